//! The dtype-generic fast kernels (data movement, masks, conversions, integer arithmetic,
//! reductions) against the reference kernels on generated cases: every dtype they take,
//! broadcasts of each kind, outputs small (serial) and large (parallel), and the special
//! values conversions must treat as the reference does (NaN, ±inf, out of range, -0).

use aim_ir::{Attr, DType, Node, Tensor};
use aim_kernels::fast::{kernel, Ctx};
use aim_kernels::gemm::{Blocking, Isa, Sequential};

fn node(op: &str, attrs: &[(&str, Attr)]) -> Node {
    Node {
        name: format!("{op}_test"),
        op: op.into(),
        domain: String::new(),
        inputs: vec![],
        outputs: vec!["y".into()],
        attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
    }
}

/// Values that exercise conversions: fractions, negatives, large magnitudes, NaN, ±inf, -0.
const SPECIAL: [f64; 12] =
    [0.0, -0.0, 1.5, -2.5, 3.99, 127.6, -300.0, 1e10, -1e20, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

fn values(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if dtype == DType::Bool {
                (s % 2) as f64
            } else if i % 5 == 0 && dtype.is_float() {
                SPECIAL[(s % SPECIAL.len() as u64) as usize]
            } else {
                (s % 41) as f64 - 20.0 + if dtype.is_float() { 0.25 } else { 0.0 }
            }
        })
        .collect();
    Tensor::from_f64(dtype, shape, &v)
}

/// The fast kernel of `n` gives exactly the reference's outputs (or declines).
fn same(n: &Node, ins: &[Option<Tensor>]) -> bool {
    let cx = Ctx { par: &Sequential, isa: Isa::PORTABLE, blocking: Blocking { kc: 64, mc: 8 }, out: None };
    let fast = kernel(&n.op).expect("a fast kernel")(n, ins, &cx);
    let want = aim_kernels::kernel(&n.op).expect("a reference kernel")(n, ins).expect("the reference runs");
    let got = fast.expect("the fast kernel takes this case").expect("the fast kernel runs");
    assert_eq!(got.len(), want.len(), "{}", n.op);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            (g.dtype(), g.shape()),
            (w.dtype(), w.shape()),
            "{} {:?}",
            n.op,
            ins.iter().map(|t| t.as_ref().map(|t| t.shape().to_vec())).collect::<Vec<_>>()
        );
        assert_eq!(g.bytes(), w.bytes(), "{} values", n.op);
    }
    true
}

const ALL: [DType; 13] = DType::ALL;

/// Shape pairs that broadcast: equal, a scalar, rows, columns, both ways, and a large one
/// (parallel path).
const PAIRS: [(&[usize], &[usize]); 7] = [
    (&[2, 3], &[2, 3]),
    (&[4, 5], &[]),
    (&[3, 1, 4], &[5, 1]),
    (&[2, 3, 4], &[4]),
    (&[1, 6], &[3, 1]),
    (&[2, 1, 3], &[2, 4, 1]),
    (&[200, 100], &[100]),
];

#[test]
fn cast_between_every_pair_of_dtypes() {
    for from in ALL {
        for to in ALL {
            for shape in [&[7][..], &[3, 200, 41]] {
                let n = node("Cast", &[("to", Attr::Int(to.onnx_code() as i64))]);
                assert!(same(&n, &[Some(values(from, shape, 3))]), "{from} -> {to}");
            }
        }
    }
}

#[test]
fn where_compare_logic_and_integer_arithmetic_broadcast() {
    for (sa, sb) in PAIRS {
        for dt in [DType::F32, DType::I64, DType::I32, DType::F16, DType::U8, DType::F64, DType::Bool] {
            let (a, b) = (values(dt, sa, 1), values(dt, sb, 2));
            let c = values(DType::Bool, sb, 9);
            assert!(same(&node("Where", &[]), &[Some(c.clone()), Some(a.clone()), Some(b.clone())]));
            assert!(same(&node("Where", &[]), &[Some(values(DType::Bool, sa, 4)), Some(b.clone()), Some(a.clone())]));
            if dt == DType::Bool {
                for op in ["And", "Or", "Xor", "Equal"] {
                    assert!(same(&node(op, &[]), &[Some(a.clone()), Some(b.clone())]));
                }
                assert!(same(&node("Not", &[]), &[Some(a.clone())]));
            } else if dt != DType::F16 {
                for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"] {
                    assert!(same(&node(op, &[]), &[Some(a.clone()), Some(b.clone())]));
                }
            }
            if matches!(dt, DType::I64 | DType::I32) {
                for op in ["Add", "Sub", "Mul", "Div"] {
                    assert!(same(&node(op, &[]), &[Some(a.clone()), Some(b.clone())]), "{op} {dt}");
                }
            }
        }
    }
}

#[test]
fn expand_range_and_data_movement_of_any_dtype() {
    for dt in ALL {
        for (from, to) in [
            (&[3, 1][..], &[2, 3, 4][..]),
            (&[1], &[5]),
            (&[4], &[3, 1, 4]),
            (&[1, 50], &[400, 50]),
            (&[2, 3], &[2, 3]),
        ] {
            let shape = Tensor::from_i64(&[to.len()], to.iter().map(|&d| d as i64).collect());
            assert!(same(&node("Expand", &[]), &[Some(values(dt, from, 5)), Some(shape)]), "{dt} {from:?}");
        }
        let x = values(dt, &[4, 6, 5], 7);
        let ax = |a: i64| [("axis", Attr::Int(a))];
        assert!(same(&node("Concat", &ax(1)), &[Some(x.clone()), Some(values(dt, &[4, 2, 5], 8))]));
        let sizes = Tensor::from_i64(&[2], vec![2, 4]);
        let mut split = node("Split", &ax(1));
        split.outputs = vec!["a".into(), "b".into()];
        assert!(same(&split, &[Some(x.clone()), Some(sizes)]));
        let i = |v: Vec<i64>| Some(Tensor::from_i64(&[v.len()], v));
        assert!(same(&node("Slice", &[]), &[Some(x.clone()), i(vec![1, -4]), i(vec![3, 100]), i(vec![0, 2])]));
        let idx = Tensor::from_i64(&[2, 2], vec![0, -1, 3, 2]);
        assert!(same(&node("Gather", &ax(-1)), &[Some(x), Some(idx)]));
    }
    for (s, l, d) in [(0, 10, 1), (5, -7, -3), (2, 3, 5), (4, 4, 1), (0, 100000, 3)] {
        let t = |v: i64| Some(Tensor::from_i64(&[], vec![v]));
        assert!(same(&node("Range", &[]), &[t(s), t(l), t(d)]));
        let f = |v: i64| Some(Tensor::from_vec(&[], vec![v as f32 * 0.3]));
        assert!(same(&node("Range", &[]), &[f(s), f(l), f(d)]));
        let i32s = |v: i64| Some(Tensor::from_vec(&[], vec![v as i32]));
        assert!(same(&node("Range", &[]), &[i32s(s), i32s(l), i32s(d)]));
    }
}

#[test]
fn reductions_over_consecutive_axes() {
    let cx = Ctx { par: &Sequential, isa: Isa::PORTABLE, blocking: Blocking { kc: 64, mc: 8 }, out: None };
    for op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare"] {
        for shape in [&[2, 3, 4, 5][..], &[1, 64, 8, 40], &[7], &[300, 70]] {
            let x = values(DType::F32, shape, 11);
            let r = shape.len() as i64;
            let mut cases: Vec<Vec<i64>> = (0..r).map(|a| vec![a]).collect();
            cases.extend((0..r - 1).map(|a| vec![a, a + 1]));
            cases.push(vec![-1]);
            cases.push(vec![]);
            for axes in cases {
                for keep in [0, 1] {
                    let n = node(op, &[("keepdims", Attr::Int(keep))]);
                    let ins =
                        [Some(x.clone()), (!axes.is_empty()).then(|| Tensor::from_i64(&[axes.len()], axes.clone()))];
                    let want = aim_kernels::kernel(op).unwrap()(&n, &ins).unwrap();
                    let got = kernel(op).unwrap()(&n, &ins, &cx).expect("taken").unwrap();
                    assert_eq!(got[0].shape(), want[0].shape(), "{op} {shape:?} {axes:?}");
                    let scale = want[0].to_f64_vec().iter().filter(|v| v.is_finite()).fold(1f64, |m, v| m.max(v.abs()));
                    for (g, w) in got[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
                        let ok = (g.is_nan() && w.is_nan()) || g == &w || (g - w).abs() <= 1e-5 * scale;
                        assert!(ok, "{op} {shape:?} {axes:?}: {g} vs {w}");
                    }
                }
            }
        }
    }
}

/// DynamicQuantizeLinear gives the reference's u8 values, scale and zero point: mixed
/// signs, all positive, all negative, all zero (scale 0), and the special values.
#[test]
fn dynamic_quantize_linear_matches_the_reference() {
    let n = node("DynamicQuantizeLinear", &[]);
    for seed in 1..6 {
        assert!(same(&n, &[Some(values(DType::F32, &[3, 77], seed))]));
    }
    for v in [vec![0.5f32, 3.0, 7.25, 1.0], vec![-0.5, -3.0, -7.25], vec![0.0; 5], vec![1e-30, -1e-30, 2.5e-31]] {
        assert!(same(&n, &[Some(Tensor::from_slice(&[v.len()], &v))]), "{v:?}");
    }
}

/// The vectorised QuantizeLinear step gives the scalar formula's bytes on ties (to even),
/// NaN (0), infinities and values past either end, at every length around the vector
/// width.
#[test]
fn quantize_matches_the_scalar_formula() {
    let scale = 0.5f32;
    let mut v: Vec<f32> = (-300..300).map(|i| i as f32 * 0.25).collect();
    v.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 0.25, 0.75, -0.0]);
    for isa in aim_kernels::gemm::Isa::all_available() {
        for zp in [0.0f32, 3.0, 128.0, 255.0] {
            for len in [0, 1, 15, 16, 17, 31, 32, 33, 65, v.len()] {
                let mut got = vec![7u8; len];
                aim_kernels::fast::quant::quantize(isa, &v[..len], &mut got, scale, zp);
                for (i, (&g, &x)) in got.iter().zip(&v).enumerate() {
                    let want = ((x / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8;
                    assert_eq!(g, want, "{isa:?} zp {zp} len {len} at {i}: {x}");
                }
            }
        }
    }
}

/// The range DynamicQuantizeLinear takes is the same on every ISA: NaN ignored, infinities
/// kept, 0 always inside, at lengths around the vector loops' widths.
#[test]
fn quantization_range_is_the_same_on_every_isa() {
    let mut v: Vec<f32> = (0..300).map(|i| ((i * 37 % 101) as f32 - 40.0) * 0.3).collect();
    v[70] = f32::NAN;
    v[200] = f32::NAN;
    for len in [0, 1, 15, 63, 64, 65, 129, 300] {
        let want = aim_kernels::fast::quant::range(aim_kernels::gemm::Isa::PORTABLE, &v[..len]);
        assert_eq!(aim_kernels::fast::quant::range(aim_kernels::gemm::Isa::best(), &v[..len]), want, "len {len}");
    }
    let mut w = vec![1.0f32; 130];
    w[100] = f32::INFINITY;
    w[3] = f32::NEG_INFINITY;
    assert_eq!(aim_kernels::fast::quant::range(aim_kernels::gemm::Isa::best(), &w), (f32::NEG_INFINITY, f32::INFINITY));
    assert_eq!(aim_kernels::fast::quant::range(aim_kernels::gemm::Isa::best(), &[2.0; 70]), (0.0, 2.0));
}
