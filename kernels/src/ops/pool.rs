//! Pooling: MaxPool (with indices), AveragePool, LpPool and their global forms.

use super::window::{for_each_index, window};
use crate::util::{err, req, Result};
use aim_ir::{DType, Node, Tensor};

fn pool(node: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let xs = x.shape();
    if xs.len() < 3 {
        return err(format!("{} needs an input of rank ≥ 3, got {xs:?}", node.op));
    }
    let op = node.op.as_str();
    let sp = xs.len() - 2;
    let kernel: Vec<usize> = match node.ints("kernel_shape") {
        Some(k) => k.iter().map(|&v| v.max(1) as usize).collect(),
        None => return err("attribute kernel_shape is required"),
    };
    let ceil = node.int("ceil_mode", 0) != 0;
    let g = window(node, &xs[2..], &kernel, ceil)?;
    let include_pad = node.int("count_include_pad", 0) != 0;
    let p = node.int("p", 2) as f64;
    let xd = x.to_f64_vec();
    let (nb, c) = (xs[0], xs[1]);
    let in_sp = &xs[2..];
    let isize: usize = in_sp.iter().product();
    let osize = crate::util::elements(&g.out)?;
    crate::util::check_count(crate::util::elements(&[nb, c, osize])?, 8)?;
    let mut y = Vec::with_capacity(nb * c * osize);
    let mut idx_out: Vec<i64> = Vec::new();
    let col_major = node.int("storage_order", 0) != 0;
    for plane in 0..nb * c {
        let xp = &xd[plane * isize..(plane + 1) * isize];
        for_each_index(&g.out, |op_| {
            let mut best = f64::NEG_INFINITY;
            let mut best_at: Option<Vec<usize>> = None;
            let mut sum = 0.0;
            let mut count = 0usize;
            let mut padded_count = 1usize;
            for d in 0..sp {
                // The window clipped to the padded input (what count_include_pad divides by).
                let start = (op_[d] * g.strides[d]) as isize - g.pad_begin[d] as isize;
                let end =
                    (start + ((kernel[d] - 1) * g.dilations[d] + 1) as isize).min((in_sp[d] + g.pad_end[d]) as isize);
                padded_count *= ((end - start) as usize).div_ceil(g.dilations[d]);
            }
            for_each_index(&kernel, |kp| {
                let mut off = 0usize;
                let mut pos_v = Vec::with_capacity(sp);
                for d in 0..sp {
                    let pos = (op_[d] * g.strides[d] + kp[d] * g.dilations[d]) as isize - g.pad_begin[d] as isize;
                    if pos < 0 || pos >= in_sp[d] as isize {
                        return;
                    }
                    off = off * in_sp[d] + pos as usize;
                    pos_v.push(pos as usize);
                }
                let v = xp[off];
                count += 1;
                match op {
                    "MaxPool" => {
                        if v > best || best_at.is_none() || v.is_nan() {
                            best = v;
                            best_at = Some(pos_v);
                        }
                    }
                    "LpPool" => sum += v.abs().powf(p),
                    _ => sum += v,
                }
            });
            y.push(match op {
                "MaxPool" => {
                    if let Some(at) = &best_at {
                        let flat = if col_major {
                            let mut o = 0usize;
                            for d in (0..sp).rev() {
                                o = o * in_sp[d] + at[d];
                            }
                            o
                        } else {
                            at.iter().zip(in_sp).fold(0usize, |o, (&a, &s)| o * s + a)
                        };
                        idx_out.push((plane * isize + flat) as i64);
                    } else {
                        idx_out.push(0);
                    }
                    best
                }
                "LpPool" => sum.powf(1.0 / p),
                _ => {
                    let div = if include_pad { padded_count } else { count };
                    if div == 0 {
                        0.0
                    } else {
                        sum / div as f64
                    }
                }
            });
        });
    }
    let mut shape = vec![nb, c];
    shape.extend(&g.out);
    let mut outs = vec![Tensor::from_f64(x.dtype(), &shape, &y)];
    if op == "MaxPool" {
        outs.push(Tensor::from_i64(&shape, idx_out));
    }
    Ok(outs)
}

fn global_pool(node: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let xs = x.shape();
    if xs.len() < 2 {
        return err(format!("{} needs an input of rank ≥ 2, got {xs:?}", node.op));
    }
    let planes = xs[0] * xs[1];
    let size: usize = xs[2..].iter().product();
    let p = node.int("p", 2) as f64;
    let xd = x.to_f64_vec();
    let y: Vec<f64> = (0..planes)
        .map(|i| {
            let s = &xd[i * size..(i + 1) * size];
            match node.op.as_str() {
                "GlobalMaxPool" => s.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                "GlobalLpPool" => s.iter().map(|v| v.abs().powf(p)).sum::<f64>().powf(1.0 / p),
                _ => s.iter().sum::<f64>() / size as f64,
            }
        })
        .collect();
    let mut shape = xs.to_vec();
    shape[2..].iter_mut().for_each(|d| *d = 1);
    if x.dtype() == DType::Bool || !x.dtype().is_float() {
        return err(format!("{} needs a float input, got {}", node.op, x.dtype()));
    }
    Ok(vec![Tensor::from_f64(x.dtype(), &shape, &y)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("MaxPool", pool),
    ("AveragePool", pool),
    ("LpPool", pool),
    ("GlobalAveragePool", global_pool),
    ("GlobalMaxPool", global_pool),
    ("GlobalLpPool", global_pool),
];
