//! `aim-cuda`: the cuda backend. PTX code generation for NVIDIA GPUs, emitted by aim
//! itself (no nvcc, no NVRTC), the lowering of an optimised graph to a
//! [`aim_runtime::cuda::CudaProgram`] ([`lower`]), and, with the `device` feature, running
//! that program on a GPU through the driver API ([`device`]).
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
#[cfg(feature = "device")]
pub mod device;
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
    /// Whether GEMMs with constant weights keep them in half precision on the device and
    /// multiply on f16 / bf16 tensor cores (activations rounded to the same type as they
    /// enter the product, f32 sums and epilogue): half models, or `--weights f16|bf16`.
    pub half: Option<Half>,
}

/// A half-precision type for weights and tensor-core products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// IEEE binary16: 10-bit mantissa, 5-bit exponent (largest finite 65504).
    F16,
    /// bfloat16: 7-bit mantissa, f32's 8-bit exponent.
    Bf16,
}

impl Half {
    /// The PTX type name (`f16`, `bf16`).
    pub fn ptx(self) -> &'static str {
        match self {
            Half::F16 => "f16",
            Half::Bf16 => "bf16",
        }
    }
}

impl GpuTarget {
    /// An A100-class GPU (sm_80: 108 SMs).
    pub const SM80: GpuTarget = GpuTarget {
        sm: 80,
        sms: 108,
        shared_per_block: 48 * 1024,
        regs_per_thread: 255,
        allow_tf32: false,
        half: None,
    };
    /// An H100/H200-class GPU (sm_90: 132 SMs).
    pub const SM90: GpuTarget = GpuTarget {
        sm: 90,
        sms: 132,
        shared_per_block: 48 * 1024,
        regs_per_thread: 255,
        allow_tf32: false,
        half: None,
    };

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

    /// The same target with constant GEMM weights in `half` precision (or in f32).
    pub fn with_half(self, half: Option<Half>) -> GpuTarget {
        GpuTarget { half, ..self }
    }
}

pub use aim_runtime::cuda::Kernel;

/// Blocks for a grid-stride loop over `n` items with `block` threads each: enough to fill
/// every SM several times, no more than the items need.
pub fn grid_for(n: usize, block: u32, target: &GpuTarget) -> u32 {
    let need = n.div_ceil(block as usize).max(1);
    need.min(target.sms as usize * 8) as u32
}
