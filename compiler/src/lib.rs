//! `aim-compiler`: everything between a model file and runnable code.
//!
//! Today it holds the ONNX frontend ([`onnx`]): protobuf decoding (prost, with the generated
//! code checked in so no protoc is needed), external data, and opset normalisation into
//! aim's canonical op forms. The graph passes, scheduling and code generators join it here.

pub mod codegen;
pub mod ewprog;
pub mod memory_plan;
pub mod onnx;
pub mod passes;
pub mod target;
