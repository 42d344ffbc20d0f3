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
