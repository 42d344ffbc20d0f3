//! The quantized convolution against its definition (QuantizeLinear, then the integer
//! convolution summed in i64, then the scale and bias), bit for bit: kernel sizes, strides,
//! dilations, asymmetric padding, groups, several images, on every kernel this CPU runs
//! (VNNI, AVX2, portable).

use aim_kernels::gemm::Isa;
use aim_kernels::gemm::Sequential;
use aim_kernels::qconv::*;

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

#[allow(clippy::too_many_arguments)]
fn want(
    s: &QConvShape,
    x: &[f32],
    n: usize,
    h: usize,
    w: usize,
    wt: &[i8],
    sx: f32,
    zx: u8,
    scale: &[f32],
    bias: &[f32],
) -> Vec<f32> {
    let (oh, ow) = s.output(h, w).unwrap();
    let q: Vec<i64> = x.iter().map(|&v| ((v / sx).round_ties_even() + zx as f32).clamp(0.0, 255.0) as i64).collect();
    let (cg, mg) = (s.c / s.group, s.m / s.group);
    let (kh, kw) = (s.kernel[0], s.kernel[1]);
    let mut y = vec![0f32; n * s.m * oh * ow];
    for b in 0..n {
        for o in 0..s.m {
            let g = o / mg;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0i64;
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * s.stride[0] + ky * s.dilation[0]) as i64 - s.pads[0] as i64;
                                let ix = (ox * s.stride[1] + kx * s.dilation[1]) as i64 - s.pads[1] as i64;
                                let c = g * cg + ci;
                                let v = if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                                    zx as i64
                                } else {
                                    q[((b * s.c + c) * h + iy as usize) * w + ix as usize]
                                };
                                acc += (v - zx as i64) * wt[((o * cg + ci) * kh + ky) * kw + kx] as i64;
                            }
                        }
                    }
                    let sc = scale[if scale.len() == 1 { 0 } else { o }];
                    y[((b * s.m + o) * oh + oy) * ow + ox] = acc as i32 as f32 * sc + bias[o];
                }
            }
        }
    }
    y
}

#[test]
fn matches_the_definition_bit_for_bit() {
    // Every ISA this CPU has: its VNNI, AVX2 and portable kernels.
    let isas = Isa::all_available();
    let mut seed = 5u64;
    let cases = [
        // c, m, group, kernel, stride, dilation, pads, n, h, w
        (3, 8, 1, [7, 7], [2, 2], [1, 1], [3, 3, 3, 3], 1, 19, 17),
        (16, 13, 1, [1, 1], [1, 1], [1, 1], [0, 0, 0, 0], 2, 6, 9),
        (8, 16, 1, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1, 9, 10),
        (8, 8, 2, [3, 3], [2, 2], [2, 1], [2, 0, 1, 2], 2, 11, 8),
        (5, 3, 1, [3, 1], [1, 2], [1, 1], [0, 1, 0, 0], 1, 4, 5),
        (32, 40, 4, [1, 1], [2, 2], [1, 1], [0, 0, 0, 0], 1, 7, 7),
        (24, 8, 2, [1, 1], [1, 1], [1, 1], [0, 0, 0, 0], 2, 5, 13),
    ];
    for &(c, m, group, kernel, stride, dilation, pads, n, h, w) in &cases {
        let s = QConvShape { c, m, group, kernel, stride, dilation, pads };
        let taps = c / group * kernel[0] * kernel[1];
        let wt: Vec<i8> = (0..m * taps).map(|_| (lcg(&mut seed) % 255) as i8).collect();
        let x: Vec<f32> = (0..n * c * h * w).map(|_| (lcg(&mut seed) % 2001) as f32 / 400.0 - 2.0).collect();
        let (sx, zx) = (0.02f32, 131u8);
        let scale: Vec<f32> = (0..m).map(|o| 1e-3 * (1 + o) as f32).collect();
        let bias: Vec<f32> = (0..m).map(|o| o as f32 * 0.25 - 1.0).collect();
        let exact = want(&s, &x, n, h, w, &wt, sx, zx, &scale, &bias);
        let bytes: Vec<u8> = wt.iter().map(|&v| v as u8).collect();
        let p = PackedQConv::new(s, &bytes).unwrap();
        for &isa in &isas {
            let mut y = vec![f32::NAN; exact.len()];
            let input = QConvInput {
                x: QSource::F32(&x),
                n,
                h,
                w,
                scale: sx,
                zero: zx,
                offset: None,
                out_scale: &scale,
                bias: Some(&bias),
                act: None,
                requant: None,
                post: None,
            };
            qconv(isa, &p, &input, &mut y, &Sequential);
            for (i, (a, b)) in y.iter().zip(&exact).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{isa:?} {s:?} at {i}: {a} vs {b}");
            }
            // With a quantize-dequantize of the result: the pair's f32 steps on the same sums.
            let rq = Requant { scale: 0.05, zero: 7.0, lo: 0.0, hi: 255.0 };
            let input = QConvInput { requant: Some(rq), ..input };
            qconv(isa, &p, &input, &mut y, &Sequential);
            for (i, (a, b)) in y.iter().zip(&exact).enumerate() {
                let q = ((b / rq.scale).round_ties_even() + rq.zero).clamp(rq.lo, rq.hi);
                let want = (q - rq.zero) * rq.scale;
                assert_eq!(a.to_bits(), want.to_bits(), "{isa:?} {s:?} requantized at {i}: {a} vs {want}");
            }
            // Bytes quantized beforehand (ConvInteger's input) give the same sums, whatever
            // the scale field says.
            let xq: Vec<u8> =
                x.iter().map(|v| ((v / sx).round_ties_even() + zx as f32).clamp(0.0, 255.0) as u8).collect();
            let input = QConvInput { x: QSource::Bytes(&xq), scale: f32::NAN, requant: None, ..input };
            let mut yb = vec![f32::NAN; exact.len()];
            qconv(isa, &p, &input, &mut yb, &Sequential);
            for (i, (a, b)) in yb.iter().zip(&exact).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{isa:?} {s:?} from bytes at {i}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn bad_weights_are_refused() {
    let s = QConvShape { c: 4, m: 2, group: 3, kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pads: [0; 4] };
    assert!(PackedQConv::new(s, &[0; 8]).is_err());
    let s = QConvShape { group: 1, ..s };
    assert!(PackedQConv::new(s, &[0; 7]).is_err());
}
