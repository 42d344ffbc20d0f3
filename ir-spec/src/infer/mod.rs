//! Static shape and type inference, symbolic where dims are symbolic.
//!
//! Each op's rule derives output types from input types (and from constant inputs, for
//! ops such as Reshape whose output shape is data). Ops without a rule get unknown output
//! types: inference is an aid to the passes and to `aim info`, while the executor always
//! works from real shapes. A rule that finds inputs that cannot go together (Add of f32 and
//! i64, broadcasting 3 against 4, MatMul with mismatched inner dims) is an error naming
//! the node.

use crate::{Attr, DType, Dim, Graph, Node, ValueType};

mod aim;
mod data;
mod nn;

/// A type error found by inference.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("node '{node}' ({op}): {msg}")]
pub struct InferError {
    /// The node's name.
    pub node: String,
    /// Its op.
    pub op: String,
    /// What does not fit.
    pub msg: String,
}

/// Infers the type of every node output of `g` (not descending into subgraphs), recording
/// them in `g.value_types`; declared types of graph outputs are kept where they say more.
pub fn infer_types(g: &mut Graph) -> Result<(), InferError> {
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        let ins: Vec<Option<ValueType>> =
            n.inputs.iter().map(|s| if s.is_empty() { None } else { g.value_type(s) }).collect();
        let outs = infer_node(g, n, &ins).map_err(|msg| InferError { node: n.name.clone(), op: n.op.clone(), msg })?;
        let names = n.outputs.clone();
        for (name, ty) in names.iter().zip(outs) {
            if name.is_empty() {
                continue;
            }
            let declared = g.value_types.get(name).cloned();
            let keep = match &declared {
                Some(d) => more_known(d, &ty),
                None => false,
            };
            if !keep {
                g.value_types.insert(name.clone(), ty);
            }
        }
    }
    Ok(())
}

fn known_count(t: &ValueType) -> usize {
    t.dtype.is_some() as usize
        + t.shape.as_ref().map_or(0, |s| 1 + s.iter().filter(|d| !matches!(d, Dim::Unknown)).count())
}

fn more_known(a: &ValueType, b: &ValueType) -> bool {
    known_count(a) > known_count(b)
}

type Ins<'a> = &'a [Option<ValueType>];

fn dtype_of(ins: Ins, i: usize) -> Option<DType> {
    ins.get(i).and_then(|t| t.as_ref()).and_then(|t| t.dtype)
}

fn shape_of(ins: Ins, i: usize) -> Option<Vec<Dim>> {
    ins.get(i).and_then(|t| t.as_ref()).and_then(|t| t.shape.clone())
}

fn same_as(ins: Ins, i: usize) -> ValueType {
    ins.get(i).and_then(|t| t.clone()).unwrap_or_else(ValueType::unknown)
}

/// The broadcast of two shapes under ONNX (numpy) rules.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let da = if i + a.len() >= r { &a[i + a.len() - r] } else { &Dim::Known(1) };
        let db = if i + b.len() >= r { &b[i + b.len() - r] } else { &Dim::Known(1) };
        out.push(match (da, db) {
            (Dim::Known(1), d) | (d, Dim::Known(1)) => d.clone(),
            (Dim::Known(x), Dim::Known(y)) if x != y => {
                return Err(format!("cannot broadcast dimension {x} against {y}"));
            }
            (x, y) if x == y => x.clone(),
            (Dim::Known(x), _) | (_, Dim::Known(x)) => Dim::Known(*x),
            _ => Dim::Unknown,
        });
    }
    Ok(out)
}

fn broadcast_all(ins: Ins, idx: &[usize]) -> Result<Option<Vec<Dim>>, String> {
    let mut acc: Option<Vec<Dim>> = Some(vec![]);
    for &i in idx {
        match (acc, shape_of(ins, i)) {
            (Some(a), Some(b)) => acc = Some(broadcast_dims(&a, &b)?),
            _ => acc = None,
        }
    }
    Ok(acc)
}

fn same_dtype(ins: Ins, idx: &[usize]) -> Result<Option<DType>, String> {
    let mut d: Option<DType> = None;
    for &i in idx {
        if let Some(x) = dtype_of(ins, i) {
            if let Some(prev) = d {
                if prev != x {
                    return Err(format!("inputs must share one element type, found {prev} and {x}"));
                }
            }
            d = Some(x);
        }
    }
    Ok(d)
}

fn const_ints(g: &Graph, n: &Node, i: usize) -> Option<Vec<i64>> {
    let name = n.input(i)?;
    let t = g.initializers.get(name)?;
    if t.dtype().is_int() {
        Some(t.to_i64_vec())
    } else {
        None
    }
}

fn norm_axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if x < 0 || x >= r.max(1) && !(r == 0 && x == 0) {
        return Err(format!("axis {a} is out of range for rank {rank}"));
    }
    Ok(x as usize)
}

fn mul_dims(dims: &[Dim]) -> Dim {
    let mut p = 1usize;
    for d in dims {
        match d {
            Dim::Known(k) => match p.checked_mul(*k) {
                Some(v) => p = v,
                None => return Dim::Unknown, // impossible: the kernel will say so with the value
            },
            _ => return Dim::Unknown,
        }
    }
    Dim::Known(p)
}

/// Ops whose `axis` attribute indexes the dims of input 0 (`[-r, r)`).
const AXIS_OPS: &[&str] = &[
    "ArgMax",
    "ArgMin",
    "Compress",
    "Gather",
    "GatherElements",
    "Hardmax",
    "LayerNormalization",
    "LogSoftmax",
    "LpNormalization",
    "ScatterElements",
    "Softmax",
    "Split",
    "TopK",
];

/// An `axis` attribute out of range for input 0's rank is an error, as in ONNX Runtime
/// (Flatten takes `[-r, r]`).
fn check_axis(n: &Node, ins: Ins) -> Result<(), String> {
    let (Some(a), Some(r)) = (n.opt_int("axis"), shape_of(ins, 0).map(|s| s.len() as i64)) else { return Ok(()) };
    let ok = match n.op.as_str() {
        "Flatten" => (-r..=r).contains(&a),
        op if AXIS_OPS.contains(&op) => (-r..r).contains(&a) || (r == 0 && a == 0 && op == "Compress"),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("axis {a} is out of range for an input of rank {r}"))
    }
}

const UNARY_SAME: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "BatchNormalization",
    "Ceil",
    "Celu",
    "Clip",
    "Cos",
    "Cosh",
    "CumSum",
    "Dropout",
    "Elu",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "InstanceNormalization",
    "LRN",
    "LayerNormalization",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "LpNormalization",
    "MeanVarianceNormalization",
    "Mish",
    "Neg",
    "Not",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softmax",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "Trilu",
    "BitwiseNot",
    "GroupNormalization",
    "RMSNormalization",
];
const BINARY_SAME: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Mod",
    "Min",
    "Max",
    "Sum",
    "Mean",
    "BitShift",
    "And",
    "Or",
    "Xor",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "PRelu",
];
const COMPARE: &[&str] = &["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"];

fn infer_node(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let op = n.op.as_str();
    let unknown = || vec![ValueType::unknown(); n.outputs.len()];
    if let Some(custom) = crate::custom::lookup(&n.domain, op) {
        return crate::custom::infer(&*custom, n, ins);
    }
    if n.domain == "aim" {
        return Ok(aim::infer(g, n, ins));
    }
    if !n.domain.is_empty() && n.domain != "ai.onnx" {
        return Ok(unknown());
    }
    let one = |dtype: Option<DType>, shape: Option<Vec<Dim>>| Ok(vec![ValueType { dtype, shape }]);
    check_axis(n, ins)?;
    if UNARY_SAME.contains(&op) {
        let mut outs = vec![same_as(ins, 0)];
        outs.resize(n.outputs.len(), ValueType::unknown());
        return Ok(outs);
    }
    if BINARY_SAME.contains(&op) || op == "Pow" {
        let idx: Vec<usize> = (0..ins.len()).collect();
        let dt = if op == "Pow" || op == "PRelu" { dtype_of(ins, 0) } else { same_dtype(ins, &idx)? };
        return one(dt, broadcast_all(ins, &idx)?);
    }
    if COMPARE.contains(&op) {
        same_dtype(ins, &[0, 1])?;
        return one(Some(DType::Bool), broadcast_all(ins, &[0, 1])?);
    }
    match op {
        "IsNaN" | "IsInf" => one(Some(DType::Bool), shape_of(ins, 0)),
        "Where" => {
            same_dtype(ins, &[1, 2])?;
            one(dtype_of(ins, 1).or(dtype_of(ins, 2)), broadcast_all(ins, &[0, 1, 2])?)
        }
        "Cast" => {
            let to = n.int("to", 0) as i32;
            one(DType::from_onnx_code(to), shape_of(ins, 0))
        }
        "CastLike" => one(dtype_of(ins, 1), shape_of(ins, 0)),
        "Shape" => {
            let shape = shape_of(ins, 0).map(|s| {
                let r = s.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r);
                let start = clamp(n.int("start", 0));
                let end = clamp(n.int("end", r));
                vec![Dim::Known((end - start).max(0) as usize)]
            });
            one(Some(DType::I64), shape)
        }
        "Size" => one(Some(DType::I64), Some(vec![])),
        // MatMulInteger (quantize_dynamic's products): 8-bit operands of either signedness,
        // an int32 product of MatMul's shape.
        "MatMul" | "MatMulInteger" => {
            let dt = if op == "MatMulInteger" { Some(DType::I32) } else { same_dtype(ins, &[0, 1])? };
            let (Some(a), Some(b)) = (shape_of(ins, 0), shape_of(ins, 1)) else { return one(dt, None) };
            if a.is_empty() || b.is_empty() {
                return Err("MatMul inputs must have rank at least 1".into());
            }
            let (a2, pa) = if a.len() == 1 { (vec![Dim::Known(1), a[0].clone()], true) } else { (a.clone(), false) };
            let (b2, pb) = if b.len() == 1 { (vec![b[0].clone(), Dim::Known(1)], true) } else { (b.clone(), false) };
            let k1 = &a2[a2.len() - 1];
            let k2 = &b2[b2.len() - 2];
            if let (Dim::Known(x), Dim::Known(y)) = (k1, k2) {
                if x != y {
                    return Err(format!("inner dimensions differ: {x} vs {y}"));
                }
            }
            let mut out = broadcast_dims(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
            if !pa {
                out.push(a2[a2.len() - 2].clone());
            }
            if !pb {
                out.push(b2[b2.len() - 1].clone());
            }
            one(dt, Some(out))
        }
        "Gemm" => {
            let dt = same_dtype(ins, &[0, 1])?;
            let (Some(a), Some(b)) = (shape_of(ins, 0), shape_of(ins, 1)) else { return one(dt, None) };
            if a.len() != 2 || b.len() != 2 {
                return Err("Gemm inputs A and B must be 2-D".into());
            }
            let m = if n.int("transA", 0) != 0 { &a[1] } else { &a[0] };
            let nn = if n.int("transB", 0) != 0 { &b[0] } else { &b[1] };
            one(dt, Some(vec![m.clone(), nn.clone()]))
        }
        "Conv" | "ConvInteger" | "MaxPool" | "AveragePool" | "LpPool" => {
            // ConvInteger sums bytes into i32.
            let dt = if op == "ConvInteger" { Some(DType::I32) } else { dtype_of(ins, 0) };
            let Some(x) = shape_of(ins, 0) else { return Ok(unknown()) };
            if x.len() < 3 {
                return Err(format!("input must be at least 3-D (N, C, spatial...), got rank {}", x.len()));
            }
            let sp = x.len() - 2;
            for (name, per) in [("strides", 1), ("dilations", 1), ("kernel_shape", 1), ("pads", 2)] {
                if let Some(v) = n.ints(name).filter(|v| v.len() != per * sp) {
                    return Err(format!("attribute '{name}' has {} values for {sp} spatial dims", v.len()));
                }
            }
            let (c_out, kernel) = if op == "Conv" || op == "ConvInteger" {
                let Some(w) = shape_of(ins, 1) else { return one(dt, None) };
                if w.len() != x.len() {
                    return Err(format!("weight rank {} does not match input rank {}", w.len(), x.len()));
                }
                let k: Vec<Option<usize>> = match n.ints("kernel_shape") {
                    Some(k) => k.iter().map(|&v| Some(v as usize)).collect(),
                    None => w[2..].iter().map(|d| d.known()).collect(),
                };
                for (i, (kk, wd)) in k.iter().zip(&w[2..]).enumerate() {
                    if let (Some(a), Some(b)) = (kk, wd.known()) {
                        if *a != b {
                            return Err(format!("kernel_shape[{i}] is {a} but the weight's kernel is {b}"));
                        }
                    }
                }
                let group = n.int("group", 1).max(1) as usize;
                if let (Some(c), Some(cg)) = (x[1].known(), w[1].known()) {
                    if c != cg * group {
                        return Err(format!(
                            "the input has {c} channels, the weight expects {cg} per group × {group} groups"
                        ));
                    }
                }
                (w[0].clone(), k)
            } else {
                let k: Vec<Option<usize>> =
                    n.ints("kernel_shape").map(|k| k.iter().map(|&v| Some(v as usize)).collect()).unwrap_or_default();
                (x[1].clone(), k)
            };
            if kernel.len() != sp {
                return Ok(unknown());
            }
            let strides = n.ints("strides").map(|v| v.to_vec()).unwrap_or(vec![1; sp]);
            let dil = n.ints("dilations").map(|v| v.to_vec()).unwrap_or(vec![1; sp]);
            let pads = n.ints("pads").map(|v| v.to_vec()).unwrap_or(vec![0; 2 * sp]);
            let auto_pad = n.string("auto_pad", "NOTSET");
            let ceil = n.int("ceil_mode", 0) != 0;
            let mut out = vec![x[0].clone(), c_out];
            for i in 0..sp {
                let (Some(inp), Some(k)) = (x[2 + i].known(), kernel[i]) else {
                    out.push(Dim::Unknown);
                    continue;
                };
                let s = strides.get(i).copied().unwrap_or(1).max(1) as usize;
                let d = dil.get(i).copied().unwrap_or(1).max(1) as usize;
                let Some(ek) = k.checked_sub(1).and_then(|k| k.checked_mul(d)).and_then(|e| e.checked_add(1)) else {
                    return Err(format!("kernel {k} with dilation {d} is larger than can be addressed"));
                };
                let o = match auto_pad {
                    "SAME_UPPER" | "SAME_LOWER" => inp.div_ceil(s),
                    "VALID" => (inp + 1).saturating_sub(ek).div_ceil(s),
                    _ => {
                        let total = (inp as i128)
                            + pads.get(i).copied().unwrap_or(0) as i128
                            + pads.get(i + sp).copied().unwrap_or(0) as i128;
                        let span = total - ek as i128;
                        if span >= i64::MAX as i128 {
                            return Err(format!("the padded input {total} is larger than can be addressed"));
                        }
                        if span < 0 {
                            return Err(format!("kernel {ek} is larger than the padded input {total}"));
                        }
                        let span = span as usize;
                        if ceil {
                            let mut o = span.div_ceil(s) + 1;
                            if (o - 1) * s >= inp + pads.get(i).copied().unwrap_or(0) as usize {
                                o -= 1;
                            }
                            o
                        } else {
                            span / s + 1
                        }
                    }
                };
                out.push(Dim::Known(o));
            }
            let mut outs = vec![ValueType { dtype: dt, shape: Some(out.clone()) }];
            if n.outputs.len() > 1 {
                outs.push(ValueType { dtype: Some(DType::I64), shape: Some(out) });
            }
            Ok(outs)
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            let Some(x) = shape_of(ins, 0) else { return one(dtype_of(ins, 0), None) };
            let mut out = x.clone();
            for d in out.iter_mut().skip(2) {
                *d = Dim::Known(1);
            }
            one(dtype_of(ins, 0), Some(out))
        }
        "Flatten" => {
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
        "Reshape" => {
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
                if let (Dim::Known(total), Dim::Known(rest)) =
                    (mul_dims(x), mul_dims(&[&out[..pos], &out[pos + 1..]].concat()))
                {
                    if rest == 0 || total % rest != 0 {
                        return Err(format!("cannot reshape {total} elements into {target:?}"));
                    }
                    out[pos] = Dim::Known(total / rest);
                }
            }
            one(dt, Some(out))
        }
        "Transpose" => {
            let Some(x) = shape_of(ins, 0) else { return one(dtype_of(ins, 0), None) };
            let perm: Vec<i64> =
                n.ints("perm").map(|p| p.to_vec()).unwrap_or_else(|| (0..x.len() as i64).rev().collect());
            if perm.len() != x.len() {
                return Err(format!("perm {perm:?} does not match rank {}", x.len()));
            }
            let out: Result<Vec<Dim>, String> =
                perm.iter().map(|&p| x.get(p as usize).cloned().ok_or_else(|| format!("bad perm {perm:?}"))).collect();
            one(dtype_of(ins, 0), Some(out?))
        }
        "Concat" => {
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
        "Unsqueeze" | "Squeeze" => {
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
        "Gather" => {
            let dt = dtype_of(ins, 0);
            let (Some(x), Some(idx)) = (shape_of(ins, 0), shape_of(ins, 1)) else { return one(dt, None) };
            let ax = norm_axis(n.int("axis", 0), x.len())?;
            let mut out = x[..ax].to_vec();
            out.extend(idx);
            out.extend_from_slice(&x[ax + 1..]);
            one(dt, Some(out))
        }
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare" | "ArgMax" | "ArgMin" => {
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
        "Constant" => {
            if let Some(Attr::Tensor(t)) = n.attrs.get("value") {
                return one(Some(t.dtype()), Some(t.shape().iter().map(|&d| Dim::Known(d)).collect()));
            }
            Ok(unknown())
        }
        "ConstantOfShape" => {
            let dt = n.tensor("value").map(|t| t.dtype()).or(Some(DType::F32));
            let shape = const_ints(g, n, 0).map(|v| v.iter().map(|&d| Dim::Known(d.max(0) as usize)).collect());
            one(dt, shape)
        }
        _ => data::infer(g, n, ins).or_else(|| nn::infer(g, n, ins)).unwrap_or_else(|| Ok(unknown())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_graph;

    fn ty(g: &Graph, v: &str) -> String {
        g.value_types.get(v).map(|t| t.to_string()).unwrap_or_default()
    }

    /// Squeeze's axes as an attribute (before opset 13) are the axes squeezed, negative
    /// ones included, and axes computed at run time leave the shape unknown: neither is
    /// every dim of 1 (the output's computed type once came out `[3,5]` for `[1,3,5]`).
    #[test]
    fn squeeze_reads_its_axes_attribute() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[1,3,1,5]\n input %a: i64[1]\n %y = Squeeze(%x) {axes=[-2]}  # sq\n %z = Squeeze(%x, %a)  # run_time_axes\n output %y: f32[*]\n output %z: f32[*]\n}\n",
        )
        .unwrap();
        infer_types(&mut g).unwrap();
        assert_eq!(ty(&g, "y"), "f32[1,3,5]");
        // Axes known only at run time: no shape is guessed.
        assert!(g.value_types.get("z").is_none_or(|t| t.shape.is_none()), "{}", ty(&g, "z"));
    }

    #[test]
    fn symbolic_dims_flow_through() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[N,4]\n input %w: f32[4,8]\n %y = MatMul(%x, %w)  # mm\n %z = Relu(%y)  # r\n %s = Shape(%z)  # s\n output %z: f32[N,8]\n}\n",
        )
        .unwrap();
        infer_types(&mut g).unwrap();
        assert_eq!(ty(&g, "y"), "f32[N,8]");
        assert_eq!(ty(&g, "z"), "f32[N,8]");
        assert_eq!(ty(&g, "s"), "i64[2]");
    }

    #[test]
    fn conv_and_pool_shapes() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[1,3,224,224]\n input %w: f32[64,3,7,7]\n %y = Conv(%x, %w) {pads=[3, 3, 3, 3], strides=[2, 2]}  # c\n %p = MaxPool(%y) {kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]}  # p\n output %p: f32[*]\n}\n",
        )
        .unwrap();
        infer_types(&mut g).unwrap();
        assert_eq!(ty(&g, "y"), "f32[1,64,112,112]");
        assert_eq!(ty(&g, "p"), "f32[1,64,56,56]");
    }

    #[test]
    fn mismatches_are_errors_naming_the_node() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %a: f32[3]\n input %b: f32[4]\n %c = Add(%a, %b)  # the_add\n output %c: f32[*]\n}\n",
        )
        .unwrap();
        let e = infer_types(&mut g).unwrap_err();
        assert_eq!(e.node, "the_add");
        let mut g = parse_graph(
            "graph \"g\" {\n input %a: f32[3]\n input %b: i64[3]\n %c = Add(%a, %b)  # x\n output %c: f32[*]\n}\n",
        )
        .unwrap();
        assert!(infer_types(&mut g).is_err());
    }
}
