//! The byte epilogue with AVX2 (8 lanes): [`super::epilogue`]'s clamp steps applied in
//! registers, value for value what the scalar and AVX-512 paths compute, for CPUs without
//! AVX-512 (where the scalar loop cost the integer convolutions a tenth of their time).

#![cfg(target_arch = "x86_64")]

use super::epilogue::Epilogue8;
use crate::qgemm::{MR, NR};
use std::arch::x86_64::*;

/// [`super::epilogue::Clamped`]'s constants broadcast to 8 lanes.
#[derive(Clone, Copy)]
pub(crate) struct Epi8 {
    z1: __m256,
    lo1: __m256,
    hi1: __m256,
    res: Option<[__m256; 4]>,
    z2: __m256,
    lo2: __m256,
    hi2: __m256,
}

impl Epi8 {
    /// The broadcast constants of `e`'s clamp steps (`None` without them: other
    /// activations need the f32 value and take the scalar path).
    #[target_feature(enable = "avx2")]
    pub(crate) fn new(e: &Epilogue8) -> Option<Epi8> {
        let k = e.clamp_constants()?;
        let b = |v: f32| _mm256_set1_ps(v);
        Some(Epi8 {
            z1: b(k.z1),
            lo1: b(k.lo1),
            hi1: b(k.hi1),
            res: k.res.map(|r| r.map(b)),
            z2: b(k.z2),
            lo2: b(k.lo2),
            hi2: b(k.hi2),
        })
    }

    /// The output bytes (as i32 lanes) of 8 sums `v` scaled by `qs`, `qb` (the channels'
    /// scale and bias over the first grid's scale), `res` the residual's 8 bytes (low half)
    /// when there is one: `Clamped::value` per lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn apply(&self, v: __m256, qs: __m256, qb: __m256, res: __m128i) -> __m256i {
        const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        // Clamped (a NaN becomes the lower bound: `max` returns its second operand then),
        // rounded, then the zero point added.
        let q = _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(v, qs, qb), self.lo1), self.hi1);
        let q = _mm256_add_ps(_mm256_round_ps::<R>(q), self.z1);
        let Some([zm, a, b, zr]) = self.res else { return _mm256_cvtps_epi32(q) };
        let rf = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(res)), zr);
        let y = _mm256_fmadd_ps(_mm256_sub_ps(q, zm), a, _mm256_mul_ps(rf, b));
        let y = _mm256_add_ps(_mm256_round_ps::<R>(y), self.z2);
        _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(y, self.lo2), self.hi2))
    }
}

/// The 8 bytes of lanes each in [0, 255], in the low half.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn narrow(q: __m256i) -> __m128i {
    let w = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
    _mm_packus_epi16(w, w)
}

/// Stores the first `n` (at most 8) of 8 bytes.
///
/// # Safety
/// `dst` has `n` writable bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn store8(dst: *mut u8, n: usize, b: __m128i) {
    if n >= 8 {
        _mm_storel_epi64(dst as *mut __m128i, b);
    } else {
        let mut t = [0u8; 16];
        _mm_storeu_si128(t.as_mut_ptr() as *mut __m128i, b);
        std::ptr::copy_nonoverlapping(t.as_ptr(), dst, n);
    }
}

/// Loads the first `n` (at most 8) bytes into the low half, zeros after.
///
/// # Safety
/// `src` has `n` readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn load8(src: *const u8, n: usize) -> __m128i {
    if n >= 8 {
        _mm_loadl_epi64(src as *const __m128i)
    } else {
        let mut t = [0u8; 16];
        std::ptr::copy_nonoverlapping(src, t.as_mut_ptr(), n);
        _mm_loadu_si128(t.as_ptr() as *const __m128i)
    }
}

/// Loads the first `n` (at most 8) floats, zeros after.
///
/// # Safety
/// `src` has `n` readable floats.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn load8_ps(src: *const f32, n: usize) -> __m256 {
    if n >= 8 {
        _mm256_loadu_ps(src)
    } else {
        let mut t = [0f32; 8];
        std::ptr::copy_nonoverlapping(src, t.as_mut_ptr(), n);
        _mm256_loadu_ps(t.as_ptr())
    }
}

/// [`Epilogue8::tile`] with AVX2: 8 columns at a time, the tile's column quantities loaded
/// once. Returns false (having written nothing) where the epilogue has no clamp steps.
///
/// # Safety
/// As for [`Epilogue8::tile`]; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_v3(
    e: &Epilogue8,
    acc: &[[i32; NR]; MR],
    rows: usize,
    c0: usize,
    cols: usize,
    res: *const u8,
    y: *mut u8,
    ldy: usize,
) -> bool {
    let (Some(k), Some((qs, qb))) = (Epi8::new(e), e.grid_columns()) else { return false };
    let n = cols.min(NR);
    let chunks = n.div_ceil(8);
    let width = |h: usize| (n - 8 * h).min(8);
    let qs: [__m256; NR / 8] = std::array::from_fn(|h| {
        if h < chunks {
            load8_ps(qs.as_ptr().add(c0 + 8 * h), width(h))
        } else {
            _mm256_setzero_ps()
        }
    });
    let qb: [__m256; NR / 8] = std::array::from_fn(|h| {
        if h < chunks {
            load8_ps(qb.as_ptr().add(c0 + 8 * h), width(h))
        } else {
            _mm256_setzero_ps()
        }
    });
    let residual = e.out().residual.is_some();
    for (r, sums) in acc.iter().enumerate().take(rows) {
        for h in 0..chunks {
            let v = _mm256_cvtepi32_ps(_mm256_loadu_si256(sums.as_ptr().add(8 * h) as *const __m256i));
            let rb = if residual { load8(res.add(r * ldy + 8 * h), width(h)) } else { _mm_setzero_si128() };
            store8(y.add(r * ldy + 8 * h), width(h), narrow(k.apply(v, qs[h], qb[h], rb)));
        }
    }
    true
}
