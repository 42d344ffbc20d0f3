//! The decode step's product on 4-bit codes with AVX-512 VNNI: rows quantized per block to
//! int8 (`accuracy_level` 4, as [`super::coded`]'s AVX2 kernel takes them), each code
//! multiplied by its activation byte in `vpdpbusd`, 64 products per instruction.
//!
//! The codes keep the layout every x86 kernel reads (per panel of 16 columns, pairs of
//! rows, a byte per column holding row `2r` in its low nibble and `2r + 1` in its high one).
//! A step reads four pairs (64 bytes: 128 weights), splits the nibbles and interleaves them
//! (`vpunpck{l,h}bw`: per 128-bit lane, one pair's 16 columns as (row 2r, row 2r + 1)
//! words), then two `vpermt2w` gather each column's four consecutive rows into one 32-bit
//! lane — the operand `vpdpbusd` multiplies by a broadcast of the four activation bytes of
//! those rows. About a dozen instructions per 128 weights, half the AVX2 kernel's, so that
//! a decode step streaming its weights from memory leaves the core more room to keep loads
//! in flight. Sums are exact (a code is at most 15, an activation at most 127 in
//! magnitude); per block `row += scale · act_scale · (Σ code·q − zero · Σ q)`, as the AVX2
//! kernel computes it.

use std::arch::x86_64::*;

/// Whether this CPU runs [`panel`].
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// The `vpermt2w` indices that take, from the interleaved low (`a`, columns 0–7 of each
/// pair) and high (`b`, columns 8–15) halves of four pairs, the dwords of pairs
/// `first, first + 1`: column `c`'s (row 2r, 2r + 1) word of each pair, in row order.
fn gather(first: usize) -> [i16; 32] {
    std::array::from_fn(|w| {
        let (c, second) = (w / 2, w % 2);
        let lane = first + second;
        let at = if c < 8 { 8 * lane + c } else { 32 + 8 * lane + (c - 8) };
        at as i16
    })
}

/// A whole panel's product with `M` rows quantized to int8 (`quant`, from
/// `coded::quantize_rows`), added to `rows` (16 floats each): the AVX-512 VNNI form of
/// `coded::x86::panel_int8`, which runs it.
///
/// # Safety
/// [`available`]; `codes` holds the panel's ⌈k/2⌉ pairs of 16 bytes; `params` its
/// ⌈k/block⌉ blocks of 16 f32 scales (bytes, little-endian) and `zeros` as many of 16
/// bytes; `quant` is `quantize_rows(a, M, k, block)`; each of the `M` ≤ 4 row pointers is
/// valid for 16 floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn panel<const M: usize>(
    codes: &[u8],
    params: &[u8],
    zeros: Option<&[u8]>,
    quant: &[i32],
    k: usize,
    block: usize,
    rows: &[*mut f32],
) {
    let (pairs, blocks) = (k.div_ceil(2), k.div_ceil(block));
    let words = (pairs * 2).div_ceil(4);
    assert!(M <= 4 && rows.len() >= M && block.is_multiple_of(2));
    assert!(codes.len() >= pairs * 16 && params.len() >= blocks * 64);
    assert!(zeros.is_none_or(|z| z.len() >= blocks * 16) && quant.len() >= M * words + 2 * M * blocks);
    // SAFETY: code loads are masked to the block's pairs, inside `codes`; a step reads the
    // activation bytes of rows 2r..2r + 8 of a row, at most two bytes past its
    // `words`, which the next row's codes or (for the last row) the two words of scales
    // and sums after them hold: inside `quant`. Scale, zero and row accesses are as
    // asserted and promised.
    unsafe {
        let nibble = _mm512_set1_epi8(15);
        let (i0, i1) = (gather(0), gather(2));
        let idx0 = _mm512_loadu_si512(i0.as_ptr() as *const _);
        let idx1 = _mm512_loadu_si512(i1.as_ptr() as *const _);
        let acts = quant.as_ptr() as *const u8;
        let mut out = [_mm512_setzero_ps(); M];
        for (i, o) in out.iter_mut().enumerate() {
            *o = _mm512_loadu_ps(rows[i]);
        }
        for b in 0..blocks {
            let (p0, p1) = (b * block, k.min((b + 1) * block));
            let (r0, r1) = (p0 / 2, p1.div_ceil(2));
            super::coded::prefetch_ahead(codes, params, block, b);
            let mut c = [_mm512_setzero_si512(); M];
            let mut r = r0;
            while r < r1 {
                let n = (r1 - r).min(4);
                let at = codes.as_ptr().add(16 * r);
                let q = if n == 4 {
                    _mm512_loadu_si512(at as *const _)
                } else {
                    _mm512_maskz_loadu_epi8((1u64 << (16 * n)) - 1, at as *const i8)
                };
                let lo = _mm512_and_si512(q, nibble);
                let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
                let (a, bb) = (_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi));
                let z0 = _mm512_permutex2var_epi16(a, idx0, bb);
                for (i, ci) in c.iter_mut().enumerate() {
                    let x = acts.add(4 * i * words + 2 * r);
                    let x0 = _mm512_set1_epi32((x as *const i32).read_unaligned());
                    *ci = _mm512_dpbusd_epi32(*ci, z0, x0);
                }
                if n > 2 {
                    let z1 = _mm512_permutex2var_epi16(a, idx1, bb);
                    for (i, ci) in c.iter_mut().enumerate() {
                        let x = acts.add(4 * i * words + 2 * r + 4);
                        let x1 = _mm512_set1_epi32((x as *const i32).read_unaligned());
                        *ci = _mm512_dpbusd_epi32(*ci, z1, x1);
                    }
                }
                r += 4;
            }
            let sc = _mm512_loadu_ps(params.as_ptr().add(64 * b) as *const f32);
            let z = match zeros {
                Some(zs) => {
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(zs.as_ptr().add(16 * b) as *const __m128i)))
                }
                None => _mm512_setzero_ps(),
            };
            for (i, o) in out.iter_mut().enumerate() {
                let at = M * words + 2 * (i * blocks + b);
                let act = _mm512_set1_ps(f32::from_bits(*quant.get_unchecked(at) as u32));
                let sum = _mm512_set1_ps(*quant.get_unchecked(at + 1) as f32);
                let t = _mm512_mul_ps(_mm512_fnmadd_ps(z, sum, _mm512_cvtepi32_ps(c[i])), act);
                *o = _mm512_fmadd_ps(t, sc, *o);
            }
        }
        for (i, o) in out.iter().enumerate() {
            _mm512_storeu_ps(rows[i], *o);
        }
    }
}
