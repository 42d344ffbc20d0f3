//! The edges of a byte region: f32 NCHW values quantized into bytes NHWC (QuantizeLinear
//! exactly, the layout change in the same pass), and bytes NHWC dequantized into f32 NCHW
//! (DequantizeLinear exactly). Both go through tiles of 64 pixels × 64 channels, so that
//! reads and writes stay within a few cache lines each.

use super::{SharedMut, Q8};
use crate::gemm::{Isa, Parallel};

const TILE: usize = 64;

/// `y[(b, p, ch)] = q.quantize(x[(b, ch, p)])` for `n` images of `c` channels × `hw`
/// pixels: per tile of pixels, each channel's run quantized as one vector loop, then
/// interleaved.
///
/// Panics when a buffer does not hold `n·c·hw` values.
#[allow(clippy::too_many_arguments)]
pub fn quantize_nchw(isa: Isa, x: &[f32], n: usize, c: usize, hw: usize, q: Q8, y: &mut [u8], par: &dyn Parallel) {
    let len = n * c * hw;
    assert!(x.len() >= len && y.len() >= len, "the buffers do not hold {n}×{c}×{hw} values");
    let tiles = hw.div_ceil(TILE);
    let yp = SharedMut(y.as_mut_ptr());
    par.for_each(n * tiles, &|t| {
        let yp = yp;
        let (b, p0) = (t / tiles, (t % tiles) * TILE);
        let p1 = (p0 + TILE).min(hw);
        let np = p1 - p0;
        let mut buf = [0u8; TILE * TILE];
        // SAFETY: inside `y` (checked above); tasks write disjoint pixel ranges.
        let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add((b * hw + p0) * c), np * c) };
        #[cfg(target_arch = "x86_64")]
        if c <= 4 && crate::int8::epilogue::fast_tiles(isa) {
            let planes: [&[f32]; 4] = std::array::from_fn(|ch| {
                let ch = ch.min(c - 1);
                &x[(b * c + ch) * hw + p0..(b * c + ch) * hw + p1]
            });
            // SAFETY: AVX-512 F, BW and VL checked.
            return unsafe { few_channels_v4(&planes, c, q, dst) };
        }
        // Channels in groups of TILE: each channel's run quantized into a row of `buf`
        // (vector code), then the pixels' bytes written in order (the writes sequential,
        // the reads down the L1-resident tile; byte by byte into `dst` with stride `c`
        // they cost 1 ns a value).
        for c0 in (0..c).step_by(TILE) {
            let c1 = (c0 + TILE).min(c);
            for ch in c0..c1 {
                let src = &x[(b * c + ch) * hw + p0..(b * c + ch) * hw + p1];
                let row = &mut buf[(ch - c0) * TILE..(ch - c0) * TILE + np];
                crate::fast::quant::quantize(isa, src, row, q.scale, q.zero as f32);
            }
            for k in 0..np {
                let out = &mut dst[k * c + c0..k * c + c1];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = buf[j * TILE + k];
                }
            }
        }
    });
}

/// [`quantize_nchw`] of one tile for 1 to 4 channels (a network's RGB input): 16 pixels at
/// a time, each channel quantized as QuantizeLinear does (division, ties to even), the
/// pixel's bytes gathered into one 32-bit lane and the lanes' first `c` bytes packed.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn few_channels_v4(planes: &[&[f32]; 4], c: usize, q: Q8, dst: &mut [u8]) {
    use std::arch::x86_64::*;
    const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let n = planes[0].len();
    assert!(dst.len() >= n * c, "the tile does not fit");
    let (scale, z, lo, hi) =
        (_mm512_set1_ps(q.scale), _mm512_set1_ps(q.zero as f32), _mm512_setzero_ps(), _mm512_set1_ps(255.0));
    // Per 128-bit lane, its four pixels' first `c` bytes, packed to the front.
    let pick: [i8; 16] = std::array::from_fn(|i| if i < 4 * c { ((i / c) * 4 + i % c) as i8 } else { -1 });
    let pick = _mm512_broadcast_i32x4(_mm_loadu_si128(pick.as_ptr() as *const __m128i));
    let mut i = 0;
    while i + 16 <= n {
        let mut lanes = _mm512_setzero_si512();
        for (ch, plane) in planes.iter().enumerate().take(c) {
            let v = _mm512_div_ps(_mm512_loadu_ps(plane.as_ptr().add(i)), scale);
            let v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(_mm512_roundscale_ps::<R>(v), z), lo), hi);
            let byte = _mm512_sllv_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(8 * ch as i32));
            lanes = _mm512_or_si512(lanes, byte);
        }
        let packed = _mm512_shuffle_epi8(lanes, pick);
        let out = dst.as_mut_ptr().add(i * c);
        for l in 0..4 {
            let part = match l {
                0 => _mm512_castsi512_si128(packed),
                1 => _mm512_extracti32x4_epi32::<1>(packed),
                2 => _mm512_extracti32x4_epi32::<2>(packed),
                _ => _mm512_extracti32x4_epi32::<3>(packed),
            };
            // The lane's 4·c bytes (the masked store writes no more).
            _mm_mask_storeu_epi8(out.add(l * 4 * c) as *mut i8, ((1u32 << (4 * c)) - 1) as u16, part);
        }
        i += 16;
    }
    for p in i..n {
        for (ch, plane) in planes.iter().enumerate().take(c) {
            dst[p * c + ch] = q.quantize(plane[p]);
        }
    }
}

/// `y[(b, ch, p)] = q.dequantize(x[(b, p, ch)])` for `n` images of `c` channels × `hw`
/// pixels.
///
/// Panics when a buffer does not hold `n·c·hw` values.
pub fn dequantize_nhwc(x: &[u8], n: usize, c: usize, hw: usize, q: Q8, y: &mut [f32], par: &dyn Parallel) {
    let len = n * c * hw;
    assert!(x.len() >= len && y.len() >= len, "the buffers do not hold {n}×{c}×{hw} values");
    let ctiles = c.div_ceil(TILE);
    let yp = SharedMut(y.as_mut_ptr());
    par.for_each(n * ctiles, &|t| {
        let yp = yp;
        let (b, c0) = (t / ctiles, (t % ctiles) * TILE);
        let c1 = (c0 + TILE).min(c);
        let mut buf = [0f32; TILE * TILE];
        for p0 in (0..hw).step_by(TILE) {
            let p1 = (p0 + TILE).min(hw);
            for p in p0..p1 {
                let src = &x[(b * hw + p) * c + c0..(b * hw + p) * c + c1];
                for (k, &v) in src.iter().enumerate() {
                    buf[k * TILE + (p - p0)] = q.dequantize(v);
                }
            }
            for ch in c0..c1 {
                let row = &buf[(ch - c0) * TILE..(ch - c0) * TILE + (p1 - p0)];
                // SAFETY: inside `y` (checked above); tasks write disjoint channel ranges.
                let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add((b * c + ch) * hw + p0), p1 - p0) };
                dst.copy_from_slice(row);
            }
        }
    });
}

/// `y[i] = table[x[i]]`: an elementwise function of bytes as its table of 256 results
/// (`aim:Lut8`), in parallel chunks; 64 bytes per step with AVX-512 VBMI (two two-register
/// byte permutes and a blend on the top bit), 32 with AVX2 (sixteen 16-byte shuffles),
/// one at a time elsewhere.
///
/// Panics when `y` is shorter than `x`.
pub fn lookup(isa: Isa, x: &[u8], table: &[u8; 256], y: &mut [u8], par: &dyn Parallel) {
    assert!(y.len() >= x.len(), "the output does not hold {} bytes", x.len());
    const CHUNK: usize = 64 * 1024;
    #[cfg(target_arch = "x86_64")]
    let vbmi = isa.kind() == crate::gemm::IsaKind::Avx512
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vbmi");
    #[cfg(target_arch = "x86_64")]
    let avx2 = crate::qgemm::use_avx2(isa);
    let _ = isa;
    let yp = SharedMut(y.as_mut_ptr());
    par.for_each(x.len().div_ceil(CHUNK), &|c| {
        let yp = yp;
        let r = c * CHUNK..((c + 1) * CHUNK).min(x.len());
        // SAFETY: inside `y` (checked above); chunks write disjoint ranges.
        let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(r.start), r.len()) };
        let src = &x[r];
        #[cfg(target_arch = "x86_64")]
        if vbmi {
            // SAFETY: AVX-512 F, BW and VBMI checked.
            return unsafe { lookup_vbmi(src, table, dst) };
        }
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2 checked.
            return unsafe { lookup_avx2(src, table, dst) };
        }
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = table[v as usize];
        }
    });
}

/// [`lookup`] of one chunk with `vpshufb`: the table as sixteen rows of 16 bytes, each
/// shuffled by the index less the row's first index, offset by 0x70 with unsigned
/// saturation so that only the indices of that row keep the top bit clear (`vpshufb`
/// gives 0 for the others), the rows' results or-ed together.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn lookup_avx2(x: &[u8], table: &[u8; 256], y: &mut [u8]) {
    use std::arch::x86_64::*;
    let rows: [__m256i; 16] =
        std::array::from_fn(|k| _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().add(16 * k) as *const _)));
    let (offset, sixteen) = (_mm256_set1_epi8(0x70), _mm256_set1_epi8(16));
    let n = x.len().min(y.len());
    let mut i = 0;
    while i + 32 <= n {
        let mut v = _mm256_loadu_si256(x.as_ptr().add(i) as *const __m256i);
        let mut r = _mm256_setzero_si256();
        for row in &rows {
            r = _mm256_or_si256(r, _mm256_shuffle_epi8(*row, _mm256_adds_epu8(v, offset)));
            v = _mm256_sub_epi8(v, sixteen);
        }
        _mm256_storeu_si256(y.as_mut_ptr().add(i) as *mut __m256i, r);
        i += 32;
    }
    for k in i..n {
        y[k] = table[x[k] as usize];
    }
}

/// [`lookup`] of one chunk with `vpermi2b`: the index's low seven bits pick from the table's
/// lower or upper 128 bytes, its top bit which of the two.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn lookup_vbmi(x: &[u8], table: &[u8; 256], y: &mut [u8]) {
    use std::arch::x86_64::*;
    let t: [__m512i; 4] = std::array::from_fn(|k| _mm512_loadu_si512(table.as_ptr().add(64 * k) as *const _));
    let n = x.len().min(y.len());
    let mut i = 0;
    while i + 64 <= n {
        let v = _mm512_loadu_si512(x.as_ptr().add(i) as *const _);
        let lo = _mm512_permutex2var_epi8(t[0], v, t[1]);
        let hi = _mm512_permutex2var_epi8(t[2], v, t[3]);
        let r = _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi);
        _mm512_storeu_si512(y.as_mut_ptr().add(i) as *mut _, r);
        i += 64;
    }
    for k in i..n {
        y[k] = table[x[k] as usize];
    }
}
