//! Control flow with compiled bodies: the branches of an `If` and the body of a `Loop`,
//! each compiled by the compiler into a program of its own (with its own arena and
//! prepared kernels), instead of being interpreted node by node on the reference kernels.
//!
//! A body program's inputs are, in order, the body's own inputs (a Loop's iteration
//! number, condition and loop-carried values; none for an If branch) and then the values
//! of the enclosing program it reads, by name; [`Body`] records where the enclosing program
//! keeps each of those.

use super::CpuProgram;
use crate::control::{loop_with, truthy};
use crate::exec::{Deadline, RunError};
use aim_ir::{Graph, Node, Tensor};
use std::collections::HashMap;

/// The compiled subgraphs of one control-flow node.
pub enum Body {
    /// An If's two branches.
    If {
        /// `then_branch`.
        then: Box<CpuProgram>,
        /// `else_branch`.
        otherwise: Box<CpuProgram>,
    },
    /// A Loop's body.
    Loop(Box<CpuProgram>),
}

/// Compiled bodies by the index of their node in the enclosing program's graph.
pub type Bodies = HashMap<usize, Body>;

/// The inputs of `prog` (past its first `skip`, the body's own) taken from the enclosing
/// program's values by name.
fn outer_inputs(
    prog: &CpuProgram,
    skip: usize,
    value: &dyn Fn(&str) -> Result<Tensor, RunError>,
) -> Result<HashMap<String, Tensor>, RunError> {
    prog.graph().inputs[skip.min(prog.graph().inputs.len())..]
        .iter()
        .map(|i| Ok((i.name.clone(), value(&i.name)?)))
        .collect()
}

impl Body {
    /// Runs the node with its compiled bodies: `ins` are its inputs, `value(name)` gives
    /// any value of the enclosing program the bodies read.
    pub(super) fn run(
        &self,
        n: &Node,
        ins: &[Option<Tensor>],
        value: &dyn Fn(&str) -> Result<Tensor, RunError>,
        deadline: Option<Deadline>,
    ) -> Result<Vec<Tensor>, RunError> {
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: n.op.clone(), msg };
        match self {
            Body::If { then, otherwise } => {
                let cond =
                    ins.first().and_then(|c| c.as_ref()).ok_or_else(|| fail("the condition is missing".into()))?;
                if cond.len() != 1 {
                    return Err(fail(format!("the condition must hold one element, got shape {:?}", cond.shape())));
                }
                let prog = if truthy(cond) { then } else { otherwise };
                prog.run_within(outer_inputs(prog, 0, value)?, deadline)
            }
            Body::Loop(prog) => {
                let g: &Graph = n.graph("body").ok_or_else(|| fail("the body is missing".into()))?;
                let own = g.inputs.len();
                let outer = outer_inputs(prog, own, value)?;
                let names: Vec<String> = prog.graph().inputs[..own].iter().map(|i| i.name.clone()).collect();
                let check = || Deadline::check(deadline, &n.name).map_err(|e| e.to_string());
                loop_with(n, g, ins, &check, &mut |vals: Vec<Tensor>| {
                    let mut all = outer.clone();
                    all.extend(names.iter().cloned().zip(vals));
                    prog.run_within(all, deadline)
                })
            }
        }
    }
}
