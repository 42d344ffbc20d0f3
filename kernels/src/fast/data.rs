//! Data movement of any dtype as block copies of bytes (parallel when large): Concat, Split,
//! Slice (block copies with unit steps, element gathers with positive steps), and Gather of
//! whole rows. Each returns `None` for what it does not
//! take (negative steps), and checks shapes the way the reference kernel does, leaving the
//! error messages to it (a mismatch falls back to the reference, which reports it).

use super::copy::copy_bytes;
use super::output::Output;
use super::Ctx;
use crate::util::Result;
use crate::util::SharedMut;
use aim_ir::{DType, Node, Tensor};

/// The inputs present, when they all have one dtype.
fn same_dtype(ins: &[Option<Tensor>]) -> Option<(Vec<&Tensor>, DType)> {
    let ts: Vec<&Tensor> = ins.iter().flatten().collect();
    let d = ts.first()?.dtype();
    ts.iter().all(|t| t.dtype() == d).then_some((ts, d))
}

fn norm_axis(a: i64, r: usize) -> Option<usize> {
    let a = if a < 0 { a + r as i64 } else { a };
    (0..r as i64).contains(&a).then_some(a as usize)
}

/// Steps a row-major multi-index over `dims` to the next position (wrapping to zeros).
fn next_index(idx: &mut [usize], dims: &[usize]) {
    for d in (0..dims.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return;
        }
        idx[d] = 0;
    }
}

/// Below this many bytes a copy runs on the calling thread: waking the pool costs more.
const SERIAL_BYTES: usize = 32 * 1024;

/// Copies `count` parts (part `i` is `(source, offset in source, destination offset,
/// length)`, in elements of `es` bytes) into `dst`, in parallel when there is enough to
/// copy. The parts are computed as they are copied, not collected first: a slice of a
/// `[32, 129, 5]` tensor to `[32, 129, 4]` has 4,128 parts of 16 bytes, and a list of them
/// cost as much as the copies.
fn copy_parts<'a>(
    cx: &Ctx,
    dst: &mut [u8],
    es: usize,
    count: usize,
    part: impl Fn(usize) -> (&'a [u8], usize, usize, usize) + Sync,
) {
    let out = SharedMut(dst.as_mut_ptr());
    let n = dst.len();
    let range = |lo: usize, hi: usize| {
        let out = out;
        for k in lo..hi {
            let (src, from, to, len) = part(k);
            let (from, to, len) = (from * es, to * es, len * es);
            assert!(to + len <= n && from + len <= src.len(), "copy part in bounds");
            // SAFETY: the parts' destination ranges are disjoint and in bounds (checked).
            let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(to), len) };
            copy_bytes(d, &src[from..from + len]);
        }
    };
    if n < SERIAL_BYTES || count < 2 {
        range(0, count);
    } else {
        let tasks = count.min(4 * cx.par.threads().max(1));
        cx.par.for_each(tasks, &|t| range(t * count / tasks, (t + 1) * count / tasks));
    }
}

/// Concat: for each index of the dims before the axis, each input's block.
pub(super) fn concat(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let (ts, dtype) = same_dtype(ins)?;
    let first = ts.first()?;
    let r = first.rank();
    let ax = norm_axis(n.int("axis", 0), r)?;
    if ts.iter().any(|t| t.rank() != r || (0..r).any(|d| d != ax && t.shape()[d] != first.shape()[d])) {
        return None;
    }
    let mut shape = first.shape().to_vec();
    shape[ax] = ts.iter().map(|t| t.shape()[ax]).sum();
    let outer: usize = shape[..ax].iter().product();
    let row: usize = shape[ax..].iter().product();
    let mut y = match Output::new(cx.out, dtype, &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    // Each input's block length and its offset in an output row.
    let lens: Vec<usize> = ts.iter().map(|t| t.shape()[ax..].iter().product()).collect();
    let offsets: Vec<usize> = lens.iter().scan(0, |at, &l| Some(std::mem::replace(at, *at + l))).collect();
    let k = ts.len();
    copy_parts(cx, y.bytes_mut(), dtype.size(), outer * k, |i| {
        let (o, t) = (i / k, i % k);
        (ts[t].bytes(), o * lens[t], o * row + offsets[t], lens[t])
    });
    Some(Ok(vec![y.finish()]))
}

/// Split of a tensor into the sizes given (or equal parts).
pub(super) fn split(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref()?;
    let ax = norm_axis(n.int("axis", 0), x.rank())?;
    let dim = x.shape()[ax];
    let sizes: Vec<usize> = match ins.get(1).and_then(|s| s.as_ref()) {
        Some(s) => s.to_i64_vec().iter().map(|&v| usize::try_from(v).ok()).collect::<Option<_>>()?,
        None => {
            let k = n.opt_int("num_outputs").map(|v| v as usize).unwrap_or(n.outputs.len()).max(1);
            let chunk = dim.div_ceil(k);
            (0..k).map(|i| chunk.min(dim.saturating_sub(i * chunk))).collect()
        }
    };
    if sizes.iter().try_fold(0usize, |a, &p| a.checked_add(p)) != Some(dim) {
        return None;
    }
    let outer: usize = x.shape()[..ax].iter().product();
    let inner: usize = x.shape()[ax + 1..].iter().product();
    let (src, dtype) = (x.bytes(), x.dtype());
    let mut outs = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for (k, &s) in sizes.iter().enumerate() {
        let mut shape = x.shape().to_vec();
        shape[ax] = s;
        // The first output may go into the slot offered; the others are new tensors.
        let mut y = match Output::new(if k == 0 { cx.out } else { None }, dtype, &shape) {
            Ok(y) => y,
            Err(e) => return Some(Err(e)),
        };
        copy_parts(cx, y.bytes_mut(), dtype.size(), outer, |o| {
            (src, (o * dim + start) * inner, o * s * inner, s * inner)
        });
        outs.push(y.finish());
        start += s;
    }
    Some(Ok(outs))
}

/// Slice with unit steps: contiguous runs of the innermost sliced dims.
pub(super) fn slice(_n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref()?;
    let ints = |i: usize| ins.get(i).and_then(|t| t.as_ref()).map(|t| t.to_i64_vec());
    let (starts, ends) = (ints(1)?, ints(2)?);
    let r = x.rank();
    let axes: Vec<usize> = match ints(3) {
        Some(a) => a.iter().map(|&v| norm_axis(v, r)).collect::<Option<_>>()?,
        None => (0..starts.len()).collect(),
    };
    if ends.len() != starts.len() || axes.len() != starts.len() {
        return None;
    }
    if let Some(steps) = ints(4).filter(|s| s.iter().any(|&v| v != 1)) {
        return strided_slice(x, &starts, &ends, &axes, &steps, cx);
    }
    let mut lo = vec![0usize; r];
    let mut shape = x.shape().to_vec();
    for (i, &a) in axes.iter().enumerate() {
        let d = x.shape()[a] as i128;
        let fix = |v: i64| (if v < 0 { v as i128 + d } else { v as i128 }).clamp(0, d);
        let (s, e) = (fix(starts[i]), fix(ends[i]));
        lo[a] = s as usize;
        shape[a] = (e - s).max(0) as usize;
    }
    let mut y = match Output::new(cx.out, x.dtype(), &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    // Contiguous runs: the trailing dims that are taken whole, times the last sliced one.
    let st = crate::util::strides(x.shape());
    let mut k = r;
    while k > 0 && shape[k - 1] == x.shape()[k - 1] && lo[k - 1] == 0 {
        k -= 1;
    }
    let run: usize = if k == 0 { shape.iter().product() } else { shape[k - 1..].iter().product() };
    let outer_dims = &shape[..k.saturating_sub(1)];
    let count: usize = outer_dims.iter().product();
    let src = x.bytes();
    let first = if k > 0 { lo[k - 1] * st[k - 1] } else { 0 };
    if run > 0 {
        copy_parts(cx, y.bytes_mut(), x.dtype().size(), count, |i| {
            // Part i's source: its outer multi-index, innermost dim last.
            let (mut rest, mut base) = (i, first);
            for d in (0..outer_dims.len()).rev() {
                base += (lo[d] + rest % outer_dims[d]) * st[d];
                rest /= outer_dims[d];
            }
            (src, base, i * run, run)
        });
    }
    Some(Ok(vec![y.finish()]))
}

/// Slice with positive steps (YOLOv5/YOLOX's Focus: `x[..., ::2, ::2]`): each output row
/// (the last axis) gathered with the last axis's step from the source row its outer indices
/// select. Negative steps are left to the reference.
fn strided_slice(
    x: &Tensor,
    starts: &[i64],
    ends: &[i64],
    axes: &[usize],
    steps: &[i64],
    cx: &Ctx,
) -> Option<Result<Vec<Tensor>>> {
    let r = x.rank();
    if r == 0 || steps.len() != starts.len() || steps.iter().any(|&v| v < 1) {
        return None;
    }
    let (mut lo, mut step, mut shape) = (vec![0usize; r], vec![1usize; r], x.shape().to_vec());
    for (i, &a) in axes.iter().enumerate() {
        let d = x.shape()[a] as i128;
        let fix = |v: i64| (if v < 0 { v as i128 + d } else { v as i128 }).clamp(0, d);
        let (s, e, k) = (fix(starts[i]), fix(ends[i]), steps[i] as i128);
        lo[a] = s as usize;
        step[a] = k as usize;
        shape[a] = if e > s { ((e - s + k - 1) / k) as usize } else { 0 };
    }
    let mut y = match Output::new(cx.out, x.dtype(), &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let es = x.dtype().size();
    let st = crate::util::strides(x.shape());
    let (src, dst) = (x.bytes(), y.bytes_mut());
    let width = shape[r - 1];
    let rows: usize = shape[..r - 1].iter().product();
    let mut idx = vec![0usize; r - 1];
    for row in 0..if width == 0 { 0 } else { rows } {
        let base: usize = (0..r - 1).map(|d| (lo[d] + idx[d] * step[d]) * st[d]).sum::<usize>() + lo[r - 1];
        let out = &mut dst[row * width * es..(row + 1) * width * es];
        for (j, e) in out.chunks_exact_mut(es).enumerate() {
            let at = (base + j * step[r - 1]) * es;
            e.copy_from_slice(&src[at..at + es]);
        }
        next_index(&mut idx, &shape[..r - 1]);
    }
    Some(Ok(vec![y.finish()]))
}

/// Gather of whole rows (any axis, any dtype): block copies per index.
pub(super) fn gather(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref()?;
    let idx = ins.get(1)?.as_ref().filter(|t| t.dtype().is_int())?;
    let ax = norm_axis(n.int("axis", 0), x.rank())?;
    let dim = x.shape()[ax];
    let ids: Vec<usize> = idx
        .to_i64_vec()
        .iter()
        .map(|&i| {
            let i = if i < 0 { i + dim as i64 } else { i };
            (0..dim as i64).contains(&i).then_some(i as usize)
        })
        .collect::<Option<_>>()?;
    let mut shape = x.shape()[..ax].to_vec();
    shape.extend(idx.shape());
    shape.extend(&x.shape()[ax + 1..]);
    let outer: usize = x.shape()[..ax].iter().product();
    let inner: usize = x.shape()[ax + 1..].iter().product();
    let mut y = match Output::new(cx.out, x.dtype(), &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let src = x.bytes();
    if inner > 0 && !ids.is_empty() {
        let n = ids.len();
        copy_parts(cx, y.bytes_mut(), x.dtype().size(), outer * n, |p| {
            let (o, j) = (p / n, p % n);
            (src, (o * dim + ids[j]) * inner, p * inner, inner)
        });
    }
    Some(Ok(vec![y.finish()]))
}

/// Where output index `i` of an axis of `dim` elements padded by `before` reads from, for
/// `mode`: Some(source index), or None for the constant.
fn pad_source(i: usize, before: usize, dim: usize, mode: &str) -> Option<usize> {
    let j = i as i64 - before as i64;
    let d = dim as i64;
    if (0..d).contains(&j) {
        return Some(j as usize);
    }
    Some(match mode {
        "edge" => j.clamp(0, d - 1) as usize,
        "reflect" if d == 1 => 0,
        "reflect" => {
            let period = 2 * (d - 1);
            let k = j.rem_euclid(period);
            (if k >= d { period - k } else { k }) as usize
        }
        "wrap" => j.rem_euclid(d) as usize,
        _ => return None,
    })
}

/// Pad of any dtype with non-negative pads (constant, edge, reflect or wrap): each output row
/// (the last axis) is the source row copied whole into its middle, its padded ends filled per
/// element. Negative pads (crops) and padding an empty tensor are left to the reference.
pub(super) fn pad(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref()?;
    let pads = ins.get(1)?.as_ref()?.to_i64_vec();
    let r = x.rank();
    let axes: Vec<usize> = match ins.get(3).and_then(|t| t.as_ref()) {
        Some(a) => a.to_i64_vec().iter().map(|&v| norm_axis(v, r)).collect::<Option<_>>()?,
        None => (0..r).collect(),
    };
    let mode = n.string("mode", "constant");
    if r == 0 || x.is_empty() || pads.len() != 2 * axes.len() || pads.iter().any(|&p| p < 0) {
        return None;
    }
    if !matches!(mode, "constant" | "edge" | "reflect" | "wrap") {
        return None;
    }
    let (mut before, mut after) = (vec![0usize; r], vec![0usize; r]);
    for (i, &a) in axes.iter().enumerate() {
        before[a] = pads[i] as usize;
        after[a] = pads[i + axes.len()] as usize;
    }
    let shape: Vec<usize> = (0..r).map(|d| x.shape()[d] + before[d] + after[d]).collect();
    let value = ins.get(2).and_then(|t| t.as_ref()).and_then(|v| v.to_f64_vec().first().copied()).unwrap_or(0.0);
    let fill = Tensor::from_f64(x.dtype(), &[1], &[value]);
    let mut y = match Output::new(cx.out, x.dtype(), &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    // Trailing axes with no padding are one element of the axis before them: a row is
    // then the last padded axis, not one value of a unit last dimension (a [1, 76, 32, 1]
    // input padded on axis 2 is 76 rows of 34 four-byte elements, not 2,584 rows of one).
    let r_all = r;
    let r = (0..r_all).rev().find(|&d| before[d] + after[d] > 0).map_or(1, |d| d + 1);
    let inner: usize = x.shape()[r..r_all].iter().product();
    let es = x.dtype().size() * inner;
    let fill = fill.bytes().repeat(inner);
    let (fill, src) = (&fill[..], x.bytes());
    let xshape = &x.shape()[..r];
    let shape = &shape[..r];
    let (last, width) = (xshape[r - 1], shape[r - 1]);
    let st = crate::util::strides(xshape);
    let dst = y.bytes_mut();
    let rows = shape[..r - 1].iter().product::<usize>();
    // The padded ends of a row: each position's source element (None: the constant), the
    // same for every row, found once instead of per element of every row.
    let ends: Vec<(usize, Option<usize>)> = (0..before[r - 1])
        .chain(before[r - 1] + last..width)
        .map(|j| (j, pad_source(j, before[r - 1], last, mode)))
        .collect();
    let mut idx = vec![0usize; r - 1];
    for row in 0..rows {
        let out = &mut dst[row * width * es..(row + 1) * width * es];
        // The source row, or None when some outer axis reads the constant.
        let base = (0..r - 1)
            .try_fold(0usize, |acc, d| pad_source(idx[d], before[d], xshape[d], mode).map(|s| acc + s * st[d]));
        match base {
            None => out.chunks_exact_mut(es).for_each(|e| e.copy_from_slice(fill)),
            Some(b) => {
                let (lo, hi) = (before[r - 1] * es, (before[r - 1] + last) * es);
                copy_bytes(&mut out[lo..hi], &src[b * es..(b + last) * es]);
                for &(j, s) in &ends {
                    let e = &mut out[j * es..(j + 1) * es];
                    match s {
                        Some(s) => copy_bytes(e, &src[(b + s) * es..(b + s + 1) * es]),
                        None => copy_bytes(e, fill),
                    }
                }
            }
        }
        next_index(&mut idx, &shape[..r - 1]);
    }
    Some(Ok(vec![y.finish()]))
}
