fn grid(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
    (0..=n).map(move |i| lo + (hi - lo) * i as f32 / n as f32)
}

#[test]
fn exp_error() {
    let worst = grid(-87.0, 88.0, 2_000_000)
        .map(|x| {
            let want = (x as f64).exp();
            ((aim_kernels::fast::math::exp(x) as f64 - want) / want).abs()
        })
        .fold(0.0, f64::max);
    assert!(worst <= 3e-7, "exp relative error {worst:e}");
    assert_eq!(aim_kernels::fast::math::exp(-200.0), 0.0);
    assert!(aim_kernels::fast::math::exp(100.0) > 3e38);
    assert!(aim_kernels::fast::math::exp(f32::NAN).is_nan());
}

#[test]
fn erf_error() {
    let mut worst_abs = 0.0f64;
    let mut worst_rel = 0.0f64;
    for x in grid(-6.0, 6.0, 2_000_000) {
        let want = aim_kernels::erf(x as f64);
        let got = aim_kernels::fast::math::erf(x) as f64;
        worst_abs = worst_abs.max((got - want).abs());
        if x.abs() < 0.84 && want != 0.0 {
            worst_rel = worst_rel.max(((got - want) / want).abs());
        }
    }
    assert!(worst_abs <= 5e-7, "erf absolute error {worst_abs:e}");
    assert_eq!(aim_kernels::fast::math::erf(4.0), 1.0);
    assert_eq!(aim_kernels::fast::math::erf(f32::NEG_INFINITY), -1.0);
    assert!(aim_kernels::fast::math::erf(f32::NAN).is_nan());
    assert!(worst_rel <= 1e-6, "erf relative error near 0 {worst_rel:e}");
}

#[test]
fn tanh_and_sigmoid_error() {
    let (mut t, mut s) = (0.0f64, 0.0f64);
    for x in grid(-20.0, 20.0, 1_000_000) {
        t = t.max((aim_kernels::fast::math::tanh(x) as f64 - (x as f64).tanh()).abs());
        s = s.max((aim_kernels::fast::math::sigmoid(x) as f64 - 1.0 / (1.0 + (-(x as f64)).exp())).abs());
    }
    // tanh is the rational fit ONNX Runtime's MLAS uses (4.0e-7 near |x| = 5.9, where
    // tanh is 0.99998); sigmoid's fit stays within the 3e-7 of the exp form it replaced.
    assert!(t <= 4.5e-7 && s <= 3e-7, "tanh {t:e}, sigmoid {s:e}");
    assert!(aim_kernels::fast::math::tanh(f32::NAN).is_nan() && aim_kernels::fast::math::sigmoid(f32::NAN).is_nan());
    assert_eq!((aim_kernels::fast::math::tanh(-1e9), aim_kernels::fast::math::sigmoid(1e9)), (-1.0, 1.0));
}
