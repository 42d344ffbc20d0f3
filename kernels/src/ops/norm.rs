//! Normalisations (batch, instance, layer, group, RMS, Lp, mean-variance, LRN) and the
//! softmax family. All compute in f64.

use crate::util::{axis, broadcast_offsets, err, need_float, opt, req, Result};
use aim_ir::{Node, Tensor};

/// Splits `shape` around `ax` into (outer, len, inner) element counts.
pub fn lanes(shape: &[usize], ax: usize) -> (usize, usize, usize) {
    (shape[..ax].iter().product(), shape[ax], shape[ax + 1..].iter().product())
}

fn per_channel(t: &Tensor, c: usize, what: &str) -> Result<Vec<f64>> {
    if t.len() != c {
        return err(format!("{what} has {} values for {c} channels", t.len()));
    }
    Ok(t.to_f64_vec())
}

fn batch_norm(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_float(x, "X")?;
    if x.rank() < 2 {
        return err(format!("BatchNormalization needs rank ≥ 2, got {:?}", x.shape()));
    }
    let c = x.shape()[1];
    let scale = per_channel(req(ins, 1)?, c, "scale")?;
    let bias = per_channel(req(ins, 2)?, c, "B")?;
    let mut mean = per_channel(req(ins, 3)?, c, "mean")?;
    let mut var = per_channel(req(ins, 4)?, c, "var")?;
    let eps = n.float_attr("epsilon") as f64;
    let (outer, _, inner) = lanes(x.shape(), 1);
    let xd = x.to_f64_vec();
    let training = n.int("training_mode", 0) != 0;
    let (run_mean, run_var) = (mean.clone(), var.clone());
    if training {
        let cnt = (outer * inner) as f64;
        for ci in 0..c {
            let vals = (0..outer).flat_map(|o| xd[(o * c + ci) * inner..(o * c + ci + 1) * inner].iter().copied());
            let m = vals.clone().sum::<f64>() / cnt;
            mean[ci] = m;
            var[ci] = vals.map(|v| (v - m) * (v - m)).sum::<f64>() / cnt;
        }
    }
    let mut y = vec![0.0; xd.len()];
    for o in 0..outer {
        for ci in 0..c {
            let k = scale[ci] / (var[ci] + eps).sqrt();
            for i in 0..inner {
                let at = (o * c + ci) * inner + i;
                y[at] = (xd[at] - mean[ci]) * k + bias[ci];
            }
        }
    }
    let mut outs = vec![Tensor::from_f64(x.dtype(), x.shape(), &y)];
    if training {
        let mom = n.float("momentum", 0.9) as f64;
        let rm: Vec<f64> = run_mean.iter().zip(&mean).map(|(r, m)| r * mom + m * (1.0 - mom)).collect();
        let rv: Vec<f64> = run_var.iter().zip(&var).map(|(r, v)| r * mom + v * (1.0 - mom)).collect();
        let dt = req(ins, 3)?.dtype();
        outs.push(Tensor::from_f64(dt, &[c], &rm));
        outs.push(Tensor::from_f64(dt, &[c], &rv));
    }
    Ok(outs)
}

/// Normalises each group of `group` consecutive elements: (x - mean) / sqrt(var + eps).
fn normalize_groups(xd: &[f64], group: usize, eps: f64, rms: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; xd.len()];
    let (mut means, mut inv_stds) = (Vec::new(), Vec::new());
    for (gi, chunk) in xd.chunks(group.max(1)).enumerate() {
        let m = if rms { 0.0 } else { chunk.iter().sum::<f64>() / group as f64 };
        let v = chunk.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / group as f64;
        let inv = 1.0 / (v + eps).sqrt();
        for (j, &x) in chunk.iter().enumerate() {
            y[gi * group + j] = (x - m) * inv;
        }
        means.push(m);
        inv_stds.push(inv);
    }
    (y, means, inv_stds)
}

/// Requires rank ≥ `min` (normalisations index the channel dim).
fn need_rank(x: &Tensor, min: usize, op: &str) -> Result<()> {
    if x.rank() < min {
        return err(format!("{op} needs an input of rank ≥ {min}, got {:?}", x.shape()));
    }
    Ok(())
}

fn instance_norm(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_float(x, "X")?;
    need_rank(x, 2, "InstanceNormalization")?;
    let c = x.shape()[1];
    let scale = per_channel(req(ins, 1)?, c, "scale")?;
    let bias = per_channel(req(ins, 2)?, c, "B")?;
    let inner: usize = x.shape()[2..].iter().product();
    let (mut y, _, _) = normalize_groups(&x.to_f64_vec(), inner, n.float_attr("epsilon") as f64, false);
    for (i, v) in y.iter_mut().enumerate() {
        let ci = (i / inner.max(1)) % c;
        *v = *v * scale[ci] + bias[ci];
    }
    Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &y)])
}

fn group_norm(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_float(x, "X")?;
    need_rank(x, 2, "GroupNormalization")?;
    let c = x.shape()[1];
    let groups = n.int("num_groups", 1).max(1) as usize;
    if c % groups != 0 {
        return err(format!("{c} channels do not split into {groups} groups"));
    }
    let (scale, bias) = (req(ins, 1)?.to_f64_vec(), req(ins, 2)?.to_f64_vec());
    if (scale.len() != c && scale.len() != groups) || bias.len() != scale.len() {
        return err(format!("scale and bias must hold {c} (per channel) or {groups} (per group) values"));
    }
    let inner: usize = x.shape()[2..].iter().product();
    let gsize = c / groups * inner;
    let (mut y, _, _) = normalize_groups(&x.to_f64_vec(), gsize, n.float_attr("epsilon") as f64, false);
    for (i, v) in y.iter_mut().enumerate() {
        let ci = (i / inner.max(1)) % c;
        // Opset 18 had one scale per group, opset 21 one per channel.
        let k = if scale.len() == c { ci } else { ci / (c / groups) };
        *v = *v * scale[k] + bias[k];
    }
    Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &y)])
}

fn layer_norm(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_float(x, "X")?;
    let rms = n.op == "RMSNormalization";
    let ax = axis(n.int("axis", -1), x.rank())?;
    let group: usize = x.shape()[ax..].iter().product();
    let norm_shape = &x.shape()[ax..];
    let (mut y, means, invs) = normalize_groups(&x.to_f64_vec(), group, n.float_attr("epsilon") as f64, rms);
    let scale = req(ins, 1)?;
    for t in [Some(scale), if rms { None } else { opt(ins, 2) }].into_iter().flatten() {
        if crate::util::broadcast_shapes(&[t.shape(), norm_shape])? != norm_shape {
            return err(format!(
                "scale/bias of shape {:?} do not broadcast to the normalised shape {norm_shape:?}",
                t.shape()
            ));
        }
    }
    let sc_offs = broadcast_offsets(scale.shape(), norm_shape)?;
    let sc = scale.to_f64_vec();
    let bias = if rms { None } else { opt(ins, 2) };
    let (bo, bd) = match bias {
        Some(b) => (broadcast_offsets(b.shape(), norm_shape)?, b.to_f64_vec()),
        None => (vec![], vec![]),
    };
    for (i, v) in y.iter_mut().enumerate() {
        let j = i % group.max(1);
        *v *= sc[sc_offs[j]];
        if !bd.is_empty() {
            *v += bd[bo[j]];
        }
    }
    let mut stat_shape = x.shape()[..ax].to_vec();
    stat_shape.resize(x.rank(), 1);
    let stash = if n.int("stash_type", 1) == 1 { aim_ir::DType::F32 } else { x.dtype() };
    let (means, invs) = if group == 0 {
        // Empty groups: the statistics are undefined (0/0), as numpy would say.
        let outer: usize = x.shape()[..ax].iter().product();
        (vec![f64::NAN; outer], vec![f64::NAN; outer])
    } else {
        (means, invs)
    };
    let mut outs = vec![Tensor::from_f64(x.dtype(), x.shape(), &y)];
    if !rms {
        outs.push(Tensor::from_f64(stash, &stat_shape, &means));
        outs.push(Tensor::from_f64(stash, &stat_shape, &invs));
    }
    Ok(outs)
}

fn lp_norm(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let ax = axis(n.int("axis", -1), x.rank())?;
    let p = n.int("p", 2);
    let (outer, len, inner) = lanes(x.shape(), ax);
    let xd = x.to_f64_vec();
    let mut y = xd.clone();
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * len + k) * inner + i;
            let norm = if p == 1 {
                (0..len).map(|k| xd[at(k)].abs()).sum::<f64>()
            } else {
                (0..len).map(|k| xd[at(k)] * xd[at(k)]).sum::<f64>().sqrt()
            };
            for k in 0..len {
                y[at(k)] = if norm == 0.0 { 0.0 } else { xd[at(k)] / norm };
            }
        }
    }
    Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &y)])
}

fn mvn(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&v| axis(v, x.rank())).collect::<Result<_>>()?,
        None => vec![0, 2, 3].into_iter().filter(|&a| a < x.rank()).collect(),
    };
    let rest: Vec<usize> = (0..x.rank()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = rest.iter().chain(&axes).copied().collect();
    let xt = crate::util::transpose(x, &perm)?;
    let group: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let xd = xt.to_f64_vec();
    let mut y = vec![0.0; xd.len()];
    for (gi, chunk) in xd.chunks(group.max(1)).enumerate() {
        let m = chunk.iter().sum::<f64>() / group as f64;
        let v = chunk.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / group as f64;
        for (j, &a) in chunk.iter().enumerate() {
            y[gi * group + j] = (a - m) / (v.sqrt() + 1e-9);
        }
    }
    let yt = Tensor::from_f64(x.dtype(), xt.shape(), &y);
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    Ok(vec![crate::util::transpose(&yt, &inv)?])
}

fn lrn(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_rank(x, 2, "LRN")?;
    let size = n.int("size", 1).max(1) as usize;
    let (alpha, beta, bias) = (n.float_attr("alpha") as f64, n.float_attr("beta") as f64, n.float_attr("bias") as f64);
    let (outer, c, inner) = lanes(x.shape(), 1);
    let xd = x.to_f64_vec();
    let mut y = vec![0.0; xd.len()];
    let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
    for o in 0..outer {
        for ci in 0..c {
            for i in 0..inner {
                let from = ci.saturating_sub(lo);
                let to = (ci + hi).min(c - 1);
                let sq: f64 = (from..=to).map(|k| xd[(o * c + k) * inner + i].powi(2)).sum();
                let at = (o * c + ci) * inner + i;
                y[at] = xd[at] / (bias + alpha / size as f64 * sq).powf(beta);
            }
        }
    }
    Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &y)])
}

fn softmax(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_float(x, "the input")?;
    if x.rank() == 0 {
        return err("softmax needs rank ≥ 1");
    }
    let ax = axis(n.int("axis", -1), x.rank())?;
    let (outer, len, inner) = lanes(x.shape(), ax);
    let xd = x.to_f64_vec();
    let mut y = vec![0.0; xd.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * len + k) * inner + i;
            let max = (0..len).map(|k| xd[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            match n.op.as_str() {
                "Hardmax" => {
                    let first = (0..len).find(|&k| xd[at(k)] == max);
                    for k in 0..len {
                        y[at(k)] = if Some(k) == first { 1.0 } else { 0.0 };
                    }
                }
                op => {
                    let sum: f64 = (0..len).map(|k| (xd[at(k)] - max).exp()).sum();
                    for k in 0..len {
                        let z = xd[at(k)] - max;
                        y[at(k)] = if op == "LogSoftmax" { z - sum.ln() } else { z.exp() / sum };
                    }
                }
            }
        }
    }
    Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &y)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("BatchNormalization", batch_norm),
    ("InstanceNormalization", instance_norm),
    ("GroupNormalization", group_norm),
    ("LayerNormalization", layer_norm),
    ("RMSNormalization", layer_norm),
    ("LpNormalization", lp_norm),
    ("MeanVarianceNormalization", mvn),
    ("LRN", lrn),
    ("Softmax", softmax),
    ("LogSoftmax", softmax),
    ("Hardmax", softmax),
];
