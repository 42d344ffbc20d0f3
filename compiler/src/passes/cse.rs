//! Common subexpression elimination: two nodes with the same op, attributes and inputs
//! compute the same values; the later one is removed, its readers read the earlier one,
//! and the earlier one lists the later one's ONNX sources too. It runs again after the
//! quantization passes, whose rewrites can leave two conversions of the same bytes (a
//! QLinearMul's expansion dequantizes the tensor the activation before it dequantized).

use super::fuse::{sources_of, SOURCES};
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
        // Attributes print deterministically (ordered, full tensor values via Debug); the
        // ONNX nodes a node came from are provenance, not semantics.
        let attrs: Vec<_> = n.attrs.iter().filter(|(k, _)| k.as_str() != SOURCES).collect();
        let key = format!("{}:{}({:?}){:?}#{}", n.domain, n.op, n.inputs, attrs, n.outputs.len());
        match seen.get(&key) {
            Some(&first) => {
                let (dup, orig) = (g.nodes[i].outputs.clone(), g.nodes[first].outputs.clone());
                // The kept node now also stands for the removed one's sources.
                let mut sources = sources_of(&g.nodes[first]);
                for s in sources_of(&g.nodes[i]) {
                    if !sources.contains(&s) {
                        sources.push(s);
                    }
                }
                g.nodes[first].attrs.insert(SOURCES.into(), Attr::Strings(sources));
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
        assert!(!g.nodes.iter().any(|n| n.name == "r2") && text.contains("Add(%a, %a)"), "{text}");
    }

    /// Nodes that differ only in the ONNX nodes they came from are merged, and the kept
    /// one names both.
    #[test]
    fn provenance_does_not_keep_duplicates() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[4]\n %a = Relu(%x)  # r1\n %b = Relu(%x)  # r2\n %c = Add(%a, %b)  # add\n output %c: f32[4]\n}\n",
        )
        .unwrap();
        for (n, from) in g.nodes.iter_mut().zip(["conv_a", "mul_b"]) {
            n.attrs.insert(super::SOURCES.into(), aim_ir::Attr::Strings(vec![from.into()]));
        }
        super::run(&mut g).unwrap();
        assert_eq!(g.nodes.len(), 2);
        assert_eq!(g.nodes[0].strings(super::SOURCES), Some(&["conv_a".to_string(), "mul_b".to_string()][..]));
        assert_eq!(g.nodes[1].inputs, ["a", "a"]);
    }
}
