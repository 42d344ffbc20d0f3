//! `aim-compiler`: everything between an imported graph (`aim-onnx` reads the model file)
//! and runnable code.
//!
//! The target description read with CPUID ([`target`]), the graph passes and their
//! pipeline ([`passes`]), the elementwise program format ([`ewprog`]), Cranelift code
//! generation ([`codegen`]) and the memory plan ([`memory_plan`]).

pub mod codegen;
/// The programs of `aim:Elementwise` nodes (defined with the kernels that run them).
pub use aim_kernels::ewprog;
pub mod memory_plan;
pub mod passes;
pub mod select;
pub mod target;
