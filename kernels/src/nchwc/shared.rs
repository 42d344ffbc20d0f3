//! Raw pointers handed to the tasks of a parallel loop, and the activation bounds every
//! blocked kernel clamps to.

use crate::gemm::Activation;

/// An output buffer shared by tasks that each write a disjoint part of it.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: users hand each task a disjoint part.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// An input buffer shared by tasks that only read it.
#[derive(Clone, Copy)]
pub(super) struct In(pub(super) *const f32);
// SAFETY: only read.
unsafe impl Send for In {}
unsafe impl Sync for In {}

/// The `[lo, hi]` an activation clamps to (the whole line for none).
pub(super) fn bounds(act: Activation) -> (f32, f32) {
    match act {
        Activation::Identity => (f32::NEG_INFINITY, f32::INFINITY),
        Activation::Relu => (0.0, f32::INFINITY),
        Activation::Clip(lo, hi) => (lo, hi),
    }
}
