use aim_kernels::scratch::*;

#[test]
fn buffers_are_reused_and_sized() {
    let p = {
        let mut a = take(1000);
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|v| v.is_nan()), "new buffers are NaN");
        a[0] = 1.0;
        a.as_ptr()
    };
    // The same buffer comes back for a request it fits, cut to the asked length.
    let b = take(600);
    assert_eq!((b.as_ptr(), b.len(), b[0]), (p, 600, 1.0));
    // Two at once are different buffers.
    let c = take(600);
    assert_ne!(c.as_ptr(), b.as_ptr());
}
