//! The byte kernels against their definitions, bit for bit: integer sums in i64, then the
//! epilogue's f32 steps written out one value at a time; on this CPU's kernels and the
//! portable ones, over kernel sizes, strides, dilations, asymmetric padding, channel counts
//! that are not multiples of four, several images, residuals and activations.

use aim_kernels::gemm::{Activation, Isa, Sequential};
use aim_kernels::int8::add::add;
use aim_kernels::int8::conv::Conv8;
use aim_kernels::int8::convert::{dequantize_nhwc, quantize_nchw};
use aim_kernels::int8::depthwise::Depthwise8;
use aim_kernels::int8::pool::max_pool;
use aim_kernels::int8::*;

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

fn bytes(seed: &mut u64, n: usize) -> Vec<u8> {
    (0..n).map(|_| lcg(seed) as u8).collect()
}

/// The epilogue of one value, as `epilogue.rs` defines it: with clamp activations, in the
/// output's quantized units (one fused multiply-add, a rounding, one clamp per grid); with
/// others, the graph's steps (QuantizeLinear by the reciprocal of the scale).
fn epilogue(sum: i64, scale: f32, bias: f32, out: &Out8, res: Option<u8>) -> u8 {
    let bounds = |a: Option<Activation>, q: Q8| {
        let (lo, hi) = a.map_or(Some((f32::NEG_INFINITY, f32::INFINITY)), |a| a.clamp_bounds())?;
        let grid = |v: f32| (v / q.scale).round_ties_even() + q.zero as f32;
        Some((grid(lo).max(0.0), grid(hi).min(255.0)))
    };
    let first = out.residual.map_or(out.q, |r| r.mid);
    let b1 = bounds(out.act, first);
    let b2 = out.residual.map_or(b1, |r| bounds(r.act, out.q));
    let v = sum as i32 as f32;
    if let (Some((lo1, hi1)), Some((lo2, hi2))) = (b1, b2) {
        // Rounded before the zero point is added, as QuantizeLinear and ORT's
        // requantization do (added first, f32 rounds the value once more).
        let (s1, b1, z1) = (scale / first.scale, bias / first.scale, first.zero as f32);
        let q = v.mul_add(s1, b1).clamp(lo1 - z1, hi1 - z1).round_ties_even() + z1;
        let q = match out.residual {
            Some(r) => {
                let y = (q - r.mid.zero as f32).mul_add(
                    r.mid.scale / out.q.scale,
                    (res.unwrap() as f32 - r.res.zero as f32) * (r.res.scale / out.q.scale),
                );
                (y.round_ties_even() + out.q.zero as f32).clamp(lo2, hi2)
            }
            None => q,
        };
        return q as u8;
    }
    let act = |a: Option<Activation>, x: f32| a.map_or(x, |a| a.apply(x));
    let q = |q: Q8, x: f32| (x * (1.0 / q.scale)).round_ties_even() + q.zero as f32;
    let mut v = act(out.act, v * scale + bias);
    if let Some(r) = out.residual {
        let m = q(r.mid, v).clamp(0.0, 255.0) - r.mid.zero as f32;
        v = act(r.act, m * r.mid.scale + (res.unwrap() as i32 - r.res.zero as i32) as f32 * r.res.scale);
    }
    q(out.q, v).clamp(0.0, 255.0) as u8
}

/// Every ISA this CPU runs: AVX-512 (VNNI where present), AVX2 (the plain or sign kernel), portable.
fn isas() -> Vec<Isa> {
    Isa::all_available()
}

struct Case {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    m: usize,
    window: Window,
    residual: bool,
    act: Option<Activation>,
}

fn out_of(case: &Case, seed: &mut u64) -> Out8 {
    let q = |seed: &mut u64| Q8 { scale: 0.02 + (lcg(seed) % 100) as f32 * 0.003, zero: (lcg(seed) % 256) as u8 };
    Out8 {
        act: case.act,
        residual: case.residual.then(|| Residual8 { mid: q(seed), res: q(seed), act: Some(Activation::Relu) }),
        q: q(seed),
    }
}

fn cases() -> Vec<Case> {
    let win = |k: usize, s: usize, d: usize, pads: [usize; 4]| Window {
        kernel: [k, k],
        stride: [s, s],
        dilation: [d, d],
        pads,
    };
    vec![
        Case { n: 1, h: 7, w: 9, c: 64, m: 40, window: win(1, 1, 1, [0; 4]), residual: false, act: None },
        Case { n: 2, h: 9, w: 8, c: 3, m: 16, window: win(7, 2, 1, [3; 4]), residual: false, act: None },
        Case {
            n: 1,
            h: 10,
            w: 11,
            c: 13,
            m: 70,
            window: win(3, 1, 1, [1, 0, 2, 1]),
            residual: true,
            act: Some(Activation::Relu),
        },
        Case { n: 1, h: 12, w: 12, c: 32, m: 33, window: win(3, 2, 2, [2; 4]), residual: false, act: None },
        Case {
            n: 3,
            h: 5,
            w: 6,
            c: 8,
            m: 64,
            window: win(1, 2, 1, [0; 4]),
            residual: true,
            act: Some(Activation::Clip(-0.5, 2.0)),
        },
        Case {
            n: 2,
            h: 13,
            w: 16,
            c: 40,
            m: 24,
            window: win(3, 2, 1, [1; 4]),
            residual: true,
            act: Some(Activation::Clip(0.0, 6.0)),
        },
        // Multiples of 8 channels: the AVX2 depthwise runs (3×3 rolled at stride 1, more
        // taps than it holds in registers).
        Case {
            n: 1,
            h: 9,
            w: 12,
            c: 24,
            m: 8,
            window: win(3, 1, 1, [1; 4]),
            residual: true,
            act: Some(Activation::Relu),
        },
        Case { n: 2, h: 11, w: 10, c: 16, m: 36, window: win(5, 1, 1, [2; 4]), residual: false, act: None },
        // Winograd F(2×2, 3×3): odd output sizes, uneven padding, a residual, several images.
        Case {
            n: 2,
            h: 7,
            w: 10,
            c: 20,
            m: 40,
            window: win(3, 1, 1, [1, 0, 2, 1]),
            residual: true,
            act: Some(Activation::Relu),
        },
        Case {
            n: 1,
            h: 4,
            w: 4,
            c: 260,
            m: 17,
            window: win(3, 1, 1, [1; 4]),
            residual: false,
            act: Some(Activation::Sigmoid),
        },
    ]
}

#[test]
fn conv_equals_its_definition() {
    let mut seed = 7u64;
    for case in cases() {
        let Case { n, h, w, c, m, window, .. } = case;
        let taps = window.taps();
        let x = bytes(&mut seed, n * h * w * c);
        let wt = bytes(&mut seed, m * c * taps);
        // Weights as drawn, without any −128 (activations of 0 and 255 and weights of ±127
        // are the sums that would saturate a plain `vpmaddubsw`: on AVX2 the input is
        // widened to 16 bits), with one −128 per output channel or one in 16 (packed as
        // −127 and corrected per tile) and with one in 4 (too many to correct). And
        // weights with headroom, one in 600 at ±127/−128: the few pairs that would
        // saturate `vpmaddubsw` shrunk and corrected, so that the AVX2 plain kernel runs.
        let all = wt.len();
        let headroom: Vec<u8> = wt
            .iter()
            .enumerate()
            .map(|(i, &v)| match i % 600 {
                17 => 127,
                317 => 0x80,
                _ => ((v % 121) as i32 - 60) as i8 as u8,
            })
            .collect();
        let clean: Vec<u8> = wt.iter().map(|&v| if v == 0x80 { 0x81 } else { v }).collect();
        let with = |count: usize, step: usize| {
            let mut v = clean.clone();
            (0..count).for_each(|i| v[(i * step + 13) % all] = 0x80);
            v
        };
        let per_channel = with(m, c * taps + 1);
        let (some, many) = (with(all / 16, 7919), with(all / 4 + 2, 4099));
        let (widened, plain) = (Some("widened"), Some("every pair"));
        let cases =
            [(wt, None), (clean, widened), (per_channel, None), (some, widened), (many, widened), (headroom, plain)];
        for (wt, kernel) in cases {
            conv_case(&case, &mut seed, &x, &wt, kernel);
        }
    }
}

/// One convolution against its definition on every ISA; `kernel`: what the name of the
/// microkernel that runs on AVX2 must contain (None: any).
fn conv_case(case: &Case, seed: &mut u64, x: &[u8], wt: &[u8], kernel: Option<&str>) {
    let Case { n, h, w, c, m, window, .. } = *case;
    {
        let xq = Q8 { scale: 0.05, zero: (lcg(seed) % 256) as u8 };
        let w_scale: Vec<f32> = (0..m).map(|o| 0.001 + o as f32 * 1e-4).collect();
        let bias: Vec<f32> = (0..m).map(|o| (o as f32 - 20.0) * 0.1).collect();
        let out = out_of(case, seed);
        let (oh, ow) = window.output(h, w).unwrap();
        let res = bytes(seed, n * oh * ow * m);
        let mut want = vec![0u8; n * oh * ow * m];
        for b in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for o in 0..m {
                        let mut acc = 0i64;
                        for ci in 0..c {
                            for ky in 0..window.kernel[0] {
                                for kx in 0..window.kernel[1] {
                                    let v = match window.source(oy, ox, ky, kx, h, w) {
                                        Some((iy, ix)) => x[((b * h + iy) * w + ix) * c + ci],
                                        None => xq.zero,
                                    } as i64;
                                    let k = wt[((o * c + ci) * window.kernel[0] + ky) * window.kernel[1] + kx] as i8;
                                    acc += (v - xq.zero as i64) * k as i64;
                                }
                            }
                        }
                        let at = ((b * oh + oy) * ow + ox) * m + o;
                        want[at] = epilogue(acc, xq.scale * w_scale[o], bias[o], &out, Some(res[at]));
                    }
                }
            }
        }
        let direct = Conv8::new(c, m, window, Weights8 { w: wt, scale: &w_scale, bias: Some(&bias) }, xq, out).unwrap();
        // Winograd F(2×2, 3×3) where it takes the window, on every ISA: the same bytes.
        let wino = direct.clone().into_winograd(wt);
        let takes = window.kernel == [3, 3] && window.stride == [1, 1] && window.dilation == [1, 1];
        assert_eq!(wino.is_ok(), takes && (16..=1024).contains(&c), "{window:?} c {c}: {:?}", wino.as_ref().err());
        let kernels = [Some(direct), wino.ok()];
        for (k, isa) in kernels.iter().flatten().flat_map(|k| isas().into_iter().map(move |i| (k, i))) {
            // The name the schedule prints for this input: `!word` for a kernel it must not be.
            let runs = k.micro_name(isa, n * h * w);
            if k.winograd() {
                assert!(runs.contains("Winograd"), "{isa:?}: {runs}");
            } else if isa.kind() == aim_kernels::gemm::IsaKind::Avx2 {
                let named = |s: &str| s.strip_prefix('!').map_or(runs.contains(s), |no| !runs.contains(no));
                assert!(kernel.is_none_or(named), "{isa:?} c {c} m {m}: {runs}, not {kernel:?}");
            }
            let mut y = vec![0u8; want.len()];
            let input = Nhwc { data: x, n, h, w, c };
            k.run(isa, &input, case.residual.then_some(&res[..]), &mut y, &Sequential);
            assert_eq!(y, want, "{isa:?} c {c} m {m} {window:?} {runs}");
        }
        // Packed for the kernel each ISA runs (VNNI and portable: the weights as they are),
        // and run on every ISA: the same bytes.
        for made_for in isas() {
            let weights = Weights8 { w: wt, scale: &w_scale, bias: Some(&bias) };
            let k = Conv8::for_isa(made_for, c, m, window, weights, xq, out).unwrap();
            for isa in isas() {
                let mut y = vec![0u8; want.len()];
                let input = Nhwc { data: x, n, h, w, c };
                k.run(isa, &input, case.residual.then_some(&res[..]), &mut y, &Sequential);
                assert_eq!(y, want, "packed for {made_for:?}, run on {isa:?}: c {c} m {m} {window:?}");
            }
        }
    }
}

#[test]
fn depthwise_equals_its_definition() {
    let mut seed = 11u64;
    for case in cases() {
        let Case { n, h, w, c, window, .. } = case;
        let taps = window.taps();
        let x = bytes(&mut seed, n * h * w * c);
        let wt = bytes(&mut seed, c * taps);
        let xq = Q8 { scale: 0.03, zero: (lcg(&mut seed) % 256) as u8 };
        let w_scale = [0.01f32];
        let bias: Vec<f32> = (0..c).map(|o| (o as f32 - 5.0) * 0.2).collect();
        let out = out_of(&case, &mut seed);
        let (oh, ow) = window.output(h, w).unwrap();
        let res = bytes(&mut seed, n * oh * ow * c);
        let mut want = vec![0u8; n * oh * ow * c];
        for b in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..c {
                        let mut acc = 0i64;
                        for ky in 0..window.kernel[0] {
                            for kx in 0..window.kernel[1] {
                                if let Some((iy, ix)) = window.source(oy, ox, ky, kx, h, w) {
                                    let v = x[((b * h + iy) * w + ix) * c + ch] as i64 - xq.zero as i64;
                                    acc += v * wt[(ch * window.kernel[0] + ky) * window.kernel[1] + kx] as i8 as i64;
                                }
                            }
                        }
                        let at = ((b * oh + oy) * ow + ox) * c + ch;
                        want[at] = epilogue(acc, xq.scale * w_scale[0], bias[ch], &out, Some(res[at]));
                    }
                }
            }
        }
        let k = Depthwise8::new(c, window, Weights8 { w: &wt, scale: &w_scale, bias: Some(&bias) }, xq, out).unwrap();
        for isa in isas() {
            let mut y = vec![0u8; want.len()];
            let input = Nhwc { data: &x, n, h, w, c };
            k.run(isa, &input, case.residual.then_some(&res[..]), &mut y, &Sequential);
            assert_eq!(y, want, "{isa:?} c {c} {window:?}");
        }
    }
}

#[test]
fn max_pool_takes_the_largest_byte() {
    let mut seed = 3u64;
    for case in cases() {
        let Case { n, h, w, c, window, .. } = case;
        let x = bytes(&mut seed, n * h * w * c);
        let (oh, ow) = window.output(h, w).unwrap();
        let mut y = vec![0u8; n * oh * ow * c];
        max_pool(&window, &Nhwc { data: &x, n, h, w, c }, (oh, ow), &mut y, &Sequential);
        for b in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..c {
                        let mut best = 0u8;
                        for ky in 0..window.kernel[0] {
                            for kx in 0..window.kernel[1] {
                                if let Some((iy, ix)) = window.source(oy, ox, ky, kx, h, w) {
                                    best = best.max(x[((b * h + iy) * w + ix) * c + ch]);
                                }
                            }
                        }
                        assert_eq!(y[((b * oh + oy) * ow + ox) * c + ch], best);
                    }
                }
            }
        }
    }
}

#[test]
fn add_is_the_qdq_graph() {
    let mut seed = 5u64;
    let (a, b) = (bytes(&mut seed, 1000), bytes(&mut seed, 1000));
    let (qa, qb, q) = (Q8 { scale: 0.1, zero: 128 }, Q8 { scale: 0.037, zero: 3 }, Q8 { scale: 0.07, zero: 0 });
    for act in [None, Some(Activation::Relu), Some(Activation::Tanh)] {
        for isa in isas() {
            let mut y = vec![0u8; 1000];
            add(isa, &a, qa, &b, qb, act, q, &mut y, &Sequential);
            for i in 0..1000 {
                let v = qa.dequantize(a[i]) + qb.dequantize(b[i]);
                let v = act.map_or(v, |a| a.apply(v));
                assert_eq!(y[i], q.quantize(v), "{isa:?} {act:?} at {i}");
            }
        }
    }
}

#[test]
fn conversions_are_quantize_and_dequantize_linear() {
    for (n, c, hw) in [(2, 70, 130), (1, 3, 150), (2, 1, 37), (1, 2, 64), (1, 4, 33)] {
        conversions(n, c, hw);
    }
}

fn conversions(n: usize, c: usize, hw: usize) {
    let x: Vec<f32> = (0..n * c * hw).map(|i| ((i * 37 % 1001) as f32 - 500.0) * 0.013).collect();
    let q = Q8 { scale: 0.021, zero: 117 };
    let mut y = vec![0u8; x.len()];
    quantize_nchw(Isa::best(), &x, n, c, hw, q, &mut y, &Sequential);
    let mut portable = vec![0u8; x.len()];
    quantize_nchw(Isa::PORTABLE, &x, n, c, hw, q, &mut portable, &Sequential);
    assert_eq!(y, portable, "{c} channels");
    let mut back = vec![0f32; x.len()];
    dequantize_nhwc(&y, n, c, hw, q, &mut back, &Sequential);
    for b in 0..n {
        for ch in 0..c {
            for p in 0..hw {
                let want = q.quantize(x[(b * c + ch) * hw + p]);
                assert_eq!(y[(b * hw + p) * c + ch], want);
                assert_eq!(back[(b * c + ch) * hw + p], q.dequantize(want));
            }
        }
    }
}

#[test]
fn global_mean_is_the_mean_of_the_dequantized_bytes() {
    let mut seed = 9u64;
    let (n, hw, c) = (2, 49, 37);
    let x = bytes(&mut seed, n * hw * c);
    let q = Q8 { scale: 0.013, zero: 77 };
    let mut y = vec![0f32; n * c];
    aim_kernels::int8::pool::global_mean(&x, n, hw, c, q, &mut y, &Sequential);
    for b in 0..n {
        for ch in 0..c {
            let mean = (0..hw).map(|p| q.dequantize(x[(b * hw + p) * c + ch]) as f64).sum::<f64>() / hw as f64;
            assert!((y[b * c + ch] as f64 - mean).abs() <= 1e-6 * mean.abs().max(1.0), "{b} {ch}");
        }
    }
}

/// Table lookups of bytes (`aim:Lut8`) give `table[x]` for every byte value and any length
/// (whole 64-byte vectors and the tail), on every ISA.
#[test]
fn lookup_is_the_table() {
    let mut seed = 5u64;
    let table: [u8; 256] = std::array::from_fn(|_| lcg(&mut seed) as u8);
    for len in [0, 1, 63, 64, 65, 256, 1000, 70_000] {
        let x: Vec<u8> = (0..len).map(|i| if i < 256 { i as u8 } else { lcg(&mut seed) as u8 }).collect();
        let want: Vec<u8> = x.iter().map(|&v| table[v as usize]).collect();
        for isa in isas() {
            let mut y = vec![0u8; len];
            aim_kernels::int8::convert::lookup(isa, &x, &table, &mut y, &Sequential);
            assert_eq!(y, want, "{isa:?} length {len}");
        }
    }
}

/// Winograd at its channel limit (1,024), on the inputs and weights that make the
/// transformed values and the sums largest: the sums pass through i32 with wrap-around (see
/// `int8::winograd`) and must still come out exact; a wrong wrap would move a byte by 2³⁰
/// units of the sum, which these scales make about a hundred quanta.
#[test]
fn winograd_sums_are_exact_at_the_channel_limit() {
    // 36 tiles: three blocks, in two groups of transformed patches.
    let (h, w, c, m) = (12, 11, 1024, 6);
    let window = Window { kernel: [3, 3], stride: [1, 1], dilation: [1, 1], pads: [1; 4] };
    // Rows of 255 (largest sums) above a checkerboard of 255 and 0 (largest transformed
    // inputs), and filters of −128, of 127 and of both in checkerboards (largest
    // transformed filters).
    let x: Vec<u8> =
        (0..h * w * c).map(|i| if i / (c * w) < 3 || (i / c + i / (c * w)) % 2 == 0 { 255 } else { 0 }).collect();
    let wt: Vec<u8> = (0..m * c * 9)
        .map(|i| match (i / (c * 9), (i % 9 + i / 9 / 4) % 2) {
            (0, _) | (2.., 0) => 0x80,
            _ => 127,
        })
        .collect();
    let xq = Q8 { scale: 1.0, zero: (m % 2) as u8 };
    let out = Out8 { act: None, residual: None, q: Q8 { scale: 1.0, zero: 128 } };
    let scale = [3e-7f32];
    let k = Conv8::new(c, m, window, Weights8 { w: &wt, scale: &scale, bias: None }, xq, out).unwrap();
    let k = k.into_winograd(&wt).unwrap();
    let mut want = vec![0u8; h * w * m];
    for oy in 0..h {
        for ox in 0..w {
            for o in 0..m {
                let mut acc = 0i64;
                for ci in 0..c {
                    for t in 0..9 {
                        let v = window
                            .source(oy, ox, t / 3, t % 3, h, w)
                            .map_or(xq.zero, |(iy, ix)| x[(iy * w + ix) * c + ci]);
                        acc += (v as i64 - xq.zero as i64) * wt[(o * c + ci) * 9 + t] as i8 as i64;
                    }
                }
                want[(oy * w + ox) * m + o] = epilogue(acc, scale[0], 0.0, &out, None);
            }
        }
    }
    assert!(want.iter().any(|&b| b < 60) && want.iter().any(|&b| b > 190), "sums near the limit: {want:?}");
    for isa in isas() {
        let mut y = vec![0u8; want.len()];
        k.run(isa, &Nhwc { data: &x, n: 1, h, w, c }, None, &mut y, &Sequential);
        assert_eq!(y, want, "{isa:?}");
    }
}

/// An input too large to widen (over 8 MiB of bytes): the byte kernels run it on AVX2 (the
/// sign kernel for these weights, the portable one for weights with many −128s), exactly.
#[test]
fn a_large_input_keeps_the_byte_kernels() {
    let mut seed = 11u64;
    let window = Window { kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pads: [0; 4] };
    let case = Case { n: 1, h: 512, w: 1040, c: 16, m: 5, window, residual: false, act: None };
    let x = bytes(&mut seed, case.h * case.w * case.c);
    let clean: Vec<u8> =
        bytes(&mut seed, case.m * case.c).into_iter().map(|v| if v == 0x80 { 0x81 } else { v }).collect();
    let many: Vec<u8> = clean.iter().enumerate().map(|(i, &v)| if i % 3 == 0 { 0x80 } else { v }).collect();
    conv_case(&case, &mut seed, &x, &clean, Some("!widened"));
    conv_case(&case, &mut seed, &x, &many, Some("!widened"));
}
