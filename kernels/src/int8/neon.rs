//! The AArch64 integer microkernel: exact u8 × s8 sums with the dot-product instruction
//! `sdot` (FEAT_DotProd: Cortex-A55, A76 and later, Neoverse N1 and later, Apple M1 and
//! later), which multiplies signed bytes by signed bytes and adds each four products into a
//! 32-bit lane — four times the products per instruction of f32 `fmla`.
//!
//! The unsigned side (the activations, or the packed activations of a product whose rows
//! are s8 weights) is moved to signed terms, `a' = a − 128` (a flip of its top bit), so the
//! kernel sums `(a − 128) · w`; the `−128 · Σw` this leaves is taken back by the starting
//! values, `128 · Σw` per column ([`super::sign::start`]) or per row. Every byte pair fits:
//! `|a'| ≤ 128`, `|w| ≤ 128`, four products at most 65,536, so the 32-bit sums are the exact
//! integer ones for any weights (no pair condition, no −128 moved, unlike AVX2's kernels).
//!
//! The intrinsic (`vdotq_s32`) is not stable Rust yet; the instruction is written with
//! `asm!`, in functions compiled with the `dotprod` target feature and called only where
//! the CPU has it ([`available`]).
//!
//! Per group of four bytes of depth and half of a panel (16 columns, four vectors), up to
//! six rows: four loads of the panel, per row one load-and-broadcast of its four bytes, a
//! flip and four `sdot` (24 accumulators, 4 weights, 1 activation in the 32 vector
//! registers).

use crate::qgemm::{MR, NR};
use std::arch::aarch64::*;

/// Whether this CPU has the dot-product instructions.
pub(crate) fn available() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// `acc + Σ` of the four products per lane of `a` and `b` (signed bytes).
///
/// # Safety
/// The CPU has FEAT_DotProd.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the caller's CPU has.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Four bytes at `p`, in every lane, as signed bytes `v − 128` (`FLIP`) or as they are.
///
/// # Safety
/// `p` has four readable bytes.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn broadcast<const FLIP: bool>(p: *const u8) -> int8x16_t {
    // SAFETY: four bytes at `p`, read unaligned.
    let v = unsafe { vreinterpretq_s8_s32(vdupq_n_s32((p as *const i32).read_unaligned())) };
    if FLIP {
        veorq_s8(v, vdupq_n_s8(-128))
    } else {
        v
    }
}

/// `acc[r][j] = init[j] + Σ_t Σ_k (a[t][r][k] − 128) · panel[t][k][j]` for rows `0..rows`
/// of a tile, `taps` taps of `groups·4` bytes: `ind[t·MR + r]` points at row `r`'s bytes
/// for tap `t` (u8); the panel holds, per tap and group of four bytes, NR columns × 4 bytes
/// (s8). With `init` from [`super::sign::start`] the sums are `Σ a · w`, exactly.
///
/// # Safety
/// The CPU has FEAT_DotProd ([`available`]); `ind` holds `taps·MR` pointers (the first
/// `rows` of each tap read), each to `groups·4` readable bytes; `panel` holds
/// `taps·groups·NR·4` bytes; `acc` has `rows ≤ MR` writable rows.
pub(crate) unsafe fn tile(
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
        // SAFETY: as the caller promised, for rows r0.. of the tile (pointers `MR` apart
        // per tap, so the offset keeps each tap's row).
        unsafe {
            let (ind, acc) = (ind.add(r0), acc.add(r0));
            let tap_stride = MR;
            match rows - r0 {
                1 => block::<1, true>(ind, tap_stride, taps, groups, panel, init, acc),
                2 => block::<2, true>(ind, tap_stride, taps, groups, panel, init, acc),
                3 => block::<3, true>(ind, tap_stride, taps, groups, panel, init, acc),
                4 => block::<4, true>(ind, tap_stride, taps, groups, panel, init, acc),
                5 => block::<5, true>(ind, tap_stride, taps, groups, panel, init, acc),
                _ => block::<6, true>(ind, tap_stride, taps, groups, panel, init, acc),
            }
        }
        r0 += 6;
    }
}

/// The rows of a GEMM tile (one tap): `acc[r][j] = init[j] + Σ_k a'[r][k] · b'[k][j]` where
/// `a'` are the rows flipped to signed terms when `signed_rows` is false (the panel is
/// then s8), else the rows as they are (s8) and `b'` the panel flipped (u8 packed
/// activations): then each row's sum must start from `128 · Σ_k a[r][k]`, which the caller
/// adds, and `init` is zero.
///
/// # Safety
/// As for [`tile`] with one tap: `rows` holds `rows` pointers (at least one) to `groups·4`
/// readable bytes each.
pub(crate) unsafe fn gemm_tile(
    rows: &[*const u8],
    signed_rows: bool,
    groups: usize,
    panel: *const u8,
    init: &[i32; NR],
    acc: *mut [i32; NR],
) {
    let n = rows.len();
    let mut r0 = 0;
    while r0 < n {
        // SAFETY: as the caller promised, for rows r0.. (one tap: the tap stride is unused).
        unsafe {
            let (ind, acc) = (rows.as_ptr().add(r0), acc.add(r0));
            macro_rules! run {
                ($r:literal) => {
                    if signed_rows {
                        block::<$r, false>(ind, 0, 1, groups, panel, init, acc)
                    } else {
                        block::<$r, true>(ind, 0, 1, groups, panel, init, acc)
                    }
                };
            }
            match n - r0 {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                4 => run!(4),
                5 => run!(5),
                _ => run!(6),
            }
        }
        r0 += 6;
    }
}

/// `R` rows of a tile, both halves of the panel in turn. `FLIP_ROWS`: the rows are u8 and
/// flipped, the panel s8 as it is; else the rows are s8 and the panel is u8, flipped.
///
/// # Safety
/// As for [`tile`], for `R` rows, tap `t`'s row pointers at `ind + t·tap_stride`.
#[target_feature(enable = "neon,dotprod")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const R: usize, const FLIP_ROWS: bool>(
    ind: *const *const u8,
    tap_stride: usize,
    taps: usize,
    groups: usize,
    panel: *const u8,
    init: &[i32; NR],
    acc: *mut [i32; NR],
) {
    let flip = vdupq_n_s8(-128);
    for half in 0..2 {
        // SAFETY: reads inside `init` (NR values), the panel and the rows as promised;
        // writes inside `acc`'s R rows.
        unsafe {
            let i: [int32x4_t; 4] = std::array::from_fn(|q| vld1q_s32(init.as_ptr().add(half * 16 + q * 4)));
            let mut c = [i; R];
            for t in 0..taps {
                let a: [*const u8; R] = std::array::from_fn(|r| *ind.add(t * tap_stride + r));
                let mut pb = panel.add(t * groups * NR * 4 + half * 64);
                for g in 0..groups {
                    let w: [int8x16_t; 4] = std::array::from_fn(|q| {
                        let v = vld1q_s8(pb.add(q * 16) as *const i8);
                        if FLIP_ROWS {
                            v
                        } else {
                            veorq_s8(v, flip)
                        }
                    });
                    pb = pb.add(NR * 4);
                    for r in 0..R {
                        let av = broadcast::<FLIP_ROWS>(a[r].add(g * 4));
                        for q in 0..4 {
                            c[r][q] = sdot(c[r][q], av, w[q]);
                        }
                    }
                }
            }
            for (r, c) in c.iter().enumerate() {
                for (q, c) in c.iter().enumerate() {
                    vst1q_s32((acc.add(r) as *mut i32).add(half * 16 + q * 4), *c);
                }
            }
        }
    }
}
