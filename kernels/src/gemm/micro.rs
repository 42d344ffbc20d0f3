//! The microkernels: C[MR×NR] (=|+=) Σ_p A[:, p] ⊗ B[p, :] over packed panels, with the
//! whole tile of accumulators held in vector registers.

use crate::gemm::IsaKind;

use super::Isa;
use std::sync::OnceLock;

/// The portable microkernel's contract as a C function (`acc` 0 or 1), for a kernel generated
/// at run time (by the compiler's Cranelift back end) to stand in for the Rust one.
pub type MicroFn = unsafe extern "C" fn(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: usize);

/// The generated portable microkernel, when one has been installed for this process.
static GENERATED: OnceLock<MicroFn> = OnceLock::new();

/// Installs `f` as this process's portable microkernel (`IsaKind::Portable`: 4×16 tiles over the
/// same packed panels). The first installation stays; returns whether this one did.
///
/// # Safety
/// `f` must compute exactly what the portable kernel computes, for every `kc`, and stay
/// callable for the rest of the process.
pub unsafe fn install_portable(f: MicroFn) -> bool {
    GENERATED.set(f).is_ok()
}

/// Whether a generated portable microkernel is in use.
pub fn portable_is_generated() -> bool {
    GENERATED.get().is_some()
}

/// Runs the microkernel of `isa` over `kc` steps.
///
/// # Safety
/// `a` holds `kc × MR` and `b` `kc × NR` floats; `c` is an MR×NR tile with leading
/// dimension `ldc`, valid for reads (when `acc`) and writes; the CPU supports `isa`.
pub(crate) unsafe fn run(isa: Isa, kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
    match isa.kind() {
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => avx512(kc, a, b, c, ldc, acc),
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => avx2(kc, a, b, c, ldc, acc),
        #[cfg(target_arch = "aarch64")]
        IsaKind::Neon => neon(kc, a, b, c, ldc, acc),
        _ => match GENERATED.get() {
            Some(f) => f(kc, a, b, c, ldc, acc as usize),
            None => portable(kc, a, b, c, ldc, acc),
        },
    }
}

/// Like [`run`] for the first `rows` (1..=12) rows of an AVX-512 tile only: a partial row
/// panel (a 64-row product is five full panels and one of four rows) computes and writes
/// just its rows instead of twelve.
///
/// # Safety
/// As for [`run`], with `c` valid for `rows` rows; the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn avx512_rows(
    rows: usize,
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    macro_rules! go {
        ($($r:literal)*) => {
            match rows {
                $($r => avx512_mr::<$r, false, 2>(kc, a, 0, b, c, ldc, acc),)*
                _ => unreachable!("1..=12 rows"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// 12×32: 24 zmm accumulators, two B vectors, one broadcast.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
    avx512_mr::<12, false, 2>(kc, a, 0, b, c, ldc, acc)
}

/// Like [`run`] for `rows` rows (1..=MR) of A read in place, row-major with leading
/// dimension `lda` (a dense layer's activations, which then need no packing), on the
/// AVX-512 and AVX2 kernels. With `narrow` just the first half of the tile's columns (16
/// on AVX-512, 8 on AVX2) is computed and written (a layer of ten outputs then does half
/// the work on AVX-512; 257 columns on AVX2 end in a panel of one column).
///
/// # Safety
/// As for [`run`], with `a` holding `rows` rows of `kc` floats at stride `lda`, `c` valid
/// for `rows` rows, and `isa` AVX-512 or AVX2.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_plain(
    isa: Isa,
    rows: usize,
    narrow: bool,
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    pf: &[f32],
) {
    macro_rules! go {
        ($f:ident; $nv:literal, $($r:literal)*) => {
            match rows {
                $($r => $f::<$r, true, $nv>(kc, a, lda, b, c, ldc, acc),)*
                _ => unreachable!("1..=MR rows"),
            }
        };
        ($f:ident; $nv:literal, $pf:expr, $($r:literal)*) => {
            match rows {
                $($r => $f::<$r, true, $nv>(kc, a, lda, b, c, ldc, acc, $pf),)*
                _ => unreachable!("1..=MR rows"),
            }
        };
    }
    match isa.kind() {
        IsaKind::Avx512 => {
            prefetch_lines(pf);
            if narrow {
                go!(avx512_mr; 1, 1 2 3 4 5 6 7 8 9 10 11 12)
            } else {
                go!(avx512_mr; 2, 1 2 3 4 5 6 7 8 9 10 11 12)
            }
        }
        IsaKind::Avx2 if narrow => go!(avx2_mr; 1, pf, 1 2 3 4 5 6),
        IsaKind::Avx2 => go!(avx2_mr; 2, pf, 1 2 3 4 5 6),
        _ => unreachable!("A is read in place only by the AVX-512 and AVX2 kernels"),
    }
}

/// The first `MR` rows and `NV` (one or two) vectors of columns of the 12×32 tile. Element
/// (r, p) of A is at `a[p·12 + r]` in a packed panel, or at `a[r·lda + p]` when `PLAIN`
/// (rows read in place).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_mr<const MR: usize, const PLAIN: bool, const NV: usize>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    use std::arch::x86_64::*;
    const PANEL: usize = 12;
    let mut cv = [[_mm512_setzero_ps(); NV]; MR];
    for p in 0..kc {
        let bv: [__m512; NV] = std::array::from_fn(|j| _mm512_loadu_ps(b.add(p * 32 + 16 * j)));
        for (r, cr) in cv.iter_mut().enumerate() {
            let av = _mm512_set1_ps(if PLAIN { *a.add(r * lda + p) } else { *a.add(p * PANEL + r) });
            for j in 0..NV {
                cr[j] = _mm512_fmadd_ps(av, bv[j], cr[j]);
            }
        }
    }
    for (r, cr) in cv.iter_mut().enumerate() {
        let row = c.add(r * ldc);
        for (j, v) in cr.iter_mut().enumerate() {
            if acc {
                *v = _mm512_add_ps(*v, _mm512_loadu_ps(row.add(16 * j)));
            }
            _mm512_storeu_ps(row.add(16 * j), *v);
        }
    }
}

/// 6×16: 12 ymm accumulators, two B vectors, one broadcast.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
    avx2_mr::<6, false, 2>(kc, a, 0, b, c, ldc, acc, &[])
}

/// The first `MR` rows and `NV` (one or two) vectors of columns of the 6×16 tile, A packed
/// or in place as for [`avx512_mr`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_mr<const MR: usize, const PLAIN: bool, const NV: usize>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    pf: &[f32],
) {
    use std::arch::x86_64::*;
    const PANEL: usize = 6;
    let mut c0 = [_mm256_setzero_ps(); MR];
    let mut c1 = [_mm256_setzero_ps(); MR];
    // Four k steps per loop iteration: one step per iteration spends a third of its
    // instructions on addresses and the loop (12 FMAs, 8 loads, 8 others), close to what
    // the front end issues in the 6 cycles of the FMAs; unrolled, measured 2% faster.
    let step = |p: usize, c0: &mut [__m256; MR], c1: &mut [__m256; MR]| {
        let b0 = _mm256_loadu_ps(b.add(p * 16));
        let b1 = if NV == 2 { _mm256_loadu_ps(b.add(p * 16 + 8)) } else { b0 };
        for r in 0..MR {
            let av = _mm256_broadcast_ss(&*(if PLAIN { a.add(r * lda + p) } else { a.add(p * PANEL + r) }));
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            if NV == 2 {
                c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
            }
        }
    };
    // One line of `pf` (what the caller wants in cache next) every four k steps: spread
    // out, the prefetches do not stall the loop waiting for free miss buffers, as a burst
    // of them before the call did (3% of a BERT layer's time on the prefetches alone).
    let (pf_lines, mut line) = (pf.len().div_ceil(LINE_FLOATS), 0);
    let mut p = 0;
    while p + 4 <= kc {
        if line < pf_lines {
            _mm_prefetch::<_MM_HINT_T0>(pf.as_ptr().add(line * LINE_FLOATS) as *const i8);
            line += 1;
        }
        step(p, &mut c0, &mut c1);
        step(p + 1, &mut c0, &mut c1);
        step(p + 2, &mut c0, &mut c1);
        step(p + 3, &mut c0, &mut c1);
        p += 4;
    }
    while p < kc {
        step(p, &mut c0, &mut c1);
        p += 1;
    }
    prefetch_lines(&pf[(line * LINE_FLOATS).min(pf.len())..]);
    for r in 0..MR {
        let row = c.add(r * ldc);
        if acc {
            c0[r] = _mm256_add_ps(c0[r], _mm256_loadu_ps(row));
        }
        _mm256_storeu_ps(row, c0[r]);
        if NV == 2 {
            if acc {
                c1[r] = _mm256_add_ps(c1[r], _mm256_loadu_ps(row.add(8)));
            }
            _mm256_storeu_ps(row.add(8), c1[r]);
        }
    }
}

/// Floats in one 64-byte cache line: the unit the prefetches count in.
pub(crate) const LINE_FLOATS: usize = 16;

/// Prefetches every 64-byte line of `v` into L1 at once (a hint: it never faults).
#[cfg(target_arch = "x86_64")]
pub(crate) fn prefetch_lines(v: &[f32]) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for l in 0..v.len().div_ceil(LINE_FLOATS) {
        // SAFETY: the address lies inside `v`; prefetches are SSE, in every x86-64 CPU.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(v.as_ptr().add(l * LINE_FLOATS) as *const i8) };
    }
}

/// 8×12: 24 q-register accumulators; per k step three B vectors, two A vectors (eight
/// rows), and 24 fused multiply-adds by lane.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn neon(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
    use std::arch::aarch64::*;
    const MR: usize = 8;
    const NR: usize = 12;
    let mut t = [[vdupq_n_f32(0.0); 3]; MR];
    for p in 0..kc {
        let bp = b.add(p * NR);
        let (b0, b1, b2) = (vld1q_f32(bp), vld1q_f32(bp.add(4)), vld1q_f32(bp.add(8)));
        let (a0, a1) = (vld1q_f32(a.add(p * MR)), vld1q_f32(a.add(p * MR + 4)));
        macro_rules! row {
            ($r:expr, $a:ident, $lane:literal) => {
                t[$r][0] = vfmaq_laneq_f32::<$lane>(t[$r][0], b0, $a);
                t[$r][1] = vfmaq_laneq_f32::<$lane>(t[$r][1], b1, $a);
                t[$r][2] = vfmaq_laneq_f32::<$lane>(t[$r][2], b2, $a);
            };
        }
        row!(0, a0, 0);
        row!(1, a0, 1);
        row!(2, a0, 2);
        row!(3, a0, 3);
        row!(4, a1, 0);
        row!(5, a1, 1);
        row!(6, a1, 2);
        row!(7, a1, 3);
    }
    for (r, row) in t.iter().enumerate() {
        let dst = c.add(r * ldc);
        for (j, &v) in row.iter().enumerate() {
            let v = if acc { vaddq_f32(v, vld1q_f32(dst.add(4 * j))) } else { v };
            vst1q_f32(dst.add(4 * j), v);
        }
    }
}

/// 4×16 in plain Rust.
unsafe fn portable(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
    const MR: usize = 4;
    const NR: usize = 16;
    let mut t = [[0f32; NR]; MR];
    for p in 0..kc {
        let bp = std::slice::from_raw_parts(b.add(p * NR), NR);
        for (r, row) in t.iter_mut().enumerate() {
            let av = *a.add(p * MR + r);
            for (x, &bv) in row.iter_mut().zip(bp) {
                *x += av * bv;
            }
        }
    }
    for (r, row) in t.iter().enumerate() {
        let dst = std::slice::from_raw_parts_mut(c.add(r * ldc), NR);
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = if acc { *d + v } else { v };
        }
    }
}
