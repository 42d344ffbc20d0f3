//! Dynamically quantized dense layers as one integer kernel, where the target has one
//! (AVX-512 VNNI, or AVX2's exact 16-bit products): the form `quantize_dynamic` writes,
//!
//! ```text
//! xq, xs, xz = DynamicQuantizeLinear(x)
//! y = Cast<f32>(MatMulInteger(xq, Wq, xz, Wz)) · Mul(xs, Ws)  [+ bias]
//! ```
//!
//! with `Wq`, `Wz`, `Ws` and the bias constant, becomes `aim:QDense(x, Wq, Wz, Ws, bias)`
//! (the runtime's `qdense` kernel: x quantized in one pass, u8×s8 sums in i32, the scale
//! and bias in the epilogue). The integer sums are exact, so the result is the graph's
//! (the Cast of an exact i32 sum, times the same f32 scale product), where the f32 form the
//! quantize-dequantize pass writes otherwise rounds sums beyond 2²⁴. The
//! DynamicQuantizeLinear and the scale product are left for dead-code elimination once
//! every reader is fused.

use super::fuse::{sources_of, SOURCES};
use super::uses::{readers, remove_marked};
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node};

/// Fuses every matching layer (see the module doc).
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    if !g.nodes.iter().any(|n| n.domain.is_empty() && n.op == "MatMulInteger") {
        return Ok(());
    }
    let r = readers(g);
    let by_output: std::collections::HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut replace: Vec<(usize, Node)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some(m) = match_layer(g, &r, &by_output, i, n) {
            for &k in &m.absorbed {
                removed[k] = true;
            }
            replace.push((m.at, m.node));
        }
    }
    for (at, node) in replace {
        g.nodes[at] = node;
        removed[at] = false;
    }
    remove_marked(g, &removed);
    Ok(())
}

/// A layer found: the fused node, the index it takes and the nodes it absorbs.
struct Layer {
    node: Node,
    at: usize,
    absorbed: Vec<usize>,
}

/// The only reader of `v`, when it has exactly one and it is a node of the default domain.
fn only_reader<'g>(
    g: &'g Graph,
    r: &std::collections::HashMap<String, Vec<usize>>,
    v: &str,
) -> Option<(usize, &'g Node)> {
    match r.get(v).map(|v| v.as_slice()) {
        Some(&[k]) if k != usize::MAX && g.nodes[k].domain.is_empty() => Some((k, &g.nodes[k])),
        _ => None,
    }
}

/// A constant of `dtype` with one element or `cols`.
fn per_column<'g>(g: &'g Graph, v: &str, dtype: DType, cols: usize) -> Option<&'g aim_ir::Tensor> {
    g.initializers.get(v).filter(|t| t.dtype() == dtype && (t.len() == 1 || t.len() == cols) && t.shape().len() <= 1)
}

fn match_layer(
    g: &Graph,
    r: &std::collections::HashMap<String, Vec<usize>>,
    by_output: &std::collections::HashMap<&str, usize>,
    i: usize,
    n: &Node,
) -> Option<Layer> {
    if !(n.domain.is_empty() && n.op == "MatMulInteger") {
        return None;
    }
    let (a, b, az) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dq = &g.nodes[*by_output.get(a)?];
    if !(dq.domain.is_empty() && dq.op == "DynamicQuantizeLinear" && dq.outputs.len() == 3) {
        return None;
    }
    if dq.outputs[0] != a || dq.outputs[2] != az {
        return None;
    }
    let x = dq.input(0)?;
    if g.value_type(x).and_then(|t| t.dtype) != Some(DType::F32) {
        return None;
    }
    let w = g.initializers.get(b).filter(|t| matches!(t.dtype(), DType::I8 | DType::U8) && t.shape().len() == 2)?;
    let cols = w.shape()[1];
    if let Some(bz) = n.input(3) {
        per_column(g, bz, w.dtype(), cols)?;
    }
    let (ci, cast) = only_reader(g, r, &n.outputs[0])?;
    if cast.op != "Cast" || cast.int("to", 0) != 1 {
        return None;
    }
    let (mi, mul) = only_reader(g, r, &cast.outputs[0])?;
    if mul.op != "Mul" || mul.inputs.len() != 2 {
        return None;
    }
    let scales = if mul.inputs[0] == cast.outputs[0] { &mul.inputs[1] } else { &mul.inputs[0] };
    let sn = &g.nodes[*by_output.get(scales.as_str())?];
    if !(sn.domain.is_empty() && sn.op == "Mul" && sn.inputs.len() == 2) {
        return None;
    }
    let ws = match (sn.inputs[0] == dq.outputs[1], sn.inputs[1] == dq.outputs[1]) {
        (true, false) => &sn.inputs[1],
        (false, true) => &sn.inputs[0],
        _ => return None,
    };
    per_column(g, ws, DType::F32, cols)?;
    let mut absorbed = vec![i, ci, mi];
    let mut sources = sources_of(n);
    sources.extend(sources_of(cast));
    sources.extend(sources_of(mul));
    let (mut out, mut at, mut bias) = (mul.outputs[0].clone(), mi, String::new());
    if let Some((ai, add)) = only_reader(g, r, &out) {
        let other = if add.inputs.first() == Some(&out) { add.inputs.get(1) } else { add.inputs.first() };
        let bias_ok = other
            .and_then(|b| g.initializers.get(b))
            .is_some_and(|t| t.dtype() == DType::F32 && t.len() == cols && t.shape().len() == 1 && cols > 0);
        if add.op == "Add" && add.inputs.len() == 2 && bias_ok {
            bias = other.expect("checked above").clone();
            sources.extend(sources_of(add));
            absorbed.push(ai);
            (out, at) = (add.outputs[0].clone(), ai);
        }
    }
    sources.dedup();
    let node = Node {
        name: format!("{}/qdense", n.name),
        op: "QDense".into(),
        domain: "aim".into(),
        inputs: vec![x.to_string(), b.to_string(), n.input(3).unwrap_or("").to_string(), ws.clone(), bias],
        outputs: vec![out],
        attrs: [(SOURCES.to_string(), Attr::Strings(sources))].into_iter().collect(),
    };
    Some(Layer { node, at, absorbed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::text::parse_graph;

    const LAYER: &str = r#"graph "g" {
  input %x: f32[2,8]
  init %w = i8[8,3] [1, -2, 3, 4, 5, -6, 7, 8, 9, 10, -11, 12, 13, 14, 15, -16, 17, 18, 19, 20, 21, 22, 23, 24]
  init %wz = i8[] [0]
  init %ws = f32[] [0.5]
  init %b = f32[3] [1.0, 2.0, 3.0]
  %q, %s, %z = DynamicQuantizeLinear(%x)  # dq
  %p = Mul(%s, %ws)  # scales
  %i = MatMulInteger(%q, %w, %z, %wz)  # mm
  %c = Cast(%i) {to=1}  # cast
  %m = Mul(%c, %p)  # scale
  %y = Add(%m, %b)  # bias
  output %y: f32[2,3]
}
"#;

    #[test]
    fn the_dynamic_form_becomes_one_kernel_with_its_bias() {
        let mut g = parse_graph(LAYER).unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        run(&mut g).unwrap();
        let q: Vec<&Node> = g.nodes.iter().filter(|n| n.op == "QDense").collect();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].inputs, ["x", "w", "wz", "ws", "b"]);
        assert_eq!(q[0].outputs, ["y"]);
        assert!(!g.nodes.iter().any(|n| matches!(n.op.as_str(), "MatMulInteger" | "Cast" | "Add")));
    }

    #[test]
    fn a_product_read_elsewhere_stays() {
        let text = LAYER.replace("output %y: f32[2,3]", "output %y: f32[2,3]\n  output %c: f32[2,3]");
        let mut g = parse_graph(&text).unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        run(&mut g).unwrap();
        assert!(!g.nodes.iter().any(|n| n.op == "QDense"));
    }
}
