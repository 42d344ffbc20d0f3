//! Control flow: If, Loop and Scan run their subgraphs with the enclosing values in scope.

use crate::exec::{run_scoped, RunError, Scope};
use aim_ir::{Graph, Node, Tensor};
use aim_kernels::ops::shape::concat_tensors;
use std::collections::HashMap;

fn fail(n: &Node, msg: impl Into<String>) -> RunError {
    RunError::Node { node: n.name.clone(), op: n.op.clone(), msg: msg.into() }
}

fn body<'a>(n: &'a Node, attr: &str) -> Result<&'a Graph, RunError> {
    n.graph(attr).ok_or_else(|| fail(n, format!("attribute '{attr}' (a graph) is missing")))
}

/// A scope holding the values the subgraph may read (the caller's locals and parents).
fn sub_inputs(g: &Graph, values: Vec<Tensor>) -> HashMap<String, Tensor> {
    g.inputs.iter().map(|i| i.name.clone()).zip(values).collect()
}

pub(crate) fn truthy(t: &Tensor) -> bool {
    t.to_f64_vec().first().is_some_and(|&v| v != 0.0)
}

pub(crate) fn run_if(n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError> {
    let cond = ins.first().and_then(|c| c.as_ref()).ok_or_else(|| fail(n, "the condition input is missing"))?;
    if cond.len() != 1 {
        return Err(fail(n, format!("the condition must hold one element, got shape {:?}", cond.shape())));
    }
    let g = body(n, if truthy(cond) { "then_branch" } else { "else_branch" })?;
    run_scoped(g, HashMap::new(), Some(scope))
}

/// Stacks per-iteration tensors along a new axis `ax` (0 for Loop).
fn stack(parts: &[Tensor], ax: usize, n: &Node) -> Result<Tensor, RunError> {
    let first = parts.first().ok_or_else(|| fail(n, "no iterations to stack"))?;
    let expanded: Vec<Tensor> = parts
        .iter()
        .map(|p| {
            let mut s = p.shape().to_vec();
            s.insert(ax, 1);
            p.reshaped(&s)
        })
        .collect();
    let refs: Vec<&Tensor> = expanded.iter().collect();
    let _ = first;
    concat_tensors(&refs, ax).map_err(|e| fail(n, e.0))
}

pub(crate) fn run_loop(n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError> {
    let g = body(n, "body")?;
    loop_with(n, g, ins, &|| scope.check_deadline(), &mut |vals| run_scoped(g, sub_inputs(g, vals), Some(scope)))
}

/// The loop itself, with `run_body` running one iteration on the body's inputs (iteration
/// number, condition, loop-carried values) — interpreted, or a compiled body program — and
/// `deadline` saying when to stop.
pub(crate) fn loop_with(
    n: &Node,
    g: &Graph,
    ins: &[Option<Tensor>],
    deadline: &dyn Fn() -> Result<(), String>,
    run_body: &mut dyn FnMut(Vec<Tensor>) -> Result<Vec<Tensor>, RunError>,
) -> Result<Vec<Tensor>, RunError> {
    let max_trip = ins.first().and_then(|t| t.as_ref()).map(|t| t.to_i64_vec().first().copied().unwrap_or(0));
    let mut cond = ins.get(1).and_then(|t| t.as_ref()).map(truthy).unwrap_or(true);
    let mut carried: Vec<Tensor> = ins
        .iter()
        .skip(2)
        .map(|t| t.clone().ok_or_else(|| fail(n, "a loop-carried input is missing")))
        .collect::<Result<_, _>>()?;
    let k = carried.len();
    if g.inputs.len() != k + 2 || g.outputs.len() < k + 1 {
        return Err(fail(
            n,
            format!(
                "the body takes {} inputs and gives {} outputs, which does not fit {k} loop-carried values",
                g.inputs.len(),
                g.outputs.len()
            ),
        ));
    }
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); g.outputs.len() - 1 - k];
    let mut i: i64 = 0;
    let mut scan_bytes = 0usize;
    while cond && max_trip.is_none_or(|m| i < m) {
        let mut vals = vec![Tensor::scalar(i), Tensor::from_bools(&[], &[cond])];
        vals.extend(carried.iter().cloned());
        let outs = run_body(vals)?;
        if outs.len() != g.outputs.len() {
            return Err(fail(n, format!("the body gave {} outputs, not {}", outs.len(), g.outputs.len())));
        }
        cond = truthy(&outs[0]);
        carried = outs[1..=k].to_vec();
        for (s, t) in scans.iter_mut().zip(&outs[k + 1..]) {
            s.push(t.clone());
        }
        // Scan outputs are stacked at the end: their total may not pass the tensor limit.
        scan_bytes += outs[k + 1..].iter().map(|t| t.bytes().len()).sum::<usize>();
        aim_ir::limits::check_count(scan_bytes, 1)
            .map_err(|e| fail(n, format!("the scan outputs grew too large after {} iterations: {e}", i + 1)))?;
        deadline().map_err(|e| fail(n, e))?;
        i += 1;
        if i > 1 << 31 {
            return Err(fail(n, "the loop ran for more than 2^31 iterations"));
        }
    }
    let mut out = carried;
    for (j, s) in scans.iter().enumerate() {
        if s.is_empty() {
            // No iterations: an empty stack of the body output's declared per-iteration
            // shape where it is known ([0, 1] for a [1] output), as ONNX Runtime gives.
            let ty = &g.outputs[k + 1 + j].ty;
            let mut shape = vec![0];
            shape.extend(ty.concrete_shape().unwrap_or_default());
            out.push(Tensor::zeros(ty.dtype.unwrap_or(aim_ir::DType::F32), &shape));
        } else {
            out.push(stack(s, 0, n)?);
        }
    }
    Ok(out)
}

pub(crate) fn run_scan(n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError> {
    let g = body(n, "body")?;
    let m = n.int("num_scan_inputs", 0).max(0) as usize;
    let all: Vec<Tensor> = ins.iter().flatten().cloned().collect();
    if all.len() < m {
        return Err(fail(n, format!("{m} scan inputs declared, {} inputs given", all.len())));
    }
    let k = all.len() - m;
    let mut state = all[..k].to_vec();
    let scan_in = &all[k..];
    let in_axes: Vec<usize> = (0..m)
        .map(|i| {
            let a = n.ints("scan_input_axes").and_then(|v| v.get(i).copied()).unwrap_or(0);
            aim_kernels::util::axis(a, scan_in[i].rank()).map_err(|e| fail(n, e.0))
        })
        .collect::<Result<_, _>>()?;
    let in_dirs: Vec<i64> =
        (0..m).map(|i| n.ints("scan_input_directions").and_then(|v| v.get(i).copied()).unwrap_or(0)).collect();
    let steps = scan_in.first().map(|t| t.shape()[in_axes[0]]).unwrap_or(0);
    for (t, &a) in scan_in.iter().zip(&in_axes) {
        if t.shape()[a] != steps {
            return Err(fail(n, "scan inputs have different lengths along their scan axes"));
        }
    }
    let n_out = g.outputs.len().saturating_sub(k);
    let mut outs: Vec<Vec<Tensor>> = vec![Vec::new(); n_out];
    for step in 0..steps {
        let mut vals = state.clone();
        for (i, t) in scan_in.iter().enumerate() {
            let s = if in_dirs[i] != 0 { steps - 1 - step } else { step };
            let ax = in_axes[i];
            let (outer, len, inner) = aim_kernels::ops::norm::lanes(t.shape(), ax);
            let offs: Vec<usize> =
                (0..outer).flat_map(|o| (0..inner).map(move |j| (o * len + s) * inner + j)).collect();
            let mut shape = t.shape().to_vec();
            shape.remove(ax);
            vals.push(aim_kernels::util::gather_elems(t, &shape, &offs).map_err(|e| fail(n, e.0))?);
        }
        let res = run_scoped(g, sub_inputs(g, vals), Some(scope))?;
        state = res[..k].to_vec();
        for (o, t) in outs.iter_mut().zip(&res[k..]) {
            o.push(t.clone());
        }
    }
    let mut result = state;
    for (j, o) in outs.iter_mut().enumerate() {
        if n.ints("scan_output_directions").and_then(|v| v.get(j).copied()).unwrap_or(0) != 0 {
            o.reverse();
        }
        let r = o.first().map_or(0, |t| t.rank()) + 1;
        let ax = n.ints("scan_output_axes").and_then(|v| v.get(j).copied()).unwrap_or(0);
        let ax = aim_kernels::util::axis(ax, r).map_err(|e| fail(n, e.0))?;
        result.push(stack(o, ax, n)?);
    }
    Ok(result)
}
