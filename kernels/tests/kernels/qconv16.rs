//! The 16-bit convolution against its definition (the integer convolution of the input
//! and the weights less their zero points, summed in i64, then the scale and bias), bit for
//! bit: weights over the whole −255..=255 range, odd channel counts, output channels that
//! fill a panel partly, kernel sizes, strides, dilations, asymmetric padding, rows longer
//! than a segment, several images and threads; and the same values as the byte kernel.

use aim_kernels::gemm::{Isa, Parallel, Sequential};
use aim_kernels::qconv::*;
use aim_kernels::qconv16::*;

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

/// Runs tasks on scoped threads, two at a time, in a scrambled order.
struct Two;

impl Parallel for Two {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        std::thread::scope(|s| {
            s.spawn(|| (0..n).rev().filter(|i| i % 2 == 0).for_each(f));
            (0..n).filter(|i| i % 2 == 1).for_each(f);
        });
    }
    fn threads(&self) -> usize {
        2
    }
}

#[allow(clippy::too_many_arguments)]
fn want(
    s: &QConvShape,
    x: &[u8],
    n: usize,
    h: usize,
    w: usize,
    wt: &[i16],
    zx: u8,
    osb: (&[f32], &[f32], &[f32]),
) -> Vec<f32> {
    let (offset, scale, bias) = osb;
    let (oh, ow) = s.output(h, w).unwrap();
    let [kh, kw] = s.kernel;
    let mut y = vec![0f32; n * s.m * oh * ow];
    for b in 0..n {
        for o in 0..s.m {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0i64;
                    for ci in 0..s.c {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * s.stride[0] + ky * s.dilation[0]) as i64 - s.pads[0] as i64;
                                let ix = (ox * s.stride[1] + kx * s.dilation[1]) as i64 - s.pads[1] as i64;
                                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                                    continue;
                                }
                                let v = x[((b * s.c + ci) * h + iy as usize) * w + ix as usize] as i64 - zx as i64;
                                acc += v * wt[((o * s.c + ci) * kh + ky) * kw + kx] as i64;
                            }
                        }
                    }
                    let sc = scale[if scale.len() == 1 { 0 } else { o }];
                    let off = offset[if offset.len() == 1 { 0 } else { o }];
                    y[((b * s.m + o) * oh + oy) * ow + ox] = (acc as i32 as f32 + off) * sc + bias[o];
                }
            }
        }
    }
    y
}

#[test]
fn matches_the_definition_bit_for_bit() {
    let Some(isa) = Isa::all_available().into_iter().find(|&i| available(i)) else {
        // No AVX2 here: the kernel is never chosen, and it refuses to run.
        return;
    };
    let mut seed = 3u64;
    let cases = [
        // c, m, kernel, stride, dilation, pads, n, h, w
        (24, 24, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1, 9, 53),
        (1, 24, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], 1, 12, 20),
        (5, 7, [3, 1], [1, 2], [1, 1], [0, 1, 0, 0], 2, 4, 5),
        (48, 40, [1, 1], [1, 1], [1, 1], [0, 0, 0, 0], 1, 6, 50),
        (7, 17, [5, 5], [2, 1], [2, 1], [2, 0, 1, 2], 2, 11, 9),
        (16, 8, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1, 1, 1),
        (3, 56, [5, 1], [1, 1], [1, 1], [2, 0, 2, 0], 1, 30, 1),
        (96, 48, [1, 1], [1, 1], [1, 1], [0, 0, 0, 0], 1, 3, 97),
        (32, 16, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1, 4, 32),
    ];
    for &(c, m, kernel, stride, dilation, pads, n, h, w) in &cases {
        let s = QConvShape { c, m, group: 1, kernel, stride, dilation, pads };
        let taps = c * kernel[0] * kernel[1];
        let wt: Vec<i16> = (0..m * taps).map(|_| (lcg(&mut seed) % 511) as i16 - 255).collect();
        let x: Vec<u8> = (0..n * c * h * w).map(|_| lcg(&mut seed) as u8).collect();
        let zx = 131u8;
        let scale: Vec<f32> = (0..m).map(|o| 1e-3 * (1 + o) as f32).collect();
        let bias: Vec<f32> = (0..m).map(|o| o as f32 * 0.25 - 1.0).collect();
        // A quantized bias added to the sums before the scale (older quantize_dynamic's).
        let offset: Vec<f32> = (0..m).map(|_| (lcg(&mut seed) % 20001) as f32 - 10000.0).collect();
        let exact = want(&s, &x, n, h, w, &wt, zx, (&offset, &scale, &bias));
        let p = PackedConv16::new(s, &wt).unwrap();
        let input = QConvInput {
            x: QSource::Bytes(&x),
            n,
            h,
            w,
            scale: f32::NAN,
            zero: zx,
            offset: Some(&offset),
            out_scale: &scale,
            bias: Some(&bias),
            act: None,
            requant: None,
            post: None,
        };
        for par in [&Sequential as &dyn Parallel, &Two] {
            let mut y = vec![f32::NAN; exact.len()];
            conv16(isa, &p, &input, &mut y, par).unwrap();
            for (i, (a, b)) in y.iter().zip(&exact).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{s:?} at {i}: {a} vs {b}");
            }
        }
        // Weights clamped to s8 give the byte kernel's values too.
        {
            let small: Vec<i16> = wt.iter().map(|&v| v.clamp(-127, 127)).collect();
            let p16 = PackedConv16::new(s, &small).unwrap();
            let bytes: Vec<u8> = small.iter().map(|&v| v as i8 as u8).collect();
            let p8 = PackedQConv::new(s, &bytes).unwrap();
            let (mut a, mut b) = (vec![f32::NAN; exact.len()], vec![f32::NAN; exact.len()]);
            conv16(isa, &p16, &input, &mut a, &Sequential).unwrap();
            qconv(isa, &p8, &input, &mut b, &Sequential);
            assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{s:?}: not the byte kernel's");
        }
    }
}

#[test]
fn bad_operands_are_refused() {
    let s = QConvShape { c: 4, m: 2, group: 2, kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pads: [0; 4] };
    assert!(PackedConv16::new(s, &[0; 4]).is_err(), "groups");
    let s = QConvShape { group: 1, ..s };
    assert!(PackedConv16::new(s, &[0; 7]).is_err(), "weight count");
    let Some(isa) = Isa::all_available().into_iter().find(|&i| available(i)) else { return };
    let p = PackedConv16::new(s, &[1; 8]).unwrap();
    let x = [0u8; 4 * 9];
    let input = QConvInput {
        x: QSource::Bytes(&x),
        n: 1,
        h: 3,
        w: 3,
        scale: 1.0,
        zero: 0,
        offset: None,
        out_scale: &[1.0],
        bias: None,
        act: None,
        requant: None,
        post: None,
    };
    assert!(conv16(isa, &p, &input, &mut [0.0; 17], &Sequential).is_err(), "output size");
    let short = QConvInput { h: 4, ..input };
    assert!(conv16(isa, &p, &short, &mut [0.0; 32], &Sequential).is_err(), "input size");
    let twice = QConvInput { x: QSource::BytesTwice(&x), ..input };
    assert!(conv16(isa, &p, &twice, &mut [0.0; 18], &Sequential).is_err(), "bytes read twice");
}
