//! The AVX2 integer microkernel: exact u8 × s8 sums at `vpmaddubsw`'s rate.
//!
//! `vpmaddubsw` multiplies unsigned bytes by signed ones and adds each pair of products
//! into a 16-bit lane, saturating: with activations up to 255 and weights up to ±127 a pair
//! can reach 64,770 and is clipped (ONNX Runtime's AVX2 kernel sums that way and gives
//! wrong sums when weights use their whole range). Here the activations are first moved to
//! signed terms, `a' = a − 128` (a flip of the top bit), and the sign of each `a'` is moved
//! onto its weight: `a'·w = |a'| · (sign(a')·w)` (`vpabsb`, `vpsignb`). Then the unsigned
//! side is at most 128 and the signed side at most 127 in magnitude, so a pair sum is at
//! most 2 · 128 · 127 = 32,512 and never saturates. `vpmaddwd` by ones widens the pairs to
//! 32 bits. The `−128 · Σw` this leaves is taken back by starting each column's sum from
//! `128 · Σw` (the caller's `init`, computed when the weights are packed).
//!
//! The one condition is that no weight is −128 (its sign flip would not fit a byte):
//! [`fits`] checks a packing, and ONNX Runtime's quantizer writes symmetric s8 weights in
//! [−127, 127].
//!
//! Per group of four bytes of depth, two rows and the panel's 32 columns (four vectors,
//! eight accumulators), each row costs a broadcast, an xor and an abs, then per vector a
//! sign, the two multiplies and an add: four operations per 32 products, with the two
//! multiplies the bound on every AVX2 core (as for ONNX Runtime's saturating sequence of
//! three). Two rows of the whole panel measured 6–9% faster than four rows of half of it
//! (the sign and magnitude of a row are then made once per group, not twice).

#[cfg(target_arch = "x86_64")]
use super::micro::Block;
#[cfg(target_arch = "x86_64")]
use crate::qgemm::MR;
use crate::qgemm::NR;

/// Whether every byte of packed s8 weights can take the sign of an activation: none is
/// −128.
pub(crate) fn fits(panels: &[u8]) -> bool {
    !panels.contains(&0x80)
}

/// What each column's sum must start from for the sign kernel: `init + 128 · Σw` (`colsum`
/// the column's weight sum, 0 past the last column).
pub(crate) fn start(init: &[i32; NR], colsum: &[i32]) -> [i32; NR] {
    std::array::from_fn(|j| init[j].wrapping_add(colsum.get(j).copied().unwrap_or(0).wrapping_mul(128)))
}

/// The kernel, run by [`super::micro::by_two_rows`]: `acc[r][j] = init[j] + Σ_t Σ_k
/// (a[t][r][k] − 128) · panel[t][k][j]` for rows `0..rows` of the tile, `taps` taps of
/// `groups·4` bytes: `ind[t·MR + r]` points at row `r`'s bytes for tap `t` (u8); the panel
/// holds, per tap and group of four bytes, NR columns × 4 bytes (s8, none −128). With
/// `init` from [`start`] the sums are `Σ a · w`, exactly.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Sign;

#[cfg(target_arch = "x86_64")]
impl super::micro::TwoRows for Sign {
    #[inline(always)]
    unsafe fn block<const R: usize>(args: Block) {
        block::<R>(args)
    }
}

/// Rows `0..R` (one or two) of a tile of [`Sign`], the whole panel at once (8
/// accumulators): each row's sign and magnitude computed once per group for the panel's
/// four vectors.
///
/// # Safety
/// As for [`super::micro::by_two_rows`], for `R` rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block<const R: usize>((ind, taps, groups, panel, init, acc): Block) {
    use std::arch::x86_64::*;
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let i: [__m256i; 4] = std::array::from_fn(|h| _mm256_loadu_si256(init.as_ptr().add(h * 8) as *const __m256i));
    let mut c = [i; R];
    for t in 0..taps {
        let a: [*const u8; R] = std::array::from_fn(|r| *ind.add(t * MR + r));
        let mut pb = panel.add(t * groups * NR * 4);
        for g in 0..groups {
            let w: [__m256i; 4] = std::array::from_fn(|h| _mm256_loadu_si256(pb.add(h * 32) as *const __m256i));
            pb = pb.add(NR * 4);
            for r in 0..R {
                let av = _mm256_set1_epi32((a[r].add(g * 4) as *const i32).read_unaligned());
                let s = _mm256_xor_si256(av, flip);
                let u = _mm256_abs_epi8(s);
                for h in 0..4 {
                    let p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(w[h], s));
                    c[r][h] = _mm256_add_epi32(c[r][h], _mm256_madd_epi16(p, ones));
                }
            }
        }
    }
    for (r, c) in c.iter().enumerate() {
        for (h, c) in c.iter().enumerate() {
            _mm256_storeu_si256((acc.add(r) as *mut i32).add(h * 8) as *mut __m256i, *c);
        }
    }
}
