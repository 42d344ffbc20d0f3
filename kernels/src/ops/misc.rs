//! Smaller ops that fit no family: RotaryEmbedding, SwiGLU, BitCast, CenterCropPad,
//! ReverseSequence, Unique, MaxUnpool, Det and the signal windows.

use super::window::for_each_index;
use crate::util::{axis, err, gather_elems, ints_of, need_float, opt, req, strides, Result};
use aim_ir::{DType, Node, Tensor};

fn rotary_embedding(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, cos, sin) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    need_float(x, "input")?;
    let pos = opt(ins, 3).map(|p| p.to_i64_vec());
    let shape = x.shape().to_vec();
    // Work in [batch, seq, heads, head] order.
    let (b, s, h, d, four_d) = match shape.as_slice() {
        &[b, h, s, d] => (b, s, h, d, true),
        &[b, s, hidden] => {
            let h = n.int("num_heads", 0);
            if h <= 0 || hidden % h as usize != 0 {
                return err("a 3-D input needs num_heads dividing its hidden size");
            }
            (b, s, h as usize, hidden / h as usize, false)
        }
        s => return err(format!("input must be 3-D or 4-D, got {s:?}")),
    };
    let rot = match n.int("rotary_embedding_dim", 0) {
        0 => d,
        r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
        r => return err(format!("rotary_embedding_dim {r} does not fit head size {d}")),
    };
    let half = rot / 2;
    let (cv, sv) = (cos.to_f64_vec(), sin.to_f64_vec());
    if cos.shape().last() != Some(&half) || sin.shape() != cos.shape() {
        return err(format!("cos/sin caches {:?} must end in rotary_embedding_dim/2 = {half}", cos.shape()));
    }
    let interleaved = n.int("interleaved", 0) != 0;
    let xv = x.to_f64_vec();
    let mut y = xv.clone();
    for bi in 0..b {
        for si in 0..s {
            let row = match &pos {
                Some(p) => {
                    let r = p[if p.len() == 1 { 0 } else { bi * s + si }];
                    if r < 0 || (r as usize + 1) * half > cv.len() {
                        return err(format!("position id {r} is outside the cos/sin cache"));
                    }
                    r as usize
                }
                None if cos.rank() == 3 => bi * s + si,
                None => si,
            };
            if (row + 1) * half > cv.len() {
                return err("the cos/sin cache is shorter than the sequence");
            }
            for hi in 0..h {
                let at =
                    |k: usize| if four_d { ((bi * h + hi) * s + si) * d + k } else { ((bi * s + si) * h + hi) * d + k };
                for k in 0..half {
                    let (i1, i2) = if interleaved { (2 * k, 2 * k + 1) } else { (k, k + half) };
                    let (x1, x2) = (xv[at(i1)], xv[at(i2)]);
                    let (c, sn) = (cv[row * half + k], sv[row * half + k]);
                    y[at(i1)] = c * x1 - sn * x2;
                    y[at(i2)] = sn * x1 + c * x2;
                }
            }
        }
    }
    Ok(vec![Tensor::from_f64(x.dtype(), &shape, &y)])
}

fn swiglu(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return err("SwiGLU needs A and B of one shape and dtype");
    }
    let alpha = n.float("alpha", 1.0) as f64;
    let y: Vec<f64> =
        a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(&x, y)| x / (1.0 + (-alpha * x).exp()) * y).collect();
    Ok(vec![Tensor::from_f64(a.dtype(), a.shape(), &y)])
}

fn bitcast(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let code = n.int("to", 0) as i32;
    let to = DType::from_onnx_code(code)
        .ok_or_else(|| crate::KernelError(format!("BitCast to {} is not supported", DType::onnx_code_name(code))))?;
    if to.size() != x.dtype().size() {
        return err(format!("BitCast needs types of one width, {} and {to} differ", x.dtype()));
    }
    if to == DType::Bool && x.bytes().iter().any(|&b| b > 1) {
        return err("BitCast to bool needs bytes that are 0 or 1");
    }
    Ok(vec![Tensor::from_bytes(to, x.shape(), x.bytes()).map_err(|e| crate::KernelError(e.to_string()))?])
}

fn center_crop_pad(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let target = ints_of(req(ins, 1)?)?;
    let r = x.rank();
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&v| axis(v, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if target.len() != axes.len() || target.iter().any(|&t| t < 0) {
        return err(format!("shape {target:?} must give a size for each of the {} axes", axes.len()));
    }
    let mut out = x.shape().to_vec();
    // Per dim: offset of output index 0 in input coordinates (negative when padding).
    let mut shift = vec![0i64; r];
    for (&a, &t) in axes.iter().zip(&target) {
        let dim = x.shape()[a] as i64;
        out[a] = t as usize;
        shift[a] = if t <= dim { (dim - t) / 2 } else { -((t - dim) / 2) };
    }
    crate::util::check_out(x.dtype(), &out)?;
    crate::util::check_count(crate::util::elements(&out)?, std::mem::size_of::<usize>())?;
    let st = strides(x.shape());
    let ext = super::shape::concat_tensors(&[&x.reshaped(&[x.len()]), &Tensor::zeros(x.dtype(), &[1])], 0)?;
    let mut offs = Vec::with_capacity(out.iter().product());
    for_each_index(&out, |idx| {
        let mut off = 0usize;
        for d in 0..r {
            let i = idx[d] as i64 + shift[d];
            if i < 0 || i >= x.shape()[d] as i64 {
                off = usize::MAX;
                break;
            }
            off += i as usize * st[d];
        }
        offs.push(if off == usize::MAX { x.len() } else { off });
    });
    Ok(vec![gather_elems(&ext, &out, &offs)?])
}

fn reverse_sequence(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, lens) = (req(ins, 0)?, req(ins, 1)?);
    let (ta, ba) = (axis(n.int("time_axis", 0), x.rank())?, axis(n.int("batch_axis", 1), x.rank())?);
    let lens = lens.to_i64_vec();
    if lens.len() != x.shape()[ba] {
        return err("sequence_lens must hold one length per batch entry");
    }
    let st = strides(x.shape());
    let mut offs = Vec::with_capacity(x.len());
    for_each_index(x.shape(), |idx| {
        let len = lens[idx[ba]].clamp(0, x.shape()[ta] as i64) as usize;
        let t = idx[ta];
        let src_t = if t < len { len - 1 - t } else { t };
        offs.push(idx.iter().enumerate().map(|(d, &i)| if d == ta { src_t } else { i } * st[d]).sum());
    });
    Ok(vec![gather_elems(x, x.shape(), &offs)?])
}

fn unique(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x0 = req(ins, 0)?;
    let (x, ax) = match n.opt_int("axis") {
        Some(a) => (x0.clone(), axis(a, x0.rank())?),
        None => (x0.reshaped(&[x0.len()]), 0),
    };
    let (outer, dim, inner) = super::norm::lanes(x.shape(), ax);
    let v = x.to_f64_vec();
    let slice = |k: usize| -> Vec<f64> {
        (0..outer).flat_map(|o| (0..inner).map(move |i| (o, i))).map(|(o, i)| v[(o * dim + k) * inner + i]).collect()
    };
    let slices: Vec<Vec<f64>> = (0..dim).map(slice).collect();
    let mut firsts: Vec<usize> = Vec::new();
    let mut inverse = vec![0usize; dim];
    for k in 0..dim {
        match firsts.iter().position(|&f| slices[f] == slices[k]) {
            Some(p) => inverse[k] = p,
            None => {
                inverse[k] = firsts.len();
                firsts.push(k);
            }
        }
    }
    let mut order: Vec<usize> = (0..firsts.len()).collect();
    if n.int("sorted", 1) != 0 {
        order.sort_by(|&a, &b| slices[firsts[a]].partial_cmp(&slices[firsts[b]]).unwrap_or(std::cmp::Ordering::Equal));
    }
    let mut rank_of = vec![0usize; order.len()];
    for (r, &u) in order.iter().enumerate() {
        rank_of[u] = r;
    }
    let mut counts = vec![0i64; order.len()];
    for &u in &inverse {
        counts[rank_of[u]] += 1;
    }
    let chosen: Vec<usize> = order.iter().map(|&u| firsts[u]).collect();
    let mut offs = Vec::new();
    for o in 0..outer {
        for &k in &chosen {
            offs.extend((o * dim + k) * inner..(o * dim + k + 1) * inner);
        }
    }
    let mut shape = x.shape().to_vec();
    shape[ax] = chosen.len();
    let nu = chosen.len();
    Ok(vec![
        gather_elems(&x, &shape, &offs)?,
        Tensor::from_i64(&[nu], chosen.iter().map(|&k| k as i64).collect()),
        Tensor::from_i64(&[dim], inverse.iter().map(|&u| rank_of[u] as i64).collect()),
        Tensor::from_i64(&[nu], counts),
    ])
}

fn max_unpool(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, idx) = (req(ins, 0)?, req(ins, 1)?);
    if idx.shape() != x.shape() || x.rank() < 3 {
        return err("MaxUnpool needs X of rank ≥ 3 and indices of the same shape");
    }
    let sp = x.rank() - 2;
    let kernel = n.ints("kernel_shape").ok_or_else(|| crate::KernelError("kernel_shape is required".into()))?;
    let strides_a = n.ints("strides").map(|v| v.to_vec()).unwrap_or(vec![1; sp]);
    let pads = n.ints("pads").map(|v| v.to_vec()).unwrap_or(vec![0; 2 * sp]);
    if kernel.len() != sp || strides_a.len() != sp || pads.len() != 2 * sp {
        return err("kernel_shape, strides and pads must match the spatial rank");
    }
    // Indices address the default output (what MaxPool's input would have been); an
    // explicit output_shape only pads that at the end of each spatial dim.
    let mut default = x.shape()[..2].to_vec();
    for i in 0..sp {
        let o = (x.shape()[2 + i] as i128 - 1) * strides_a[i] as i128 + kernel[i] as i128
            - pads[i] as i128
            - pads[sp + i] as i128;
        default.push(usize::try_from(o.max(0)).unwrap_or(usize::MAX));
    }
    let shape: Vec<usize> = match opt(ins, 2) {
        Some(s) => ints_of(s)?.iter().map(|&v| v.max(0) as usize).collect(),
        None => default.clone(),
    };
    if shape.len() != default.len() || shape.iter().zip(&default).any(|(s, d)| s < d) {
        return err(format!("output_shape {shape:?} is smaller than the unpooled shape {default:?}"));
    }
    crate::util::check_out(x.dtype(), &shape)?;
    crate::util::check_count(crate::util::elements(&shape)?, 8)?;
    let (dst, ost) = (strides(&default), strides(&shape));
    let total = crate::util::elements(&default)?;
    let mut y = vec![0.0; shape.iter().product()];
    for (v, i) in x.to_f64_vec().into_iter().zip(idx.to_i64_vec()) {
        if i < 0 || i as usize >= total {
            return err(format!("index {i} is outside the unpooled output of {total} elements"));
        }
        let off: usize = (0..default.len()).map(|d| (i as usize / dst[d]) % default[d] * ost[d]).sum();
        y[off] = v;
    }
    Ok(vec![Tensor::from_f64(x.dtype(), &shape, &y)])
}

fn det(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_float(x, "X")?;
    let r = x.rank();
    if r < 2 || x.shape()[r - 1] != x.shape()[r - 2] {
        return err(format!("Det needs square matrices [..., M, M], got {:?}", x.shape()));
    }
    let m = x.shape()[r - 1];
    let v = x.to_f64_vec();
    let dets: Vec<f64> = v
        .chunks(m * m)
        .map(|mat| {
            // LU decomposition with partial pivoting.
            let mut a = mat.to_vec();
            let mut d = 1.0;
            for c in 0..m {
                let p = (c..m)
                    .max_by(|&i, &j| {
                        a[i * m + c].abs().partial_cmp(&a[j * m + c].abs()).unwrap_or(std::cmp::Ordering::Equal)
                    })
                    .unwrap_or(c);
                if a[p * m + c] == 0.0 {
                    return 0.0;
                }
                if p != c {
                    for k in 0..m {
                        a.swap(p * m + k, c * m + k);
                    }
                    d = -d;
                }
                d *= a[c * m + c];
                for i in c + 1..m {
                    let f = a[i * m + c] / a[c * m + c];
                    for k in c..m {
                        a[i * m + k] -= f * a[c * m + k];
                    }
                }
            }
            d
        })
        .collect();
    Ok(vec![Tensor::from_f64(x.dtype(), &x.shape()[..r - 2], &dets)])
}

fn window_fn(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let size = req(ins, 0)?.to_i64_vec().first().copied().unwrap_or(0);
    if size < 0 {
        return err("window size must be non-negative");
    }
    crate::util::check_count(size as usize, 8)?;
    let periodic = n.int("periodic", 1) != 0;
    let den = if periodic { size as f64 } else { (size - 1).max(1) as f64 };
    let tau = 2.0 * std::f64::consts::PI;
    let v: Vec<f64> = (0..size)
        .map(|i| {
            let x = i as f64 / den;
            match n.op.as_str() {
                "HannWindow" => 0.5 - 0.5 * (tau * x).cos(),
                "HammingWindow" => 25.0 / 46.0 - 21.0 / 46.0 * (tau * x).cos(),
                _ => 0.42 - 0.5 * (tau * x).cos() + 0.08 * (2.0 * tau * x).cos(),
            }
        })
        .collect();
    let code = n.int("output_datatype", 1) as i32;
    let dt = DType::from_onnx_code(code)
        .ok_or_else(|| crate::KernelError(format!("output_datatype {code} is not supported")))?;
    Ok(vec![Tensor::from_f64(dt, &[size as usize], &v)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("RotaryEmbedding", rotary_embedding),
    ("SwiGLU", swiglu),
    ("BitCast", bitcast),
    ("CenterCropPad", center_crop_pad),
    ("ReverseSequence", reverse_sequence),
    ("Unique", unique),
    ("MaxUnpool", max_unpool),
    ("Det", det),
    ("HannWindow", window_fn),
    ("HammingWindow", window_fn),
    ("BlackmanWindow", window_fn),
];
