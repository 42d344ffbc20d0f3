//! Kernels for the blocked channel layout (NCHWc): a tensor `[n][c][h][w]` is stored as
//! `[n][ceil(c/L)][h][w][L]`, `L` channels per block — the vector width of the ISA (16 for
//! AVX-512, 8 otherwise) — with the channels past `c` in the last block zero (kernels keep
//! them finite). A vector then holds one pixel of `L` channels, which turns depthwise
//! convolutions and convolutions over small images into dense vector work; the compiler's
//! layout pass puts whole chains of convolutions into this layout and reorders at the edges.

mod conv;
mod depthwise;
mod pool;
mod reorder;
mod select;
mod shared;
mod simd;
mod winograd;

pub use conv::{panel_blocks, Conv, ConvIo};
pub use depthwise::Depthwise;
pub use pool::{global_average, Pool};
pub use reorder::{from_blocked, to_blocked};
pub use select::{BlockedKernel, ConvShape, EXACT_SUMS};
pub use winograd::Winograd;

use crate::gemm::IsaKind;

use crate::gemm::Isa;

/// The channel block for an ISA: one vector of floats.
pub fn lanes(isa: Isa) -> usize {
    lanes_of(isa.kind())
}

/// [`lanes`] of a family, whether or not this CPU has it (for code compiled for another).
pub fn lanes_of(kind: IsaKind) -> usize {
    match kind {
        IsaKind::Avx512 => 16,
        IsaKind::Avx2 | IsaKind::Portable | IsaKind::Neon => 8,
    }
}

/// The kernels that run a channel block of `block` floats where the program's kernels are
/// `isa`'s: `isa` itself for its own block, AVX2 for a block of 8 on an AVX-512 CPU (which
/// has AVX2 and FMA: the compiler picks 8 where 16 would pad the channels more than
/// AVX-512's width pays back), else none.
pub fn isa_for_block(isa: Isa, block: usize) -> Option<Isa> {
    if lanes(isa) == block {
        Some(isa)
    } else if isa.kind() == IsaKind::Avx512 && block == lanes_of(IsaKind::Avx2) {
        Isa::new(IsaKind::Avx2)
    } else {
        None
    }
}

/// Output pixels in one microkernel tile of the blocked convolution.
pub(crate) fn tile_rows(isa: Isa) -> usize {
    match isa.kind() {
        IsaKind::Avx512 => 12,
        IsaKind::Avx2 => 6,
        IsaKind::Portable | IsaKind::Neon => 4,
    }
}

/// How a convolution's input is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[n][c][h][w]`: read directly by a first layer with few input channels.
    Nchw,
    /// `[n][ceil(c/L)][h][w][L]`.
    Blocked,
}

/// A 2-D window: kernel size, strides and dilations (height, width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Dilations.
    pub dilations: [usize; 2],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family runs its own block; AVX-512 programs also run AVX2's narrower one (with
    /// AVX2's kernels), and no family runs a block wider than its vector or one of another
    /// size.
    #[test]
    fn blocks_each_family_runs() {
        for isa in Isa::all_available() {
            assert_eq!(isa_for_block(isa, lanes(isa)), Some(isa));
            assert_eq!(isa_for_block(isa, 4), None);
            assert_eq!(isa_for_block(isa, 32), None);
            match isa.kind() {
                IsaKind::Avx512 => assert_eq!(isa_for_block(isa, 8).map(Isa::kind), Some(IsaKind::Avx2)),
                _ => assert_eq!(isa_for_block(isa, 16), None),
            }
        }
    }
}
