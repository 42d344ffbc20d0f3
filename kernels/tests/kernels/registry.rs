#[test]
fn op_names_are_unique() {
    let v = aim_kernels::ops();
    let mut d = v.clone();
    d.dedup();
    assert_eq!(v, d);
}
