//! The loss ops ONNX defines (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), so
//! exported training graphs and evaluation heads run too.

use crate::util::{err, ints_of, need_float, opt, req, Result};
use aim_ir::{Node, Tensor};

/// NLL over log-probabilities `x` [N, C, d...] and class indices `target` [N, d...].
fn nll(n: &Node, x: &Tensor, target: &Tensor, weight: Option<&Tensor>) -> Result<Tensor> {
    need_float(x, "input")?;
    let xs = x.shape();
    if xs.len() < 2 || target.rank() != xs.len() - 1 || target.shape()[0] != xs[0] || target.shape()[1..] != xs[2..] {
        return err(format!("input {xs:?} and target {:?} do not fit (N, C, d...) and (N, d...)", target.shape()));
    }
    let (nb, c) = (xs[0], xs[1]);
    let d: usize = xs[2..].iter().product();
    let xv = x.to_f64_vec();
    let t = ints_of(target)?;
    let w = weight.map(|w| w.to_f64_vec());
    if w.as_ref().is_some_and(|w| w.len() != c) {
        return err(format!("weight must hold {c} values"));
    }
    let ignore = n.opt_int("ignore_index");
    let mut loss = vec![0.0; nb * d];
    let mut wsum = 0.0;
    let weighted = w.is_some() || ignore.is_some();
    for i in 0..nb {
        for k in 0..d {
            let cls = t[i * d + k];
            if Some(cls) == ignore {
                continue;
            }
            if cls < 0 || cls as usize >= c {
                return err(format!("target class {cls} is out of range for {c} classes"));
            }
            let wt = w.as_ref().map_or(1.0, |w| w[cls as usize]);
            loss[i * d + k] = -xv[(i * c + cls as usize) * d + k] * wt;
            wsum += wt;
        }
    }
    Ok(match n.string("reduction", "mean") {
        "none" => Tensor::from_f64(x.dtype(), target.shape(), &loss),
        "sum" => Tensor::from_f64(x.dtype(), &[], &[loss.iter().sum()]),
        "mean" => {
            let total: f64 = loss.iter().sum();
            let m = if weighted { total / wsum } else { total / loss.len() as f64 };
            Tensor::from_f64(x.dtype(), &[], &[m])
        }
        r => return err(format!("unknown reduction '{r}'")),
    })
}

fn nll_loss(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    Ok(vec![nll(n, req(ins, 0)?, req(ins, 1)?, opt(ins, 2))?])
}

fn softmax_cross_entropy(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    need_float(x, "scores")?;
    if x.rank() < 2 {
        return err("scores must be at least 2-D (N, C, ...)");
    }
    let (outer, c, inner) = super::norm::lanes(x.shape(), 1);
    let xv = x.to_f64_vec();
    let mut lp = vec![0.0; xv.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * c + k) * inner + i;
            let max = (0..c).map(|k| xv[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let lse = max + (0..c).map(|k| (xv[at(k)] - max).exp()).sum::<f64>().ln();
            for k in 0..c {
                lp[at(k)] = xv[at(k)] - lse;
            }
        }
    }
    let log_prob = Tensor::from_f64(x.dtype(), x.shape(), &lp);
    let loss = nll(n, &log_prob, req(ins, 1)?, opt(ins, 2))?;
    Ok(vec![loss, log_prob])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] =
    &[("NegativeLogLikelihoodLoss", nll_loss), ("SoftmaxCrossEntropyLoss", softmax_cross_entropy)];
