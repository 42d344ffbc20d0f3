//! The kernels' own tests, through the crate's public API: one test binary, so that
//! `cargo test` links once and does not compile the whole crate a second time in test mode
//! (the library has `test = false`).

mod fast;
mod fast_copy;
mod fast_math;
mod gemm;
mod int8;
mod nchwc;
mod ops_elementwise;
mod ops_quant;
mod qconv;
mod qconv16;
mod qgemm;
mod qmatmul;
mod registry;
mod robustness;
mod scratch;
mod util;
