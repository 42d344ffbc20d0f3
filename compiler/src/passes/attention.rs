//! Scaled dot-product attention — `MatMul(Q, Transpose(K))`, the (fused) softmax of the
//! scores with their scale and additive mask, then `MatMul(·, V)` — becomes one
//! `aim:Attention(Q, K, V, mask)` node (`scale`), which reads K and V where they are instead
//! of transposing K and packing both for two GEMMs, and never stores the scores. That is
//! how every exporter writes attention when it does not use a fused op (and how aim expands
//! the contrib attention ops). The transposes around it are absorbed too: a transpose that
//! only Q or V passes through becomes `q_perm` / `v_perm`, K's becomes `k_perm`, and a
//! transpose that is the result's only reader becomes `out_perm` (the node then computes
//! that transpose's output) — so the head split `[B, S, heads, H]` → `[B, heads, S, H]` and
//! the merge back cost no copies. Intermediates read elsewhere stop the match; the node keeps
//! every original node in `sources`. Runs after `fuse-softmax`, before transposes are
//! lowered.

use super::fuse::{sources_of, SOURCES};
use super::uses::Chains;
use super::PassError;
use aim_ir::{Attr, DType, Dim, Graph, Node};

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    super::fuse::fuse_each(g, fuse_at);
    Ok(())
}

/// Whether `n` is an ONNX Transpose.
fn is_transpose(n: &Node) -> bool {
    n.domain.is_empty() && n.op == "Transpose" && n.inputs.len() == 1 && n.outputs.len() == 1
}

/// A Transpose's permutation of `rank` axes (ONNX's default: the axes reversed), if valid.
fn perm_of(n: &Node, rank: usize) -> Option<Vec<i64>> {
    let p: Vec<i64> = n.ints("perm").map(|p| p.to_vec()).unwrap_or_else(|| (0..rank as i64).rev().collect());
    let mut seen = vec![false; rank];
    let ok = p.len() == rank
        && p.iter().all(|&a| a >= 0 && (a as usize) < rank && !std::mem::replace(&mut seen[a as usize], true));
    ok.then_some(p)
}

/// The attention node for the MatMul at `i` (the product with V), and the nodes it absorbs.
fn fuse_at(g: &Graph, c: &Chains, i: usize) -> Option<(Node, Vec<usize>)> {
    let o = &g.nodes[i];
    if !o.domain.is_empty() || o.op != "MatMul" || o.inputs.len() != 2 || o.outputs.len() != 1 {
        return None;
    }
    // The producer of `v` when node `reader` is its only reader.
    let only = |v: &str, reader: usize| c.sole_producer(v, reader).filter(|&k| g.nodes[k].outputs.len() == 1);
    // f32 values of known rank: their dims.
    let shape = |x: &str| {
        let t = g.value_type(x)?;
        (t.dtype == Some(DType::F32)).then_some(())?;
        t.shape.clone()
    };
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
    let r = shape(&mm.inputs[0])?.len();
    if r < 2 {
        return None;
    }
    // Kᵀ is a transpose of K's tensor: K is that tensor with the transpose's last two axes
    // swapped back.
    let kt = only(&mm.inputs[1], km)?;
    let tr = &g.nodes[kt];
    if !is_transpose(tr) {
        return None;
    }
    let mut k_perm = perm_of(tr, r)?;
    k_perm.swap(r - 2, r - 1);
    let k = tr.inputs[0].as_str();
    // Q and V through a transpose only they read.
    let through = |x: &'_ str, reader: usize| -> Option<(String, Option<Vec<i64>>, Option<usize>)> {
        match only(x, reader) {
            Some(t) if is_transpose(&g.nodes[t]) => {
                Some((g.nodes[t].inputs[0].clone(), Some(perm_of(&g.nodes[t], r)?), Some(t)))
            }
            _ => Some((x.to_string(), None, None)),
        }
    };
    let (q, q_perm, qt) = through(&mm.inputs[0], km)?;
    let (v, v_perm, vt) = through(v, i)?;
    // The result through a transpose that is its only reader.
    let (outputs, out_perm, ot) = match c.sole_reader(&o.outputs[0]).map(|t| (t, &g.nodes[t])) {
        Some((t, n)) if is_transpose(n) => (n.outputs.clone(), Some(perm_of(n, r)?), Some(t)),
        _ => (o.outputs.clone(), None, None),
    };
    // Shapes as the kernel reads them: Q [.., M, H], K [.., T, H], V [.., T, Hv], one rank,
    // K and V with one batch.
    let logical = |x: &str, perm: &Option<Vec<i64>>| -> Option<Vec<Dim>> {
        let s = shape(x)?;
        (s.len() == r).then_some(())?;
        Some(match perm {
            Some(p) => p.iter().map(|&a| s[a as usize].clone()).collect(),
            None => s,
        })
    };
    let (qs, ks_, vs) = (logical(&q, &q_perm)?, logical(k, &Some(k_perm.clone()))?, logical(&v, &v_perm)?);
    if ks_[..r - 1] != vs[..r - 1] || ks_[r - 1] != qs[r - 1] {
        return None;
    }
    let mut sources = Vec::new();
    let mut absorbed = vec![kt, km, ks];
    for t in [qt, vt].into_iter().flatten() {
        sources.extend(sources_of(&g.nodes[t]));
        absorbed.push(t);
    }
    for n in [tr, mm, sm, o] {
        sources.extend(sources_of(n));
    }
    if let Some(t) = ot {
        sources.extend(sources_of(&g.nodes[t]));
        absorbed.push(t);
    }
    let mut attrs = std::collections::BTreeMap::new();
    attrs.insert("scale".to_string(), Attr::Float(scale));
    attrs.insert(SOURCES.to_string(), Attr::Strings(sources));
    let identity: Vec<i64> = (0..r as i64).collect();
    for (name, perm) in [("q_perm", q_perm), ("k_perm", Some(k_perm)), ("v_perm", v_perm), ("out_perm", out_perm)] {
        if let Some(p) = perm.filter(|p| *p != identity) {
            attrs.insert(name.to_string(), Attr::Ints(p));
        }
    }
    let mut inputs = vec![q, k.to_string(), v];
    inputs.extend(mask);
    let node = Node { name: o.name.clone(), op: "Attention".into(), domain: "aim".into(), inputs, outputs, attrs };
    Some((node, absorbed))
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

    /// Scores or transposed keys read elsewhere stop it; keys transposed on other axes
    /// are read through their permutation.
    #[test]
    fn other_readers_stop_it_and_other_permutations_do_not() {
        let t =
            fused(&ATTENTION.replace("output %o: f32[2,3,4,5]", "output %o: f32[2,3,4,5]\n output %p: f32[2,3,4,6]"));
        assert!(!t.contains("Attention"), "{t}");
        let t =
            fused(&ATTENTION.replace("output %o: f32[2,3,4,5]", "output %o: f32[2,3,4,5]\n output %kt: f32[2,1,8,6]"));
        assert!(!t.contains("Attention"), "{t}");
        let t = fused(
            &ATTENTION
                .replace("input %k: f32[2,1,6,8]\n", "input %k: f32[1,2,6,8]\n")
                .replace("perm=[0, 1, 3, 2]", "perm=[1, 0, 3, 2]"),
        );
        assert!(t.contains("aim:Attention(%q, %k, %v, %m) {k_perm=[1, 0, 2, 3]"), "{t}");
        // A long prompt is fused too.
        let t = fused(&ATTENTION.replace("f32[2,3,4,8]", "f32[2,3,70,8]").replace("f32[2,3,4,5]", "f32[2,3,70,5]"));
        assert!(t.contains("aim:Attention") && !t.contains("MatMul"), "{t}");
    }

    /// Multi-head attention as exporters write it: Q, K and V split into heads by
    /// transposes of `[B, S, heads, H]`, K transposed straight to `[B, heads, H, S]`, and the
    /// result merged back by a transpose. Every transpose is absorbed as a permutation.
    #[test]
    fn head_split_and_merge_transposes_are_absorbed() {
        let text = "graph \"g\" {\n input %q: f32[1,7,3,8]\n input %k: f32[1,7,3,8]\n input %v: f32[1,7,3,8]\n init %c = f32[] [0.5]\n %qt = Transpose(%q) {perm=[0, 2, 1, 3]}  # tq\n %kt = Transpose(%k) {perm=[0, 2, 3, 1]}  # tk\n %vt = Transpose(%v) {perm=[0, 2, 1, 3]}  # tv\n %s = MatMul(%qt, %kt)  # qk\n %x = Mul(%s, %c)  # scale\n %p = Softmax(%x) {axis=-1}  # sm\n %o = MatMul(%p, %vt)  # pv\n %y = Transpose(%o) {perm=[0, 2, 1, 3]}  # merge\n output %y: f32[1,7,3,8]\n}\n";
        let t = fused(text);
        assert!(t.contains("%y: f32[1,7,3,8] = aim:Attention(%q, %k, %v)"), "{t}");
        assert!(t.contains("k_perm=[0, 2, 1, 3]") && t.contains("q_perm=[0, 2, 1, 3]"), "{t}");
        assert!(t.contains("v_perm=[0, 2, 1, 3]") && t.contains("out_perm=[0, 2, 1, 3]"), "{t}");
        assert!(!t.contains("Transpose") && !t.contains("MatMul"), "{t}");
        assert!(t.contains("sources=[\"tq\", \"tv\", \"tk\", \"qk\", \"scale\", \"sm\", \"pv\", \"merge\"]"), "{t}");
        // A merge transpose read elsewhere as well stays, and so does the value it reads.
        let t = fused(&text.replace("output %y: f32[1,7,3,8]", "output %y: f32[1,7,3,8]\n output %o: f32[1,3,7,8]"));
        assert!(t.contains("%o: f32[1,3,7,8] = aim:Attention(%q, %k, %v)") && t.contains("Transpose(%o)"), "{t}");
        assert!(!t.contains("out_perm"), "{t}");
    }
}
