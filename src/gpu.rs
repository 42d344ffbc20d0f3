//! The cuda backend's compiler, which needs no GPU: a model's graph specialised to one
//! input-shape signature, run through the cuda pipeline and lowered to a [`CudaProgram`].
//! [`crate::Model`] on [`crate::Backend::Cuda`] loads what it returns onto the GPU; the
//! tests run it in the PTX interpreter (`tools/ptx-interp`).

use crate::specialize::{bind, fits};
use crate::Error;
use aim_cuda::{GpuTarget, Half};
use aim_ir::DType;
pub use aim_runtime::cuda::CudaProgram;

/// Compiles `graph` (imported and type-inferred, weights kept: [`crate::Model::ir`]'s
/// graph) for `target` with its inputs of shapes `sig`, in input order. `path` names the
/// model in errors. A node the backend has no kernel for is [`Error::Lower`]. A half
/// model ([`half_model`]) keeps its GEMM weights in its half type on the device, on tensor
/// cores of that type, whatever `target.half` says.
pub fn compile(
    graph: &aim_ir::Graph,
    sig: &[Vec<usize>],
    target: &GpuTarget,
    path: &str,
) -> Result<CudaProgram, Error> {
    let target = &target.with_half(half_model(graph).or(target.half));
    let sig = sig.to_vec();
    if !fits(graph, &sig) {
        return Err(Error::Compile {
            path: path.to_string(),
            msg: format!("input shapes {sig:?} do not fit the model's inputs"),
        });
    }
    let mut g = graph.clone();
    bind(&mut g, &sig, path)?;
    aim_compiler::passes::run_pipeline(&mut g, &aim_compiler::passes::cuda_pipeline(), false)
        .map_err(|cause| Error::Pass { path: path.to_string(), cause })?;
    aim_cuda::lower::lower(&g, target).map_err(|cause| Error::Lower { path: path.to_string(), cause })
}

/// The half type of a model whose weights (its initializers of rank 2 or more) are mostly
/// f16 or bf16: such models run their GEMMs on tensor cores of that type.
pub fn half_model(graph: &aim_ir::Graph) -> Option<Half> {
    let (mut f16, mut bf16, mut f32) = (0usize, 0usize, 0usize);
    for t in graph.initializers.values().filter(|t| t.rank() >= 2) {
        match t.dtype() {
            DType::F16 => f16 += t.len(),
            DType::BF16 => bf16 += t.len(),
            DType::F32 => f32 += t.len(),
            _ => {}
        }
    }
    if f16 > f32.max(bf16) {
        Some(Half::F16)
    } else if bf16 > f32.max(f16) {
        Some(Half::Bf16)
    } else {
        None
    }
}

/// The GPU the cuda backend runs on here (its name and architecture), or why there is none
/// (no driver, no device, too old a device, or a build without the backend): what ONNX
/// Runtime-style provider lists and `aim serve` ask before choosing the GPU.
pub fn device() -> Result<String, String> {
    #[cfg(feature = "cuda")]
    {
        aim_cuda::device::Device::open(0).map(|d| format!("{} (sm_{})", d.name, d.sm)).map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("this build of aim has no cuda backend (cargo feature `cuda`)".into())
    }
}
