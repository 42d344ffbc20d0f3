//! The cuda backend's compiled program as plain data ([`program`]): what `aim-cuda`'s
//! lowering produces, a `.aim` file records, the PTX interpreter runs, and `aim-cuda`'s
//! device runtime launches on a GPU.

mod program;

pub use program::{module, Arg, CudaProgram, Kernel, Launch, Storage, Value, PTX_VERSION};
