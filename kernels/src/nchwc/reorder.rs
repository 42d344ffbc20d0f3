//! Conversions between NCHW and the blocked layout, at the edges of a blocked region.

use super::shared::OutPtr;
use crate::gemm::Parallel;

/// `x` (`[n][c][hw]`) into `y` (`[n][ceil(c/L)][hw][L]`), padding channels zero.
pub fn to_blocked(x: &[f32], n: usize, c: usize, hw: usize, lanes: usize, y: &mut [f32], par: &dyn Parallel) {
    let blocks = c.div_ceil(lanes);
    assert!(x.len() == n * c * hw && y.len() == n * blocks * hw * lanes, "to_blocked: sizes do not match");
    let yp = OutPtr(y.as_mut_ptr());
    par.for_each(n * blocks, &|t| {
        let yp = yp;
        let (img, blk) = (t / blocks, t % blocks);
        // SAFETY: task t writes block t.
        let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(t * hw * lanes), hw * lanes) };
        let chans = (c - blk * lanes).min(lanes);
        if chans < lanes {
            dst.fill(0.0);
        }
        for l in 0..chans {
            let src = &x[(img * c + blk * lanes + l) * hw..][..hw];
            for (p, &v) in src.iter().enumerate() {
                dst[p * lanes + l] = v;
            }
        }
    });
}

/// `x` (`[n][ceil(c/L)][hw][L]`) into `y` (`[n][c][hw]`), dropping padding channels.
pub fn from_blocked(x: &[f32], n: usize, c: usize, hw: usize, lanes: usize, y: &mut [f32], par: &dyn Parallel) {
    let blocks = c.div_ceil(lanes);
    assert!(y.len() == n * c * hw && x.len() == n * blocks * hw * lanes, "from_blocked: sizes do not match");
    let yp = OutPtr(y.as_mut_ptr());
    par.for_each(n * c, &|t| {
        let yp = yp;
        let (img, ch) = (t / c, t % c);
        // SAFETY: task t writes channel plane t.
        let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(t * hw), hw) };
        let src = &x[(img * blocks + ch / lanes) * hw * lanes..][..hw * lanes];
        for (p, d) in dst.iter_mut().enumerate() {
            *d = src[p * lanes + ch % lanes];
        }
    });
}
