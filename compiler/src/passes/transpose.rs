//! f32 Transposes of rank two or more become `aim:Transpose` nodes (with their permutation
//! made explicit), which the code generator compiles to copy loops for their rank. Other
//! transposes (other dtypes, unknown rank) keep their library kernels.
//!
//! Over a static shape the permutation is first reduced: dims of size one are dropped and
//! input dims that stay adjacent and in order are merged (`[1, 512, 256, 1]` by
//! `[0, 2, 1, 3]` is a `512 × 256` matrix transposed), with Reshapes (views) around — so
//! the copy loop's rows are as long as the data allows, not one element each. A transpose
//! that reduces to no movement at all is a Reshape.

use super::fuse::{sources_of, SOURCES};
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node};

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let mut i = 0;
    while i < g.nodes.len() {
        i += 1;
        let i = i - 1;
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
        if let Some(shape) = t.concrete_shape() {
            let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
            let (dims, reduced) = reduce(&shape, &perm);
            if reduced.len() < rank {
                let n = g.nodes[i].clone();
                let nodes = reduced_transpose(g, &n, &shape, &perm, &dims, &reduced);
                g.nodes.splice(i..=i, nodes);
                continue;
            }
        }
        let n = &g.nodes[i];
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

/// The transpose of `shape` by `perm` reduced: the merged input dims, and the permutation
/// of them (size-one dims dropped, input dims adjacent and in order in the output merged).
fn reduce(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Output order of the input dims that are not 1, as runs of consecutive input dims.
    let kept: Vec<usize> = perm.iter().copied().filter(|&d| shape[d] != 1).collect();
    // The input dim after `d` that is not 1 (dims of size one between do not separate).
    let next = |d: usize| (d + 1..shape.len()).find(|&e| shape[e] != 1);
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for d in kept {
        match runs.last_mut() {
            Some(run) if next(*run.last().expect("runs are not empty")) == Some(d) => run.push(d),
            _ => runs.push(vec![d]),
        }
    }
    // Number the runs in input order: that is the reduced input's dim order.
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&r| runs[r][0]);
    let dims: Vec<usize> = order.iter().map(|&r| runs[r].iter().map(|&d| shape[d]).product()).collect();
    let mut reduced = vec![0; runs.len()];
    for (pos, &r) in order.iter().enumerate() {
        reduced[r] = pos;
    }
    (dims, reduced)
}

/// `n` as Reshape → `aim:Transpose` by `reduced` over `dims` → Reshape to its output shape
/// (just a Reshape when nothing moves), the nodes to take `n`'s place; their shape
/// constants are added to `g`.
fn reduced_transpose(
    g: &mut Graph,
    n: &Node,
    shape: &[usize],
    perm: &[usize],
    dims: &[usize],
    reduced: &[usize],
) -> Vec<Node> {
    let out_shape: Vec<i64> = perm.iter().map(|&p| shape[p] as i64).collect();
    let mut shape_const = |suffix: &str, v: Vec<i64>| {
        let name = format!("{}::{suffix}", n.name);
        g.initializers.insert(name.clone(), aim_ir::Tensor::from_vec(&[v.len()], v));
        name
    };
    let to_out = shape_const("out_shape", out_shape);
    let with_sources = |op: &str, domain: &str, inputs: Vec<String>, outputs: Vec<String>| {
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert(SOURCES.to_string(), Attr::Strings(sources_of(n)));
        Node {
            name: format!("{}/{}", n.name, op.to_lowercase()),
            op: op.into(),
            domain: domain.into(),
            inputs,
            outputs,
            attrs,
        }
    };
    let is_identity = reduced.iter().enumerate().all(|(i, &p)| i == p);
    if is_identity {
        let mut r = with_sources("Reshape", "", vec![n.inputs[0].clone(), to_out], n.outputs.clone());
        r.name = n.name.clone();
        return vec![r];
    }
    let to_in = shape_const("in_shape", dims.iter().map(|&d| d as i64).collect());
    let (flat, moved) = (format!("{}::in", n.name), format!("{}::moved", n.name));
    // The new values' types, static like the shape they come from (aim nodes' outputs are
    // not inferred, and the cuda lowering needs every dim).
    let typed = |d: Vec<usize>| aim_ir::ValueType {
        dtype: Some(DType::F32),
        shape: Some(d.into_iter().map(aim_ir::Dim::Known).collect()),
    };
    g.value_types.insert(flat.clone(), typed(dims.to_vec()));
    g.value_types.insert(moved.clone(), typed(reduced.iter().map(|&p| dims[p]).collect()));
    let before = with_sources("Reshape", "", vec![n.inputs[0].clone(), to_in], vec![flat.clone()]);
    let mut t = with_sources("Transpose", "aim", vec![flat], vec![moved.clone()]);
    t.attrs.insert("perm".into(), Attr::Ints(reduced.iter().map(|&p| p as i64).collect()));
    t.name = n.name.clone();
    vec![before, t, with_sources("Reshape", "", vec![moved, to_out], n.outputs.clone())]
}

#[cfg(test)]
mod tests {
    use super::reduce;

    #[test]
    fn permutations_reduce_to_their_moving_blocks() {
        // magika's [1, 512, 256, 1] by [0, 2, 1, 3]: a 512 × 256 matrix transposed.
        assert_eq!(reduce(&[1, 512, 256, 1], &[0, 2, 1, 3]), (vec![512, 256], vec![1, 0]));
        // NCHW → NHWC: the spatial dims move together.
        assert_eq!(reduce(&[2, 3, 4, 5], &[0, 2, 3, 1]), (vec![2, 3, 20], vec![0, 2, 1]));
        // Only size-one dims move: nothing to copy.
        assert_eq!(reduce(&[1, 7, 1, 9], &[2, 1, 0, 3]), (vec![63], vec![0]));
        // A rotation is the transpose of two merged blocks.
        assert_eq!(reduce(&[2, 3, 4], &[2, 0, 1]), (vec![6, 4], vec![1, 0]));
        // Already minimal.
        assert_eq!(reduce(&[2, 3, 4], &[1, 0, 2]), (vec![2, 3, 4], vec![1, 0, 2]));
    }
}
