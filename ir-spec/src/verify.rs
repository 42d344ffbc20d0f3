//! The verifier: structural checks every graph must pass before any pass or backend sees it.

use crate::{Attr, Graph};
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
}

/// Checks a graph (and its subgraphs): every value defined once, every use after its
/// definition, every output defined, initializers agreeing with declared input types.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    verify_scoped(g, &HashSet::new())
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
