//! f32 Transposes of rank two or more become `aim:Transpose` nodes (with their permutation
//! made explicit), which the code generator compiles to copy loops for their rank. Other
//! transposes (other dtypes, unknown rank) keep their library kernels.

use super::fuse::{sources_of, SOURCES};
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node};

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        if !n.domain.is_empty() || n.op != "Transpose" || n.outputs.len() != 1 {
            continue;
        }
        let Some(t) = n.input(0).and_then(|x| g.value_type(x)) else { continue };
        let Some(rank) = t.shape.as_ref().map(|s| s.len()) else { continue };
        if t.dtype != Some(DType::F32) || rank < 2 {
            continue;
        }
        let perm: Vec<i64> = match n.ints("perm") {
            Some(p) => p.to_vec(),
            None => (0..rank as i64).rev().collect(),
        };
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        if sorted != (0..rank as i64).collect::<Vec<_>>() {
            continue;
        }
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("perm".to_string(), Attr::Ints(perm));
        attrs.insert(SOURCES.to_string(), Attr::Strings(sources_of(n)));
        g.nodes[i] = Node {
            name: n.name.clone(),
            op: "Transpose".into(),
            domain: "aim".into(),
            inputs: vec![n.inputs[0].clone()],
            outputs: n.outputs.clone(),
            attrs,
        };
    }
    Ok(())
}
