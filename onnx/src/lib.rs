//! ONNX import (protobuf bytes → [`aim_ir::Model`] in aim's canonical op forms) and export
//! (the way back, for models written in the IR text format).

mod canon;
pub mod contrib;
mod contrib_gather_q;
mod contrib_quant;
mod error;
mod export;
mod import;
mod print;
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod proto;
mod tensor;

pub use aim_ir::mapped::release_pages;
pub use error::ImportError;
pub use export::{export, export_bytes, node_proto, tensor_proto, value_info_proto};
pub use import::{import_bytes, import_file};
pub use print::{print_onnx, OnnxLine};
pub use tensor::{decode_tensor_proto, tensor_from_proto};
