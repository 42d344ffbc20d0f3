//! Conversions between NCHW and the blocked layout, at the edges of a blocked region.
//!
//! Both directions are a transpose of each `[L channels][hw pixels]` block; they run as
//! 8×8 tiles transposed in registers (AVX2 shuffles, also on AVX-512 machines: an L = 16
//! block is two tiles high), with scalar loops for the pixels past the last whole tile
//! and for partial channel groups. Tasks are (image, block, pixel range), so one block of
//! a large image still spreads over the threads.

use super::shared::{In, OutPtr};
use crate::gemm::{Isa, IsaKind, Parallel};

/// The fewest pixels one task handles (below this, the task overhead dominates).
const MIN_TASK_PIXELS: usize = 256;

/// `x` (`[n][c][hw]`) into `y` (`[n][ceil(c/L)][hw][L]`), padding channels zero.
pub fn to_blocked(isa: Isa, x: &[f32], n: usize, c: usize, hw: usize, y: &mut [f32], par: &dyn Parallel) {
    let lanes = super::lanes(isa);
    let blocks = c.div_ceil(lanes);
    assert!(x.len() == n * c * hw && y.len() == n * blocks * hw * lanes, "to_blocked: sizes do not match");
    let (xp, yp) = (In(x.as_ptr()), OutPtr(y.as_mut_ptr()));
    let tiles = Tiles::new(n * blocks, hw, par.threads());
    par.for_each(tiles.tasks(), &|t| {
        let (xp, yp) = (xp, yp);
        let (plane, p0, p1) = tiles.task(t);
        let (img, blk) = (plane / blocks, plane % blocks);
        let chans = (c - blk * lanes).min(lanes);
        // SAFETY: task t reads its block's channel rows and writes pixels p0..p1 of block
        // `plane`, all inside the buffers checked above.
        unsafe {
            let src = xp.0.add((img * c + blk * lanes) * hw);
            let dst = yp.0.add(plane * hw * lanes);
            for g in (0..lanes).step_by(8) {
                let full = g + 8 <= chans;
                let mut p = p0;
                if full && simd(isa) {
                    while p + 8 <= p1 {
                        #[cfg(target_arch = "x86_64")]
                        transpose8(src.add(g * hw + p), hw, dst.add(p * lanes + g), lanes);
                        p += 8;
                    }
                }
                for p in p..p1 {
                    for ch in g..g + 8 {
                        let v = if ch < chans { *src.add(ch * hw + p) } else { 0.0 };
                        *dst.add(p * lanes + ch) = v;
                    }
                }
            }
        }
    });
}

/// `x` (`[n][ceil(c/L)][hw][L]`) into `y` (`[n][c][hw]`), dropping padding channels.
pub fn from_blocked(isa: Isa, x: &[f32], n: usize, c: usize, hw: usize, y: &mut [f32], par: &dyn Parallel) {
    let lanes = super::lanes(isa);
    let blocks = c.div_ceil(lanes);
    assert!(y.len() == n * c * hw && x.len() == n * blocks * hw * lanes, "from_blocked: sizes do not match");
    let (xp, yp) = (In(x.as_ptr()), OutPtr(y.as_mut_ptr()));
    let tiles = Tiles::new(n * blocks, hw, par.threads());
    par.for_each(tiles.tasks(), &|t| {
        let (xp, yp) = (xp, yp);
        let (plane, p0, p1) = tiles.task(t);
        let (img, blk) = (plane / blocks, plane % blocks);
        let chans = (c - blk * lanes).min(lanes);
        // SAFETY: task t reads pixels p0..p1 of block `plane` and writes those pixels of
        // the block's true channels, all inside the buffers checked above.
        unsafe {
            let src = xp.0.add(plane * hw * lanes);
            let dst = yp.0.add((img * c + blk * lanes) * hw);
            for g in (0..lanes).step_by(8) {
                let mut p = p0;
                if g + 8 <= chans && simd(isa) {
                    while p + 8 <= p1 {
                        #[cfg(target_arch = "x86_64")]
                        transpose8(src.add(p * lanes + g), lanes, dst.add(g * hw + p), hw);
                        p += 8;
                    }
                }
                for p in p..p1 {
                    for ch in g..(g + 8).min(chans) {
                        *dst.add(ch * hw + p) = *src.add(p * lanes + ch);
                    }
                }
            }
        }
    });
}

/// Whether the 8×8 register transpose runs (AVX2 is there).
fn simd(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && matches!(isa.kind(), IsaKind::Avx512 | IsaKind::Avx2)
}

/// The split of `planes` planes of `hw` pixels into tasks: pixel ranges that are whole
/// tiles of 8, enough of them to give every thread a few.
struct Tiles {
    planes: usize,
    hw: usize,
    chunk: usize,
    chunks: usize,
}

impl Tiles {
    fn new(planes: usize, hw: usize, threads: usize) -> Tiles {
        let want = (4 * threads).div_ceil(planes.max(1)).clamp(1, hw.div_ceil(MIN_TASK_PIXELS).max(1));
        let chunk = hw.div_ceil(want).next_multiple_of(8).max(8);
        Tiles { planes, hw, chunk, chunks: hw.div_ceil(chunk).max(1) }
    }

    fn tasks(&self) -> usize {
        self.planes * self.chunks
    }

    /// Task `t`: its plane and pixel range.
    fn task(&self, t: usize) -> (usize, usize, usize) {
        let (plane, k) = (t / self.chunks, t % self.chunks);
        let p0 = (k * self.chunk).min(self.hw);
        (plane, p0, (p0 + self.chunk).min(self.hw))
    }
}

/// Transposes the 8×8 tile at `src` (rows `ss` floats apart) into `dst` (rows `ds`
/// floats apart): `dst[j][i] = src[i][j]`.
///
/// # Safety
/// Both tiles lie inside their buffers; AVX2 is available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ss)));
    // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves swapped.
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let out = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (j, v) in out.into_iter().enumerate() {
        _mm256_storeu_ps(dst.add(j * ds), v);
    }
}
