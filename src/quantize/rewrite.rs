//! The quantized model, written by editing the ONNX protobuf itself (so every op, attribute,
//! opset and metadata entry it does not touch stays as it was):
//!
//! - static (QDQ, as ONNX Runtime's `quantize_static` writes it): a QuantizeLinear /
//!   DequantizeLinear pair on each activation a quantized node reads, s8 weights with their
//!   DequantizeLinear (per tensor or per output channel), int32 biases of scale
//!   `input scale × weight scale`;
//! - dynamic (as `quantize_dynamic` writes it): a MatMul or Gemm with constant weights as
//!   DynamicQuantizeLinear → MatMulInteger → Cast → Mul by the scale product (+ bias).

use super::calibrate::{quantize_weights, Params};
use aim_ir::{Attr, DType, Node, Tensor};
use aim_onnx::proto::{GraphProto, NodeProto, TensorProto, ValueInfoProto};
use aim_onnx::{node_proto, tensor_proto};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What a quantizable node reads as activations and as constants.
#[derive(Clone, Debug)]
pub struct Target {
    /// The node's index in the graph.
    pub node: usize,
    /// The inputs (by position) quantized as activations.
    pub activations: Vec<usize>,
    /// The weight input's position, its quantization axis (`None`: per tensor) and dims.
    pub weight: Option<(usize, Option<usize>, Vec<usize>)>,
    /// The bias input's position (quantized to int32 with the activation's and the
    /// weight's scales).
    pub bias: Option<usize>,
    /// The weights are stored transposed (`[N, K]`: Gemm's `transB`).
    pub transposed: bool,
}

/// Fresh names next to the model's own.
pub struct Names(HashSet<String>);

impl Names {
    /// Every node and value name of `g`.
    pub fn of(g: &GraphProto) -> Names {
        let mut s: HashSet<String> = HashSet::new();
        for n in &g.node {
            s.insert(n.name().to_string());
            s.extend(n.output.iter().cloned());
            s.extend(n.input.iter().cloned());
        }
        s.extend(g.initializer.iter().map(|t| t.name().to_string()));
        s.extend(g.input.iter().map(|v| v.name().to_string()));
        Names(s)
    }

    /// `base`, or `base_1`, `base_2`, ... whichever is free (then taken).
    pub fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 1;
        while !self.0.insert(name.clone()) {
            name = format!("{base}_{k}");
            k += 1;
        }
        name
    }
}

fn node(name: String, op: &str, inputs: Vec<String>, outputs: Vec<String>, attrs: Vec<(&str, Attr)>) -> NodeProto {
    node_proto(&Node {
        name,
        op: op.into(),
        domain: String::new(),
        inputs,
        outputs,
        attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    })
}

fn scalar_zero(p: &Params) -> Tensor {
    if p.signed {
        Tensor::from_bytes(DType::I8, &[], &[p.zero as i8 as u8]).expect("one byte")
    } else {
        Tensor::from_bytes(DType::U8, &[], &[p.zero as u8]).expect("one byte")
    }
}

fn i8_tensor(dims: &[usize], v: &[i8]) -> Tensor {
    let bytes: Vec<u8> = v.iter().map(|&x| x as u8).collect();
    Tensor::from_bytes(DType::I8, dims, &bytes).expect("the weights' bytes")
}

/// Rewrites `g` in the QDQ form: `targets` with the activations' parameters `params` (by
/// value name) and the float constants `weights` (by name). Returns the names of the nodes
/// quantized.
pub fn static_qdq(
    g: &mut GraphProto,
    targets: &[Target],
    params: &HashMap<String, Params>,
    weights: &HashMap<String, Tensor>,
) -> Result<Vec<String>, String> {
    let mut names = Names::of(g);
    let mut new_inits: Vec<TensorProto> = Vec::new();
    // The dequantized name of each activation, and its Q/DQ pair, emitted after its producer.
    let mut dequantized: BTreeMap<String, String> = BTreeMap::new();
    let mut pairs: HashMap<String, Vec<NodeProto>> = HashMap::new();
    let mut pair_for = |v: &str, names: &mut Names, inits: &mut Vec<TensorProto>| -> Result<String, String> {
        if let Some(d) = dequantized.get(v) {
            return Ok(d.clone());
        }
        let p = params.get(v).ok_or_else(|| format!("no calibrated range for '{v}'"))?;
        let (s, z) = (names.fresh(&format!("{v}_scale")), names.fresh(&format!("{v}_zero_point")));
        inits.push(tensor_proto(&s, &Tensor::scalar(p.scale)));
        inits.push(tensor_proto(&z, &scalar_zero(p)));
        let (q, d) =
            (names.fresh(&format!("{v}_QuantizeLinear_Output")), names.fresh(&format!("{v}_DequantizeLinear_Output")));
        let nodes = vec![
            node(
                names.fresh(&format!("{v}_QuantizeLinear")),
                "QuantizeLinear",
                vec![v.into(), s.clone(), z.clone()],
                vec![q.clone()],
                vec![],
            ),
            node(
                names.fresh(&format!("{v}_DequantizeLinear")),
                "DequantizeLinear",
                vec![q, s, z],
                vec![d.clone()],
                vec![],
            ),
        ];
        pairs.insert(v.to_string(), nodes);
        dequantized.insert(v.to_string(), d.clone());
        Ok(d)
    };
    let mut weight_nodes: HashMap<usize, Vec<NodeProto>> = HashMap::new();
    let mut replaced_consts: HashSet<String> = HashSet::new();
    let mut done = Vec::new();
    for t in targets {
        let n = g.node[t.node].clone();
        let mut inputs = n.input.clone();
        for &k in &t.activations {
            inputs[k] = pair_for(&n.input[k], &mut names, &mut new_inits)?;
        }
        let mut before = Vec::new();
        let mut w_scales: Option<Vec<f32>> = None;
        if let Some((k, axis, dims)) = &t.weight {
            let name = &n.input[*k];
            let w = weights.get(name).ok_or_else(|| format!("the weight '{name}' is not a constant"))?;
            let (q, scales) = quantize_weights(w.data::<f32>(), dims, *axis);
            let (qn, sn, zn) = (
                names.fresh(&format!("{name}_quantized")),
                names.fresh(&format!("{name}_scale")),
                names.fresh(&format!("{name}_zero_point")),
            );
            let sdims: Vec<usize> = if axis.is_some() { vec![scales.len()] } else { vec![] };
            new_inits.push(tensor_proto(&qn, &i8_tensor(dims, &q)));
            new_inits.push(tensor_proto(&sn, &Tensor::from_slice(&sdims, &scales)));
            new_inits.push(tensor_proto(&zn, &i8_tensor(&sdims, &vec![0; scales.len()])));
            let out = names.fresh(&format!("{name}_DequantizeLinear_Output"));
            let attrs = axis.map(|a| vec![("axis", Attr::Int(a as i64))]).unwrap_or_default();
            before.push(node(
                names.fresh(&format!("{name}_DequantizeLinear")),
                "DequantizeLinear",
                vec![qn, sn, zn],
                vec![out.clone()],
                attrs,
            ));
            inputs[*k] = out;
            replaced_consts.insert(name.clone());
            w_scales = Some(scales);
        }
        if let (Some(k), Some(ws)) = (t.bias, &w_scales) {
            // The bias in int32 steps of input scale × weight scale (per output channel).
            let name = &n.input[k];
            let b = weights.get(name).ok_or_else(|| format!("the bias '{name}' is not a constant"))?;
            let x = t.activations.first().map(|&a| &n.input[a]).ok_or("a bias needs a quantized input")?;
            let sx = params.get(x).ok_or_else(|| format!("no calibrated range for '{x}'"))?.scale;
            let bv = b.data::<f32>();
            let scale: Vec<f32> = (0..bv.len()).map(|c| sx * ws[if ws.len() == 1 { 0 } else { c }]).collect();
            let q: Vec<i32> = bv
                .iter()
                .zip(&scale)
                .map(|(&v, &s)| (v / s).round_ties_even().clamp(-2147483648.0, 2147483520.0) as i32)
                .collect();
            let (qn, sn) = (names.fresh(&format!("{name}_quantized")), names.fresh(&format!("{name}_scale")));
            new_inits.push(tensor_proto(&qn, &Tensor::from_slice(b.shape(), &q)));
            new_inits.push(tensor_proto(&sn, &Tensor::from_slice(&[scale.len()], &scale)));
            let out = names.fresh(&format!("{name}_DequantizeLinear_Output"));
            before.push(node(
                names.fresh(&format!("{name}_DequantizeLinear")),
                "DequantizeLinear",
                vec![qn, sn],
                vec![out.clone()],
                vec![("axis", Attr::Int(0))],
            ));
            inputs[k] = out;
            replaced_consts.insert(name.clone());
        }
        g.node[t.node].input = inputs;
        weight_nodes.insert(t.node, before);
        done.push(n.name().to_string());
    }
    // Node order: each pair right after the node making its value (graph inputs' first),
    // each weight's dequantization right before its node.
    let graph_inputs: Vec<String> = g.input.iter().map(|v| v.name().to_string()).collect();
    let mut out: Vec<NodeProto> = Vec::with_capacity(g.node.len() * 2);
    for v in &graph_inputs {
        out.extend(pairs.remove(v).unwrap_or_default());
    }
    for (i, n) in std::mem::take(&mut g.node).into_iter().enumerate() {
        out.extend(weight_nodes.remove(&i).unwrap_or_default());
        let outputs = n.output.clone();
        out.push(n);
        for o in &outputs {
            out.extend(pairs.remove(o).unwrap_or_default());
        }
    }
    if let Some(v) = pairs.keys().next() {
        return Err(format!("the value '{v}' is neither a graph input nor made by a node"));
    }
    g.node = out;
    drop_unread(g, &replaced_consts);
    g.initializer.extend(new_inits);
    Ok(done)
}

/// Rewrites each MatMul / Gemm of `targets` (constant weights) in the dynamic form. Returns
/// the names of the nodes quantized.
pub fn dynamic(
    g: &mut GraphProto,
    targets: &[Target],
    weights: &HashMap<String, Tensor>,
) -> Result<Vec<String>, String> {
    let mut names = Names::of(g);
    let mut new_inits: Vec<TensorProto> = Vec::new();
    let mut replaced: HashMap<usize, Vec<NodeProto>> = HashMap::new();
    let mut consts: HashSet<String> = HashSet::new();
    let mut done = Vec::new();
    for t in targets {
        let n = g.node[t.node].clone();
        let base = n.name().to_string();
        let Some((k, axis, dims)) = &t.weight else { continue };
        let name = &n.input[*k];
        let w = weights.get(name).ok_or_else(|| format!("the weight '{name}' is not a constant"))?;
        // MatMulInteger has no transposition: Gemm's transposed weights are turned once.
        let (wv, kn): (Vec<f32>, [usize; 2]) = if t.transposed {
            let (rows, cols) = (dims[0], dims[1]);
            let src = w.data::<f32>();
            ((0..rows * cols).map(|i| src[(i % rows) * cols + i / rows]).collect(), [cols, rows])
        } else {
            (w.data::<f32>().to_vec(), [dims[0], dims[1]])
        };
        let per_col = axis.is_some();
        let (q, scales) = quantize_weights(&wv, &kn, per_col.then_some(1));
        let sdims: Vec<usize> = if per_col { vec![scales.len()] } else { vec![] };
        let (qn, sn, zn) = (
            names.fresh(&format!("{name}_quantized")),
            names.fresh(&format!("{name}_scale")),
            names.fresh(&format!("{name}_zero_point")),
        );
        new_inits.push(tensor_proto(&qn, &i8_tensor(&kn, &q)));
        new_inits.push(tensor_proto(&sn, &Tensor::from_slice(&sdims, &scales)));
        new_inits.push(tensor_proto(&zn, &i8_tensor(&sdims, &vec![0; scales.len()])));
        consts.insert(name.clone());
        let v = |s: &str, names: &mut Names| names.fresh(&format!("{base}_{s}"));
        let (aq, as_, az) = (v("quant", &mut names), v("scale", &mut names), v("zero_point", &mut names));
        let (mm, cast, prod) =
            (v("MatMulInteger_Output", &mut names), v("Cast_Output", &mut names), v("scale_product", &mut names));
        let y = n.output[0].clone();
        let has_bias = t.bias.is_some();
        let scaled = if has_bias { v("scaled", &mut names) } else { y.clone() };
        let mut nodes = vec![
            node(
                v("DynamicQuantizeLinear", &mut names),
                "DynamicQuantizeLinear",
                vec![n.input[0].clone()],
                vec![aq.clone(), as_.clone(), az.clone()],
                vec![],
            ),
            node(v("MatMulInteger", &mut names), "MatMulInteger", vec![aq, qn, az, zn], vec![mm.clone()], vec![]),
            node(v("Cast", &mut names), "Cast", vec![mm], vec![cast.clone()], vec![("to", Attr::Int(1))]),
            node(v("ScaleProduct", &mut names), "Mul", vec![as_, sn], vec![prod.clone()], vec![]),
            node(v("Mul", &mut names), "Mul", vec![cast, prod], vec![scaled.clone()], vec![]),
        ];
        if let Some(b) = t.bias {
            nodes.push(node(v("Add", &mut names), "Add", vec![scaled, n.input[b].clone()], vec![y], vec![]));
        }
        replaced.insert(t.node, nodes);
        done.push(base);
    }
    let mut out = Vec::with_capacity(g.node.len() + 4 * replaced.len());
    for (i, n) in std::mem::take(&mut g.node).into_iter().enumerate() {
        match replaced.remove(&i) {
            Some(nodes) => out.extend(nodes),
            None => out.push(n),
        }
    }
    g.node = out;
    drop_unread(g, &consts);
    g.initializer.extend(new_inits);
    Ok(done)
}

/// Removes the constants of `names` that no node (or graph output) reads any more.
fn drop_unread(g: &mut GraphProto, names: &HashSet<String>) {
    let mut read: HashSet<&str> = g.node.iter().flat_map(|n| n.input.iter().map(|s| s.as_str())).collect();
    read.extend(g.output.iter().map(|o| o.name()));
    // Subgraphs read outer values too.
    let mut sub = Vec::new();
    for n in &g.node {
        for a in &n.attribute {
            if let Some(gg) = &a.g {
                collect_inputs(gg, &mut sub);
            }
        }
    }
    let sub: HashSet<String> = sub.into_iter().collect();
    let keep = |t: &TensorProto| !names.contains(t.name()) || read.contains(t.name()) || sub.contains(t.name());
    g.initializer.retain(keep);
    let inits: HashSet<String> = g.initializer.iter().map(|t| t.name().to_string()).collect();
    // Graph inputs that only declared a removed initializer go with it.
    g.input
        .retain(|v: &ValueInfoProto| !names.contains(v.name()) || inits.contains(v.name()) || read.contains(v.name()));
}

fn collect_inputs(g: &GraphProto, out: &mut Vec<String>) {
    for n in &g.node {
        out.extend(n.input.iter().cloned());
        for a in &n.attribute {
            if let Some(gg) = &a.g {
                collect_inputs(gg, out);
            }
        }
    }
}

/// Folds each BatchNormalization that alone reads a Conv's output (constant weights and
/// statistics) into that Conv's weights and bias, as ONNX Runtime's quantization
/// pre-processing does: the Conv's result is then the one quantized (and an activation
/// after it joins the integer kernel). The new constants go into `weights`. Returns how
/// many were folded.
pub fn fold_batchnorm(g: &mut GraphProto, weights: &mut HashMap<String, Tensor>) -> usize {
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for n in &g.node {
        for i in n.input.iter().filter(|s| !s.is_empty()) {
            *readers.entry(i.as_str()).or_default() += 1;
        }
    }
    for o in &g.output {
        *readers.entry(o.name()).or_default() += 1;
    }
    let by_output: HashMap<&str, usize> =
        g.node.iter().enumerate().flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i))).collect();
    let mut names = Names::of(g);
    let mut folds: Vec<(usize, usize, Vec<String>, Tensor, Tensor)> = Vec::new();
    for (b, bn) in g.node.iter().enumerate() {
        if !(bn.domain().is_empty() && bn.op_type() == "BatchNormalization")
            || bn.output.len() != 1
            || bn.input.len() != 5
        {
            continue;
        }
        let Some(&c) = by_output.get(bn.input[0].as_str()) else { continue };
        let conv = &g.node[c];
        let attr = |n: &NodeProto, k: &str| n.attribute.iter().find(|a| a.name() == k).cloned();
        if !(conv.domain().is_empty() && conv.op_type() == "Conv")
            || readers.get(bn.input[0].as_str()) != Some(&1)
            || attr(bn, "training_mode").is_some_and(|a| a.i() != 0)
        {
            continue;
        }
        let get = |v: &str| weights.get(v).filter(|t| t.dtype() == DType::F32);
        let (Some(w), Some(gamma), Some(beta), Some(mean), Some(var)) = (
            conv.input.get(1).and_then(|v| get(v)),
            get(&bn.input[1]),
            get(&bn.input[2]),
            get(&bn.input[3]),
            get(&bn.input[4]),
        ) else {
            continue;
        };
        let m = w.shape().first().copied().unwrap_or(0);
        if w.rank() != 4 || [gamma, beta, mean, var].iter().any(|t| t.len() != m) {
            continue;
        }
        let bias = match conv.input.get(2).filter(|s| !s.is_empty()) {
            Some(v) => match get(v).filter(|t| t.len() == m) {
                Some(t) => t.data::<f32>().to_vec(),
                None => continue,
            },
            None => vec![0.0; m],
        };
        let eps = attr(bn, "epsilon").map_or(1e-5, |a| a.f());
        let (g_, b_, mu, v_) = (gamma.data::<f32>(), beta.data::<f32>(), mean.data::<f32>(), var.data::<f32>());
        let k: Vec<f32> = (0..m).map(|o| g_[o] / (v_[o] + eps).sqrt()).collect();
        let per = w.len() / m.max(1);
        let wv: Vec<f32> = w.data::<f32>().iter().enumerate().map(|(i, &x)| x * k[i / per]).collect();
        let bv: Vec<f32> = (0..m).map(|o| (bias[o] - mu[o]) * k[o] + b_[o]).collect();
        let wn = names.fresh(&format!("{}_bn_folded", conv.input[1]));
        let bn_ = names.fresh(&format!("{}_bn_folded_bias", conv.name()));
        folds.push((c, b, vec![wn, bn_], Tensor::from_vec(w.shape(), wv), Tensor::from_vec(&[m], bv)));
    }
    let count = folds.len();
    let mut gone: HashSet<usize> = HashSet::new();
    let mut replaced: HashSet<String> = HashSet::new();
    for (c, b, names, w, bias) in folds {
        let y = g.node[b].output[0].clone();
        replaced.extend(g.node[c].input.iter().skip(1).cloned());
        replaced.extend(g.node[b].input.iter().skip(1).cloned());
        let conv = &mut g.node[c];
        conv.input.truncate(1);
        conv.input.extend(names.iter().cloned());
        conv.output[0] = y;
        g.initializer.push(tensor_proto(&names[0], &w));
        g.initializer.push(tensor_proto(&names[1], &bias));
        weights.insert(names[0].clone(), w);
        weights.insert(names[1].clone(), bias);
        gone.insert(b);
    }
    let mut i = 0;
    g.node.retain(|_| {
        i += 1;
        !gone.contains(&(i - 1))
    });
    drop_unread(g, &replaced);
    count
}
