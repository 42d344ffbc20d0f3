//! LSTM in f32 on the packed GEMMs: the input projection of every time step at once
//! (`X · Wᵀ + Wb + Rb`, one large product), then per step `H · Rᵀ` added to it (a small
//! product on the same microkernels) and the gates as vector loops with the fast sigmoid
//! and tanh. Directions forward, reverse and bidirectional, both layouts, initial states.
//! Configurations it does not take (peepholes, clipping, other activations, coupled input
//! and forget gates, sequence lengths shorter than the sequence) run the reference kernel.
//! Constant weights are packed once, at load ([`LstmWeights`]); others on each run.

use super::math;
use super::output::Output;
use super::sequence::Seq;
use super::Ctx;
#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;
use crate::gemm::{gemm_rows, Epilogue, Isa, PackedB};
use crate::util::Result;
use aim_ir::{DType, Node, Tensor};

/// Whether the node uses the default activations (Sigmoid, Tanh, Tanh).
fn default_activations(n: &Node) -> bool {
    match n.strings("activations") {
        None => true,
        Some(a) => {
            a.len() % 3 == 0
                && a.chunks(3).all(|c| {
                    c[0].eq_ignore_ascii_case("sigmoid")
                        && c[1].eq_ignore_ascii_case("tanh")
                        && c[2].eq_ignore_ascii_case("tanh")
                })
        }
    }
}

/// One step's gates for `batch` rows: `g` holds `[i, o, f, c]` pre-activations per row;
/// updates `c` and `h` in place.
#[inline(always)]
fn gates_generic(g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
    for ((gr, cr), hr) in g.chunks_exact(4 * hidden).zip(c.chunks_exact_mut(hidden)).zip(h.chunks_exact_mut(hidden)) {
        let (gi, rest) = gr.split_at(hidden);
        let (go, rest) = rest.split_at(hidden);
        let (gf, gc) = rest.split_at(hidden);
        for j in 0..hidden {
            let i = math::sigmoid(gi[j]);
            let f = math::sigmoid(gf[j]);
            let cand = math::tanh(gc[j]);
            let cn = f * cr[j] + i * cand;
            cr[j] = cn;
            hr[j] = math::sigmoid(go[j]) * math::tanh(cn);
        }
    }
}

fn gates(isa: Isa, g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
            gates_generic(g, c, h, hidden)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
            gates_generic(g, c, h, hidden)
        }
        // SAFETY: an `Isa` exists only for features this CPU has.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(g, c, h, hidden) },
            IsaKind::Avx2 => return unsafe { v3(g, c, h, hidden) },
            _ => {}
        }
    }
    let _ = isa;
    gates_generic(g, c, h, hidden)
}

/// The fast LSTM, or `None` for the configurations left to the reference kernel.
/// An LSTM's weights packed for the microkernels, per direction: `Wᵀ`, `Rᵀ` and the summed
/// biases `Wb + Rb` — made once at load when W, R and B are constants, so that a run (a
/// speech model's step is ~0.03 ms) does not repack them.
pub struct LstmWeights {
    dirs: Vec<(PackedB, PackedB, Vec<f32>)>,
    /// The shapes packed (W, R), to check each run's inputs against.
    shapes: (Vec<usize>, Vec<usize>),
}

impl LstmWeights {
    /// Packs W `[dirs, 4h, input]`, R `[dirs, 4h, h]` and B `[dirs, 8h]` (if given) of f32;
    /// None for other types or shapes (the node then packs on each run, or falls back).
    pub fn pack(
        w: &Tensor,
        r: &Tensor,
        b: Option<&Tensor>,
        isa: Isa,
        blocking: crate::gemm::Blocking,
    ) -> Option<LstmWeights> {
        let f32s = [Some(w), Some(r), b].into_iter().flatten().all(|t| t.dtype() == DType::F32);
        if !f32s || w.rank() != 3 || r.rank() != 3 {
            return None;
        }
        let (dirs, g4, input, hidden) = (w.shape()[0], w.shape()[1], w.shape()[2], r.shape()[2]);
        if g4 != 4 * hidden || r.shape() != [dirs, g4, hidden] || b.is_some_and(|b| b.shape() != [dirs, 8 * hidden]) {
            return None;
        }
        let (wd, rd) = (w.data::<f32>(), r.data::<f32>());
        let dirs = (0..dirs)
            .map(|d| {
                let pw = PackedB::from_slice(isa, blocking, &wd[d * g4 * input..(d + 1) * g4 * input], input, g4, true);
                let pr =
                    PackedB::from_slice(isa, blocking, &rd[d * g4 * hidden..(d + 1) * g4 * hidden], hidden, g4, true);
                let bias = match b {
                    Some(bt) => {
                        let bv = &bt.data::<f32>()[d * 8 * hidden..(d + 1) * 8 * hidden];
                        (0..g4).map(|j| bv[j] + bv[g4 + j]).collect()
                    }
                    None => vec![0.0; g4],
                };
                (pw, pr, bias)
            })
            .collect();
        Some(LstmWeights { dirs, shapes: (w.shape().to_vec(), r.shape().to_vec()) })
    }
}

/// The constant weights of a recurrent node packed at load, so that a run does not repack
/// them.
pub enum RecurrentWeights {
    /// An LSTM's.
    Lstm(LstmWeights),
    /// A GRU's.
    Gru(super::GruWeights),
    /// A plain RNN's.
    Rnn(super::RnnWeights),
}

impl RecurrentWeights {
    /// Packs the weights of an `LSTM`, `GRU` or `RNN` node (W, R and B, if given); None for other
    /// ops, types or shapes (the node then packs on each run, or falls back).
    pub fn pack(
        op: &str,
        w: &Tensor,
        r: &Tensor,
        b: Option<&Tensor>,
        isa: Isa,
        blocking: crate::gemm::Blocking,
    ) -> Option<RecurrentWeights> {
        match op {
            "LSTM" => LstmWeights::pack(w, r, b, isa, blocking).map(RecurrentWeights::Lstm),
            "GRU" => super::GruWeights::pack(w, r, b, isa, blocking).map(RecurrentWeights::Gru),
            "RNN" => super::RnnWeights::pack(w, r, b, isa, blocking).map(RecurrentWeights::Rnn),
            _ => None,
        }
    }

    /// Runs node `n` with these weights; None where the fast kernel does not take it.
    pub fn run(&self, n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
        match (self, n.op.as_str()) {
            (RecurrentWeights::Lstm(w), "LSTM") => run(n, ins, cx, Some(w)),
            (RecurrentWeights::Gru(w), "GRU") => super::gru::gru_packed(n, ins, cx, w),
            (RecurrentWeights::Rnn(w), "RNN") => super::rnn::rnn_packed(n, ins, cx, w),
            _ => None,
        }
    }
}

pub(super) fn lstm(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    run(n, ins, cx, None)
}

fn run(n: &Node, ins: &[Option<Tensor>], cx: &Ctx, packed: Option<&LstmWeights>) -> Option<Result<Vec<Tensor>>> {
    let peepholes = ins.get(7).is_some_and(|p| p.is_some());
    if peepholes || n.attrs.contains_key("clip") || n.int("input_forget", 0) != 0 || !default_activations(n) {
        return None;
    }
    let q = Seq::parse(n, ins, 4)?;
    let (h0, c0) = (q.state(ins, 5)?, q.state(ins, 6)?);
    let mut y = match Output::new(cx.out, DType::F32, &q.y_shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let (batch, hidden, input, t_len) = (q.batch, q.hidden, q.input, q.t_len);
    let mut yh = vec![0f32; q.dirs * batch * hidden];
    let mut yc = vec![0f32; q.dirs * batch * hidden];
    let xd = q.x.data::<f32>();
    let yd = y.bits_mut();
    let g4 = 4 * hidden;
    let rows = t_len * batch;
    let packed_now;
    let weights = match packed {
        Some(p) if p.shapes == (q.w.shape().to_vec(), q.r.shape().to_vec()) => p,
        Some(_) => return None,
        None => {
            packed_now = LstmWeights::pack(q.w, q.r, q.bias, cx.isa, cx.blocking)?;
            &packed_now
        }
    };
    for d in 0..q.dirs {
        let (pw, pr, b) = &weights.dirs[d];
        // The input projection of every step: rows in X's own order.
        let mut xp = vec![0f32; rows * g4];
        let ep = Epilogue { col_bias: Some(b), ..Epilogue::default() };
        gemm_rows(
            xd,
            rows,
            input,
            cx.blocking,
            pw,
            &mut xp,
            g4,
            &ep,
            super::sequence::parallel_for(rows * input * g4, cx.par),
        );
        let (mut h, mut c) = (q.initial(h0, d), q.initial(c0, d));
        let step_par = super::sequence::parallel_for(batch * hidden * g4, cx.par);
        let mut g = vec![0f32; batch * g4];
        let mut xt = vec![0f32; batch * g4];
        for s in 0..t_len {
            let t = if q.reverse(d) { t_len - 1 - s } else { s };
            // This step's projections, one row per batch entry.
            for bi in 0..batch {
                let row = q.x_row(t, bi);
                xt[bi * g4..(bi + 1) * g4].copy_from_slice(&xp[row * g4..(row + 1) * g4]);
            }
            let ep = Epilogue { residual: Some(&xt), ..Epilogue::default() };
            gemm_rows(&h, batch, hidden, cx.blocking, pr, &mut g, g4, &ep, step_par);
            gates(cx.isa, &g, &mut c, &mut h, hidden);
            for bi in 0..batch {
                let at = q.y_at(t, bi, d);
                yd[at..at + hidden].copy_from_slice(&h[bi * hidden..(bi + 1) * hidden]);
            }
        }
        for bi in 0..batch {
            let at = q.state_at(bi, d);
            yh[at..at + hidden].copy_from_slice(&h[bi * hidden..(bi + 1) * hidden]);
            yc[at..at + hidden].copy_from_slice(&c[bi * hidden..(bi + 1) * hidden]);
        }
    }
    let mut outs = vec![y.finish()];
    if n.outputs.len() > 1 {
        outs.push(Tensor::from_vec(&q.state_shape(), yh));
    }
    if n.outputs.len() > 2 {
        outs.push(Tensor::from_vec(&q.state_shape(), yc));
    }
    Some(Ok(outs))
}
