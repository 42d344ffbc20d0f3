//! The indirect microkernels: one tile of [`MR`] output pixels × [`NR`] output channels,
//! summed over taps whose bytes each row reads through its own pointer (the input pixel
//! a window tap lands on, or a row of zero points in the padding), so a convolution's
//! operand is never gathered into a copy.

use crate::qgemm::{MR, NR};

/// Which AVX2 kernel a convolution's packed weights take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Avx2 {
    /// Every pair of weights fits `vpmaddubsw` ([`super::plain`]).
    Plain,
    /// No weight is −128 ([`super::sign`]).
    Sign,
    /// Neither: the portable kernel.
    Neither,
}

/// Which microkernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Micro {
    /// AVX-512 VNNI: `vpdpbusd` on zmm registers, 24 accumulators.
    #[cfg(target_arch = "x86_64")]
    Vnni512,
    /// AVX2: `vpmaddubsw` with the activations' signs moved onto the weights
    /// ([`super::sign`]); the weights hold no −128 and the sums start from the sign
    /// kernel's initial values.
    #[cfg(target_arch = "x86_64")]
    Avx2Sign,
    /// AVX2: `vpmaddubsw` on weights whose every pair fits 16 bits ([`super::plain`]).
    #[cfg(target_arch = "x86_64")]
    Avx2Plain,
    /// AArch64 `sdot` ([`super::neon`]): the activations flipped to signed terms, the
    /// sums started from `128 · Σw` of the packed weights.
    #[cfg(target_arch = "aarch64")]
    NeonDot,
    /// Plain Rust (exact, like every kernel here: the sums are integers).
    Portable,
}

impl Micro {
    /// The best microkernel for `isa` on this CPU, for weights packed for the AVX2 kernel
    /// `avx2` (what their pairs and −128s allow).
    pub(crate) fn for_isa(isa: crate::gemm::Isa, avx2: Avx2) -> Micro {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::qgemm::use_vnni(isa) {
                return Micro::Vnni512;
            }
            if crate::qgemm::use_avx2(isa) {
                match avx2 {
                    Avx2::Plain => return Micro::Avx2Plain,
                    Avx2::Sign => return Micro::Avx2Sign,
                    Avx2::Neither => {}
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        if isa.kind() == crate::gemm::IsaKind::Neon && super::neon::available() {
            return Micro::NeonDot;
        }
        let _ = (isa, avx2);
        Micro::Portable
    }

    /// The kernel's name, for schedule texts.
    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Micro::Vnni512 => "AVX-512 VNNI vpdpbusd",
            #[cfg(target_arch = "x86_64")]
            Micro::Avx2Sign => "AVX2 vpmaddubsw, signs moved onto the weights: exact",
            #[cfg(target_arch = "x86_64")]
            Micro::Avx2Plain => "AVX2 vpmaddubsw, every pair of weights fits 16 bits: exact",
            #[cfg(target_arch = "aarch64")]
            Micro::NeonDot => "NEON sdot, activations flipped to signed bytes: exact",
            Micro::Portable => "portable",
        }
    }

    /// Whether this kernel's sums start from [`super::sign::start`]'s values of the packed
    /// weights as they are (the NEON kernel, which takes any packing).
    pub(crate) fn flipped_start(self) -> bool {
        #[cfg(target_arch = "aarch64")]
        if self == Micro::NeonDot {
            return true;
        }
        false
    }

    /// Whether this kernel's sums start from [`super::sign::start`]'s values.
    pub(crate) fn signed_start(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Micro::Avx2Sign {
            return true;
        }
        false
    }

    /// `acc[r][j] = init[j] + Σ_t Σ_k a[t][r][k] · panel[t][k][j]` for `taps` taps of `groups·4`
    /// bytes: `ind[t·MR + r]` points at row `r`'s bytes for tap `t` (u8), the panel holds,
    /// per tap and group of four bytes, NR columns × 4 bytes (s8).
    ///
    /// # Safety
    /// `ind` holds `taps·MR` pointers, each to `groups·4` readable bytes; `panel` holds
    /// `taps·groups·NR·4` bytes; this CPU has the microkernel's instructions. Rows from
    /// `rows` on may be left as they were.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn tile(
        self,
        ind: &[*const u8],
        taps: usize,
        groups: usize,
        panel: *const u8,
        init: &[i32; NR],
        rows: usize,
        acc: &mut [[i32; NR]; MR],
    ) {
        debug_assert!(ind.len() >= taps * MR && rows <= MR);
        let _ = rows;
        match self {
            #[cfg(target_arch = "x86_64")]
            Micro::Vnni512 => vnni512(ind.as_ptr(), taps, groups, panel, init, acc),
            #[cfg(target_arch = "x86_64")]
            Micro::Avx2Sign => {
                by_two_rows::<super::sign::Sign>(ind.as_ptr(), taps, groups, panel, init, rows, acc.as_mut_ptr())
            }
            #[cfg(target_arch = "x86_64")]
            Micro::Avx2Plain => {
                by_two_rows::<super::plain::Plain>(ind.as_ptr(), taps, groups, panel, init, rows, acc.as_mut_ptr())
            }
            #[cfg(target_arch = "aarch64")]
            Micro::NeonDot => super::neon::tile(ind.as_ptr(), taps, groups, panel, init, rows, acc.as_mut_ptr()),
            Micro::Portable => portable(ind.as_ptr(), taps, groups, panel, init, acc),
        }
    }
}

/// See [`Micro::tile`]: per group of four bytes, two 64-byte loads of the panel, one
/// broadcast per row and 24 `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn vnni512(
    ind: *const *const u8,
    taps: usize,
    groups: usize,
    panel: *const u8,
    init: &[i32; NR],
    acc: &mut [[i32; NR]; MR],
) {
    use std::arch::x86_64::*;
    let i0 = _mm512_loadu_si512(init.as_ptr() as *const _);
    let i1 = _mm512_loadu_si512(init.as_ptr().add(16) as *const _);
    let mut c = [[i0, i1]; MR];
    let mut pb = panel;
    for t in 0..taps {
        let a: [*const u8; MR] = std::array::from_fn(|r| *ind.add(t * MR + r));
        for g in 0..groups {
            let b0 = _mm512_loadu_si512(pb as *const _);
            let b1 = _mm512_loadu_si512(pb.add(64) as *const _);
            pb = pb.add(NR * 4);
            for r in 0..MR {
                let av = _mm512_set1_epi32((a[r].add(g * 4) as *const i32).read_unaligned());
                c[r][0] = _mm512_dpbusd_epi32(c[r][0], av, b0);
                c[r][1] = _mm512_dpbusd_epi32(c[r][1], av, b1);
            }
        }
    }
    for (r, c) in c.iter().enumerate() {
        _mm512_storeu_si512(acc[r].as_mut_ptr() as *mut _, c[0]);
        _mm512_storeu_si512(acc[r].as_mut_ptr().add(16) as *mut _, c[1]);
    }
}

/// See [`Micro::tile`], in plain Rust.
unsafe fn portable(
    ind: *const *const u8,
    taps: usize,
    groups: usize,
    panel: *const u8,
    init: &[i32; NR],
    acc: &mut [[i32; NR]; MR],
) {
    *acc = [*init; MR];
    let mut pb = panel;
    for t in 0..taps {
        for g in 0..groups {
            let b = std::slice::from_raw_parts(pb, NR * 4);
            pb = pb.add(NR * 4);
            for (r, row) in acc.iter_mut().enumerate() {
                let a = std::slice::from_raw_parts((*ind.add(t * MR + r)).add(g * 4), 4);
                for (j, s) in row.iter_mut().enumerate() {
                    let w = &b[j * 4..j * 4 + 4];
                    *s = s.wrapping_add((0..4).map(|i| a[i] as i32 * w[i] as i8 as i32).sum::<i32>());
                }
            }
        }
    }
}

/// The arguments of an AVX2 row block ([`TwoRows`]): row pointers (tap `t`, row `r` at
/// `t·MR + r`), taps, groups, panel, initial sums, first output row.
#[cfg(target_arch = "x86_64")]
pub(crate) type Block<'a> = (*const *const u8, usize, usize, *const u8, &'a [i32; NR], *mut [i32; NR]);

/// An AVX2 kernel of one or two rows of a whole panel (eight accumulators): the plain and
/// sign kernels, run over a tile's rows by [`by_two_rows`].
#[cfg(target_arch = "x86_64")]
pub(crate) trait TwoRows {
    /// Rows `0..R` (`R` is one or two) of the tile.
    ///
    /// # Safety
    /// As for [`by_two_rows`], for `R` rows.
    unsafe fn block<const R: usize>(args: Block);
}

/// `K`'s blocks over rows `0..rows` of a tile, two rows at a time: the tile of the AVX2
/// plain and sign kernels (what its sums are, each kernel's type says).
///
/// # Safety
/// The CPU has AVX2; `ind` holds `taps·MR` pointers (the first `rows` of each tap read),
/// each to `groups·4` readable bytes; `panel` holds `taps·groups·NR·4` bytes; `acc` has
/// `rows` writable rows; `rows ≤ MR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn by_two_rows<K: TwoRows>(
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
        let args = (ind.add(r0), taps, groups, panel, init, acc.add(r0));
        match rows - r0 {
            1 => K::block::<1>(args),
            _ => K::block::<2>(args),
        }
        r0 += 2;
    }
}
