use aim_ir::{DType, Tensor};
use aim_kernels::ops::quant::*;

/// The narrow path gives the general formula's bits, `(q - zp) · s` in f64 rounded
/// once, for every 8- and 16-bit type, per tensor and per axis.
#[test]
fn narrow_dequantize_is_the_general_formula() {
    let shape = [3usize, 4, 5];
    let n: usize = shape.iter().product();
    let scales = [0.1f32, 0.0371, 3.3e-5, 7.0];
    for dt in [DType::U8, DType::I8, DType::U16, DType::I16] {
        let (lo, hi) = range_of(dt).unwrap();
        let q: Vec<f64> = (0..n).map(|i| lo + ((i * 7919) as f64 % (hi - lo + 1.0))).collect();
        let x = Tensor::from_f64(dt, &shape, &q);
        for per_axis in [false, true] {
            let (s, z) = if per_axis { (&scales[..], 4) } else { (&scales[1..2], 1) };
            let st = Tensor::from_slice(&[s.len()][..(per_axis as usize)], s);
            let zv: Vec<f64> = (0..z).map(|c| lo + (c as f64 * 37.0) % (hi - lo)).collect();
            let zt = Tensor::from_f64(dt, &[z][..(per_axis as usize)], &zv);
            let got = dequantize_narrow(&x, &st, Some(&zt), 1).unwrap().expect("the narrow path takes it");
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    let c = if per_axis { (i / 5) % 4 } else { 0 };
                    ((q[i] - zv[c]) * s[c] as f64) as f32
                })
                .collect();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got.data::<f32>()), bits(&want), "{dt} per axis {per_axis}");
        }
    }
}
