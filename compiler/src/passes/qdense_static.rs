//! Statically quantized dense layers on the integer kernel, where the target has one
//! (AVX-512 VNNI, or AVX2's exact 16-bit products): a MatMul or Gemm whose input is a quantize-dequantize pair with constant
//! per-tensor parameters and whose weights are the dequantization of a constant 8-bit
//! matrix (what ONNX Runtime's QDQ quantizer writes, and what the quantize-dequantize pass
//! makes of QLinearMatMul), with an optional constant bias (Gemm's C, or a following Add),
//! becomes `aim:QDense(x, W, Wz, Ws, bias)` with the pair's `x_scale` / `x_zero`: the input
//! quantized exactly as the QuantizeLinear does, exact u8×s8 sums, the scale and bias in
//! the epilogue (`runtime/src/cpu/qdense.rs`). Gemm's transposed weights are transposed
//! once here.

use super::fuse::{sources_of, SOURCES};
use super::uses::{readers, remove_marked};
use aim_ir::{Attr, DType, Graph, Node, Tensor};
use std::collections::HashMap;

/// Fuses every matching layer (see the module doc).
pub fn run(g: &mut Graph) {
    if !g.nodes.iter().any(|n| n.domain.is_empty() && matches!(n.op.as_str(), "MatMul" | "Gemm")) {
        return;
    }
    let r = readers(g);
    let by_output: HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut found: Vec<(usize, Node, Option<Constant>)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some((node, at, absorbed, transposed)) = match_layer(g, &r, &by_output, i, n) {
            for k in absorbed {
                removed[k] = true;
            }
            found.push((at, node, transposed));
        }
    }
    for (at, node, transposed) in found {
        if let Some((name, t)) = transposed {
            g.initializers.insert(name, t);
        }
        g.nodes[at] = node;
        removed[at] = false;
    }
    remove_marked(g, &removed);
}

/// The scale and the zero point, in u8 terms (an s8 zero point plus 128: the integer
/// kernels quantize to u8, the differences the same), of QuantizeLinear `q` read by
/// DequantizeLinear `dq` with the same constant per-tensor parameters of 8 bits; None for
/// other pairs.
pub(super) fn u8_terms(g: &Graph, q: &Node, dq: &Node) -> Option<(f32, i64)> {
    let (pq, pd) = (super::qdq::params(g, q)?, super::qdq::params(g, dq)?);
    let shift = match (pq.lo, pq.hi) {
        (0.0, 255.0) => 0.0,
        (-128.0, 127.0) => 128.0,
        _ => return None,
    };
    if pq != pd || !(pq.scale > 0.0 && pq.scale.is_finite()) {
        return None;
    }
    Some((pq.scale, (pq.zero + shift) as i64))
}

/// A new constant: its name and value.
type Constant = (String, Tensor);

/// The fused node, the index it takes, the nodes it absorbs and, for transposed weights,
/// the new constant.
type Match = (Node, usize, Vec<usize>, Option<Constant>);

fn match_layer(
    g: &Graph,
    r: &HashMap<String, Vec<usize>>,
    by_output: &HashMap<&str, usize>,
    i: usize,
    n: &Node,
) -> Option<Match> {
    if !n.domain.is_empty() || n.outputs.len() != 1 {
        return None;
    }
    let gemm = match n.op.as_str() {
        "MatMul" => false,
        "Gemm" if n.float_attr("alpha") == 1.0 && n.float_attr("beta") == 1.0 && n.int("transA", 0) == 0 => true,
        _ => return None,
    };
    let trans_b = gemm && n.int("transB", 0) != 0;
    let producer = |v: &str, op: &str| -> Option<&Node> {
        let p = &g.nodes[*by_output.get(v)?];
        (p.domain.is_empty() && p.op == op && !p.attrs.contains_key("block_size")).then_some(p)
    };
    // The input: DequantizeLinear(QuantizeLinear(x)) with one set of per-tensor parameters.
    let dqx = producer(n.input(0)?, "DequantizeLinear")?;
    let qx = producer(dqx.input(0)?, "QuantizeLinear")?;
    let (x_scale, x_zero) = u8_terms(g, qx, dqx)?;
    let x = qx.input(0)?;
    if g.value_type(x).and_then(|t| t.dtype) != Some(DType::F32) {
        return None;
    }
    // The weights: DequantizeLinear of a constant 8-bit matrix, per tensor or per column.
    let dqw = producer(n.input(1)?, "DequantizeLinear")?;
    let w =
        g.initializers.get(dqw.input(0)?).filter(|t| matches!(t.dtype(), DType::I8 | DType::U8) && t.rank() == 2)?;
    let (k, cols) = if trans_b { (w.shape()[1], w.shape()[0]) } else { (w.shape()[0], w.shape()[1]) };
    let column_axis = if trans_b { 0 } else { 1 };
    let per_column = |v: &str, dtype: DType| {
        g.initializers.get(v).filter(|t| {
            t.dtype() == dtype
                && t.rank() <= 1
                && (t.len() == 1
                    || (t.len() == cols && matches!(dqw.int("axis", 1), a if a == column_axis || a == column_axis - 2)))
        })
    };
    let ws = dqw.input(1)?;
    per_column(ws, DType::F32)?;
    if let Some(z) = dqw.input(2) {
        per_column(z, w.dtype())?;
    }
    let mut absorbed = vec![i];
    let mut sources = sources_of(qx);
    sources.extend(sources_of(dqx));
    sources.extend(sources_of(dqw));
    sources.extend(sources_of(n));
    let (mut out, mut at) = (n.outputs[0].clone(), i);
    let constant_bias = |b: &str| super::qconv::constant(g, by_output, b, 3);
    let mut bias = String::new();
    if gemm {
        if let Some(c) = n.input(2) {
            let ok =
                g.value_type(c).and_then(|t| t.concrete_shape()).is_some_and(|s| s.iter().product::<usize>() == cols);
            if !(constant_bias(c) && ok) {
                return None;
            }
            bias = c.to_string();
        }
    } else if let Some(&[ai]) = r.get(&out).map(|v| v.as_slice()) {
        // A following Add of a constant of one value per column.
        let add = (ai != usize::MAX).then(|| &g.nodes[ai]).filter(|a| a.domain.is_empty() && a.op == "Add");
        if let Some(add) = add.filter(|a| a.inputs.len() == 2) {
            let other = if add.inputs[0] == out { &add.inputs[1] } else { &add.inputs[0] };
            let shape = g.value_type(other).and_then(|t| t.concrete_shape());
            if constant_bias(other) && shape.is_some_and(|s| s.len() == 1 && s[0] == cols) {
                bias = other.clone();
                sources.extend(sources_of(add));
                absorbed.push(ai);
                (out, at) = (add.outputs[0].clone(), ai);
            }
        }
    }
    let transposed = trans_b.then(|| {
        let bytes = w.bytes();
        let mut t = vec![0u8; bytes.len()];
        for row in 0..cols {
            for col in 0..k {
                t[col * cols + row] = bytes[row * k + col];
            }
        }
        let name = format!("{}/transposed", dqw.inputs[0]);
        (name, Tensor::from_bytes(w.dtype(), &[k, cols], &t).expect("the same bytes"))
    });
    let w_name = transposed.as_ref().map_or(dqw.inputs[0].clone(), |(name, _)| name.clone());
    sources.dedup();
    let node = Node {
        name: format!("{}/qdense", n.name),
        op: "QDense".into(),
        domain: "aim".into(),
        inputs: vec![x.to_string(), w_name, dqw.input(2).unwrap_or("").to_string(), ws.to_string(), bias],
        outputs: vec![out],
        attrs: [
            ("x_scale".to_string(), Attr::Float(x_scale)),
            ("x_zero".to_string(), Attr::Int(x_zero)),
            (SOURCES.to_string(), Attr::Strings(sources)),
        ]
        .into_iter()
        .collect(),
    };
    Some((node, at, absorbed, transposed))
}
