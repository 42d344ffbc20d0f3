//! Statically quantized convolutions as one integer kernel, where the target has one
//! (AVX-512 VNNI): a Conv whose input is a quantize-dequantize pair with constant
//! per-tensor parameters and whose weights are the dequantization of constant s8 weights
//! with zero point 0 (what ONNX Runtime's QDQ quantizer writes, and what the
//! quantize-dequantize pass makes of QLinearConv), with a constant bias, becomes
//! `aim:QConv(x, Wq, sx, zx, sw, bias)`, with a Relu / Clip reading it folded in. The
//! kernel quantizes `x` exactly as the QuantizeLinear does and sums exactly, so the result
//! is the f32 convolution of the dequantized values up to that convolution's own rounding.
//!
//! Depthwise convolutions (one input channel per group) keep the f32 kernels: their one
//! row of products per group does not fill the integer tiles.

use super::fuse::{activation_at, set_activation, sources_of, SOURCES};
use super::uses::{readers, remove_marked};
use aim_ir::{Attr, DType, Graph, Node, Tensor};
use std::collections::HashMap;

/// Fuses every matching convolution (see the module doc).
pub fn run(g: &mut Graph) {
    if !g.nodes.iter().any(|n| n.domain.is_empty() && n.op == "Conv") {
        return;
    }
    let r = readers(g);
    let by_output: HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut replace: Vec<(usize, Node)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some((node, at, absorbed)) = match_conv(g, &r, &by_output, n) {
            for k in absorbed {
                removed[k] = true;
            }
            replace.push((at.unwrap_or(i), node));
            removed[i] = true;
        }
    }
    // A value whose quantize-dequantize pair a fused node took in is gone: the integer
    // convolutions that quantized it read the pair's output instead (quantizing that with
    // the same parameters gives the same integers).
    let mut renamed: HashMap<String, String> = HashMap::new();
    for (_, node) in &replace {
        if let Some(Attr::String(v)) = node.attrs.get(REQUANTIZED) {
            renamed.insert(v.clone(), node.outputs[0].clone());
        }
    }
    for (at, mut node) in replace {
        node.attrs.remove(REQUANTIZED);
        g.nodes[at] = node;
        removed[at] = false;
    }
    remove_marked(g, &removed);
    if !renamed.is_empty() {
        for n in &mut g.nodes {
            for i in n.inputs.iter_mut() {
                if let Some(to) = renamed.get(i.as_str()) {
                    *i = to.clone();
                }
            }
        }
    }
}

/// Attribute the matcher leaves on a node that took in a pair: the value the pair read.
const REQUANTIZED: &str = "requantized_value";

/// A one-element constant.
fn scalar<'g>(g: &'g Graph, v: Option<&str>) -> Option<&'g Tensor> {
    g.initializers.get(v?).filter(|t| t.len() == 1)
}

/// Whether two one-element constants hold the same value of the same type.
fn same(a: &Tensor, b: &Tensor) -> bool {
    a.dtype() == b.dtype() && a.bytes() == b.bytes()
}

/// The node making `v`, if it is `op` of the default domain.
fn producer<'g>(g: &'g Graph, by_output: &HashMap<&str, usize>, v: &str, op: &str) -> Option<&'g Node> {
    let n = &g.nodes[*by_output.get(v)?];
    (n.domain.is_empty() && n.op == op).then_some(n)
}

/// Whether `v` is computed from constants alone (within `depth` nodes), so that constant
/// folding makes it one.
pub(super) fn constant(g: &Graph, by_output: &HashMap<&str, usize>, v: &str, depth: usize) -> bool {
    if g.initializers.contains_key(v) {
        return true;
    }
    let Some(&i) = by_output.get(v) else { return false };
    let n = &g.nodes[i];
    depth > 0
        && n.domain.is_empty()
        && n.attrs.values().all(|a| !matches!(a, Attr::Graph(_)))
        && n.inputs.iter().filter(|s| !s.is_empty()).all(|s| constant(g, by_output, s, depth - 1))
}

/// Attributes of an `aim:QConv` whose output goes through a quantize-dequantize pair:
/// the pair's scale, zero point and integer range.
pub const REQUANT_SCALE: &str = "requant_scale";
/// See [`REQUANT_SCALE`].
pub const REQUANT_ZERO: &str = "requant_zero";
/// See [`REQUANT_SCALE`].
pub const REQUANT_MIN: &str = "requant_min";
/// See [`REQUANT_SCALE`].
pub const REQUANT_MAX: &str = "requant_max";

/// The QuantizeLinear → DequantizeLinear pair (with equal per-tensor parameters) that is
/// the only reader of `v`, with its parameters and the index of its DequantizeLinear.
fn requantized(g: &Graph, r: &HashMap<String, Vec<usize>>, v: &str) -> Option<(Vec<usize>, super::qdq::Params, usize)> {
    let only = |v: &str| match r.get(v).map(|x| x.as_slice()) {
        Some(&[k]) if k != usize::MAX && g.nodes[k].domain.is_empty() => Some(k),
        _ => None,
    };
    let q = only(v)?;
    let qn = &g.nodes[q];
    if qn.op != "QuantizeLinear"
        || qn.attrs.contains_key("block_size")
        || super::qdq::four_bit(qn)
        || qn.input(0) != Some(v)
    {
        return None;
    }
    let d = only(&qn.outputs[0])?;
    let dn = &g.nodes[d];
    if dn.op != "DequantizeLinear" || dn.attrs.contains_key("block_size") || dn.attrs.contains_key("output_dtype") {
        return None;
    }
    let (pq, pd) = (super::qdq::params(g, qn)?, super::qdq::params(g, dn)?);
    (pq == pd && pq.scale != 0.0 && pq.scale.is_finite()).then_some((vec![q, d], pq, d))
}

/// The fused node for Conv `n`, the index it takes when an activation is folded (else the
/// Conv's), and the activation nodes it absorbs.
fn match_conv(
    g: &Graph,
    r: &HashMap<String, Vec<usize>>,
    by_output: &HashMap<&str, usize>,
    n: &Node,
) -> Option<(Node, Option<usize>, Vec<usize>)> {
    if !(n.domain.is_empty() && n.op == "Conv") || n.string("auto_pad", "NOTSET") != "NOTSET" {
        return None;
    }
    // The input: DequantizeLinear(QuantizeLinear(x, s, z), s, z), per tensor.
    let dqx = producer(g, by_output, n.input(0)?, "DequantizeLinear")?;
    let qx = producer(g, by_output, dqx.input(0)?, "QuantizeLinear")?;
    let (sx, zx) = (scalar(g, dqx.input(1))?, scalar(g, dqx.input(2))?);
    let (sq, zq) = (scalar(g, qx.input(1))?, scalar(g, qx.input(2))?);
    if !(same(sx, sq) && same(zx, zq) && sx.dtype() == DType::F32 && matches!(zx.dtype(), DType::U8 | DType::I8)) {
        return None;
    }
    let x = qx.input(0)?;
    if g.value_type(x).and_then(|t| t.dtype) != Some(DType::F32) {
        return None;
    }
    // The weights: DequantizeLinear(Wq, sw, 0) of s8 constants, per tensor or per output channel.
    let dqw = producer(g, by_output, n.input(1)?, "DequantizeLinear")?;
    let wq = g.initializers.get(dqw.input(0)?).filter(|t| t.dtype() == DType::I8 && t.shape().len() == 4)?;
    let ws = wq.shape();
    let sw = g.initializers.get(dqw.input(1)?).filter(|t| t.dtype() == DType::F32)?;
    let per_channel = sw.len() > 1;
    if (per_channel && (sw.len() != ws[0] || !matches!(dqw.int("axis", 1), 0 | -4))) || sw.is_empty() {
        return None;
    }
    if let Some(zw) = dqw.input(2) {
        let z = g.initializers.get(zw)?;
        if z.dtype() != DType::I8 || z.data::<i8>().iter().any(|&v| v != 0) {
            return None;
        }
    }
    let group = n.int("group", 1);
    if group < 1 || (group > 1 && ws[1] < 4) {
        return None;
    }
    // The bias: an f32 constant, or a dequantization of constants (folded before the kernels
    // are prepared).
    let bias = match n.input(2) {
        None => "",
        Some(b) if g.initializers.get(b).is_some_and(|t| t.dtype() == DType::F32) => b,
        Some(b) if constant(g, by_output, b, 3) => b,
        Some(_) => return None,
    };
    let mut attrs: std::collections::BTreeMap<String, Attr> = n
        .attrs
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "strides" | "pads" | "dilations" | "group"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // The kernel does the quantization and both dequantizations.
    let mut sources = sources_of(qx);
    sources.extend(sources_of(dqx));
    sources.extend(sources_of(dqw));
    sources.extend(sources_of(n));
    let mut out = n.outputs[0].clone();
    let (mut at, mut absorbed) = (None, Vec::new());
    if let Some((act, taken)) = r.get(&out).and_then(|rd| activation_at(g, r, &out, rd)) {
        let mut f = n.clone();
        f.attrs.clear();
        set_activation(&mut f, act);
        attrs.extend(f.attrs);
        for &k in &taken {
            sources.extend(sources_of(&g.nodes[k]));
        }
        let last = *taken.iter().max().expect("an activation takes a node");
        out = g.nodes[last].outputs[0].clone();
        at = Some(last);
        absorbed = taken;
    }
    // A quantize-dequantize pair that alone reads the result rounds it in the epilogue
    // (the pair's f32 arithmetic, step for step) instead of in a pass over memory.
    if let Some((pair, p, last)) = requantized(g, r, &out) {
        attrs.insert(REQUANTIZED.into(), Attr::String(out.clone()));
        for (k, v) in [(REQUANT_SCALE, p.scale), (REQUANT_ZERO, p.zero), (REQUANT_MIN, p.lo), (REQUANT_MAX, p.hi)] {
            attrs.insert(k.into(), Attr::Float(v));
        }
        for &k in &pair {
            sources.extend(sources_of(&g.nodes[k]));
        }
        out = g.nodes[last].outputs[0].clone();
        at = Some(last);
        absorbed.extend(pair);
    }
    attrs.insert(SOURCES.into(), Attr::Strings(sources));
    let node = Node {
        name: format!("{}/qconv", n.name),
        op: "QConv".into(),
        domain: "aim".into(),
        inputs: vec![
            x.to_string(),
            dqw.inputs[0].clone(),
            dqx.inputs[1].clone(),
            dqx.inputs[2].clone(),
            dqw.inputs[1].clone(),
            bias.to_string(),
        ],
        outputs: vec![out],
        attrs,
    };
    Some((node, at, absorbed))
}

/// Whether `v` (f32) holds one value, or one per channel of a 4-D NCHW value with `m`
/// channels (`[M, 1, 1]`, `[1, M, 1, 1]`): a scale or bias the kernel applies per channel.
fn per_channel(g: &Graph, v: &str, m: usize) -> bool {
    let Some(t) = g.value_type(v).filter(|t| t.dtype == Some(DType::F32)) else { return false };
    let Some(s) = t.concrete_shape().filter(|s| s.len() <= 4) else { return false };
    let aligned: Vec<usize> = std::iter::repeat_n(1, 4 - s.len()).chain(s.iter().copied()).collect();
    aligned[0] == 1 && aligned[2] == 1 && aligned[3] == 1 && (aligned[1] == 1 || aligned[1] == m)
}

/// The `aim:ConvInteger` nodes of dynamically quantized convolutions take what follows
/// them into the kernel's epilogue: an offset added to the sums (`Add` of one value or one
/// per channel: the quantized bias older `quantize_dynamic` computes per run and adds to
/// the integers) as input 5, the product by the scales (`Mul` by the input's scale times
/// the weights', computed at run time, one or one per channel), a constant bias and an
/// activation — what the f32 form would have fused into its convolution.
pub fn run_dynamic(g: &mut Graph) {
    if !g.nodes.iter().any(|n| n.domain == "aim" && n.op == "ConvInteger") {
        return;
    }
    let r = readers(g);
    let outputs: std::collections::HashSet<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut replace: Vec<(usize, Node)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !(n.domain == "aim" && n.op == "ConvInteger" && n.inputs.len() <= 3) {
            continue;
        }
        let Some(m) = n.input(1).and_then(|w| g.initializers.get(w)).map(|w| w.shape()[0]) else { continue };
        // The sole reader of `v`, not a graph output, of the default domain.
        let sole = |v: &str| match r.get(v).map(|x| x.as_slice()) {
            Some(&[k]) if k != usize::MAX && g.nodes[k].domain.is_empty() && !outputs.contains(v) => Some(k),
            _ => None,
        };
        let binary = |k: usize, op: &str| g.nodes[k].op == op && g.nodes[k].inputs.len() == 2;
        // The other operand of binary node `k` that reads `v`, if it is one value or one
        // per channel.
        let other = |k: usize, v: &str| {
            let x = &g.nodes[k];
            let o = if x.inputs[0] == v { &x.inputs[1] } else { &x.inputs[0] };
            (o != v && per_channel(g, o, m)).then(|| o.clone())
        };
        let mut sums = n.outputs[0].clone();
        let mut taken = Vec::new();
        let mut sources = sources_of(n);
        let mut offset = None;
        if let Some(a) = sole(&sums).filter(|&a| binary(a, "Add")) {
            let Some(o) = other(a, &sums) else { continue };
            offset = Some(o);
            taken.push(a);
            sources.extend(sources_of(&g.nodes[a]));
            sums = g.nodes[a].outputs[0].clone();
        }
        let Some(k) = sole(&sums).filter(|&k| binary(k, "Mul")) else { continue };
        let mul = &g.nodes[k];
        let Some(scale) = other(k, &sums) else { continue };
        taken.push(k);
        sources.extend(sources_of(mul));
        let mut out = mul.outputs[0].clone();
        let mut bias = String::new();
        if let Some(a) = sole(&out).filter(|&a| g.nodes[a].op == "Add" && g.nodes[a].inputs.len() == 2) {
            let add = &g.nodes[a];
            let b = if add.inputs[0] == out { &add.inputs[1] } else { &add.inputs[0] };
            let constant = g.initializers.get(b).is_some_and(|t| t.dtype() == DType::F32 && t.len() == m);
            if *b != out && constant && per_channel(g, b, m) {
                bias = b.clone();
                taken.push(a);
                sources.extend(sources_of(add));
                out = add.outputs[0].clone();
            }
        }
        let mut node = n.clone();
        node.inputs.resize(3, String::new());
        node.inputs.extend([scale, bias]);
        node.inputs.extend(offset);
        if let Some((act, more)) = r.get(&out).and_then(|rd| activation_at(g, &r, &out, rd)) {
            if !outputs.contains(out.as_str()) {
                set_activation(&mut node, act);
                for &x in &more {
                    sources.extend(sources_of(&g.nodes[x]));
                }
                out = g.nodes[*more.iter().max().expect("an activation takes a node")].outputs[0].clone();
                taken.extend(more);
            }
        }
        node.outputs = vec![out];
        // Nodes the product and the offset's Add both came from, named once.
        let mut seen = std::collections::HashSet::new();
        sources.retain(|s| seen.insert(s.clone()));
        node.attrs.insert(SOURCES.into(), Attr::Strings(sources));
        let last = *taken.iter().max().expect("the product is taken");
        removed[i] = true;
        for &x in &taken {
            removed[x] = true;
        }
        replace.push((last, node));
    }
    for (at, node) in replace {
        g.nodes[at] = node;
        removed[at] = false;
    }
    remove_marked(g, &removed);
}
