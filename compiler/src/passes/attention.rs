//! Scaled dot-product attention — `MatMul(Q, Transpose(K))`, the (fused) softmax of the
//! scores with their scale and additive mask, then `MatMul(·, V)` — becomes one
//! `aim:Attention(Q, K, V, mask)` node (`scale`), which reads K and V where they are instead
//! of transposing K and packing both for two GEMMs. That is how every exporter writes
//! attention when it does not use a fused op (and how aim expands the contrib attention
//! ops); for a decoder step it turns three copies of the key/value cache into one read.
//! Only for steps of at most [`MAX_ROWS`] query rows per head: longer prompts keep the
//! GEMMs. Intermediates read elsewhere stop the match; the node keeps every original node
//! in `sources`. Runs after `fuse-softmax`, before transposes are lowered.

use super::fuse::{sources_of, SOURCES};
use super::uses::Chains;
use super::PassError;
use aim_ir::{Attr, DType, Dim, Graph, Node};

/// The most query rows per batch item the fused kernel takes.
pub const MAX_ROWS: usize = 16;

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    super::fuse::fuse_each(g, fuse_at);
    Ok(())
}

/// The attention node for the MatMul at `i` (the product with V), and the nodes it absorbs.
fn fuse_at(g: &Graph, c: &Chains, i: usize) -> Option<(Node, Vec<usize>)> {
    let o = &g.nodes[i];
    if !o.domain.is_empty() || o.op != "MatMul" || o.inputs.len() != 2 {
        return None;
    }
    // The producer of `v` when node `reader` is its only reader.
    let only = |v: &str, reader: usize| c.sole_producer(v, reader).filter(|&k| g.nodes[k].outputs.len() == 1);
    let (p, v) = (o.inputs[0].as_str(), o.inputs[1].as_str());
    let ks = only(p, i)?;
    let sm = &g.nodes[ks];
    let (scale, mask) = match (sm.domain.as_str(), sm.op.as_str()) {
        ("aim", "Softmax") => (sm.float("scale", 1.0), sm.input(1).map(str::to_string)),
        ("", "Softmax") if matches!(sm.int("axis", -1), -1) => (1.0, None),
        _ => return None,
    };
    let km = only(sm.input(0)?, ks)?;
    let mm = &g.nodes[km];
    if !mm.domain.is_empty() || mm.op != "MatMul" || mm.inputs.len() != 2 {
        return None;
    }
    let kt = only(&mm.inputs[1], km)?;
    let tr = &g.nodes[kt];
    let (q, k) = (mm.inputs[0].as_str(), tr.input(0)?);
    // Shapes: Q [.., M, H], K [.., T, H], V [.., T, Hv], one rank, K and V with one batch.
    let shape = |x: &str| {
        let t = g.value_type(x)?;
        (t.dtype == Some(DType::F32)).then_some(())?;
        t.shape.clone()
    };
    let (qs, ks_, vs) = (shape(q)?, shape(k)?, shape(v)?);
    let r = qs.len();
    if r < 2 || ks_.len() != r || vs.len() != r || ks_[..r - 1] != vs[..r - 1] || ks_[r - 1] != qs[r - 1] {
        return None;
    }
    // Few query rows (a decoder's step): the kernel streams K and V once for them. Long
    // prompts keep the two GEMMs, whose microkernels do more products per load.
    if !matches!(qs[r - 2], Dim::Known(m) if m <= MAX_ROWS) {
        return None;
    }
    let perm: Vec<i64> = (0..r as i64 - 2).chain([r as i64 - 1, r as i64 - 2]).collect();
    if !tr.domain.is_empty() || tr.op != "Transpose" || tr.ints("perm") != Some(perm.as_slice()) {
        return None;
    }
    let mut sources = Vec::new();
    for n in [tr, mm, sm, o] {
        sources.extend(sources_of(n));
    }
    let mut attrs = std::collections::BTreeMap::new();
    attrs.insert("scale".to_string(), Attr::Float(scale));
    attrs.insert(SOURCES.to_string(), Attr::Strings(sources));
    let mut inputs = vec![q.to_string(), k.to_string(), v.to_string()];
    inputs.extend(mask);
    let node = Node {
        name: o.name.clone(),
        op: "Attention".into(),
        domain: "aim".into(),
        inputs,
        outputs: o.outputs.clone(),
        attrs,
    };
    Some((node, vec![kt, km, ks]))
}

#[cfg(test)]
mod tests {
    use aim_ir::text::{parse_graph, print_graph, TensorDetail};

    fn fused(text: &str) -> String {
        let mut g = parse_graph(text).unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        super::super::softmax::run(&mut g).unwrap();
        super::run(&mut g).unwrap();
        print_graph(&g, TensorDetail::Full)
    }

    const ATTENTION: &str = "graph \"g\" {\n input %q: f32[2,3,4,8]\n input %k: f32[2,1,6,8]\n input %v: f32[2,1,6,5]\n input %m: f32[2,1,1,6]\n init %c = f32[] [0.5]\n %kt = Transpose(%k) {perm=[0, 1, 3, 2]}  # t\n %s = MatMul(%q, %kt)  # qk\n %x = Mul(%s, %c)  # scale\n %y = Add(%x, %m)  # mask\n %p = Softmax(%y) {axis=-1}  # sm\n %o = MatMul(%p, %v)  # pv\n output %o: f32[2,3,4,5]\n}\n";

    /// The chain becomes one node reading K as it is, with the scale and the mask.
    #[test]
    fn scaled_masked_attention_is_one_node() {
        let t = fused(ATTENTION);
        assert!(t.contains("%o: f32[2,3,4,5] = aim:Attention(%q, %k, %v, %m) {scale=0.5"), "{t}");
        assert!(!t.contains("MatMul") && !t.contains("Transpose") && !t.contains("Softmax("), "{t}");
        assert!(t.contains("sources=[\"t\", \"qk\", \"scale\", \"mask\", \"sm\", \"pv\"]"), "{t}");
    }

    /// Scores read elsewhere, keys not transposed on their last two axes, or many query
    /// rows, stop it.
    #[test]
    fn other_readers_and_other_permutations_stop_it() {
        let t =
            fused(&ATTENTION.replace("output %o: f32[2,3,4,5]", "output %o: f32[2,3,4,5]\n output %p: f32[2,3,4,6]"));
        assert!(!t.contains("Attention"), "{t}");
        let t = fused(
            &ATTENTION
                .replace("input %k: f32[2,1,6,8]\n", "input %k: f32[1,2,6,8]\n")
                .replace("perm=[0, 1, 3, 2]", "perm=[1, 0, 3, 2]"),
        );
        assert!(!t.contains("Attention"), "{t}");
        // A long prompt (more than MAX_ROWS query rows) keeps its GEMMs.
        let t = fused(&ATTENTION.replace("f32[2,3,4,8]", "f32[2,3,17,8]").replace("f32[2,3,4,5]", "f32[2,3,17,5]"));
        assert!(!t.contains("Attention") && t.contains("MatMul"), "{t}");
    }
}
