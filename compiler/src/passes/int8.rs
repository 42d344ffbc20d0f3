//! Byte regions: statically quantized CNNs keep their activations as bytes, channels last,
//! between integer kernels (`aim_kernels::int8`).
//!
//! In the QDQ form every quantized activation is an integer tensor `q = QuantizeLinear(x)`
//! read through `DequantizeLinear(q)` by the f32 ops after it. This pass looks for the ops
//! that can compute on `q` directly — a Conv (plain or depthwise, s8 weights with zero
//! point 0) whose input is such a dequantization and whose result, after an optional
//! activation, is quantized by a QuantizeLinear alone; an Add of two dequantized values
//! quantized likewise; a MaxPool between a dequantization and a quantization with the
//! same parameters — and rewrites them as `aim:Conv8`, `aim:Add8`, `aim:MaxPool8`, which
//! read and write bytes NHWC (`q` in "u8 terms": an s8 value plus 128). Every integer
//! tensor such an op reads or writes is then stored that way:
//!
//! - one made by a QuantizeLinear of an f32 value becomes `aim:Quantize8` (the layout
//!   change in the same pass);
//! - each DequantizeLinear of it that an f32 op still reads becomes `aim:Dequantize8`
//!   (bytes NHWC to f32 NCHW);
//! - a reader of the integer tensor itself (a graph output, an integer op) gets it back
//!   exactly, as the QuantizeLinear of its dequantization.
//!
//! A 1-D convolution's values (`[N, C, W]`) join as 2-D ones of height 1: their bytes are
//! `[N, 1, W, C]`, the Conv8 (or MaxPool8) takes 2-D attributes and weights, and their
//! dequantizations are `aim:Dequantize8` with `ncw = 1`, back to `[N, C, W]`.
//!
//! Finally an `aim:Add8` whose operand is a convolution's result read by nothing else takes
//! that convolution in: it adds the other operand in the convolution's epilogue.
//!
//! Quantizing and dequantizing are exact; each integer kernel's result is the QDQ graph's
//! up to the rounding of its f32 steps (the sums themselves are exact), the same freedom
//! ONNX Runtime's integer kernels take.

use super::fuse::{activation_at, sources_of, SOURCES};
use super::uses::readers;
use aim_ir::{Attr, DType, Dim, Graph, Node, ValueType};
use aim_kernels::gemm::Activation;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A quantized activation: the integer output of a per-tensor 8-bit QuantizeLinear.
struct Quantized {
    /// The QuantizeLinear.
    node: usize,
    /// Scale and zero point in u8 terms.
    scale: f32,
    zero: i64,
    /// Its dims in NCHW order (a 1-D value's `[N, C, W]` as `[N, C, 1, W]`).
    dims: Vec<Dim>,
    /// Whether the value is 1-D, `[N, C, W]`.
    ncw: bool,
}

/// An activation folded into a byte op, with the nodes it takes.
type Act = Option<(Activation, Vec<usize>)>;

/// An op that runs on bytes, found in the graph.
enum IntOp {
    Conv { conv: usize, input: String, act: Act, depthwise: bool },
    Add { add: usize, inputs: [String; 2], act: Act },
    MaxPool { pool: usize, input: String },
}

/// Rewrites the byte regions of `g` (see the module doc).
pub fn run(g: &mut Graph) {
    if !g.nodes.iter().any(|n| n.domain.is_empty() && n.op == "QuantizeLinear") {
        return;
    }
    let r = readers(g);
    let by_output: HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    let quantized = quantized_values(g);
    // The integer tensor a DequantizeLinear reads, when its parameters are the tensor's.
    let dequantizes = |v: &str| -> Option<String> {
        let d = &g.nodes[*by_output.get(v)?];
        let q = d.input(0)?;
        let qv = quantized.get(q)?;
        (d.domain.is_empty() && d.op == "DequantizeLinear" && same_params(g, d, &g.nodes[qv.node])).then(|| q.into())
    };
    // The quantized value that alone reads `v` (after an optional activation).
    let quantized_by = |v: &str| -> Option<(Act, String)> {
        let rd = r.get(v)?;
        let act = activation_at(g, &r, v, rd);
        let last = match &act {
            Some((_, taken)) => g.nodes[*taken.last()?].outputs.first()?.clone(),
            None => v.to_string(),
        };
        match r.get(&last)?.as_slice() {
            &[k] if k != usize::MAX
                && g.nodes[k].outputs.first().is_some_and(|o| quantized.contains_key(o.as_str())) =>
            {
                let q = &g.nodes[k];
                (q.input(0) == Some(last.as_str())).then(|| (act, q.outputs[0].clone()))
            }
            _ => None,
        }
    };
    // The ops, with the quantized value each makes, in graph order.
    let mut ops: Vec<(IntOp, String)> = Vec::new();
    let mut made: HashSet<String> = HashSet::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.domain.is_empty() {
            continue;
        }
        let found = match n.op.as_str() {
            "Conv" => conv_op(g, &by_output, n).and_then(|depthwise| {
                let input = dequantizes(n.input(0)?)?;
                let (act, out) = quantized_by(&n.outputs[0])?;
                Some((IntOp::Conv { conv: i, input, act, depthwise }, out))
            }),
            "Add" if n.inputs.len() == 2 => (|| {
                let (a, b) = (dequantizes(n.input(0)?)?, dequantizes(n.input(1)?)?);
                // Operands of one shape, both made by byte ops (a lone Add is not worth a
                // change of layout).
                let same = quantized[a.as_str()].dims == quantized[b.as_str()].dims
                    && !quantized[a.as_str()].dims.contains(&Dim::Unknown);
                if !(same && made.contains(&a) && made.contains(&b)) {
                    return None;
                }
                let (act, out) = quantized_by(&n.outputs[0])?;
                Some((IntOp::Add { add: i, inputs: [a, b], act }, out))
            })(),
            "MaxPool" if n.outputs.len() == 1 && pool_ok(n) => (|| {
                let input = dequantizes(n.input(0)?)?;
                let (act, out) = quantized_by(&n.outputs[0])?;
                let one_d = n.ints("kernel_shape").is_some_and(|k| k.len() == 1);
                let same = act.is_none()
                    && quantized[input.as_str()].ncw == one_d
                    && same_params(g, &g.nodes[quantized[input.as_str()].node], &g.nodes[quantized[out.as_str()].node]);
                (same && made.contains(&input)).then_some((IntOp::MaxPool { pool: i, input }, out))
            })(),
            _ => None,
        };
        if let Some((op, out)) = found {
            if quantized[out.as_str()].dims.len() == 4 {
                made.insert(out.clone());
                ops.push((op, out));
            }
        }
    }
    if ops.is_empty() {
        return;
    }
    rewrite(g, &r, &quantized, ops);
    fuse_residuals(g);
    fuse_global_pools(g);
}

/// Every per-tensor 8-bit QuantizeLinear output of a rank-4 f32 value, by name.
fn quantized_values(g: &Graph) -> HashMap<String, Quantized> {
    let mut out = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !(n.domain.is_empty() && n.op == "QuantizeLinear") || n.attrs.contains_key("block_size") {
            continue;
        }
        let Some(p) = super::qdq::params(g, n) else { continue };
        let shift = match (p.lo, p.hi) {
            (0.0, 255.0) => 0,
            (-128.0, 127.0) => 128,
            _ => continue,
        };
        let ty = n.input(0).and_then(|x| g.value_type(x));
        let (dims, ncw) = match ty {
            Some(ValueType { dtype: Some(DType::F32), shape: Some(s) }) if s.len() == 4 => (s, false),
            Some(ValueType { dtype: Some(DType::F32), shape: Some(s) }) if s.len() == 3 => {
                (vec![s[0].clone(), s[1].clone(), Dim::Known(1), s[2].clone()], true)
            }
            _ => continue,
        };
        if !(p.scale > 0.0 && p.scale.is_finite()) {
            continue;
        }
        let zero = p.zero as i64 + shift;
        out.insert(n.outputs[0].clone(), Quantized { node: i, scale: p.scale, zero, dims, ncw });
    }
    out
}

/// Whether two Q/DQ nodes have the same constant scale and zero point.
fn same_params(g: &Graph, a: &Node, b: &Node) -> bool {
    let t = |n: &Node, k: usize| n.input(k).and_then(|v| g.initializers.get(v));
    let eq = |x: Option<&aim_ir::Tensor>, y: Option<&aim_ir::Tensor>| match (x, y) {
        (Some(x), Some(y)) => x.dtype() == y.dtype() && x.bytes() == y.bytes(),
        (None, None) => true,
        _ => false,
    };
    !a.attrs.contains_key("block_size")
        && !b.attrs.contains_key("block_size")
        && !a.attrs.contains_key("output_dtype")
        && !b.attrs.contains_key("output_dtype")
        && t(a, 1).is_some()
        && eq(t(a, 1), t(b, 1))
        && eq(t(a, 2), t(b, 2))
}

/// Whether a Conv runs on bytes: 2-D (or 1-D, as 2-D of height 1), explicit padding, s8 weights (the dequantization of
/// constants with zero point 0, per tensor or per output channel), a constant bias, and
/// one group (`Some(false)`) or one channel per group (`Some(true)`, depthwise).
fn conv_op(g: &Graph, by_output: &HashMap<&str, usize>, n: &Node) -> Option<bool> {
    if n.string("auto_pad", "NOTSET") != "NOTSET" || n.outputs.len() != 1 {
        return None;
    }
    let dqw = &g.nodes[*by_output.get(n.input(1)?)?];
    if !(dqw.domain.is_empty() && dqw.op == "DequantizeLinear") || dqw.attrs.contains_key("block_size") {
        return None;
    }
    let x_rank = g.value_type(n.input(0)?)?.shape?.len();
    let w = g.initializers.get(dqw.input(0)?).filter(|t| t.dtype() == DType::I8 && t.rank() == x_rank)?;
    if !matches!(x_rank, 3 | 4) {
        return None;
    }
    let ws = w.shape();
    let sw = g.initializers.get(dqw.input(1)?).filter(|t| t.dtype() == DType::F32)?;
    if sw.len() != 1 && !(sw.len() == ws[0] && matches!(dqw.int("axis", 1), 0 | -4)) {
        return None;
    }
    if let Some(z) = dqw.input(2) {
        let z = g.initializers.get(z)?;
        if z.dtype() != DType::I8 || z.data::<i8>().iter().any(|&v| v != 0) {
            return None;
        }
    }
    if let Some(b) = n.input(2) {
        if !super::qconv::constant(g, by_output, b, 3) {
            return None;
        }
    }
    let channels = match g.value_type(n.input(0)?)?.shape?.get(1)? {
        Dim::Known(c) => *c,
        _ => return None,
    };
    match n.int("group", 1) {
        1 if ws[1] == channels => Some(false),
        k if k > 1 && k as usize == channels && ws[0] == channels && ws[1] == 1 => Some(true),
        _ => None,
    }
}

/// Whether a MaxPool runs on bytes: 2-D (or 1-D), explicit padding, no storage order.
fn pool_ok(n: &Node) -> bool {
    n.ints("kernel_shape").is_some_and(|k| matches!(k.len(), 1 | 2))
        && n.string("auto_pad", "NOTSET") == "NOTSET"
        && n.int("storage_order", 0) == 0
}

/// A name no value or node of `g` has, from `base`.
fn fresh(taken: &mut HashSet<String>, base: &str) -> String {
    let mut name = base.to_string();
    let mut k = 1;
    while !taken.insert(name.clone()) {
        name = format!("{base}_{k}");
        k += 1;
    }
    name
}

/// NCHW dims to NHWC.
fn nhwc(d: &[Dim]) -> Vec<Dim> {
    vec![d[0].clone(), d[2].clone(), d[3].clone(), d[1].clone()]
}

/// A 1-D window attribute as the 2-D one of height 1: `kernel_shape`, `strides` and
/// `dilations` `[x]` as `[1, x]`, `pads` `[b, e]` as `[0, b, 0, e]`; others as they are.
fn two_d(key: &str, a: &Attr) -> Attr {
    match (key, a) {
        ("kernel_shape" | "strides" | "dilations", Attr::Ints(v)) if v.len() == 1 => Attr::Ints(vec![1, v[0]]),
        ("pads", Attr::Ints(v)) if v.len() == 2 => Attr::Ints(vec![0, v[0], 0, v[1]]),
        _ => a.clone(),
    }
}

fn float(v: f32) -> Attr {
    Attr::Float(v)
}

/// Writes the byte ops and the edges of their regions (see the module doc).
fn rewrite(
    g: &mut Graph,
    r: &HashMap<String, Vec<usize>>,
    quantized: &HashMap<String, Quantized>,
    ops: Vec<(IntOp, String)>,
) {
    let mut taken: HashSet<String> = g.nodes.iter().map(|n| n.name.clone()).collect();
    taken.extend(g.nodes.iter().flat_map(|n| n.outputs.iter().cloned()));
    taken.extend(g.initializers.keys().cloned());
    taken.extend(g.inputs.iter().map(|v| v.name.clone()));
    // Every integer tensor a byte op reads or writes, and its bytes' name.
    let mut bytes: BTreeMap<String, String> = BTreeMap::new();
    let mut read_by_ops: HashSet<usize> = HashSet::new();
    for (op, out) in &ops {
        let ins: Vec<&String> = match op {
            IntOp::Conv { input, conv, act, .. } => {
                read_by_ops.insert(*conv);
                read_by_ops.extend(act.iter().flat_map(|a| a.1.iter().copied()));
                vec![input]
            }
            IntOp::Add { inputs, add, act } => {
                read_by_ops.insert(*add);
                read_by_ops.extend(act.iter().flat_map(|a| a.1.iter().copied()));
                inputs.iter().collect()
            }
            IntOp::MaxPool { input, pool } => {
                read_by_ops.insert(*pool);
                vec![input]
            }
        };
        for v in ins.into_iter().chain([out]) {
            if !bytes.contains_key(v) {
                let name = fresh(&mut taken, &format!("{v}/nhwc"));
                bytes.insert(v.clone(), name);
            }
        }
    }
    let by_output: HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    // A 1-D convolution's s8 weights `[M, C, k]` as 2-D ones, `[M, C, 1, k]`.
    let mut two_d_weights: HashMap<String, String> = HashMap::new();
    for (op, _) in &ops {
        let IntOp::Conv { conv, .. } = op else { continue };
        let Some(dqw) = g.nodes[*conv].input(1).and_then(|w| by_output.get(w)).map(|&k| &g.nodes[k]) else {
            continue;
        };
        let w = &dqw.inputs[0];
        match g.initializers.get(w) {
            Some(t) if t.rank() == 3 && !two_d_weights.contains_key(w) => {
                let s = t.shape();
                let t2 = t.reshaped(&[s[0], s[1], 1, s[2]]);
                let name = fresh(&mut taken, &format!("{w}/2d"));
                two_d_weights.insert(w.clone(), name.clone());
                g.initializers.insert(name, t2);
            }
            _ => {}
        }
    }
    let made_by_op: HashMap<&str, usize> = ops.iter().enumerate().map(|(k, (_, out))| (out.as_str(), k)).collect();
    let q8 = |v: &str| -> (f32, i64) { (quantized[v].scale, quantized[v].zero) };
    // Per node index: what replaces it (None: dropped).
    let mut replace: HashMap<usize, Vec<Node>> = HashMap::new();
    let mut types: Vec<(String, ValueType)> = Vec::new();
    for (v, b) in &bytes {
        let qv = &quantized[v.as_str()];
        types.push((b.clone(), ValueType { dtype: Some(DType::U8), shape: Some(nhwc(&qv.dims)) }));
        let qnode = &g.nodes[qv.node];
        let (scale, zero) = q8(v);
        let mut nodes = Vec::new();
        match made_by_op.get(v.as_str()) {
            Some(&k) => nodes.push(int_node(g, &by_output, &ops[k].0, &bytes, quantized, &two_d_weights, v, b)),
            None => nodes.push(Node {
                name: fresh(&mut taken, &format!("{}/quantize8", qnode.name)),
                op: "Quantize8".into(),
                domain: "aim".into(),
                inputs: vec![qnode.inputs[0].clone()],
                outputs: vec![b.clone()],
                attrs: [
                    ("scale".to_string(), float(scale)),
                    ("zero".to_string(), Attr::Int(zero)),
                    (SOURCES.to_string(), Attr::Strings(sources_of(qnode))),
                ]
                .into_iter()
                .collect(),
            }),
        }
        // Readers of the integer tensor other than its dequantizations with the same
        // parameters read by byte ops alone: they get the bytes back as f32, or (for a
        // reader of the integers themselves) their QuantizeLinear again, exactly.
        let mut integer_readers = false;
        for &k in r.get(v).map(|x| x.as_slice()).unwrap_or(&[]) {
            let d = (k != usize::MAX).then(|| &g.nodes[k]);
            match d {
                Some(d) if d.domain.is_empty() && d.op == "DequantizeLinear" && same_params(g, d, qnode) => {
                    let only_ops = r
                        .get(&d.outputs[0])
                        .is_some_and(|rd| rd.iter().all(|&x| x != usize::MAX && read_by_ops.contains(&x)));
                    let mut dq = Vec::new();
                    if !only_ops {
                        dq.push(dequantize8(&mut taken, d, b, (scale, zero, qv.ncw), &d.outputs[0]));
                    }
                    replace.insert(k, dq);
                }
                _ => integer_readers = true,
            }
        }
        if integer_readers {
            match made_by_op.get(v.as_str()) {
                // The QuantizeLinear's f32 input is gone: quantize the dequantization.
                Some(_) => {
                    let f = fresh(&mut taken, &format!("{v}/dequantized"));
                    nodes.push(dequantize8(&mut taken, qnode, b, (scale, zero, qv.ncw), &f));
                    let mut q = qnode.clone();
                    q.inputs[0] = f.clone();
                    nodes.push(q);
                    let dims = match qv.ncw {
                        true => vec![qv.dims[0].clone(), qv.dims[1].clone(), qv.dims[3].clone()],
                        false => qv.dims.clone(),
                    };
                    types.push((f, ValueType { dtype: Some(DType::F32), shape: Some(dims) }));
                }
                None => nodes.insert(0, qnode.clone()),
            }
        }
        replace.insert(qv.node, nodes);
    }
    // The ops' own nodes (the Conv, Add or MaxPool and an activation) are gone.
    for k in read_by_ops {
        replace.entry(k).or_default();
    }
    let nodes = std::mem::take(&mut g.nodes);
    for (i, n) in nodes.into_iter().enumerate() {
        match replace.remove(&i) {
            Some(new) => g.nodes.extend(new),
            None => g.nodes.push(n),
        }
    }
    g.value_types.extend(types);
}

/// `aim:Dequantize8(bytes) → out`, for the DequantizeLinear or QuantizeLinear `n`: scale,
/// zero point, and whether `out` is 1-D (`ncw`).
fn dequantize8(
    taken: &mut HashSet<String>,
    n: &Node,
    bytes: &str,
    (scale, zero, ncw): (f32, i64, bool),
    out: &str,
) -> Node {
    let mut node = Node {
        name: fresh(taken, &format!("{}/dequantize8", n.name)),
        op: "Dequantize8".into(),
        domain: "aim".into(),
        inputs: vec![bytes.to_string()],
        outputs: vec![out.to_string()],
        attrs: [
            ("scale".to_string(), Attr::Float(scale)),
            ("zero".to_string(), Attr::Int(zero)),
            (SOURCES.to_string(), Attr::Strings(sources_of(n))),
        ]
        .into_iter()
        .collect(),
    };
    if ncw {
        node.attrs.insert("ncw".into(), Attr::Int(1));
    }
    node
}

/// The byte op making `v` (bytes `b`), in place of `v`'s QuantizeLinear (`two_d_weights`:
/// the 2-D copy of each 1-D convolution's weights).
#[allow(clippy::too_many_arguments)]
fn int_node(
    g: &Graph,
    by_output: &HashMap<&str, usize>,
    op: &IntOp,
    bytes: &BTreeMap<String, String>,
    quantized: &HashMap<String, Quantized>,
    two_d_weights: &HashMap<String, String>,
    v: &str,
    b: &str,
) -> Node {
    let qv = &quantized[v];
    let qnode = &g.nodes[qv.node];
    let mut attrs: BTreeMap<String, Attr> = BTreeMap::new();
    attrs.insert("y_scale".into(), float(qv.scale));
    attrs.insert("y_zero".into(), Attr::Int(qv.zero));
    let mut sources = Vec::new();
    let set_act = |attrs: &mut BTreeMap<String, Attr>, sources: &mut Vec<String>, act: &Act| {
        if let Some((a, taken)) = act {
            let mut f = g.nodes[taken[0]].clone();
            f.attrs.clear();
            super::fuse::set_activation(&mut f, *a);
            attrs.extend(f.attrs);
            for &k in taken {
                sources.extend(sources_of(&g.nodes[k]));
            }
        }
    };
    let input_attrs = |attrs: &mut BTreeMap<String, Attr>, prefix: &str, v: &str| {
        attrs.insert(format!("{prefix}_scale"), float(quantized[v].scale));
        attrs.insert(format!("{prefix}_zero"), Attr::Int(quantized[v].zero));
    };
    let (name, op_name, inputs) = match op {
        IntOp::Conv { conv, input, act, depthwise } => {
            let n = &g.nodes[*conv];
            let producer = |v: Option<&str>| v.and_then(|v| by_output.get(v)).map(|&k| &g.nodes[k]);
            let dqw = producer(n.input(1)).expect("the weights' dequantization was checked");
            input_attrs(&mut attrs, "x", input);
            for k in ["strides", "pads", "dilations", "group", "kernel_shape"] {
                if let Some(a) = n.attrs.get(k) {
                    attrs.insert(k.into(), two_d(k, a));
                }
            }
            if *depthwise {
                attrs.insert("depthwise".into(), Attr::Int(1));
            }
            sources.extend(producer(n.input(0)).map(sources_of).unwrap_or_default());
            sources.extend(sources_of(dqw));
            // A dequantized int32 bias folds into the epilogue's constants.
            if let Some(d) = producer(n.input(2)).filter(|d| d.domain.is_empty() && d.op == "DequantizeLinear") {
                sources.extend(sources_of(d));
            }
            sources.extend(sources_of(n));
            set_act(&mut attrs, &mut sources, act);
            let w = &dqw.inputs[0];
            let ins = vec![
                bytes[input].clone(),
                two_d_weights.get(w).unwrap_or(w).clone(),
                dqw.inputs[1].clone(),
                n.input(2).unwrap_or("").to_string(),
            ];
            (n.name.clone(), "Conv8", ins)
        }
        IntOp::Add { add, inputs, act } => {
            let n = &g.nodes[*add];
            input_attrs(&mut attrs, "a", &inputs[0]);
            input_attrs(&mut attrs, "b", &inputs[1]);
            for x in &n.inputs {
                if let Some(&d) = by_output.get(x.as_str()) {
                    sources.extend(sources_of(&g.nodes[d]));
                }
            }
            sources.extend(sources_of(n));
            set_act(&mut attrs, &mut sources, act);
            (n.name.clone(), "Add8", vec![bytes[&inputs[0]].clone(), bytes[&inputs[1]].clone()])
        }
        IntOp::MaxPool { pool, input } => {
            let n = &g.nodes[*pool];
            for (k, a) in &n.attrs {
                if k != SOURCES {
                    attrs.insert(k.clone(), two_d(k, a));
                }
            }
            attrs.remove("y_scale");
            attrs.remove("y_zero");
            if let Some(&d) = n.input(0).and_then(|x| by_output.get(x)) {
                sources.extend(sources_of(&g.nodes[d]));
            }
            sources.extend(sources_of(n));
            (n.name.clone(), "MaxPool8", vec![bytes[input].clone()])
        }
    };
    sources.extend(sources_of(qnode));
    attrs.insert(SOURCES.into(), Attr::Strings(sources));
    let mut node = Node {
        name: format!("{name}/{}", op_name.to_lowercase()),
        op: op_name.into(),
        domain: "aim".into(),
        inputs,
        outputs: vec![b.to_string()],
        attrs,
    };
    // The pool's own attributes came over whole: any the model added beyond ONNX's go.
    if matches!(op, IntOp::MaxPool { .. }) {
        aim_ir::schema::retain_known_attrs(&mut node);
    }
    node
}

/// Fuses each `aim:Add8` into the `aim:Conv8` making one of its operands, where that
/// operand has no other reader: the convolution adds the other operand in its epilogue.
fn fuse_residuals(g: &mut Graph) {
    let r = readers(g);
    let by_output: HashMap<String, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i))).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut moves: Vec<(usize, usize, usize)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !(n.domain == "aim" && n.op == "Add8") {
            continue;
        }
        // The operand made last (the branch that just ended), if a convolution alone reads it.
        let conv_of = |k: usize| -> Option<usize> {
            let p = *by_output.get(&n.inputs[k])?;
            let c = &g.nodes[p];
            let alone = r.get(&n.inputs[k]).is_some_and(|rd| rd.as_slice() == [i]);
            (c.domain == "aim" && c.op == "Conv8" && c.input(4).is_none() && alone && !removed[p]).then_some(p)
        };
        let pick = match (conv_of(0), conv_of(1)) {
            (Some(a), Some(b)) => Some(if a > b { (a, 0) } else { (b, 1) }),
            (Some(a), None) => Some((a, 0)),
            (None, Some(b)) => Some((b, 1)),
            (None, None) => None,
        };
        if let Some((p, k)) = pick {
            moves.push((p, i, k));
            removed[p] = true;
        }
    }
    if moves.is_empty() {
        return;
    }
    for (p, i, k) in moves {
        let add = g.nodes[i].clone();
        let mut conv = g.nodes[p].clone();
        let other = 1 - k;
        let (mid, res) = (["a", "b"][k], ["a", "b"][other]);
        let get = |n: &Node, key: &str| n.attrs.get(key).cloned();
        // The convolution's own output quantization becomes the pre-addition one.
        for (from, to) in [("y_scale", "mid_scale"), ("y_zero", "mid_zero")] {
            if let Some(a) = get(&conv, from) {
                conv.attrs.insert(to.into(), a);
            }
        }
        debug_assert_eq!(get(&conv, "mid_scale"), get(&add, &format!("{mid}_scale")));
        for (from, to) in [(format!("{res}_scale"), "res_scale"), (format!("{res}_zero"), "res_zero")] {
            if let Some(a) = get(&add, &from) {
                conv.attrs.insert(to.into(), a);
            }
        }
        for key in ["y_scale", "y_zero"] {
            if let Some(a) = get(&add, key) {
                conv.attrs.insert(key.into(), a);
            }
        }
        for key in [
            super::fuse::ACTIVATION,
            super::fuse::ACT_ALPHA,
            super::fuse::ACT_BETA,
            super::fuse::CLIP_MIN,
            super::fuse::CLIP_MAX,
        ] {
            if let Some(a) = get(&add, key) {
                conv.attrs.insert(format!("res_{key}"), a);
            }
        }
        let mut sources = sources_of(&conv);
        sources.extend(sources_of(&add));
        conv.attrs.insert(SOURCES.into(), Attr::Strings(sources));
        while conv.inputs.len() < 4 {
            conv.inputs.push(String::new());
        }
        conv.inputs.truncate(4);
        conv.inputs.push(add.inputs[other].clone());
        conv.outputs = add.outputs.clone();
        conv.name = format!("{}+add", conv.name);
        g.nodes[i] = conv;
    }
    super::uses::remove_marked(g, &removed);
}

/// A GlobalAveragePool that alone reads an `aim:Dequantize8` averages the bytes themselves:
/// `aim:GlobalAveragePool8` (bytes NHWC in, the f32 NCHW means out: exact integer sums,
/// then dequantized), one pass where the dequantization and the pool were two.
fn fuse_global_pools(g: &mut Graph) {
    let r = readers(g);
    let by_output: HashMap<String, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i))).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut fused: Vec<(usize, Node)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !(n.domain.is_empty() && n.op == "GlobalAveragePool") {
            continue;
        }
        let Some(&d) = n.input(0).and_then(|x| by_output.get(x)) else { continue };
        let dq = &g.nodes[d];
        let alone = r.get(&dq.outputs[0]).is_some_and(|rd| rd.as_slice() == [i]);
        if !(dq.domain == "aim" && dq.op == "Dequantize8" && alone) || dq.int("ncw", 0) != 0 {
            continue;
        }
        let mut node = dq.clone();
        node.name = format!("{}/globalaveragepool8", n.name);
        node.op = "GlobalAveragePool8".into();
        node.outputs = n.outputs.clone();
        let mut sources = sources_of(dq);
        sources.extend(sources_of(n));
        node.attrs.insert(SOURCES.into(), Attr::Strings(sources));
        removed[d] = true;
        fused.push((i, node));
    }
    for (i, node) in fused {
        g.nodes[i] = node;
    }
    super::uses::remove_marked(g, &removed);
}
