//! `aim-ir`: the graph IR every part of aim speaks.
//!
//! It holds the types (dtypes, symbolic shapes, tensors), the graph of named values and
//! nodes, the text format that prints and parses back, the verifier, and static shape and
//! type inference. It knows nothing of any backend. The written specification of the IR
//! and of every op is `ir-spec/SPEC.md`.

pub mod aim_file;
mod column_codes;
pub mod custom;
mod dtype;
mod graph;
pub mod infer;
pub mod limits;
pub mod liveness;
pub mod mapped;
pub mod schema;
mod shape;
mod tensor;
pub mod text;
mod verify;

pub use column_codes::{field, ColumnCodes};
pub use dtype::DType;
pub use graph::{Attr, Graph, Model, Node, ValueInfo};
pub use shape::{Dim, ValueType};
pub use tensor::{Elem, SizeMismatch, Tensor, ALIGN};
pub use verify::{verify, verify_nodes, VerifyError};
