//! PTX code generation for NVIDIA GPUs, emitted by aim itself (no nvcc, no NVRTC).
//!
//! Each kernel generator takes what the optimised graph says of a node (an elementwise
//! program, a reduction's rows, a softmax's scale, a GEMM's shape and epilogue) and a
//! [`GpuTarget`], and writes one `.entry` with its launch geometry ([`Kernel`]). The text
//! is checked by `ptxas` for sm_80 and sm_90 and run by the PTX interpreter
//! (`tools/ptx-interp`) against the reference kernels in the tests, so the backend is
//! verified on machines without a GPU.
//!
//! - [`ptx`]: the kernel builder (virtual registers, parameters, shared arrays, labels);
//! - [`math`]: exp, erf, tanh and sigmoid with the cpu backend's algorithms;
//! - [`elementwise`], [`reduce`], [`softmax`], [`gemm`]: the kernel families.

pub mod conv;
pub mod elementwise;
pub mod gather;
pub mod gemm;
pub mod layernorm;
pub mod lower;
pub mod math;
pub mod ptx;
pub mod ptxas;
pub mod reduce;
pub mod resize;
pub mod softmax;
pub mod strided;

#[cfg(test)]
mod tests;

/// What the generators need to know of a GPU: its architecture and the limits tiles are
/// sized against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuTarget {
    /// Compute capability × 10 (80 for sm_80, 90 for sm_90).
    pub sm: u32,
    /// Streaming multiprocessors (grids are sized to fill them).
    pub sms: u32,
    /// Shared memory one block may use, in bytes (without opting in to more).
    pub shared_per_block: u32,
    /// 32-bit registers per thread before ptxas must spill.
    pub regs_per_thread: u32,
    /// Whether f32 GEMMs may use TF32 tensor cores (`--allow-tf32`: 10-bit mantissas in
    /// the products, f32 sums).
    pub allow_tf32: bool,
}

impl GpuTarget {
    /// An A100-class GPU (sm_80: 108 SMs).
    pub const SM80: GpuTarget =
        GpuTarget { sm: 80, sms: 108, shared_per_block: 48 * 1024, regs_per_thread: 255, allow_tf32: false };
    /// An H100/H200-class GPU (sm_90: 132 SMs).
    pub const SM90: GpuTarget =
        GpuTarget { sm: 90, sms: 132, shared_per_block: 48 * 1024, regs_per_thread: 255, allow_tf32: false };

    /// The target for `sm_80` / `sm_90` (also `80`, `90`).
    pub fn parse(s: &str) -> Option<GpuTarget> {
        match s.trim_start_matches("sm_") {
            "80" | "86" | "89" => Some(GpuTarget { sm: s.trim_start_matches("sm_").parse().ok()?, ..GpuTarget::SM80 }),
            "90" => Some(GpuTarget::SM90),
            _ => None,
        }
    }

    /// The same target with TF32 tensor cores allowed or not.
    pub fn with_tf32(self, allow: bool) -> GpuTarget {
        GpuTarget { allow_tf32: allow, ..self }
    }
}

pub use aim_runtime::cuda::Kernel;

/// Blocks for a grid-stride loop over `n` items with `block` threads each: enough to fill
/// every SM several times, no more than the items need.
pub fn grid_for(n: usize, block: u32, target: &GpuTarget) -> u32 {
    let need = n.div_ceil(block as usize).max(1);
    need.min(target.sms as usize * 8) as u32
}
