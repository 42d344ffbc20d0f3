//! Quantized depthwise convolution, bytes NHWC in and out: per output pixel, each channel
//! sums its taps `x · w` across the pixel's channels as one vector loop, starting from
//! `−zx · Σw` (a tap in the padding reads a row of zero points, so the correction is the
//! same for every pixel).
//!
//! The sums are integers computed in f32: each product is an integer of magnitude at most
//! 255 · 128, the correction at most that times the taps, and there are at most
//! [`MAX_TAPS`] taps, so every partial sum is below 2²⁴ and exact — the integer sum,
//! fused multiply-adds or not, without the widening steps an i32 accumulator needs for
//! byte operands. The epilogue is the one every byte-writing kernel shares.

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::epilogue::Epilogue8;
use super::{Nhwc, Out8, SharedMut, Weights8, Window, Q8};
use crate::gemm::{Isa, Parallel};

/// Taps per window up to which the f32 sums are exact (2 · 257 · 255 · 128 < 2²⁴).
pub const MAX_TAPS: usize = 257;

/// A depthwise convolution prepared for [`Depthwise8::run`].
#[derive(Clone, Debug)]
pub struct Depthwise8 {
    c: usize,
    window: Window,
    /// Per tap, one weight per channel (the s8 values, as f32).
    w: Vec<f32>,
    x_zero: u8,
    /// `−zx · Σw` per channel: where each channel's sum starts.
    start: Vec<f32>,
    /// The epilogue, with each channel's scale (input × weight) and bias.
    ep: Epilogue8,
}

impl Depthwise8 {
    /// Prepares the weights (`[c, 1, kh, kw]`) of a depthwise convolution over `window`
    /// (see [`super::conv::Conv8::new`] for the other arguments).
    pub fn new(c: usize, window: Window, weights: Weights8, x: Q8, out: Out8) -> Result<Depthwise8, String> {
        let Weights8 { w, scale: w_scale, bias } = weights;
        let taps = window.taps();
        if c == 0 || taps == 0 || taps > MAX_TAPS {
            return Err(format!("a depthwise convolution of {c} channels over {taps} taps (1 to {MAX_TAPS})"));
        }
        if w.len() != c * taps {
            return Err(format!("{} weights for {c} channels of {taps} taps", w.len()));
        }
        if w_scale.len() != 1 && w_scale.len() != c {
            return Err(format!("{} weight scales for {c} channels", w_scale.len()));
        }
        if bias.is_some_and(|b| b.len() != c) {
            return Err(format!("a bias of {} values for {c} channels", bias.map_or(0, |b| b.len())));
        }
        let mut wt = vec![0f32; taps * c];
        let mut start = vec![0f32; c];
        for ch in 0..c {
            let mut sum = 0i32;
            for t in 0..taps {
                let v = w[ch * taps + t] as i8;
                wt[t * c + ch] = v as f32;
                sum += v as i32;
            }
            start[ch] = -(x.zero as i32 * sum) as f32;
        }
        let scale = (0..c).map(|o| x.scale * w_scale[if w_scale.len() == 1 { 0 } else { o }]).collect();
        let bias = bias.map_or_else(|| vec![0.0; c], |b| b.to_vec());
        Ok(Depthwise8 { c, window, w: wt, x_zero: x.zero, start, ep: Epilogue8::new(out, scale, bias) })
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.c
    }

    /// The window.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// The epilogue.
    pub fn out(&self) -> &Out8 {
        self.ep.out()
    }

    /// `y` (bytes NHWC) from `x`, with the residual `res` when the epilogue has one.
    ///
    /// Panics when a buffer does not fit the shapes given.
    pub fn run(&self, isa: Isa, x: &Nhwc, res: Option<&[u8]>, y: &mut [u8], par: &dyn Parallel) {
        let (oh, ow) = self.window.output(x.h, x.w).expect("the window fits the input");
        let c = self.c;
        assert!(x.fits() && x.c == c, "the input does not hold {c} channels NHWC");
        let out_len = x.n * oh * ow * c;
        assert!(y.len() >= out_len, "the output is too small");
        assert_eq!(res.is_some(), self.out().residual.is_some(), "a residual exactly when the epilogue adds one");
        if let Some(r) = res {
            assert!(r.len() >= out_len, "the residual is too small");
        }
        let lines = x.n * oh;
        let per = lines.div_ceil(par.threads() * 4).max(1);
        let yp = SharedMut(y.as_mut_ptr());
        let zrow = vec![self.x_zero; c];
        let [kh, kw] = self.window.kernel;
        let rel: Vec<usize> = (0..kh * kw)
            .map(|t| ((t / kw) * self.window.dilation[0] * x.w + (t % kw) * self.window.dilation[1]) * c)
            .collect();
        par.for_each(lines.div_ceil(per), &|t| {
            let yp = yp;
            let mut taps = vec![zrow.as_ptr(); self.window.taps()];
            let mut acc = vec![0f32; c];
            for line in t * per..((t + 1) * per).min(lines) {
                let at = line * ow * c;
                // SAFETY: inside `y` (checked above); tasks write disjoint lines.
                let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(at), ow * c) };
                let res = res.map_or(&[][..], |r| &r[at..at + ow * c]);
                let row = Row { x, img: line / oh, oy: line % oh, ow, zrow: &zrow, rel: &rel };
                self.line(isa, &row, &mut taps, &mut acc, res, dst);
            }
        });
    }

    /// One output row: `dst` (and the residual `res`, when there is one) its `ow · c`
    /// bytes; one dispatch on the ISA for the whole row.
    fn line(&self, isa: Isa, row: &Row, taps: &mut [*const u8], acc: &mut [f32], res: &[u8], dst: &mut [u8]) {
        #[inline(always)]
        fn body(k: &Depthwise8, row: &Row, taps: &mut [*const u8], acc: &mut [f32], res: &[u8], dst: &mut [u8]) {
            let c = k.c;
            for ox in 0..row.ow {
                k.taps(row, ox, taps, 1, 0);
                acc.copy_from_slice(&k.start);
                for (t, &p) in taps.iter().enumerate() {
                    // SAFETY: every tap points at `c` readable bytes (a pixel or the zero row).
                    let xs = unsafe { std::slice::from_raw_parts(p, c) };
                    for ((a, &v), &w) in acc.iter_mut().zip(xs).zip(&k.w[t * c..(t + 1) * c]) {
                        *a += v as f32 * w;
                    }
                }
                let r = if res.is_empty() { res } else { &res[ox * c..(ox + 1) * c] };
                k.ep.row(acc, 0, r, &mut dst[ox * c..(ox + 1) * c]);
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::gemm::IsaKind;
            if self.ep.fast(isa) {
                // SAFETY: AVX-512 F, BW and VL checked.
                return unsafe { line_v4(self, row, taps, res, dst) };
            }
            if crate::qgemm::use_avx2(isa) && avx2::fits(self) {
                // SAFETY: AVX2 and FMA checked.
                return unsafe { avx2::line(self, row, taps, res, dst) };
            }
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
            unsafe fn v4(k: &Depthwise8, row: &Row, t: &mut [*const u8], a: &mut [f32], r: &[u8], d: &mut [u8]) {
                body(k, row, t, a, r, d)
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3(k: &Depthwise8, row: &Row, t: &mut [*const u8], a: &mut [f32], r: &[u8], d: &mut [u8]) {
                body(k, row, t, a, r, d)
            }
            // SAFETY: an `Isa` exists only for features this CPU has (BW checked here).
            match isa.kind() {
                IsaKind::Avx512 if std::arch::is_x86_feature_detected!("avx512bw") => {
                    return unsafe { v4(self, row, taps, acc, res, dst) }
                }
                IsaKind::Avx512 | IsaKind::Avx2 => return unsafe { v3(self, row, taps, acc, res, dst) },
                _ => {}
            }
        }
        let _ = isa;
        body(self, row, taps, acc, res, dst)
    }

    /// The output columns `lo..hi` of `row` whose windows lie wholly inside the input
    /// (empty when the row's do not).
    #[cfg(target_arch = "x86_64")]
    fn interior(&self, row: &Row) -> (usize, usize) {
        let win = &self.window;
        let span = |k: usize, d: usize| (k - 1) * d;
        let (h, w) = (row.x.h, row.x.w);
        let iy0 = (row.oy * win.stride[0]) as isize - win.pads[0] as isize;
        if iy0 < 0 || iy0 as usize + span(win.kernel[0], win.dilation[0]) >= h {
            return (0, 0);
        }
        let lo = win.pads[1].div_ceil(win.stride[1]);
        let reach = w + win.pads[1];
        let last = span(win.kernel[1], win.dilation[1]);
        // ox·sx − pl + last ≤ w − 1.
        let hi = if reach > last { ((reach - last - 1) / win.stride[1] + 1).min(row.ow) } else { 0 };
        (lo, hi.max(lo))
    }

    /// Points `taps[t·stride + at]` at the pixel tap `t` of output `(row, ox)` reads, or at
    /// the zero row.
    #[inline(always)]
    fn taps(&self, row: &Row, ox: usize, taps: &mut [*const u8], stride: usize, at: usize) {
        let (x, c, win) = (row.x, self.c, &self.window);
        let [kh, kw] = win.kernel;
        let iy0 = (row.oy * win.stride[0]) as isize - win.pads[0] as isize;
        let ix0 = (ox * win.stride[1]) as isize - win.pads[1] as isize;
        let (dh, dw) = (win.dilation[0] as isize, win.dilation[1] as isize);
        let (h, w) = (x.h as isize, x.w as isize);
        let image = row.img * x.h * x.w;
        let (last_y, last_x) = (iy0 + (kh as isize - 1) * dh, ix0 + (kw as isize - 1) * dw);
        if iy0 >= 0 && ix0 >= 0 && last_y < h && last_x < w {
            // The whole window inside: one pixel's offset plus each tap's.
            let base = x.data[(image + (iy0 * w + ix0) as usize) * c..].as_ptr();
            for (t, &r) in row.rel.iter().enumerate() {
                // SAFETY: the tap's pixel is inside the input (checked above).
                taps[t * stride + at] = unsafe { base.add(r) };
            }
            return;
        }
        for ky in 0..kh {
            let iy = iy0 + ky as isize * dh;
            for kx in 0..kw {
                let ix = ix0 + kx as isize * dw;
                taps[(ky * kw + kx) * stride + at] = if iy >= 0 && iy < h && ix >= 0 && ix < w {
                    x.data[(image + (iy * w + ix) as usize) * c..].as_ptr()
                } else {
                    row.zrow.as_ptr()
                };
            }
        }
    }
}

/// One output row's place: the input, image, output row and width, and the zero row.
struct Row<'a> {
    x: &'a Nhwc<'a>,
    img: usize,
    oy: usize,
    ow: usize,
    zrow: &'a [u8],
    /// Each tap's byte offset from the window's first pixel.
    rel: &'a [usize],
}

/// [`Depthwise8::line`] with AVX-512: the pixels whose windows lie inside the input as runs
/// ([`interior_v4`]), the others one by one; sums by fused multiply-adds (exact: see the
/// module doc), the epilogue applied in registers ([`super::epilogue::Epi16`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn line_v4(k: &Depthwise8, row: &Row, taps: &mut [*const u8], res: &[u8], dst: &mut [u8]) {
    let c = k.c;
    assert!(dst.len() >= row.ow * c && (res.is_empty() || res.len() >= row.ow * c), "the line does not fit");
    let (Some(e), Some((qs, qb))) = (super::epilogue::Epi16::new(&k.ep), k.ep.grid_columns()) else { return };
    let nt = k.window.taps();
    let residual = !res.is_empty();
    // A pixel whose window leaves the input: its taps one by one (the padding's read the
    // zero row).
    let edge = |ox: usize, taps: &mut [*const u8], dst: &mut [u8]| {
        k.taps(row, ox, taps, 1, 0);
        let cx = Pixel { k, e: &e, qs, qb, ptrs: taps, ox, res };
        if residual {
            pixel_v4::<true>(&cx, dst)
        } else {
            pixel_v4::<false>(&cx, dst)
        }
    };
    let (lo, hi) = k.interior(row);
    let mut ox = 0;
    while ox < lo.min(row.ow) {
        edge(ox, taps, dst);
        ox += 1;
    }
    if lo < hi {
        // Whole windows inside the image: pixel `ox`'s taps are at fixed offsets from its
        // window's first pixel, one stride apart from pixel to pixel.
        let win = &k.window;
        let iy0 = row.oy * win.stride[0] - win.pads[0];
        let ix0 = ox * win.stride[1] - win.pads[1];
        let first = row.x.data[((row.img * row.x.h + iy0) * row.x.w + ix0) * c..].as_ptr();
        let run = Run { k, e: &e, qs, qb, first, step: win.stride[1] * c, rel: row.rel, ox, count: hi - ox, res };
        let rolled = win.kernel == [3, 3] && win.dilation == [1, 1];
        match (nt, residual, win.stride[1]) {
            (_, true, 1) if rolled => rolled_v4::<1, true>(&run, dst),
            (_, false, 1) if rolled => rolled_v4::<1, false>(&run, dst),
            (_, true, 2) if rolled => rolled_v4::<2, true>(&run, dst),
            (_, false, 2) if rolled => rolled_v4::<2, false>(&run, dst),
            (9, false, _) => interior_v4::<9, false>(&run, dst),
            (9, true, _) => interior_v4::<9, true>(&run, dst),
            (_, false, _) => interior_v4::<0, false>(&run, dst),
            (_, true, _) => interior_v4::<0, true>(&run, dst),
        }
        ox = hi;
    }
    while ox < row.ow {
        edge(ox, taps, dst);
        ox += 1;
    }
}

/// What [`interior_v4`] reads: `count` pixels from `ox` on whose windows are inside the
/// input, the first one's window starting at `first`, the next ones `step` bytes apart.
#[cfg(target_arch = "x86_64")]
struct Run<'a> {
    k: &'a Depthwise8,
    e: &'a super::epilogue::Epi16,
    qs: &'a [f32],
    qb: &'a [f32],
    first: *const u8,
    step: usize,
    rel: &'a [usize],
    ox: usize,
    count: usize,
    res: &'a [u8],
}

/// A run of inside pixels (`NT` taps when not 0; a residual when `RES`): per block of 16
/// channels, the taps' weights held in registers while the pixels pass.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn interior_v4<const NT: usize, const RES: bool>(r: &Run, dst: &mut [u8]) {
    use super::epilogue::lanes;
    use std::arch::x86_64::*;
    let k = r.k;
    let c = k.c;
    let nt = if NT > 0 { NT } else { r.rel.len() };
    let mut w = [_mm512_setzero_ps(); 32];
    for cb in (0..c).step_by(16) {
        let m = lanes(c - cb);
        let start = _mm512_maskz_loadu_ps(m, k.start.as_ptr().add(cb));
        let s = _mm512_maskz_loadu_ps(m, r.qs.as_ptr().add(cb));
        let b = _mm512_maskz_loadu_ps(m, r.qb.as_ptr().add(cb));
        let held = nt.min(w.len());
        for (t, wt) in w.iter_mut().enumerate().take(held) {
            *wt = _mm512_maskz_loadu_ps(m, k.w.as_ptr().add(t * c + cb));
        }
        for i in 0..r.count {
            // In bounds: every tap of these pixels is inside the input.
            let px = r.first.add(i * r.step + cb);
            let mut acc = start;
            for (t, &rel) in r.rel.iter().enumerate().take(nt) {
                let xb = _mm_maskz_loadu_epi8(m, px.add(rel) as *const i8);
                let wt = if t < held { w[t] } else { _mm512_maskz_loadu_ps(m, k.w.as_ptr().add(t * c + cb)) };
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(xb)), wt, acc);
            }
            store::<RES>(r.e, acc, s, b, m, r.res, dst, (r.ox + i) * c + cb);
        }
    }
}

/// [`interior_v4`] for 3×3 windows of horizontal stride `S` (1 or 2): along the run each
/// input column (three rows of 16 channels) is widened to f32 once and serves every pixel
/// whose window holds it (three, or two at stride 2), kept in registers from pixel to pixel.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn rolled_v4<const S: usize, const RES: bool>(r: &Run, dst: &mut [u8]) {
    use super::epilogue::lanes;
    use std::arch::x86_64::*;
    let k = r.k;
    let c = k.c;
    // The offsets of the window's three rows (taps 0, 3 and 6).
    let rows = [r.rel[0], r.rel[3], r.rel[6]];
    for cb in (0..c).step_by(16) {
        let m = lanes(c - cb);
        let start = _mm512_maskz_loadu_ps(m, k.start.as_ptr().add(cb));
        let s = _mm512_maskz_loadu_ps(m, r.qs.as_ptr().add(cb));
        let b = _mm512_maskz_loadu_ps(m, r.qb.as_ptr().add(cb));
        let w: [__m512; 9] = std::array::from_fn(|t| _mm512_maskz_loadu_ps(m, k.w.as_ptr().add(t * c + cb)));
        // In bounds: every window of the run is inside the input, so are its columns.
        let col = |j: usize, ky: usize| {
            let xb = _mm_maskz_loadu_epi8(m, r.first.add(j * c + rows[ky] + cb) as *const i8);
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(xb))
        };
        // Pixel i's window is columns S·i .. S·i + 2: the first (and at stride 1 the
        // second) is carried over from pixel i − 1.
        let mut a: [__m512; 3] = std::array::from_fn(|ky| col(0, ky));
        let mut bcol: [__m512; 3] = std::array::from_fn(|ky| col(1, ky));
        for i in 0..r.count {
            if S == 2 && i > 0 {
                bcol = std::array::from_fn(|ky| col(S * i + 1, ky));
            }
            let next: [__m512; 3] = std::array::from_fn(|ky| col(S * i + 2, ky));
            let mut acc = start;
            for ky in 0..3 {
                acc = _mm512_fmadd_ps(a[ky], w[ky * 3], acc);
                acc = _mm512_fmadd_ps(bcol[ky], w[ky * 3 + 1], acc);
                acc = _mm512_fmadd_ps(next[ky], w[ky * 3 + 2], acc);
            }
            if S == 1 {
                (a, bcol) = (bcol, next);
            } else {
                a = next;
            }
            store::<RES>(r.e, acc, s, b, m, r.res, dst, (r.ox + i) * c + cb);
        }
    }
}

/// What [`pixel_v4`] reads: `ptrs[t]` is the pixel's tap `t`.
#[cfg(target_arch = "x86_64")]
struct Pixel<'a> {
    k: &'a Depthwise8,
    e: &'a super::epilogue::Epi16,
    qs: &'a [f32],
    qb: &'a [f32],
    ptrs: &'a [*const u8],
    ox: usize,
    res: &'a [u8],
}

/// One pixel's output (a residual when `RES`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn pixel_v4<const RES: bool>(cx: &Pixel, dst: &mut [u8]) {
    use super::epilogue::lanes;
    use std::arch::x86_64::*;
    let (k, c) = (cx.k, cx.k.c);
    for cb in (0..c).step_by(16) {
        let m = lanes(c - cb);
        let mut acc = _mm512_maskz_loadu_ps(m, k.start.as_ptr().add(cb));
        for (t, &p) in cx.ptrs.iter().enumerate() {
            // In bounds: every tap points at `c` bytes, each tap's weights are `c` floats.
            let w = _mm512_maskz_loadu_ps(m, k.w.as_ptr().add(t * c + cb));
            let xb = _mm_maskz_loadu_epi8(m, p.add(cb) as *const i8);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(xb)), w, acc);
        }
        let s = _mm512_maskz_loadu_ps(m, cx.qs.as_ptr().add(cb));
        let b = _mm512_maskz_loadu_ps(m, cx.qb.as_ptr().add(cb));
        store::<RES>(cx.e, acc, s, b, m, cx.res, dst, cx.ox * c + cb);
    }
}

/// The epilogue of 16 channels' sums `acc` (scales `s`, biases `b`, lanes `m`) stored at
/// `dst[at..]`, the residual read at `res[at..]` when `RES`.
///
/// # Safety
/// The lanes of `m` lie inside `dst` (and `res`) from `at`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn store<const RES: bool>(
    e: &super::epilogue::Epi16,
    acc: std::arch::x86_64::__m512,
    s: std::arch::x86_64::__m512,
    b: std::arch::x86_64::__m512,
    m: u16,
    res: &[u8],
    dst: &mut [u8],
    at: usize,
) {
    use std::arch::x86_64::*;
    let rb = if RES { _mm_maskz_loadu_epi8(m, res.as_ptr().add(at) as *const i8) } else { _mm_setzero_si128() };
    super::epilogue::store16(dst.as_mut_ptr().add(at), m, e.apply(acc, s, b, rb));
}
