//! Quantized 3×3 stride-1 convolutions as Winograd F(2×2, 3×3) in exact integer
//! arithmetic: 16 multiplies per 2×2 outputs and input channel instead of 36.
//!
//! Each 2×2 block of outputs (a *tile*) comes from a 4×4 patch `d` of the input bytes
//! (the input's zero point where the patch leaves the image): the patch is transformed
//! to `V = Bᵀ d B` (coefficients 0 and ±1: |V| ≤ 4 · 255, an i16), the filter `g` to
//! `U = G' g G'ᵀ` at load with `G' = 2G` (integer coefficients, so `U` is four times
//! Lavin's transformed filter: |U| ≤ 9 · 128, an i16), and for each of the 16 positions
//! the products summed over input channels are one integer GEMM, tiles × channels ×
//! output channels, on `vpmaddwd` (exact: 16-bit products summed in i32). The output
//! transform `Aᵀ M A` gives four times the convolution's exact sum; every step is a ring
//! operation, so sums that wrap in i32 on the way still give that value whenever it fits,
//! which [`MAX_CHANNELS`] guarantees, and the division by four is exact. The result is
//! then the direct kernel's sums, bit for bit, and takes the same epilogue.
//!
//! On AVX2 without VNNI (where the direct kernel multiplies at `vpmaddwd`'s rate too) this
//! is 2.25× fewer multiplies; the transforms cost a pass over each patch and each tile's
//! sums. The transformed weights take 16/9 × 2 of the bytes of the s8 weights, and the
//! byte panels are then not kept.

use super::Nhwc;
use crate::qgemm::{MR, NR};

/// Input channels above which four times a sum could leave i32
/// (4 · 9 · c · 255 · 128 < 2³¹ up to 1,827 channels).
pub(crate) const MAX_CHANNELS: usize = 1024;

/// Input channels below which the direct kernel is kept: the transforms' cost per value
/// is then no longer small next to the products'.
pub(crate) const MIN_CHANNELS: usize = 16;

/// Multiply-adds a byte of weights read from memory costs: on AMD Zen 3 one core multiplies
/// about 55 G per second on `vpmaddwd` and reads a model's weights (cold each run) at
/// about 5 GB/s.
const WEIGHT_BYTE_COST: u64 = 11;

/// Positions of a transformed tile.
const POS: usize = 16;

/// A 3×3 stride-1 convolution's weights transformed for Winograd F(2×2, 3×3).
#[derive(Clone, Debug)]
pub(crate) struct Wino8 {
    /// Groups of four input channels (the channels rounded up with zero weights).
    groups: usize,
    /// Per panel of [`NR`] output channels, per position, per group: NR columns × 4 values.
    u: Vec<i16>,
}

impl Wino8 {
    /// Whether the transform takes a convolution from `c` channels over `window`: 3×3,
    /// stride and dilation 1, and a channel count whose sums stay exact.
    pub(crate) fn applies(c: usize, window: &super::Window) -> bool {
        window.kernel == [3, 3]
            && window.stride == [1, 1]
            && window.dilation == [1, 1]
            && (MIN_CHANNELS..=MAX_CHANNELS).contains(&c)
    }

    /// The estimated costs of Winograd and of the direct kernel, in multiply-adds, for a
    /// convolution from `c` to `m` channels with an output of `oh × ow` pixels per image
    /// (and `n` images): the products (16 per tile, tiles past an odd edge included, and a
    /// quarter more for the transforms; 9 per pixel), plus [`WEIGHT_BYTE_COST`] per byte of
    /// weights read (a model's weights are read from memory on every run; Winograd's take
    /// 32 bytes per channel pair, the s8 ones 9). With few tiles and many channels (7×7
    /// outputs over 512 channels) the weights' bytes decide.
    pub(crate) fn costs(c: usize, m: usize, n: usize, oh: usize, ow: usize) -> (u64, u64) {
        let (cm, cpm) = ((c * m) as u64, (c.div_ceil(4) * 4 * m) as u64);
        let tiles = (n * oh.div_ceil(2) * ow.div_ceil(2)) as u64;
        let wino = tiles * 16 * cpm * 5 / 4 + WEIGHT_BYTE_COST * 32 * cpm;
        let direct = (n * oh * ow) as u64 * 9 * cm + WEIGHT_BYTE_COST * 9 * cm;
        (wino, direct)
    }

    /// Transforms `w` (s8 as bytes, `[m, c, 3, 3]`).
    pub(crate) fn new(c: usize, m: usize, w: &[u8]) -> Wino8 {
        debug_assert_eq!(w.len(), m * c * 9);
        let groups = c.div_ceil(4);
        let panel = POS * groups * NR * 4;
        let mut u = vec![0i16; m.div_ceil(NR) * panel];
        for o in 0..m {
            let (p, j) = (o / NR, o % NR);
            for ci in 0..c {
                let g: [i32; 9] = std::array::from_fn(|t| w[(o * c + ci) * 9 + t] as i8 as i32);
                let t = filter(&g);
                let (grp, i) = (ci / 4, ci % 4);
                for (xi, &v) in t.iter().enumerate() {
                    u[p * panel + ((xi * groups + grp) * NR + j) * 4 + i] = v as i16;
                }
            }
        }
        Wino8 { groups, u }
    }

    /// Bytes the transformed weights take.
    pub(crate) fn bytes(&self) -> usize {
        self.u.len() * 2
    }

    /// Input channels rounded up to whole groups of four.
    pub(crate) fn depth(&self) -> usize {
        self.groups * 4
    }

    /// Panel `p`'s weights at position `xi`.
    fn panel(&self, p: usize, xi: usize) -> &[i16] {
        let len = self.groups * NR * 4;
        &self.u[(p * POS + xi) * len..(p * POS + xi + 1) * len]
    }

    /// `acc[xi][r] = Σ_k v[xi][r][k] · U[p][xi][k]` for the `rows` tiles of a block: `v`
    /// holds per position [`MR`] rows of [`Wino8::depth`] values.
    pub(crate) fn products(&self, avx2: bool, v: &[i16], rows: usize, p: usize, acc: &mut [[[i32; NR]; MR]; POS]) {
        let depth = self.depth();
        assert!(v.len() >= POS * MR * depth && rows <= MR);
        for (xi, acc) in acc.iter_mut().enumerate() {
            let a = &v[xi * MR * depth..(xi + 1) * MR * depth];
            let b = self.panel(p, xi);
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the caller has checked AVX2; `a` holds MR rows of `depth` values
                // and `b` groups · NR · 4 (the slices above).
                unsafe { gemm_avx2(a.as_ptr(), depth, rows, self.groups, b.as_ptr(), acc) };
                continue;
            }
            let _ = avx2;
            gemm_portable(a, depth, rows, self.groups, b, acc);
        }
    }
}

/// `G' g G'ᵀ` for a 3×3 filter `g` (row-major), `G' = [[2,0,0],[1,1,1],[1,−1,1],[0,0,2]]`:
/// four times the transformed filter of F(2×2, 3×3), in integers. Row-major 4×4.
fn filter(g: &[i32; 9]) -> [i32; POS] {
    let rows = |a: i32, b: i32, c: i32| [2 * a, a + b + c, a - b + c, 2 * c];
    // G' g: 4×3, column by column.
    let cols: [[i32; 4]; 3] = std::array::from_fn(|k| rows(g[k], g[3 + k], g[6 + k]));
    let mut u = [0; POS];
    for i in 0..4 {
        let r = rows(cols[0][i], cols[1][i], cols[2][i]);
        u[i * 4..i * 4 + 4].copy_from_slice(&r);
    }
    u
}

/// `Bᵀ d B` for one channel of a 4×4 patch, `Bᵀ = [[1,0,−1,0],[0,1,1,0],[0,−1,1,0],[0,1,0,−1]]`.
#[inline(always)]
fn input(d: [i16; POS]) -> [i16; POS] {
    let rows = |a: i16, b: i16, c: i16, e: i16| [a - c, b + c, c - b, b - e];
    let mut t = [0i16; POS];
    for j in 0..4 {
        let r = rows(d[j], d[4 + j], d[8 + j], d[12 + j]);
        for i in 0..4 {
            t[i * 4 + j] = r[i];
        }
    }
    let mut v = [0i16; POS];
    for i in 0..4 {
        v[i * 4..i * 4 + 4].copy_from_slice(&rows(t[i * 4], t[i * 4 + 1], t[i * 4 + 2], t[i * 4 + 3]));
    }
    v
}

/// The patches of a block's tiles, transformed: `v` gets, per position, [`MR`] rows of
/// `depth` values; row `r` from the 16 pixels `px[r]` points at (`c` bytes each, the zero
/// point's row where the patch leaves the image). Channels from `c` to `depth` are 0.
pub(crate) fn transform_inputs(px: &[[*const u8; POS]], c: usize, depth: usize, v: &mut [i16]) {
    debug_assert!(px.len() <= MR && v.len() >= POS * MR * depth);
    for (r, p) in px.iter().enumerate() {
        // SAFETY: every pointer has `c` readable bytes (the caller's contract).
        let rows: [&[u8]; POS] = std::array::from_fn(|i| unsafe { std::slice::from_raw_parts(p[i], c) });
        for ch in 0..c {
            let t = input(std::array::from_fn(|i| rows[i][ch] as i16));
            for (xi, &x) in t.iter().enumerate() {
                v[(xi * MR + r) * depth + ch] = x;
            }
        }
        for xi in 0..POS {
            v[(xi * MR + r) * depth + c..(xi * MR + r + 1) * depth].fill(0);
        }
    }
}

/// The sums of one tile: `Aᵀ M A / 4` with `Aᵀ = [[1,1,1,0],[0,1,−1,−1]]` plus `init` per
/// column, for the tile in row `r` of every position's products; row `k` of `out[2·dy +
/// dx]` gets its output pixel `(dy, dx)`. Wrapping: see the module doc.
#[inline(always)]
pub(crate) fn output(
    acc: &[[[i32; NR]; MR]; POS],
    r: usize,
    init: &[i32; NR],
    out: &mut [[[i32; NR]; MR]; 4],
    k: usize,
) {
    for j in 0..NR {
        let m = |i: usize, c: usize| acc[i * 4 + c][r][j];
        // Aᵀ M: two rows of four.
        let s0: [i32; 4] = std::array::from_fn(|c| m(0, c).wrapping_add(m(1, c)).wrapping_add(m(2, c)));
        let s1: [i32; 4] = std::array::from_fn(|c| m(1, c).wrapping_sub(m(2, c)).wrapping_sub(m(3, c)));
        let left = |s: &[i32; 4]| s[0].wrapping_add(s[1]).wrapping_add(s[2]);
        let right = |s: &[i32; 4]| s[1].wrapping_sub(s[2]).wrapping_sub(s[3]);
        let four = [left(&s0), right(&s0), left(&s1), right(&s1)];
        for (o, f) in out.iter_mut().zip(four) {
            o[k][j] = (f >> 2).wrapping_add(init[j]);
        }
    }
}

/// The 16 pixel pointers of the patch whose top-left input position is `(iy, ix)` of image
/// `img` (the zero row outside the image).
pub(crate) fn patch(x: &Nhwc, img: usize, iy: isize, ix: isize, zrow: &[u8]) -> [*const u8; POS] {
    let (h, w, c) = (x.h as isize, x.w as isize, x.c);
    std::array::from_fn(|i| {
        let (y, xx) = (iy + (i / 4) as isize, ix + (i % 4) as isize);
        if y >= 0 && y < h && xx >= 0 && xx < w {
            x.data[((img * x.h) + y as usize) * x.w * c + xx as usize * c..].as_ptr()
        } else {
            zrow.as_ptr()
        }
    })
}

/// [`Wino8::products`] for one position in plain Rust.
fn gemm_portable(a: &[i16], depth: usize, rows: usize, groups: usize, b: &[i16], acc: &mut [[i32; NR]; MR]) {
    for (r, sums) in acc.iter_mut().enumerate().take(rows) {
        let row = &a[r * depth..(r + 1) * depth];
        *sums = [0; NR];
        for g in 0..groups {
            let w = &b[g * NR * 4..(g + 1) * NR * 4];
            for (j, s) in sums.iter_mut().enumerate() {
                let d: i32 = (0..4).map(|i| row[g * 4 + i] as i32 * w[j * 4 + i] as i32).sum();
                *s = s.wrapping_add(d);
            }
        }
    }
}

/// [`Wino8::products`] for one position on AVX2: rows six at a time, eight columns at a
/// time (two `vpmaddwd` per row and group of four channels).
///
/// # Safety
/// The CPU has AVX2; `a` holds `rows` rows of `depth` values, `b` `groups · NR · 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gemm_avx2(a: *const i16, depth: usize, rows: usize, groups: usize, b: *const i16, acc: &mut [[i32; NR]; MR]) {
    let mut r0 = 0;
    while r0 < rows {
        let (at, out) = (a.add(r0 * depth), acc.as_mut_ptr().add(r0));
        match rows - r0 {
            1 => block::<1>(at, depth, groups, b, out),
            2 => block::<2>(at, depth, groups, b, out),
            3 => block::<3>(at, depth, groups, b, out),
            4 => block::<4>(at, depth, groups, b, out),
            5 => block::<5>(at, depth, groups, b, out),
            _ => block::<6>(at, depth, groups, b, out),
        }
        r0 += 6;
    }
}

/// Rows `0..R` of [`gemm_avx2`].
///
/// # Safety
/// As for [`gemm_avx2`], with `R` rows from `a` and `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block<const R: usize>(a: *const i16, depth: usize, groups: usize, b: *const i16, out: *mut [i32; NR]) {
    use std::arch::x86_64::*;
    for chunk in 0..NR / 8 {
        let mut lo = [_mm256_setzero_si256(); R];
        let mut hi = [_mm256_setzero_si256(); R];
        let mut at = b.add(chunk * 32);
        for g in 0..groups {
            let w0 = _mm256_loadu_si256(at as *const __m256i);
            let w1 = _mm256_loadu_si256(at.add(16) as *const __m256i);
            at = at.add(NR * 4);
            for r in 0..R {
                // Four values of the row (two pairs), in every 64-bit lane.
                let av = _mm256_set1_epi64x((a.add(r * depth + g * 4) as *const i64).read_unaligned());
                lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(w0, av));
                hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(w1, av));
            }
        }
        for r in 0..R {
            // lo holds columns 0–3 as pairs of sums, hi columns 4–7: hadd gives (c0, c1,
            // c4, c5, c2, c3, c6, c7), the permute puts them in order.
            let s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0b11_01_10_00);
            _mm256_storeu_si256(((*out.add(r)).as_mut_ptr()).add(chunk * 8) as *mut __m256i, s);
        }
    }
}
