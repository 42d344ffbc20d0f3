//! The edges of a byte region: f32 NCHW values quantized into bytes NHWC (QuantizeLinear
//! exactly, the layout change in the same pass), and bytes NHWC dequantized into f32 NCHW
//! (DequantizeLinear exactly). Both go through tiles of 64 pixels × 64 channels, so that
//! reads and writes stay within a few cache lines each.

use super::{SharedMut, Q8};
use crate::gemm::{Isa, Parallel};

const TILE: usize = 64;

/// `y[(b, p, ch)] = q.quantize(x[(b, ch, p)])` for `n` images of `c` channels × `hw`
/// pixels: per tile of pixels, each channel's run quantized as one vector loop, then
/// interleaved.
///
/// Panics when a buffer does not hold `n·c·hw` values.
#[allow(clippy::too_many_arguments)]
pub fn quantize_nchw(isa: Isa, x: &[f32], n: usize, c: usize, hw: usize, q: Q8, y: &mut [u8], par: &dyn Parallel) {
    let len = n * c * hw;
    assert!(x.len() >= len && y.len() >= len, "the buffers do not hold {n}×{c}×{hw} values");
    let tiles = hw.div_ceil(TILE);
    let yp = SharedMut(y.as_mut_ptr());
    par.for_each(n * tiles, &|t| {
        let yp = yp;
        let (b, p0) = (t / tiles, (t % tiles) * TILE);
        let p1 = (p0 + TILE).min(hw);
        let np = p1 - p0;
        let mut buf = [0u8; TILE];
        // SAFETY: inside `y` (checked above); tasks write disjoint pixel ranges.
        let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add((b * hw + p0) * c), np * c) };
        for ch in 0..c {
            let src = &x[(b * c + ch) * hw + p0..(b * c + ch) * hw + p1];
            crate::fast::quant::quantize(isa, src, &mut buf[..np], q.scale, q.zero as f32);
            for (k, &v) in buf[..np].iter().enumerate() {
                dst[k * c + ch] = v;
            }
        }
    });
}

/// `y[(b, ch, p)] = q.dequantize(x[(b, p, ch)])` for `n` images of `c` channels × `hw`
/// pixels.
///
/// Panics when a buffer does not hold `n·c·hw` values.
pub fn dequantize_nhwc(x: &[u8], n: usize, c: usize, hw: usize, q: Q8, y: &mut [f32], par: &dyn Parallel) {
    let len = n * c * hw;
    assert!(x.len() >= len && y.len() >= len, "the buffers do not hold {n}×{c}×{hw} values");
    let ctiles = c.div_ceil(TILE);
    let yp = SharedMut(y.as_mut_ptr());
    par.for_each(n * ctiles, &|t| {
        let yp = yp;
        let (b, c0) = (t / ctiles, (t % ctiles) * TILE);
        let c1 = (c0 + TILE).min(c);
        let mut buf = [0f32; TILE * TILE];
        for p0 in (0..hw).step_by(TILE) {
            let p1 = (p0 + TILE).min(hw);
            for p in p0..p1 {
                let src = &x[(b * hw + p) * c + c0..(b * hw + p) * c + c1];
                for (k, &v) in src.iter().enumerate() {
                    buf[k * TILE + (p - p0)] = q.dequantize(v);
                }
            }
            for ch in c0..c1 {
                let row = &buf[(ch - c0) * TILE..(ch - c0) * TILE + (p1 - p0)];
                // SAFETY: inside `y` (checked above); tasks write disjoint channel ranges.
                let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add((b * c + ch) * hw + p0), p1 - p0) };
                dst.copy_from_slice(row);
            }
        }
    });
}
