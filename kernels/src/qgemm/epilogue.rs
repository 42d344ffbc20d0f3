//! The integer GEMM's epilogue: one tile's exact sums back to f32 (zero-point terms
//! subtracted, scaled, bias added, clamped or activated), written to the output.
//!
//! A tile of a whole panel (every tile but a layer's last) takes [`FullPanel`], whose
//! column operands are taken once per tile and, on x86, whose rows are written with
//! intrinsics: the compiler's vectorisation of the same loops, called once per row, kept
//! the row in a stack array written and re-read in pieces (store-forwarding stalls) and
//! added the bias lane by lane; for a product of depth 64 (an attention head's Q·Kᵀ) that
//! epilogue took two thirds of the time.

use crate::gemm::Isa;
#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;

use super::{QEpilogue, TileOut, NR};

/// The zero-point terms of one tile: `Σ(a − za)(b − zb) = Σab − za·Σb − zb·row`, with
/// `row = Σa − k·za` for each of its rows. Taken per tile from the packed column sums, so that a call
/// (a recurrent step's GEMV is one every few microseconds) allocates nothing.
pub(super) struct Zeros<'a> {
    /// The activations' zero point.
    pub a: i32,
    /// The tile's columns' Σb.
    pub colsum: &'a [i32],
    /// The tile's columns' zero points.
    pub b: &'a [i32],
    /// `Σa − k·za` of each row.
    pub rows: &'a [i32],
}

/// One tile's sums (a row of [`NR`] per tile row) to f32, into `out` (vectorised for
/// the ISA: the loop is as long as the depth's quarter for a tile, so a scalar epilogue
/// would cost as much as the products).
pub(super) fn epilogue(isa: Isa, sums: &[[i32; NR]], zeros: &Zeros, ep: &QEpilogue, j0: usize, out: &mut TileOut) {
    assert_eq!(sums.len(), zeros.rows.len(), "one zero-point term per row");
    if let Some(full) = FullPanel::new(zeros, ep, j0) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Isa` exists only for features this CPU has.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { full.avx512(sums, zeros.rows, out) },
            IsaKind::Avx2 => return unsafe { full.avx2(sums, zeros.rows, out) },
            _ => {}
        }
        return full.portable(sums, zeros.rows, out);
    }
    #[inline(always)]
    fn each(sums: &[[i32; NR]], z: &Zeros, ep: &QEpilogue, j0: usize, out: &mut TileOut) {
        for (r, (s, &row)) in sums.iter().zip(z.rows).enumerate() {
            partial(s, z, row, ep, j0, out.row(r));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(s: &[[i32; NR]], z: &Zeros, ep: &QEpilogue, j0: usize, out: &mut TileOut) {
            each(s, z, ep, j0, out)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(s: &[[i32; NR]], z: &Zeros, ep: &QEpilogue, j0: usize, out: &mut TileOut) {
            each(s, z, ep, j0, out)
        }
        // SAFETY: an `Isa` exists only for features this CPU has.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(sums, zeros, ep, j0, out) },
            IsaKind::Avx2 => return unsafe { v3(sums, zeros, ep, j0, out) },
            _ => {}
        }
    }
    let _ = isa;
    each(sums, zeros, ep, j0, out)
}

/// The scale of a whole panel's columns.
#[derive(Clone, Copy)]
enum Scale<'a> {
    One(f32),
    Cols(&'a [f32; NR]),
}

/// A tile of a whole panel (`NR` columns) whose activation is a clamp (or none): the
/// column operands, taken once per tile, of constant length, so that each form below is
/// straight-line vector code per row. Every form computes `((Σab − za·Σb − zb·row) as f32 · s) + bias`, then
/// the clamp, in that order and rounding (no fused multiply-add), so that all give the
/// values of [`partial`] exactly.
struct FullPanel<'a> {
    colsum: &'a [i32; NR],
    zb: &'a [i32; NR],
    za: i32,
    scale: Scale<'a>,
    bias: Option<&'a [f32; NR]>,
    lo: f32,
    hi: f32,
}

impl<'a> FullPanel<'a> {
    /// The tile's column operands, or None where the panel is partial or the activation
    /// is not a clamp.
    fn new(zeros: &Zeros<'a>, ep: &QEpilogue<'a>, j0: usize) -> Option<FullPanel<'a>> {
        let colsum = <&[i32; NR]>::try_from(zeros.colsum).ok()?;
        let zb = <&[i32; NR]>::try_from(zeros.b).ok()?;
        let (lo, hi) = match ep.act.map(|a| a.clamp_bounds()) {
            None => (f32::NEG_INFINITY, f32::INFINITY),
            Some(b) => b?,
        };
        let scale = match ep.scale {
            [s] => Scale::One(*s),
            s => Scale::Cols(s.get(j0..)?.first_chunk::<NR>()?),
        };
        let bias = match ep.bias {
            Some(b) => Some(b.get(j0..)?.first_chunk::<NR>()?),
            None => None,
        };
        Some(FullPanel { colsum, zb, za: zeros.a, scale, bias, lo, hi })
    }

    /// The tile where no x86 form applies (vectorised by the compiler).
    fn portable(&self, sums: &[[i32; NR]], rows: &[i32], out: &mut TileOut) {
        for (r, (sums, &row)) in sums.iter().zip(rows).enumerate() {
            let mut v = [0f32; NR];
            for j in 0..NR {
                v[j] = sums[j]
                    .wrapping_sub(self.za.wrapping_mul(self.colsum[j]))
                    .wrapping_sub(self.zb[j].wrapping_mul(row)) as f32;
            }
            match self.scale {
                Scale::One(s) => v.iter_mut().for_each(|x| *x *= s),
                Scale::Cols(s) => v.iter_mut().zip(s).for_each(|(x, s)| *x *= s),
            }
            if let Some(b) = self.bias {
                v.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            }
            for (d, x) in out.row(r).iter_mut().zip(v) {
                *d = crate::gemm::clamp(x, self.lo, self.hi);
            }
        }
    }

    /// The tile, each row in two 16-lane vectors.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(&self, sums: &[[i32; NR]], rows: &[i32], out: &mut TileOut) {
        use std::arch::x86_64::*;
        let za = _mm512_set1_epi32(self.za);
        let (lo, hi) = (_mm512_set1_ps(self.lo), _mm512_set1_ps(self.hi));
        for (r, (sums, &row)) in sums.iter().zip(rows).enumerate() {
            let (row, dst) = (_mm512_set1_epi32(row), out.row(r));
            assert_eq!(dst.len(), NR, "a whole panel's row");
            for o in [0, 16] {
                let s = _mm512_loadu_si512(sums.as_ptr().add(o) as *const _);
                let c = _mm512_loadu_si512(self.colsum.as_ptr().add(o) as *const _);
                let z = _mm512_loadu_si512(self.zb.as_ptr().add(o) as *const _);
                let v = _mm512_sub_epi32(_mm512_sub_epi32(s, _mm512_mullo_epi32(za, c)), _mm512_mullo_epi32(z, row));
                let mut x = _mm512_cvtepi32_ps(v);
                x = match self.scale {
                    Scale::One(s) => _mm512_mul_ps(x, _mm512_set1_ps(s)),
                    Scale::Cols(s) => _mm512_mul_ps(x, _mm512_loadu_ps(s.as_ptr().add(o))),
                };
                if let Some(b) = self.bias {
                    x = _mm512_add_ps(x, _mm512_loadu_ps(b.as_ptr().add(o)));
                }
                // max(lo, x) is lo where lo > x, else x (NaN stays), as `clamp` is; min likewise.
                x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
                _mm512_storeu_ps(dst.as_mut_ptr().add(o), x);
            }
        }
    }

    /// The tile, each row in four 8-lane vectors.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn avx2(&self, sums: &[[i32; NR]], rows: &[i32], out: &mut TileOut) {
        use std::arch::x86_64::*;
        let za = _mm256_set1_epi32(self.za);
        let (lo, hi) = (_mm256_set1_ps(self.lo), _mm256_set1_ps(self.hi));
        for (r, (sums, &row)) in sums.iter().zip(rows).enumerate() {
            let (row, dst) = (_mm256_set1_epi32(row), out.row(r));
            assert_eq!(dst.len(), NR, "a whole panel's row");
            for o in [0, 8, 16, 24] {
                let s = _mm256_loadu_si256(sums.as_ptr().add(o) as *const _);
                let c = _mm256_loadu_si256(self.colsum.as_ptr().add(o) as *const _);
                let z = _mm256_loadu_si256(self.zb.as_ptr().add(o) as *const _);
                let v = _mm256_sub_epi32(_mm256_sub_epi32(s, _mm256_mullo_epi32(za, c)), _mm256_mullo_epi32(z, row));
                let mut x = _mm256_cvtepi32_ps(v);
                x = match self.scale {
                    Scale::One(s) => _mm256_mul_ps(x, _mm256_set1_ps(s)),
                    Scale::Cols(s) => _mm256_mul_ps(x, _mm256_loadu_ps(s.as_ptr().add(o))),
                };
                if let Some(b) = self.bias {
                    x = _mm256_add_ps(x, _mm256_loadu_ps(b.as_ptr().add(o)));
                }
                x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
                _mm256_storeu_ps(dst.as_mut_ptr().add(o), x);
            }
        }
    }
}

/// Any row (`r` its zero-point term): the integer terms in one loop, then the scale and bias in one loop per form
/// (scalar or per-column scale, with or without bias), each a branch-free vector loop,
/// then the activation.
#[inline(always)]
fn partial(sums: &[i32; NR], zeros: &Zeros, r: i32, ep: &QEpilogue, j0: usize, dst: &mut [f32]) {
    let cols = dst.len();
    let mut v = [0f32; NR];
    let za = zeros.a;
    for (((o, &a), &c), &z) in v.iter_mut().zip(&sums[..cols]).zip(&zeros.colsum[..cols]).zip(&zeros.b[..cols]) {
        *o = a.wrapping_sub(za.wrapping_mul(c)).wrapping_sub(z.wrapping_mul(r)) as f32;
    }
    let v = &v[..cols];
    match (ep.scale.len() == 1, ep.bias) {
        (true, None) => {
            let s = ep.scale[0];
            dst.iter_mut().zip(v).for_each(|(d, &x)| *d = x * s);
        }
        (true, Some(b)) => {
            let s = ep.scale[0];
            dst.iter_mut().zip(v).zip(&b[j0..j0 + cols]).for_each(|((d, &x), &b)| *d = x * s + b);
        }
        (false, None) => {
            dst.iter_mut().zip(v).zip(&ep.scale[j0..j0 + cols]).for_each(|((d, &x), &s)| *d = x * s);
        }
        (false, Some(b)) => {
            let (s, b) = (&ep.scale[j0..j0 + cols], &b[j0..j0 + cols]);
            dst.iter_mut().zip(v).zip(s.iter().zip(b)).for_each(|((d, &x), (&s, &b))| *d = x * s + b);
        }
    }
    if let Some(a) = ep.act {
        match a.clamp_bounds() {
            Some((lo, hi)) => dst.iter_mut().for_each(|x| *x = crate::gemm::clamp(*x, lo, hi)),
            None => dst.iter_mut().for_each(|x| *x = a.apply(*x)),
        }
    }
}
