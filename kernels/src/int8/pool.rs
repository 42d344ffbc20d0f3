//! Max pooling of bytes NHWC. Quantization is monotonic (its scale is positive), so the
//! largest byte of a window is the quantization of the largest value: the result has the
//! input's quantization and equals QuantizeLinear(MaxPool(DequantizeLinear(x))) exactly.

use super::{Nhwc, SharedMut, Window};
use crate::gemm::Parallel;

/// `y` (bytes NHWC, `n × oh × ow × c`) = the max of each window of `x`; padding never
/// wins (a window with no tap inside the input gives the smallest byte, 0).
///
/// Panics when a buffer does not fit the shapes given.
pub fn max_pool(window: &Window, x: &Nhwc, (oh, ow): (usize, usize), y: &mut [u8], par: &dyn Parallel) {
    let c = x.c;
    assert!(x.fits(), "the input does not hold its shape");
    assert!(y.len() >= x.n * oh * ow * c, "the output is too small");
    let lines = x.n * oh;
    let per = lines.div_ceil(par.threads() * 4).max(1);
    let yp = SharedMut(y.as_mut_ptr());
    let [kh, kw] = window.kernel;
    par.for_each(lines.div_ceil(per), &|t| {
        let yp = yp;
        for line in t * per..((t + 1) * per).min(lines) {
            let (img, oy) = (line / oh, line % oh);
            for ox in 0..ow {
                let at = (line * ow + ox) * c;
                // SAFETY: inside `y` (checked above); tasks write disjoint lines.
                let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(at), c) };
                dst.fill(0);
                for ky in 0..kh {
                    for kx in 0..kw {
                        if let Some((iy, ix)) = window.source(oy, ox, ky, kx, x.h, x.w) {
                            let src = &x.data[((img * x.h + iy) * x.w + ix) * c..][..c];
                            dst.iter_mut().zip(src).for_each(|(d, &s)| *d = (*d).max(s));
                        }
                    }
                }
            }
        }
    });
}

/// GlobalAveragePool of bytes NHWC into f32 `[n, c]` (NCHW `[n, c, 1, 1]`): each channel's
/// `hw` bytes summed exactly as integers, the mean of their dequantized values
/// `(Σx / hw − zero) · scale` computed in f64 and rounded once.
///
/// Panics when a buffer does not fit the shapes given.
pub fn global_mean(x: &[u8], n: usize, hw: usize, c: usize, q: super::Q8, y: &mut [f32], par: &dyn Parallel) {
    assert!(x.len() >= n * hw * c && y.len() >= n * c, "the buffers do not fit {n}×{hw}×{c}");
    let yp = SharedMut(y.as_mut_ptr());
    par.for_each(n, &|b| {
        let yp = yp;
        let mut sums = vec![0u32; c];
        for p in 0..hw {
            let px = &x[(b * hw + p) * c..(b * hw + p + 1) * c];
            sums.iter_mut().zip(px).for_each(|(s, &v)| *s += v as u32);
        }
        // SAFETY: image b's c outputs, written by this task alone.
        let out = unsafe { std::slice::from_raw_parts_mut(yp.0.add(b * c), c) };
        for (o, &s) in out.iter_mut().zip(&sums) {
            *o = ((s as f64 / hw.max(1) as f64 - q.zero as f64) * q.scale as f64) as f32;
        }
    });
}
