//! Inference rules of the matrix products and the windowed ops: MatMul, Gemm, Conv, the
//! pools.

use super::{broadcast_dims, dtype_of, one, same_dtype, shape_of, unknown, Ins};
use crate::{DType, Dim, Graph, Node, ValueType};

/// MatMul, MatMulInteger (quantize_dynamic's products: 8-bit operands of either
/// signedness, an i32 product): numpy's matmul shape, inner dims checked.
pub(super) fn matmul(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let op = n.op.as_str();
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

/// Gemm: `[M, N]` from the (transposed) 2-D operands.
pub(super) fn gemm(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let dt = same_dtype(ins, &[0, 1])?;
    let (Some(a), Some(b)) = (shape_of(ins, 0), shape_of(ins, 1)) else { return one(dt, None) };
    if a.len() != 2 || b.len() != 2 {
        return Err("Gemm inputs A and B must be 2-D".into());
    }
    let m = if n.int("transA", 0) != 0 { &a[1] } else { &a[0] };
    let nn = if n.int("transB", 0) != 0 { &b[0] } else { &b[1] };
    one(dt, Some(vec![m.clone(), nn.clone()]))
}

/// Conv, ConvInteger (i32 sums of bytes) and the windowed pools: the output size per
/// spatial dim from kernel, strides, dilations, pads or `auto_pad`, and `ceil_mode`
/// (MaxPool's indices output too).
pub(super) fn window(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let op = n.op.as_str();
    // ConvInteger sums bytes into i32.
    let dt = if op == "ConvInteger" { Some(DType::I32) } else { dtype_of(ins, 0) };
    let Some(x) = shape_of(ins, 0) else { return Ok(unknown(n)) };
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
                return Err(format!("the input has {c} channels, the weight expects {cg} per group × {group} groups"));
            }
        }
        (w[0].clone(), k)
    } else {
        let k: Vec<Option<usize>> =
            n.ints("kernel_shape").map(|k| k.iter().map(|&v| Some(v as usize)).collect()).unwrap_or_default();
        (x[1].clone(), k)
    };
    if kernel.len() != sp {
        return Ok(unknown(n));
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

/// The global pools: every spatial dim 1.
pub(super) fn global_pool(_g: &Graph, _n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let Some(x) = shape_of(ins, 0) else { return one(dtype_of(ins, 0), None) };
    let mut out = x.clone();
    for d in out.iter_mut().skip(2) {
        *d = Dim::Known(1);
    }
    one(dtype_of(ins, 0), Some(out))
}
