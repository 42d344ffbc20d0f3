//! Raw pointers handed to the tasks of a parallel loop, and the activation bounds every
//! blocked kernel clamps to.

use crate::ewprog::wide::Wide;
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

/// The `[lo, hi]` the kernels clamp to in registers: the activation's own for a clamp,
/// the whole line for the others (which [`finish`] applies after the store).
pub(super) fn bounds(act: Activation) -> (f32, f32) {
    act.clamp_bounds().unwrap_or((f32::NEG_INFINITY, f32::INFINITY))
}

/// Applies an activation that is not a clamp to the `n` floats just stored at `p` (still in
/// L1); nothing for the clamps, applied before the store. Then the program that followed
/// the layer, if any.
///
/// # Safety
/// `p` must be valid for reads and writes of `n` floats that no other thread touches.
#[inline(always)]
pub(super) unsafe fn finish(act: Activation, post: Option<&Wide>, isa: crate::gemm::Isa, p: *mut f32, n: usize) {
    if act.clamp_bounds().is_none() {
        act.apply_all(isa, std::slice::from_raw_parts_mut(p, n));
    }
    if let Some(post) = post {
        post.apply(p, n);
    }
}

/// A layer's schedule text for its activation and the program after it.
pub(super) fn epilogue_text(act: Activation, post: Option<&Wide>) -> String {
    let a = super::conv::act_text(act);
    match post {
        Some(p) => format!("{a}, then a program of {} steps", p.steps()),
        None => a,
    }
}

/// The program that followed a layer, shared by the layer's copies.
pub type Post = Option<std::sync::Arc<Wide>>;
