//! `aim:QMatMul` (the product of two quantized activations) against its definition:
//! each side quantized as QuantizeLinear does (half to even, clamped to u8), the sums of
//! `(a − za)(b − zb)` exact, scaled by the two scales' product — on every kernel this CPU
//! runs, with batches, B shared by every batch item, depths not a multiple of four, values
//! that clamp, and zero points that make the packed B reach −128.

use aim_ir::{Attr, Node, Tensor};
use aim_kernels::fast::{qmatmul, Ctx};
use aim_kernels::gemm::{Blocking, Isa, Sequential};

/// Deterministic values in [-span, span) (an LCG).
fn values(n: usize, seed: u64, span: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * span
        })
        .collect()
}

fn quantize(x: f32, scale: f32, zero: i32) -> i64 {
    ((x / scale).round_ties_even() + zero as f32).clamp(0.0, 255.0) as i64
}

fn node(sa: f32, za: i64, sb: f32, zb: i64) -> Node {
    Node {
        name: "qmatmul_test".into(),
        op: "QMatMul".into(),
        domain: "aim".into(),
        inputs: vec!["a".into(), "b".into()],
        outputs: vec!["y".into()],
        attrs: [
            ("a_scale", Attr::Float(sa)),
            ("a_zero", Attr::Int(za)),
            ("b_scale", Attr::Float(sb)),
            ("b_zero", Attr::Int(zb)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    }
}

#[test]
fn matches_the_definition() {
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[2, 3, 13, 7], &[2, 3, 7, 33]),
        (&[6, 40, 64], &[6, 64, 40]),
        (&[2, 9, 37], &[37, 5]),
        (&[1, 1, 1], &[1, 1, 1]),
        (&[3, 12, 100], &[1, 100, 64]),
    ];
    let mut cases = 0;
    for isa in Isa::all_available() {
        for (si, &(ash, bsh)) in shapes.iter().enumerate() {
            // Zero points at the edges too: 0 (B's bytes at −128 after the shift) and 255.
            for &(za, zb) in &[(128, 128), (3, 0), (250, 255), (0, 77)] {
                let (sa, sb) = (0.05f32, 0.07f32);
                let a = values(ash.iter().product(), 11 + si as u64, 9.0);
                let b = values(bsh.iter().product(), 29 + si as u64, 12.0);
                let ins = [Some(Tensor::from_slice(ash, &a)), Some(Tensor::from_slice(bsh, &b))];
                let cx = Ctx { par: &Sequential, isa, blocking: Blocking { kc: 64, mc: 8 }, out: None };
                let y = qmatmul(&node(sa, za, sb, zb), &ins, &cx).expect("f32 inputs").expect("it runs");
                let (m, k, n) = (ash[ash.len() - 2], ash[ash.len() - 1], bsh[bsh.len() - 1]);
                let items: usize = ash[..ash.len() - 2].iter().product();
                let b_items: usize = bsh[..bsh.len() - 2].iter().product();
                let mut want_shape = ash[..ash.len() - 2].to_vec();
                want_shape.extend([m, n]);
                assert_eq!(y[0].shape(), &want_shape[..]);
                let got = y[0].data::<f32>();
                for t in 0..items {
                    let tb = if b_items == 1 { 0 } else { t };
                    for i in 0..m {
                        for j in 0..n {
                            let sum: i64 = (0..k)
                                .map(|kk| {
                                    (quantize(a[(t * m + i) * k + kk], sa, za as i32) - za)
                                        * (quantize(b[(tb * k + kk) * n + j], sb, zb as i32) - zb)
                                })
                                .sum();
                            let want = sum as f32 * (sa * sb);
                            let g = got[(t * m + i) * n + j];
                            assert!(
                                (g - want).abs() <= 1e-6 * want.abs().max(1.0),
                                "{isa:?} {ash:?}×{bsh:?} zero points {za}, {zb}: [{t}, {i}, {j}] {g} != {want}"
                            );
                        }
                    }
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= 20, "{cases} cases");
}

#[test]
fn bad_shapes_and_parameters_are_errors() {
    let cx = Ctx { par: &Sequential, isa: Isa::PORTABLE, blocking: Blocking { kc: 64, mc: 8 }, out: None };
    let t = |s: &[usize]| Some(Tensor::from_slice(s, &vec![0.5f32; s.iter().product()]));
    let ok = node(0.1, 128, 0.1, 128);
    for (ins, why) in [([t(&[2, 3]), t(&[4, 5])], "do not fit"), ([t(&[2, 2, 3]), t(&[3, 3, 5])], "batch dims")] {
        let e = qmatmul(&ok, &ins, &cx).expect("f32 inputs").expect_err("refused");
        assert!(e.0.contains(why), "{}", e.0);
    }
    let e = qmatmul(&node(0.0, 128, 0.1, 300), &[t(&[2, 3]), t(&[3, 5])], &cx).expect("f32").expect_err("refused");
    assert!(e.0.contains("a_scale"), "{}", e.0);
}
