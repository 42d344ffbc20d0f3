//! Quantisation: QuantizeLinear, DequantizeLinear (per tensor, per axis, or blocked),
//! DynamicQuantizeLinear, and the integer products MatMulInteger, ConvInteger,
//! QLinearMatMul and QLinearConv — the ops of quantised (INT8) ONNX models.

use crate::util::{axis, err, opt, req, strides, Result};
use aim_ir::{DType, Node, Tensor};

/// For each element of a tensor of `shape`, the offset of its scale / zero point in a
/// parameter of `pshape`: a scalar, a 1-D per-axis vector, or a blocked tensor of the same
/// rank whose `axis` dim is the number of blocks.
fn param_offsets(shape: &[usize], pshape: &[usize], ax: i64, block: usize) -> Result<Vec<usize>> {
    let n: usize = shape.iter().product();
    let plen: usize = pshape.iter().product();
    if plen == 1 {
        return Ok(vec![0; n]);
    }
    let a = axis(ax, shape.len())?;
    let st = strides(shape);
    if pshape.len() == 1 && block == 0 {
        if pshape[0] != shape[a] {
            return err(format!("per-axis parameter of {} values for axis {a} of size {}", pshape[0], shape[a]));
        }
        return Ok((0..n).map(|i| (i / st[a]) % shape[a]).collect());
    }
    if pshape.len() != shape.len() || block == 0 {
        return err(format!("parameter of shape {pshape:?} does not fit an input of shape {shape:?}"));
    }
    let pst = strides(pshape);
    Ok((0..n)
        .map(|i| {
            (0..shape.len())
                .map(|d| {
                    let c = (i / st[d]) % shape[d];
                    (if d == a { c / block } else { c }) * pst[d]
                })
                .sum()
        })
        .collect())
}

/// ONNX's code of the 4-bit signed integer type.
pub const INT4: i64 = 22;
/// ONNX's code of the 4-bit unsigned integer type.
pub const UINT4: i64 = 21;

/// The smallest and largest value of the quantized integer type `dt`, or why `dt` is not one.
pub fn range_of(dt: DType) -> Result<(f64, f64)> {
    Ok(match dt {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        d => return err(format!("quantising to {d} is not supported")),
    })
}

/// `a / b`, in f32 when the input is single precision: the rounding that follows must see
/// the same quotient ONNX's f32 arithmetic gives.
fn div(a: f64, b: f64, single: bool) -> f64 {
    if single {
        (a as f32 / b as f32) as f64
    } else {
        a / b
    }
}

fn quantize(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, scale) = (req(ins, 0)?, req(ins, 1)?);
    let zp = opt(ins, 2);
    let code = n.opt_int("output_dtype").filter(|&c| c != 0);
    let (out_dt, (lo, hi)) = match (zp, code) {
        // 4-bit outputs (ONNX's INT4 / UINT4) are held one per byte, as the importer holds
        // 4-bit tensors: the values saturate to the 4-bit range.
        (_, Some(INT4)) => (DType::I8, (-8.0, 7.0)),
        (_, Some(UINT4)) => (DType::U8, (0.0, 15.0)),
        (Some(z), _) => (z.dtype(), range_of(z.dtype())?),
        (None, Some(code)) => {
            let d = DType::from_onnx_code(code as i32).ok_or_else(|| {
                crate::KernelError(format!("output_dtype {} is not supported", DType::onnx_code_name(code as i32)))
            })?;
            (d, range_of(d)?)
        }
        (None, None) => (DType::U8, range_of(DType::U8)?),
    };
    let block = n.int("block_size", 0).max(0) as usize;
    let offs = param_offsets(x.shape(), scale.shape(), n.int("axis", 1), block)?;
    let (xv, sv) = (x.to_f64_vec(), scale.to_f64_vec());
    let zv = zp.map(|z| z.to_f64_vec()).unwrap_or(vec![0.0; sv.len()]);
    let single = x.dtype() != DType::F64;
    let y: Vec<f64> =
        xv.iter().zip(&offs).map(|(&v, &o)| (div(v, sv[o], single).round_ties_even() + zv[o]).clamp(lo, hi)).collect();
    Ok(vec![Tensor::from_f64(out_dt, x.shape(), &y)])
}

fn dequantize(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, scale) = (req(ins, 0)?, req(ins, 1)?);
    let block = n.int("block_size", 0).max(0) as usize;
    if block == 0 && n.opt_int("output_dtype").is_none_or(|c| c == 0 || c == DType::F32.onnx_code() as i64) {
        if let Some(y) = dequantize_narrow(x, scale, opt(ins, 2), n.int("axis", 1))? {
            return Ok(vec![y]);
        }
    }
    let offs = param_offsets(x.shape(), scale.shape(), n.int("axis", 1), block)?;
    let (xv, sv) = (x.to_f64_vec(), scale.to_f64_vec());
    let zv = opt(ins, 2).map(|z| z.to_f64_vec()).unwrap_or(vec![0.0; sv.len()]);
    let y: Vec<f64> = xv.iter().zip(&offs).map(|(&v, &o)| (v - zv[o]) * sv[o]).collect();
    let out_dt = match n.opt_int("output_dtype").filter(|&c| c != 0) {
        Some(code) => DType::from_onnx_code(code as i32).unwrap_or(scale.dtype()),
        None => scale.dtype(),
    };
    Ok(vec![Tensor::from_f64(out_dt, x.shape(), &y)])
}

/// DequantizeLinear of 8- and 16-bit integers with an f32 scale, per tensor or per axis,
/// in f32 — what dequantizing a model's weights at load needs, without the general path's
/// f64 copies and per-element offsets. The result is the general path's exactly: `q - zp`
/// is an exact integer and its product with an f32 scale fits in f64's 53 bits, so both
/// round once, to the same f32. `None` for other forms.
pub fn dequantize_narrow(x: &Tensor, scale: &Tensor, zp: Option<&Tensor>, ax: i64) -> Result<Option<Tensor>> {
    let narrow = |d: DType| matches!(d, DType::U8 | DType::I8 | DType::U16 | DType::I16);
    if !narrow(x.dtype()) || scale.dtype() != DType::F32 || zp.is_some_and(|z| z.dtype() != x.dtype()) {
        return Ok(None);
    }
    let ints = |t: &Tensor| -> Vec<i32> {
        match t.dtype() {
            DType::U8 => t.data::<u8>().iter().map(|&v| v as i32).collect(),
            DType::I8 => t.data::<i8>().iter().map(|&v| v as i32).collect(),
            DType::U16 => t.data::<u16>().iter().map(|&v| v as i32).collect(),
            _ => t.data::<i16>().iter().map(|&v| v as i32).collect(),
        }
    };
    let s = scale.data::<f32>();
    let z = zp.map(ints).unwrap_or_else(|| vec![0; s.len()]);
    if z.len() != s.len() {
        return Ok(None);
    }
    let shape = x.shape();
    // Per tensor: one channel of every element; per axis: channels along `ax`.
    let (len, inner) = if s.len() == 1 {
        (1, x.len().max(1))
    } else {
        let a = axis(ax, shape.len())?;
        if scale.rank() != 1 || shape[a] != s.len() {
            return Ok(None);
        }
        (s.len(), shape[a + 1..].iter().product::<usize>().max(1))
    };
    let q = ints(x);
    let mut y = Vec::with_capacity(q.len());
    for (i, chunk) in q.chunks(inner).enumerate() {
        let c = i % len;
        y.extend(chunk.iter().map(|&v| (v - z[c]) as f32 * s[c]));
    }
    Ok(Some(Tensor::from_vec(shape, y)))
}

fn dynamic_quantize(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let xv = x.to_f64_vec();
    let rmin = xv.iter().copied().fold(0.0, f64::min);
    let rmax = xv.iter().copied().fold(0.0, f64::max);
    let scale = ((rmax - rmin) as f32 / 255.0) as f64;
    let zp = if scale == 0.0 { 0.0 } else { (0.0 - div(rmin, scale, true)).round_ties_even().clamp(0.0, 255.0) };
    let y: Vec<f64> = xv
        .iter()
        .map(|&v| if scale == 0.0 { zp } else { (div(v, scale, true).round_ties_even() + zp).clamp(0.0, 255.0) })
        .collect();
    Ok(vec![
        Tensor::from_f64(DType::U8, x.shape(), &y),
        Tensor::scalar(scale as f32),
        Tensor::from_f64(DType::U8, &[], &[zp]),
    ])
}

/// `t - zero_point` as f64, the zero point per tensor, or per row (`axis` -2, the A side of
/// MatMulInteger) or per column / output channel (`axis` given).
fn centered(t: &Tensor, zp: Option<&Tensor>, ax: i64) -> Result<Vec<f64>> {
    let v = t.to_f64_vec();
    let Some(z) = zp else { return Ok(v) };
    let offs = param_offsets(t.shape(), &[z.len()], ax, 0)?;
    let zv = z.to_f64_vec();
    Ok(v.iter().zip(&offs).map(|(&a, &o)| a - zv[o]).collect())
}

fn as_f64_tensor(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F64, shape, v)
}

fn matmul_f64(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let node = Node {
        name: String::new(),
        op: "MatMul".into(),
        domain: String::new(),
        inputs: vec![],
        outputs: vec![],
        attrs: Default::default(),
    };
    Ok(crate::kernel("MatMul").expect("MatMul kernel")(&node, &[Some(a.clone()), Some(b.clone())])?.remove(0))
}

fn matmul_integer(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    let av = centered(a, opt(ins, 2), -2)?;
    let bv = centered(b, opt(ins, 3), -1)?;
    let y = matmul_f64(&as_f64_tensor(a.shape(), &av), &as_f64_tensor(b.shape(), &bv))?;
    Ok(vec![Tensor::from_f64(DType::I32, y.shape(), &y.to_f64_vec())])
}

fn qlinear_matmul(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 3)?);
    let (as_, bs, ys) = (req(ins, 1)?.to_f64_vec(), req(ins, 4)?.to_f64_vec(), req(ins, 6)?.to_f64_vec());
    let yzp = req(ins, 7)?;
    let av: Vec<f64> = centered(a, opt(ins, 2), -2)?;
    let bv: Vec<f64> = centered(b, opt(ins, 5), -1)?;
    let av: Vec<f64> = av.iter().map(|x| x * as_[0]).collect();
    let offs = param_offsets(b.shape(), &[bs.len()], -1, 0)?;
    let bv: Vec<f64> = bv.iter().zip(&offs).map(|(x, &o)| x * bs[o]).collect();
    let y = matmul_f64(&as_f64_tensor(a.shape(), &av), &as_f64_tensor(b.shape(), &bv))?;
    let (lo, hi) = range_of(yzp.dtype())?;
    let z = yzp.to_f64_vec()[0];
    let q: Vec<f64> = y.to_f64_vec().iter().map(|v| ((v / ys[0]).round_ties_even() + z).clamp(lo, hi)).collect();
    Ok(vec![Tensor::from_f64(yzp.dtype(), y.shape(), &q)])
}

fn conv_f64(n: &Node, x: Tensor, w: Tensor, b: Option<Tensor>) -> Result<Tensor> {
    let mut node = n.clone();
    node.op = "Conv".into();
    Ok(crate::kernel("Conv").expect("Conv kernel")(&node, &[Some(x), Some(w), b])?.remove(0))
}

fn conv_integer(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, w) = (req(ins, 0)?, req(ins, 1)?);
    let xv = centered(x, opt(ins, 2), 0)?;
    let wv = centered(w, opt(ins, 3), 0)?;
    let y = conv_f64(n, as_f64_tensor(x.shape(), &xv), as_f64_tensor(w.shape(), &wv), None)?;
    Ok(vec![Tensor::from_f64(DType::I32, y.shape(), &y.to_f64_vec())])
}

fn qlinear_conv(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, w) = (req(ins, 0)?, req(ins, 3)?);
    let (xs, ws, ys) = (req(ins, 1)?.to_f64_vec(), req(ins, 4)?.to_f64_vec(), req(ins, 6)?.to_f64_vec());
    let yzp = req(ins, 7)?;
    let xv: Vec<f64> = centered(x, opt(ins, 2), 0)?.iter().map(|v| v * xs[0]).collect();
    let offs = param_offsets(w.shape(), &[ws.len()], 0, 0)?;
    let wv: Vec<f64> = centered(w, opt(ins, 5), 0)?.iter().zip(&offs).map(|(v, &o)| v * ws[o]).collect();
    let b = opt(ins, 8).map(|b| {
        let bv: Vec<f64> =
            b.to_f64_vec().iter().enumerate().map(|(i, v)| v * xs[0] * ws[if ws.len() == 1 { 0 } else { i }]).collect();
        as_f64_tensor(b.shape(), &bv)
    });
    let y = conv_f64(n, as_f64_tensor(x.shape(), &xv), as_f64_tensor(w.shape(), &wv), b)?;
    let (lo, hi) = range_of(yzp.dtype())?;
    let z = yzp.to_f64_vec()[0];
    let q: Vec<f64> = y.to_f64_vec().iter().map(|v| ((v / ys[0]).round_ties_even() + z).clamp(lo, hi)).collect();
    Ok(vec![Tensor::from_f64(yzp.dtype(), y.shape(), &q)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("QuantizeLinear", quantize),
    ("DequantizeLinear", dequantize),
    ("DynamicQuantizeLinear", dynamic_quantize),
    ("MatMulInteger", matmul_integer),
    ("QLinearMatMul", qlinear_matmul),
    ("ConvInteger", conv_integer),
    ("QLinearConv", qlinear_conv),
];
