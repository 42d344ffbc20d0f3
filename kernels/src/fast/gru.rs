//! GRU in f32 on the packed GEMMs, as the LSTM is (see `recurrent.rs`): the input
//! projection of every step at once (`X · Wᵀ` plus the biases that add linearly), then per
//! step `H · R_zrᵀ` for the update and reset gates and `(r ⊙ H) · R_hᵀ` (or `r ⊙ (H · R_hᵀ +
//! Rb_h)` with `linear_before_reset`) for the candidate, gates as vector loops with the
//! fast sigmoid and tanh. Directions forward, reverse and bidirectional, both layouts, an
//! initial state. Other activations, clipping and sequence lengths shorter than the
//! sequence run the reference kernel. Constant weights are packed once, at load.

use super::math;
use super::output::Output;
use super::sequence::{Seq, SharedY};
use super::Ctx;
use crate::gemm::{gemm_rows, Blocking, Epilogue, Isa, PackedB, Parallel};
use crate::util::Result;
use aim_ir::{DType, Node, Tensor};
use std::ops::Range;

/// One direction's packed weights.
struct Dir {
    /// `Wᵀ` (input × 3h).
    w: PackedB,
    /// `R_zᵀ, R_rᵀ` (h × 2h).
    r_zr: PackedB,
    /// `R_hᵀ` (h × h).
    r_h: PackedB,
    /// Added to the input projection: `Wb_z + Rb_z, Wb_r + Rb_r, Wb_h` (3h).
    bias_x: Vec<f32>,
    /// `Rb_h` (h): inside the reset product.
    bias_rh: Vec<f32>,
}

/// A GRU's weights packed for the microkernels, made once at load when W, R and B are
/// constants.
pub struct GruWeights {
    dirs: Vec<Dir>,
    /// The shapes packed (W, R), to check each run's inputs against.
    shapes: (Vec<usize>, Vec<usize>),
}

impl GruWeights {
    /// Packs W `[dirs, 3h, input]`, R `[dirs, 3h, h]` and B `[dirs, 6h]` (if given) of f32;
    /// None for other types or shapes.
    pub fn pack(w: &Tensor, r: &Tensor, b: Option<&Tensor>, isa: Isa, blocking: Blocking) -> Option<GruWeights> {
        let f32s = [Some(w), Some(r), b].into_iter().flatten().all(|t| t.dtype() == DType::F32);
        if !f32s || w.rank() != 3 || r.rank() != 3 {
            return None;
        }
        let (dirs, g3, input, hidden) = (w.shape()[0], w.shape()[1], w.shape()[2], r.shape()[2]);
        if g3 != 3 * hidden || r.shape() != [dirs, g3, hidden] || b.is_some_and(|b| b.shape() != [dirs, 6 * hidden]) {
            return None;
        }
        let (wd, rd) = (w.data::<f32>(), r.data::<f32>());
        let dirs = (0..dirs)
            .map(|d| {
                let wdir = &wd[d * g3 * input..(d + 1) * g3 * input];
                let rdir = &rd[d * g3 * hidden..(d + 1) * g3 * hidden];
                let (rzr, rh) = rdir.split_at(2 * hidden * hidden);
                let bv: Vec<f32> = b.map_or(vec![0.0; 6 * hidden], |bt| {
                    bt.data::<f32>()[d * 6 * hidden..(d + 1) * 6 * hidden].to_vec()
                });
                let (wb, rb) = bv.split_at(g3);
                let bias_x = (0..g3).map(|j| if j < 2 * hidden { wb[j] + rb[j] } else { wb[j] }).collect();
                Dir {
                    w: PackedB::from_slice(isa, blocking, wdir, input, g3, true),
                    r_zr: PackedB::from_slice(isa, blocking, rzr, hidden, 2 * hidden, true),
                    r_h: PackedB::from_slice(isa, blocking, rh, hidden, hidden, true),
                    bias_x,
                    bias_rh: rb[2 * hidden..].to_vec(),
                }
            })
            .collect();
        Some(GruWeights { dirs, shapes: (w.shape().to_vec(), r.shape().to_vec()) })
    }
}

/// Whether the node uses the default activations (Sigmoid, Tanh).
fn default_activations(n: &Node) -> bool {
    n.strings("activations").is_none_or(|a| {
        a.len() % 2 == 0
            && a.chunks(2).all(|c| c[0].eq_ignore_ascii_case("sigmoid") && c[1].eq_ignore_ascii_case("tanh"))
    })
}

/// GRU with weights packed at load.
pub(super) fn gru_packed(
    n: &Node,
    ins: &[Option<Tensor>],
    cx: &Ctx,
    weights: &GruWeights,
) -> Option<Result<Vec<Tensor>>> {
    run(n, ins, cx, Some(weights))
}

pub(super) fn gru(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    run(n, ins, cx, None)
}

fn run(n: &Node, ins: &[Option<Tensor>], cx: &Ctx, packed: Option<&GruWeights>) -> Option<Result<Vec<Tensor>>> {
    if n.attrs.contains_key("clip") || !default_activations(n) {
        return None;
    }
    let q = Seq::parse(n, ins, 3)?;
    let h0 = q.state(ins, 5)?;
    let packed_now;
    let weights = match packed {
        Some(p) if p.shapes == (q.w.shape().to_vec(), q.r.shape().to_vec()) => p,
        Some(_) => return None,
        None => {
            packed_now = GruWeights::pack(q.w, q.r, q.bias, cx.isa, cx.blocking)?;
            &packed_now
        }
    };
    let linear_before_reset = n.int("linear_before_reset", 0) != 0;
    let mut y = match Output::new(cx.out, DType::F32, &q.y_shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let (batch, hidden) = (q.batch, q.hidden);
    let mut yh = vec![0f32; q.dirs * batch * hidden];
    let (xd, yd) = (q.x.data::<f32>(), y.bits_mut());
    let g3 = 3 * hidden;
    let rows = q.t_len * batch;
    // Every direction's input projection first (the pool's threads share each product).
    let xps: Vec<Vec<f32>> = weights
        .dirs
        .iter()
        .map(|dw| {
            let mut xp = vec![0f32; rows * g3];
            let ep = Epilogue { col_bias: Some(&dw.bias_x), ..Epilogue::default() };
            let proj_par = super::sequence::parallel_for(rows * q.input * g3, cx.par);
            gemm_rows(xd, rows, q.input, cx.blocking, &dw.w, &mut xp, g3, &ep, proj_par);
            xp
        })
        .collect();
    // Then the recurrences (two directions side by side where a step is small).
    let y_out = SharedY::new(yd);
    let (isa, blocking) = (cx.isa, cx.blocking);
    let dirs = (weights.dirs.iter().zip(&xps).enumerate())
        .map(|(d, (dw, xp))| Direction {
            dw,
            xp,
            q: &q,
            d,
            linear_before_reset,
            isa,
            blocking,
            y: y_out,
            h: q.initial(h0, d),
            zr: vec![0f32; batch * 2 * hidden],
            cand: vec![0f32; batch * hidden],
            rh: vec![0f32; batch * hidden],
        })
        .collect();
    let finals = super::sequence::by_direction(dirs, q.t_len, batch * hidden * g3, cx.par);
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
/// state written to `y`. It holds its state and a step's scratch, so that
/// [`by_direction`](super::sequence::by_direction) can advance it a few steps at a time on
/// whichever thread is free.
struct Direction<'a> {
    dw: &'a Dir,
    /// The input projections (rows in X's order, 3h each).
    xp: &'a [f32],
    q: &'a Seq<'a>,
    d: usize,
    linear_before_reset: bool,
    /// Which gate loops run (read on x86-64, where they are compiled per ISA).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: Isa,
    blocking: Blocking,
    y: SharedY,
    h: Vec<f32>,
    /// z and r of a step (batch × 2h), the candidate's product and r ⊙ h (batch × h).
    zr: Vec<f32>,
    cand: Vec<f32>,
    rh: Vec<f32>,
}

impl super::sequence::Recurrence for Direction<'_> {
    /// Runs with the gate loops compiled for the ISA (the fast sigmoid and tanh vectorise).
    fn run(&mut self, steps: Range<usize>, par: &dyn Parallel) {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn v4(j: &mut Direction, steps: Range<usize>, par: &dyn Parallel) {
                j.steps::<true>(steps, par)
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3(j: &mut Direction, steps: Range<usize>, par: &dyn Parallel) {
                j.steps::<true>(steps, par)
            }
            // SAFETY: an `Isa` exists only for features this CPU has.
            match self.isa.kind() {
                crate::gemm::IsaKind::Avx512 => return unsafe { v4(self, steps, par) },
                crate::gemm::IsaKind::Avx2 => return unsafe { v3(self, steps, par) },
                _ => {}
            }
        }
        self.steps::<{ cfg!(target_arch = "aarch64") }>(steps, par)
    }
}

impl Direction<'_> {
    /// The steps, the gates' functions with fused multiply-adds where `FMA`.
    #[inline(always)]
    fn steps<const FMA: bool>(&mut self, steps: Range<usize>, par: &dyn Parallel) {
        let q = self.q;
        let (batch, hidden, t_len) = (q.batch, q.hidden, q.t_len);
        let (g3, dw, y) = (3 * hidden, self.dw, self.y);
        let (h, zr, cand, rh) = (&mut self.h, &mut self.zr, &mut self.cand, &mut self.rh);
        let bias_rh = Epilogue { col_bias: Some(&dw.bias_rh), ..Epilogue::default() };
        for s in steps {
            let t = if q.reverse(self.d) { t_len - 1 - s } else { s };
            let xrow = |bi: usize| {
                let row = q.x_row(t, bi);
                &self.xp[row * g3..(row + 1) * g3]
            };
            gemm_rows(h, batch, hidden, self.blocking, &dw.r_zr, zr, 2 * hidden, &Epilogue::default(), par);
            // z and r: σ(x + h·R).
            for bi in 0..batch {
                let (xr, g) = (xrow(bi), &mut zr[bi * 2 * hidden..(bi + 1) * 2 * hidden]);
                for (v, &xv) in g.iter_mut().zip(&xr[..2 * hidden]) {
                    *v = math::sigmoid_with::<FMA>(*v + xv);
                }
            }
            if self.linear_before_reset {
                gemm_rows(h, batch, hidden, self.blocking, &dw.r_h, cand, hidden, &bias_rh, par);
                for bi in 0..batch {
                    let r = &zr[bi * 2 * hidden + hidden..(bi + 1) * 2 * hidden];
                    for (cv, &rv) in cand[bi * hidden..(bi + 1) * hidden].iter_mut().zip(r) {
                        *cv *= rv;
                    }
                }
            } else {
                for bi in 0..batch {
                    let r = &zr[bi * 2 * hidden + hidden..(bi + 1) * 2 * hidden];
                    let (dst, src) = (&mut rh[bi * hidden..(bi + 1) * hidden], &h[bi * hidden..(bi + 1) * hidden]);
                    for ((o, &rv), &hv) in dst.iter_mut().zip(r).zip(src) {
                        *o = rv * hv;
                    }
                }
                gemm_rows(rh, batch, hidden, self.blocking, &dw.r_h, cand, hidden, &bias_rh, par);
            }
            for bi in 0..batch {
                let xr = &xrow(bi)[2 * hidden..];
                let z = &zr[bi * 2 * hidden..bi * 2 * hidden + hidden];
                let (hr, cr) = (&mut h[bi * hidden..(bi + 1) * hidden], &cand[bi * hidden..(bi + 1) * hidden]);
                for (((hv, &c), &xv), &zv) in hr.iter_mut().zip(cr).zip(xr).zip(z) {
                    let c = math::tanh_with::<FMA>(c + xv);
                    *hv = (1.0 - zv) * c + zv * *hv;
                }
                // SAFETY: this direction's states alone are written here, Y outlives the run.
                unsafe { y.write(q.y_at(t, bi, self.d), hr) };
            }
        }
    }
}
