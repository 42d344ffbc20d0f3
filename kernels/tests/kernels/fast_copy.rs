use aim_kernels::fast::copy::copy_short;

#[test]
fn copies_every_length() {
    for n in 0..300 {
        let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut dst = vec![-1.0; n];
        copy_short(&mut dst, &src);
        assert_eq!(dst, src, "length {n}");
    }
}
