//! `aim-runtime`: running graphs.
//!
//! The executor binds a graph's inputs (checking them against the declared types, symbolic
//! dims included), runs the nodes in order, frees each value after its last use, and runs
//! the control-flow ops (If, Loop, Scan) by executing their subgraphs: with the reference
//! kernels of `aim-kernels` (the reference backend), or as a [`cpu::CpuProgram`] whose
//! nodes run prepared, packed and generated kernels (the cpu backend). Tensors are
//! `aim_ir::Tensor`: 64-byte aligned, owned, shared or memory-mapped.
//!
//! Architecture invariant: this crate never depends on Cranelift, so ahead-of-time
//! compiled models run with the runtime alone.

// Parallel loops rebind their Send/Sync pointer wrappers (`let out = out;`) inside the
// closure so that it captures the whole wrapper, not its raw-pointer field.
#![allow(clippy::redundant_locals)]

pub mod affinity;
mod claims;
mod control;
pub mod cpu;
pub mod cuda;
pub mod custom_library;
pub mod denormals;
pub mod embedded;
mod exec;
pub mod pool;
mod support;
pub mod views;

pub use aim_ir::Tensor;
pub use exec::{
    panic_message, run_graph, run_graph_capture, run_graph_profiled, run_graph_with, Capture, NodeTiming, RunError,
    RunOptions,
};
pub use support::{is_supported, unsupported_ops};
