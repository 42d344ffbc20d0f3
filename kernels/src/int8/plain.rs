//! The AVX2 integer microkernel for weights whose pairs fit `vpmaddubsw`: u8 activations
//! times s8 weights as ONNX Runtime's AVX2 kernel multiplies them (`vpmaddubsw`, then
//! `vpmaddwd` by ones, then `vpaddd`: three operations per 32 products), made exact.
//!
//! `vpmaddubsw` adds the products of two neighbouring depths in 16 bits, saturating. With
//! activations up to 255, a pair of weights `w₁, w₂` can saturate only when both have the
//! same sign and `|w₁| + |w₂| > 128` (`255 · 128 = 32,640` fits, `255 · 129` does not).
//! Weights quantized per tensor or with headroom have few such pairs; those few are
//! packed with the second weight shrunk until the pair fits, and the sum corrected per
//! row by the activation times what was taken off (see [`split_pairs`]). Then the sums
//! are exact, and the kernel runs a third faster than the sign kernel
//! ([`super::sign`]), which needs a fourth operation per vector: a packing chooses this
//! one when the corrections are few, the sign kernel otherwise (weights quantized per
//! channel to the full range, where one pair in fifty or more would need one).
//!
//! Per group of four bytes of depth, two rows and the panel's 32 columns (four vectors,
//! eight accumulators), as the sign kernel.

#[cfg(target_arch = "x86_64")]
use super::micro::Block;
#[cfg(target_arch = "x86_64")]
use crate::qgemm::MR;
use crate::qgemm::NR;

/// A correction of a packed weight: `(column within the panel, depth, what was taken
/// off)`: the true sum is the kernel's plus the activation at that depth times the third.
pub(crate) type Fix = (u32, u32, i32);

/// Shrinks, in s8 `panels` (per panel, per group of four depths, [`NR`] columns × 4
/// bytes), every pair of neighbouring depths that `vpmaddubsw` could saturate, and returns
/// the corrections per panel, or `None` (the panels unchanged) when there are more than
/// one in `one_in` of the `weights`: past that share the corrections cost more than this
/// kernel saves over the sign kernel.
pub(crate) fn split_pairs(panels: &mut [u8], groups: usize, weights: usize, one_in: usize) -> Option<Vec<Vec<Fix>>> {
    let panel_bytes = (groups * NR * 4).max(1);
    let mut fixes = vec![Vec::new(); panels.len() / panel_bytes];
    let limit = weights / one_in.max(1);
    // The pairs are the packing's consecutive byte pairs (depths 0–1 and 2–3 of each
    // column's group of four): positions worked out for the few that saturate only (a
    // load of large weights, and `aim:QMatMul`'s packing per run, spend their time here
    // otherwise).
    // Pairs are counted a block of 64 bytes at a time, without branches (the compiler
    // vectorises it): a pair saturates when both have one sign and the magnitude of their
    // sum passes 128. The blocks holding none are then skipped.
    let block_count = |b: &[u8]| -> usize {
        b.chunks_exact(2)
            .map(|w| {
                let (a, b) = (w[0] as i8 as i16, w[1] as i8 as i16);
                (((a ^ b) >= 0) & ((a + b).abs() > 128)) as usize
            })
            .sum()
    };
    const BLOCK: usize = 64;
    let bad: usize = panels.chunks(BLOCK).map(block_count).sum();
    if bad > limit {
        return None;
    }
    for (bi, block) in panels.chunks_mut(BLOCK).enumerate() {
        if bad == 0 || block_count(block) == 0 {
            continue;
        }
        for (c, w) in block.chunks_exact_mut(2).enumerate() {
            let (w1, w2) = (w[0] as i8 as i32, w[1] as i8 as i32);
            if !((w1 > 0 && w2 > 0 && w1 + w2 > 128) || (w1 < 0 && w2 < 0 && w1 + w2 < -128)) {
                continue;
            }
            // The second takes what the first leaves of 128 (the first is at most 128 in
            // magnitude, so that is at least 0).
            let kept = w2.signum() * (128 - w1.abs());
            w[1] = kept as i8 as u8;
            let at = bi * BLOCK + 2 * c;
            let (p, within) = (at / panel_bytes, at % panel_bytes);
            let (g, jj, t) = (within / (NR * 4), within % (NR * 4) / 4, within % 4);
            fixes[p].push((jj as u32, (g * 4 + t + 1) as u32, w2 - kept));
        }
    }
    Some(fixes)
}

/// The kernel, run by [`super::micro::by_two_rows`]: `acc[r][j] = init[j] + Σ_t Σ_k
/// a[t][r][k] · panel[t][k][j]` for rows `0..rows` of the tile, `taps` taps of `groups·4`
/// bytes: `ind[t·MR + r]` points at row `r`'s bytes for tap `t` (u8); the panel holds, per
/// tap and group of four bytes, NR columns × 4 bytes (s8, no pair that [`split_pairs`]
/// would shrink).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Plain;

#[cfg(target_arch = "x86_64")]
impl super::micro::TwoRows for Plain {
    #[inline(always)]
    unsafe fn block<const R: usize>(args: Block) {
        block::<R>(args)
    }
}

/// Rows `0..R` (one or two) of a tile of [`Plain`], the whole panel at once (8
/// accumulators).
///
/// # Safety
/// As for [`super::micro::by_two_rows`], for `R` rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block<const R: usize>((ind, taps, groups, panel, init, acc): Block) {
    use std::arch::x86_64::*;
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
                for h in 0..4 {
                    let p = _mm256_maddubs_epi16(av, w[h]);
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
