//! The blocked kernels against a direct definition of convolution, for every ISA this CPU
//! runs, over strides, dilations, paddings, channel counts that do and do not fill a block,
//! both input layouts, residuals and activations.

use aim_kernels::gemm::{Activation, Isa, Parallel, Sequential};
use aim_kernels::nchwc::*;

/// A small deterministic generator (xorshift), values in [-1, 1).
fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// NCHW convolution by definition (group 1 or depthwise), with bias, residual, activation.
#[allow(clippy::too_many_arguments)]
fn naive(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    n: usize,
    cin: usize,
    cout: usize,
    h: usize,
    wd: usize,
    g: Geometry,
    pads: [usize; 2],
    oh: usize,
    ow: usize,
    depthwise: bool,
    res: Option<&[f32]>,
    act: Activation,
) -> Vec<f32> {
    let [kh, kw] = g.kernel;
    let cg = if depthwise { 1 } else { cin };
    let mut y = vec![0f32; n * cout * oh * ow];
    for img in 0..n {
        for co in 0..cout {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = b[co] as f64;
                    for cj in 0..cg {
                        let ci = if depthwise { co } else { cj };
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * g.strides[0] + ky * g.dilations[0]) as isize - pads[0] as isize;
                                let ix = (ox * g.strides[1] + kx * g.dilations[1]) as isize - pads[1] as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    let xv = x[((img * cin + ci) * h + iy as usize) * wd + ix as usize];
                                    s += xv as f64 * w[((co * cg + cj) * kh + ky) * kw + kx] as f64;
                                }
                            }
                        }
                    }
                    let at = ((img * cout + co) * oh + oy) * ow + ox;
                    let v = s as f32 + res.map_or(0.0, |r| r[at]);
                    y[at] = act.apply(v);
                }
            }
        }
    }
    y
}

fn isas() -> Vec<Isa> {
    Isa::all_available()
}

fn blocked(isa: Isa, x: &[f32], n: usize, c: usize, hw: usize) -> Vec<f32> {
    let l = lanes(isa);
    let mut y = vec![0f32; n * c.div_ceil(l) * hw * l];
    to_blocked(isa, x, n, c, hw, &mut y, &Sequential);
    y
}

/// Runs tasks in reverse order and claims eight threads: the kernels then split their
/// work finely, and a task that depends on another's order shows.
struct Reversed;

impl Parallel for Reversed {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).rev().for_each(f)
    }
    fn threads(&self) -> usize {
        8
    }
}

/// The sizes of one convolution run: batch, input and output planes, pads.
#[derive(Clone, Copy)]
struct Sizes {
    n: usize,
    h: usize,
    w: usize,
    pads: [usize; 4],
    oh: usize,
    ow: usize,
}

/// Runs a blocked kernel (`run`: its `run` method) on `x` (in the layout it takes) and the
/// blocked residual `res` — apart, or already in the output when `in_place` — into a blocked
/// output of `cout` channels first filled with NaN, and returns that output unblocked.
fn run_blocked(
    isa: Isa,
    sz: Sizes,
    cout: usize,
    x: &[f32],
    res: Option<&[f32]>,
    in_place: bool,
    run: impl FnOnce(ConvIo, &dyn Parallel) -> Result<(), String>,
) -> Vec<f32> {
    let l = lanes(isa);
    let mut y = match (in_place, res) {
        (true, Some(r)) => r.to_vec(),
        _ => vec![f32::NAN; sz.n * cout.div_ceil(l) * sz.oh * sz.ow * l],
    };
    let io = ConvIo {
        x,
        batch: sz.n,
        h: sz.h,
        w: sz.w,
        pads: sz.pads,
        oh: sz.oh,
        ow: sz.ow,
        residual: if in_place { None } else { res },
        residual_in_y: in_place,
        y: &mut y,
    };
    run(io, &Sequential).unwrap();
    let mut got = vec![0f32; sz.n * cout * sz.oh * sz.ow];
    from_blocked(isa, &y, sz.n, cout, sz.oh * sz.ow, &mut got, &Sequential);
    got
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{what}: element {i}: got {a}, want {b}");
    }
}

#[test]
fn reorders_match_the_definition() {
    let mut seed = 7;
    for isa in isas() {
        let l = lanes(isa);
        for &(n, c, hw) in &[(1, 3, 5), (2, 16, 7), (1, 24, 1), (2, 33, 9), (1, 16, 3000), (1, 20, 517), (2, 8, 64)] {
            let x = rand(n * c * hw, &mut seed);
            let blocks = c.div_ceil(l);
            let mut want = vec![0f32; n * blocks * hw * l];
            for img in 0..n {
                for ch in 0..c {
                    for p in 0..hw {
                        want[((img * blocks + ch / l) * hw + p) * l + ch % l] = x[(img * c + ch) * hw + p];
                    }
                }
            }
            for par in [&Sequential as &dyn Parallel, &Reversed] {
                let mut b = vec![f32::NAN; want.len()];
                to_blocked(isa, &x, n, c, hw, &mut b, par);
                assert_eq!(b, want, "{isa:?} to_blocked {n}x{c}x{hw}");
                let mut back = vec![f32::NAN; x.len()];
                from_blocked(isa, &b, n, c, hw, &mut back, par);
                assert_eq!(back, x, "{isa:?} from_blocked {n}x{c}x{hw}");
            }
        }
    }
}

#[test]
fn conv_matches_the_definition() {
    let mut seed = 1;
    // (cin, cout, h, w, kernel, stride, dilation, pads [t, l, b, r], input layout)
    let cases = [
        (16, 32, 5, 6, 1, 1, 1, [0, 0, 0, 0], Layout::Blocked),
        (24, 40, 7, 7, 1, 1, 1, [0, 0, 0, 0], Layout::Blocked),
        (8, 16, 9, 13, 3, 1, 1, [1, 1, 1, 1], Layout::Blocked),
        (20, 24, 9, 8, 3, 2, 1, [1, 1, 1, 1], Layout::Blocked),
        (16, 16, 8, 8, 1, 2, 1, [0, 0, 0, 0], Layout::Blocked),
        (5, 48, 11, 10, 3, 1, 2, [2, 2, 2, 2], Layout::Blocked),
        (3, 32, 15, 15, 3, 2, 1, [1, 1, 1, 1], Layout::Nchw),
        (3, 20, 16, 17, 7, 2, 1, [3, 3, 3, 3], Layout::Nchw),
        (4, 8, 6, 6, 2, 1, 1, [0, 1, 1, 0], Layout::Nchw),
        // Odd block counts (panels of three blocks, and a last panel of one or two).
        (8, 56, 6, 19, 3, 1, 1, [1, 1, 1, 1], Layout::Blocked),
        (16, 72, 5, 9, 1, 1, 1, [0, 0, 0, 0], Layout::Blocked),
        (24, 88, 4, 23, 1, 3, 1, [0, 1, 0, 2], Layout::Blocked),
        // Weights larger than the input and than one group of panels that stays in L2 (a
        // last group of fewer panels).
        (1024, 112, 4, 5, 1, 1, 1, [0, 0, 0, 0], Layout::Blocked),
    ];
    for isa in isas() {
        for (i, &(cin, cout, h, w, k, s, d, pads, layout)) in cases.iter().enumerate() {
            // Small k blocks too, so that partial sums wait in the output.
            let kc = [7, 64, 1000][i % 3];
            for (act, with_res) in [
                (Activation::Identity, false),
                (Activation::Relu, true),
                (Activation::Clip(-0.5, 0.5), false),
                (Activation::LeakyRelu(0.2), true),
            ] {
                let n = 2;
                let g = Geometry { kernel: [k, k], strides: [s, s], dilations: [d, d] };
                let oh = (h + pads[0] + pads[2] - (k - 1) * d - 1) / s + 1;
                let ow = (w + pads[1] + pads[3] - (k - 1) * d - 1) / s + 1;
                let x = rand(n * cin * h * w, &mut seed);
                let wt = rand(cout * cin * k * k, &mut seed);
                let b = rand(cout, &mut seed);
                let res = with_res.then(|| rand(n * cout * oh * ow, &mut seed));
                let want =
                    naive(&x, &wt, &b, n, cin, cout, h, w, g, [pads[0], pads[1]], oh, ow, false, res.as_deref(), act);
                let conv = Conv::new(isa, &wt, Some(&b), cout, cin, g, layout, act, kc);
                let xin = if layout == Layout::Blocked { blocked(isa, &x, n, cin, h * w) } else { x.clone() };
                let res_b = res.as_ref().map(|r| blocked(isa, r, n, cout, oh * ow));
                let sz = Sizes { n, h, w, pads, oh, ow };
                let mut got = run_blocked(isa, sz, cout, &xin, res_b.as_deref(), false, |io, par| conv.run(io, par));
                close(
                    &got,
                    &want,
                    &format!("{isa:?} conv {cin}->{cout} {h}x{w} k{k} s{s} d{d} {pads:?} {layout:?} {act:?}"),
                );
                // The same with the residual already in the output (overwritten in place).
                if let Some(r) = &res_b {
                    got = run_blocked(isa, sz, cout, &xin, Some(r), true, |io, par| conv.run(io, par));
                    close(
                        &got,
                        &want,
                        &format!(
                            "{isa:?} conv in place {cin}->{cout} {h}x{w} k{k} s{s} d{d} {pads:?} {layout:?} {act:?}"
                        ),
                    );
                }
            }
        }
    }
}

#[test]
fn depthwise_matches_the_definition() {
    let mut seed = 3;
    // (channels, h, w, kernel, stride, dilation, pads [t, l, b, r])
    let cases = [
        (16, 7, 7, 3, 1, 1, [1, 1, 1, 1]),
        (24, 14, 13, 3, 2, 1, [1, 1, 1, 1]),
        (32, 12, 12, 3, 2, 1, [0, 0, 1, 1]),
        (8, 9, 11, 5, 1, 1, [2, 2, 2, 2]),
        (40, 10, 9, 3, 1, 2, [2, 2, 2, 2]),
        (16, 2, 3, 3, 1, 1, [1, 1, 1, 1]),
        (12, 6, 20, 3, 3, 1, [1, 0, 1, 0]),
        (24, 7, 7, 5, 1, 1, [2, 2, 2, 2]),
        (16, 14, 14, 5, 2, 1, [2, 2, 2, 2]),
        (8, 3, 17, 5, 1, 1, [2, 2, 2, 2]),
        (8, 5, 2, 5, 1, 1, [2, 2, 2, 2]),
    ];
    for isa in isas() {
        for &(c, h, w, k, s, d, pads) in &cases {
            for (act, with_res) in [(Activation::Identity, true), (Activation::Clip(0.0, 0.6), false)] {
                let n = 2;
                let g = Geometry { kernel: [k, k], strides: [s, s], dilations: [d, d] };
                let oh = (h + pads[0] + pads[2] - (k - 1) * d - 1) / s + 1;
                let ow = (w + pads[1] + pads[3] - (k - 1) * d - 1) / s + 1;
                let x = rand(n * c * h * w, &mut seed);
                let wt = rand(c * k * k, &mut seed);
                let b = rand(c, &mut seed);
                let res = with_res.then(|| rand(n * c * oh * ow, &mut seed));
                let want = naive(&x, &wt, &b, n, c, c, h, w, g, [pads[0], pads[1]], oh, ow, true, res.as_deref(), act);
                let dw = Depthwise::new(isa, &wt, Some(&b), c, g, act);
                let xin = blocked(isa, &x, n, c, h * w);
                let res_b = res.as_ref().map(|r| blocked(isa, r, n, c, oh * ow));
                let sz = Sizes { n, h, w, pads, oh, ow };
                let got = run_blocked(isa, sz, c, &xin, res_b.as_deref(), false, |io, par| dw.run(io, par));
                close(&got, &want, &format!("{isa:?} depthwise {c} {h}x{w} k{k} s{s} d{d} {pads:?} {act:?}"));
            }
        }
    }
}

#[test]
fn winograd_matches_the_definition() {
    let mut seed = 5;
    // (cin, cout, h, w, pads [t, l, b, r]): outputs that do and do not fill 4×4 tiles.
    let cases = [
        (16, 32, 8, 8, [1, 1, 1, 1]),
        (24, 40, 7, 9, [1, 1, 1, 1]),
        (8, 16, 6, 5, [0, 0, 0, 0]),
        (32, 16, 13, 11, [1, 0, 1, 2]),
        (3, 8, 3, 3, [1, 1, 1, 1]),
    ];
    for isa in isas() {
        for &(cin, cout, h, w, pads) in &cases {
            for (act, with_res) in
                [(Activation::Identity, false), (Activation::Relu, true), (Activation::Clip(-0.5, 0.5), false)]
            {
                let n = 2;
                let g = Geometry { kernel: [3, 3], strides: [1, 1], dilations: [1, 1] };
                let (oh, ow) = (h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2);
                let x = rand(n * cin * h * w, &mut seed);
                let wt = rand(cout * cin * 9, &mut seed);
                let b = rand(cout, &mut seed);
                let res = with_res.then(|| rand(n * cout * oh * ow, &mut seed));
                let want =
                    naive(&x, &wt, &b, n, cin, cout, h, w, g, [pads[0], pads[1]], oh, ow, false, res.as_deref(), act);
                let wino = Winograd::new(isa, &wt, Some(&b), cout, cin, act, 64);
                let xin = blocked(isa, &x, n, cin, h * w);
                let res_b = res.as_ref().map(|r| blocked(isa, r, n, cout, oh * ow));
                let sz = Sizes { n, h, w, pads, oh, ow };
                let got = run_blocked(isa, sz, cout, &xin, res_b.as_deref(), false, |io, par| wino.run(io, par));
                // Winograd rounds differently from the direct sum: compare against the scale of
                // the sums before the activation (of up to 288 products of values in ±1).
                let raw = naive(
                    &x,
                    &wt,
                    &b,
                    n,
                    cin,
                    cout,
                    h,
                    w,
                    g,
                    [pads[0], pads[1]],
                    oh,
                    ow,
                    false,
                    res.as_deref(),
                    Activation::Identity,
                );
                let scale = raw.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert!((a - e).abs() <= 1e-5 * scale, "{isa:?} winograd {cin}->{cout} {h}x{w} {pads:?} {act:?}: element {i}: got {a}, want {e} (scale {scale})");
                }
            }
        }
    }
}

#[test]
fn pooling_matches_the_definition() {
    let mut seed = 9;
    // (channels, h, w, kernel, stride, pads [t, l, b, r])
    let cases = [
        (16, 8, 8, 3, 2, [1, 1, 1, 1]),
        (20, 7, 9, 2, 2, [0, 0, 0, 0]),
        (8, 5, 6, 3, 1, [1, 0, 1, 2]),
        (24, 112, 112, 3, 2, [1, 1, 1, 1]),
    ];
    for isa in isas() {
        let l = lanes(isa);
        for &(c, h, w, k, s, pads) in &cases {
            for (max, include_pad) in [(true, false), (false, false), (false, true)] {
                let n = 2;
                let p = Pool { max, kernel: [k, k], strides: [s, s], pads, include_pad };
                let (oh, ow) = p.output(h, w).unwrap();
                let mut x = rand(n * c * h * w, &mut seed);
                x[5] = f32::NAN;
                let mut want = vec![0f32; n * c * oh * ow];
                for plane in 0..n * c {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let (y0, x0) = ((oy * s) as isize - pads[0] as isize, (ox * s) as isize - pads[1] as isize);
                            let (mut m, mut sum, mut cnt) = (f32::NEG_INFINITY, 0f32, 0);
                            for iy in y0..y0 + k as isize {
                                for ix in x0..x0 + k as isize {
                                    if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                        let v = x[(plane * h + iy as usize) * w + ix as usize];
                                        m = if v > m || v.is_nan() || m.is_nan() {
                                            if m.is_nan() {
                                                m
                                            } else {
                                                v
                                            }
                                        } else {
                                            m
                                        };
                                        sum += v;
                                        cnt += 1;
                                    }
                                }
                            }
                            let padded = ((y0 + k as isize).min((h + pads[2]) as isize) - y0)
                                * ((x0 + k as isize).min((w + pads[3]) as isize) - x0);
                            want[(plane * oh + oy) * ow + ox] =
                                if max { m } else { sum / if include_pad { padded as f32 } else { cnt as f32 } };
                        }
                    }
                }
                let xin = blocked(isa, &x, n, c, h * w);
                let mut y = vec![f32::NAN; n * c.div_ceil(l) * oh * ow * l];
                p.run(isa, &xin, n, c.div_ceil(l), h, w, &mut y, &Sequential).unwrap();
                let mut got = vec![0f32; want.len()];
                from_blocked(isa, &y, n, c, oh * ow, &mut got, &Sequential);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{isa:?} pool {p:?} {c}x{h}x{w}: element {i}: got {a}, want {b}"
                    );
                }
            }
        }
        // Global average pooling ends the blocked region: NCHW out.
        for (n, c, hw) in [(2, 20, 49), (1, 33, 130), (1, 8, 3137)] {
            let x = rand(n * c * hw, &mut seed);
            let mut y = vec![0f32; n * c];
            global_average(isa, &blocked(isa, &x, n, c, hw), n, c, hw, &mut y, &Sequential).unwrap();
            for (i, v) in y.iter().enumerate() {
                let want = x[i * hw..(i + 1) * hw].iter().map(|&v| v as f64).sum::<f64>() / hw as f64;
                assert!((*v as f64 - want).abs() < 1e-6, "{isa:?} global average {c}x{hw} {i}: {v} vs {want}");
            }
        }
    }
}

#[test]
fn a_conv_refuses_buffers_that_do_not_fit() {
    let g = Geometry { kernel: [3, 3], strides: [1, 1], dilations: [1, 1] };
    let conv = Conv::new(Isa::PORTABLE, &[0.0; 16 * 8 * 9], None, 16, 8, g, Layout::Blocked, Activation::Identity, 64);
    let x = vec![0f32; 8 * 5 * 5];
    let mut y = vec![0f32; 16 * 5 * 5];
    // Too small an output for the given input.
    assert!(conv
        .run(
            ConvIo {
                x: &x,
                batch: 1,
                h: 5,
                w: 5,
                pads: [1; 4],
                oh: 5,
                ow: 5,
                residual: None,
                residual_in_y: false,
                y: &mut y[..100]
            },
            &Sequential
        )
        .is_err());
    // An output larger than the window allows.
    assert!(conv
        .run(
            ConvIo {
                x: &x,
                batch: 1,
                h: 5,
                w: 5,
                pads: [0; 4],
                oh: 5,
                ow: 5,
                residual: None,
                residual_in_y: false,
                y: &mut y
            },
            &Sequential
        )
        .is_err());
}
