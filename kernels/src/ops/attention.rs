//! Attention (opset 23+): scaled dot-product attention over 3-D (heads packed in the
//! hidden dim) or 4-D inputs, with grouped key/value heads, a past key/value cache, a
//! boolean or additive mask, causal and sliding-window masking, soft-capping and the
//! optional QK output. Follows the ONNX reference: fully masked rows give zeros.

use crate::util::{broadcast_offsets, err, need_float, opt, req, Result};
use aim_ir::{DType, Node, Tensor};

/// A 4-D view [batch, heads, seq, head_dim] of f64 values.
struct Heads {
    v: Vec<f64>,
    b: usize,
    h: usize,
    s: usize,
    d: usize,
}

impl Heads {
    fn at(&self, b: usize, h: usize, s: usize, d: usize) -> f64 {
        self.v[((b * self.h + h) * self.s + s) * self.d + d]
    }

    /// From a 4-D tensor, or a 3-D one with `heads` packed in the last dim.
    fn from(t: &Tensor, heads: Option<usize>, what: &str) -> Result<Heads> {
        let x = t.to_f64_vec();
        match (t.shape(), heads) {
            (&[b, h, s, d], _) => Ok(Heads { v: x, b, h, s, d }),
            (&[b, s, hidden], Some(h)) if h > 0 && hidden % h == 0 => {
                let d = hidden / h;
                let mut v = vec![0.0; x.len()];
                for bi in 0..b {
                    for si in 0..s {
                        for hi in 0..h {
                            for di in 0..d {
                                v[((bi * h + hi) * s + si) * d + di] = x[(bi * s + si) * hidden + hi * d + di];
                            }
                        }
                    }
                }
                Ok(Heads { v, b, h, s, d })
            }
            (&[_, _, _], _) => err(format!("3-D {what} needs q_num_heads/kv_num_heads that divide its hidden size")),
            (s, _) => err(format!("{what} must be 3-D or 4-D, got {s:?}")),
        }
    }

    /// Concatenates `past` (if any) before `self` along the sequence axis.
    fn after(self, past: Option<Heads>) -> Result<Heads> {
        let Some(p) = past else { return Ok(self) };
        if p.b != self.b || p.h != self.h || p.d != self.d {
            return err("the past cache does not match the new keys/values");
        }
        let s = p.s + self.s;
        let mut v = Vec::with_capacity(self.b * self.h * s * self.d);
        for bh in 0..self.b * self.h {
            v.extend_from_slice(&p.v[bh * p.s * p.d..(bh + 1) * p.s * p.d]);
            v.extend_from_slice(&self.v[bh * self.s * self.d..(bh + 1) * self.s * self.d]);
        }
        Ok(Heads { v, b: self.b, h: self.h, s, d: self.d })
    }
}

fn attention(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (q0, k0, v0) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    need_float(q0, "Q")?;
    let dt = q0.dtype();
    let three_d = q0.rank() == 3;
    let qh = n.opt_int("q_num_heads").map(|v| v as usize);
    let kvh = n.opt_int("kv_num_heads").map(|v| v as usize);
    let q = Heads::from(q0, qh, "Q")?;
    let past_k = opt(ins, 4).map(|t| Heads::from(t, None, "past_key")).transpose()?;
    let past_v = opt(ins, 5).map(|t| Heads::from(t, None, "past_value")).transpose()?;
    let past_len = past_k.as_ref().map_or(0, |p| p.s);
    let k = Heads::from(k0, kvh, "K")?.after(past_k)?;
    let v = Heads::from(v0, kvh, "V")?.after(past_v)?;
    if k.b != q.b || v.b != q.b || k.d != q.d || v.s != k.s || v.h != k.h || k.h == 0 || q.h % k.h != 0 {
        return err(format!(
            "Q [{}, {} heads, {}, {}], K [{}, {} heads, {}, {}] and V [{}, {} heads, {}, {}] do not fit together",
            q.b, q.h, q.s, q.d, k.b, k.h, k.s, k.d, v.b, v.h, v.s, v.d
        ));
    }
    let (b, hq, sq, skv, dv) = (q.b, q.h, q.s, k.s, v.d);
    let group = hq / k.h;
    let scale = match n.attrs.get("scale") {
        Some(_) => n.float("scale", 1.0) as f64,
        None => 1.0 / (q.d as f64).sqrt(),
    };
    let softcap = n.float("softcap", 0.0) as f64;
    let causal = n.int("is_causal", 0) != 0;
    let (left, right) = (n.int("left_window_size", -1), n.int("right_window_size", -1));
    let mode = n.int("qk_matmul_output_mode", 0);
    let nonpad: Option<Vec<i64>> = opt(ins, 6).map(|t| t.to_i64_vec());
    if nonpad.as_ref().is_some_and(|np| np.len() != b) {
        return err("nonpad_kv_seqlen must hold one length per batch");
    }
    // The additive mask, padded on the key axis to the total length and broadcast.
    let full = [b, hq, sq, skv];
    let mask: Option<(Vec<f64>, Vec<usize>)> = match opt(ins, 3) {
        None => None,
        Some(m) => {
            let ms = m.shape();
            if ms.is_empty() || ms[ms.len() - 1] > skv {
                return err(format!("attn_mask of shape {ms:?} does not fit {skv} keys"));
            }
            let last = ms[ms.len() - 1];
            let vals = m.to_f64_vec();
            let is_bool = m.dtype() == DType::Bool;
            let rows = vals.len() / last.max(1);
            let mut padded = Vec::with_capacity(rows * skv);
            for r in 0..rows {
                for j in 0..skv {
                    padded.push(if j < last {
                        let x = vals[r * last + j];
                        if is_bool {
                            if x != 0.0 {
                                0.0
                            } else {
                                f64::NEG_INFINITY
                            }
                        } else {
                            x
                        }
                    } else {
                        f64::NEG_INFINITY
                    });
                }
            }
            let mut pshape = ms.to_vec();
            *pshape.last_mut().unwrap() = skv;
            let offs = broadcast_offsets(&pshape, &full)?;
            if crate::util::broadcast_shapes(&[&pshape, &full])? != full {
                return err(format!("attn_mask of shape {ms:?} does not broadcast to {full:?}"));
            }
            Some((padded, offs))
        }
    };
    let mut y = vec![0.0; b * hq * sq * dv];
    let mut qk_out = vec![0.0; b * hq * sq * skv];
    let mut row = vec![0.0; skv];
    let mut bias_row = vec![0.0; skv];
    for bi in 0..b {
        let offset = match (&nonpad, past_len) {
            (Some(np), 0) => np[bi] - sq as i64,
            _ => past_len as i64,
        };
        for h in 0..hq {
            let kh = h / group;
            for i in 0..sq {
                let flat = ((bi * hq + h) * sq + i) * skv;
                for j in 0..skv {
                    let mut bias = match &mask {
                        Some((m, offs)) => m[offs[flat + j]],
                        None => 0.0,
                    };
                    let diff = i as i64 + offset - j as i64;
                    if causal && diff < 0 {
                        bias = f64::NEG_INFINITY;
                    }
                    if (left >= 0 && diff > left) || (right >= 0 && -diff > right) {
                        bias = f64::NEG_INFINITY;
                    }
                    if let Some(np) = &nonpad {
                        if j as i64 >= np[bi] {
                            bias = f64::NEG_INFINITY;
                        }
                    }
                    let mut s = 0.0;
                    for d in 0..q.d {
                        s += q.at(bi, h, i, d) * k.at(bi, kh, j, d);
                    }
                    s *= scale;
                    if softcap > 0.0 {
                        s = softcap * (s / softcap).tanh();
                    }
                    row[j] = s;
                    bias_row[j] = bias;
                }
                let with_bias: Vec<f64> = row.iter().zip(&bias_row).map(|(a, b)| a + b).collect();
                let all_masked = bias_row.iter().all(|x| *x == f64::NEG_INFINITY);
                let max = with_bias.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let safe = if max == f64::NEG_INFINITY { 0.0 } else { max };
                let e: Vec<f64> = with_bias.iter().map(|x| (x - safe).exp()).collect();
                let sum: f64 = e.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                let p: Vec<f64> = e.iter().map(|x| if all_masked { 0.0 } else { x / sum }).collect();
                for j in 0..skv {
                    qk_out[flat + j] = match mode {
                        2 => with_bias[j],
                        3 => p[j],
                        _ => row[j],
                    };
                }
                for d in 0..dv {
                    let acc: f64 = p.iter().enumerate().take(skv).map(|(j, &pj)| pj * v.at(bi, kh, j, d)).sum();
                    y[((bi * hq + h) * sq + i) * dv + d] = acc;
                }
            }
        }
    }
    let y = if three_d {
        let mut t = vec![0.0; y.len()];
        for bi in 0..b {
            for h in 0..hq {
                for i in 0..sq {
                    for d in 0..dv {
                        t[((bi * sq + i) * hq + h) * dv + d] = y[((bi * hq + h) * sq + i) * dv + d];
                    }
                }
            }
        }
        Tensor::from_f64(dt, &[b, sq, hq * dv], &t)
    } else {
        Tensor::from_f64(dt, &[b, hq, sq, dv], &y)
    };
    Ok(vec![
        y,
        Tensor::from_f64(k0.dtype(), &[k.b, k.h, k.s, k.d], &k.v),
        Tensor::from_f64(v0.dtype(), &[v.b, v.h, v.s, v.d], &v.v),
        Tensor::from_f64(dt, &full, &qk_out),
    ])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[("Attention", attention)];
