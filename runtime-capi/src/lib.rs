//! `libaim_runtime`: aim's runtime without the compiler, exporting the C ABI of
//! `include/aim.h` for models compiled ahead of time (`aim compile --target ... -o
//! libNAME.so`, whose `NAME_load` calls `aim_runtime_load_embedded` here). It has every
//! function of the header but `aim_model_load`, which compiles `.onnx` and `.aim` files and
//! so lives in `libaim` (which exports this same ABI as well). The functions are those of
//! `capi/src/abi.rs`, included as is so that the two libraries cannot drift apart.

#[path = "../../capi/src/abi.rs"]
mod abi;

pub use abi::*;
