//! A PTX interpreter for the subset of PTX that aim's cuda backend emits.
//!
//! aim generates PTX text itself; CI machines have no GPU. This crate parses that text and
//! runs kernels on the CPU with the PTX execution model: a grid of blocks, each block's
//! threads grouped in warps of 32, per-block shared memory, `bar.sync` barriers, warp
//! collectives (`shfl.sync`, `mma.sync`) executed when every live lane of the warp has
//! reached them, and `cp.async` copies (done at once, which is one of the orders the
//! hardware may choose). Every global and shared access is bounds-checked against the
//! buffers it may touch, so a kernel that reads or writes outside them fails its test
//! instead of passing by luck.
//!
//! What it is not: a timing model, or a check of anything aim does not emit. An
//! instruction outside the subset is a parse error naming it.

mod exec;
mod parse;
mod program;

pub use exec::{Arg, ExecError, Launch, Memory, Stats};
pub use parse::{Module, ParseError};
pub use program::{run_program, Placement};
