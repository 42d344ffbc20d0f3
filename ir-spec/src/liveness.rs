//! Liveness: the last node of a graph that reads each value.
//!
//! Architecture invariant: every executor and the memory plan compute value lifetimes
//! with [`last_reads`], so they agree on when a value dies. A node that holds subgraphs
//! (If, Loop, Scan) reads every enclosing value those subgraphs read, at any depth: a value
//! used only inside a branch lives until the node holding the branch has run.

use crate::{Attr, Graph};
use std::collections::HashMap;

/// For each value `g`'s nodes read — as an input, or anywhere inside their subgraphs — the
/// index of the last node that reads it. Graph outputs are not counted as reads: callers
/// keep them alive to the end themselves.
pub fn last_reads(g: &Graph) -> HashMap<String, usize> {
    let mut last = HashMap::new();
    let mut inner = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for x in n.inputs.iter().filter(|s| !s.is_empty()) {
            last.insert(x.clone(), i);
        }
        for a in n.attrs.values() {
            if let Attr::Graph(sub) = a {
                inner.clear();
                sub.names_read(&mut inner);
                for x in inner.drain(..) {
                    last.insert(x, i);
                }
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_graph;

    #[test]
    fn reads_inside_nested_subgraphs_count_at_the_holding_node() {
        let g = parse_graph(
            "graph \"g\" {\n input %x: f32[2]\n input %c: bool[]\n %k = Relu(%x)  # k\n %y = If(%c) {else_branch=graph \"e\" {\n output %x: f32[2]\n }, then_branch=graph \"t\" {\n %i = If(%c) {else_branch=graph \"e2\" {\n output %x: f32[2]\n }, then_branch=graph \"t2\" {\n %r = Neg(%k)  # r\n output %r: f32[2]\n }}  # i\n output %i: f32[2]\n }}  # if\n %z = Neg(%x)  # z\n output %y: f32[2]\n output %z: f32[2]\n}\n",
        )
        .unwrap();
        let last = last_reads(&g);
        assert_eq!(last["k"], 1, "k is read inside the nested branch of node 1");
        assert_eq!(last["x"], 2);
        assert_eq!(last["c"], 1);
        assert!(!last.contains_key("y"), "graph outputs are not reads");
    }
}
