//! The end of every integer kernel that writes bytes: exact sums to f32, scaled, the bias
//! added, the activation applied, optionally a residual added (the `Add` of two quantized
//! values that the QDQ form writes after a convolution, fused), and the quantization to
//! bytes.
//!
//! Where the activations are clamps (none, Relu, Clip: what quantized CNNs use) the steps
//! run in the output's quantized units, as integer kernels do: one fused multiply-add per
//! value by `scale / s_out` and `bias / s_out`, one clamp that is both the activation's
//! bounds (rounded to the grid: rounding is monotonic) and the byte range less `z_out`, a
//! rounding (ties to even; clamping first to integer bounds gives the same bytes), and
//! `z_out` added to the whole number. The zero point comes after the rounding, as in
//! QuantizeLinear and ONNX Runtime's requantization: added before, it rounds the value
//! once more in f32 (15.499998 + 128 is 143.5, which then rounds to 144, not 143). With a residual, the result first takes its own grid
//! (`mid`), then `(q − z_mid) · s_mid / s_out + (r − z_res) · s_res / s_out` is rounded the
//! same way. Other activations need the f32 value: there the steps are the graph's own
//! (scale, bias, activation, then QuantizeLinear by the reciprocal of the scale). The
//! AVX-512 path computes exactly what the scalar one does.

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

/// The clamp steps' constants (see the module doc): the first grid's zero point and byte
/// bounds less it, and with a residual its coefficients and the output grid's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Clamped {
    pub(super) z1: f32,
    pub(super) lo1: f32,
    pub(super) hi1: f32,
    /// `z_mid`, `s_mid / s_out`, `s_res / s_out`, `z_res`.
    pub(super) res: Option<[f32; 4]>,
    pub(super) z2: f32,
    pub(super) lo2: f32,
    pub(super) hi2: f32,
}

impl Clamped {
    /// The constants for `out`, when its activations are clamps.
    fn new(out: &Out8) -> Option<Clamped> {
        let bounds = |a: Option<Activation>, q: Q8| -> Option<(f32, f32)> {
            let (lo, hi) = a.map_or(Some((f32::NEG_INFINITY, f32::INFINITY)), |a| a.clamp_bounds())?;
            let z = q.zero as f32;
            let grid = |v: f32| (v / q.scale).round_ties_even() + z;
            Some((grid(lo).max(0.0), grid(hi).min(255.0)))
        };
        let first = out.residual.map_or(out.q, |r| r.mid);
        let (lo1, hi1) = bounds(out.act, first)?;
        let (res, (lo2, hi2)) = match out.residual {
            Some(r) => {
                let k = [r.mid.zero as f32, r.mid.scale / out.q.scale, r.res.scale / out.q.scale, r.res.zero as f32];
                (Some(k), bounds(r.act, out.q)?)
            }
            None => (None, (lo1, hi1)),
        };
        let z1 = first.zero as f32;
        Some(Clamped { z1, lo1: lo1 - z1, hi1: hi1 - z1, res, z2: out.q.zero as f32, lo2, hi2 })
    }

    /// One value: `y` the sum already scaled to the first grid, `r` the residual's byte.
    /// Clamped, then rounded, then the zero point added: the bounds are integers, so this is
    /// the rounding clamped (and a NaN becomes the lower bound).
    #[inline(always)]
    fn value(&self, y: f32, r: u8) -> f32 {
        let q = y.max(self.lo1).min(self.hi1).round_ties_even() + self.z1;
        match self.res {
            Some([zm, a, b, zr]) => {
                let y = (q - zm).mul_add(a, (r as f32 - zr) * b);
                (y.round_ties_even() + self.z2).max(self.lo2).min(self.hi2)
            }
            None => q,
        }
    }
}

/// A kernel's epilogue, prepared with its per-channel quantities.
#[derive(Clone, Debug)]
pub(crate) struct Epilogue8 {
    out: Out8,
    /// Per channel: the product's scale and the bias.
    scale: Vec<f32>,
    bias: Vec<f32>,
    /// With clamps: the scale and bias divided by the first grid's scale.
    clamped: Option<(Clamped, Vec<f32>, Vec<f32>)>,
}

impl Epilogue8 {
    /// The epilogue of `out` for channels of product scale `scale` and bias `bias`.
    pub(crate) fn new(out: Out8, scale: Vec<f32>, bias: Vec<f32>) -> Epilogue8 {
        let clamped = Clamped::new(&out).map(|c| {
            let s1 = out.residual.map_or(out.q.scale, |r| r.mid.scale);
            (c, scale.iter().map(|s| s / s1).collect(), bias.iter().map(|b| b / s1).collect())
        });
        Epilogue8 { out, scale, bias, clamped }
    }

    /// With clamps, each channel's scale and bias over the first grid's scale.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn grid_columns(&self) -> Option<(&[f32], &[f32])> {
        self.clamped.as_ref().map(|(_, s, b)| (s.as_slice(), b.as_slice()))
    }

    /// The clamp steps' constants, where the activations are clamps.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn clamp_constants(&self) -> Option<&Clamped> {
        self.clamped.as_ref().map(|(c, _, _)| c)
    }

    /// What the result becomes.
    pub(crate) fn out(&self) -> &Out8 {
        &self.out
    }

    /// Whether [`Epilogue8::tile`] and [`Epilogue8::row`] take the AVX-512 path on this CPU.
    pub(crate) fn fast(&self, isa: Isa) -> bool {
        self.clamped.is_some() && fast_tiles(isa)
    }

    /// `dst = epilogue(v)` for channels `c0..c0 + v.len()` (`v` the exact sums as f32, `res`
    /// the residual's bytes when there is one); `v` is overwritten.
    #[inline(always)]
    pub(crate) fn row(&self, v: &mut [f32], c0: usize, res: &[u8], dst: &mut [u8]) {
        let n = v.len();
        let dst = &mut dst[..n];
        if let Some((k, qs, qb)) = &self.clamped {
            let (qs, qb) = (&qs[c0..c0 + n], &qb[c0..c0 + n]);
            if self.out.residual.is_some() {
                for ((((d, &x), &s), &b), &r) in dst.iter_mut().zip(v.iter()).zip(qs).zip(qb).zip(&res[..n]) {
                    // SAFETY: in [0, 255]: exactly representable.
                    *d = unsafe { k.value(x.mul_add(s, b), r).to_int_unchecked::<i32>() } as u8;
                }
            } else {
                for (((d, &x), &s), &b) in dst.iter_mut().zip(v.iter()).zip(qs).zip(qb) {
                    // SAFETY: as above.
                    *d = unsafe { k.value(x.mul_add(s, b), 0).to_int_unchecked::<i32>() } as u8;
                }
            }
            return;
        }
        let (scale, bias) = (&self.scale[c0..c0 + n], &self.bias[c0..c0 + n]);
        for ((x, &s), &b) in v.iter_mut().zip(scale).zip(bias) {
            *x = *x * s + b;
        }
        activate(v, self.out.act);
        if let Some(r) = self.out.residual {
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
        let (inv, z) = (1.0 / self.out.q.scale, self.out.q.zero as f32);
        for (d, &x) in dst.iter_mut().zip(v.iter()) {
            // SAFETY: in [0, 255] (NaN became 0): exactly representable.
            *d = unsafe { requant(x, inv, z).to_int_unchecked::<i32>() } as u8;
        }
    }

    /// [`Epilogue8::row`] compiled for the ISA (one dispatch per call).
    pub(crate) fn row_for(&self, isa: Isa, v: &mut [f32], c0: usize, res: &[u8], dst: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::gemm::IsaKind;
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
            unsafe fn v4(e: &Epilogue8, v: &mut [f32], c0: usize, r: &[u8], d: &mut [u8]) {
                e.row(v, c0, r, d)
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3(e: &Epilogue8, v: &mut [f32], c0: usize, r: &[u8], d: &mut [u8]) {
                e.row(v, c0, r, d)
            }
            // SAFETY: an `Isa` exists only for features this CPU has (BW checked here).
            match isa.kind() {
                IsaKind::Avx512 if std::arch::is_x86_feature_detected!("avx512bw") => {
                    return unsafe { v4(self, v, c0, res, dst) }
                }
                IsaKind::Avx512 | IsaKind::Avx2 => return unsafe { v3(self, v, c0, res, dst) },
                _ => {}
            }
        }
        let _ = isa;
        self.row(v, c0, res, dst)
    }

    /// The epilogue of a whole tile of integer sums (the zero points already taken out):
    /// rows `0..rows` of `acc`, columns `c0..c0 + cols`, row `r` written to `y[r·ldy..]` and
    /// its residual read at the same offset of `res`.
    ///
    /// # Safety
    /// `y` (and `res`, when the epilogue has a residual) hold `(rows − 1)·ldy + cols` bytes;
    /// at most [`crate::qgemm::NR`] columns; `fast` only where [`Epilogue8::fast`] holds.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn tile(
        &self,
        fast: bool,
        isa: Isa,
        acc: &[[i32; crate::qgemm::NR]; crate::qgemm::MR],
        rows: usize,
        c0: usize,
        cols: usize,
        res: *const u8,
        y: *mut u8,
        ldy: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            if fast {
                return tile_v4(self, acc, rows, c0, cols, res, y, ldy);
            }
            if crate::qgemm::use_avx2(isa) && super::epilogue_avx2::tile_v3(self, acc, rows, c0, cols, res, y, ldy) {
                return;
            }
        }
        let _ = fast;
        let n = cols;
        let mut v = [0f32; crate::qgemm::NR];
        for (r, sums) in acc.iter().enumerate().take(rows) {
            for (v, &s) in v.iter_mut().zip(&sums[..n]) {
                *v = s as f32;
            }
            let dst = std::slice::from_raw_parts_mut(y.add(r * ldy), n);
            let rr =
                if self.out.residual.is_some() { std::slice::from_raw_parts(res.add(r * ldy), n) } else { &[][..] };
            self.row_for(isa, &mut v[..n], c0, rr, dst);
        }
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

/// Whether the AVX-512 epilogues run on this CPU (F, BW and VL).
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

/// [`Clamped`] broadcast for AVX-512.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Epi16 {
    z1: std::arch::x86_64::__m512,
    lo1: std::arch::x86_64::__m512,
    hi1: std::arch::x86_64::__m512,
    res: Option<[std::arch::x86_64::__m512; 4]>,
    z2: std::arch::x86_64::__m512,
    lo2: std::arch::x86_64::__m512,
    hi2: std::arch::x86_64::__m512,
}

#[cfg(target_arch = "x86_64")]
impl Epi16 {
    /// The broadcast constants of `e`'s clamp steps (`None` without them).
    #[target_feature(enable = "avx512f")]
    pub(crate) fn new(e: &Epilogue8) -> Option<Epi16> {
        use std::arch::x86_64::*;
        let (k, _, _) = e.clamped.as_ref()?;
        let b = |v: f32| _mm512_set1_ps(v);
        Some(Epi16 {
            z1: b(k.z1),
            lo1: b(k.lo1),
            hi1: b(k.hi1),
            res: k.res.map(|r| r.map(b)),
            z2: b(k.z2),
            lo2: b(k.lo2),
            hi2: b(k.hi2),
        })
    }

    /// The output bytes (as i32 lanes) of 16 sums `v` scaled by `qs`, `qb` (the channels'
    /// scale and bias over the first grid's scale): [`Clamped::value`] per lane; `res` the
    /// residual's 16 bytes when there is one.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    pub(crate) fn apply(
        &self,
        v: std::arch::x86_64::__m512,
        qs: std::arch::x86_64::__m512,
        qb: std::arch::x86_64::__m512,
        res: std::arch::x86_64::__m128i,
    ) -> std::arch::x86_64::__m512i {
        use std::arch::x86_64::*;
        const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let grid = |y: __m512, z: __m512, lo: __m512, hi: __m512| {
            _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(_mm512_roundscale_ps::<R>(y), z), lo), hi)
        };
        // Clamped, rounded (the bounds are integers; a NaN becomes the lower bound), then
        // the zero point added.
        let q = _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(v, qs, qb), self.lo1), self.hi1);
        let q = _mm512_add_ps(_mm512_roundscale_ps::<R>(q), self.z1);
        let Some([zm, a, b, zr]) = self.res else { return _mm512_cvtps_epi32(q) };
        let rf = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(res)), zr);
        let y = _mm512_fmadd_ps(_mm512_sub_ps(q, zm), a, _mm512_mul_ps(rf, b));
        _mm512_cvt_roundps_epi32::<R>(grid(y, self.z2, self.lo2, self.hi2))
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

/// Stores the low bytes of 16 lanes (each in [0, 255]) under a mask: narrowed in a register
/// and stored whole where the mask is full (the narrowing store to memory is slower).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn store16(dst: *mut u8, mask: u16, q: std::arch::x86_64::__m512i) {
    use std::arch::x86_64::*;
    let b = _mm512_cvtepi32_epi8(q);
    if mask == 0xFFFF {
        _mm_storeu_si128(dst as *mut __m128i, b);
    } else {
        _mm_mask_storeu_epi8(dst as *mut i8, mask, b);
    }
}

/// [`Epilogue8::tile`] with AVX-512: 16 columns at a time, the tile's column quantities
/// loaded once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_v4(
    e: &Epilogue8,
    acc: &[[i32; crate::qgemm::NR]; crate::qgemm::MR],
    rows: usize,
    c0: usize,
    cols: usize,
    res: *const u8,
    y: *mut u8,
    ldy: usize,
) {
    use std::arch::x86_64::*;
    let (Some(k), Some((_, qs, qb))) = (Epi16::new(e), e.clamped.as_ref()) else { return };
    let n = cols;
    let halves = n.div_ceil(16);
    let masks: [__mmask16; 2] = std::array::from_fn(|h| lanes(n.saturating_sub(16 * h)));
    let at = |h: usize| (16 * h).min(n);
    let qs: [__m512; 2] = std::array::from_fn(|h| _mm512_maskz_loadu_ps(masks[h], qs.as_ptr().add(c0 + at(h))));
    let qb: [__m512; 2] = std::array::from_fn(|h| _mm512_maskz_loadu_ps(masks[h], qb.as_ptr().add(c0 + at(h))));
    let residual = e.out.residual.is_some();
    for (r, sums) in acc.iter().enumerate().take(rows) {
        for h in 0..halves {
            let s = _mm512_loadu_si512(sums.as_ptr().add(16 * h) as *const _);
            let v = _mm512_cvtepi32_ps(s);
            let rb = if residual {
                _mm_maskz_loadu_epi8(masks[h], res.add(r * ldy + 16 * h) as *const i8)
            } else {
                _mm_setzero_si128()
            };
            let q = k.apply(v, qs[h], qb[h], rb);
            store16(y.add(r * ldy + 16 * h), masks[h], q);
        }
    }
}
