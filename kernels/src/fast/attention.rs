//! `aim:Attention`: `softmax(Q·Kᵀ·scale + mask)·V` in one kernel, reading the keys and
//! values where they are (`[.., T, H]`, no transposed or packed copy) — for a decoder's step,
//! one query row per head against its whole cache, that is the difference between reading
//! the cache once and copying it three times. Batch items that share a key/value item (the
//! query heads of one grouped key/value head) are taken together, so each key and value row
//! is loaded once for all of them.

use super::ops::{mask_row_offsets, scaled_softmax_row, shared_b_runs, Ctx};
use super::output::Output;
use crate::util::SharedMut;
use crate::util::{broadcast_offsets, broadcast_shapes, err, Result};
use aim_ir::{DType, Node, Tensor};

/// Query rows scored together against each key (their dot products share its loads).
const ROWS: usize = 4;

/// Runs an `aim:Attention` node: inputs Q `[.., M, H]`, K `[.., T, H]`, V `[.., T, Hv]`
/// (K and V with equal batch dims, broadcast against Q's), an optional additive mask
/// running along the last axis of the scores `[.., M, T]`; attribute `scale`. `None`
/// (not f32): the caller reports the node as unsupported.
pub fn attention(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let f32_in = |i: usize| ins.get(i)?.as_ref().filter(|t| t.dtype() == DType::F32);
    let (q, k, v) = (f32_in(0)?, f32_in(1)?, f32_in(2)?);
    let mask = match ins.get(3) {
        Some(Some(_)) => Some(f32_in(3)?),
        _ => None,
    };
    Some(run(n.float("scale", 1.0), q, k, v, mask, cx))
}

fn run(scale: f32, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, cx: &Ctx) -> Result<Vec<Tensor>> {
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let r = qs.len();
    if r < 2 || ks.len() != r || vs.len() != r {
        return err(format!("Q {qs:?}, K {ks:?} and V {vs:?} must have one rank of at least 2"));
    }
    let (m, h, t, hv) = (qs[r - 2], qs[r - 1], ks[r - 2], vs[r - 1]);
    if ks[r - 1] != h || vs[r - 2] != t || ks[..r - 2] != vs[..r - 2] {
        return err(format!("Q {qs:?}, K {ks:?} and V {vs:?} do not fit: K [.., T, H] and V [.., T, Hv] expected"));
    }
    let batch = broadcast_shapes(&[&qs[..r - 2], &ks[..r - 2]])?;
    let (oq, okv) = (broadcast_offsets(&qs[..r - 2], &batch)?, broadcast_offsets(&ks[..r - 2], &batch)?);
    // The scores' shape, and each score row's mask row.
    let mut scores = batch.clone();
    scores.extend([m, t]);
    let mask_rows = match mask {
        None => None,
        Some(mt) => {
            let md = mt.data::<f32>();
            Some((md, mask_row_offsets(md, mt.shape(), &scores).map_err(crate::KernelError)?))
        }
    };
    let mut shape = batch;
    shape.extend([m, hv]);
    let mut y = Output::new(cx.out, DType::F32, &shape)?;
    let (qd, kd, vd) = (q.data::<f32>(), k.data::<f32>(), v.data::<f32>());
    let out = SharedMut(y.bits_mut().as_mut_ptr());
    let units = shared_b_runs(&oq, &okv);
    // Work items: a unit's rows in chunks, so that a few units still use every thread.
    let per = (4096 / t.max(1)).clamp(1, 64);
    let items: Vec<(usize, usize, usize)> = units
        .iter()
        .flat_map(|&(first, count)| (0..(count * m).div_ceil(per)).map(move |c| (first, count, c)))
        .collect();
    let isa = cx.isa;
    cx.par.for_each(items.len(), &|w| {
        let out = out;
        let (first, count, c) = items[w];
        let rows = (c * per)..((c + 1) * per).min(count * m);
        let kv = okv[first];
        let (kb, vb) = (&kd[kv * t * h..(kv + 1) * t * h], &vd[kv * t * hv..(kv + 1) * t * hv]);
        let (mut s, mut tmp, mut probs) = (vec![0f32; ROWS * t], vec![0f32; t], vec![0f32; t]);
        let mut row = rows.start;
        while row < rows.end {
            let n = ROWS.min(rows.end - row);
            // A unit's rows are consecutive batch items' rows: contiguous in Q and in Y.
            let qrow = |i: usize| &qd[(oq[first] * m + row + i.min(n - 1)) * h..][..h];
            dots(isa, [qrow(0), qrow(1), qrow(2), qrow(3)], kb, &mut s);
            for i in 0..n {
                let g = first * m + row + i;
                let mrow: &[f32] = match &mask_rows {
                    Some((md, offs)) => &md[offs[g]..offs[g] + t],
                    None => &[],
                };
                scaled_softmax_row(isa, &s[i * t..(i + 1) * t], mrow, scale, &mut tmp, &mut probs);
                // SAFETY: output row g is written by this work item only.
                let yrow = unsafe { std::slice::from_raw_parts_mut(out.0.add(g * hv), hv) };
                weighted_rows(isa, &probs, vb, yrow);
            }
            row += n;
        }
    });
    Ok(vec![y.finish()])
}

/// Runs `$generic` compiled for the ISA's vector width (AVX-512, AVX2 + FMA), else as is.
macro_rules! by_isa {
    ($isa:expr, $generic:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn v4(f: impl FnOnce()) { f() }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3(f: impl FnOnce()) { f() }
            match $isa.kind() {
                // SAFETY: the ISA was checked available when the program was built.
                crate::gemm::IsaKind::Avx512 => unsafe { v4(#[inline(always)] || $generic($($arg),*)) },
                crate::gemm::IsaKind::Avx2 => unsafe { v3(#[inline(always)] || $generic($($arg),*)) },
                crate::gemm::IsaKind::Portable | crate::gemm::IsaKind::Neon => $generic($($arg),*),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = $isa;
            $generic($($arg),*)
        }
    }};
}

/// `s[i·T + j] = q[i] · k[j]` for the `ROWS` query rows and every key row of `k`.
fn dots(isa: crate::gemm::Isa, q: [&[f32]; ROWS], k: &[f32], s: &mut [f32]) {
    by_isa!(isa, dots_generic(q, k, s))
}

#[inline(always)]
fn dots_generic(q: [&[f32]; ROWS], k: &[f32], s: &mut [f32]) {
    let h = q[0].len();
    let t = k.len() / h.max(1);
    let whole = h / 8 * 8;
    for j in 0..t {
        let kj = &k[j * h..(j + 1) * h];
        let mut acc = [[0f32; 8]; ROWS];
        for c in (0..whole).step_by(8) {
            let kc: &[f32; 8] = kj[c..c + 8].try_into().expect("eight");
            for (a, qi) in acc.iter_mut().zip(&q) {
                let qc: &[f32; 8] = qi[c..c + 8].try_into().expect("eight");
                for l in 0..8 {
                    a[l] += qc[l] * kc[l];
                }
            }
        }
        for (i, (a, qi)) in acc.iter().zip(&q).enumerate() {
            let tail: f32 = (whole..h).map(|p| qi[p] * kj[p]).sum();
            s[i * t + j] = a.iter().sum::<f32>() + tail;
        }
    }
}

/// `y = Σ_j p[j] · v[j]` over the rows of `v` (`[T, y.len()]`).
fn weighted_rows(isa: crate::gemm::Isa, p: &[f32], v: &[f32], y: &mut [f32]) {
    by_isa!(isa, weighted_rows_generic(p, v, y))
}

#[inline(always)]
fn weighted_rows_generic(p: &[f32], v: &[f32], y: &mut [f32]) {
    const W: usize = 64;
    let hv = y.len();
    for c0 in (0..hv).step_by(W) {
        let w = W.min(hv - c0);
        let mut acc = [0f32; W];
        if w == W {
            for (j, &pj) in p.iter().enumerate() {
                let vj: &[f32; W] = v[j * hv + c0..j * hv + c0 + W].try_into().expect("a chunk");
                for l in 0..W {
                    acc[l] += pj * vj[l];
                }
            }
        } else {
            for (j, &pj) in p.iter().enumerate() {
                for (a, &x) in acc[..w].iter_mut().zip(&v[j * hv + c0..j * hv + c0 + w]) {
                    *a += pj * x;
                }
            }
        }
        y[c0..c0 + w].copy_from_slice(&acc[..w]);
    }
}
