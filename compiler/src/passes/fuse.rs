//! Epilogue fusion: a Conv, Gemm or MatMul with a constant weight absorbs what follows it —
//! a constant bias Add, a residual Add, then an activation (any of the table
//! `aim_kernels::gemm::Activation` holds: Relu, Clip, LeakyRelu, HardSigmoid, HardSwish,
//! Sigmoid, SiLU written as `x · Sigmoid(x)`, Tanh, Gelu, Elu) — into one `aim` domain node,
//! `aim:Conv` or `aim:Dense`, that the CPU backend runs as one GEMM with an epilogue. The
//! fused node lists every ONNX node it came from in its `sources` attribute. A dense layer
//! split along its features then becomes one layer per part (`dense_split`), and a residual
//! added after a Reshape of the layer's output is moved before it first
//! (`reshaped_residual`).

use super::uses::{readers, Chains};
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor};
use aim_kernels::gemm::Activation;
use std::collections::HashMap;

/// Attribute naming the fused activation (`Activation::name`), or absent.
pub const ACTIVATION: &str = "activation";
/// The fused activation's first parameter (LeakyRelu's and Elu's alpha, HardSigmoid's
/// alpha), where it has one; a clip has `clip_min` / `clip_max` instead.
pub const ACT_ALPHA: &str = "act_alpha";
/// The fused activation's second parameter (HardSigmoid's beta).
pub const ACT_BETA: &str = "act_beta";
/// Lower bound of a fused clip.
pub const CLIP_MIN: &str = "clip_min";
/// Upper bound of a fused clip.
pub const CLIP_MAX: &str = "clip_max";
/// Attribute listing the ONNX nodes a node came from.
pub const SOURCES: &str = "sources";
/// On an `aim:Dense`: 1 when its weight is stored transposed, `[N, K]` (a Gemm with
/// `transB`, or a MatMul reading `Transpose(W)` of a constant `W`): the kernel packs it
/// from those bytes, so no transposed copy of the weight is ever made.
pub const TRANS_B: &str = "trans_b";

/// The `[K, N]` dims of an `aim:Dense`'s weight `w`, read through [`TRANS_B`].
pub fn dense_dims(n: &Node, w: &Tensor) -> Option<(usize, usize)> {
    if let Some(s) = super::coded_weights::shape_of(n) {
        return Some((s.k, s.n));
    }
    let [a, b] = w.shape()[..] else { return None };
    Some(if n.int(TRANS_B, 0) != 0 { (b, a) } else { (a, b) })
}

/// The constant 2-D f32 `W` when `name` is computed as `Transpose(W)` (the default or
/// `[1, 0]` permutation): what a MatMul then reads as a transposed weight.
fn transposed_constant(g: &Graph, producers: &HashMap<String, usize>, name: &str) -> Option<String> {
    let t = &g.nodes[*producers.get(name)?];
    let w = g.initializers.get(t.input(0)?)?;
    let perm_ok = t.ints("perm").is_none_or(|p| p == [1, 0]);
    (t.domain.is_empty() && t.op == "Transpose" && perm_ok && w.rank() == 2 && w.dtype() == DType::F32)
        .then(|| t.inputs[0].clone())
}

/// Replaces, front to back, each node `at` for which `fuse(g, at)` gives a fused node by that
/// node, removing the nodes it absorbs (and the types of the values no node computes any
/// more): the driver of the passes that fold a chain into its last node. A fused node may
/// also absorb a node after it and compute that node's outputs in its place.
pub fn fuse_each(g: &mut Graph, fuse: impl Fn(&Graph, &Chains, usize) -> Option<(Node, Vec<usize>)>) {
    let mut chains = Chains::new(g);
    let mut i = 0;
    while i < g.nodes.len() {
        if let Some((node, mut remove)) = fuse(g, &chains, i) {
            let old = std::mem::replace(&mut g.nodes[i], node);
            for o in old.outputs.iter().filter(|o| !g.nodes[i].outputs.contains(o)) {
                g.value_types.remove(o);
            }
            remove.sort_unstable();
            for k in remove.into_iter().rev() {
                for o in g.nodes[k].outputs.clone() {
                    if !g.nodes[i].outputs.contains(&o) {
                        g.value_types.remove(&o);
                    }
                }
                g.nodes.remove(k);
                if k < i {
                    i -= 1;
                }
            }
            chains = Chains::new(g);
        }
        i += 1;
    }
}

/// The ONNX nodes a node stands for: its `sources` attribute, or its own name.
pub fn sources_of(n: &Node) -> Vec<String> {
    n.strings(SOURCES).map(|s| s.to_vec()).unwrap_or_else(|| vec![n.name.clone()])
}

fn scalar(g: &Graph, name: Option<&str>) -> Option<Option<f32>> {
    match name {
        None => Some(None),
        Some(n) => {
            let t = g.initializers.get(n)?;
            (t.len() == 1).then(|| Some(t.to_f64_vec()[0] as f32))
        }
    }
}

/// Turns a Conv/Gemm/MatMul with a constant f32 weight into its `aim` form, or None. A
/// MatMul's weight may also be the transpose of a constant (`producers`: the node computing
/// each value), read in place as a transposed weight.
fn start(g: &Graph, producers: &HashMap<String, usize>, n: &Node) -> Option<Node> {
    // A dense layer with 4-bit weights (`coded_weights`) is already in its `aim` form.
    if n.domain == "aim" && n.op == "Dense" && super::coded_weights::shape_of(n).is_some() {
        return Some(n.clone());
    }
    if n.domain.is_empty() && n.op == "MatMul" && !g.initializers.contains_key(n.input(1)?) {
        let w = transposed_constant(g, producers, n.input(1)?)?;
        let mut f = n.clone();
        f.domain = "aim".into();
        f.op = "Dense".into();
        let mut srcs = sources_of(n);
        srcs.extend(producers.get(n.input(1)?).map(|&t| g.nodes[t].name.clone()));
        f.attrs.insert(SOURCES.into(), Attr::Strings(srcs));
        f.attrs.insert(TRANS_B.into(), Attr::Int(1));
        f.inputs = vec![n.inputs[0].clone(), w, String::new()];
        return Some(f);
    }
    let w = g.initializers.get(n.input(1)?)?;
    if w.dtype() != DType::F32 || !n.domain.is_empty() {
        return None;
    }
    let mut f = n.clone();
    f.domain = "aim".into();
    f.attrs.insert(SOURCES.into(), Attr::Strings(sources_of(n)));
    match n.op.as_str() {
        "Conv" => {
            if n.input(2).is_some_and(|b| !g.initializers.contains_key(b)) {
                return None;
            }
            f.inputs.resize(3, String::new());
            Some(f)
        }
        // 2-D transposed convolutions run as a GEMM and an overlap-add (`aim:ConvTranspose`).
        "ConvTranspose" if w.rank() == 4 && n.input(2).is_none_or(|b| g.initializers.contains_key(b)) => {
            f.inputs.resize(3, String::new());
            Some(f)
        }
        "MatMul" if w.rank() == 2 => {
            f.op = "Dense".into();
            f.inputs = vec![n.inputs[0].clone(), n.inputs[1].clone(), String::new()];
            Some(f)
        }
        "Gemm" if w.rank() == 2 && n.float_attr("alpha") == 1.0 && n.int("transA", 0) == 0 => {
            let c = n.input(2);
            if c.is_some() && (n.float_attr("beta") != 1.0 || !g.initializers.contains_key(c?)) {
                return None;
            }
            let nout = if n.int("transB", 0) != 0 { w.shape()[0] } else { w.shape()[1] };
            let bias = match c {
                Some(c) => {
                    let t = g.initializers.get(c)?;
                    if t.dtype() != DType::F32 || t.len() != nout {
                        return None;
                    }
                    Some(c.to_string())
                }
                None => None,
            };
            if n.int("transB", 0) != 0 {
                f.attrs.insert(TRANS_B.into(), Attr::Int(1));
            }
            f.op = "Dense".into();
            f.inputs = vec![n.inputs[0].clone(), n.inputs[1].clone(), bias.unwrap_or_default()];
            for a in ["alpha", "beta", "transA", "transB"] {
                f.attrs.remove(a);
            }
            Some(f)
        }
        _ => None,
    }
}

/// The activation a single ONNX node computes on its first input (Relu, Clip with constant
/// bounds, LeakyRelu, HardSigmoid, HardSwish, Sigmoid, Tanh, Gelu, Elu), if it is one: what
/// epilogues fuse, and what the cuda lowering runs as an elementwise program.
pub fn node_activation(g: &Graph, m: &Node) -> Option<Activation> {
    let f = |name: &str, d: f32| m.float(name, d);
    Some(match m.op.as_str() {
        "Relu" => Activation::Relu,
        "Clip" => {
            let (lo, hi) = (scalar(g, m.input(1))?, scalar(g, m.input(2))?);
            Activation::Clip(lo.unwrap_or(f32::NEG_INFINITY), hi.unwrap_or(f32::INFINITY))
        }
        "LeakyRelu" => Activation::LeakyRelu(f("alpha", 0.01)),
        "HardSigmoid" => Activation::HardSigmoid(f("alpha", 0.2), f("beta", 0.5)),
        "HardSwish" => Activation::HardSwish,
        "Sigmoid" => Activation::Sigmoid,
        "Tanh" => Activation::Tanh,
        "Gelu" if m.string("approximate", "none") == "tanh" => Activation::GeluTanh,
        "Gelu" => Activation::Gelu,
        "Elu" => Activation::Elu(f("alpha", 1.0)),
        _ => return None,
    })
}

/// The activation node `m` (reading `x`) computes, with the nodes it takes (itself first):
/// one node of the table, or SiLU / HardSwish written out as `x · Sigmoid(x)` /
/// `x · HardSigmoid(x)` (then `m` is the Sigmoid or the Mul, and both are taken).
pub(super) fn activation_at(
    g: &Graph,
    index: &HashMap<String, Vec<usize>>,
    x: &str,
    readers: &[usize],
) -> Option<(Activation, Vec<usize>)> {
    let single = |m: &Node| node_activation(g, m);
    match *readers {
        [k] if k != usize::MAX => {
            let m = &g.nodes[k];
            (m.domain.is_empty() && !m.inputs.is_empty() && m.inputs[0] == x && m.outputs.len() == 1)
                .then(|| single(m))
                .flatten()
                .map(|a| (a, vec![k]))
        }
        [a, b] if a != usize::MAX && b != usize::MAX => {
            if let Some(taken) = hardswish_written_out(g, index, x, a, b) {
                return Some((Activation::HardSwish, taken));
            }
            // x · gate(x): the gate's output read by the Mul alone.
            let (gate, mul) = if g.nodes[a].op == "Mul" { (b, a) } else { (a, b) };
            let (gn, mn) = (&g.nodes[gate], &g.nodes[mul]);
            let gated = gn.domain.is_empty()
                && mn.domain.is_empty()
                && mn.op == "Mul"
                && gn.inputs.len() == 1
                && gn.inputs[0] == x
                && mn.inputs.len() == 2
                && mn.inputs.contains(&x.to_string())
                && mn.inputs.contains(&gn.outputs[0])
                && index.get(&gn.outputs[0]).is_some_and(|r| r.as_slice() == [mul]);
            if !gated || mul < gate {
                return None;
            }
            let act = match single(gn)? {
                Activation::Sigmoid => Activation::Silu,
                Activation::HardSigmoid(a, b) if (a - 1.0 / 6.0).abs() < 1e-7 && b == 0.5 => Activation::HardSwish,
                _ => return None,
            };
            Some((act, vec![gate, mul]))
        }
        _ => None,
    }
}

/// HardSwish as paddle2onnx writes it, `x · Clip(x + 3, 0, 6) / 6` (the `/ 6` a Div or a
/// Mul by 1/6), read from `x` by an Add and a Mul (nodes `a`, `b`, either order): the
/// nodes it takes, in order, each intermediate value read by the next alone.
fn hardswish_written_out(
    g: &Graph,
    index: &HashMap<String, Vec<usize>>,
    x: &str,
    a: usize,
    b: usize,
) -> Option<Vec<usize>> {
    let (add, mul) = if g.nodes[a].op == "Add" { (a, b) } else { (b, a) };
    let only_reader = |v: &str| -> Option<usize> {
        match index.get(v).map(|r| r.as_slice()) {
            Some(&[k]) if k != usize::MAX => Some(k),
            _ => None,
        }
    };
    let plain = |k: usize, op: &str| g.nodes[k].domain.is_empty() && g.nodes[k].op == op;
    let is = |v: Option<Option<f32>>, want: f32| matches!(v, Some(Some(c)) if (c - want).abs() <= 1e-6 * want.abs());
    let other = |k: usize, known: &str| -> Option<&str> {
        let n = &g.nodes[k];
        (n.inputs.len() == 2).then_some(())?;
        if n.inputs[0] == known {
            Some(n.inputs[1].as_str())
        } else if n.inputs[1] == known {
            Some(n.inputs[0].as_str())
        } else {
            None
        }
    };
    if !plain(add, "Add") || !plain(mul, "Mul") || !is(scalar(g, other(add, x)), 3.0) {
        return None;
    }
    let clip = only_reader(&g.nodes[add].outputs[0])?;
    let cn = &g.nodes[clip];
    let bounds_ok =
        cn.input(1).is_some() && scalar(g, cn.input(1)) == Some(Some(0.0)) && is(scalar(g, cn.input(2)), 6.0);
    if !plain(clip, "Clip") || cn.inputs[0] != g.nodes[add].outputs[0] || !bounds_ok {
        return None;
    }
    if only_reader(&cn.outputs[0])? != mul || other(mul, x)? != cn.outputs[0] {
        return None;
    }
    let last = only_reader(&g.nodes[mul].outputs[0])?;
    let scaled = match g.nodes[last].op.as_str() {
        "Div" => g.nodes[last].inputs[0] == g.nodes[mul].outputs[0] && is(scalar(g, g.nodes[last].input(1)), 6.0),
        "Mul" => is(scalar(g, other(last, &g.nodes[mul].outputs[0])), 1.0 / 6.0),
        _ => false,
    };
    let ordered = add < clip && clip < mul && mul < last;
    (scaled && g.nodes[last].domain.is_empty() && ordered).then(|| vec![add, clip, mul, last])
}

/// Scales the output channels of the fused `aim:Conv` / `aim:Dense` `f` (fused from node
/// `name`) by `scale`: new weight and bias constants (the originals may be shared), false
/// when its weights are not a constant f32 tensor of the expected layout.
fn scale_outputs(g: &mut Graph, f: &mut Node, name: &str, scale: &[f32]) -> bool {
    let Some(w) = g.initializers.get(&f.inputs[1]).filter(|w| w.dtype() == DType::F32) else { return false };
    let mut v = w.data::<f32>().to_vec();
    let shape = w.shape().to_vec();
    let ok = match f.op.as_str() {
        // [Cout, ...]: one row of weights per output channel.
        "Conv" if shape.first() == Some(&scale.len()) => {
            let per = v.len() / scale.len().max(1);
            v.chunks_mut(per.max(1)).zip(scale).for_each(|(row, s)| row.iter_mut().for_each(|x| *x *= s));
            true
        }
        "Dense" => match (dense_dims(f, w), shape.as_slice()) {
            // [N, K] stored transposed: a row per output; [K, N]: a column.
            (Some((_, n)), &[rows, k]) if n == scale.len() && f.int(TRANS_B, 0) != 0 && rows == n => {
                v.chunks_mut(k.max(1)).zip(scale).for_each(|(row, s)| row.iter_mut().for_each(|x| *x *= s));
                true
            }
            (Some((_, n)), &[_, cols]) if n == scale.len() && f.int(TRANS_B, 0) == 0 && cols == n => {
                v.chunks_mut(n.max(1)).for_each(|row| row.iter_mut().zip(scale).for_each(|(x, s)| *x *= s));
                true
            }
            _ => false,
        },
        _ => false,
    };
    if !ok {
        return false;
    }
    let wname = format!("{name}::scaled_w");
    g.initializers.insert(wname.clone(), Tensor::from_vec(&shape, v));
    f.inputs[1] = wname;
    if let Some(b) = g.initializers.get(&f.inputs[2]) {
        let scaled: Vec<f32> = b.data::<f32>().iter().zip(scale).map(|(b, s)| b * s).collect();
        let bname = format!("{name}::bias");
        g.initializers.insert(bname.clone(), Tensor::from_vec(&[scaled.len()], scaled));
        f.inputs[2] = bname;
    }
    true
}

/// Records `act` on the fused node `f`.
pub(super) fn set_activation(f: &mut Node, act: Activation) {
    let (name, a, b) = act.name();
    f.attrs.insert(ACTIVATION.into(), Attr::String(name.into()));
    let (ka, kb) = if name == "clip" { (CLIP_MIN, CLIP_MAX) } else { (ACT_ALPHA, ACT_BETA) };
    for (k, v) in [(ka, a), (kb, b)] {
        if let Some(v) = v {
            f.attrs.insert(k.into(), Attr::Float(v));
        }
    }
}

/// Fuses every eligible chain.
///
/// One reader index serves the whole pass: the fused node takes the place of the last node it
/// absorbed and the others become tombstones, removed at the end, so node indices stay valid
/// and the index needs only the fused node's inputs redirected. Linear in the graph size.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    super::reshaped_residual::run(g);
    let mut r = readers(g);
    let mut removed = vec![false; g.nodes.len()];
    let producers: HashMap<String, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i))).collect();
    for i in 0..g.nodes.len() {
        if removed[i] {
            continue;
        }
        let n = g.nodes[i].clone();
        let Some(mut f) = start(g, &producers, &n).map(|mut f| {
            aim_ir::schema::retain_known_attrs(&mut f);
            f
        }) else {
            continue;
        };
        // The output's dims (symbolic ones included: equal names are equal sizes), and the
        // number of channels / features, which the weight tells even when the batch is symbolic.
        let out_ty: Option<Vec<aim_ir::Dim>> = g
            .value_types
            .get(&n.outputs[0])
            .and_then(|t| t.shape.clone())
            .filter(|s| !s.contains(&aim_ir::Dim::Unknown));
        let channels = g.initializers.get(&f.inputs[1]).and_then(|w| match f.op.as_str() {
            "Conv" => Some(w.shape()[0]),
            "ConvTranspose" => Some(w.shape()[1] * f.int("group", 1).max(1) as usize),
            _ => dense_dims(&f, w).map(|(_, n)| n),
        });
        let mut out = n.outputs[0].clone();
        let mut has_residual = false;
        let mut has_act = false;
        let mut absorbed: Vec<usize> = Vec::new();
        loop {
            if !has_act {
                let rs = r.get(&out).map(|v| v.as_slice()).unwrap_or_default();
                if let Some((act, taken)) = activation_at(g, &r, &out, rs).filter(|(_, t)| t.iter().all(|&k| k > i)) {
                    set_activation(&mut f, act);
                    has_act = true;
                    let mut srcs = sources_of(&f);
                    srcs.extend(taken.iter().flat_map(|&k| sources_of(&g.nodes[k])));
                    f.attrs.insert(SOURCES.into(), Attr::Strings(srcs));
                    let last = *taken.iter().max().expect("an activation takes a node");
                    out = g.nodes[last].outputs[0].clone();
                    absorbed.extend(taken);
                    continue;
                }
            }
            let Some(&[next]) = r.get(&out).map(|v| v.as_slice()) else { break };
            if next == usize::MAX || next <= i || absorbed.contains(&next) {
                break;
            }
            let m = g.nodes[next].clone();
            if !m.domain.is_empty() || has_act {
                break;
            }
            // A constant operand of m as one value per output channel (a scalar repeated),
            // if it is a scalar or one value per channel along the channel dim.
            let per_channel = |t: &Tensor| -> Option<Vec<f32>> {
                let c = channels?;
                let r = out_ty.as_ref().map_or(0, |s| s.len());
                let channel_dim = if f.op.starts_with("Conv") { 1 } else { r.saturating_sub(1) };
                if t.dtype() != DType::F32 || t.rank() > r || r == 0 {
                    return None;
                }
                let v = t.data::<f32>();
                if t.len() == 1 {
                    return Some(vec![v[0]; c]);
                }
                let aligned = t.len() == c
                    && (0..r).all(|d| {
                        let td = if d + t.rank() >= r { t.shape()[d + t.rank() - r] } else { 1 };
                        td == if d == channel_dim { c } else { 1 }
                    });
                aligned.then(|| v.to_vec())
            };
            let constant = |m: &Node| -> Option<&Tensor> {
                let other = if m.inputs[0] == out { &m.inputs[1] } else { &m.inputs[0] };
                (other != &out).then(|| g.initializers.get(other)).flatten()
            };
            let plain = f.op == "Conv" || f.op == "Dense";
            let taken = match m.op.as_str() {
                // Before any residual or activation, a constant scale per output channel
                // folds into the weights and bias (PP-LCNet's learnable affine after a
                // convolution: `conv · k + b`).
                "Mul" if m.inputs.len() == 2 && plain && !has_residual => match constant(&m).and_then(&per_channel) {
                    Some(scale) => scale_outputs(g, &mut f, &n.name, &scale),
                    None => false,
                },
                "Add"
                    if m.inputs.len() == 2 && plain && !has_residual && constant(&m).is_some_and(|t| t.len() == 1) =>
                {
                    match constant(&m).and_then(&per_channel) {
                        Some(shift) => {
                            let name = format!("{}::bias", n.name);
                            let old = g.initializers.get(&f.inputs[2]).map(|b| b.data::<f32>().to_vec());
                            let bias: Vec<f32> = match old {
                                Some(b) => b.iter().zip(&shift).map(|(b, s)| b + s).collect(),
                                None => shift,
                            };
                            g.initializers.insert(name.clone(), Tensor::from_vec(&[bias.len()], bias));
                            f.inputs[2] = name;
                            true
                        }
                        None => false,
                    }
                }
                "Add" if m.inputs.len() == 2 => {
                    let other = if m.inputs[0] == out { &m.inputs[1] } else { &m.inputs[0] };
                    if *other == out {
                        break;
                    }
                    let bias_slot_free = f.inputs[2].is_empty();
                    match g.initializers.get(other) {
                        // A constant: a bias if it is one value per output channel/feature,
                        // also after a residual (`(x·W + r) + b`, as ONNX Runtime's
                        // SkipLayerNormalization adds them, becomes `(x·W + b) + r`: one
                        // rounding apart).
                        Some(t) if bias_slot_free && t.dtype() == DType::F32 => {
                            let ch = match (f.op.as_str(), &out_ty) {
                                ("Conv" | "ConvTranspose", Some(s)) if s.len() >= 2 => channels,
                                ("Dense", Some(s)) if !s.is_empty() => channels,
                                _ => None,
                            };
                            // Right-aligned against the output, every dim but the channel's is 1.
                            let r = out_ty.as_ref().map_or(0, |s| s.len());
                            let channel_dim = if f.op.starts_with("Conv") { 1 } else { r.saturating_sub(1) };
                            let shape_ok = ch.is_some_and(|c| {
                                t.rank() <= r
                                    && t.len() == c
                                    && (0..r).all(|d| {
                                        let td = if d + t.rank() >= r { t.shape()[d + t.rank() - r] } else { 1 };
                                        td == if d == channel_dim { c } else { 1 }
                                    })
                            });
                            // A dense layer's output ends in its features whatever its other dims
                            // (known or not): a 1-D bias of one value per feature broadcasts along
                            // them alone.
                            let dense_vector = f.op == "Dense" && t.rank() == 1 && Some(t.len()) == channels;
                            if shape_ok || dense_vector {
                                let name = format!("{}::bias", n.name);
                                g.initializers
                                    .insert(name.clone(), Tensor::from_vec(&[t.len()], t.data::<f32>().to_vec()));
                                f.inputs[2] = name;
                                true
                            } else {
                                false
                            }
                        }
                        None if !has_residual
                            && out_ty.is_some()
                            && g.value_type(other).and_then(|t| t.shape) == out_ty =>
                        {
                            f.inputs.resize(4, String::new());
                            f.inputs[3] = other.clone();
                            has_residual = true;
                            true
                        }
                        _ => false,
                    }
                }
                _ => false,
            };
            if !taken {
                break;
            }
            let mut srcs = sources_of(&f);
            // A node made from the same ONNX node (a Gemm's bias Add) names it once.
            srcs.extend(sources_of(&m).into_iter().filter(|s| !sources_of(&f).contains(s)));
            f.attrs.insert(SOURCES.into(), Attr::Strings(srcs));
            out = m.outputs[0].clone();
            absorbed.push(next);
        }
        f.outputs = vec![out];
        if f.inputs.len() == 4 && f.inputs[3].is_empty() {
            f.inputs.truncate(3);
        }
        // The fused node takes the place of the last node it absorbed: by then its residual
        // (computed on another branch) is defined too.
        let at = absorbed.iter().max().copied().unwrap_or(i);
        let group: Vec<usize> = absorbed.iter().copied().chain([i]).collect();
        let mut read: Vec<&String> = f.inputs.iter().filter(|v| !v.is_empty()).collect();
        read.sort_unstable();
        read.dedup();
        for v in read {
            let rs = r.entry(v.clone()).or_default();
            rs.retain(|x| !group.contains(x));
            rs.push(at);
            rs.sort_unstable();
        }
        g.nodes[at] = f;
        for k in group.into_iter().filter(|&k| k != at) {
            removed[k] = true;
        }
    }
    super::uses::remove_marked(g, &removed);
    super::dense_split::run(g);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::text::parse_graph;

    /// A 1-D bias after a MatMul joins the dense layer even when the output's other dims are
    /// not known (a decoder's `[batch, ?, features]`): it broadcasts along the features alone.
    #[test]
    fn a_vector_bias_joins_a_dense_layer_whatever_its_other_dims() {
        let mut g = parse_graph(
            "graph \"g\" {\n  input %x: f32[?,3]\n  init %w = f32[3,2] [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]\n  init %b = f32[2] [0.5, -0.5]\n  %m = MatMul(%x, %w)  # mm\n  %y = Add(%m, %b)  # bias\n  output %y: f32[?,2]\n}\n",
        )
        .unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        run(&mut g).unwrap();
        let ops: Vec<String> = g.nodes.iter().map(|n| format!("{}:{}", n.domain, n.op)).collect();
        assert_eq!(ops, ["aim:Dense"]);
        assert_eq!(g.initializers[&g.nodes[0].inputs[2]].data::<f32>(), &[0.5, -0.5]);
        assert_eq!(sources_of(&g.nodes[0]), ["mm", "bias"]);
    }
}
