//! Fast f32 kernels for the CPU backend: the common transformer and CNN ops written for
//! speed (vectorised math approximations, row-wise softmax and layer norm, contiguous
//! transposes, batched GEMMs on the packed microkernels), run on the thread pool.
//!
//! Each kernel returns `None` when it does not handle a case (another dtype, a broadcast
//! pattern it has no fast path for), and the backend then runs the reference kernel. The
//! approximations' errors are stated in [`math`] and tested.

mod copy;
mod data;
pub mod math;
mod ops;
mod output;
mod recurrent;
mod resize;

pub use copy::copy_short;

pub use ops::{kernel, scaled_masked_softmax, Ctx, FastKernel};
pub use output::OutSlot;
