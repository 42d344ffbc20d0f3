//! Fast f32 kernels for the CPU backend: the common transformer and CNN ops written for
//! speed (vectorised math approximations, row-wise softmax and layer norm, contiguous
//! transposes, batched GEMMs on the packed microkernels), run on the thread pool.
//!
//! Each kernel returns `None` when it does not handle a case (another dtype, a broadcast
//! pattern it has no fast path for), and the backend then runs the reference kernel. The
//! approximations' errors are stated in [`math`] and tested.

mod attention;
pub mod copy;
mod data;
mod gru;
mod logic;
pub mod math;
mod ops;
mod output;
mod qmatmul;
pub mod quant;
mod recurrent;
mod rnn;
mod sequence;
pub use gru::GruWeights;
pub use recurrent::{LstmWeights, RecurrentWeights};
pub use rnn::RnnWeights;
mod reduce;
mod resize;
mod taps;

pub use attention::attention;
pub use copy::{copy_short, zero_short};
pub use qmatmul::qmatmul;
pub use taps::{tap_rows, MAX_TAPS};

/// Whether an op's kernel only relabels its input (a new shape over the same bytes) or
/// reads nothing but its input's shape: Reshape and its kin, Identity, Shape, Size. Their
/// one kernel (shared with the reference backend) moves no data, so they need no fast path;
/// `aim info` and the schedule list them as such.
pub fn moves_no_data(op: &str) -> bool {
    matches!(op, "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" | "Shape" | "Size")
}

pub use ops::{covers, kernel, scaled_masked_softmax, Ctx, FastKernel};
pub use output::OutSlot;
