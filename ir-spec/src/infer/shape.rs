//! Inference rules of the ops that rearrange or reduce dims: Shape, Size, Flatten, Reshape,
//! Transpose, Concat, Squeeze / Unsqueeze, Gather, the reductions, Constant,
//! ConstantOfShape.

use super::{const_ints, dtype_of, mul_dims, norm_axis, one, same_dtype, shape_of, unknown, Ins};
use crate::{Attr, DType, Dim, Graph, Node, ValueType};

/// Shape: the rank (between `start` and `end`) as one i64 dim.
pub(super) fn shape(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let shape = shape_of(ins, 0).map(|s| {
        let r = s.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r);
        let start = clamp(n.int("start", 0));
        let end = clamp(n.int("end", r));
        vec![Dim::Known((end - start).max(0) as usize)]
    });
    one(Some(DType::I64), shape)
}

/// Size: one i64 scalar.
pub(super) fn size(_g: &Graph, _n: &Node, _ins: Ins) -> Result<Vec<ValueType>, String> {
    one(Some(DType::I64), Some(vec![]))
}

/// Flatten: two dims, split at `axis`.
pub(super) fn flatten(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let Some(x) = shape_of(ins, 0) else { return one(dtype_of(ins, 0), None) };
    let r = x.len() as i64;
    let a = n.int("axis", 1);
    let a = if a < 0 { a + r } else { a };
    if a < 0 || a > r {
        return Err(format!("axis {} is out of range for rank {r}", n.int("axis", 1)));
    }
    let a = a as usize;
    one(dtype_of(ins, 0), Some(vec![mul_dims(&x[..a]), mul_dims(&x[a..])]))
}

/// Reshape: the constant target shape, 0 copying and −1 inferring a dim.
pub(super) fn reshape(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let dt = dtype_of(ins, 0);
    let Some(target) = const_ints(g, n, 1) else { return one(dt, None) };
    let x = shape_of(ins, 0);
    let allowzero = n.int("allowzero", 0) != 0;
    let mut out: Vec<Dim> = Vec::with_capacity(target.len());
    for (i, &t) in target.iter().enumerate() {
        out.push(match t {
            0 if !allowzero => x.as_ref().and_then(|x| x.get(i).cloned()).unwrap_or(Dim::Unknown),
            -1 => Dim::Unknown,
            t if t < -1 => return Err(format!("bad target dimension {t}")),
            t => Dim::Known(t as usize),
        });
    }
    if let (None, Some(x)) = (target.iter().position(|&t| t == -1), &x) {
        if let (Dim::Known(total), Dim::Known(want)) = (mul_dims(x), mul_dims(&out)) {
            if total != want {
                return Err(format!("cannot reshape {total} elements into {target:?}"));
            }
        }
    }
    if let (Some(pos), Some(x)) = (target.iter().position(|&t| t == -1), &x) {
        if let (Dim::Known(total), Dim::Known(rest)) = (mul_dims(x), mul_dims(&[&out[..pos], &out[pos + 1..]].concat()))
        {
            if rest == 0 || total % rest != 0 {
                return Err(format!("cannot reshape {total} elements into {target:?}"));
            }
            out[pos] = Dim::Known(total / rest);
        }
    }
    one(dt, Some(out))
}

/// Transpose: the dims in `perm` order (reversed without it).
pub(super) fn transpose(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let Some(x) = shape_of(ins, 0) else { return one(dtype_of(ins, 0), None) };
    let perm: Vec<i64> = n.ints("perm").map(|p| p.to_vec()).unwrap_or_else(|| (0..x.len() as i64).rev().collect());
    if perm.len() != x.len() {
        return Err(format!("perm {perm:?} does not match rank {}", x.len()));
    }
    let out: Result<Vec<Dim>, String> =
        perm.iter().map(|&p| x.get(p as usize).cloned().ok_or_else(|| format!("bad perm {perm:?}"))).collect();
    one(dtype_of(ins, 0), Some(out?))
}

/// Concat: the sum of the inputs along `axis`.
pub(super) fn concat(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let idx: Vec<usize> = (0..ins.len()).collect();
    let dt = same_dtype(ins, &idx)?;
    let shapes: Option<Vec<Vec<Dim>>> = idx.iter().map(|&i| shape_of(ins, i)).collect();
    let Some(shapes) = shapes else { return one(dt, None) };
    let Some(first) = shapes.first() else { return Err("Concat needs at least one input".into()) };
    let ax = norm_axis(n.int("axis", 0), first.len())?;
    let mut out = first.clone();
    out[ax] = mul_dims(&[]);
    let mut total = Some(0usize);
    for s in &shapes {
        if s.len() != first.len() {
            return Err("all inputs must have the same rank".into());
        }
        total = total.and_then(|t| s[ax].known().and_then(|k| t.checked_add(k)));
    }
    out[ax] = total.map(Dim::Known).unwrap_or(Dim::Unknown);
    one(dt, Some(out))
}

/// Squeeze, Unsqueeze: axes from the input (opset 13) or the attribute.
pub(super) fn squeeze(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let op = n.op.as_str();
    let dt = dtype_of(ins, 0);
    let Some(x) = shape_of(ins, 0) else { return one(dt, None) };
    // The axes: an input from opset 13, an attribute before.
    let axes = const_ints(g, n, 1).or_else(|| n.ints("axes").map(|a| a.to_vec()));
    if op == "Unsqueeze" {
        let Some(axes) = axes else { return one(dt, None) };
        let r = x.len() + axes.len();
        let mut axes: Vec<usize> = axes.iter().map(|&a| norm_axis(a, r)).collect::<Result<_, _>>()?;
        axes.sort();
        let mut out = x.clone();
        for a in axes {
            out.insert(a.min(out.len()), Dim::Known(1));
        }
        one(dt, Some(out))
    } else {
        let out: Vec<Dim> = match axes {
            Some(axes) => {
                let axes: Vec<usize> = axes.iter().map(|&a| norm_axis(a, x.len())).collect::<Result<_, _>>()?;
                x.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d.clone()).collect()
            }
            // Axes computed at run time: unknown (not every dim of 1).
            None if n.input(1).is_some() => return one(dt, None),
            None if x.iter().all(|d| d.known().is_some()) => {
                x.iter().filter(|d| **d != Dim::Known(1)).cloned().collect()
            }
            None => return one(dt, None),
        };
        one(dt, Some(out))
    }
}

/// Gather: the data's dims with `axis` replaced by the indices' dims.
pub(super) fn gather(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let dt = dtype_of(ins, 0);
    let (Some(x), Some(idx)) = (shape_of(ins, 0), shape_of(ins, 1)) else { return one(dt, None) };
    let ax = norm_axis(n.int("axis", 0), x.len())?;
    let mut out = x[..ax].to_vec();
    out.extend(idx);
    out.extend_from_slice(&x[ax + 1..]);
    one(dt, Some(out))
}

/// The reductions, and ArgMax / ArgMin.
pub(super) const REDUCE: &[&str] = &[
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ArgMax",
    "ArgMin",
];

/// The reductions and ArgMax / ArgMin: reduced axes dropped or kept as 1.
pub(super) fn reduce(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let op = n.op.as_str();
    let arg = op.starts_with("Arg");
    let dt = if arg { Some(DType::I64) } else { dtype_of(ins, 0) };
    let Some(x) = shape_of(ins, 0) else { return one(dt, None) };
    let keep = n.int("keepdims", 1) != 0;
    let axes: Vec<i64> = if arg {
        vec![n.int("axis", 0)]
    } else if let Some(a) = n.ints("axes") {
        a.to_vec()
    } else if n.input(1).is_some() {
        match const_ints(g, n, 1) {
            Some(a) => a,
            None => return one(dt, None),
        }
    } else {
        vec![]
    };
    let noop = axes.is_empty() && n.int("noop_with_empty_axes", 0) != 0;
    if noop {
        return one(dt, Some(x));
    }
    let axes: Vec<usize> = if axes.is_empty() {
        (0..x.len()).collect()
    } else {
        axes.iter().map(|&a| norm_axis(a, x.len())).collect::<Result<_, _>>()?
    };
    let mut out = Vec::new();
    for (i, d) in x.iter().enumerate() {
        if axes.contains(&i) {
            if keep {
                out.push(Dim::Known(1));
            }
        } else {
            out.push(d.clone());
        }
    }
    one(dt, Some(out))
}

/// Constant: its tensor's type.
pub(super) fn constant(_g: &Graph, n: &Node, _ins: Ins) -> Result<Vec<ValueType>, String> {
    if let Some(Attr::Tensor(t)) = n.attrs.get("value") {
        return one(Some(t.dtype()), Some(t.shape().iter().map(|&d| Dim::Known(d)).collect()));
    }
    Ok(unknown(n))
}

/// ConstantOfShape: the value's type and the constant shape input.
pub(super) fn constant_of_shape(g: &Graph, n: &Node, _ins: Ins) -> Result<Vec<ValueType>, String> {
    let dt = n.tensor("value").map(|t| t.dtype()).or(Some(DType::F32));
    let shape = const_ints(g, n, 0).map(|v| v.iter().map(|&d| Dim::Known(d.max(0) as usize)).collect());
    one(dt, shape)
}
