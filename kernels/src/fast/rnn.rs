//! The plain `RNN` in f32 on the packed GEMMs: `Hₜ = f(Xₜ·Wᵀ + Hₜ₋₁·Rᵀ + Wb + Rb)` with
//! the input projection of every step at once and one small product per step; `f` Tanh,
//! Relu or Sigmoid per direction. Directions, layouts and an initial state as the LSTM's;
//! clipping, other activations and shorter sequence lengths run the reference kernel.
//! Constant weights are packed once, at load.

use super::math;
use super::output::Output;
use super::Ctx;
use crate::gemm::{gemm_rows, Blocking, Epilogue, Isa, PackedB, Parallel, Sequential};
use crate::util::Result;
use aim_ir::{DType, Node, Tensor};

/// The multiply-adds of a product (a step's, or a short sequence's input projection)
/// below which it runs on the calling thread: waking the others costs more.
const STEP_PARALLEL_MACS: usize = 1 << 20;

/// An RNN's weights packed for the microkernels, per direction: `Wᵀ`, `Rᵀ` and `Wb + Rb`.
pub struct RnnWeights {
    dirs: Vec<(PackedB, PackedB, Vec<f32>)>,
    shapes: (Vec<usize>, Vec<usize>),
}

impl RnnWeights {
    /// Packs W `[dirs, h, input]`, R `[dirs, h, h]` and B `[dirs, 2h]` (if given) of f32;
    /// None for other types or shapes.
    pub fn pack(w: &Tensor, r: &Tensor, b: Option<&Tensor>, isa: Isa, blocking: Blocking) -> Option<RnnWeights> {
        let f32s = [Some(w), Some(r), b].into_iter().flatten().all(|t| t.dtype() == DType::F32);
        if !f32s || w.rank() != 3 || r.rank() != 3 {
            return None;
        }
        let (dirs, hidden, input) = (w.shape()[0], w.shape()[1], w.shape()[2]);
        if r.shape() != [dirs, hidden, hidden] || b.is_some_and(|b| b.shape() != [dirs, 2 * hidden]) {
            return None;
        }
        let (wd, rd) = (w.data::<f32>(), r.data::<f32>());
        let dirs = (0..dirs)
            .map(|d| {
                let pw = PackedB::from_slice(
                    isa,
                    blocking,
                    &wd[d * hidden * input..(d + 1) * hidden * input],
                    input,
                    hidden,
                    true,
                );
                let pr = PackedB::from_slice(
                    isa,
                    blocking,
                    &rd[d * hidden * hidden..(d + 1) * hidden * hidden],
                    hidden,
                    hidden,
                    true,
                );
                let bias = b.map_or(vec![0.0; hidden], |bt| {
                    let bv = &bt.data::<f32>()[d * 2 * hidden..(d + 1) * 2 * hidden];
                    (0..hidden).map(|j| bv[j] + bv[hidden + j]).collect()
                });
                (pw, pr, bias)
            })
            .collect();
        Some(RnnWeights { dirs, shapes: (w.shape().to_vec(), r.shape().to_vec()) })
    }
}

/// An activation applied per element.
type Act = fn(f32) -> f32;

/// The activation of each direction, if all are ones this kernel computes.
fn activations(n: &Node, dirs: usize) -> Option<Vec<Act>> {
    let pick = |a: &str| -> Option<Act> {
        match a.to_ascii_lowercase().as_str() {
            "tanh" => Some(math::tanh),
            "sigmoid" => Some(math::sigmoid),
            "relu" => Some(|v: f32| v.max(0.0)),
            _ => None,
        }
    };
    match n.strings("activations") {
        None => Some(vec![math::tanh as Act; dirs]),
        Some(a) if a.len() == dirs => a.iter().map(|s| pick(s)).collect(),
        Some(_) => None,
    }
}

/// RNN with weights packed at load.
pub(super) fn rnn_packed(
    n: &Node,
    ins: &[Option<Tensor>],
    cx: &Ctx,
    weights: &RnnWeights,
) -> Option<Result<Vec<Tensor>>> {
    run(n, ins, cx, Some(weights))
}

pub(super) fn rnn(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    run(n, ins, cx, None)
}

fn run(n: &Node, ins: &[Option<Tensor>], cx: &Ctx, packed: Option<&RnnWeights>) -> Option<Result<Vec<Tensor>>> {
    let f32_at = |i: usize| ins.get(i).and_then(|t| t.as_ref()).filter(|t| t.dtype() == DType::F32);
    let (x, w, r) = (f32_at(0)?, f32_at(1)?, f32_at(2)?);
    if n.attrs.contains_key("clip") || x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
        return None;
    }
    let batch_first = n.int("layout", 0) != 0;
    let (t_len, batch, input) = if batch_first {
        (x.shape()[1], x.shape()[0], x.shape()[2])
    } else {
        (x.shape()[0], x.shape()[1], x.shape()[2])
    };
    let (dirs, hidden) = (w.shape()[0], w.shape()[1]);
    let direction = n.string("direction", "forward");
    let fits = (direction == "bidirectional") == (dirs == 2)
        && w.shape()[2] == input
        && r.shape() == [dirs, hidden, hidden]
        && n.opt_int("hidden_size").is_none_or(|h| h as usize == hidden);
    let acts = activations(n, dirs)?;
    if !fits {
        return None;
    }
    if let Some(lens) = ins.get(4).and_then(|t| t.as_ref()) {
        if lens.len() != batch || lens.to_i64_vec().iter().any(|&l| l != t_len as i64) {
            return None;
        }
    }
    let bias = f32_at(3).filter(|b| b.shape() == [dirs, 2 * hidden]);
    if ins.get(3).is_some_and(|b| b.is_some()) && bias.is_none() {
        return None;
    }
    let h0 = match ins.get(5).and_then(|t| t.as_ref()) {
        None => None,
        Some(t) if t.dtype() == DType::F32 && t.shape() == [dirs, batch, hidden] => Some(t),
        Some(_) => return None,
    };
    let packed_now;
    let weights = match packed {
        Some(p) if p.shapes == (w.shape().to_vec(), r.shape().to_vec()) => p,
        Some(_) => return None,
        None => {
            packed_now = RnnWeights::pack(w, r, bias, cx.isa, cx.blocking)?;
            &packed_now
        }
    };
    let y_shape = if batch_first { vec![batch, t_len, dirs, hidden] } else { vec![t_len, dirs, batch, hidden] };
    let mut y = match Output::new(cx.out, DType::F32, &y_shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let mut yh = vec![0f32; dirs * batch * hidden];
    let (xd, yd) = (x.data::<f32>(), y.bits_mut());
    let rows = t_len * batch;
    let par: &dyn Parallel = if batch * hidden * hidden < STEP_PARALLEL_MACS { &Sequential } else { cx.par };
    for (d, (pw, pr, b)) in weights.dirs.iter().enumerate() {
        let mut xp = vec![0f32; rows * hidden];
        let ep = Epilogue { col_bias: Some(b), ..Epilogue::default() };
        let proj_par: &dyn Parallel = if rows * input * hidden < STEP_PARALLEL_MACS { &Sequential } else { cx.par };
        gemm_rows(xd, rows, input, cx.blocking, pw, &mut xp, hidden, &ep, proj_par);
        let mut h: Vec<f32> = h0.map_or(vec![0.0; batch * hidden], |t| {
            t.data::<f32>()[d * batch * hidden..(d + 1) * batch * hidden].to_vec()
        });
        let reverse = direction == "reverse" || d == 1;
        let (mut g, mut xt) = (vec![0f32; batch * hidden], vec![0f32; batch * hidden]);
        for s in 0..t_len {
            let t = if reverse { t_len - 1 - s } else { s };
            for bi in 0..batch {
                let row = if batch_first { bi * t_len + t } else { t * batch + bi };
                xt[bi * hidden..(bi + 1) * hidden].copy_from_slice(&xp[row * hidden..(row + 1) * hidden]);
            }
            let ep = Epilogue { residual: Some(&xt), ..Epilogue::default() };
            gemm_rows(&h, batch, hidden, cx.blocking, pr, &mut g, hidden, &ep, par);
            for (hv, &gv) in h.iter_mut().zip(&g) {
                *hv = acts[d](gv);
            }
            for bi in 0..batch {
                let at = if batch_first {
                    ((bi * t_len + t) * dirs + d) * hidden
                } else {
                    ((t * dirs + d) * batch + bi) * hidden
                };
                yd[at..at + hidden].copy_from_slice(&h[bi * hidden..(bi + 1) * hidden]);
            }
        }
        for bi in 0..batch {
            let at = if batch_first { (bi * dirs + d) * hidden } else { (d * batch + bi) * hidden };
            yh[at..at + hidden].copy_from_slice(&h[bi * hidden..(bi + 1) * hidden]);
        }
    }
    let state_shape = if batch_first { vec![batch, dirs, hidden] } else { vec![dirs, batch, hidden] };
    let mut outs = vec![y.finish()];
    if n.outputs.len() > 1 {
        outs.push(Tensor::from_vec(&state_shape, yh));
    }
    Some(Ok(outs))
}
