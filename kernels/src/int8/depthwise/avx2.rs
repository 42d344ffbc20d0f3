//! [`Depthwise8::line`] with AVX2, for channel counts that are multiples of 8 and clamp
//! epilogues: the AVX-512 path's runs (taps' weights held in registers while the pixels
//! pass; 3×3 windows rolled along the row) on 8 lanes, the epilogue in registers
//! ([`Epi8`]). The sums are exact integers in f32, as on every path (see the module doc).

use super::{Depthwise8, Row};
use crate::int8::epilogue_avx2::{load8, narrow, store8, Epi8};
use std::arch::x86_64::*;

/// Whether [`line`] takes `k`'s lines on an AVX2 CPU.
pub(super) fn fits(k: &Depthwise8) -> bool {
    k.c.is_multiple_of(8) && k.ep.clamp_constants().is_some()
}

/// One output row (see [`Depthwise8::line`]).
///
/// # Safety
/// The CPU has AVX2 and FMA; [`fits`] holds for `k`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn line(k: &Depthwise8, row: &Row, taps: &mut [*const u8], res: &[u8], dst: &mut [u8]) {
    let c = k.c;
    assert!(dst.len() >= row.ow * c && (res.is_empty() || res.len() >= row.ow * c), "the line does not fit");
    let (Some(e), Some((qs, qb))) = (Epi8::new(&k.ep), k.ep.grid_columns()) else { return };
    let cols = Cols { k, e: &e, qs, qb, res };
    let residual = !res.is_empty();
    let edge = |ox: usize, taps: &mut [*const u8], dst: &mut [u8]| {
        k.taps(row, ox, taps, 1, 0);
        if residual {
            pixel::<true>(&cols, taps, ox, dst)
        } else {
            pixel::<false>(&cols, taps, ox, dst)
        }
    };
    let (lo, hi) = k.interior(row);
    let mut ox = 0;
    while ox < lo.min(row.ow) {
        edge(ox, taps, dst);
        ox += 1;
    }
    if lo < hi {
        let win = &k.window;
        let iy0 = row.oy * win.stride[0] - win.pads[0];
        let ix0 = ox * win.stride[1] - win.pads[1];
        let first = row.x.data[((row.img * row.x.h + iy0) * row.x.w + ix0) * c..].as_ptr();
        let run = Run { first, step: win.stride[1] * c, rel: row.rel, ox, count: hi - ox };
        let rolled = win.kernel == [3, 3] && win.dilation == [1, 1];
        match (residual, win.stride[1]) {
            (true, 1) if rolled => rolled_run::<1, true>(&cols, &run, dst),
            (false, 1) if rolled => rolled_run::<1, false>(&cols, &run, dst),
            (true, 2) if rolled => rolled_run::<2, true>(&cols, &run, dst),
            (false, 2) if rolled => rolled_run::<2, false>(&cols, &run, dst),
            (false, _) => interior::<false>(&cols, &run, dst),
            (true, _) => interior::<true>(&cols, &run, dst),
        }
        ox = hi;
    }
    while ox < row.ow {
        edge(ox, taps, dst);
        ox += 1;
    }
}

/// The kernel's per-channel quantities and the line's residual.
struct Cols<'a> {
    k: &'a Depthwise8,
    e: &'a Epi8,
    qs: &'a [f32],
    qb: &'a [f32],
    res: &'a [u8],
}

/// `count` pixels from `ox` on whose windows are inside the input, the first one's window
/// starting at `first`, the next ones `step` bytes apart; `rel` each tap's offset.
struct Run<'a> {
    first: *const u8,
    step: usize,
    rel: &'a [usize],
    ox: usize,
    count: usize,
}

/// 8 bytes widened to f32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// A run of inside pixels: per block of 8 channels, up to 12 taps' weights held in
/// registers while the pixels pass.
#[target_feature(enable = "avx2,fma")]
unsafe fn interior<const RES: bool>(cx: &Cols, r: &Run, dst: &mut [u8]) {
    let k = cx.k;
    let c = k.c;
    let mut w = [_mm256_setzero_ps(); 12];
    let held = r.rel.len().min(w.len());
    for cb in (0..c).step_by(8) {
        let start = _mm256_loadu_ps(k.start.as_ptr().add(cb));
        let (s, b) = (_mm256_loadu_ps(cx.qs.as_ptr().add(cb)), _mm256_loadu_ps(cx.qb.as_ptr().add(cb)));
        for (t, wt) in w.iter_mut().enumerate().take(held) {
            *wt = _mm256_loadu_ps(k.w.as_ptr().add(t * c + cb));
        }
        for i in 0..r.count {
            // In bounds: every tap of these pixels is inside the input.
            let px = r.first.add(i * r.step + cb);
            let mut acc = start;
            for (t, &rel) in r.rel.iter().enumerate() {
                let wt = if t < held { w[t] } else { _mm256_loadu_ps(k.w.as_ptr().add(t * c + cb)) };
                acc = _mm256_fmadd_ps(widen(px.add(rel)), wt, acc);
            }
            store::<RES>(cx, acc, s, b, dst, (r.ox + i) * c + cb);
        }
    }
}

/// [`interior`] for 3×3 windows of horizontal stride `S` (1 or 2): each input column (three
/// rows of 8 channels) widened once and kept in registers for every pixel whose window
/// holds it.
#[target_feature(enable = "avx2,fma")]
unsafe fn rolled_run<const S: usize, const RES: bool>(cx: &Cols, r: &Run, dst: &mut [u8]) {
    let k = cx.k;
    let c = k.c;
    let rows = [r.rel[0], r.rel[3], r.rel[6]];
    for cb in (0..c).step_by(8) {
        let start = _mm256_loadu_ps(k.start.as_ptr().add(cb));
        let (s, b) = (_mm256_loadu_ps(cx.qs.as_ptr().add(cb)), _mm256_loadu_ps(cx.qb.as_ptr().add(cb)));
        let w: [__m256; 9] = std::array::from_fn(|t| _mm256_loadu_ps(k.w.as_ptr().add(t * c + cb)));
        // In bounds: every window of the run is inside the input, so are its columns.
        let col = |j: usize, ky: usize| widen(r.first.add(j * c + rows[ky] + cb));
        let mut a: [__m256; 3] = std::array::from_fn(|ky| col(0, ky));
        let mut bcol: [__m256; 3] = std::array::from_fn(|ky| col(1, ky));
        for i in 0..r.count {
            if S == 2 && i > 0 {
                bcol = std::array::from_fn(|ky| col(S * i + 1, ky));
            }
            let next: [__m256; 3] = std::array::from_fn(|ky| col(S * i + 2, ky));
            let mut acc = start;
            for ky in 0..3 {
                acc = _mm256_fmadd_ps(a[ky], w[ky * 3], acc);
                acc = _mm256_fmadd_ps(bcol[ky], w[ky * 3 + 1], acc);
                acc = _mm256_fmadd_ps(next[ky], w[ky * 3 + 2], acc);
            }
            if S == 1 {
                (a, bcol) = (bcol, next);
            } else {
                a = next;
            }
            store::<RES>(cx, acc, s, b, dst, (r.ox + i) * c + cb);
        }
    }
}

/// One pixel whose taps are `ptrs` (some the zero row).
#[target_feature(enable = "avx2,fma")]
unsafe fn pixel<const RES: bool>(cx: &Cols, ptrs: &[*const u8], ox: usize, dst: &mut [u8]) {
    let k = cx.k;
    let c = k.c;
    for cb in (0..c).step_by(8) {
        let mut acc = _mm256_loadu_ps(k.start.as_ptr().add(cb));
        for (t, &p) in ptrs.iter().enumerate() {
            // In bounds: every tap points at `c` bytes, each tap's weights are `c` floats.
            acc = _mm256_fmadd_ps(widen(p.add(cb)), _mm256_loadu_ps(k.w.as_ptr().add(t * c + cb)), acc);
        }
        let (s, b) = (_mm256_loadu_ps(cx.qs.as_ptr().add(cb)), _mm256_loadu_ps(cx.qb.as_ptr().add(cb)));
        store::<RES>(cx, acc, s, b, dst, ox * c + cb);
    }
}

/// The epilogue of 8 channels' sums stored at `dst[at..]`, the residual read at
/// `res[at..]` when `RES`.
///
/// # Safety
/// `dst` (and the residual) hold 8 bytes from `at`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store<const RES: bool>(cx: &Cols, acc: __m256, s: __m256, b: __m256, dst: &mut [u8], at: usize) {
    debug_assert!(at + 8 <= dst.len());
    let rb = if RES { load8(cx.res.as_ptr().add(at), 8) } else { _mm_setzero_si128() };
    store8(dst.as_mut_ptr().add(at), 8, narrow(cx.e.apply(acc, s, b, rb)));
}
