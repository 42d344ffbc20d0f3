//! Reductions (the Reduce* family), ArgMax/ArgMin, CumSum/CumProd.

use super::norm::lanes;
use crate::util::{axis, err, ints_of, opt, req, transpose, Result};
use aim_ir::{DType, Node, Tensor};

/// The axes a Reduce* node reduces: from the `axes` input (opset 13/18 onwards) or attribute.
pub(crate) fn reduce_axes(n: &Node, ins: &[Option<Tensor>], rank: usize) -> Result<Option<Vec<usize>>> {
    let raw: Vec<i64> = match (opt(ins, 1), n.ints("axes")) {
        (Some(t), _) => ints_of(t)?,
        (None, Some(a)) => a.to_vec(),
        (None, None) => vec![],
    };
    if raw.is_empty() {
        return Ok(if n.int("noop_with_empty_axes", 0) != 0 { None } else { Some((0..rank).collect()) });
    }
    let mut v: Vec<usize> = raw.iter().map(|&a| axis(a, rank)).collect::<Result<_>>()?;
    v.sort();
    v.dedup();
    Ok(Some(v))
}

fn reduce(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let Some(axes) = reduce_axes(n, ins, x.rank())? else { return Ok(vec![x.clone()]) };
    let keep = n.int("keepdims", 1) != 0;
    let rest: Vec<usize> = (0..x.rank()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = rest.iter().chain(&axes).copied().collect();
    let xt = transpose(x, &perm)?;
    let group: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let outer: usize = rest.iter().map(|&a| x.shape()[a]).product();
    let xd = xt.to_f64_vec();
    let op = n.op.as_str();
    let int = !x.dtype().is_float();
    let y: Vec<f64> = (0..outer)
        .map(|o| {
            let s = &xd[o * group..(o + 1) * group];
            match op {
                "ReduceSum" => s.iter().sum(),
                "ReduceMean" => s.iter().sum::<f64>() / group as f64,
                "ReduceProd" => s.iter().product(),
                "ReduceMax" => {
                    if s.is_empty() && int {
                        min_of(x.dtype())
                    } else {
                        s.iter().copied().fold(f64::NEG_INFINITY, nan_max)
                    }
                }
                "ReduceMin" => {
                    if s.is_empty() && int {
                        max_of(x.dtype())
                    } else {
                        s.iter().copied().fold(f64::INFINITY, nan_min)
                    }
                }
                "ReduceL1" => s.iter().map(|v| v.abs()).sum(),
                "ReduceL2" => s.iter().map(|v| v * v).sum::<f64>().sqrt(),
                "ReduceSumSquare" => s.iter().map(|v| v * v).sum(),
                "ReduceLogSum" => s.iter().sum::<f64>().ln(),
                _ => {
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    if m.is_infinite() {
                        m
                    } else {
                        m + s.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
                    }
                }
            }
        })
        .collect();
    let shape: Vec<usize> =
        (0..x.rank()).filter_map(|a| if axes.contains(&a) { keep.then_some(1) } else { Some(x.shape()[a]) }).collect();
    Ok(vec![Tensor::from_f64(x.dtype(), &shape, &y)])
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

fn min_of(d: DType) -> f64 {
    match d {
        DType::I8 => i8::MIN as f64,
        DType::I16 => i16::MIN as f64,
        DType::I32 => i32::MIN as f64,
        DType::I64 => i64::MIN as f64,
        _ => 0.0,
    }
}

fn max_of(d: DType) -> f64 {
    match d {
        DType::I8 => i8::MAX as f64,
        DType::I16 => i16::MAX as f64,
        DType::I32 => i32::MAX as f64,
        DType::I64 => i64::MAX as f64,
        DType::U8 | DType::Bool => u8::MAX as f64,
        DType::U16 => u16::MAX as f64,
        DType::U32 => u32::MAX as f64,
        _ => u64::MAX as f64,
    }
}

fn arg(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let ax = axis(n.int("axis", 0), x.rank())?;
    let keep = n.int("keepdims", 1) != 0;
    let last = n.int("select_last_index", 0) != 0;
    let is_max = n.op == "ArgMax";
    let (outer, len, inner) = lanes(x.shape(), ax);
    if len == 0 {
        return err("ArgMax/ArgMin over an empty axis");
    }
    let xd = x.to_f64_vec();
    let mut y = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0usize;
            for k in 1..len {
                let (v, b) = (xd[(o * len + k) * inner + i], xd[(o * len + best) * inner + i]);
                let better = if is_max { v > b || (last && v == b) } else { v < b || (last && v == b) };
                if better {
                    best = k;
                }
            }
            y.push(best as i64);
        }
    }
    let mut shape = x.shape().to_vec();
    if keep {
        shape[ax] = 1;
    } else {
        shape.remove(ax);
    }
    Ok(vec![Tensor::from_i64(&shape, y)])
}

fn cumulative(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let a = ints_of(req(ins, 1)?)?;
    let Some(&a) = a.first() else { return err("the axis input is empty") };
    let ax = axis(a, x.rank())?;
    let (exclusive, reverse) = (n.int("exclusive", 0) != 0, n.int("reverse", 0) != 0);
    let prod = n.op == "CumProd";
    let (outer, len, inner) = lanes(x.shape(), ax);
    let xd = x.to_f64_vec();
    let mut y = vec![0.0; xd.len()];
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = if prod { 1.0 } else { 0.0 };
            for step in 0..len {
                let k = if reverse { len - 1 - step } else { step };
                let at = (o * len + k) * inner + i;
                if exclusive {
                    y[at] = acc;
                }
                acc = if prod { acc * xd[at] } else { acc + xd[at] };
                if !exclusive {
                    y[at] = acc;
                }
            }
        }
    }
    Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &y)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("ReduceSum", reduce),
    ("ReduceMean", reduce),
    ("ReduceProd", reduce),
    ("ReduceMax", reduce),
    ("ReduceMin", reduce),
    ("ReduceL1", reduce),
    ("ReduceL2", reduce),
    ("ReduceSumSquare", reduce),
    ("ReduceLogSum", reduce),
    ("ReduceLogSumExp", reduce),
    ("ArgMax", arg),
    ("ArgMin", arg),
    ("CumSum", cumulative),
    ("CumProd", cumulative),
];
