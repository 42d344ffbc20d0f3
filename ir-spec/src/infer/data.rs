//! Inference rules of the data-movement ops whose output shapes come from constant inputs
//! or attributes: Split, Slice, Pad, Expand, Tile, Range, Resize, DepthToSpace and
//! SpaceToDepth, OneHot, TopK, the Gather/Scatter variants, NonZero. With the input shapes
//! bound (shape specialisation) and the shape arithmetic folded, these give every value of
//! an exported detector or transformer a static type.

use super::{broadcast_dims, const_ints, dtype_of, norm_axis, shape_of, Ins};
use crate::{DType, Dim, Graph, Node, ValueType};

/// The ops [`infer`] has rules for.
pub(super) const OPS: &[&str] = &[
    "Split",
    "Slice",
    "Pad",
    "Expand",
    "Tile",
    "Range",
    "Resize",
    "Upsample",
    "DepthToSpace",
    "SpaceToDepth",
    "OneHot",
    "TopK",
    "GatherElements",
    "ScatterElements",
    "ScatterND",
    "GatherND",
    "NonZero",
    "CumProd",
    "Swish",
    "RotaryEmbedding",
    "ReverseSequence",
    "EyeLike",
];

/// The output types of `n`, one of [`OPS`] (other ops: unknown).
pub(super) fn infer(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let dt = dtype_of(ins, 0);
    let ty = |shape: Option<Vec<Dim>>| ValueType { dtype: dt, shape };
    let one = |shape: Option<Vec<Dim>>| Ok(vec![ty(shape)]);
    match n.op.as_str() {
        "Split" => split(g, n, ins).map(|shapes| shapes.into_iter().map(ty).collect()),
        "Slice" => slice(g, n, ins).and_then(one),
        "Pad" => pad(g, n, ins).and_then(one),
        "Expand" => match (shape_of(ins, 0), const_ints(g, n, 1)) {
            (Some(x), Some(t)) => {
                let t: Vec<Dim> = t.iter().map(|&v| Dim::Known(v.max(0) as usize)).collect();
                broadcast_dims(&x, &t).and_then(|s| one(Some(s)))
            }
            (_, Some(t)) => one(Some(vec![Dim::Unknown; t.len()])),
            _ => one(None),
        },
        "Tile" => match (shape_of(ins, 0), const_ints(g, n, 1)) {
            (Some(x), Some(r)) if r.len() == x.len() => one(Some(
                x.iter()
                    .zip(&r)
                    .map(|(d, &k)| match d.known().and_then(|d| d.checked_mul(k.max(0) as usize)) {
                        Some(v) => Dim::Known(v),
                        None if k == 1 => d.clone(),
                        None => Dim::Unknown,
                    })
                    .collect(),
            )),
            (Some(x), _) => one(Some(vec![Dim::Unknown; x.len()])),
            _ => one(None),
        },
        "Range" => {
            let scalar = |i: usize| {
                let t = g.initializers.get(n.input(i)?)?;
                (t.len() == 1).then(|| t.to_f64_vec()[0])
            };
            let len = match (scalar(0), scalar(1), scalar(2)) {
                (Some(s), Some(l), Some(d)) if d != 0.0 => {
                    let c = ((l - s) / d).ceil().max(0.0);
                    if c < usize::MAX as f64 {
                        Dim::Known(c as usize)
                    } else {
                        Dim::Unknown
                    }
                }
                _ => Dim::Unknown,
            };
            one(Some(vec![len]))
        }
        "Resize" | "Upsample" => resize(g, n, ins).and_then(one),
        "DepthToSpace" | "SpaceToDepth" => {
            let Some(x) = shape_of(ins, 0) else { return one(None) };
            if x.len() != 4 {
                return Err(format!("{} needs a 4-D input, got rank {}", n.op, x.len()));
            }
            let b = n.int("blocksize", 0);
            if b < 1 {
                return Err(format!("blocksize must be positive, got {b}"));
            }
            let b = b as usize;
            let f = |d: &Dim, up: bool| match d.known() {
                Some(v) if up => Dim::Known(v * b),
                Some(v) => Dim::Known(v / b),
                None => Dim::Unknown,
            };
            let (c_up, sp_up) = (n.op == "SpaceToDepth", n.op == "DepthToSpace");
            let c = match x[1].known() {
                Some(v) if c_up => Dim::Known(v * b * b),
                Some(v) => Dim::Known(v / (b * b)),
                None => Dim::Unknown,
            };
            one(Some(vec![x[0].clone(), c, f(&x[2], sp_up), f(&x[3], sp_up)]))
        }
        "OneHot" => {
            let Some(idx) = shape_of(ins, 0) else {
                return Ok(vec![ValueType { dtype: dtype_of(ins, 2), shape: None }]);
            };
            let depth = g
                .initializers
                .get(n.input(1).unwrap_or_default())
                .filter(|t| t.len() == 1)
                .map(|t| t.to_f64_vec()[0])
                .filter(|d| *d >= 1.0 && *d < usize::MAX as f64)
                .map_or(Dim::Unknown, |d| Dim::Known(d as usize));
            let r = idx.len() + 1;
            match norm_axis(n.int("axis", -1), r) {
                Ok(ax) => {
                    let mut out = idx.clone();
                    out.insert(ax, depth);
                    Ok(vec![ValueType { dtype: dtype_of(ins, 2), shape: Some(out) }])
                }
                Err(e) => Err(e),
            }
        }
        "TopK" => {
            let Some(x) = shape_of(ins, 0) else {
                return Ok(vec![ty(None), ValueType { dtype: Some(DType::I64), shape: None }]);
            };
            let ax = norm_axis(n.int("axis", -1), x.len())?;
            let mut out = x.clone();
            out[ax] = match const_ints(g, n, 1).as_deref() {
                Some([k]) if *k >= 0 => Dim::Known(*k as usize),
                _ => Dim::Unknown,
            };
            Ok(vec![ty(Some(out.clone())), ValueType { dtype: Some(DType::I64), shape: Some(out) }])
        }
        "GatherElements" => Ok(vec![ValueType { dtype: dt, shape: shape_of(ins, 1) }]),
        "ScatterElements" | "ScatterND" => one(shape_of(ins, 0)),
        "GatherND" => {
            let (Some(x), Some(idx)) = (shape_of(ins, 0), shape_of(ins, 1)) else { return one(None) };
            let b = n.int("batch_dims", 0).max(0) as usize;
            match idx.last().and_then(|d| d.known()) {
                Some(k) if !idx.is_empty() && b + k <= x.len() => {
                    let mut out = idx[..idx.len() - 1].to_vec();
                    out.extend_from_slice(&x[b + k..]);
                    one(Some(out))
                }
                _ => one(None),
            }
        }
        "NonZero" => {
            let r = shape_of(ins, 0).map_or(Dim::Unknown, |x| Dim::Known(x.len()));
            Ok(vec![ValueType { dtype: Some(DType::I64), shape: Some(vec![r, Dim::Unknown]) }])
        }
        "CumProd" | "Swish" | "RotaryEmbedding" | "ReverseSequence" => one(shape_of(ins, 0)),
        "EyeLike" => {
            let dt = n.opt_int("dtype").and_then(|c| DType::from_onnx_code(c as i32)).or(dt);
            Ok(vec![ValueType { dtype: dt, shape: shape_of(ins, 0) }])
        }
        _ => Ok(vec![ValueType::unknown(); n.outputs.len()]),
    }
}

/// The outputs of a Split: the split sizes along `axis` where known (a constant `split`, or
/// equal parts of a known dim).
fn split(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<Option<Vec<Dim>>>, String> {
    let outs = n.outputs.len();
    let Some(x) = shape_of(ins, 0) else { return Ok(vec![None; outs]) };
    let ax = norm_axis(n.int("axis", 0), x.len())?;
    let sizes: Vec<Dim> = match (const_ints(g, n, 1), x[ax].known()) {
        (Some(s), _) => {
            if s.len() != outs {
                return Err(format!("split has {} sizes for {outs} outputs", s.len()));
            }
            if s.iter().any(|&v| v < 0) {
                return Err(format!("split sizes {s:?} must be non-negative"));
            }
            if let Some(d) = x[ax].known() {
                if s.iter().try_fold(0usize, |a, &v| a.checked_add(v as usize)) != Some(d) {
                    return Err(format!("split sizes {s:?} do not add up to {d}"));
                }
            }
            s.iter().map(|&v| Dim::Known(v as usize)).collect()
        }
        (None, Some(d)) if n.input(1).is_none() => {
            let k = n.opt_int("num_outputs").map_or(outs, |v| v.max(1) as usize).max(1);
            // ORT's rule: no output of nothing (more outputs than elements).
            if k > d {
                return Err(format!("{k} outputs of an axis of {d} elements"));
            }
            let chunk = d.div_ceil(k);
            (0..outs).map(|i| Dim::Known(chunk.min(d.saturating_sub(i * chunk)))).collect()
        }
        _ => vec![Dim::Unknown; outs],
    };
    Ok(sizes
        .into_iter()
        .map(|s| {
            let mut out = x.clone();
            out[ax] = s;
            Some(out)
        })
        .collect())
}

/// A Slice's output: each sliced axis's length where its dim and the constant bounds are
/// known (ONNX's clamping rules, in i128 so that the extremes of i64 are safe).
fn slice(g: &Graph, n: &Node, ins: Ins) -> Result<Option<Vec<Dim>>, String> {
    let Some(x) = shape_of(ins, 0) else { return Ok(None) };
    let (Some(starts), Some(ends)) = (const_ints(g, n, 1), const_ints(g, n, 2)) else {
        return Ok(Some(vec![Dim::Unknown; x.len()]));
    };
    let axes = match n.input(3) {
        Some(_) => match const_ints(g, n, 3) {
            Some(a) => a,
            None => return Ok(Some(vec![Dim::Unknown; x.len()])),
        },
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match n.input(4) {
        Some(_) => match const_ints(g, n, 4) {
            Some(s) => s,
            None => return Ok(Some(vec![Dim::Unknown; x.len()])),
        },
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps must have the same length".into());
    }
    let mut out = x.clone();
    for i in 0..starts.len() {
        let ax = norm_axis(axes[i], x.len())?;
        if steps[i] == 0 {
            return Err("slice step cannot be 0".into());
        }
        let Some(dim) = x[ax].known() else {
            out[ax] = Dim::Unknown;
            continue;
        };
        let (dim, step) = (dim as i128, steps[i] as i128);
        let fix = |v: i64| if v < 0 { v as i128 + dim } else { v as i128 };
        let (s, e) = (fix(starts[i]), fix(ends[i]));
        let (s, e) =
            if step > 0 { (s.clamp(0, dim), e.clamp(0, dim)) } else { (s.clamp(0, dim - 1), e.clamp(-1, dim - 1)) };
        let span = if step > 0 { (e - s).max(0) } else { (s - e).max(0) };
        out[ax] = Dim::Known(((span + step.abs() - 1) / step.abs()) as usize);
    }
    Ok(Some(out))
}

/// A Pad's output: each dim plus its constant pads.
fn pad(g: &Graph, n: &Node, ins: Ins) -> Result<Option<Vec<Dim>>, String> {
    let Some(x) = shape_of(ins, 0) else { return Ok(None) };
    let r = x.len();
    let Some(pads) = const_ints(g, n, 1) else { return Ok(Some(vec![Dim::Unknown; r])) };
    let axes: Vec<usize> = match n.input(3) {
        Some(_) => match const_ints(g, n, 3) {
            Some(a) => a.iter().map(|&v| norm_axis(v, r)).collect::<Result<_, _>>()?,
            None => return Ok(Some(vec![Dim::Unknown; r])),
        },
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("pads has {} values for {} axes", pads.len(), axes.len()));
    }
    let mut out = x.clone();
    for (i, &a) in axes.iter().enumerate() {
        if let Some(d) = x[a].known() {
            let v = d as i128 + pads[i] as i128 + pads[i + axes.len()] as i128;
            if v < 0 {
                return Err(format!("pads {pads:?} remove more than axis {a} holds"));
            }
            out[a] = usize::try_from(v).map_or(Dim::Unknown, Dim::Known);
        }
    }
    Ok(Some(out))
}

/// A Resize's output: constant sizes, or each dim times its constant scale (rounded down).
fn resize(g: &Graph, n: &Node, ins: Ins) -> Result<Option<Vec<Dim>>, String> {
    let Some(x) = shape_of(ins, 0) else { return Ok(None) };
    let r = x.len();
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&v| norm_axis(v, r)).collect::<Result<_, _>>()?,
        None => (0..r).collect(),
    };
    let nonempty = |i: usize| n.input(i).filter(|name| g.initializers.get(*name).is_none_or(|t| !t.is_empty()));
    let mut out = x.clone();
    if nonempty(3).is_some() {
        let Some(sizes) = const_ints(g, n, 3) else { return Ok(Some(vec![Dim::Unknown; r])) };
        if sizes.len() != axes.len() {
            return Err(format!("sizes has {} values for {} axes", sizes.len(), axes.len()));
        }
        if n.string("keep_aspect_ratio_policy", "stretch") != "stretch" {
            return Ok(Some(vec![Dim::Unknown; r]));
        }
        for (&a, &s) in axes.iter().zip(&sizes) {
            out[a] = Dim::Known(s.max(0) as usize);
        }
        return Ok(Some(out));
    }
    let Some(scales) = nonempty(2).and_then(|s| g.initializers.get(s)).map(|t| t.to_f64_vec()) else {
        return Ok(Some(vec![Dim::Unknown; r]));
    };
    if scales.len() != axes.len() {
        return Err(format!("scales has {} values for {} axes", scales.len(), axes.len()));
    }
    for (&a, &s) in axes.iter().zip(&scales) {
        if !(s > 0.0 && s.is_finite()) {
            return Err(format!("scale {s} must be positive and finite"));
        }
        out[a] = match x[a].known() {
            Some(d) if (d as f64 * s) < usize::MAX as f64 => Dim::Known((d as f64 * s).floor() as usize),
            _ => Dim::Unknown,
        };
    }
    Ok(Some(out))
}
