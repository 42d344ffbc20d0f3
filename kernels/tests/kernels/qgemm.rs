//! The packed integer GEMM against the definition, summed in i64: every shape edge
//! (partial tiles, depths not a multiple of four), both weight signs, scalar and per-column
//! zero points and scales, on every kernel this CPU runs (VNNI, AVX2, portable).

use aim_kernels::gemm::Sequential;
use aim_kernels::gemm::{Activation, Isa, Parallel};
use aim_kernels::qgemm::*;

/// Deterministic bytes (an LCG).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

/// Three "threads" run in order: the task split of a parallel run, deterministically.
struct Three;
impl Parallel for Three {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).rev().for_each(f)
    }
    fn threads(&self) -> usize {
        3
    }
}

#[allow(clippy::too_many_arguments)]
fn want(a: &[u8], za: i32, b: &[u8], signed: bool, zb: &[i32], m: usize, k: usize, n: usize) -> Vec<i64> {
    let mut y = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            let z = zb[if zb.len() == 1 { 0 } else { j }] as i64;
            y[i * n + j] = (0..k)
                .map(|kk| {
                    let bv = if signed { b[kk * n + j] as i8 as i64 } else { b[kk * n + j] as i64 };
                    (a[i * k + kk] as i64 - za as i64) * (bv - z)
                })
                .sum();
        }
    }
    y
}

#[test]
fn matches_the_definition_on_every_edge() {
    // Every ISA this CPU has: its VNNI, AVX2 and portable kernels.
    let isas = Isa::all_available();
    let mut cases = 0;
    for &(m, k, n) in &[(1, 1, 1), (5, 3, 31), (12, 4, 32), (13, 7, 33), (30, 64, 70), (3, 385, 40), (25, 96, 7)] {
        // Weights with −128 in s8 terms (not `clean`) are packed as −127 and their sums
        // corrected afterwards (on every ISA); clean ones need no correction.
        for (signed, clean) in [(true, false), (false, false), (true, true), (false, true)] {
            for per_column in [false, true] {
                let seed = (m * 1000 + k * 10 + n) as u64;
                let a = bytes(m * k, seed);
                let lowest = if signed { 0x80 } else { 0 };
                let b: Vec<u8> =
                    bytes(k * n, seed + 1).into_iter().map(|v| if clean && v == lowest { v + 1 } else { v }).collect();
                let zb: Vec<i32> = if per_column {
                    bytes(n, seed + 2).iter().map(|&v| if signed { v as i8 as i32 } else { v as i32 }).collect()
                } else {
                    vec![if signed { -3 } else { 131 }]
                };
                let za = 117;
                let packed = PackedQB::new(&b, signed, k, n, &zb).unwrap();
                // Rows padded to a multiple of four, with junk in the padding.
                let stride = k.div_ceil(4) * 4 + 4;
                let mut ad = bytes(m * stride, seed + 3);
                for i in 0..m {
                    ad[i * stride..i * stride + k].copy_from_slice(&a[i * k..(i + 1) * k]);
                }
                let sums: Vec<i32> = (0..m).map(|i| a[i * k..(i + 1) * k].iter().map(|&v| v as i32).sum()).collect();
                let scale: Vec<f32> =
                    if per_column { (0..n).map(|j| 0.01 + j as f32 * 1e-3).collect() } else { vec![0.02] };
                let bias: Vec<f32> = (0..n).map(|j| j as f32 - 3.5).collect();
                let exact = want(&a, za, &b, signed, &zb, m, k, n);
                for &isa in &isas {
                    for par in [&Sequential as &dyn Parallel, &Three] {
                        let ldy = n + 3;
                        let mut y = vec![f32::NAN; m * ldy];
                        let qa = QuantizedA { data: &ad, m, stride, zero: za, row_sums: &sums };
                        let ep = QEpilogue { scale: &scale, bias: Some(&bias), act: None };
                        qgemm(isa, &qa, &packed, &ep, &mut y, ldy, par);
                        for i in 0..m {
                            for j in 0..n {
                                let s = scale[if scale.len() == 1 { 0 } else { j }];
                                let w = exact[i * n + j] as i32 as f32 * s + bias[j];
                                let got = y[i * ldy + j];
                                assert_eq!(
                                    got.to_bits(),
                                    w.to_bits(),
                                    "{isa:?} m{m} k{k} n{n} signed {signed} clean {clean} at {i},{j}"
                                );
                            }
                            assert!(y[i * ldy + n..(i + 1) * ldy].iter().all(|v| v.is_nan()), "wrote past the row");
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 112);
}

/// Weights with headroom (per-tensor quantization leaves most columns well inside ±127)
/// and a few pairs of neighbouring depths that `vpmaddubsw` would saturate against
/// activations of 255: packed for the AVX2 plain kernel, those pairs shrunk and their
/// sums corrected, exact on every ISA and every split of the work. Without the
/// correction the saturated pairs miss by thousands.
#[test]
fn weights_with_a_few_saturating_pairs_are_exact_on_the_plain_kernel() {
    let (m, k, n) = (14, 4 * 97 + 2, 70);
    let mut b: Vec<u8> = bytes(k * n, 5).iter().map(|&v| ((v % 121) as i32 - 60) as i8 as u8).collect();
    // Pairs (even depth, next depth) of one column each, both signs, with −128.
    let heavy: [(usize, usize, i8, i8); 5] =
        [(0, 0, 127, 127), (2, 5, -128, -1), (10, 33, 100, 29), (k - 2, n - 1, -70, -70), (64, 40, 127, 2)];
    for &(kk, j, w1, w2) in &heavy {
        b[kk * n + j] = w1 as u8;
        b[(kk + 1) * n + j] = w2 as u8;
    }
    let packed = PackedQB::new(&b, true, k, n, &[0]).unwrap();
    assert_eq!(packed.corrections(), heavy.len(), "one correction per saturating pair");
    let stride = k.div_ceil(4) * 4;
    // Every activation 255 where the heavy pairs read, else anything.
    let mut a = bytes(m * stride, 6);
    for i in 0..m {
        for &(kk, ..) in &heavy {
            a[i * stride + kk] = 255;
            a[i * stride + kk + 1] = 255;
        }
    }
    let dense: Vec<u8> = (0..m).flat_map(|i| a[i * stride..i * stride + k].to_vec()).collect();
    let exact = want(&dense, 0, &b, true, &[0], m, k, n);
    for isa in Isa::all_available() {
        if isa.kind() == aim_kernels::gemm::IsaKind::Avx2 {
            assert!(packed.micro_name(isa).contains("pair"), "{isa:?}: {}", packed.micro_name(isa));
        }
        for par in [&Sequential as &dyn Parallel, &Three] {
            let mut y = vec![f32::NAN; m * n];
            let qa = QuantizedA { data: &a, m, stride, zero: 0, row_sums: &[] };
            qgemm(isa, &qa, &packed, &QEpilogue { scale: &[1.0], bias: None, act: None }, &mut y, n, par);
            for (i, (got, want)) in y.iter().zip(&exact).enumerate() {
                assert_eq!(*got, *want as f32, "{isa:?} at {},{}", i / n, i % n);
            }
        }
    }
}

#[test]
fn a_clamping_activation_is_applied() {
    let (m, k, n) = (2, 8, 3);
    let a = vec![200u8; m * k];
    let b: Vec<u8> = (0..k * n).map(|i| if i % 2 == 0 { 1 } else { (-1i8) as u8 }).collect();
    let packed = PackedQB::new(&b, true, k, n, &[0]).unwrap();
    assert!(!packed.needs_row_sums());
    let mut y = vec![0.0; m * n];
    let qa = QuantizedA { data: &a, m, stride: k, zero: 0, row_sums: &[] };
    let ep = QEpilogue { scale: &[1.0], bias: Some(&[5.0, -5.0, 0.5]), act: Some(Activation::Relu) };
    qgemm(Isa::best(), &qa, &packed, &ep, &mut y, n, &Sequential);
    assert_eq!(y, vec![5.0, 0.0, 0.5, 5.0, 0.0, 0.5]);
}

/// Whole panels (the epilogue's constant-length path) and a partial one, with a clamp,
/// with and without bias, scalar and per-column scales, and an activation the epilogue
/// applies after the store (Tanh): each output equals the definition's.
#[test]
fn whole_panels_take_every_epilogue_form() {
    let (m, k, n) = (13, 40, 70);
    let a = bytes(m * k, 7);
    let b = bytes(k * n, 8);
    let zb = vec![-2];
    let packed = PackedQB::new(&b, true, k, n, &zb).unwrap();
    let sums: Vec<i32> = (0..m).map(|i| a[i * k..(i + 1) * k].iter().map(|&v| v as i32).sum()).collect();
    let exact = want(&a, 9, &b, true, &zb, m, k, n);
    let bias: Vec<f32> = (0..n).map(|j| j as f32 * 7.0 - 200.0).collect();
    let columns: Vec<f32> = (0..n).map(|j| 0.02 + j as f32 * 1e-3).collect();
    for act in [None, Some(Activation::Relu), Some(Activation::Clip(-30.0, 40.0)), Some(Activation::Tanh)] {
        for with_bias in [false, true] {
            for scale in [&[0.03f32][..], &[-0.03], &columns] {
                for &isa in &Isa::all_available() {
                    let mut y = vec![f32::NAN; m * n];
                    let qa = QuantizedA { data: &a, m, stride: k, zero: 9, row_sums: &sums };
                    let ep = QEpilogue { scale, bias: with_bias.then_some(&bias[..]), act };
                    qgemm(isa, &qa, &packed, &ep, &mut y, n, &Sequential);
                    for (i, got) in y.iter().enumerate() {
                        let j = i % n;
                        let s = scale[if scale.len() == 1 { 0 } else { j }];
                        let mut w = exact[i] as i32 as f32 * s;
                        if with_bias {
                            w += bias[j];
                        }
                        let w = act.map_or(w, |a| a.apply(w));
                        assert_eq!(got.to_bits(), w.to_bits(), "{isa:?} {act:?} bias {with_bias} at {},{j}", i / n);
                    }
                }
            }
        }
    }
}

#[test]
fn bad_sizes_are_refused_at_packing() {
    assert!(PackedQB::new(&[0; 5], true, 2, 3, &[0]).is_err());
    assert!(PackedQB::new(&[0; 6], true, 2, 3, &[0, 0]).is_err());
}

/// The parallel DynamicQuantizeLinear gives the one-pass kernel's scale, zero point and
/// bytes, whatever the chunking, with the padding zeroed and the row sums of the bytes.
#[test]
fn dynamic_quantization_in_chunks_matches_one_pass() {
    let (m, k) = (300, 70);
    let x: Vec<f32> = bytes(m * k, 9).iter().map(|&b| b as f32 / 20.0 - 4.0).collect();
    let (scale, zp) = aim_kernels::fast::quant::dynamic_params(Isa::PORTABLE, &x);
    let stride = 72;
    for par in [&Sequential as &dyn Parallel, &Three] {
        let mut q = vec![9u8; m * stride];
        let mut sums = vec![0i32; m];
        let (s, z) = quantize_dynamic(Isa::best(), &x, k, &mut q, stride, &mut sums, par);
        assert_eq!((s.to_bits(), z), (scale.to_bits(), zp as i32));
        for i in 0..m {
            let row = &q[i * stride..(i + 1) * stride];
            for j in 0..k {
                let want = ((x[i * k + j] / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8;
                assert_eq!(row[j], want, "row {i} col {j}");
            }
            assert_eq!(&row[k..], &[0, 0]);
            assert_eq!(sums[i], row[..k].iter().map(|&v| v as i32).sum::<i32>());
        }
    }
}

/// A packing made for one ISA (`PackedQB::for_isa`: as the weights are where the CPU runs
/// VNNI or the portable kernel, pairs shrunk and corrected for AVX2) gives the exact sums on
/// every kernel this CPU runs, including one it was not made for (a program moved to
/// another CPU): full-range weights with −128, u8 and s8, one and several rows.
#[test]
fn packings_for_each_isa_are_exact_on_every_kernel() {
    let isas = Isa::all_available();
    for &(m, k, n) in &[(1, 64, 40), (13, 72, 70), (30, 385, 33)] {
        for signed in [true, false] {
            let a = bytes(m * k, 31);
            let mut b = bytes(k * n, 32);
            b[0] = if signed { 0x80 } else { 0 };
            b[k * n - 1] = if signed { 0x7f } else { 0xff };
            let zb = vec![if signed { -3 } else { 131 }];
            let exact = want(&a, 7, &b, signed, &zb, m, k, n);
            let sums: Vec<i32> = (0..m).map(|i| a[i * k..(i + 1) * k].iter().map(|&v| v as i32).sum()).collect();
            // Rows padded to groups of four bytes, as the quantizers write them.
            let stride = k.div_ceil(4) * 4;
            let mut rows = vec![0u8; m * stride];
            for i in 0..m {
                rows[i * stride..i * stride + k].copy_from_slice(&a[i * k..(i + 1) * k]);
            }
            for &made_for in &isas {
                let packed = PackedQB::for_isa(made_for, &b, signed, k, n, &zb).unwrap();
                for &isa in &isas {
                    let mut y = vec![f32::NAN; m * n];
                    let qa = QuantizedA { data: &rows, m, stride, zero: 7, row_sums: &sums };
                    let ep = QEpilogue { scale: &[1.0], bias: None, act: None };
                    qgemm(isa, &qa, &packed, &ep, &mut y, n, &Three);
                    for (i, (&got, &w)) in y.iter().zip(&exact).enumerate() {
                        assert_eq!(got, w as f32, "made for {made_for:?}, run on {isa:?}, {m}x{k}x{n} at {i}");
                    }
                }
            }
        }
    }
}
