//! The cuda backend's compiler, which needs no GPU: a model's graph specialised to one
//! input-shape signature, run through the cuda pipeline and lowered to a [`CudaProgram`].
//! [`crate::Model`] on [`crate::Backend::Cuda`] loads what it returns onto the GPU; the
//! tests run it in the PTX interpreter (`tools/ptx-interp`).

use crate::specialize::{bind, fits};
use crate::Error;
use aim_compiler::cuda::GpuTarget;
pub use aim_runtime::cuda::CudaProgram;

/// Compiles `graph` (imported and type-inferred, weights kept: [`crate::Model::ir`]'s
/// graph) for `target` with its inputs of shapes `sig`, in input order. `path` names the
/// model in errors. A node the backend has no kernel for is [`Error::Lower`].
pub fn compile(
    graph: &aim_ir::Graph,
    sig: &[Vec<usize>],
    target: &GpuTarget,
    path: &str,
) -> Result<CudaProgram, Error> {
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
    aim_compiler::cuda::lower::lower(&g, target).map_err(|cause| Error::Lower { path: path.to_string(), cause })
}
