//! Weights stored already packed (a `.aim` file written with `aim compile`): an `aim:Conv`
//! or `aim:Dense` whose weight input holds the floats its kernel reads, in the layout of
//! the target the program was compiled for, says so with two attributes — `prepacked`
//! (the kind of kernel they were packed for: `direct` or `direct3` (panels of two or three
//! output blocks), `winograd` or `dense`) and
//! `weight_shape` (the weight's logical dims) — and is prepared by viewing them in place.
//! [`CpuProgram::prepacked`](super::CpuProgram::prepacked) gives a program's packed weights
//! for writing such a file.

use super::{const_f32, prep_err};
use crate::exec::RunError;
use aim_ir::{Attr, Graph, Node, Tensor};

/// A node's weight (input 1, a constant f32), its logical dims (`rank` of them) and, when
/// it is stored packed, the kernel kind it was packed for.
pub(super) fn weight<'g>(
    g: &'g Graph,
    n: &'g Node,
    rank: usize,
) -> Result<(&'g Tensor, Vec<usize>, Option<&'g str>), RunError> {
    let w = const_f32(g, n.input(1)).ok_or_else(|| prep_err(n, "weights must be a constant f32 tensor"))?;
    match n.attrs.get("prepacked") {
        Some(Attr::String(kind)) => {
            let dims: Vec<usize> = match n.attrs.get("weight_shape") {
                Some(Attr::Ints(d)) if d.len() == rank && d.iter().all(|&x| x >= 0) => {
                    d.iter().map(|&x| x as usize).collect()
                }
                _ => return Err(prep_err(n, format!("prepacked weights need a {rank}-D weight_shape attribute"))),
            };
            Ok((w, dims, Some(kind.as_str())))
        }
        Some(_) => Err(prep_err(n, "the prepacked attribute must be a string")),
        None if w.rank() == rank => Ok((w, w.shape().to_vec(), None)),
        None => Err(prep_err(n, format!("weights must be a constant {rank}-D f32 tensor"))),
    }
}
