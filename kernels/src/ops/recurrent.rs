//! Recurrent layers: RNN, GRU and LSTM (forward, reverse, bidirectional; per-batch
//! sequence lengths; custom activations; clipping; both layouts), as OCR and speech models
//! use them.

use crate::util::{err, need_float, opt, req, Result};
use aim_ir::{Node, Tensor};

type Act = Box<dyn Fn(f64) -> f64>;

fn activation(name: &str, alpha: Option<f32>, beta: Option<f32>) -> Result<Act> {
    let a = |d: f32| alpha.unwrap_or(d) as f64;
    let b = |d: f32| beta.unwrap_or(d) as f64;
    Ok(match name.to_ascii_lowercase().as_str() {
        "sigmoid" => Box::new(|x: f64| 1.0 / (1.0 + (-x).exp())),
        "tanh" => Box::new(f64::tanh),
        "relu" => Box::new(|x: f64| x.max(0.0)),
        "affine" => {
            let (al, be) = (a(1.0), b(0.0));
            Box::new(move |x| al * x + be)
        }
        "leakyrelu" => {
            let al = a(0.01);
            Box::new(move |x| if x >= 0.0 { x } else { al * x })
        }
        "thresholdedrelu" => {
            let al = a(1.0);
            Box::new(move |x| if x > al { x } else { 0.0 })
        }
        "scaledtanh" => {
            let (al, be) = (a(1.0), b(1.0));
            Box::new(move |x| al * (be * x).tanh())
        }
        "hardsigmoid" => {
            let (al, be) = (a(0.2), b(0.5));
            Box::new(move |x| (al * x + be).clamp(0.0, 1.0))
        }
        "elu" => {
            let al = a(1.0);
            Box::new(move |x| if x >= 0.0 { x } else { al * (x.exp() - 1.0) })
        }
        "softsign" => Box::new(|x: f64| x / (1.0 + x.abs())),
        "softplus" => Box::new(|x: f64| x.exp().ln_1p()),
        other => return err(format!("unknown activation '{other}'")),
    })
}

/// The activations of one direction: `count` functions, from the attribute or defaults.
fn activations(n: &Node, dir: usize, defaults: &[&str]) -> Result<Vec<Act>> {
    let k = defaults.len();
    let names = n.strings("activations");
    let alphas = n.floats("activation_alpha");
    let betas = n.floats("activation_beta");
    (0..k)
        .map(|i| {
            let idx = dir * k + i;
            let name = names.and_then(|v| v.get(idx)).map(|s| s.as_str()).unwrap_or(defaults[i]);
            activation(name, alphas.and_then(|v| v.get(idx).copied()), betas.and_then(|v| v.get(idx).copied()))
        })
        .collect()
}

/// y[r] = sum_c m[(row0 + r) * cols + c] * x[c] for `rows` rows.
fn matvec(m: &[f64], row0: usize, rows: usize, cols: usize, x: &[f64], y: &mut [f64]) {
    for r in 0..rows {
        let row = &m[(row0 + r) * cols..(row0 + r + 1) * cols];
        y[r] = row.iter().zip(x).map(|(a, b)| a * b).sum();
    }
}

/// `v` put on the 8-bit grid DynamicQuantizeLinear picks for it and back, in f32 steps as
/// ONNX Runtime computes them: the range widened to hold 0, `scale = range / 255`, the zero
/// point and every value rounded half to even and clamped to 0..=255. An all-zero `v` stays.
fn fake_quantize(v: &[f64]) -> Vec<f64> {
    let lo = v.iter().fold(0f32, |a, &b| a.min(b as f32));
    let hi = v.iter().fold(0f32, |a, &b| a.max(b as f32));
    let scale = ((hi as f64 - lo as f64) as f32) / 255.0;
    if scale == 0.0 {
        return v.to_vec();
    }
    let zp = (0.0 - lo / scale).round_ties_even().clamp(0.0, 255.0);
    let level = |a: f64| {
        let q = ((a as f32 / scale).round_ties_even() + zp).clamp(0.0, 255.0);
        // NaN becomes 0, as the conversion to u8 makes it.
        if q.is_nan() {
            0.0
        } else {
            q
        }
    };
    v.iter().map(|&a| (level(a) - zp) as f64 * scale as f64).collect()
}

fn recurrent(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let kind = n.op.as_str();
    let gates = match kind {
        "RNN" => 1,
        "GRU" => 3,
        _ => 4,
    };
    let x0 = req(ins, 0)?;
    need_float(x0, "X")?;
    let layout = n.int("layout", 0);
    let (w, r) = (req(ins, 1)?, req(ins, 2)?);
    let hidden = n.opt_int("hidden_size").map(|h| h as usize).unwrap_or(r.shape().last().copied().unwrap_or(0));
    if x0.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
        return err("X, W and R must be 3-D");
    }
    let (seq, batch, input) = if layout == 0 {
        (x0.shape()[0], x0.shape()[1], x0.shape()[2])
    } else {
        (x0.shape()[1], x0.shape()[0], x0.shape()[2])
    };
    let dirs = w.shape()[0];
    let direction = n.string("direction", "forward");
    if (direction == "bidirectional") != (dirs == 2)
        || w.shape()[1] != gates * hidden
        || w.shape()[2] != input
        || r.shape()[2] != hidden
    {
        return err(format!(
            "W {:?} / R {:?} do not fit {gates} gates, hidden {hidden}, input {input}, direction {direction}",
            w.shape(),
            r.shape()
        ));
    }
    // DynamicQuantizeLSTM's rounding of X (whole) and of each step's hidden state.
    let quantize = crate::qrecurrent::dynamic_quantize(n);
    if quantize && kind != "LSTM" {
        return err("attribute 'dynamic_quantize' is defined for LSTM only");
    }
    let xv = if quantize { fake_quantize(&x0.to_f64_vec()) } else { x0.to_f64_vec() };
    let x_at = |t: usize, b: usize| -> &[f64] {
        let off = if layout == 0 { (t * batch + b) * input } else { (b * seq + t) * input };
        &xv[off..off + input]
    };
    let (wv, rv) = if quantize {
        let real = |t: &Tensor, which: &str| -> Result<Vec<f64>> {
            let q = crate::qrecurrent::row_quant(n, t, which)?;
            let cols = t.shape()[2].max(1);
            let c = q.centered(t);
            Ok(c.data::<f32>()
                .chunks(cols)
                .zip(&q.scale)
                .flat_map(|(row, &s)| row.iter().map(move |&v| v as f64 * s as f64))
                .collect())
        };
        (real(w, "w")?, real(r, "r")?)
    } else {
        (w.to_f64_vec(), r.to_f64_vec())
    };
    let bias = opt(ins, 3).map(|t| t.to_f64_vec());
    let lens: Vec<usize> = opt(ins, 4)
        .map(|t| t.to_i64_vec().iter().map(|&l| l.clamp(0, seq as i64) as usize).collect())
        .unwrap_or(vec![seq; batch]);
    let h0 = opt(ins, 5).map(|t| t.to_f64_vec());
    let c0 = if kind == "LSTM" { opt(ins, 6).map(|t| t.to_f64_vec()) } else { None };
    let peep = if kind == "LSTM" { opt(ins, 7).map(|t| t.to_f64_vec()) } else { None };
    let clip = n.attrs.get("clip").map(|_| n.float("clip", 0.0) as f64);
    let clamp = |v: f64| match clip {
        Some(c) if c > 0.0 => v.clamp(-c, c),
        _ => v,
    };
    let lbr = n.int("linear_before_reset", 0) != 0;
    let input_forget = n.int("input_forget", 0) != 0;
    let defaults: &[&str] = match kind {
        "RNN" => &["Tanh"],
        "GRU" => &["Sigmoid", "Tanh"],
        _ => &["Sigmoid", "Tanh", "Tanh"],
    };
    let gh = gates * hidden;
    let mut y = vec![0.0; seq * dirs * batch * hidden];
    let mut yh = vec![0.0; dirs * batch * hidden];
    let mut yc = vec![0.0; dirs * batch * hidden];
    for d in 0..dirs {
        let acts = activations(n, d, defaults)?;
        let reverse = direction == "reverse" || d == 1;
        let wd = &wv[d * gh * input..(d + 1) * gh * input];
        let rd = &rv[d * gh * hidden..(d + 1) * gh * hidden];
        let (wb, rb): (Vec<f64>, Vec<f64>) = match &bias {
            Some(bv) => (bv[d * 2 * gh..d * 2 * gh + gh].to_vec(), bv[d * 2 * gh + gh..(d + 1) * 2 * gh].to_vec()),
            None => (vec![0.0; gh], vec![0.0; gh]),
        };
        let state = |s: &Option<Vec<f64>>, b: usize| {
            s.as_ref().map_or(vec![0.0; hidden], |v| v[(d * batch + b) * hidden..(d * batch + b + 1) * hidden].to_vec())
        };
        let mut hs: Vec<Vec<f64>> = (0..batch).map(|b| state(&h0, b)).collect();
        let mut cs: Vec<Vec<f64>> = (0..batch).map(|b| state(&c0, b)).collect();
        let mut xw = vec![0.0; gh];
        let mut hr = vec![0.0; gh];
        for step in 0..seq {
            // The hidden states this step's products read: as they are, or rounded to
            // 8 bits together (every row still running), as DynamicQuantizeLSTM does.
            let running: Vec<usize> = (0..batch).filter(|&b| step < lens[b]).collect();
            let mut reads: Vec<Vec<f64>> = running.iter().map(|&b| hs[b].clone()).collect();
            if quantize {
                let flat: Vec<f64> = reads.concat();
                let rounded = fake_quantize(&flat);
                for (row, q) in reads.iter_mut().zip(rounded.chunks(hidden.max(1))) {
                    row.copy_from_slice(q);
                }
            }
            for (&b, hin) in running.iter().zip(&reads) {
                let (h, c) = (&mut hs[b], &mut cs[b]);
                let len = lens[b];
                let t = if reverse { len - 1 - step } else { step };
                matvec(wd, 0, gh, input, x_at(t, b), &mut xw);
                matvec(rd, 0, gh, hidden, hin, &mut hr);
                let g = |gate: usize, j: usize| {
                    xw[gate * hidden + j] + hr[gate * hidden + j] + wb[gate * hidden + j] + rb[gate * hidden + j]
                };
                match kind {
                    "RNN" => {
                        for (j, hj) in h.iter_mut().enumerate().take(hidden) {
                            *hj = acts[0](clamp(g(0, j)));
                        }
                    }
                    "GRU" => {
                        let z: Vec<f64> = (0..hidden).map(|j| acts[0](clamp(g(0, j)))).collect();
                        let rg: Vec<f64> = (0..hidden).map(|j| acts[0](clamp(g(1, j)))).collect();
                        let cand: Vec<f64> = if lbr {
                            (0..hidden)
                                .map(|j| {
                                    acts[1](clamp(
                                        xw[2 * hidden + j]
                                            + wb[2 * hidden + j]
                                            + rg[j] * (hr[2 * hidden + j] + rb[2 * hidden + j]),
                                    ))
                                })
                                .collect()
                        } else {
                            let rh: Vec<f64> = (0..hidden).map(|j| rg[j] * h[j]).collect();
                            let mut rr = vec![0.0; hidden];
                            matvec(rd, 2 * hidden, hidden, hidden, &rh, &mut rr);
                            (0..hidden)
                                .map(|j| {
                                    acts[1](clamp(xw[2 * hidden + j] + rr[j] + wb[2 * hidden + j] + rb[2 * hidden + j]))
                                })
                                .collect()
                        };
                        for j in 0..hidden {
                            h[j] = (1.0 - z[j]) * cand[j] + z[j] * h[j];
                        }
                    }
                    _ => {
                        let p =
                            |k: usize, j: usize| peep.as_ref().map_or(0.0, |pv| pv[d * 3 * hidden + k * hidden + j]);
                        for j in 0..hidden {
                            let i_g = acts[0](clamp(g(0, j) + p(0, j) * c[j]));
                            let f_g = if input_forget { 1.0 - i_g } else { acts[0](clamp(g(2, j) + p(2, j) * c[j])) };
                            let c_g = acts[1](clamp(g(3, j)));
                            c[j] = f_g * c[j] + i_g * c_g;
                            let o_g = acts[0](clamp(g(1, j) + p(1, j) * c[j]));
                            h[j] = o_g * acts[2](c[j]);
                        }
                    }
                }
                for j in 0..hidden {
                    y[((t * dirs + d) * batch + b) * hidden + j] = h[j];
                }
            }
        }
        for b in 0..batch {
            yh[(d * batch + b) * hidden..(d * batch + b + 1) * hidden].copy_from_slice(&hs[b]);
            yc[(d * batch + b) * hidden..(d * batch + b + 1) * hidden].copy_from_slice(&cs[b]);
        }
    }
    let dt = x0.dtype();
    let (y_t, yh_t, yc_t) = if layout == 0 {
        (
            Tensor::from_f64(dt, &[seq, dirs, batch, hidden], &y),
            Tensor::from_f64(dt, &[dirs, batch, hidden], &yh),
            Tensor::from_f64(dt, &[dirs, batch, hidden], &yc),
        )
    } else {
        let yt = crate::util::transpose(&Tensor::from_f64(dt, &[seq, dirs, batch, hidden], &y), &[2, 0, 1, 3])?;
        let perm = [1, 0, 2];
        (
            yt,
            crate::util::transpose(&Tensor::from_f64(dt, &[dirs, batch, hidden], &yh), &perm)?,
            crate::util::transpose(&Tensor::from_f64(dt, &[dirs, batch, hidden], &yc), &perm)?,
        )
    };
    let mut outs = vec![y_t, yh_t];
    if kind == "LSTM" {
        outs.push(yc_t);
    }
    Ok(outs)
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[("RNN", recurrent), ("GRU", recurrent), ("LSTM", recurrent)];
