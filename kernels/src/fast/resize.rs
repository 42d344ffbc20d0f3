//! Resize of f32 tensors over one or two adjacent axes (the spatial axes of NCHW, or of the
//! blocked layout with its lanes as the innermost dim): the taps of every output position
//! come from the reference kernel's plan (`ops::resize::plan`, so every mode and coordinate
//! transformation agrees with it), and each output row is a weighted sum of input rows,
//! with the innermost dim (the lanes) contiguous. Cases it does not take (more axes, the
//! crop-box extrapolation of tf_crop_and_resize) run the reference kernel.

use super::output::Output;
use super::Ctx;
use crate::ops::resize::{plan, Taps};
use crate::util::Result;
use crate::util::SharedMut;
use aim_ir::{DType, Node, Tensor};

/// (source index, weight) taps of every output position along one axis.
type AxisTaps = Vec<Vec<(usize, f32)>>;

/// Concrete taps: (source index, weight) per output position; `None` if any position is
/// outside the crop box.
fn concrete(taps: &[Taps]) -> Option<AxisTaps> {
    taps.iter().map(|t| t.as_ref().map(|t| t.iter().map(|&(i, w)| (i, w as f32)).collect())).collect()
}

/// The fast Resize, or `None` for the cases it leaves to the reference kernel.
pub(super) fn resize(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref().filter(|t| t.dtype() == DType::F32)?;
    let p = match plan(n, ins) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    let xs = x.shape();
    let (hy, wy): (Option<(usize, AxisTaps)>, (usize, AxisTaps)) = match p.axes.as_slice() {
        [] => return Some(Ok(vec![x.clone()])),
        [(d, t)] => (None, (*d, concrete(t)?)),
        [(d0, t0), (d1, t1)] if *d1 == d0 + 1 => (Some((*d0, concrete(t0)?)), (*d1, concrete(t1)?)),
        _ => return None,
    };
    let wd = wy.0;
    let hd = hy.as_ref().map_or(wd, |h| h.0);
    let outer: usize = xs[..hd].iter().product();
    let inner: usize = xs[wd + 1..].iter().product();
    let (hin, win) = (if hy.is_some() { xs[hd] } else { 1 }, xs[wd]);
    let (hout, wout) = (if hy.is_some() { p.out[hd] } else { 1 }, p.out[wd]);
    let ytaps: AxisTaps = match hy {
        Some((_, t)) => t,
        None => vec![vec![(0, 1.0)]],
    };
    let xtaps = wy.1;
    let mut y = match Output::new(cx.out, DType::F32, &p.out) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let src = x.data::<f32>();
    let dst = SharedMut(y.bits_mut().as_mut_ptr());
    let row_in = win * inner;
    let row_out = wout * inner;
    if row_out == 0 {
        return Some(Ok(vec![y.finish()]));
    }
    // Runs of output rows with the same vertical taps (an upsampling by 2 reads each source
    // row for two output rows): the first row of a run is computed, the others copied
    // from it whole.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for oy in 0..hout {
        match runs.last_mut() {
            Some((start, len)) if ytaps[*start] == ytaps[oy] => *len += 1,
            _ => runs.push((oy, 1)),
        }
    }
    cx.par.for_each(outer * runs.len(), &|t| {
        let dst = dst;
        let (o, (oy, len)) = (t / runs.len(), runs[t % runs.len()]);
        let plane = &src[o * hin * row_in..(o + 1) * hin * row_in];
        // SAFETY: task t writes output rows oy..oy + len of image o alone.
        let rows = unsafe { std::slice::from_raw_parts_mut(dst.0.add((o * hout + oy) * row_out), len * row_out) };
        let (out, rest) = rows.split_at_mut(row_out);
        let ty = &ytaps[oy];
        if let [(sy, w)] = ty.as_slice() {
            // One source row (nearest, or a whole coordinate): horizontal taps only.
            let srow = &plane[sy * row_in..(sy + 1) * row_in];
            horizontal(srow, out, &xtaps, inner, *w);
        } else {
            // A weighted sum of source rows first, then the horizontal taps.
            let mut acc = vec![0f32; row_in];
            for &(sy, w) in ty {
                for (a, &v) in acc.iter_mut().zip(&plane[sy * row_in..(sy + 1) * row_in]) {
                    *a += w * v;
                }
            }
            horizontal(&acc, out, &xtaps, inner, 1.0);
        }
        for r in rest.chunks_exact_mut(row_out) {
            r.copy_from_slice(out);
        }
    });
    Some(Ok(vec![y.finish()]))
}

/// `out[x] = scale · Σ w · row[sx]` over the horizontal taps, `inner` floats per position.
#[inline(always)]
fn horizontal(row: &[f32], out: &mut [f32], xtaps: &AxisTaps, inner: usize, scale: f32) {
    for (ox, taps) in xtaps.iter().enumerate() {
        let o = &mut out[ox * inner..(ox + 1) * inner];
        match taps.as_slice() {
            [(sx, w)] if *w * scale == 1.0 => super::copy_short(o, &row[sx * inner..(sx + 1) * inner]),
            _ => {
                o.iter_mut().for_each(|v| *v = 0.0);
                for &(sx, w) in taps {
                    let w = w * scale;
                    for (v, &s) in o.iter_mut().zip(&row[sx * inner..(sx + 1) * inner]) {
                        *v += w * s;
                    }
                }
            }
        }
    }
}
