//! Fast f32 reductions over any run of consecutive axes (the mean over the height of a CRNN's
//! feature map, a pooled sequence, a per-channel sum): ReduceSum, ReduceMean, ReduceMax,
//! ReduceMin and ReduceSumSquare as `outer × group × inner`, accumulating whole rows of
//! `inner` values at a time (vector adds along the contiguous dim) and in parallel over
//! `outer`. Reductions over the trailing axes alone are usually generated code already
//! (`aim:Reduce`); this takes the others. Non-consecutive axes, empty groups and other
//! dtypes go to the reference kernel.

use super::output::Output;
use super::Ctx;
use crate::util::Result;
use crate::util::SharedMut;
use aim_ir::{DType, Node, Tensor};

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Sum,
    Mean,
    Max,
    Min,
    SumSquare,
}

/// ReduceSum/Mean/Max/Min/SumSquare of f32 over consecutive axes.
pub(super) fn reduce(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref().filter(|t| t.dtype() == DType::F32)?;
    let op = match n.op.as_str() {
        "ReduceSum" => Op::Sum,
        "ReduceMean" => Op::Mean,
        "ReduceMax" => Op::Max,
        "ReduceMin" => Op::Min,
        "ReduceSumSquare" => Op::SumSquare,
        _ => return None,
    };
    let r = x.rank();
    // The reference's reading of the axes; no axes with `noop_with_empty_axes` (None) or a
    // bad axis go to it.
    let axes = crate::ops::reduce::reduce_axes(n, ins, r).ok()??;
    let (a, b) = match (axes.first(), axes.last()) {
        (Some(&a), Some(&b)) if b + 1 - a == axes.len() => (a, b + 1),
        (None, _) => (0, 0),
        _ => return None,
    };
    let s = x.shape();
    let (outer, group, inner): (usize, usize, usize) =
        (s[..a].iter().product(), s[a..b].iter().product(), s[b..].iter().product());
    if group == 0 || axes.is_empty() {
        return None;
    }
    let keep = n.int("keepdims", 1) != 0;
    let shape: Vec<usize> =
        (0..r).filter_map(|d| if d >= a && d < b { keep.then_some(1) } else { Some(s[d]) }).collect();
    let mut y = match Output::new(cx.out, DType::F32, &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let src = x.data::<f32>();
    let dst = y.bits_mut();
    if dst.is_empty() {
        return Some(Ok(vec![y.finish()]));
    }
    let out = SharedMut(dst.as_mut_ptr());
    // Tasks of whole outer rows, about 16K source elements each.
    let per = (16 * 1024 / (group * inner).max(1)).max(1);
    let one = |t: usize| {
        let out = out;
        for o in t * per..((t + 1) * per).min(outer) {
            // SAFETY: task t owns output rows t·per.., disjoint and in bounds.
            let acc = unsafe { std::slice::from_raw_parts_mut(out.0.add(o * inner), inner) };
            let block = &src[o * group * inner..(o + 1) * group * inner];
            if inner == 1 {
                acc[0] = fold(op, block);
            } else {
                rows(op, block, inner, acc);
            }
            if op == Op::Mean {
                let k = group as f32;
                acc.iter_mut().for_each(|v| *v /= k);
            }
        }
    };
    let tasks = outer.div_ceil(per);
    if tasks == 1 {
        one(0);
    } else {
        cx.par.for_each(tasks, &one);
    }
    Some(Ok(vec![y.finish()]))
}

/// The maximum of two values, NaN if either is (as the reference's `nan_max`).
fn max_nan(m: f32, v: f32) -> f32 {
    if v > m || v.is_nan() || m.is_nan() {
        if m.is_nan() {
            m
        } else {
            v
        }
    } else {
        m
    }
}

fn min_nan(m: f32, v: f32) -> f32 {
    -max_nan(-m, -v)
}

/// One contiguous group reduced, with eight partial sums.
fn fold(op: Op, s: &[f32]) -> f32 {
    match op {
        Op::Max => s.iter().copied().fold(f32::NEG_INFINITY, max_nan),
        Op::Min => s.iter().copied().fold(f32::INFINITY, min_nan),
        _ => {
            let sq = op == Op::SumSquare;
            let mut p = [0f32; 8];
            let mut it = s.chunks_exact(8);
            for c in &mut it {
                for k in 0..8 {
                    p[k] += if sq { c[k] * c[k] } else { c[k] };
                }
            }
            let tail: f32 = it.remainder().iter().map(|&v| if sq { v * v } else { v }).sum();
            p.iter().sum::<f32>() + tail
        }
    }
}

/// `group` rows of `inner` values reduced element-wise into `acc`.
fn rows(op: Op, block: &[f32], inner: usize, acc: &mut [f32]) {
    let mut it = block.chunks_exact(inner);
    let first = it.next().expect("a non-empty group");
    match op {
        Op::SumSquare => acc.iter_mut().zip(first).for_each(|(a, &v)| *a = v * v),
        _ => acc.copy_from_slice(first),
    }
    for row in it {
        let pairs = acc.iter_mut().zip(row);
        match op {
            Op::Sum | Op::Mean => pairs.for_each(|(a, &v)| *a += v),
            Op::SumSquare => pairs.for_each(|(a, &v)| *a += v * v),
            Op::Max => pairs.for_each(|(a, &v)| *a = max_nan(*a, v)),
            Op::Min => pairs.for_each(|(a, &v)| *a = min_nan(*a, v)),
        }
    }
}
