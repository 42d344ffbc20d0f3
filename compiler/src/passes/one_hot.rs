//! A product of a one-hot encoding with a constant matrix — `MatMul(Cast(Equal(ids, iota)),
//! W)`, as `jax.nn.one_hot` / `tf.one_hot` followed by a dense layer export it (an embedding
//! written as arithmetic) — becomes a row lookup: `Gather(W', where(0 ≤ ids < depth, ids,
//! depth))`, W' being W with a row of zeros appended for the ids the encoding maps to no
//! row. Exact: each one-hot row selects one row of W (the other products are zeros), so the
//! lookup gives the same values without the depth-times-larger encoding or the GEMM over it
//! (a file-type classifier's 2048 × 257 encoding and its 2048 × 257 × 64 product were 12% of
//! its time). W must be finite (0 · ∞ would be NaN in the product), `iota` a constant whose
//! every row along the last axis is 0, 1, …, depth − 1, and the ids integers of the shape the
//! encoding has with a last dim of 1; intermediates read elsewhere stop the match.

use super::fuse::{sources_of, SOURCES};
use super::uses::{producers, readers};
use super::PassError;
use aim_ir::{Attr, DType, Dim, Graph, Node, Tensor};
use std::collections::HashMap;

/// A match: the MatMul, Cast and Equal nodes, the ids, the table's name and the depth.
struct Found {
    nodes: [usize; 3],
    ids: String,
    table: String,
    depth: usize,
}

/// Whether `t` counts 0, 1, …, depth − 1 along its last axis, in every row.
fn is_iota(t: &Tensor) -> Option<usize> {
    let depth = *t.shape().last()?;
    if depth == 0 || !(t.dtype().is_int() || t.dtype().is_float()) {
        return None;
    }
    let v = t.to_f64_vec();
    v.iter().enumerate().all(|(i, &x)| x == (i % depth) as f64).then_some(depth)
}

fn find(g: &Graph, readers: &HashMap<String, Vec<usize>>, by_output: &HashMap<&str, usize>, m: usize) -> Option<Found> {
    let only = |v: &str, reader: usize| readers.get(v).is_some_and(|r| r.as_slice() == [reader]);
    let mm = &g.nodes[m];
    if mm.op != "MatMul" || !mm.domain.is_empty() {
        return None;
    }
    let table = mm.input(1)?;
    let w = g.initializers.get(table)?;
    if w.dtype() != DType::F32 || w.rank() != 2 {
        return None;
    }
    let c = *by_output.get(mm.input(0)?)?;
    let cast = &g.nodes[c];
    if cast.op != "Cast" || cast.int("to", 0) != 1 || !only(&cast.outputs[0], m) {
        return None;
    }
    let e = *by_output.get(cast.input(0)?)?;
    let eq = &g.nodes[e];
    if eq.op != "Equal" || !eq.domain.is_empty() || !only(&eq.outputs[0], c) {
        return None;
    }
    let (a, b) = (eq.input(0)?, eq.input(1)?);
    let (ids, iota) = if g.initializers.contains_key(b) { (a, b) } else { (b, a) };
    let iota = g.initializers.get(iota)?;
    let depth = is_iota(iota)?;
    if depth != w.shape()[0] {
        return None;
    }
    // The ids: integers of shape [..., 1] whose leading dims the iota's broadcast keeps.
    let ty = g.value_type(ids)?;
    let shape = ty.shape.as_ref()?;
    if !matches!(ty.dtype, Some(DType::I32 | DType::I64)) || shape.last() != Some(&Dim::Known(1)) {
        return None;
    }
    let lead = &iota.shape()[..iota.rank() - 1];
    if lead.len() > shape.len() - 1 {
        return None;
    }
    let id_lead = &shape[shape.len() - 1 - lead.len()..shape.len() - 1];
    if !lead.iter().zip(id_lead).all(|(&d, i)| d == 1 || *i == Dim::Known(d)) {
        return None;
    }
    // Last, once the nodes match: reading every weight of every MatMul here would copy each
    // unaligned one out of the mapped file (the load's peak memory, doubled).
    if w.data::<f32>().iter().any(|v| !v.is_finite()) {
        return None;
    }
    Some(Found { nodes: [m, c, e], ids: ids.to_string(), table: table.to_string(), depth })
}

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let found: Vec<Found> = {
        let r = readers(g);
        let by_output = producers(g);
        (0..g.nodes.len()).filter_map(|m| find(g, &r, &by_output, m)).collect()
    };
    if found.is_empty() {
        return Ok(());
    }
    let mut gone = vec![false; g.nodes.len()];
    let mut lookups: HashMap<usize, Vec<Node>> = HashMap::new();
    for f in found {
        let [m, c, e] = f.nodes;
        let name = g.nodes[m].name.clone();
        let out = g.nodes[m].outputs[0].clone();
        let mut sources = Vec::new();
        for i in [e, c, m] {
            sources.extend(sources_of(&g.nodes[i]));
        }
        // The table with a row of zeros for ids outside 0..depth.
        let w = &g.initializers[&f.table];
        let cols = w.shape()[1];
        let mut rows = w.data::<f32>().to_vec();
        rows.resize((f.depth + 1) * cols, 0.0);
        let id_type = g.value_type(&f.ids).and_then(|t| t.dtype).unwrap_or(DType::I64);
        let k = |s: &str| format!("{name}::{s}");
        g.initializers.insert(k("table"), Tensor::from_vec(&[f.depth + 1, cols], rows));
        g.initializers.insert(k("zero"), Tensor::from_f64(id_type, &[], &[0.0]));
        g.initializers.insert(k("depth"), Tensor::from_f64(id_type, &[], &[f.depth as f64]));
        g.initializers.insert(k("last"), Tensor::from_vec(&[1], vec![-1i64]));
        let attrs = |extra: Vec<(&str, Attr)>| {
            let mut a: std::collections::BTreeMap<String, Attr> =
                extra.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            a.insert(SOURCES.to_string(), Attr::Strings(sources.clone()));
            a
        };
        let node = |op: &str, suffix: &str, ins: Vec<String>, outv: String, extra: Vec<(&str, Attr)>| Node {
            name: format!("{name}/{suffix}"),
            op: op.into(),
            domain: String::new(),
            inputs: ins,
            outputs: vec![outv],
            attrs: attrs(extra),
        };
        let ids = f.ids.clone();
        lookups.insert(
            m,
            vec![
                node("GreaterOrEqual", "ge", vec![ids.clone(), k("zero")], k("ge"), vec![]),
                node("Less", "lt", vec![ids.clone(), k("depth")], k("lt"), vec![]),
                node("And", "in_range", vec![k("ge"), k("lt")], k("in_range"), vec![]),
                node("Where", "row", vec![k("in_range"), ids, k("depth")], k("row"), vec![]),
                node("Squeeze", "rows", vec![k("row"), k("last")], k("rows"), vec![]),
                Node {
                    name: name.clone(),
                    op: "Gather".into(),
                    domain: String::new(),
                    inputs: vec![k("table"), k("rows")],
                    outputs: vec![out],
                    attrs: attrs(vec![("axis", Attr::Int(0))]),
                },
            ],
        );
        gone[c] = true;
        gone[e] = true;
    }
    // The lookup takes the MatMul's place (the ids are defined before the Equal was).
    let old = std::mem::take(&mut g.nodes);
    for (i, n) in old.into_iter().enumerate() {
        match lookups.remove(&i) {
            Some(nodes) => g.nodes.extend(nodes),
            None if !gone[i] => g.nodes.push(n),
            None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::ValueType;

    fn node(op: &str, ins: &[&str], out: &str) -> Node {
        Node {
            name: out.into(),
            op: op.into(),
            domain: String::new(),
            inputs: ins.iter().map(|s| s.to_string()).collect(),
            outputs: vec![out.into()],
            attrs: Default::default(),
        }
    }

    fn graph(iota: Vec<i32>, w: Vec<f32>) -> Graph {
        let mut g = Graph::default();
        g.value_types.insert("ids".into(), ValueType::known(DType::I32, &[1, 6, 1]));
        g.initializers.insert("iota".into(), Tensor::from_vec(&[1, 1, iota.len()], iota));
        g.initializers.insert("W".into(), Tensor::from_vec(&[4, 2], w));
        g.nodes.push(node("Equal", &["ids", "iota"], "eq"));
        let mut cast = node("Cast", &["eq"], "oh");
        cast.attrs.insert("to".into(), Attr::Int(1));
        g.nodes.push(cast);
        g.nodes.push(node("MatMul", &["oh", "W"], "y"));
        g
    }

    #[test]
    fn one_hot_products_become_lookups() {
        let mut g = graph(vec![0, 1, 2, 3], (0..8).map(|v| v as f32).collect());
        run(&mut g).unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(ops, ["GreaterOrEqual", "Less", "And", "Where", "Squeeze", "Gather"]);
        assert_eq!(g.nodes[5].outputs, ["y"]);
        let table = &g.initializers[&g.nodes[5].inputs[0]];
        assert_eq!(table.shape(), &[5, 2]);
        assert_eq!(&table.data::<f32>()[8..], &[0.0, 0.0]);
    }

    #[test]
    fn other_encodings_and_infinite_weights_stay() {
        // Not 0, 1, 2, 3.
        let mut g = graph(vec![0, 2, 1, 3], (0..8).map(|v| v as f32).collect());
        run(&mut g).unwrap();
        assert_eq!(g.nodes.len(), 3);
        // 0 · ∞ is NaN in the product, not 0.
        let mut w: Vec<f32> = (0..8).map(|v| v as f32).collect();
        w[3] = f32::INFINITY;
        let mut g = graph(vec![0, 1, 2, 3], w);
        run(&mut g).unwrap();
        assert_eq!(g.nodes.len(), 3);
    }
}
