//! Quantize-dequantize pairs on activations as f32 arithmetic: a `QuantizeLinear` whose
//! only use is a `DequantizeLinear` with the same per-tensor scale and zero point — what
//! ONNX Runtime's QDQ quantizer puts on every activation edge — computes
//! `y = (clip(round(x / s) + zp, qmin, qmax) - zp) · s`, exactly (the division in f32, ties
//! to even, as both ops specify). Written as Div, Round, Add, Clip, Sub and Mul, it joins
//! the elementwise fusion as one loop instead of two reference kernels and an integer
//! tensor. With the weights' DequantizeLinear folded by constant folding, a QDQ model then
//! runs its convolutions and matrix products on the f32 kernels, with the quantisation
//! error of the model kept at every edge: ONNX Runtime's own semantics when it does not
//! fuse the pairs into integer kernels.
//!
//! Pairs with per-axis or blocked parameters, non-f32 inputs or non-constant parameters
//! are left to the reference kernels.

use super::fuse::{sources_of, SOURCES};
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor};

/// A per-tensor quantisation: scale, zero point and the integer range.
#[derive(Clone, Copy, PartialEq)]
struct Params {
    scale: f32,
    zero: f32,
    lo: f32,
    hi: f32,
}

/// The parameters of a QuantizeLinear / DequantizeLinear node, when they are constant and
/// per tensor (scalar, or of one element) and the integer type is 8 or 16 bits.
fn params(g: &Graph, n: &Node) -> Option<Params> {
    let scale = g.initializers.get(n.input(1)?)?;
    if scale.dtype() != DType::F32 || scale.len() != 1 {
        return None;
    }
    let (zero, dtype) = match n.input(2) {
        Some(z) => {
            let t = g.initializers.get(z)?;
            if t.len() != 1 {
                return None;
            }
            (t.to_f64_vec()[0] as f32, t.dtype())
        }
        // No zero point: 0, and QuantizeLinear's output is u8 unless output_dtype says.
        None => (0.0, quantized_type(g, n)?),
    };
    let (lo, hi) = match dtype {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        _ => return None,
    };
    Some(Params { scale: scale.data::<f32>()[0], zero, lo, hi })
}

/// The integer type of a Q/DQ node's quantised side, from the value's recorded type.
fn quantized_type(g: &Graph, n: &Node) -> Option<DType> {
    let v = if n.op == "QuantizeLinear" { n.outputs.first()? } else { n.input(0)? };
    g.value_type(v)?.dtype
}

fn is(n: &Node, op: &str) -> bool {
    n.domain.is_empty() && n.op == op
}

/// Rewrites every matching pair (see the module doc).
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let by_output: std::collections::HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    // For each DequantizeLinear to rewrite: its index, x and the parameters.
    let mut rewrites: Vec<(usize, String, Params, Vec<String>)> = Vec::new();
    for (d, dq) in g.nodes.iter().enumerate() {
        if !is(dq, "DequantizeLinear") || dq.attrs.contains_key("block_size") {
            continue;
        }
        let Some(&q) = dq.input(0).and_then(|v| by_output.get(v)) else { continue };
        let qn = &g.nodes[q];
        if !is(qn, "QuantizeLinear") || qn.attrs.contains_key("block_size") {
            continue;
        }
        let Some(x) = qn.input(0) else { continue };
        let f32_in = g.value_type(x).and_then(|t| t.dtype) == Some(DType::F32);
        let f32_out = dq.outputs.first().and_then(|o| g.value_type(o)).and_then(|t| t.dtype) == Some(DType::F32);
        let (Some(pq), Some(pd)) = (params(g, qn), params(g, dq)) else { continue };
        // Other readers of the integer tensor (a graph output, another node) keep the
        // QuantizeLinear; dead-code elimination removes it otherwise.
        if !f32_in || !f32_out || pq != pd || pq.scale == 0.0 || !pq.scale.is_finite() {
            continue;
        }
        let mut sources = sources_of(qn);
        sources.extend(sources_of(dq));
        rewrites.push((d, x.to_string(), pq, sources));
    }
    if rewrites.is_empty() {
        return Ok(());
    }
    let mut replaced: std::collections::HashMap<usize, Vec<Node>> = std::collections::HashMap::new();
    for (d, x, p, sources) in rewrites {
        let dq = &g.nodes[d];
        let base = dq.name.clone();
        let y = dq.outputs[0].clone();
        let mut constant = |what: &str, v: f32| -> String {
            let mut name = format!("{base}/{what}");
            let mut k = 1;
            while g.initializers.contains_key(&name) {
                name = format!("{base}/{what}_{k}");
                k += 1;
            }
            g.initializers.insert(name.clone(), Tensor::from_slice(&[], &[v]));
            name
        };
        let (s, lo, hi) = (constant("scale", p.scale), constant("qmin", p.lo), constant("qmax", p.hi));
        let zp = (p.zero != 0.0).then(|| constant("zero_point", p.zero));
        let attrs = || -> std::collections::BTreeMap<String, Attr> {
            [(SOURCES.to_string(), Attr::Strings(sources.clone()))].into_iter().collect()
        };
        let node = |suffix: &str, op: &str, inputs: Vec<String>, out: String| Node {
            name: format!("{base}/{suffix}"),
            op: op.into(),
            domain: String::new(),
            inputs,
            outputs: vec![out],
            attrs: attrs(),
        };
        let t = |k: &str| format!("{y}/fq_{k}");
        let mut chain =
            vec![node("div", "Div", vec![x, s.clone()], t("div")), node("round", "Round", vec![t("div")], t("round"))];
        let mut last = t("round");
        if let Some(zp) = &zp {
            chain.push(node("add_zero_point", "Add", vec![last.clone(), zp.clone()], t("shifted")));
            last = t("shifted");
        }
        chain.push(node("clip", "Clip", vec![last.clone(), lo, hi], t("clip")));
        last = t("clip");
        if let Some(zp) = &zp {
            chain.push(node("sub_zero_point", "Sub", vec![last.clone(), zp.clone()], t("centred")));
            last = t("centred");
        }
        chain.push(node("mul", "Mul", vec![last, s], y));
        replaced.insert(d, chain);
    }
    let nodes = std::mem::take(&mut g.nodes);
    for (i, n) in nodes.into_iter().enumerate() {
        match replaced.remove(&i) {
            Some(chain) => g.nodes.extend(chain),
            None => g.nodes.push(n),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(zp: &str, scale: &str) -> Graph {
        let text = format!(
            "opset 21\ngraph \"g\" {{\n  input %x: f32[2,5]\n  init %s = f32[] [{scale}]\n  init %z = {zp}\n  %q = QuantizeLinear(%x, %s, %z)  # q\n  %y = DequantizeLinear(%q, %s, %z)  # dq\n  output %y: f32[2,5]\n}}\n"
        );
        let mut m = aim_ir::text::parse_model(&text).expect("parses");
        aim_ir::infer::infer_types(&mut m.graph).expect("infers");
        m.graph
    }

    fn run_both(g: &Graph, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let input = || [("x".to_string(), Tensor::from_slice(&[2, 5], x))].into_iter().collect();
        let want = aim_runtime::run_graph(g, input()).expect("runs");
        let mut h = g.clone();
        run(&mut h).expect("rewrites");
        assert!(h.nodes.iter().all(|n| n.op != "DequantizeLinear"), "the pair is rewritten");
        crate::passes::dce::run(&mut h).expect("dce");
        assert!(h.nodes.iter().all(|n| n.op != "QuantizeLinear"), "the quantize is dead");
        let got = aim_runtime::run_graph(&h, input()).expect("runs");
        (want[0].data::<f32>().to_vec(), got[0].data::<f32>().to_vec())
    }

    /// The f32 form equals the pair bit for bit: ties to even, saturation at both ends,
    /// signed and unsigned, with and without a zero point.
    #[test]
    fn the_f32_form_equals_the_pair() {
        let x = [-300.0, -2.5, -0.5, 0.5, 1.5, 2.5, 0.1, 99.9, 1000.0, 7.0 / 3.0];
        for (zp, scale) in [("u8[] [128]", "0.5"), ("i8[] [-3]", "0.25"), ("u8[] [0]", "1.0"), ("i8[] [0]", "0.1")] {
            let (want, got) = run_both(&graph(zp, scale), &x);
            assert_eq!(want, got, "zero point {zp}, scale {scale}");
        }
    }

    /// Different parameters on the two sides, or a per-axis scale, are left alone.
    #[test]
    fn mismatched_pairs_stay() {
        let text = "opset 21\ngraph \"g\" {\n  input %x: f32[2,5]\n  init %s = f32[] [0.5]\n  init %t = f32[] [0.25]\n  init %z = u8[] [128]\n  %q = QuantizeLinear(%x, %s, %z)  # q\n  %y = DequantizeLinear(%q, %t, %z)  # dq\n  output %y: f32[2,5]\n}\n";
        let mut m = aim_ir::text::parse_model(text).expect("parses");
        aim_ir::infer::infer_types(&mut m.graph).expect("infers");
        let mut g = m.graph.clone();
        run(&mut g).expect("runs");
        assert_eq!(g, m.graph);
    }
}
