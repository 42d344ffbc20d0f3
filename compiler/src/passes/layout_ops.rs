//! Which ops keep the blocked layout NCHWc, so that a network stays blocked between its
//! convolutions instead of going back to NCHW around every elementwise op, concat, resize
//! or pool (the reorders cost as much as a small convolution each).
//!
//! Most of them run unchanged on the 5-D blocked tensor `[N, C/L, H, W, L]`: a pointwise op
//! is pointwise in any layout; a per-channel operand (`[1, C, 1, 1]`, an SE gate) becomes
//! `[1, C/L, 1, 1, L]` and broadcasts the same way; a channel Concat of inputs whose
//! channel counts fill whole blocks is a Concat of blocks along axis 1 (and a Split, the
//! inverse); a spatial Resize scales axes 2 and 3 of the blocked tensor. The padding lanes
//! of a block (channels past C) hold zeros from the convolutions; ops that would turn
//! zeros into inf or NaN there (a division, a logarithm) stay blocked only when C fills
//! whole blocks, since the next convolution multiplies those lanes by zero weights.

use super::layout::{State, BLOCK, CHANNELS, LAYOUT};
use aim_ir::{Attr, DType, Dim, Graph, Node, Tensor};

/// Ops that map zero to a finite value and finite values to finite values: safe on padding
/// lanes.
const SAFE_POINTWISE: &[&str] = &[
    "Relu",
    "Sigmoid",
    "Tanh",
    "HardSwish",
    "HardSigmoid",
    "LeakyRelu",
    "Elu",
    "Gelu",
    "Erf",
    "Neg",
    "Abs",
    "Identity",
    "Softsign",
    "Selu",
    "Celu",
    "Mish",
];

/// Binary ops safe on padding lanes (of zeros, or of a per-channel operand's zeros).
const SAFE_BINARY: &[&str] = &["Add", "Sub", "Mul", "Max", "Min"];

/// Elementwise program instructions that could make inf or NaN of padding zeros.
const UNSAFE_INSTS: &[&str] = &["div", "recip", "sqrt", "exp"];

/// Whether an elementwise program instruction keeps padding lanes finite: none of
/// [`UNSAFE_INSTS`], except a division by a nonzero constant (`div 3 c6.0`, a HardSwish's
/// `/ 6`).
fn safe_on_padding(inst: &str) -> bool {
    let mut words = inst.split_whitespace();
    match words.next() {
        Some("div") => words
            .last()
            .and_then(|d| d.strip_prefix('c'))
            .and_then(|c| c.parse::<f32>().ok())
            .is_some_and(|c| c != 0.0 && c.is_finite()),
        Some(op) => !UNSAFE_INSTS.contains(&op),
        None => true,
    }
}

/// Keeps `n` (which reads a blocked value) in the blocked layout when it can run there:
/// rewrites its inputs and outputs and returns true. Otherwise leaves it alone (its inputs
/// then come back to NCHW through `aim:FromBlocked`).
pub(super) fn propagate(g: &mut Graph, st: &mut State, n: &mut Node, out: &mut Vec<Node>) -> bool {
    let Some(xb) = n.inputs.iter().find_map(|x| st.blocked.get(x)).cloned() else { return false };
    let lanes = st.lanes;
    let Some((c, shape)) = nchw(g, &n.outputs[0]) else { return pooling(g, st, n, &xb) };
    let whole = c.is_multiple_of(lanes);
    let op = n.op.as_str();
    if n.domain == "aim" && op == "Elementwise" {
        let safe = whole || n.strings("program").is_some_and(|p| p.iter().all(|i| safe_on_padding(i)));
        if !safe || !n.inputs.iter().all(|x| nchw(g, x).is_some_and(|(_, s)| s == shape)) {
            return false;
        }
        block_inputs(g, st, n, out, &(0..n.inputs.len()).collect::<Vec<_>>());
        st.block_output(g, n, 0, c);
        return true;
    }
    if !n.domain.is_empty() {
        return pooling(g, st, n, &xb);
    }
    match op {
        _ if SAFE_POINTWISE.contains(&op) || (whole && matches!(op, "Exp" | "Sqrt" | "Reciprocal" | "Log")) => {
            if n.inputs.len() != 1 || n.outputs.len() != 1 {
                return false;
            }
            block_inputs(g, st, n, out, &[0]);
            st.block_output(g, n, 0, c);
            true
        }
        "Clip" if n.input(1).is_none_or(|v| is_scalar(g, v)) && n.input(2).is_none_or(|v| is_scalar(g, v)) => {
            block_inputs(g, st, n, out, &[0]);
            st.block_output(g, n, 0, c);
            true
        }
        _ if SAFE_BINARY.contains(&op) || (op == "Div" && (whole || nonzero_constant(g, n.input(1)))) => {
            binary(g, st, n, out, c, &shape)
        }
        "Concat" => concat(g, st, n, out, &shape),
        "Split" => split(g, st, n, out),
        "Resize" => resize(g, st, n, out, c),
        _ => pooling(g, st, n, &xb),
    }
}

/// The channel count and shape of a 4-D f32 value whose channel count is known.
fn nchw(g: &Graph, v: &str) -> Option<(usize, Vec<Dim>)> {
    let t = g.value_type(v)?;
    let s = t.shape.filter(|s| s.len() == 4 && t.dtype == Some(DType::F32))?;
    Some((s[1].known()?, s))
}

/// Whether `v` is a constant without zeros: dividing the padding lanes' zeros by it keeps
/// them zero (a HardSwish written as `x · Clip(x + 3, 0, 6) / 6`, over any channel count).
fn nonzero_constant(g: &Graph, v: Option<&str>) -> bool {
    v.and_then(|v| g.initializers.get(v))
        .is_some_and(|t| t.dtype() == DType::F32 && t.data::<f32>().iter().all(|&x| x != 0.0))
}

fn is_scalar(g: &Graph, v: &str) -> bool {
    g.initializers.get(v).is_some_and(|t| t.len() == 1)
        || g.value_type(v).and_then(|t| t.concrete_shape()).is_some_and(|s| s.iter().product::<usize>() == 1)
}

/// Rewrites inputs `which` of `n` to their blocked names.
fn block_inputs(g: &mut Graph, st: &mut State, n: &mut Node, out: &mut Vec<Node>, which: &[usize]) {
    let reader = n.clone();
    for &k in which {
        let x = n.inputs[k].clone();
        n.inputs[k] = st.blocked_name(g, &reader, &x, out);
    }
}

/// A binary op: operands of the output's shape go blocked, per-channel ones (`[N|1, C, 1, 1]`
/// or `[C, 1, 1]`) become blocked vectors, scalars stay.
fn binary(g: &mut Graph, st: &mut State, n: &mut Node, out: &mut Vec<Node>, c: usize, shape: &[Dim]) -> bool {
    if n.inputs.len() != 2 {
        return false;
    }
    enum Plan {
        Same,
        Channel,
        ChannelConst(Tensor),
        Scalar,
    }
    let lanes = st.lanes;
    let mut plans = Vec::new();
    for x in &n.inputs {
        // An operand of the output's shape goes blocked even when that shape has one element
        // (a 1×1×1×1 map): as a scalar it would stay NCHW under a blocked output.
        let same = !g.initializers.contains_key(x) && g.value_type(x).and_then(|t| t.shape).is_some_and(|s| s == shape);
        if !same && is_scalar(g, x) {
            plans.push(Plan::Scalar);
            continue;
        }
        if let Some(t) = g.initializers.get(x) {
            // A constant per-channel vector: its blocked form, padding lanes 0 (1 for Div).
            let s = t.shape();
            let per_channel = t.dtype() == DType::F32
                && t.len() == c
                && ((s.len() == 3 && s[1] == 1 && s[2] == 1) || (s.len() == 4 && s[0] == 1 && s[2] == 1 && s[3] == 1));
            if !per_channel {
                return false;
            }
            let pad = if n.op == "Div" { 1.0 } else { 0.0 };
            let mut v = vec![pad; c.div_ceil(lanes) * lanes];
            v[..c].copy_from_slice(t.data::<f32>());
            plans.push(Plan::ChannelConst(Tensor::from_vec(&[1, c.div_ceil(lanes), 1, 1, lanes], v)));
            continue;
        }
        match g.value_type(x).and_then(|t| t.shape) {
            Some(s) if s == shape => plans.push(Plan::Same),
            Some(s) if s.len() == 4 && s[1] == Dim::Known(c) && s[2] == Dim::Known(1) && s[3] == Dim::Known(1) => {
                plans.push(Plan::Channel)
            }
            _ => return false,
        }
    }
    // The output is blocked only through an operand of its shape.
    if !plans.iter().any(|p| matches!(p, Plan::Same)) {
        return false;
    }
    for (k, p) in plans.into_iter().enumerate() {
        match p {
            Plan::Same | Plan::Channel => block_inputs(g, st, n, out, &[k]),
            Plan::ChannelConst(t) => {
                let name = st.fresh(g, &format!("{}.nchwc", n.inputs[k]));
                g.initializers.insert(name.clone(), t);
                n.inputs[k] = name;
            }
            Plan::Scalar => {}
        }
    }
    st.block_output(g, n, 0, c);
    true
}

/// A channel Concat: a Concat of blocks when every input but the last fills whole blocks.
fn concat(g: &mut Graph, st: &mut State, n: &mut Node, out: &mut Vec<Node>, shape: &[Dim]) -> bool {
    let axis = n.int("axis", 0);
    if axis != 1 && axis != -3 {
        return false;
    }
    let mut channels = Vec::new();
    for x in &n.inputs {
        match nchw(g, x) {
            Some((c, s)) if s[0] == shape[0] && s[2] == shape[2] && s[3] == shape[3] => channels.push(c),
            _ => return false,
        }
    }
    let lanes = st.lanes;
    if channels[..channels.len() - 1].iter().any(|c| !c.is_multiple_of(lanes)) {
        return false;
    }
    block_inputs(g, st, n, out, &(0..n.inputs.len()).collect::<Vec<_>>());
    n.attrs.insert("axis".into(), Attr::Int(1));
    st.block_output(g, n, 0, channels.iter().sum());
    true
}

/// A channel Split into parts that fill whole blocks (all but the last): a Split of blocks
/// along axis 1, its sizes counted in blocks.
fn split(g: &mut Graph, st: &mut State, n: &mut Node, out: &mut Vec<Node>) -> bool {
    let axis = n.int("axis", 0);
    if axis != 1 && axis != -3 {
        return false;
    }
    let lanes = st.lanes;
    let parts: Option<Vec<usize>> = n.outputs.iter().map(|o| nchw(g, o).map(|(c, _)| c)).collect();
    let Some(parts) = parts else { return false };
    if parts[..parts.len() - 1].iter().any(|c| !c.is_multiple_of(lanes)) {
        return false;
    }
    let blocks: Vec<i64> = parts.iter().map(|c| c.div_ceil(lanes) as i64).collect();
    let name = st.fresh(g, &format!("{}.split_blocks", n.name));
    g.initializers.insert(name.clone(), Tensor::from_i64(&[blocks.len()], blocks));
    n.inputs.resize(2, String::new());
    n.inputs[1] = name;
    n.attrs.remove("num_outputs");
    n.attrs.insert("axis".into(), Attr::Int(1));
    block_inputs(g, st, n, out, &[0]);
    for (k, c) in parts.into_iter().enumerate() {
        st.block_output(g, n, k, c);
    }
    true
}

/// A spatial Resize (scales or sizes change only H and W): the same Resize over axes 2 and
/// 3 of the blocked tensor.
fn resize(g: &mut Graph, st: &mut State, n: &mut Node, out: &mut Vec<Node>, c: usize) -> bool {
    if n.ints("axes").is_some() || n.input(1).is_some_and(|r| g.initializers.get(r).is_none_or(|t| !t.is_empty())) {
        return false;
    }
    let lanes = st.lanes;
    let scales = n.input(2).and_then(|s| g.initializers.get(s)).filter(|t| !t.is_empty()).map(|t| t.to_f64_vec());
    let sizes = n.input(3).and_then(|s| g.initializers.get(s)).filter(|t| !t.is_empty()).map(|t| t.to_i64_vec());
    let (k, t) = match (scales, sizes) {
        (Some(s), None) if s.len() == 4 && s[0] == 1.0 && s[1] == 1.0 => {
            (2, Tensor::from_vec(&[5], vec![1.0f32, 1.0, s[2] as f32, s[3] as f32, 1.0]))
        }
        (None, Some(z)) if z.len() == 4 => {
            let Some((_, x)) = nchw(g, &n.inputs[0]) else { return false };
            if x[0].known() != Some(z[0] as usize) || z[1] != c as i64 {
                return false;
            }
            (3, Tensor::from_i64(&[5], vec![z[0], c.div_ceil(lanes) as i64, z[2], z[3], lanes as i64]))
        }
        _ => return false,
    };
    if n.inputs.get(1).is_some_and(|r| !r.is_empty()) {
        n.inputs[1] = String::new();
    }
    let name = st.fresh(g, &format!("{}.nchwc", n.inputs[k]));
    g.initializers.insert(name.clone(), t);
    n.inputs[k] = name;
    block_inputs(g, st, n, out, &[0]);
    st.block_output(g, n, 0, c);
    true
}

/// MaxPool and AveragePool of a blocked value stay blocked; GlobalAveragePool of one reads
/// it blocked and writes NCHW.
fn pooling(g: &mut Graph, st: &mut State, n: &mut Node, xb: &str) -> bool {
    if n.inputs.first().and_then(|x| st.blocked.get(x)).map(String::as_str) != Some(xb) {
        return false;
    }
    let c = st.channels[xb];
    if super::layout::poolable(n) {
        n.domain = "aim".into();
        aim_ir::schema::retain_known_attrs(n);
        n.inputs[0] = xb.to_string();
        st.block_output(g, n, 0, c);
        true
    } else if n.op == "GlobalAveragePool" && n.domain.is_empty() {
        n.domain = "aim".into();
        aim_ir::schema::retain_known_attrs(n);
        n.inputs[0] = xb.to_string();
        n.attrs.insert(LAYOUT.into(), Attr::String("NCHWc".into()));
        n.attrs.insert(BLOCK.into(), Attr::Int(st.lanes as i64));
        n.attrs.insert(CHANNELS.into(), Attr::Int(c as i64));
        true
    } else {
        false
    }
}
