//! Programs after layers: an `aim:Conv`, `aim:Dense` or `aim:ConvInteger` whose output only a one-input
//! `aim:Elementwise` reads takes that node's program as its `post` attribute, which the
//! kernels apply to each tile after the activation, while the tile is still in L1 — one
//! pass over memory fewer per layer. What follows a layer in real models and is not in the
//! activation table: a learnt scale and shift after HardSwish (PP-LCNet), `max(x, -0.4)`
//! after LeakyRelu (a tf.keras embedding model), a quantize-dequantize pair after every
//! product of a QDQ model run in f32.

use super::{fuse::sources_of, uses::readers, PassError, SOURCES};
use aim_ir::{Attr, Graph};

/// Attribute holding the program (`aim_kernels::ewprog` lines, one input: the layer's
/// output after its activation).
pub const POST: &str = "post";

/// Fuses each one-input elementwise program into the layer computing its only input.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let r = readers(g);
    let outputs: std::collections::HashSet<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut merges = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.domain != "aim" || !matches!(n.op.as_str(), "Conv" | "Dense" | "ConvInteger") || n.attrs.contains_key(POST)
        {
            continue;
        }
        let [out] = &n.outputs[..] else { continue };
        if outputs.contains(out.as_str()) {
            continue;
        }
        let Some(&[e]) = r.get(out).map(|v| &v[..]) else { continue };
        let p = &g.nodes[e];
        let one_input = p.inputs.len() == 1 && &p.inputs[0] == out && p.outputs.len() == 1;
        if p.domain == "aim" && p.op == "Elementwise" && one_input {
            if let Some(Attr::Strings(prog)) = p.attrs.get("program") {
                merges.push((i, e, prog.clone()));
            }
        }
    }
    for (i, e, prog) in merges {
        let mut sources = sources_of(&g.nodes[i]);
        sources.extend(sources_of(&g.nodes[e]));
        let out = g.nodes[e].outputs[0].clone();
        let n = &mut g.nodes[i];
        n.attrs.insert(POST.into(), Attr::Strings(prog));
        n.attrs.insert(SOURCES.into(), Attr::Strings(sources));
        n.outputs[0] = out;
        removed[e] = true;
    }
    super::uses::remove_marked(g, &removed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::{DType, Node, Tensor, ValueInfo, ValueType};

    fn node(op: &str, domain: &str, inputs: &[&str], output: &str) -> Node {
        Node {
            name: output.into(),
            op: op.into(),
            domain: domain.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: vec![output.into()],
            attrs: Default::default(),
        }
    }

    fn program(lines: &[&str]) -> Attr {
        Attr::Strings(lines.iter().map(|s| s.to_string()).collect())
    }

    fn info(name: &str) -> ValueInfo {
        ValueInfo { name: name.into(), ty: ValueType::known(DType::F32, &[1, 4]) }
    }

    fn graph(nodes: Vec<Node>, output: &str) -> Graph {
        let mut g = Graph::default();
        g.inputs.push(info("x"));
        g.initializers.insert("w".into(), Tensor::from_vec(&[4, 4], vec![0.5f32; 16]));
        g.outputs.push(info(output));
        g.nodes = nodes;
        g
    }

    #[test]
    fn a_program_read_only_by_a_layer_joins_it() {
        let mut e = node("Elementwise", "aim", &["d"], "y");
        e.attrs.insert("program".into(), program(&["in 0", "mul 0 c2.0", "max 1 c-0.4"]));
        let mut g = graph(vec![node("Dense", "aim", &["x", "w"], "d"), e], "y");
        run(&mut g).unwrap();
        assert_eq!(g.nodes.len(), 1, "{:?}", g.nodes);
        let d = &g.nodes[0];
        assert_eq!((d.op.as_str(), d.outputs[0].as_str()), ("Dense", "y"));
        assert_eq!(d.strings(POST).unwrap(), ["in 0", "mul 0 c2.0", "max 1 c-0.4"]);
        assert_eq!(d.strings(SOURCES).unwrap(), ["d", "y"]);
    }

    #[test]
    fn a_layer_read_elsewhere_or_a_program_of_two_inputs_stays_apart() {
        // The layer's output is also a graph output.
        let mut e = node("Elementwise", "aim", &["d"], "y");
        e.attrs.insert("program".into(), program(&["in 0", "neg 0"]));
        let mut g = graph(vec![node("Dense", "aim", &["x", "w"], "d"), e.clone()], "y");
        g.outputs.push(info("d"));
        run(&mut g).unwrap();
        assert_eq!(g.nodes.len(), 2);
        // The program also reads the graph input.
        let mut e2 = node("Elementwise", "aim", &["d", "x"], "y");
        e2.attrs.insert("program".into(), program(&["in 0", "in 1", "add 0 1"]));
        let mut g = graph(vec![node("Dense", "aim", &["x", "w"], "d"), e2], "y");
        run(&mut g).unwrap();
        assert_eq!(g.nodes.len(), 2);
        // Two readers.
        let mut g = graph(vec![node("Dense", "aim", &["x", "w"], "d"), e, node("Add", "", &["d", "y"], "z")], "z");
        run(&mut g).unwrap();
        assert_eq!(g.nodes.len(), 3);
    }
}
