//! The end of every integer kernel that writes bytes: exact sums to f32, scaled, the bias
//! added, the activation applied, optionally a residual added (the `Add` of two quantized
//! values that the QDQ form writes after a convolution, fused), and the quantization to
//! bytes — on a row of at most a few hundred values that is still in cache, in a few
//! passes the compiler vectorises for the ISA.

use super::Q8;
use crate::gemm::{Activation, Isa};

/// A residual added to a kernel's result before it is quantized: the result first takes
/// its own quantization `mid` (the QuantizeLinear / DequantizeLinear pair the model puts
/// on it), then the dequantized residual (bytes of quantization `res`) is added and `act`
/// applied.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Residual8 {
    /// The result's own quantization before the addition.
    pub mid: Q8,
    /// The residual's quantization.
    pub res: Q8,
    /// The activation after the addition.
    pub act: Option<Activation>,
}

/// What a kernel's f32 result becomes: `act`, then the optional residual, then bytes of
/// quantization `q`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Out8 {
    /// The activation of the result.
    pub act: Option<Activation>,
    /// The residual addition, if fused.
    pub residual: Option<Residual8>,
    /// The output's quantization.
    pub q: Q8,
}

/// `dst = quantize(residual(act(v · scale + bias)))`: `v`, `scale`, `bias`, `dst` (and the
/// residual's bytes `res`, when `out` has one) are one row of the same length; `v` is
/// overwritten.
pub(crate) fn finish(isa: Isa, v: &mut [f32], scale: &[f32], bias: &[f32], out: &Out8, res: &[u8], dst: &mut [u8]) {
    use finish_inline as body;
    #[cfg(target_arch = "x86_64")]
    {
        use crate::gemm::IsaKind;
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
        unsafe fn v4(v: &mut [f32], s: &[f32], b: &[f32], o: &Out8, r: &[u8], d: &mut [u8]) {
            body(v, s, b, o, r, d)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(v: &mut [f32], s: &[f32], b: &[f32], o: &Out8, r: &[u8], d: &mut [u8]) {
            body(v, s, b, o, r, d)
        }
        // SAFETY: an `Isa` exists only for features this CPU has (AVX-512BW checked here:
        // every AVX-512 CPU with VNNI has it, but the family only promises F).
        match isa.kind() {
            IsaKind::Avx512 if std::arch::is_x86_feature_detected!("avx512bw") => {
                return unsafe { v4(v, scale, bias, out, res, dst) }
            }
            IsaKind::Avx512 | IsaKind::Avx2 => return unsafe { v3(v, scale, bias, out, res, dst) },
            _ => {}
        }
    }
    let _ = isa;
    body(v, scale, bias, out, res, dst)
}

/// [`finish`] without the dispatch, for kernels that call it from their own ISA-specific
/// code (inlined there, so it is compiled for their features).
#[inline(always)]
pub(crate) fn finish_inline(v: &mut [f32], scale: &[f32], bias: &[f32], out: &Out8, res: &[u8], dst: &mut [u8]) {
    let n = v.len();
    let (scale, bias, dst) = (&scale[..n], &bias[..n], &mut dst[..n]);
    for ((x, &s), &b) in v.iter_mut().zip(scale).zip(bias) {
        *x = *x * s + b;
    }
    activate(v, out.act);
    if let Some(r) = out.residual {
        let res = &res[..n];
        let (inv, z) = (1.0 / r.mid.scale, r.mid.zero as f32);
        let (sm, sr, zr) = (r.mid.scale, r.res.scale, r.res.zero as i32);
        for (x, &q) in v.iter_mut().zip(res) {
            // The result on its own grid (its QuantizeLinear, with the reciprocal), then
            // both dequantized and added.
            let m = requant(*x, inv, z) - z;
            *x = m * sm + (q as i32 - zr) as f32 * sr;
        }
        activate(v, r.act);
    }
    let (inv, z) = (1.0 / out.q.scale, out.q.zero as f32);
    for (d, &x) in dst.iter_mut().zip(v.iter()) {
        // SAFETY: in [0, 255] (NaN became 0): exactly representable.
        *d = unsafe { requant(x, inv, z).to_int_unchecked::<i32>() } as u8;
    }
}

/// QuantizeLinear with the reciprocal `inv` of the scale: `round(x · inv) + z` (ties to
/// even) clamped to [0, 255], NaN to 0.
#[inline(always)]
fn requant(x: f32, inv: f32, z: f32) -> f32 {
    super::byte_range((x * inv).round_ties_even() + z)
}

/// Applies `act` to every value (clamps as one vector loop, the rest per value).
#[inline(always)]
fn activate(v: &mut [f32], act: Option<Activation>) {
    let Some(a) = act else { return };
    match a.clamp_bounds() {
        Some((lo, hi)) => v.iter_mut().for_each(|x| *x = crate::gemm::clamp(*x, lo, hi)),
        None => v.iter_mut().for_each(|x| *x = a.apply(*x)),
    }
}

/// The per-column quantities of one tile's epilogue: the zero-point correction, scale and
/// bias of its columns.
pub(crate) struct Columns<'a> {
    pub(crate) corr: &'a [i32],
    pub(crate) scale: &'a [f32],
    pub(crate) bias: &'a [f32],
}

/// The epilogue of a whole tile of integer sums: rows `0..rows` of `acc`, columns
/// `0..cols.corr.len()`, written to `y` (row `r` at `y[r·ldy..]`), the residual read at the
/// same offsets of `res` (when `out` has one).
///
/// # Safety
/// `y` (and `res`) hold `(rows − 1)·ldy + cols` bytes; the columns are at most [`NR`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(
    fast: bool,
    isa: Isa,
    acc: &[[i32; crate::qgemm::NR]; crate::qgemm::MR],
    rows: usize,
    cols: &Columns,
    out: &Out8,
    res: *const u8,
    y: *mut u8,
    ldy: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        if let Some(e) = Epi16::new(out) {
            return tile_v4(acc, rows, cols, &e, out, res, y, ldy);
        }
    }
    let _ = fast;
    let n = cols.corr.len();
    let mut v = [0f32; crate::qgemm::NR];
    for (r, sums) in acc.iter().enumerate().take(rows) {
        for ((v, &s), &k) in v.iter_mut().zip(&sums[..n]).zip(cols.corr) {
            *v = s.wrapping_sub(k) as f32;
        }
        let dst = std::slice::from_raw_parts_mut(y.add(r * ldy), n);
        let rr = if out.residual.is_some() { std::slice::from_raw_parts(res.add(r * ldy), n) } else { &[][..] };
        finish(isa, &mut v[..n], cols.scale, cols.bias, out, rr, dst);
    }
}

/// Whether [`tile`]'s AVX-512 path runs on this CPU (F, BW and VL).
pub(crate) fn fast_tiles(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa.kind() == crate::gemm::IsaKind::Avx512
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// The epilogue's constants broadcast for AVX-512: the activations' bounds, the residual's
/// and the output's quantizations.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Epi16 {
    lo1: std::arch::x86_64::__m512,
    hi1: std::arch::x86_64::__m512,
    lo2: std::arch::x86_64::__m512,
    hi2: std::arch::x86_64::__m512,
    /// Reciprocal scale, zero point and scale of `mid`; the residual's zero point and scale.
    mid: Option<[std::arch::x86_64::__m512; 5]>,
    inv: std::arch::x86_64::__m512,
    z: std::arch::x86_64::__m512,
}

#[cfg(target_arch = "x86_64")]
impl Epi16 {
    /// The constants for `out`, when its activations are clamps (else the scalar path runs).
    #[target_feature(enable = "avx512f")]
    pub(crate) fn new(out: &Out8) -> Option<Epi16> {
        use std::arch::x86_64::*;
        let clamp = |a: Option<Activation>| match a {
            None => Some((f32::NEG_INFINITY, f32::INFINITY)),
            Some(a) => a.clamp_bounds(),
        };
        let a1 = clamp(out.act)?;
        let a2 = out.residual.map_or(Some((f32::NEG_INFINITY, f32::INFINITY)), |r| clamp(r.act))?;
        let mid = out.residual.map(|r| {
            [
                _mm512_set1_ps(1.0 / r.mid.scale),
                _mm512_set1_ps(r.mid.zero as f32),
                _mm512_set1_ps(r.mid.scale),
                _mm512_set1_ps(r.res.zero as f32),
                _mm512_set1_ps(r.res.scale),
            ]
        });
        Some(Epi16 {
            lo1: _mm512_set1_ps(a1.0),
            hi1: _mm512_set1_ps(a1.1),
            lo2: _mm512_set1_ps(a2.0),
            hi2: _mm512_set1_ps(a2.1),
            mid,
            inv: _mm512_set1_ps(1.0 / out.q.scale),
            z: _mm512_set1_ps(out.q.zero as f32),
        })
    }

    /// The output bytes (as i32 lanes) of 16 exact sums `v`: [`finish`]'s steps, bit for
    /// bit; `res` the residual's 16 bytes when there is one.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn apply(
        &self,
        v: std::arch::x86_64::__m512,
        scale: std::arch::x86_64::__m512,
        bias: std::arch::x86_64::__m512,
        res: std::arch::x86_64::__m128i,
    ) -> std::arch::x86_64::__m512i {
        use std::arch::x86_64::*;
        const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let quant = |v: __m512, inv: __m512, z: __m512| {
            let q = _mm512_add_ps(_mm512_roundscale_ps::<R>(_mm512_mul_ps(v, inv)), z);
            _mm512_min_ps(_mm512_max_ps(q, _mm512_setzero_ps()), _mm512_set1_ps(255.0))
        };
        let mut v = _mm512_add_ps(_mm512_mul_ps(v, scale), bias);
        v = _mm512_min_ps(_mm512_max_ps(v, self.lo1), self.hi1);
        if let Some([im, zm, sm, zr, sr]) = self.mid {
            let m = _mm512_sub_ps(quant(v, im, zm), zm);
            let rf = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(res)), zr);
            v = _mm512_add_ps(_mm512_mul_ps(m, sm), _mm512_mul_ps(rf, sr));
            v = _mm512_min_ps(_mm512_max_ps(v, self.lo2), self.hi2);
        }
        _mm512_cvtps_epi32(quant(v, self.inv, self.z))
    }
}

/// The mask of the first `k` (at most 16) lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn lanes(k: usize) -> u16 {
    if k >= 16 {
        0xFFFF
    } else {
        ((1u32 << k) - 1) as u16
    }
}

/// [`tile`] with AVX-512 for clamp-like activations: 16 columns at a time, each tile's
/// column quantities loaded once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_v4(
    acc: &[[i32; crate::qgemm::NR]; crate::qgemm::MR],
    rows: usize,
    cols: &Columns,
    e: &Epi16,
    out: &Out8,
    res: *const u8,
    y: *mut u8,
    ldy: usize,
) {
    use std::arch::x86_64::*;
    let n = cols.corr.len();
    let halves = n.div_ceil(16);
    let masks: [__mmask16; 2] = std::array::from_fn(|h| lanes(n.saturating_sub(16 * h)));
    let at = |h: usize| (16 * h).min(n);
    let corr: [__m512i; 2] = std::array::from_fn(|h| _mm512_maskz_loadu_epi32(masks[h], cols.corr.as_ptr().add(at(h))));
    let scale: [__m512; 2] = std::array::from_fn(|h| _mm512_maskz_loadu_ps(masks[h], cols.scale.as_ptr().add(at(h))));
    let bias: [__m512; 2] = std::array::from_fn(|h| _mm512_maskz_loadu_ps(masks[h], cols.bias.as_ptr().add(at(h))));
    for (r, sums) in acc.iter().enumerate().take(rows) {
        for h in 0..halves {
            let s = _mm512_loadu_si512(sums.as_ptr().add(16 * h) as *const _);
            let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, corr[h]));
            let rb = if out.residual.is_some() {
                _mm_maskz_loadu_epi8(masks[h], res.add(r * ldy + 16 * h) as *const i8)
            } else {
                _mm_setzero_si128()
            };
            let q = e.apply(v, scale[h], bias[h], rb);
            _mm512_mask_cvtepi32_storeu_epi8(y.add(r * ldy + 16 * h) as *mut i8, masks[h], q);
        }
    }
}
