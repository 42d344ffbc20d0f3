//! The plain `RNN` in f32 on the packed GEMMs: `Hₜ = f(Xₜ·Wᵀ + Hₜ₋₁·Rᵀ + Wb + Rb)` with
//! the input projection of every step at once and one small product per step; `f` Tanh,
//! Relu or Sigmoid per direction. Directions, layouts and an initial state as the LSTM's;
//! clipping, other activations and shorter sequence lengths run the reference kernel.
//! Constant weights are packed once, at load.

use super::math;
use super::output::Output;
use super::sequence::{Seq, SharedY};
use super::Ctx;
use crate::gemm::{gemm_rows, Blocking, Epilogue, Isa, PackedB};
use crate::util::Result;
use aim_ir::{DType, Node, Tensor};

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
    if n.attrs.contains_key("clip") {
        return None;
    }
    let q = Seq::parse(n, ins, 1)?;
    let acts = activations(n, q.dirs)?;
    let h0 = q.state(ins, 5)?;
    let (batch, hidden, input) = (q.batch, q.hidden, q.input);
    let packed_now;
    let weights = match packed {
        Some(p) if p.shapes == (q.w.shape().to_vec(), q.r.shape().to_vec()) => p,
        Some(_) => return None,
        None => {
            packed_now = RnnWeights::pack(q.w, q.r, q.bias, cx.isa, cx.blocking)?;
            &packed_now
        }
    };
    let mut y = match Output::new(cx.out, DType::F32, &q.y_shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let mut yh = vec![0f32; q.dirs * batch * hidden];
    let (xd, yd) = (q.x.data::<f32>(), y.bits_mut());
    let rows = q.t_len * batch;
    // Every direction's input projection first (the pool's threads share each product).
    let xps: Vec<Vec<f32>> = weights
        .dirs
        .iter()
        .map(|(pw, _, b)| {
            let mut xp = vec![0f32; rows * hidden];
            let ep = Epilogue { col_bias: Some(b), ..Epilogue::default() };
            let proj_par = super::sequence::parallel_for(rows * input * hidden, cx.par);
            gemm_rows(xd, rows, input, cx.blocking, pw, &mut xp, hidden, &ep, proj_par);
            xp
        })
        .collect();
    // Then the recurrences (two directions side by side where a step is small).
    let y_out = SharedY::new(yd);
    let dirs = (weights.dirs.iter().zip(&xps).zip(&acts).enumerate())
        .map(|(d, (((_, pr, _), xp), &act))| Direction {
            pr,
            xp,
            act,
            q: &q,
            d,
            blocking: cx.blocking,
            y: y_out,
            h: q.initial(h0, d),
            g: vec![0f32; batch * hidden],
            xt: vec![0f32; batch * hidden],
        })
        .collect();
    let finals = super::sequence::by_direction(dirs, q.t_len, batch * hidden * hidden, cx.par);
    for (d, Direction { h, .. }) in finals.iter().enumerate() {
        for bi in 0..batch {
            let at = q.state_at(bi, d);
            yh[at..at + hidden].copy_from_slice(&h[bi * hidden..(bi + 1) * hidden]);
        }
    }
    let mut outs = vec![y.finish()];
    if n.outputs.len() > 1 {
        outs.push(Tensor::from_vec(&q.state_shape(), yh));
    }
    Some(Ok(outs))
}

/// The recurrence of one direction: `h` (batch × hidden) updated step by step, each step's
/// state written to `y`; it holds its state and a step's scratch, so that
/// [`by_direction`](super::sequence::by_direction) can advance it a few steps at a time on
/// whichever thread is free.
struct Direction<'a> {
    /// R, packed.
    pr: &'a PackedB,
    /// The input projections (rows in X's order, h each).
    xp: &'a [f32],
    act: Act,
    q: &'a Seq<'a>,
    d: usize,
    blocking: Blocking,
    y: SharedY,
    h: Vec<f32>,
    g: Vec<f32>,
    xt: Vec<f32>,
}

impl super::sequence::Recurrence for Direction<'_> {
    fn run(&mut self, steps: std::ops::Range<usize>, par: &dyn crate::gemm::Parallel) {
        let q = self.q;
        let (batch, hidden) = (q.batch, q.hidden);
        for s in steps {
            let t = if q.reverse(self.d) { q.t_len - 1 - s } else { s };
            for bi in 0..batch {
                let row = q.x_row(t, bi);
                self.xt[bi * hidden..(bi + 1) * hidden].copy_from_slice(&self.xp[row * hidden..(row + 1) * hidden]);
            }
            let ep = Epilogue { residual: Some(&self.xt), ..Epilogue::default() };
            gemm_rows(&self.h, batch, hidden, self.blocking, self.pr, &mut self.g, hidden, &ep, par);
            for (hv, &gv) in self.h.iter_mut().zip(&self.g) {
                *hv = (self.act)(gv);
            }
            for bi in 0..batch {
                // SAFETY: this direction's states alone are written here, Y outlives the run.
                unsafe { self.y.write(q.y_at(t, bi, self.d), &self.h[bi * hidden..(bi + 1) * hidden]) };
            }
        }
    }
}
