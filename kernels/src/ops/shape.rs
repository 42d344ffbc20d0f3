//! Data movement and shape ops: Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Split,
//! Slice, Expand, Tile, Pad, DepthToSpace, SpaceToDepth, Trilu, Shape, Size, and the
//! ops that make tensors (Constant, ConstantOfShape, Range, EyeLike) or change their type
//! (Cast, CastLike, Identity, Dropout).

use crate::dispatch;
use crate::num::Num;
use crate::util::{
    axis, broadcast_shapes, err, expand_to, gather_elems, ints_of, opt, req, strides, transpose, Result,
};
use crate::KernelError;
use aim_ir::{Attr, DType, Node, Tensor};

fn reshape(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let target = ints_of(req(ins, 1)?)?;
    let allowzero = n.int("allowzero", 0) != 0;
    let mut shape = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &t) in target.iter().enumerate() {
        match t {
            0 if !allowzero => shape.push(*x.shape().get(i).ok_or_else(|| {
                crate::KernelError(format!("shape {target:?} copies dim {i} that {:?} does not have", x.shape()))
            })?),
            -1 if infer.is_none() => {
                infer = Some(i);
                shape.push(1);
            }
            t if t >= 0 => shape.push(t as usize),
            _ => return err(format!("invalid target shape {target:?}")),
        }
    }
    if let Some(i) = infer {
        let rest: usize = shape.iter().product();
        if rest == 0 || x.len() % rest != 0 {
            return err(format!("cannot reshape {:?} into {target:?}", x.shape()));
        }
        shape[i] = x.len() / rest;
    }
    if shape.iter().product::<usize>() != x.len() {
        return err(format!("cannot reshape {:?} ({} elements) into {shape:?}", x.shape(), x.len()));
    }
    Ok(vec![x.reshaped(&shape)])
}

fn flatten(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let r = x.rank() as i64;
    let a = n.int("axis", 1);
    let a = if a < 0 { a + r } else { a };
    if a < 0 || a > r {
        return err(format!("axis {} is out of range for rank {r}", n.int("axis", 1)));
    }
    let a = a as usize;
    let outer: usize = x.shape()[..a].iter().product();
    Ok(vec![x.reshaped(&[outer, x.shape()[a..].iter().product()])])
}

fn squeeze(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let axes: Vec<usize> = match opt(ins, 1) {
        Some(a) => ints_of(a)?.iter().map(|&v| axis(v, x.rank())).collect::<Result<_>>()?,
        None => (0..x.rank()).filter(|&i| x.shape()[i] == 1).collect(),
    };
    for &a in &axes {
        if x.shape()[a] != 1 {
            return err(format!("cannot squeeze axis {a} of size {}", x.shape()[a]));
        }
    }
    let shape: Vec<usize> = x.shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
    Ok(vec![x.reshaped(&shape)])
}

fn unsqueeze(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let raw = ints_of(req(ins, 1)?)?;
    let r = x.rank() + raw.len();
    let mut axes: Vec<usize> = raw.iter().map(|&v| axis(v, r)).collect::<Result<_>>()?;
    axes.sort();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return err(format!("repeated axis in {raw:?}"));
    }
    let mut shape = x.shape().to_vec();
    for a in axes {
        shape.insert(a, 1);
    }
    Ok(vec![x.reshaped(&shape)])
}

fn transpose_op(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let perm: Vec<usize> = match n.ints("perm") {
        Some(p) => p.iter().map(|&v| axis(v, x.rank())).collect::<Result<_>>()?,
        None => (0..x.rank()).rev().collect(),
    };
    let mut seen = perm.clone();
    seen.sort();
    if seen != (0..x.rank()).collect::<Vec<_>>() {
        return err(format!("perm {perm:?} is not a permutation of rank {}", x.rank()));
    }
    Ok(vec![transpose(x, &perm)?])
}

/// Concatenates tensors along `ax` (all of one dtype and matching other dims).
pub fn concat_tensors(ts: &[&Tensor], ax: usize) -> Result<Tensor> {
    let first = ts[0];
    let mut shape = first.shape().to_vec();
    shape[ax] = 0;
    for t in ts {
        if t.dtype() != first.dtype() || t.rank() != first.rank() {
            return err("Concat inputs must share dtype and rank");
        }
        for d in 0..t.rank() {
            if d != ax && t.shape()[d] != first.shape()[d] {
                return err(format!("Concat inputs differ off the axis: {:?} vs {:?}", first.shape(), t.shape()));
            }
        }
        shape[ax] += t.shape()[ax];
    }
    let outer: usize = shape[..ax].iter().product();
    let sz = first.dtype().size();
    let mut out = Tensor::zeros(first.dtype(), &shape);
    let dst = out.bytes_mut();
    let mut pos = 0;
    for o in 0..outer {
        for t in ts {
            let chunk = t.shape()[ax..].iter().product::<usize>() * sz;
            dst[pos..pos + chunk].copy_from_slice(&t.bytes()[o * chunk..(o + 1) * chunk]);
            pos += chunk;
        }
    }
    Ok(out)
}

fn concat(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let ts: Vec<&Tensor> = ins.iter().flatten().collect();
    if ts.is_empty() {
        return err("Concat needs at least one input");
    }
    let ax = axis(n.int("axis", 0), ts[0].rank())?;
    Ok(vec![concat_tensors(&ts, ax)?])
}

/// Slices `x` along `ax` from `start` (inclusive) with `step` for `count` elements.
fn slice_axis(x: &Tensor, ax: usize, start: i64, step: i64, count: usize) -> Result<Tensor> {
    let mut shape = x.shape().to_vec();
    shape[ax] = count;
    let st = strides(x.shape());
    let (outer, inner) = (x.shape()[..ax].iter().product::<usize>(), st[ax]);
    let mut offs = Vec::with_capacity(outer * count * inner);
    for o in 0..outer {
        for k in 0..count {
            let src = (start + k as i64 * step) as usize;
            for i in 0..inner {
                offs.push(o * x.shape()[ax] * inner + src * inner + i);
            }
        }
    }
    gather_elems(x, &shape, &offs)
}

fn split(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let ax = axis(n.int("axis", 0), x.rank())?;
    let dim = x.shape()[ax];
    let parts: Vec<usize> = match opt(ins, 1) {
        Some(s) => ints_of(s)?.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            let k = n.opt_int("num_outputs").map(|v| v as usize).unwrap_or(n.outputs.len()).max(1);
            let chunk = dim.div_ceil(k);
            (0..k).map(|i| chunk.min(dim.saturating_sub(i * chunk))).collect()
        }
    };
    if parts.iter().try_fold(0usize, |a, &p| a.checked_add(p)) != Some(dim) {
        return err(format!("split sizes {parts:?} do not add up to {dim}"));
    }
    let mut start = 0;
    parts
        .iter()
        .map(|&p| {
            let t = slice_axis(x, ax, start as i64, 1, p)?;
            start += p;
            Ok(t)
        })
        .collect()
}

fn slice(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let starts = ints_of(req(ins, 1)?)?;
    let ends = ints_of(req(ins, 2)?)?;
    let axes: Vec<i64> = match opt(ins, 3) {
        Some(a) => ints_of(a)?,
        None => (0..starts.len() as i64).collect(),
    };
    let steps: Vec<i64> = match opt(ins, 4) {
        Some(s) => ints_of(s)?,
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return err("starts, ends, axes and steps must have the same length");
    }
    let mut out = x.clone();
    for i in 0..starts.len() {
        let ax = axis(axes[i], x.rank())?;
        let dim = x.shape()[ax] as i64;
        let step = steps[i];
        if step == 0 {
            return err("slice step cannot be 0");
        }
        // In i128: starts, ends and steps may be the extremes of i64 (INT64_MIN as a step).
        let (dim, step) = (dim as i128, step as i128);
        let fix = |v: i64| if v < 0 { v as i128 + dim } else { v as i128 };
        let (s, e) = (fix(starts[i]), fix(ends[i]));
        let (s, e) =
            if step > 0 { (s.clamp(0, dim), e.clamp(0, dim)) } else { (s.clamp(0, dim - 1), e.clamp(-1, dim - 1)) };
        let span = if step > 0 { (e - s).max(0) } else { (s - e).max(0) };
        let count = (span + step.abs() - 1) / step.abs();
        let step = step.clamp(-dim.max(1), dim.max(1)) as i64;
        out = slice_axis(&out, ax, s as i64, step, count as usize)?;
    }
    Ok(vec![out])
}

fn expand(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let target: Vec<usize> = ints_of(req(ins, 1)?)?.iter().map(|&v| v.max(0) as usize).collect();
    let shape = broadcast_shapes(&[x.shape(), &target])?;
    Ok(vec![expand_to(x, &shape)?])
}

fn tile(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let reps = ints_of(req(ins, 1)?)?;
    if reps.len() != x.rank() || reps.iter().any(|&r| r < 0) {
        return err(format!("repeats {reps:?} must be {} non-negative values", x.rank()));
    }
    let shape: Vec<usize> = x
        .shape()
        .iter()
        .zip(&reps)
        .map(|(&d, &r)| d.checked_mul(r as usize).ok_or_else(|| KernelError(format!("repeats {reps:?} overflow"))))
        .collect::<Result<_>>()?;
    crate::util::check_out(x.dtype(), &shape)?;
    let st = strides(x.shape());
    let mut offs = Vec::with_capacity(crate::util::elements(&shape)?);
    super::window::for_each_index(&shape, |idx| {
        offs.push(idx.iter().enumerate().map(|(d, &i)| (i % x.shape()[d]) * st[d]).sum());
    });
    Ok(vec![gather_elems(x, &shape, &offs)?])
}

fn pad(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let pads = ints_of(req(ins, 1)?)?;
    let r = x.rank();
    let axes: Vec<usize> = match opt(ins, 3) {
        Some(a) => ints_of(a)?.iter().map(|&v| axis(v, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return err(format!("pads has {} values for {} axes", pads.len(), axes.len()));
    }
    let mut before = vec![0i64; r];
    let mut after = vec![0i64; r];
    for (i, &a) in axes.iter().enumerate() {
        before[a] = pads[i];
        after[a] = pads[i + axes.len()];
    }
    let shape: Vec<usize> = (0..r)
        .map(|d| match (x.shape()[d] as i64).checked_add(before[d]).and_then(|s| s.checked_add(after[d])) {
            None => err(format!("pads {pads:?} overflow: the output has more elements than can be addressed")),
            Some(s) if s < 0 => err(format!("pads {pads:?} remove more than axis {d} holds")),
            Some(s) => Ok(s as usize),
        })
        .collect::<Result<_>>()?;
    crate::util::check_out(x.dtype(), &shape)?;
    let mode = n.string("mode", "constant");
    let value = opt(ins, 2).map(|v| v.to_f64_vec().first().copied().unwrap_or(0.0)).unwrap_or(0.0);
    let st = strides(x.shape());
    // Build a one-element source holding the pad value, appended after x's elements.
    let ext =
        crate::ops::shape::concat_tensors(&[&x.reshaped(&[x.len()]), &Tensor::from_f64(x.dtype(), &[1], &[value])], 0)?;
    let fill = x.len();
    let mut offs = Vec::with_capacity(crate::util::elements(&shape)?);
    let mut bad_mode = None;
    super::window::for_each_index(&shape, |idx| {
        let mut off = 0usize;
        for d in 0..r {
            let dim = x.shape()[d] as i64;
            let mut i = idx[d] as i64 - before[d];
            if i < 0 || i >= dim {
                match mode {
                    "constant" => {
                        off = usize::MAX;
                        break;
                    }
                    "edge" => i = i.clamp(0, dim - 1),
                    "wrap" => i = i.rem_euclid(dim),
                    "reflect" => {
                        if dim == 1 {
                            i = 0;
                        } else {
                            let period = 2 * (dim - 1);
                            i = i.rem_euclid(period);
                            if i >= dim {
                                i = period - i;
                            }
                        }
                    }
                    m => {
                        bad_mode = Some(m.to_string());
                        i = 0;
                    }
                }
            }
            off += i as usize * st[d];
        }
        offs.push(if off == usize::MAX { fill } else { off });
    });
    if let Some(m) = bad_mode {
        return err(format!("unknown pad mode '{m}'"));
    }
    if x.is_empty() && mode != "constant" && !shape.contains(&0) {
        return err(format!("mode '{mode}' cannot pad an empty tensor"));
    }
    Ok(vec![gather_elems(&ext, &shape, &offs)?])
}

fn depth_space(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    if x.rank() != 4 {
        return err("DepthToSpace/SpaceToDepth need a 4-D input");
    }
    let b = n.int("blocksize", 0).max(1) as usize;
    let (nb, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    if n.op == "DepthToSpace" {
        if c % (b * b) != 0 {
            return err(format!("{c} channels do not divide by blocksize² = {}", b * b));
        }
        let crd = n.string("mode", "DCR") == "CRD";
        let (t, perm) = if crd {
            (x.reshaped(&[nb, c / (b * b), b, b, h, w]), [0, 1, 4, 2, 5, 3])
        } else {
            (x.reshaped(&[nb, b, b, c / (b * b), h, w]), [0, 3, 4, 1, 5, 2])
        };
        Ok(vec![transpose(&t, &perm)?.reshaped(&[nb, c / (b * b), h * b, w * b])])
    } else {
        if h % b != 0 || w % b != 0 {
            return err(format!("spatial dims {h}×{w} do not divide by blocksize {b}"));
        }
        let t = x.reshaped(&[nb, c, h / b, b, w / b, b]);
        let perm = if n.string("mode", "DCR") == "CRD" { [0, 1, 3, 5, 2, 4] } else { [0, 3, 5, 1, 2, 4] };
        Ok(vec![transpose(&t, &perm)?.reshaped(&[nb, c * b * b, h / b, w / b])])
    }
}

fn trilu(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    if x.rank() < 2 {
        return err("Trilu needs rank ≥ 2");
    }
    let k = match opt(ins, 1) {
        Some(t) => ints_of(t)?.first().copied().unwrap_or(0),
        None => 0,
    };
    let upper = n.int("upper", 1) != 0;
    let (rows, cols) = (x.shape()[x.rank() - 2], x.shape()[x.rank() - 1]);
    let mut out = x.clone();
    let sz = x.dtype().size();
    let bytes = out.bytes_mut();
    for (i, chunk) in bytes.chunks_mut(sz).enumerate() {
        let (r, c) = ((i / cols) % rows.max(1), i % cols.max(1));
        let keep = if upper { c as i64 - r as i64 >= k } else { c as i64 - r as i64 <= k };
        if !keep {
            chunk.fill(0);
        }
    }
    Ok(vec![out])
}

fn shape_op(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    Ok(vec![shape_of(n, req(ins, 0)?.shape())?])
}

/// What a `Shape` or `Size` node gives for an input of shape `dims` (a tensor of that shape
/// need not exist: constant folding asks with static shapes).
pub fn shape_of(n: &Node, dims: &[usize]) -> Result<Tensor> {
    if n.op == "Size" {
        return Ok(Tensor::scalar(crate::util::elements(dims)? as i64));
    }
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
    let (s, e) = (clamp(n.int("start", 0)), clamp(n.int("end", r)));
    let out: Vec<i64> = dims[s..e.max(s)].iter().map(|&d| d as i64).collect();
    Ok(Tensor::from_i64(&[out.len()], out))
}

fn size(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    Ok(vec![shape_of(n, req(ins, 0)?.shape())?])
}

fn identity(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    Ok(vec![req(ins, 0)?.clone()])
}

fn dropout(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let training = opt(ins, 2).map(|t| t.to_f64_vec().first().copied().unwrap_or(0.0) != 0.0).unwrap_or(false);
    let ratio = opt(ins, 1).map(|t| t.to_f64_vec().first().copied().unwrap_or(0.5)).unwrap_or(0.5);
    if training && ratio != 0.0 {
        return err("Dropout in training mode is random; aim runs inference only");
    }
    let mut outs = vec![x.clone()];
    if n.outputs.len() > 1 {
        outs.push(Tensor::from_bools(x.shape(), &vec![true; x.len()]));
    }
    Ok(outs)
}

fn constant(n: &Node, _ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let t = match n.attrs.iter().next() {
        Some((k, a)) => match (k.as_str(), a) {
            ("value", Attr::Tensor(t)) => t.clone(),
            ("value_float", Attr::Float(v)) => Tensor::scalar(*v),
            ("value_floats", Attr::Floats(v)) => Tensor::from_slice(&[v.len()], v),
            ("value_int", Attr::Int(v)) => Tensor::scalar(*v),
            ("value_ints", Attr::Ints(v)) => Tensor::from_slice(&[v.len()], v),
            (k, _) => return err(format!("Constant attribute '{k}' is not supported")),
        },
        None => return err("Constant has no value"),
    };
    Ok(vec![t])
}

fn constant_of_shape(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let shape: Vec<usize> = ints_of(req(ins, 0)?)?
        .iter()
        .map(|&v| if v < 0 { err(format!("negative dimension {v}")) } else { Ok(v as usize) })
        .collect::<Result<_>>()?;
    let value = n.tensor("value").cloned().unwrap_or_else(|| Tensor::scalar(0f32));
    if value.len() != 1 {
        return err("ConstantOfShape's value must hold one element");
    }
    Ok(vec![expand_to(&value.reshaped(&vec![1; shape.len()]), &shape)?])
}

fn range(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (s, l, d) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    let dt = crate::util::same_dtype(&[s, l, d])?;
    if s.len() != 1 || l.len() != 1 || d.len() != 1 {
        return err("Range's start, limit and delta must be scalars");
    }
    dispatch!(dt, T => {
        let (start, limit, delta) = (s.data::<T>()[0], l.data::<T>()[0], d.data::<T>()[0]);
        let count = ((limit.to_f64() - start.to_f64()) / delta.to_f64()).ceil();
        if delta.to_f64() == 0.0 {
            return err("Range delta cannot be 0");
        }
        if count.is_nan() {
            return err("Range's start, limit and delta give no element count (NaN)");
        }
        let count = count.max(0.0);
        if count >= usize::MAX as f64 {
            return err(format!("Range would make {count:e} elements: output: more elements than can be addressed"));
        }
        let count = count as usize;
        crate::util::check_out(dt, &[count])?;
        let mut v = Vec::with_capacity(count);
        let mut acc = start;
        for _ in 0..count {
            v.push(acc);
            acc = acc.add(delta);
        }
        Ok(vec![Tensor::from_vec(&[count], v)])
    }, bool => err("Range is not defined for bool"))
}

/// Converts a tensor to another dtype with ONNX Cast semantics.
pub fn cast(x: &Tensor, to: DType) -> Tensor {
    if x.dtype() == to {
        return x.clone();
    }
    if x.dtype().is_int() && to.is_int() {
        return dispatch!(x.dtype(), S => {
            let v: Vec<i128> = x.data::<S>().iter().map(|v| v.to_i128()).collect();
            dispatch!(to, D => Tensor::from_vec(x.shape(), v.iter().map(|&i| D::from_i128(i)).collect::<Vec<D>>()))
        });
    }
    if to == DType::Bool {
        let v: Vec<bool> = x.to_f64_vec().iter().map(|&f| f != 0.0).collect();
        return Tensor::from_bools(x.shape(), &v);
    }
    if to.is_int() {
        // Float to integer truncates toward zero; NaN becomes 0, out-of-range saturates.
        let v: Vec<f64> = x.to_f64_vec().iter().map(|f| f.trunc()).collect();
        return Tensor::from_f64(to, x.shape(), &v);
    }
    Tensor::from_f64(to, x.shape(), &x.to_f64_vec())
}

fn cast_op(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let code = n.int("to", 0) as i32;
    let to = DType::from_onnx_code(code)
        .ok_or_else(|| crate::KernelError(format!("casting to {} is not supported", DType::onnx_code_name(code))))?;
    Ok(vec![cast(x, to)])
}

fn cast_like(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    Ok(vec![cast(req(ins, 0)?, req(ins, 1)?.dtype())])
}

fn eye_like(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    if x.rank() != 2 {
        return err("EyeLike needs a 2-D input");
    }
    let dt = match n.opt_int("dtype") {
        Some(c) => {
            DType::from_onnx_code(c as i32).ok_or_else(|| crate::KernelError(format!("unsupported dtype code {c}")))?
        }
        None => x.dtype(),
    };
    let k = n.int("k", 0);
    let (r, c) = (x.shape()[0], x.shape()[1]);
    let v: Vec<f64> = (0..r * c).map(|i| if (i % c) as i64 - (i / c) as i64 == k { 1.0 } else { 0.0 }).collect();
    Ok(vec![Tensor::from_f64(dt, &[r, c], &v)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("Reshape", reshape),
    ("Flatten", flatten),
    ("Squeeze", squeeze),
    ("Unsqueeze", unsqueeze),
    ("Transpose", transpose_op),
    ("Concat", concat),
    ("Split", split),
    ("Slice", slice),
    ("Expand", expand),
    ("Tile", tile),
    ("Pad", pad),
    ("DepthToSpace", depth_space),
    ("SpaceToDepth", depth_space),
    ("Trilu", trilu),
    ("Shape", shape_op),
    ("Size", size),
    ("Identity", identity),
    ("Dropout", dropout),
    ("Constant", constant),
    ("ConstantOfShape", constant_of_shape),
    ("Range", range),
    ("Cast", cast_op),
    ("CastLike", cast_like),
    ("EyeLike", eye_like),
];
