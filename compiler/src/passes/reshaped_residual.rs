//! A residual Add that reads a dense layer's output through a Reshape — GPT-2's exported
//! blocks compute `x·W + b` on 2-D rows, view it back as `[batch, seq, features]` and add
//! the residual there — is moved before the Reshape, so that epilogue fusion takes it into
//! the layer: `Add(Reshape(y), r)` becomes `Reshape(Add(y, Reshape(r)))`, both Reshapes
//! views. Only where every shape is static and the two views keep the features last.

use super::uses::readers;
use aim_ir::{Graph, Node, Tensor};
use std::collections::HashMap;

/// Rewrites every matching Add (see the module doc), before the layers are fused.
pub(super) fn run(g: &mut Graph) {
    let mut maps = (readers(g), owned_producers(g));
    let mut i = 0;
    while i < g.nodes.len() {
        match rewrite(g, i, &maps.0, &maps.1) {
            Some((nodes, view)) => {
                let added = nodes.len();
                g.nodes.splice(i..=i, nodes);
                // The old view read only by the Add (so before it): gone, so that the
                // layer's output has the new Add as its one reader.
                g.nodes.remove(view);
                i += added - 1;
                // Node indices moved.
                maps = (readers(g), owned_producers(g));
            }
            None => i += 1,
        }
    }
}

fn owned_producers(g: &Graph) -> HashMap<String, usize> {
    super::uses::producers(g).into_iter().map(|(v, i)| (v.to_string(), i)).collect()
}

/// The nodes replacing Add `i` when it matches — the residual's Reshape, the Add on the
/// layer's own shape, and the Reshape of the sum back (named as the Add's output) — and
/// the index of the Reshape the Add read, which nothing reads then.
fn rewrite(
    g: &mut Graph,
    i: usize,
    r: &HashMap<String, Vec<usize>>,
    producers: &HashMap<String, usize>,
) -> Option<(Vec<Node>, usize)> {
    let add = &g.nodes[i];
    if !add.domain.is_empty() || add.op != "Add" || add.inputs.len() != 2 {
        return None;
    }
    let only_reader = |v: &str, reader: usize| r.get(v).is_some_and(|rs| rs == &[reader]);
    // Which operand is the reshaped layer output.
    let (k, view_at) = (0..2).find_map(|k| {
        let p = *producers.get(add.inputs[k].as_str())?;
        let n = &g.nodes[p];
        (n.domain.is_empty() && n.op == "Reshape" && only_reader(&add.inputs[k], i)).then_some((k, p))
    })?;
    let view = &g.nodes[view_at];
    let y = view.input(0)?;
    let layer = &g.nodes[*producers.get(y)?];
    let is_layer = |n: &Node| {
        n.domain.is_empty()
            && matches!(n.op.as_str(), "MatMul" | "Gemm")
            && n.input(1).is_some_and(|w| g.initializers.contains_key(w))
    };
    // The layer itself, or its bias Add.
    let ends_layer = is_layer(layer)
        || (layer.domain.is_empty()
            && layer.op == "Add"
            && layer.inputs.iter().any(|v| producers.get(v.as_str()).is_some_and(|&p| is_layer(&g.nodes[p]))));
    if !ends_layer || !only_reader(y, view_at) {
        return None;
    }
    let residual = add.inputs[1 - k].clone();
    let shape = |v: &str| g.value_type(v).and_then(|t| t.concrete_shape());
    let (ys, vs, rs) = (shape(y)?, shape(&add.inputs[k])?, shape(&residual)?);
    // (A 0 in the layer's shape would read as "copy the input's dim" in the Reshape.)
    let same_size = ys.iter().product::<usize>() == vs.iter().product::<usize>();
    if rs != vs || ys.last() != vs.last() || !same_size || ys.contains(&0) {
        return None;
    }
    let dtype = g.value_type(y)?.dtype?;
    let base = add.name.clone();
    let (out, target) = (add.outputs[0].clone(), view.inputs[1].clone());
    let (r_shape, r_view, sum) = (format!("{base}::layer_shape"), format!("{base}::residual"), format!("{base}::sum"));
    let dims: Vec<i64> = ys.iter().map(|&d| d as i64).collect();
    g.initializers.insert(r_shape.clone(), Tensor::from_vec(&[dims.len()], dims));
    let ty = |s: &[usize]| aim_ir::ValueType::known(dtype, s);
    g.value_types.insert(r_view.clone(), ty(&ys));
    g.value_types.insert(sum.clone(), ty(&ys));
    let node = |name: String, op: &str, inputs: Vec<String>, output: String| Node {
        name: name.clone(),
        op: op.into(),
        domain: String::new(),
        inputs,
        outputs: vec![output],
        attrs: [(super::fuse::SOURCES.to_string(), aim_ir::Attr::Strings(super::fuse::sources_of(add)))]
            .into_iter()
            .collect(),
    };
    let nodes = vec![
        node(format!("{base}/residual_view"), "Reshape", vec![residual, r_shape], r_view.clone()),
        node(base.clone(), "Add", vec![y.to_string(), r_view], sum.clone()),
        node(format!("{base}/view"), "Reshape", vec![sum, target], out),
    ];
    g.value_types.remove(&view.outputs[0]);
    Some((nodes, view_at))
}
