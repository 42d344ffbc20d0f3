//! LSTM in f32 on the packed GEMMs: the input projection of every time step at once
//! (`X · Wᵀ + Wb + Rb`, one large product), then per step `H · Rᵀ` added to it (a small
//! product on the same microkernels) and the gates as vector loops with the fast sigmoid
//! and tanh. Directions forward, reverse and bidirectional, both layouts, initial states.
//! Configurations it does not take (peepholes, clipping, other activations, coupled input
//! and forget gates, sequence lengths shorter than the sequence) run the reference kernel.
//! Constant weights are packed once, at load ([`LstmWeights`]); others on each run.

use super::math;
use super::output::Output;
use super::sequence::{Seq, SharedY};
use super::Ctx;
#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;
use crate::gemm::{gemm_rows, Epilogue, Isa, PackedB};
use crate::qgemm::{qgemm, quantize_dynamic, PackedQB, QEpilogue, QuantizedA};
use crate::qrecurrent::{dynamic_quantize, row_quant};
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
fn gates_generic<const FMA: bool>(g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
    let (sigmoid, tanh) = (math::sigmoid_with::<FMA>, math::tanh_with::<FMA>);
    for ((gr, cr), hr) in g.chunks_exact(4 * hidden).zip(c.chunks_exact_mut(hidden)).zip(h.chunks_exact_mut(hidden)) {
        let (gi, rest) = gr.split_at(hidden);
        let (go, rest) = rest.split_at(hidden);
        let (gf, gc) = rest.split_at(hidden);
        for j in 0..hidden {
            let i = sigmoid(gi[j]);
            let f = sigmoid(gf[j]);
            let cand = tanh(gc[j]);
            let cn = f * cr[j] + i * cand;
            cr[j] = cn;
            hr[j] = sigmoid(go[j]) * tanh(cn);
        }
    }
}

fn gates(isa: Isa, g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
            gates_generic::<true>(g, c, h, hidden)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(g: &[f32], c: &mut [f32], h: &mut [f32], hidden: usize) {
            gates_generic::<true>(g, c, h, hidden)
        }
        // SAFETY: an `Isa` exists only for features this CPU has.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(g, c, h, hidden) },
            IsaKind::Avx2 => return unsafe { v3(g, c, h, hidden) },
            _ => {}
        }
    }
    let _ = isa;
    gates_generic::<{ cfg!(target_arch = "aarch64") }>(g, c, h, hidden)
}

/// One direction's W and R packed for the microkernels.
enum Panels {
    /// `Wᵀ`, `Rᵀ` for the f32 GEMM (with `dynamic_quantize`: centered whole numbers).
    F32(PackedB, PackedB),
    /// `Wᵀ`, `Rᵀ` as bytes for the integer GEMM: `dynamic_quantize` where the CPU has
    /// AVX-512 VNNI (a quarter of the bytes per step, and ORT's exact sums).
    Int8(PackedQB, PackedQB),
}

/// An LSTM's weights packed for the microkernels, per direction: W, R and the summed
/// biases `Wb + Rb` — made once at load when W, R and B are constants, so that a run (a
/// speech model's step is ~0.03 ms) does not repack them.
pub struct LstmWeights {
    dirs: Vec<(Panels, Vec<f32>)>,
    /// The shapes packed (W, R), to check each run's inputs against.
    shapes: (Vec<usize>, Vec<usize>),
    /// With `dynamic_quantize`: the scales of W and R per direction and gate row.
    scales: Option<(Vec<f32>, Vec<f32>)>,
}

/// The summed biases `Wb + Rb` of direction `d` (zeros without B).
fn summed_bias(b: Option<&Tensor>, d: usize, hidden: usize) -> Vec<f32> {
    let g4 = 4 * hidden;
    match b {
        Some(bt) => {
            let bv = &bt.data::<f32>()[d * 8 * hidden..(d + 1) * 8 * hidden];
            (0..g4).map(|j| bv[j] + bv[g4 + j]).collect()
        }
        None => vec![0.0; g4],
    }
}

/// Whether W `[dirs, 4h, input]`, R `[dirs, 4h, h]` and B `[dirs, 8h]` fit together.
fn fits(w: &Tensor, r: &Tensor, b: Option<&Tensor>) -> bool {
    if w.rank() != 3 || r.rank() != 3 || b.is_some_and(|b| b.dtype() != DType::F32) {
        return false;
    }
    let (dirs, g4, hidden) = (w.shape()[0], w.shape()[1], r.shape()[2]);
    g4 == 4 * hidden && r.shape() == [dirs, g4, hidden] && b.is_none_or(|b| b.shape() == [dirs, 8 * hidden])
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
        if w.dtype() != DType::F32 || r.dtype() != DType::F32 || !fits(w, r, b) {
            return None;
        }
        let (dirs, g4, input, hidden) = (w.shape()[0], w.shape()[1], w.shape()[2], r.shape()[2]);
        let (wd, rd) = (w.data::<f32>(), r.data::<f32>());
        let dirs = (0..dirs)
            .map(|d| {
                let pw = PackedB::from_slice(isa, blocking, &wd[d * g4 * input..(d + 1) * g4 * input], input, g4, true);
                let pr =
                    PackedB::from_slice(isa, blocking, &rd[d * g4 * hidden..(d + 1) * g4 * hidden], hidden, g4, true);
                (Panels::F32(pw, pr), summed_bias(b, d, hidden))
            })
            .collect();
        Some(LstmWeights { dirs, shapes: (w.shape().to_vec(), r.shape().to_vec()), scales: None })
    }

    /// Packs the weights of the LSTM `n`: as [`LstmWeights::pack`], or with
    /// `dynamic_quantize` its 8-bit W and R as bytes for the integer GEMM (VNNI or AVX2) or
    /// centered (whole numbers in f32) for the f32 one, with their scales; None where
    /// neither applies.
    pub fn pack_node(
        n: &Node,
        w: &Tensor,
        r: &Tensor,
        b: Option<&Tensor>,
        isa: Isa,
        blocking: crate::gemm::Blocking,
    ) -> Option<LstmWeights> {
        if !dynamic_quantize(n) {
            return LstmWeights::pack(w, r, b, isa, blocking);
        }
        if !fits(w, r, b) {
            return None;
        }
        let (qw, qr) = (row_quant(n, w, "w").ok()?, row_quant(n, r, "r").ok()?);
        if !crate::qgemm::integer_kernels(isa) {
            let mut packed = LstmWeights::pack(&qw.centered(w), &qr.centered(r), b, isa, blocking)?;
            packed.scales = Some((qw.scale, qr.scale));
            return Some(packed);
        }
        let (dirs, g4, hidden) = (w.shape()[0], w.shape()[1], r.shape()[2]);
        // One direction's `[4h, k]` bytes as the `[k, 4h]` matrix the integer GEMM packs,
        // with each gate row's zero point as its column's.
        let bytes = |t: &Tensor, q: &crate::qrecurrent::RowQuant, d: usize| -> Option<PackedQB> {
            let k = t.shape()[2];
            let src = &t.bytes()[d * g4 * k..(d + 1) * g4 * k];
            let mut kn = vec![0u8; k * g4];
            for row in 0..g4 {
                for kk in 0..k {
                    kn[kk * g4 + row] = src[row * k + kk];
                }
            }
            PackedQB::for_isa(isa, &kn, t.dtype() == DType::I8, k, g4, &q.zero[d * g4..(d + 1) * g4]).ok()
        };
        let dirs = (0..dirs)
            .map(|d| Some((Panels::Int8(bytes(w, &qw, d)?, bytes(r, &qr, d)?), summed_bias(b, d, hidden))))
            .collect::<Option<Vec<_>>>()?;
        Some(LstmWeights { dirs, shapes: (w.shape().to_vec(), r.shape().to_vec()), scales: Some((qw.scale, qr.scale)) })
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
        n: &Node,
        w: &Tensor,
        r: &Tensor,
        b: Option<&Tensor>,
        isa: Isa,
        blocking: crate::gemm::Blocking,
    ) -> Option<RecurrentWeights> {
        match n.op.as_str() {
            "LSTM" => LstmWeights::pack_node(n, w, r, b, isa, blocking).map(RecurrentWeights::Lstm),
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

/// Direction `d`'s recurrence over the sequence: per step `h · Rᵀ` added to the step's
/// row of the input projection `xp` (with 8-bit weights: h quantized, the exact integer
/// product scaled by h's scale times R's `r_scales`, and the biases `b` added after), the
/// gates, and h written into Y. It holds its state `h`, `c` (batch × hidden) and a step's
/// scratch, so that [`by_direction`](super::sequence::by_direction) can advance it a few
/// steps at a time on whichever thread is free.
struct Direction<'a> {
    q: &'a Seq<'a>,
    d: usize,
    panels: &'a Panels,
    b: &'a [f32],
    /// R's scales per gate column when the weights are 8-bit.
    r_scales: Option<&'a [f32]>,
    /// The input projections (rows in X's order, 4h each).
    xp: &'a [f32],
    kernels: (Isa, crate::gemm::Blocking),
    y: SharedY,
    h: Vec<f32>,
    c: Vec<f32>,
    g: Vec<f32>,
    xt: Vec<f32>,
    h_whole: Vec<f32>,
    h_bytes: Vec<u8>,
    h_sums: Vec<i32>,
    mult: Vec<f32>,
}

impl<'a> Direction<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        q: &'a Seq<'a>,
        d: usize,
        (panels, b): (&'a Panels, &'a [f32]),
        r_scales: Option<&'a [f32]>,
        xp: &'a [f32],
        (h, c): (Vec<f32>, Vec<f32>),
        kernels: (Isa, crate::gemm::Blocking),
        y: SharedY,
    ) -> Self {
        let (batch, hidden) = (q.batch, q.hidden);
        let g4 = 4 * hidden;
        let h_stride = hidden.div_ceil(4) * 4;
        let quantized = r_scales.is_some();
        let int8 = matches!(panels, Panels::Int8(..));
        Direction {
            q,
            d,
            panels,
            b,
            r_scales,
            xp,
            kernels,
            y,
            h,
            c,
            g: vec![0f32; batch * g4],
            xt: vec![0f32; batch * g4],
            h_whole: vec![0f32; if quantized && !int8 { batch * hidden } else { 0 }],
            h_bytes: vec![0u8; if int8 { batch * h_stride } else { 0 }],
            h_sums: vec![0i32; batch],
            mult: vec![0f32; g4],
        }
    }
}

impl super::sequence::Recurrence for Direction<'_> {
    fn run(&mut self, steps: std::ops::Range<usize>, step_par: &dyn crate::gemm::Parallel) {
        let q = self.q;
        let (batch, hidden, t_len) = (q.batch, q.hidden, q.t_len);
        let g4 = 4 * hidden;
        let h_stride = hidden.div_ceil(4) * 4;
        let (isa, blocking) = self.kernels;
        let (h, c, g, xt) = (&mut self.h, &mut self.c, &mut self.g, &mut self.xt);
        for s in steps {
            let t = if q.reverse(self.d) { t_len - 1 - s } else { s };
            // This step's projections, one row per batch entry.
            for bi in 0..batch {
                let row = q.x_row(t, bi);
                xt[bi * g4..(bi + 1) * g4].copy_from_slice(&self.xp[row * g4..(row + 1) * g4]);
            }
            match (self.panels, self.r_scales) {
                (Panels::F32(_, pr), None) => {
                    let ep = Epilogue { residual: Some(xt), ..Epilogue::default() };
                    gemm_rows(h, batch, hidden, blocking, pr, g, g4, &ep, step_par);
                }
                (panels, Some(rs)) => {
                    // h in u8 (one range over the batch), the product of whole numbers
                    // scaled by h's scale times R's, then `x·W + h·R + B` as ORT adds them.
                    match panels {
                        Panels::F32(_, pr) => {
                            let sh = super::quant::centered(isa, h, &mut self.h_whole);
                            let ep = Epilogue::default();
                            gemm_rows(&self.h_whole, batch, hidden, blocking, pr, g, g4, &ep, step_par);
                            self.mult.iter_mut().zip(rs).for_each(|(m, &r)| *m = sh * r);
                            let mult = &self.mult;
                            g.chunks_exact_mut(g4).for_each(|gr| gr.iter_mut().zip(mult).for_each(|(v, &m)| *v *= m));
                        }
                        Panels::Int8(_, pr) => {
                            let seq = &crate::gemm::Sequential;
                            let (sh, zh) =
                                quantize_dynamic(isa, h, hidden, &mut self.h_bytes, h_stride, &mut self.h_sums, seq);
                            self.mult.iter_mut().zip(rs).for_each(|(m, &r)| *m = sh * r);
                            let a = QuantizedA {
                                data: &self.h_bytes,
                                m: batch,
                                stride: h_stride,
                                zero: zh,
                                row_sums: &self.h_sums,
                            };
                            let ep = QEpilogue { scale: &self.mult, bias: None, act: None };
                            qgemm(isa, &a, pr, &ep, g, g4, step_par);
                        }
                    }
                    let b = self.b;
                    for (gr, xr) in g.chunks_exact_mut(g4).zip(xt.chunks_exact(g4)) {
                        for j in 0..g4 {
                            gr[j] = (xr[j] + gr[j]) + b[j];
                        }
                    }
                }
                // The caller pairs 8-bit panels with their scales.
                (Panels::Int8(..), None) => unreachable!("8-bit weights without scales"),
            }
            gates(isa, g, c, h, hidden);
            for bi in 0..batch {
                let at = q.y_at(t, bi, self.d);
                // SAFETY: this direction's states alone are written here, Y outlives the run.
                unsafe { self.y.write(at, &h[bi * hidden..(bi + 1) * hidden]) };
            }
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
    let yd = y.bits_mut();
    let g4 = 4 * hidden;
    let rows = t_len * batch;
    let packed_now;
    let weights = match packed {
        Some(p) if p.shapes == (q.w.shape().to_vec(), q.r.shape().to_vec()) => p,
        Some(_) => return None,
        None => {
            packed_now = LstmWeights::pack_node(n, q.w, q.r, q.bias, cx.isa, cx.blocking)?;
            &packed_now
        }
    };
    let quantized = weights.scales.is_some();
    if quantized != dynamic_quantize(n) {
        return None;
    }
    // X as given; with dynamic_quantize, X in u8 (one range) as bytes for the integer GEMM
    // or less its zero point as whole numbers for the f32 one, and its scale.
    let x = q.x.data::<f32>();
    let int8 = matches!(weights.dirs.first(), Some((Panels::Int8(..), _)));
    let x_stride = input.div_ceil(4) * 4;
    let (mut x_whole, mut x_bytes, mut x_sums) = (Vec::new(), Vec::new(), Vec::new());
    let (x_scale, x_zero) = if !quantized {
        (1.0, 0)
    } else if int8 {
        x_bytes = vec![0u8; rows * x_stride];
        x_sums = vec![0i32; rows];
        quantize_dynamic(cx.isa, x, input, &mut x_bytes, x_stride, &mut x_sums, cx.par)
    } else {
        x_whole = vec![0f32; x.len()];
        (super::quant::centered(cx.isa, x, &mut x_whole), 0)
    };
    // Every direction's input projection first (the pool's threads share each product).
    let mut xps = Vec::with_capacity(q.dirs);
    for (d, (panels, b)) in weights.dirs.iter().enumerate() {
        // This direction's scales per gate column (W's, R's) when the weights are 8-bit.
        let scales = weights.scales.as_ref().map(|(ws, _)| &ws[d * g4..(d + 1) * g4]);
        // The input projection of every step: rows in X's own order. With 8-bit weights
        // the sums are of whole numbers, scaled by X's scale times W's; the biases are
        // then added at each step, after the recurrent product, in ORT's order.
        let mut xp = vec![0f32; rows * g4];
        let par = super::sequence::parallel_for(rows * input * g4, cx.par);
        match (panels, scales) {
            (Panels::F32(pw, _), None) => {
                let ep = Epilogue { col_bias: Some(b), ..Epilogue::default() };
                gemm_rows(x, rows, input, cx.blocking, pw, &mut xp, g4, &ep, par);
            }
            (Panels::F32(pw, _), Some(ws)) => {
                gemm_rows(&x_whole, rows, input, cx.blocking, pw, &mut xp, g4, &Epilogue::default(), par);
                let mult: Vec<f32> = ws.iter().map(|&w| x_scale * w).collect();
                for row in xp.chunks_exact_mut(g4) {
                    row.iter_mut().zip(&mult).for_each(|(v, &m)| *v *= m);
                }
            }
            (Panels::Int8(pw, _), Some(ws)) => {
                let mult: Vec<f32> = ws.iter().map(|&w| x_scale * w).collect();
                let a = QuantizedA { data: &x_bytes, m: rows, stride: x_stride, zero: x_zero, row_sums: &x_sums };
                qgemm(cx.isa, &a, pw, &QEpilogue { scale: &mult, bias: None, act: None }, &mut xp, g4, par);
            }
            (Panels::Int8(..), None) => return None,
        }
        xps.push(xp);
    }
    // Then the recurrences (two directions side by side where a step is small).
    let y_out = SharedY::new(yd);
    let kernels = (cx.isa, cx.blocking);
    let dirs = (weights.dirs.iter().zip(&xps).enumerate())
        .map(|(d, ((panels, b), xp))| {
            let r_scales = weights.scales.as_ref().map(|(_, rs)| &rs[d * g4..(d + 1) * g4]);
            let state = (q.initial(h0, d), q.initial(c0, d));
            Direction::new(&q, d, (panels, b), r_scales, xp, state, kernels, y_out)
        })
        .collect();
    let finals = super::sequence::by_direction(dirs, q.t_len, batch * hidden * g4, cx.par);
    for (d, Direction { h, c, .. }) in finals.iter().enumerate() {
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
