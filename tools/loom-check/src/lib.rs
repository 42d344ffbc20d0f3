//! The claim counter of the thread pool's parallel loops, compiled from the runtime's own
//! source so that loom checks the code that ships: with `--cfg loom` its atomics are loom's,
//! and `claims::tests::loom_model` explores every interleaving and memory ordering.
//! Without it, this crate only runs the counter's plain unit test a second time.

#[path = "../../../runtime/src/claims.rs"]
#[allow(dead_code)]
mod claims;
