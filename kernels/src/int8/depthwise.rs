//! Quantized depthwise convolution, bytes NHWC in and out: per output pixel, each channel
//! sums its taps `(x − zx) · w` across the pixel's channels as one vector loop.
//!
//! The sums are integers computed in f32: each product is an integer of magnitude at most
//! 255 · 128 and there are at most [`MAX_TAPS`] of them, so every partial sum is below 2²⁴
//! and exact — the integer sum, without the widening steps an i32 accumulator needs for
//! byte operands. The epilogue is the one every byte-writing kernel shares.

use super::epilogue::finish_inline;
use super::{Nhwc, Out8, SharedMut, Weights8, Window, Q8};
use crate::gemm::{Isa, Parallel};

/// Taps per window up to which the f32 sums are exact (514 · 255 · 128 < 2²⁴).
pub const MAX_TAPS: usize = 514;

/// A depthwise convolution prepared for [`Depthwise8::run`].
#[derive(Clone, Debug)]
pub struct Depthwise8 {
    c: usize,
    window: Window,
    /// Per tap, one weight per channel (the s8 values, as f32).
    w: Vec<f32>,
    x_zero: f32,
    /// Input scale × weight scale, per channel.
    scale: Vec<f32>,
    bias: Vec<f32>,
    out: Out8,
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
        for ch in 0..c {
            for t in 0..taps {
                wt[t * c + ch] = w[ch * taps + t] as i8 as f32;
            }
        }
        let scale = (0..c).map(|o| x.scale * w_scale[if w_scale.len() == 1 { 0 } else { o }]).collect();
        let bias = bias.map_or_else(|| vec![0.0; c], |b| b.to_vec());
        Ok(Depthwise8 { c, window, w: wt, x_zero: x.zero as f32, scale, bias, out })
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
        &self.out
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
        assert_eq!(res.is_some(), self.out.residual.is_some(), "a residual exactly when the epilogue adds one");
        if let Some(r) = res {
            assert!(r.len() >= out_len, "the residual is too small");
        }
        let lines = x.n * oh;
        let per = lines.div_ceil(par.threads() * 4).max(1);
        let yp = SharedMut(y.as_mut_ptr());
        par.for_each(lines.div_ceil(per), &|t| {
            let yp = yp;
            let mut acc = vec![0f32; c];
            for line in t * per..((t + 1) * per).min(lines) {
                let at = line * ow * c;
                // SAFETY: inside `y` (checked above); tasks write disjoint lines.
                let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(at), ow * c) };
                let res = res.map_or(&[][..], |r| &r[at..at + ow * c]);
                self.line(isa, x, line / oh, line % oh, ow, &mut acc, res, dst);
            }
        });
    }

    /// One output row: `dst` (and the residual `res`, when there is one) its `ow · c`
    /// bytes; one dispatch on the ISA for the whole row.
    #[allow(clippy::too_many_arguments)]
    fn line(&self, isa: Isa, x: &Nhwc, img: usize, oy: usize, ow: usize, acc: &mut [f32], res: &[u8], dst: &mut [u8]) {
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        fn body(
            k: &Depthwise8,
            x: &Nhwc,
            img: usize,
            oy: usize,
            ow: usize,
            acc: &mut [f32],
            res: &[u8],
            dst: &mut [u8],
        ) {
            let (c, [kh, kw]) = (k.c, k.window.kernel);
            for ox in 0..ow {
                acc.fill(0.0);
                for ky in 0..kh {
                    for kx in 0..kw {
                        if let Some((iy, ix)) = k.window.source(oy, ox, ky, kx, x.h, x.w) {
                            let at = ((img * x.h + iy) * x.w + ix) * c;
                            let t = ky * kw + kx;
                            let (xs, ws) = (&x.data[at..at + c], &k.w[t * c..(t + 1) * c]);
                            for ((a, &v), &w) in acc.iter_mut().zip(xs).zip(ws) {
                                *a += (v as f32 - k.x_zero) * w;
                            }
                        }
                    }
                }
                let r = if res.is_empty() { res } else { &res[ox * c..(ox + 1) * c] };
                finish_inline(acc, &k.scale, &k.bias, &k.out, r, &mut dst[ox * c..(ox + 1) * c]);
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::gemm::IsaKind;
            if crate::int8::epilogue::fast_tiles(isa) {
                // SAFETY: AVX-512 F, BW and VL checked.
                if let Some(e) = unsafe { super::epilogue::Epi16::new(&self.out) } {
                    return unsafe { line_v4(self, &e, x, img, oy, ow, res, dst) };
                }
            }
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn v4(
                k: &Depthwise8,
                x: &Nhwc,
                img: usize,
                oy: usize,
                ow: usize,
                a: &mut [f32],
                r: &[u8],
                d: &mut [u8],
            ) {
                body(k, x, img, oy, ow, a, r, d)
            }
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn v3(
                k: &Depthwise8,
                x: &Nhwc,
                img: usize,
                oy: usize,
                ow: usize,
                a: &mut [f32],
                r: &[u8],
                d: &mut [u8],
            ) {
                body(k, x, img, oy, ow, a, r, d)
            }
            // SAFETY: an `Isa` exists only for features this CPU has (BW checked here).
            match isa.kind() {
                IsaKind::Avx512 if std::arch::is_x86_feature_detected!("avx512bw") => {
                    return unsafe { v4(self, x, img, oy, ow, acc, res, dst) }
                }
                IsaKind::Avx512 | IsaKind::Avx2 => return unsafe { v3(self, x, img, oy, ow, acc, res, dst) },
                _ => {}
            }
        }
        let _ = isa;
        body(self, x, img, oy, ow, acc, res, dst)
    }
}

/// [`Depthwise8::line`] with AVX-512: per pixel and block of 16 channels, the taps summed in
/// one register and the epilogue applied there ([`super::epilogue::Epi16`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn line_v4(
    k: &Depthwise8,
    e: &super::epilogue::Epi16,
    x: &Nhwc,
    img: usize,
    oy: usize,
    ow: usize,
    res: &[u8],
    dst: &mut [u8],
) {
    use super::epilogue::lanes;
    use std::arch::x86_64::*;
    let (c, [kh, kw]) = (k.c, k.window.kernel);
    assert!(dst.len() >= ow * c && (res.is_empty() || res.len() >= ow * c), "the line does not fit");
    let zx = _mm512_set1_ps(k.x_zero);
    // Per tap inside the input: the offsets of its pixel and of its weights.
    let mut taps: Vec<(usize, usize)> = Vec::with_capacity(kh * kw);
    for ox in 0..ow {
        taps.clear();
        for ky in 0..kh {
            for kx in 0..kw {
                if let Some((iy, ix)) = k.window.source(oy, ox, ky, kx, x.h, x.w) {
                    taps.push((((img * x.h + iy) * x.w + ix) * c, (ky * kw + kx) * c));
                }
            }
        }
        for cb in (0..c).step_by(16) {
            let m = lanes(c - cb);
            let mut acc = _mm512_setzero_ps();
            for &(xo, wo) in &taps {
                // In bounds: a pixel of the input and a tap's weights hold `c` values.
                let xb = _mm_maskz_loadu_epi8(m, x.data.as_ptr().add(xo + cb) as *const i8);
                let xv = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(xb)), zx);
                let wv = _mm512_maskz_loadu_ps(m, k.w.as_ptr().add(wo + cb));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(xv, wv));
            }
            let scale = _mm512_maskz_loadu_ps(m, k.scale.as_ptr().add(cb));
            let bias = _mm512_maskz_loadu_ps(m, k.bias.as_ptr().add(cb));
            let rb = if res.is_empty() {
                _mm_setzero_si128()
            } else {
                _mm_maskz_loadu_epi8(m, res.as_ptr().add(ox * c + cb) as *const i8)
            };
            let q = e.apply(acc, scale, bias, rb);
            _mm512_mask_cvtepi32_storeu_epi8(dst.as_mut_ptr().add(ox * c + cb) as *mut i8, m, q);
        }
    }
}
