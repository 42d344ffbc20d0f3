#[test]
fn erf_matches_known_values() {
    for (x, e) in [
        (0.0, 0.0),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.0, 0.999_977_909_503_001_4),
        (-1.5, -0.966_105_146_475_310_7),
    ] {
        assert!(
            (aim_kernels::ops::elementwise::erf(x) - e).abs() < 1e-13,
            "erf({x}) = {} not {e}",
            aim_kernels::ops::elementwise::erf(x)
        );
    }
}
