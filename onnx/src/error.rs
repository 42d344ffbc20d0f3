//! Errors of ONNX import, each naming the file, value or node concerned.

use std::path::PathBuf;

/// Why an ONNX model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read {}: {cause}", path.display())]
    Io { path: PathBuf, cause: std::io::Error },
    /// The bytes are not an ONNX protobuf (truncated, or another kind of file).
    #[error("{what} is not a valid ONNX model: {reason}")]
    Decode { what: String, reason: String },
    /// The model has no graph.
    #[error("{what} holds no graph")]
    NoGraph { what: String },
    /// The model's default-domain opset is outside what aim supports.
    #[error("opset {opset} is not supported (aim supports ONNX opsets 7 to 28)")]
    Opset { opset: i64 },
    /// A tensor (initializer, attribute or value) of an element type aim does not support.
    #[error("{what}: element type {dtype} is not supported")]
    DType { what: String, dtype: String },
    /// A tensor whose data does not match its declared type and shape.
    #[error("{what}: {reason}")]
    BadTensor { what: String, reason: String },
    /// An external data reference that is unsafe or broken.
    #[error("{what}: external data: {reason}")]
    ExternalData { what: String, reason: String },
    /// A graph input or output whose type is not a tensor (sequence, map, optional...).
    #[error("value '{name}': {kind} types are not supported, only tensors")]
    NonTensorValue { name: String, kind: String },
    /// A node whose attributes or inputs do not fit its op.
    #[error("node '{node}' ({op}): {reason}")]
    BadNode { node: String, op: String, reason: String },
}
