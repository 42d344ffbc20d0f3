//! DynamicQuantizeLinear on f32: the per-run quantisation of activations that
//! `quantize_dynamic` models put before every integer matrix product. One pass finds the
//! range, one quantises; the arithmetic is the reference kernel's, step for step (the range
//! subtracted in f64 and rounded to f32, f32 divisions, ties to even), so the results are
//! identical.

use super::ops::Ctx;
use super::output::Output;
use crate::gemm::Isa;
#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;
use crate::util::Result;
use aim_ir::{DType, Node, Tensor};

pub(super) fn dynamic_quantize_linear(_n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref().filter(|t| t.dtype() == DType::F32)?;
    let v = x.data::<f32>();
    let (scale, zp) = dynamic_params(cx.isa, v);
    let mut y = match Output::new(cx.out, DType::U8, x.shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let dst = y.bytes_mut();
    if scale == 0.0 {
        dst.fill(zp as u8);
    } else {
        quantize(cx.isa, v, dst, scale, zp);
    }
    Some(Ok(vec![y.finish(), Tensor::scalar(scale), Tensor::from_bytes(DType::U8, &[], &[zp as u8]).ok()?]))
}

/// The u8 scale and zero point DynamicQuantizeLinear picks for `v`: its range widened to
/// hold 0, over 255 steps.
pub fn dynamic_params(isa: Isa, v: &[f32]) -> (f32, f32) {
    let (lo, hi) = range(isa, v);
    params_of_range(lo, hi)
}

/// The scale and zero point of [`dynamic_params`] for the range `(lo, hi)` (which holds 0).
pub fn params_of_range(lo: f32, hi: f32) -> (f32, f32) {
    let scale = ((hi as f64 - lo as f64) as f32) / 255.0;
    let zp = if scale == 0.0 { 0.0 } else { (0.0 - lo / scale).round_ties_even().clamp(0.0, 255.0) };
    (scale, zp)
}

/// DynamicQuantizeLinear of `v` with the zero point taken out: `dst = clamp(round(v /
/// scale) + zp, 0, 255) - zp` as f32 (whole numbers), returning the scale ([`dynamic_params`];
/// 0 for an all-zero `v`, whose `dst` is then zeros). A product of such values with
/// centered 8-bit weights sums whole numbers, exactly in f32 while the partial sums stay
/// below 2^24: the integer product ONNX Runtime's quantized kernels compute.
pub fn centered(isa: Isa, v: &[f32], dst: &mut [f32]) -> f32 {
    let (scale, zp) = dynamic_params(isa, v);
    if scale == 0.0 {
        dst.fill(0.0);
        return 0.0;
    }
    for (d, &a) in dst.iter_mut().zip(v) {
        let q = ((a / scale).round_ties_even() + zp).clamp(0.0, 255.0);
        // NaN becomes 0, as the conversion to u8 makes it.
        *d = if q.is_nan() { 0.0 } else { q } - zp;
    }
    scale
}

/// `dst = clamp(round(v / scale) + zp, 0, 255)`, vectorised for the ISA (rounding is one
/// instruction with SSE4.1 / AVX and NEON, a library call without).
pub fn quantize(isa: Isa, v: &[f32], dst: &mut [u8], scale: f32, zp: f32) {
    #[inline(always)]
    fn body(v: &[f32], dst: &mut [u8], scale: f32, zp: f32) {
        for (d, &a) in dst.iter_mut().zip(v) {
            // `as` saturates and sends NaN to 0, as the reference's conversion does.
            *d = ((a / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8;
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        /// 16 values at a time, the steps written out (the compiler's own vectorisation of
        /// the saturating conversion measured 2 cycles a value): divide, round to even,
        /// add, clamp (`max` first: it gives 0 for NaN, as the conversion does), narrow.
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(v: &[f32], dst: &mut [u8], scale: f32, zp: f32) {
            use std::arch::x86_64::*;
            let n = v.len().min(dst.len());
            let (s, z, lo, hi) =
                (_mm512_set1_ps(scale), _mm512_set1_ps(zp), _mm512_setzero_ps(), _mm512_set1_ps(255.0));
            let mut i = 0;
            while i + 16 <= n {
                let x = _mm512_loadu_ps(v.as_ptr().add(i));
                let q = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_div_ps(x, s));
                let q = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(q, z), lo), hi);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
                i += 16;
            }
            body(&v[i..n], &mut dst[i..n], scale, zp)
        }
        /// The same steps, 32 values at a time: four vectors narrowed to i32, packed to
        /// bytes (in lane order, which one permute puts back), one 32-byte store.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(v: &[f32], dst: &mut [u8], scale: f32, zp: f32) {
            use std::arch::x86_64::*;
            let n = v.len().min(dst.len());
            let (s, z, lo, hi) =
                (_mm256_set1_ps(scale), _mm256_set1_ps(zp), _mm256_setzero_ps(), _mm256_set1_ps(255.0));
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let mut i = 0;
            while i + 32 <= n {
                let q = |k: usize| {
                    let x = _mm256_loadu_ps(v.as_ptr().add(i + 8 * k));
                    let q = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_div_ps(x, s));
                    _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(q, z), lo), hi))
                };
                let (a, b) = (_mm256_packs_epi32(q(0), q(1)), _mm256_packs_epi32(q(2), q(3)));
                let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order);
                _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, bytes);
                i += 32;
            }
            body(&v[i..n], &mut dst[i..n], scale, zp)
        }
        // SAFETY: the ISA was checked available when the program was built.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(v, dst, scale, zp) },
            IsaKind::Avx2 => return unsafe { v3(v, dst, scale, zp) },
            IsaKind::Portable | IsaKind::Neon => {}
        }
    }
    let _ = isa;
    body(v, dst, scale, zp)
}

/// `(min(0, min v), max(0, max v))`, NaN ignored (as `f32::min` / `max` do), over 16
/// independent lanes so that the compiler vectorises it.
pub fn range(isa: Isa, v: &[f32]) -> (f32, f32) {
    #[inline(always)]
    fn body(v: &[f32]) -> (f32, f32) {
        let (mut lo, mut hi) = ([0.0f32; 16], [0.0f32; 16]);
        let chunks = v.chunks_exact(16);
        let tail = chunks.remainder();
        for c in chunks {
            for k in 0..16 {
                // A comparison that is false for NaN keeps the running value: `minps` /
                // `maxps` exactly, and `f32::min` / `max`'s result here (the running value
                // is never NaN).
                lo[k] = if c[k] < lo[k] { c[k] } else { lo[k] };
                hi[k] = if c[k] > hi[k] { c[k] } else { hi[k] };
            }
        }
        for &a in tail {
            lo[0] = lo[0].min(a);
            hi[0] = hi[0].max(a);
        }
        (lo.iter().fold(0.0f32, |a, &b| a.min(b)), hi.iter().fold(0.0f32, |a, &b| a.max(b)))
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(v: &[f32]) -> (f32, f32) {
            use std::arch::x86_64::*;
            // Four independent pairs of accumulators (`minps`/`maxps` keep the accumulator,
            // their second operand, when the value is NaN: NaN ignored, as in `body`).
            let mut lo = [_mm512_setzero_ps(); 4];
            let mut hi = [_mm512_setzero_ps(); 4];
            let chunks = v.chunks_exact(64);
            let tail = chunks.remainder();
            for c in chunks {
                for k in 0..4 {
                    let x = _mm512_loadu_ps(c.as_ptr().add(16 * k));
                    lo[k] = _mm512_min_ps(x, lo[k]);
                    hi[k] = _mm512_max_ps(x, hi[k]);
                }
            }
            let (l, h) = body(tail);
            let lo = _mm512_min_ps(_mm512_min_ps(lo[0], lo[1]), _mm512_min_ps(lo[2], lo[3]));
            let hi = _mm512_max_ps(_mm512_max_ps(hi[0], hi[1]), _mm512_max_ps(hi[2], hi[3]));
            (_mm512_reduce_min_ps(lo).min(l), _mm512_reduce_max_ps(hi).max(h))
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(v: &[f32]) -> (f32, f32) {
            use std::arch::x86_64::*;
            // As `v4`, eight lanes a vector.
            let mut lo = [_mm256_setzero_ps(); 4];
            let mut hi = [_mm256_setzero_ps(); 4];
            let chunks = v.chunks_exact(32);
            let tail = chunks.remainder();
            for c in chunks {
                for k in 0..4 {
                    let x = _mm256_loadu_ps(c.as_ptr().add(8 * k));
                    lo[k] = _mm256_min_ps(x, lo[k]);
                    hi[k] = _mm256_max_ps(x, hi[k]);
                }
            }
            let (l, h) = body(tail);
            let lo = _mm256_min_ps(_mm256_min_ps(lo[0], lo[1]), _mm256_min_ps(lo[2], lo[3]));
            let hi = _mm256_max_ps(_mm256_max_ps(hi[0], hi[1]), _mm256_max_ps(hi[2], hi[3]));
            let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
            _mm256_storeu_ps(a.as_mut_ptr(), lo);
            _mm256_storeu_ps(b.as_mut_ptr(), hi);
            (a.iter().fold(l, |x, &y| x.min(y)), b.iter().fold(h, |x, &y| x.max(y)))
        }
        // SAFETY: the ISA was checked available when the program was built.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(v) },
            IsaKind::Avx2 => return unsafe { v3(v) },
            IsaKind::Portable | IsaKind::Neon => {}
        }
    }
    let _ = isa;
    body(v)
}
