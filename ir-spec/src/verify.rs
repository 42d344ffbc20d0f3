//! The verifier: structural checks every graph must pass before any pass or backend sees it.

use crate::{Attr, Graph, Node};
use std::collections::HashSet;

/// A structural error in a graph, naming the node and value involved.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VerifyError {
    /// A node reads a value nothing defines.
    #[error("node '{node}' ({op}) reads '{value}', which no input, initializer or node defines")]
    Dangling { node: String, op: String, value: String },
    /// A node reads a value defined only by a later node: the order is not topological,
    /// which for a well-formed model means a cycle.
    #[error("node '{node}' ({op}) reads '{value}' before the node that defines it (a cycle, or nodes out of order)")]
    OutOfOrder { node: String, op: String, value: String },
    /// Two definitions of one value.
    #[error("value '{value}' is defined twice (second time by {by})")]
    Redefined { value: String, by: String },
    /// A graph output that nothing defines.
    #[error("graph output '{value}' is not defined by any input, initializer or node")]
    UndefinedOutput { value: String },
    /// An initializer's data does not match the type the graph declares for it.
    #[error("'{value}': declared {declared}, but its initializer is {actual}")]
    InitializerType { value: String, declared: String, actual: String },
    /// A node does not fit its op's schema (arity, attribute types, values) or, for
    /// control flow, its subgraphs do not fit the node.
    #[error("node '{node}' ({op}): {msg}")]
    Node { node: String, op: String, msg: String },
    /// A graph input has no element type.
    #[error("graph input '{value}' has no type (ONNX requires one)")]
    UntypedInput { value: String },
}

/// Checks a graph (and its subgraphs): every value defined once, every use after its
/// definition, every output defined, initializers agreeing with declared input types,
/// every node fitting its op's schema (`crate::schema`) and control-flow subgraphs fitting
/// their nodes, and every input of the main graph typed.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    for i in &g.inputs {
        if i.ty.dtype.is_none() {
            return Err(VerifyError::UntypedInput { value: i.name.clone() });
        }
    }
    verify_scoped(g, &HashSet::new())
}

/// The checks of [`verify`] but the one that graph inputs are typed: for a graph the
/// compiler made, such as a control-flow body compiled on its own, which reads values of
/// the enclosing graph whose types inference may not know.
pub fn verify_nodes(g: &Graph) -> Result<(), VerifyError> {
    verify_scoped(g, &HashSet::new())
}

/// Checks that the subgraphs of an If, Loop or Scan node fit it.
fn control_flow(n: &Node) -> Result<(), String> {
    let outs = n.outputs.len();
    match n.op.as_str() {
        "If" => {
            let (Some(t), Some(e)) = (n.graph("then_branch"), n.graph("else_branch")) else {
                return Err("needs graph attributes then_branch and else_branch".into());
            };
            for (name, b) in [("then_branch", t), ("else_branch", e)] {
                if b.outputs.len() != outs {
                    return Err(format!("{name} has {} outputs, the node {outs}", b.outputs.len()));
                }
                if !b.inputs.is_empty() {
                    return Err(format!("{name} takes {} inputs; If branches take none", b.inputs.len()));
                }
            }
            for (k, (a, b)) in t.outputs.iter().zip(&e.outputs).enumerate() {
                if let (Some(x), Some(y)) = (a.ty.dtype, b.ty.dtype) {
                    if x != y {
                        return Err(format!("output {k} is {x} in then_branch but {y} in else_branch"));
                    }
                }
            }
        }
        "Loop" => {
            let body = n.graph("body").ok_or("needs a graph attribute body")?;
            let carried = n.inputs.len().saturating_sub(2);
            if body.inputs.len() != carried + 2 {
                return Err(format!(
                    "the body takes {} inputs; with {carried} loop-carried values it must take {}",
                    body.inputs.len(),
                    carried + 2
                ));
            }
            if body.outputs.len() < carried + 1 || outs > body.outputs.len() - 1 {
                return Err(format!(
                    "the body gives {} outputs: the condition, {carried} loop-carried values and the scan outputs, \
                     which does not fit the node's {outs} outputs",
                    body.outputs.len()
                ));
            }
        }
        "Scan" => {
            let body = n.graph("body").ok_or("needs a graph attribute body")?;
            let m = n.opt_int("num_scan_inputs").ok_or("needs attribute num_scan_inputs")?;
            if m < 1 || m as usize > n.inputs.len() {
                return Err(format!("num_scan_inputs is {m}, with {} inputs", n.inputs.len()));
            }
            if body.inputs.len() != n.inputs.len() {
                return Err(format!("the body takes {} inputs, the node gives {}", body.inputs.len(), n.inputs.len()));
            }
            let state = n.inputs.len() - m as usize;
            if body.outputs.len() != outs || outs < state {
                return Err(format!(
                    "the body gives {} outputs, the node has {outs} ({state} of them state)",
                    body.outputs.len()
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

fn verify_scoped(g: &Graph, outer: &HashSet<String>) -> Result<(), VerifyError> {
    let mut defined: HashSet<String> = HashSet::new();
    let define = |defined: &mut HashSet<String>, v: &str, by: &str| {
        if !defined.insert(v.to_string()) {
            return Err(VerifyError::Redefined { value: v.to_string(), by: by.to_string() });
        }
        Ok(())
    };
    for i in &g.inputs {
        define(&mut defined, &i.name, "a graph input")?;
    }
    for name in g.initializers.keys() {
        define(&mut defined, name, "an initializer")?;
    }
    let later: HashSet<&str> = g.nodes.iter().flat_map(|n| n.outputs.iter().map(|s| s.as_str())).collect();
    for n in &g.nodes {
        let bad = |msg: String| VerifyError::Node { node: n.name.clone(), op: n.op.clone(), msg };
        crate::schema::check(n).map_err(bad)?;
        if matches!(n.domain.as_str(), "" | "ai.onnx") {
            control_flow(n).map_err(bad)?;
        }
        for inp in n.inputs.iter().filter(|s| !s.is_empty()) {
            if defined.contains(inp) || outer.contains(inp) {
                continue;
            }
            let (node, op, value) = (n.name.clone(), n.op.clone(), inp.clone());
            return Err(if later.contains(inp.as_str()) {
                VerifyError::OutOfOrder { node, op, value }
            } else {
                VerifyError::Dangling { node, op, value }
            });
        }
        for a in n.attrs.values() {
            if let Attr::Graph(sub) = a {
                let scope: HashSet<String> = outer.union(&defined).cloned().collect();
                verify_scoped(sub, &scope)?;
            }
        }
        for o in n.outputs.iter().filter(|s| !s.is_empty()) {
            define(&mut defined, o, &format!("node '{}'", n.name))?;
        }
    }
    for o in &g.outputs {
        if !defined.contains(&o.name) && !outer.contains(&o.name) {
            return Err(VerifyError::UndefinedOutput { value: o.name.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_graph;

    #[test]
    fn detects_dangling_and_out_of_order() {
        let g = parse_graph("graph \"g\" {\n input %x: f32[2]\n %y = Relu(%z)  # r\n output %y: f32[2]\n}\n").unwrap();
        assert!(matches!(verify(&g), Err(VerifyError::Dangling { .. })));
        let g = parse_graph(
            "graph \"g\" {\n input %x: f32[2]\n %y = Relu(%z)  # r\n %z = Relu(%y)  # s\n output %y: f32[2]\n}\n",
        )
        .unwrap();
        assert!(matches!(verify(&g), Err(VerifyError::OutOfOrder { .. })));
    }

    #[test]
    fn detects_redefinition() {
        let g = parse_graph("graph \"g\" {\n input %x: f32[2]\n %x = Relu(%x)  # r\n output %x: f32[2]\n}\n").unwrap();
        assert!(matches!(verify(&g), Err(VerifyError::Redefined { .. })));
    }
}
