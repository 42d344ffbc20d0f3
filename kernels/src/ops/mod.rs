//! The reference kernels, one module per family of ops.

pub mod attention;
pub mod binary;
pub mod conv;
pub mod einsum;
pub mod elementwise;
pub mod index;
pub mod loss;
pub mod matmul;
pub mod misc;
pub mod norm;
pub mod pool;
pub mod quant;
pub mod recurrent;
pub mod reduce;
pub mod resize;
pub mod sample;
pub mod shape;
pub mod window;
