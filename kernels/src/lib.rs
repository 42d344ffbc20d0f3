//! `aim-kernels`: the reference semantics of every op aim supports, and the fast kernels
//! the cpu backend runs (`gemm`: packed GEMM with AVX-512 / AVX2 / NEON / portable
//! microkernels; `nchwc`: blocked-layout convolutions, Winograd, pooling; `fast`:
//! vectorised f32 kernels and math approximations; `qgemm`: u8×s8 integer GEMM with VNNI).
//!
//! One function per op, written for clarity over speed and following ONNX semantics
//! (broadcasting, per-op attributes in their canonical, newest-opset form as produced by
//! the importer). These kernels are the oracle every compiled backend is tested against
//! and the `--backend reference` executor. Control-flow ops (If, Loop, Scan) need a
//! graph executor and live in `aim-runtime`.

// Parallel loops rebind their Send/Sync pointer wrappers (`let out = out;`) inside the
// closure so that it captures the whole wrapper, not its raw-pointer field.
#![allow(clippy::redundant_locals)]

pub mod ewprog;
pub mod fast;
pub mod floats;
pub mod gemm;
pub mod int8;
pub mod nchwc;
pub mod num;
pub mod ops;
pub mod qconv;
pub mod qconv16;
pub mod qgemm;
pub mod qrecurrent;
pub mod scratch;
pub mod util;

use aim_ir::{Node, Tensor};

pub use ops::elementwise::erf;
pub use ops::shape::cast;

/// An op failed on its inputs (a shape that does not fit, an index out of range...). The
/// executor adds the node's name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct KernelError(pub String);

/// A reference kernel: the node (for its attributes) and its inputs (None for absent
/// optional inputs) to its outputs.
pub type Kernel = fn(&Node, &[Option<Tensor>]) -> Result<Vec<Tensor>, KernelError>;

const FAMILIES: &[&[(&str, Kernel)]] = &[
    ops::attention::OPS,
    ops::binary::OPS,
    ops::conv::OPS,
    ops::einsum::OPS,
    ops::elementwise::OPS,
    ops::index::OPS,
    ops::loss::OPS,
    ops::matmul::OPS,
    ops::misc::OPS,
    ops::norm::OPS,
    ops::pool::OPS,
    ops::quant::OPS,
    ops::recurrent::OPS,
    ops::reduce::OPS,
    ops::resize::OPS,
    ops::sample::OPS,
    ops::shape::OPS,
];

/// The reference kernel of a default-domain op, if aim has one.
pub fn kernel(op: &str) -> Option<Kernel> {
    FAMILIES.iter().flat_map(|f| f.iter()).find(|(name, _)| *name == op).map(|(_, k)| *k)
}

/// Every op with a reference kernel, sorted.
pub fn ops() -> Vec<&'static str> {
    let mut v: Vec<&str> = FAMILIES.iter().flat_map(|f| f.iter().map(|(n, _)| *n)).collect();
    v.sort();
    v
}
