//! Replacing every read of one value by another (for passes that remove a node whose output
//! equals a value that already exists).

use aim_ir::{Attr, Graph};

/// Makes every reader of `from` read `to` instead, inside subgraphs too (unless a subgraph
/// defines its own `from`). Graph outputs are not renamed: callers never remove a node that
/// defines one.
pub fn replace_uses(g: &mut Graph, from: &str, to: &str) {
    for n in &mut g.nodes {
        for inp in n.inputs.iter_mut() {
            if inp == from {
                *inp = to.to_string();
            }
        }
        for a in n.attrs.values_mut() {
            if let Attr::Graph(sub) = a {
                let shadows = sub.inputs.iter().any(|i| i.name == from)
                    || sub.initializers.contains_key(from)
                    || sub.nodes.iter().any(|m| m.outputs.iter().any(|o| o == from));
                if !shadows {
                    replace_uses(sub, from, to);
                    for o in sub.outputs.iter_mut() {
                        if o.name == from {
                            o.name = to.to_string();
                        }
                    }
                }
            }
        }
    }
}

/// Whether `v` is one of the graph's outputs (whose name must survive).
pub fn is_output(g: &Graph, v: &str) -> bool {
    g.outputs.iter().any(|o| o.name == v)
}
