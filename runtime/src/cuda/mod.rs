//! The cuda backend's side of the runtime: the compiled program's data ([`program`]) and,
//! with the `cuda` feature, running it on an NVIDIA GPU through the driver API, loaded
//! dynamically with cudarc (`device`): builds need no CUDA toolkit, and machines without
//! a driver or a GPU get one clear error.

mod program;

#[cfg(feature = "cuda")]
pub mod device;

pub use program::{module, Arg, CudaProgram, Kernel, Launch, Storage, Value, PTX_VERSION};
