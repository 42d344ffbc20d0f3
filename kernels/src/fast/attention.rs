//! `aim:Attention`: `softmax(Q·Kᵀ·scale + mask)·V` in one kernel, reading the keys and
//! values where they are — no transposed or packed copy of the whole tensors, no scores
//! tensor. Each operand may be a transposed view of its tensor (`q_perm`, `k_perm`,
//! `v_perm`: the permutation that makes it `[.., M, H]`, `[.., T, H]`, `[.., T, Hv]`) and
//! the result may be written transposed (`out_perm`), so the head split and merge of
//! multi-head attention (`[B, S, heads, H]` ↔ `[B, heads, S, H]`) are read and written in
//! place instead of copied. Batch items that share a key/value item (the query heads of one
//! grouped key/value head) are taken together, so each key and value row serves all of them.
//!
//! Two schedules, by the number of query rows per key/value item:
//! - **few** (a decoder's step): 4 query rows at a time are scored against each key row
//!   where it lies, and the value rows weighted where they lie: the cache is read once;
//! - **many** (a prompt, an encoder): per work item of up to three groups of MR query rows
//!   (the GEMM microkernel's tile height), the item's keys are packed once into panels of
//!   NR keys and its values into panels of NR columns, then per group the scores come from
//!   the GEMM microkernel, the softmax runs on them while they are in L1, and the output
//!   rows from the microkernel again, against the value panels.

use super::ops::{mask_row_offsets, scaled_exp_row, scaled_softmax_row, Ctx};
use super::output::Output;
use crate::util::SharedMut;
use crate::util::{broadcast_shapes, err, strided_offsets, Result};
use aim_ir::{DType, Node, Tensor};

/// Query rows scored together against each key (their products share its loads).
const ROWS: usize = 4;

/// Query rows per key/value item from which the panel schedule is taken (below, the
/// transposed panel would cost about as much as the products it serves).
const PANEL_ROWS: usize = 8;

/// Runs an `aim:Attention` node: inputs Q, K and V, viewed through `q_perm`, `k_perm` and
/// `v_perm` as `[.., M, H]`, `[.., T, H]` and `[.., T, Hv]` (K and V with equal batch dims,
/// broadcast against Q's), an optional additive mask running along the last axis of the
/// scores `[.., M, T]`; attribute `scale`; the result `[.., M, Hv]` stored transposed by
/// `out_perm`. `None` (not f32): the caller reports the node as unsupported.
pub fn attention(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let f32_in = |i: usize| ins.get(i)?.as_ref().filter(|t| t.dtype() == DType::F32);
    let (q, k, v) = (f32_in(0)?, f32_in(1)?, f32_in(2)?);
    let mask = match ins.get(3) {
        Some(Some(_)) => Some(f32_in(3)?),
        _ => None,
    };
    Some(run(n, q, k, v, mask, cx))
}

/// An operand as the kernel reads it: its logical shape, and the step in its tensor's data
/// of each logical axis.
struct View {
    shape: Vec<usize>,
    steps: Vec<usize>,
}

/// Row-major steps of `shape`.
fn contiguous(shape: &[usize]) -> Vec<usize> {
    let mut steps = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        steps[a] = steps[a + 1] * shape[a + 1];
    }
    steps
}

/// Checks that `perm` permutes `r` axes.
fn check_perm(perm: &[i64], r: usize, what: &str) -> Result<()> {
    let mut seen = vec![false; r];
    let bad = perm.len() != r
        || perm.iter().any(|&a| a < 0 || a as usize >= r || std::mem::replace(&mut seen[a as usize], true));
    if bad {
        return err(format!("{what}: {perm:?} is not a permutation of {r} axes"));
    }
    Ok(())
}

/// `t` transposed by `perm` (none: as it is), without moving it.
fn view(t: &Tensor, perm: Option<&[i64]>, what: &str) -> Result<View> {
    let (shape, steps) = (t.shape(), contiguous(t.shape()));
    let Some(p) = perm else { return Ok(View { shape: shape.to_vec(), steps }) };
    check_perm(p, shape.len(), what)?;
    Ok(View {
        shape: p.iter().map(|&a| shape[a as usize]).collect(),
        steps: p.iter().map(|&a| steps[a as usize]).collect(),
    })
}

/// Where each item of `batch` starts in the operand (its batch dims are `batch`'s or 1).
fn batch_offsets(v: &View, batch: &[usize]) -> Result<Vec<usize>> {
    let steps: Vec<usize> =
        batch.iter().enumerate().map(|(a, _)| if v.shape[a] == 1 { 0 } else { v.steps[a] }).collect();
    strided_offsets(batch, &steps)
}

/// The sizes and steps one work item needs.
#[derive(Clone, Copy)]
struct Geom {
    m: usize,
    h: usize,
    t: usize,
    hv: usize,
    scale: f32,
    /// Steps of Q's rows and columns, K's and V's, and the output's.
    q: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
    o: (usize, usize),
}

/// One work item: rows `rows` (counted over the unit's items, `m` per item) of the unit of
/// batch items `first..` that read the key/value item at `k0` / `v0`.
struct Item<'a> {
    g: Geom,
    qd: &'a [f32],
    kd: &'a [f32],
    vd: &'a [f32],
    mask: Option<(&'a [f32], &'a [usize])>,
    oq: &'a [usize],
    oo: &'a [usize],
    k0: usize,
    v0: usize,
    first: usize,
    rows: std::ops::Range<usize>,
    out: SharedMut<f32>,
}

impl Item<'_> {
    /// The batch item and row of the unit's row `u`.
    fn locate(&self, u: usize) -> (usize, usize) {
        (self.first + u / self.g.m, u % self.g.m)
    }

    /// The mask row of the scores row of batch item `b`, row `r` (empty: no mask).
    fn mask_row(&self, b: usize, r: usize) -> &[f32] {
        match self.mask {
            Some((md, offs)) => {
                let o = offs[b * self.g.m + r];
                &md[o..o + self.g.t]
            }
            None => &[],
        }
    }
}

fn run(n: &Node, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, cx: &Ctx) -> Result<Vec<Tensor>> {
    let (qv, kv, vv) = (
        view(q, n.ints("q_perm"), "q_perm")?,
        view(k, n.ints("k_perm"), "k_perm")?,
        view(v, n.ints("v_perm"), "v_perm")?,
    );
    let (qs, ks, vs) = (&qv.shape, &kv.shape, &vv.shape);
    let r = qs.len();
    if r < 2 || ks.len() != r || vs.len() != r {
        return err(format!("Q {qs:?}, K {ks:?} and V {vs:?} must have one rank of at least 2"));
    }
    let (m, h, t, hv) = (qs[r - 2], qs[r - 1], ks[r - 2], vs[r - 1]);
    if ks[r - 1] != h || vs[r - 2] != t || ks[..r - 2] != vs[..r - 2] {
        return err(format!("Q {qs:?}, K {ks:?} and V {vs:?} do not fit: K [.., T, H] and V [.., T, Hv] expected"));
    }
    let batch = broadcast_shapes(&[&qs[..r - 2], &ks[..r - 2]])?;
    let (oq, ok, ov) = (batch_offsets(&qv, &batch)?, batch_offsets(&kv, &batch)?, batch_offsets(&vv, &batch)?);
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
    // The result [.., M, Hv], stored transposed by out_perm.
    let mut logical = batch.clone();
    logical.extend([m, hv]);
    let (shape, osteps) = match n.ints("out_perm") {
        None => (logical.clone(), contiguous(&logical)),
        Some(p) => {
            check_perm(p, r, "out_perm")?;
            let shape: Vec<usize> = p.iter().map(|&a| logical[a as usize]).collect();
            let stored = contiguous(&shape);
            let mut steps = vec![0; r];
            for (i, &a) in p.iter().enumerate() {
                steps[a as usize] = stored[i];
            }
            (shape, steps)
        }
    };
    let oo = strided_offsets(&batch, &osteps[..r - 2])?;
    let mut y = Output::new(cx.out, DType::F32, &shape)?;
    let g = Geom {
        m,
        h,
        t,
        hv,
        scale: n.float("scale", 1.0),
        q: (qv.steps[r - 2], qv.steps[r - 1]),
        k: (kv.steps[r - 2], kv.steps[r - 1]),
        v: (vv.steps[r - 2], vv.steps[r - 1]),
        o: (osteps[r - 2], osteps[r - 1]),
    };
    // Units: runs of consecutive batch items reading one key/value item.
    let mut units: Vec<(usize, usize)> = Vec::new();
    for i in 0..oq.len() {
        match units.last_mut() {
            Some((f, c)) if ok[*f] == ok[i] && ov[*f] == ov[i] => *c += 1,
            _ => units.push((i, 1)),
        }
    }
    let most_rows = units.iter().map(|&(_, c)| c * m).max().unwrap_or(0);
    let rows_in_place = g.q.1 == 1 && g.k.1 == 1 && g.v.1 == 1 && g.o.1 == 1;
    let panels = most_rows >= PANEL_ROWS || !rows_in_place;
    // Work items: a unit's rows in chunks, so that a few units still use every thread.
    let items_of = |per: usize| -> Vec<(usize, usize, usize, usize)> {
        units
            .iter()
            .enumerate()
            .flat_map(|(ui, &(first, count))| (0..(count * m).div_ceil(per)).map(move |c| (ui, first, count, c)))
            .collect()
    };
    let per = if panels {
        // Three microkernel row groups per item, fewer where that leaves threads idle.
        let mr = cx.isa.mr();
        let mut per = 3 * mr;
        while per > mr && items_of(per).len() < 2 * cx.par.threads() {
            per -= mr;
        }
        per
    } else {
        (4096 / t.max(1)).clamp(1, 64)
    };
    let items = items_of(per);
    let (qd, kd, vd) = (q.data::<f32>(), k.data::<f32>(), v.data::<f32>());
    let isa = cx.isa;
    // The panel schedule packs each unit's keys and values once, in parallel, first.
    let layout = Panels::new(isa, h, t, hv);
    let unit_len = layout.keys + layout.values;
    let mut packed = vec![0f32; if panels { units.len() * unit_len } else { 0 }];
    if panels {
        let pp = SharedMut(packed.as_mut_ptr());
        cx.par.for_each(units.len(), &|ui| {
            let pp = pp;
            let first = units[ui].0;
            // SAFETY: unit ui's part of `packed` is written by this task only.
            let dst = unsafe { std::slice::from_raw_parts_mut(pp.0.add(ui * unit_len), unit_len) };
            layout.pack(&g, &kd[ok[first]..], &vd[ov[first]..], dst);
        });
    }
    let out = SharedMut(y.bits_mut().as_mut_ptr());
    cx.par.for_each(items.len(), &|w| {
        let out = out;
        let (ui, first, count, c) = items[w];
        let item = Item {
            g,
            qd,
            kd,
            vd,
            mask: mask_rows.as_ref().map(|(md, offs)| (*md, offs.as_slice())),
            oq: &oq,
            oo: &oo,
            k0: ok[first],
            v0: ov[first],
            first,
            rows: (c * per)..((c + 1) * per).min(count * m),
            out,
        };
        if panels {
            let unit = &packed[ui * unit_len..(ui + 1) * unit_len];
            panel_item(isa, &layout, &item, unit.split_at(layout.keys));
        } else {
            rows_item(isa, &item);
        }
    });
    Ok(vec![y.finish()])
}

/// The few-rows schedule for one work item: keys and values read where they lie (every
/// operand's rows contiguous).
fn rows_item(isa: crate::gemm::Isa, it: &Item) {
    let g = it.g;
    let (mut s, mut probs) = (vec![0f32; ROWS * g.t], vec![0f32; g.t]);
    let (kb, vb) = (&it.kd[it.k0..], &it.vd[it.v0..]);
    let mut u = it.rows.start;
    while u < it.rows.end {
        let n = ROWS.min(it.rows.end - u);
        let qrow = |i: usize| {
            let (b, r) = it.locate(u + i.min(n - 1));
            &it.qd[it.oq[b] + r * g.q.0..][..g.h]
        };
        dots(isa, [qrow(0), qrow(1), qrow(2), qrow(3)], kb, g.k.0, &mut s);
        for i in 0..n {
            let (b, r) = it.locate(u + i);
            scaled_softmax_row(isa, &s[i * g.t..(i + 1) * g.t], it.mask_row(b, r), g.scale, &mut probs);
            // SAFETY: output row (b, r) is written by this work item only, and lies inside
            // the output (its offset and steps come from the output's shape).
            let yrow = unsafe { std::slice::from_raw_parts_mut(it.out.0.add(it.oo[b] + r * g.o.0), g.hv) };
            weighted_rows(isa, &probs, vb, g.v.0, yrow);
        }
        u += n;
    }
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

/// `s[i·T + j] = q[i] · k[j]` for the `ROWS` query rows and every key row of `k` (`T` rows
/// of `q[0].len()` values, `step` apart).
fn dots(isa: crate::gemm::Isa, q: [&[f32]; ROWS], k: &[f32], step: usize, s: &mut [f32]) {
    by_isa!(isa, dots_generic(q, k, step, s))
}

#[inline(always)]
fn dots_generic(q: [&[f32]; ROWS], k: &[f32], step: usize, s: &mut [f32]) {
    let h = q[0].len();
    let t = s.len() / ROWS;
    let whole = h / 8 * 8;
    for j in 0..t {
        let kj = &k[j * step..j * step + h];
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

/// `y = Σ_j p[j] · v[j]` over the rows of `v` (`p.len()` rows of `y.len()` values, `step`
/// apart).
fn weighted_rows(isa: crate::gemm::Isa, p: &[f32], v: &[f32], step: usize, y: &mut [f32]) {
    by_isa!(isa, weighted_rows_generic(p, v, step, y))
}

#[inline(always)]
fn weighted_rows_generic(p: &[f32], v: &[f32], step: usize, y: &mut [f32]) {
    const W: usize = 64;
    let hv = y.len();
    for c0 in (0..hv).step_by(W) {
        let w = W.min(hv - c0);
        let mut acc = [0f32; W];
        if w == W {
            for (j, &pj) in p.iter().enumerate() {
                let vj: &[f32; W] = v[j * step + c0..j * step + c0 + W].try_into().expect("a chunk");
                for l in 0..W {
                    acc[l] += pj * vj[l];
                }
            }
        } else {
            for (j, &pj) in p.iter().enumerate() {
                for (a, &x) in acc[..w].iter_mut().zip(&v[j * step + c0..j * step + c0 + w]) {
                    *a += pj * x;
                }
            }
        }
        y[c0..c0 + w].copy_from_slice(&acc[..w]);
    }
}

/// How the panel schedule lays out one key/value item for the GEMM microkernel: keys as
/// panels of NR key rows, H deep (`kp[(jp·H + d)·NR + l] = K[jp·NR + l, d]`), values as
/// panels of NR columns, T deep (`vp[(cp·T + j)·NR + l] = V[j, cp·NR + l]`), zero-padded.
struct Panels {
    mr: usize,
    nr: usize,
    /// Key and value panels.
    kn: usize,
    vn: usize,
    /// Floats of the key panels and of the value panels.
    keys: usize,
    values: usize,
}

impl Panels {
    fn new(isa: crate::gemm::Isa, h: usize, t: usize, hv: usize) -> Panels {
        let (mr, nr) = (isa.mr(), isa.nr());
        let (kn, vn) = (t.div_ceil(nr), hv.div_ceil(nr));
        Panels { mr, nr, kn, vn, keys: kn * h * nr, values: vn * t * nr }
    }

    /// Packs the key/value item whose first rows `k` and `v` start into `dst` (keys, then
    /// values).
    fn pack(&self, g: &Geom, k: &[f32], v: &[f32], dst: &mut [f32]) {
        let (h, t, hv, nr) = (g.h, g.t, g.hv, self.nr);
        let (kp, vp) = dst.split_at_mut(self.keys);
        for jp in 0..self.kn {
            let panel = &mut kp[jp * h * nr..(jp + 1) * h * nr];
            for l in 0..nr.min(t - jp * nr) {
                let row = (jp * nr + l) * g.k.0;
                let column = panel[l..].iter_mut().step_by(nr);
                if g.k.1 == 1 {
                    column.zip(&k[row..row + h]).for_each(|(x, &v)| *x = v);
                } else {
                    column.zip(k[row..].iter().step_by(g.k.1)).for_each(|(x, &v)| *x = v);
                }
            }
        }
        for j in 0..t {
            let row = j * g.v.0;
            for cp in 0..self.vn {
                let c0 = cp * nr;
                let dst = &mut vp[(cp * t + j) * nr..][..nr.min(hv - c0)];
                if g.v.1 == 1 {
                    dst.copy_from_slice(&v[row + c0..row + c0 + dst.len()]);
                } else {
                    for (l, x) in dst.iter_mut().enumerate() {
                        *x = v[row + (c0 + l) * g.v.1];
                    }
                }
            }
        }
    }
}

/// C[rows × NR] (leading dimension `ldc`) = A · B for `rows` (≤ MR) rows of A, row-major
/// `kc` wide, against one packed B panel (`kc × NR`): A read in place by the AVX-512 and
/// AVX2 microkernels, else packed into `scratch` (`kc × MR`) for the full tile (C then has
/// MR rows).
#[allow(clippy::too_many_arguments)]
fn product(
    isa: crate::gemm::Isa,
    l: &Panels,
    rows: usize,
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    scratch: &mut [f32],
) {
    debug_assert!(rows <= l.mr && a.len() >= rows * kc && b.len() >= kc * l.nr && c.len() >= (l.mr - 1) * ldc + l.nr);
    #[cfg(target_arch = "x86_64")]
    if matches!(isa.kind(), crate::gemm::IsaKind::Avx512 | crate::gemm::IsaKind::Avx2) {
        // SAFETY: A holds `rows` rows of kc floats, B kc×NR floats, C `rows` rows of NR at
        // stride ldc (checked above); the ISA is this CPU's.
        unsafe {
            crate::gemm::microkernel_plain(
                isa,
                rows,
                false,
                kc,
                a.as_ptr(),
                kc,
                b.as_ptr(),
                c.as_mut_ptr(),
                ldc,
                false,
                &[],
            )
        };
        return;
    }
    let mr = l.mr;
    scratch[..kc * mr].fill(0.0);
    for i in 0..rows {
        for p in 0..kc {
            scratch[p * mr + i] = a[i * kc + p];
        }
    }
    // SAFETY: the scratch panel holds kc×MR floats, B kc×NR, C MR rows of NR at stride ldc
    // (checked above); the ISA is this CPU's.
    unsafe { crate::gemm::microkernel(isa, kc, scratch.as_ptr(), b.as_ptr(), c.as_mut_ptr(), ldc, false) };
}

/// The many-rows schedule for one work item, against its unit's packed `(keys, values)`:
/// per group of MR query rows, the scores against every key panel, the softmax of each
/// row, then the weighted sum against every value panel.
fn panel_item(isa: crate::gemm::Isa, l: &Panels, it: &Item, (kp, vp): (&[f32], &[f32])) {
    let g = it.g;
    let (h, t, hv, mr, nr) = (g.h, g.t, g.hv, l.mr, l.nr);
    let (tp, hvp) = (l.kn * nr, l.vn * nr);
    let (mut qb, mut pb) = (vec![0f32; mr * h], vec![0f32; mr * t]);
    let (mut s, mut o) = (vec![0f32; mr * tp], vec![0f32; mr * hvp]);
    let mut inv = vec![0f32; mr];
    // The A panel the microkernels that do not read A in place need.
    let in_place =
        cfg!(target_arch = "x86_64") && matches!(isa.kind(), crate::gemm::IsaKind::Avx512 | crate::gemm::IsaKind::Avx2);
    let mut scratch = vec![0f32; if in_place { 0 } else { mr * h.max(t) }];
    let mut u = it.rows.start;
    while u < it.rows.end {
        let n = mr.min(it.rows.end - u);
        for i in 0..n {
            let (b, r) = it.locate(u + i);
            let q0 = it.oq[b] + r * g.q.0;
            let dst = &mut qb[i * h..(i + 1) * h];
            if g.q.1 == 1 {
                dst.copy_from_slice(&it.qd[q0..q0 + h]);
            } else {
                for (d, x) in dst.iter_mut().enumerate() {
                    *x = it.qd[q0 + d * g.q.1];
                }
            }
        }
        for jp in 0..l.kn {
            product(isa, l, n, h, &qb, &kp[jp * h * nr..], &mut s[jp * nr..], tp, &mut scratch);
        }
        // The exponentials, undivided: each output row is divided by its sum instead.
        for i in 0..n {
            let (b, r) = it.locate(u + i);
            inv[i] = 1.0
                / scaled_exp_row(isa, &s[i * tp..i * tp + t], it.mask_row(b, r), g.scale, &mut pb[i * t..(i + 1) * t]);
        }
        for cp in 0..l.vn {
            product(isa, l, n, t, &pb, &vp[cp * t * nr..], &mut o[cp * nr..], hvp, &mut scratch);
        }
        for i in 0..n {
            let (b, r) = it.locate(u + i);
            let ob = it.oo[b] + r * g.o.0;
            let k = inv[i];
            if g.o.1 == 1 {
                // SAFETY: output row (b, r) is written by this work item only, and lies
                // inside the output (its offset and step come from the output's shape).
                let row = unsafe { std::slice::from_raw_parts_mut(it.out.0.add(ob), hv) };
                row.iter_mut().zip(&o[i * hvp..i * hvp + hv]).for_each(|(y, &x)| *y = x * k);
            } else {
                for (c, &x) in o[i * hvp..i * hvp + hv].iter().enumerate() {
                    // SAFETY: as above, element by element.
                    unsafe { *it.out.0.add(ob + c * g.o.1) = x * k };
                }
            }
        }
        u += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{Blocking, Isa, Sequential};
    use aim_ir::Attr;

    /// Seeded values in [-2, 2).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// ONNX Transpose of `x` (shape `s`) by `perm`.
    fn transpose(x: &[f32], s: &[usize], perm: &[usize]) -> (Vec<f32>, Vec<usize>) {
        let out: Vec<usize> = perm.iter().map(|&a| s[a]).collect();
        let steps = contiguous(s);
        let offs = strided_offsets(&out, &perm.iter().map(|&a| steps[a]).collect::<Vec<_>>()).unwrap();
        (offs.iter().map(|&o| x[o]).collect(), out)
    }

    /// The tensor stored so that viewing it through `perm` gives `x` (shape `s`).
    fn stored(x: &[f32], s: &[usize], perm: Option<&[usize]>) -> Tensor {
        let Some(p) = perm else { return Tensor::from_vec(s, x.to_vec()) };
        let mut inv = vec![0; p.len()];
        for (i, &a) in p.iter().enumerate() {
            inv[a] = i;
        }
        let (d, shape) = transpose(x, s, &inv);
        Tensor::from_vec(&shape, d)
    }

    /// softmax(q·kᵀ·scale + mask)·v in f64 over logical, contiguous operands: q [B.., M, H]
    /// with `bq` batch items, k and v with `bkv` (broadcast by `bq / bkv` consecutive items).
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: Option<&[f32]>,
        bq: usize,
        bkv: usize,
        m: usize,
        t: usize,
        h: usize,
        hv: usize,
        scale: f32,
    ) -> Vec<f32> {
        let mut y = vec![0f32; bq * m * hv];
        for b in 0..bq {
            let kb = b / (bq / bkv);
            for i in 0..m {
                let s: Vec<f64> = (0..t)
                    .map(|j| {
                        let dot: f64 =
                            (0..h).map(|d| q[(b * m + i) * h + d] as f64 * k[(kb * t + j) * h + d] as f64).sum();
                        dot * scale as f64 + mask.map_or(0.0, |mk| mk[j] as f64)
                    })
                    .collect();
                let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..hv {
                    let acc: f64 = (0..t).map(|j| e[j] / sum * v[(kb * t + j) * hv + c] as f64).sum();
                    y[(b * m + i) * hv + c] = acc as f32;
                }
            }
        }
        y
    }

    /// Both schedules, every ISA here, operands transposed or not (unit and non-unit steps
    /// along the rows), key/value items shared by query items, sizes off the vector blocks.
    #[test]
    fn every_schedule_matches_the_definition() {
        type Perm = Option<&'static [usize]>;
        // (q batch dims, kv batch dims, M, T, H, Hv, q_perm, k_perm, v_perm, out_perm, masked)
        type Case = (&'static [usize], &'static [usize], usize, usize, usize, usize, Perm, Perm, Perm, Perm, bool);
        let cases: &[Case] = &[
            (&[2, 3], &[2, 1], 37, 45, 20, 70, None, None, None, None, true),
            (
                &[2, 3],
                &[2, 3],
                9,
                33,
                16,
                32,
                Some(&[0, 2, 1, 3]),
                Some(&[0, 2, 1, 3]),
                Some(&[0, 2, 1, 3]),
                Some(&[0, 2, 1, 3]),
                false,
            ),
            (&[1, 4], &[1, 1], 1, 45, 20, 70, None, None, None, None, true),
            (&[1, 4], &[1, 4], 3, 17, 8, 5, Some(&[0, 2, 1, 3]), Some(&[0, 2, 1, 3]), None, Some(&[0, 2, 1, 3]), true),
            (
                &[2, 3],
                &[2, 1],
                5,
                12,
                6,
                9,
                Some(&[0, 1, 3, 2]),
                Some(&[0, 1, 3, 2]),
                Some(&[0, 1, 3, 2]),
                Some(&[0, 1, 3, 2]),
                false,
            ),
        ];
        for (ci, &(qb, kvb, m, t, h, hv, qp, kp, vp, op, masked)) in cases.iter().enumerate() {
            let (bq, bkv) = (qb.iter().product::<usize>(), kvb.iter().product::<usize>());
            let shape = |b: &[usize], r: usize, c: usize| b.iter().copied().chain([r, c]).collect::<Vec<_>>();
            let (q, k, v) = (values(bq * m * h, 1 + ci as u64), values(bkv * t * h, 2), values(bkv * t * hv, 3));
            let mask: Vec<f32> = values(t, 4).iter().map(|x| if *x < -1.5 { -1e30 } else { *x }).collect();
            let scale = 0.3;
            let mut attrs = std::collections::BTreeMap::new();
            attrs.insert("scale".to_string(), Attr::Float(scale));
            for (name, p) in [("q_perm", qp), ("k_perm", kp), ("v_perm", vp), ("out_perm", op)] {
                if let Some(p) = p {
                    attrs.insert(name.to_string(), Attr::Ints(p.iter().map(|&a| a as i64).collect()));
                }
            }
            let node = Node {
                name: "a".into(),
                op: "Attention".into(),
                domain: "aim".into(),
                inputs: vec!["q".into(), "k".into(), "v".into(), if masked { "m".into() } else { String::new() }],
                outputs: vec!["y".into()],
                attrs,
            };
            let ins = vec![
                Some(stored(&q, &shape(qb, m, h), qp)),
                Some(stored(&k, &shape(kvb, t, h), kp)),
                Some(stored(&v, &shape(kvb, t, hv), vp)),
                masked.then(|| Tensor::from_vec(&[1, 1, 1, t], mask.clone())),
            ];
            let want = naive(&q, &k, &v, masked.then_some(mask.as_slice()), bq, bkv, m, t, h, hv, scale);
            let want = match op {
                Some(p) => transpose(&want, &shape(qb, m, hv), p).0,
                None => want,
            };
            for isa in Isa::all_available() {
                let cx =
                    Ctx { par: &Sequential, isa, blocking: Blocking::for_caches(isa, 32 << 10, 1 << 20), out: None };
                let y = attention(&node, &ins, &cx).unwrap().unwrap().remove(0);
                let got = y.data::<f32>();
                assert_eq!(got.len(), want.len());
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 2e-5, "case {ci}, {isa:?}: off by {worst}");
            }
        }
    }
}
