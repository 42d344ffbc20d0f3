//! `aim-compiler`: everything between a model file and runnable code.
//!
//! The ONNX frontend ([`onnx`]: protobuf decoding with prost — the generated code is checked
//! in, so no protoc is needed — external data, opset normalisation into aim's canonical op
//! forms, and export back to ONNX), the target description read with CPUID ([`target`]),
//! the graph passes and their pipeline ([`passes`]), the elementwise program format
//! ([`ewprog`]), Cranelift code generation ([`codegen`]) and the memory plan
//! ([`memory_plan`]).

pub mod codegen;
pub mod cuda;
/// The programs of `aim:Elementwise` nodes (defined with the kernels that run them).
pub use aim_kernels::ewprog;
pub mod memory_plan;
pub mod onnx;
pub mod passes;
pub mod select;
pub mod target;
