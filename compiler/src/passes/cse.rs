//! Common subexpression elimination: two nodes with the same op, attributes and inputs
//! compute the same values; the later one is removed and its readers read the earlier one.

use super::rename::{is_output, replace_uses};
use super::PassError;
use aim_ir::{Attr, Graph};
use std::collections::HashMap;

/// Ops whose results are not a function of their inputs.
const IMPURE: &[&str] =
    &["RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli", "Multinomial"];

/// Removes duplicate nodes.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut i = 0;
    while i < g.nodes.len() {
        let n = &g.nodes[i];
        let skip = IMPURE.contains(&n.op.as_str())
            || n.attrs.values().any(|a| matches!(a, Attr::Graph(_)))
            || n.outputs.iter().any(|o| is_output(g, o));
        if skip {
            i += 1;
            continue;
        }
        // Attributes print deterministically (ordered, full tensor values via Debug).
        let key = format!("{}:{}({:?}){:?}#{}", n.domain, n.op, n.inputs, n.attrs, n.outputs.len());
        match seen.get(&key) {
            Some(&first) => {
                let (dup, orig) = (g.nodes[i].outputs.clone(), g.nodes[first].outputs.clone());
                g.nodes.remove(i);
                for (d, o) in dup.iter().zip(&orig) {
                    if !d.is_empty() && !o.is_empty() {
                        replace_uses(g, d, o);
                    }
                }
            }
            None => {
                seen.insert(key, i);
                i += 1;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use aim_ir::text::{parse_graph, print_graph, TensorDetail};

    #[test]
    fn duplicates_are_merged() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[4]\n %a = Relu(%x)  # r1\n %b = Relu(%x)  # r2\n %c = Add(%a, %b)  # add\n output %c: f32[4]\n}\n",
        )
        .unwrap();
        super::run(&mut g).unwrap();
        let text = print_graph(&g, TensorDetail::Full);
        assert!(!text.contains("r2") && text.contains("Add(%a, %a)"), "{text}");
    }
}
