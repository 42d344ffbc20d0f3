//! Products of two quantized activations on the integer GEMM: a MatMul whose two inputs
//! are quantize-dequantize pairs of values computed at run time, with constant per-tensor
//! parameters — what ONNX Runtime's QDQ quantizer writes around the two products of every
//! attention head (scores = Q·Kᵀ, context = P·V), and what the quantize-dequantize pass
//! makes of a QLinearMatMul of two activations — becomes `aim:QMatMul(a, b)` with both
//! pairs' scales and zero points: each side quantized exactly as its QuantizeLinear does,
//! exact u8 sums (B packed per run), the product of the scales applied in the epilogue, as
//! the f32 graph computes `DQ(a) · DQ(b)` but without its rounding. ORT runs these as
//! QLinearMatMul; in f32 they were a fifth of a QDQ transformer's time (smart_turn_v3).
//! Products with a constant side are `aim:QDense` (`qdense_static`).

use super::fuse::{sources_of, SOURCES};
use aim_ir::{Attr, DType, Graph, Node};
use std::collections::HashMap;

/// Fuses every matching product (see the module doc).
pub fn run(g: &mut Graph) {
    if !g.nodes.iter().any(|n| n.domain.is_empty() && n.op == "MatMul") {
        return;
    }
    let by_output: HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    let found: Vec<(usize, Node)> =
        g.nodes.iter().enumerate().filter_map(|(i, n)| Some((i, product(g, &by_output, n)?))).collect();
    // The pairs stay for their other readers, if any (dead code otherwise).
    for (at, node) in found {
        g.nodes[at] = node;
    }
}

/// The value a quantize-dequantize pair reads, with the pair's scale and zero point in u8
/// terms (an s8 zero point plus 128: the kernel quantizes to u8, the same differences).
fn pair<'g>(g: &'g Graph, by_output: &HashMap<&str, usize>, v: &str) -> Option<(&'g str, f32, i64, Vec<String>)> {
    let producer = |v: &str, op: &str| -> Option<&'g Node> {
        let p = &g.nodes[*by_output.get(v)?];
        (p.domain.is_empty() && p.op == op && !p.attrs.contains_key("block_size")).then_some(p)
    };
    let dq = producer(v, "DequantizeLinear")?;
    let q = producer(dq.input(0)?, "QuantizeLinear")?;
    let (scale, zero) = super::qdense_static::u8_terms(g, q, dq)?;
    let x = q.input(0)?;
    if g.initializers.contains_key(x) || g.value_type(x).and_then(|t| t.dtype) != Some(DType::F32) {
        return None;
    }
    let mut sources = sources_of(q);
    sources.extend(sources_of(dq));
    Some((x, scale, zero, sources))
}

/// `aim:QMatMul` for MatMul `n` when both its inputs are such pairs over values of rank 2
/// or more whose batch dims are known and equal (or B's are all 1: one B for every batch).
fn product(g: &Graph, by_output: &HashMap<&str, usize>, n: &Node) -> Option<Node> {
    if !n.domain.is_empty() || n.op != "MatMul" || n.outputs.len() != 1 || n.inputs.len() != 2 {
        return None;
    }
    let (a, a_scale, a_zero, mut sources) = pair(g, by_output, n.input(0)?)?;
    let (b, b_scale, b_zero, b_sources) = pair(g, by_output, n.input(1)?)?;
    let shape = |v: &str| g.value_type(v)?.concrete_shape();
    let (sa, sb) = (shape(a)?, shape(b)?);
    if sa.len() < 2 || sb.len() < 2 || sa[sa.len() - 1] != sb[sb.len() - 2] {
        return None;
    }
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    if ba != bb && bb.iter().any(|&d| d != 1) {
        return None;
    }
    sources.extend(b_sources);
    sources.extend(sources_of(n));
    sources.dedup();
    Some(Node {
        name: format!("{}/qmatmul", n.name),
        op: "QMatMul".into(),
        domain: "aim".into(),
        inputs: vec![a.to_string(), b.to_string()],
        outputs: n.outputs.clone(),
        attrs: [
            ("a_scale".to_string(), Attr::Float(a_scale)),
            ("a_zero".to_string(), Attr::Int(a_zero)),
            ("b_scale".to_string(), Attr::Float(b_scale)),
            ("b_zero".to_string(), Attr::Int(b_zero)),
            (SOURCES.to_string(), Attr::Strings(sources)),
        ]
        .into_iter()
        .collect(),
    })
}
