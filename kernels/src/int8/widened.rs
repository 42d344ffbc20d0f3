//! The AVX2 indirect microkernel on inputs widened to 16 bits: exact sums through
//! `vpmaddwd`, two multiplies per 16 products and nothing else per vector. The quantized
//! convolutions ([`super::conv`]) and the integer GEMM ([`crate::qgemm`], one tap) run on
//! it where the CPU has no VNNI and the weights do not fit the plain kernel.
//!
//! The byte kernels multiply with `vpmaddubsw`, which saturates pairs of products: the
//! plain kernel ([`super::plain`]) needs weights whose pairs fit, and the sign kernel
//! ([`super::sign`]) moves each activation's sign onto the weights with a `vpsignb` per
//! vector, which on AMD Zen 3 competes with the multiplies for their ports. Here the
//! input is widened once per call (u8 to i16, a pass over the input next to taps ×
//! output-channel products per byte) and each group of four bytes of the packed weights
//! is widened in the loop (one conversion per eight columns, shared by six rows), so that
//! any s8 weights are exact at `vpmaddwd`'s rate: on Zen 3, 1.2–1.5× the sign kernel.

/// The largest widened copy a call makes, in bytes (16 MiB: a convolution's input of 8 MiB,
/// or 4,096 GEMM rows of 2,048): larger operands keep the byte kernels rather than hold a
/// copy of that size. The quantized convolutions and the integer GEMM both apply it, and
/// the schedule texts name the kernel by it.
pub(crate) const WIDEN_MAX_BYTES: usize = 16 << 20;

#[cfg(target_arch = "x86_64")]
use crate::qgemm::{MR, NR};

/// Rows of a tile at a time: 12 accumulators, two widened weight vectors and one broadcast
/// fill the 16 ymm registers.
#[cfg(target_arch = "x86_64")]
const ROWS: usize = 6;

/// `acc[r][j] = init[j] + Σ_t Σ_k a[t][r][k] · panel[t][k][j]` for rows `0..rows` of a
/// tile: `ind[t·MR + r]` points at row `r`'s values for tap `t`, `groups·4` of them as
/// i16 (the widened input), and the panel holds, per tap and group of four, [`NR`]
/// columns × 4 bytes, as the byte kernels read it: s8, or u8 with `SIGNED_ROWS` (the rows
/// then being the widened s8 side, as [`crate::qgemm`] runs a product whose broadcast side
/// is signed). Rows from `rows` on may be left as they were.
///
/// # Safety
/// The CPU has AVX2; `ind` holds `taps·MR` pointers, each to `groups·4` readable i16
/// values (2-byte aligned or not); `panel` holds `taps·groups·NR·4` bytes; `acc` has
/// `rows` writable rows; `rows ≤ MR`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile<const SIGNED_ROWS: bool>(
    ind: *const *const u8,
    taps: usize,
    groups: usize,
    panel: *const u8,
    init: &[i32; NR],
    rows: usize,
    acc: *mut [i32; NR],
) {
    debug_assert!(rows <= MR);
    let mut r0 = 0;
    while r0 < rows {
        let (at, out) = (ind.add(r0), acc.add(r0));
        match rows - r0 {
            1 => block::<SIGNED_ROWS, 1>(at, taps, groups, panel, init, out),
            2..=3 => block::<SIGNED_ROWS, 3>(at, taps, groups, panel, init, out),
            _ => block::<SIGNED_ROWS, ROWS>(at, taps, groups, panel, init, out),
        }
        r0 += ROWS;
    }
}

/// Rows `0..R` of [`tile`]: per chunk of eight columns, every tap and group.
///
/// # Safety
/// As for [`tile`]; `ind` is the tile's pointer array from the block's first row on (its
/// `t·MR + r` entries for `r < R` are read), `acc` has `R` writable rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block<const SIGNED_ROWS: bool, const R: usize>(
    ind: *const *const u8,
    taps: usize,
    groups: usize,
    panel: *const u8,
    init: &[i32; NR],
    acc: *mut [i32; NR],
) {
    use std::arch::x86_64::*;
    let widen = |p: *const u8| {
        let v = _mm_loadu_si128(p as *const __m128i);
        if SIGNED_ROWS {
            _mm256_cvtepu8_epi16(v)
        } else {
            _mm256_cvtepi8_epi16(v)
        }
    };
    for chunk in 0..NR / 8 {
        let mut lo = [_mm256_setzero_si256(); R];
        let mut hi = [_mm256_setzero_si256(); R];
        for t in 0..taps {
            let a: [*const i16; R] = std::array::from_fn(|r| *ind.add(t * MR + r) as *const i16);
            let mut at = panel.add(t * groups * NR * 4 + chunk * 32);
            for g in 0..groups {
                let (w0, w1) = (widen(at), widen(at.add(16)));
                at = at.add(NR * 4);
                for r in 0..R {
                    // Four values of the row (two pairs), in every 64-bit lane.
                    let av = _mm256_set1_epi64x((a[r].add(g * 4) as *const i64).read_unaligned());
                    lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(w0, av));
                    hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(w1, av));
                }
            }
        }
        let start = _mm256_loadu_si256(init.as_ptr().add(chunk * 8) as *const __m256i);
        for r in 0..R {
            // lo holds columns 0–3 as pairs of sums, hi columns 4–7: hadd gives (c0, c1,
            // c4, c5, c2, c3, c6, c7), the permute puts them in order.
            let s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0b11_01_10_00);
            let s = _mm256_add_epi32(s, start);
            _mm256_storeu_si256((acc.add(r) as *mut i32).add(chunk * 8) as *mut __m256i, s);
        }
    }
}

/// `bytes` widened to i16 (u8, or s8 when `signed`), as bytes of the i16 values in native
/// order, into `dst` (twice as long).
pub(crate) fn widen(bytes: &[u8], signed: bool, dst: &mut [u8]) {
    debug_assert!(dst.len() >= 2 * bytes.len());
    for (d, &x) in dst.chunks_exact_mut(2).zip(bytes) {
        let v = if signed { x as i8 as i16 } else { x as i16 };
        d.copy_from_slice(&v.to_ne_bytes());
    }
}
