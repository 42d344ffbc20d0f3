//! The `com.microsoft` ops that ONNX Runtime's transformer optimizer and optimum's ORT
//! export write (Attention, MultiHeadAttention, SkipLayerNormalization,
//! EmbedLayerNormalization, Gelu, FastGelu, BiasGelu, FusedConv, FusedMatMul,
//! RotaryEmbedding, GroupQueryAttention, ...), expanded at import into default-domain ops with ONNX Runtime's
//! semantics. Both backends then run them: the reference interpreter with its kernels, the
//! cpu pipeline through its fusions (LayerNormalization, Gelu, the attention softmax, dense
//! layers), so they land on the same fused kernels as the unoptimised model would. Every
//! node of an expansion lists the contrib node in its `sources`.
//!
//! A form this module does not expand (Attention with a past state, packed QKV for
//! MultiHeadAttention, GroupQueryAttention with softcap or a local window, ...) is an import error naming the node and what is
//! missing, never a silent approximation.

use super::ImportError;
use aim_ir::{Attr, DType, Graph, Node, Tensor};
use std::collections::{BTreeMap, HashSet};

/// The domain of ONNX Runtime's contrib ops.
pub const DOMAIN: &str = "com.microsoft";

/// Whether this module expands `op` of [`DOMAIN`].
pub fn expands(op: &str) -> bool {
    super::contrib_quant::expands(op)
        || matches!(
            op,
            "Gelu"
                | "BiasGelu"
                | "FastGelu"
                | "QuickGelu"
                | "FusedMatMul"
                | "FusedConv"
                | "SkipLayerNormalization"
                | "SkipSimplifiedLayerNormalization"
                | "EmbedLayerNormalization"
                | "Attention"
                | "MultiHeadAttention"
                | "RotaryEmbedding"
                | "GroupQueryAttention"
                | "GatherBlockQuantized"
        )
}

/// RMS normalisation as ONNX Runtime registers it in the default domain (opset 1), where
/// onnxruntime-genai's model builder writes it.
const SIMPLIFIED_LN: &str = "SimplifiedLayerNormalization";

/// Replaces every [`DOMAIN`] node of `g` (and the default-domain [`SIMPLIFIED_LN`]) by its expansion, in place (graph order kept).
/// Ops this module does not know stay as they are (the supported-op check reports them).
pub fn expand(g: &mut Graph) -> Result<(), ImportError> {
    let ours = |n: &Node| (n.domain == DOMAIN && expands(&n.op)) || (n.domain.is_empty() && n.op == SIMPLIFIED_LN);
    if !g.nodes.iter().any(ours) {
        return Ok(());
    }
    let mut names: HashSet<String> = g.nodes.iter().map(|n| n.name.clone()).collect();
    names.extend(g.nodes.iter().flat_map(|n| n.outputs.iter().cloned()));
    names.extend(g.initializers.keys().cloned());
    names.extend(g.inputs.iter().map(|v| v.name.clone()));
    let nodes = std::mem::take(&mut g.nodes);
    for n in nodes {
        if !ours(&n) {
            g.nodes.push(n);
            continue;
        }
        let mut e = Emit { g: &mut *g, names: &mut names, src: n.name.clone(), k: 0 };
        match n.op.as_str() {
            "Gelu" => gelu(&mut e, &n, &n.inputs[0], "none"),
            "BiasGelu" => {
                let x = e.op("Add", &[input(&n, 0)?, input(&n, 1)?], vec![]);
                gelu(&mut e, &n, &x, "none")
            }
            "FastGelu" => {
                let x = match n.input(1) {
                    Some(b) => e.op("Add", &[input(&n, 0)?, b], vec![]),
                    None => input(&n, 0)?.to_string(),
                };
                gelu(&mut e, &n, &x, "tanh")
            }
            "QuickGelu" => {
                let x = input(&n, 0)?;
                let alpha = e.scalar(n.float("alpha", 1.702));
                let ax = e.op("Mul", &[x, &alpha], vec![]);
                let s = e.op("Sigmoid", &[&ax], vec![]);
                e.op_to("Mul", &[x, &s], &n.outputs[..1], vec![]);
            }
            "FusedMatMul" => fused_matmul(&mut e, &n)?,
            "FusedConv" => fused_conv(&mut e, &n)?,
            "SkipLayerNormalization" => skip_layer_norm(&mut e, &n, false)?,
            "SkipSimplifiedLayerNormalization" => skip_layer_norm(&mut e, &n, true)?,
            SIMPLIFIED_LN => {
                if output(&n, 1).is_some() {
                    return Err(bad(&n, "the inv_std_var output is not supported"));
                }
                let y = n.outputs.first().cloned().unwrap_or_default();
                rms_norm(&mut e, &n, input(&n, 0)?, input(&n, 1)?, &y, 1e-5)?
            }
            "EmbedLayerNormalization" => embed_layer_norm(&mut e, &n)?,
            "Attention" => attention(&mut e, &n)?,
            "MultiHeadAttention" => multi_head_attention(&mut e, &n)?,
            "RotaryEmbedding" => rotary(&mut e, &n)?,
            "GroupQueryAttention" => group_query_attention(&mut e, &n)?,
            "GatherBlockQuantized" => super::contrib_gather_q::gather_block_quantized(&mut e, &n)?,
            op if super::contrib_quant::expands(op) => super::contrib_quant::expand(&mut e, &n)?,
            _ => unreachable!("expands() lists the ops matched here"),
        }
    }
    Ok(())
}

pub(super) fn bad(n: &Node, reason: impl Into<String>) -> ImportError {
    ImportError::BadNode { node: n.name.clone(), op: format!("{DOMAIN}.{}", n.op), reason: reason.into() }
}

/// Input `i` of `n`, which must be given.
pub(super) fn input(n: &Node, i: usize) -> Result<&str, ImportError> {
    n.input(i).ok_or_else(|| bad(n, format!("input {i} is required")))
}

/// Output `i` of `n` if the model reads it.
fn output(n: &Node, i: usize) -> Option<&str> {
    n.outputs.get(i).map(|s| s.as_str()).filter(|s| !s.is_empty())
}

/// Appends the nodes of one expansion to the graph, with fresh names.
pub(super) struct Emit<'a> {
    g: &'a mut Graph,
    names: &'a mut HashSet<String>,
    /// The contrib node expanded.
    src: String,
    k: usize,
}

impl Emit<'_> {
    pub(super) fn fresh(&mut self, tag: &str) -> String {
        loop {
            let name = format!("{}::{tag}{}", self.src, self.k);
            self.k += 1;
            if self.names.insert(name.clone()) {
                return name;
            }
        }
    }

    /// Adds `op(ins)` with attributes, writing `outs`.
    pub(super) fn op_to(&mut self, op: &str, ins: &[&str], outs: &[String], attrs: Vec<(&str, Attr)>) {
        let name = self.fresh(op);
        let mut a: BTreeMap<String, Attr> = attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        a.insert("sources".into(), Attr::Strings(vec![self.src.clone()]));
        self.g.nodes.push(Node {
            name,
            op: op.into(),
            domain: String::new(),
            inputs: ins.iter().map(|s| s.to_string()).collect(),
            outputs: outs.to_vec(),
            attrs: a,
        });
    }

    /// Adds `op(ins)` with one new output, returned.
    pub(super) fn op(&mut self, op: &str, ins: &[&str], attrs: Vec<(&str, Attr)>) -> String {
        let out = self.fresh(&op.to_lowercase());
        self.op_to(op, ins, std::slice::from_ref(&out), attrs);
        out
    }

    /// The constant `name`, if it is one.
    pub(super) fn constant(&self, name: &str) -> Option<&Tensor> {
        self.g.initializers.get(name)
    }

    /// The constant `name`, or the constant that a Reshape of a constant by a constant
    /// shape made it (as exporters write a table shared in another shape), reshaped by the
    /// Reshape kernel itself.
    pub(super) fn constant_or_reshaped(&self, name: &str) -> Option<Tensor> {
        if let Some(t) = self.constant(name) {
            return Some(t.clone());
        }
        let n = self.g.nodes.iter().rev().find(|n| n.outputs.iter().any(|o| o == name))?;
        if n.op != "Reshape" || !n.domain.is_empty() {
            return None;
        }
        let ins = [Some(self.constant(n.input(0)?)?.clone()), Some(self.constant(n.input(1)?)?.clone())];
        aim_kernels::kernel("Reshape")?(n, &ins).ok()?.into_iter().next()
    }

    pub(super) fn konst(&mut self, t: Tensor) -> String {
        let name = self.fresh("const");
        self.g.initializers.insert(name.clone(), t);
        name
    }

    fn scalar(&mut self, v: f32) -> String {
        self.konst(Tensor::scalar(v))
    }

    fn ints(&mut self, v: &[i64]) -> String {
        self.konst(Tensor::from_i64(&[v.len()], v.to_vec()))
    }

    /// The rank of `name` if known from an initializer, a declared type or inference over
    /// the nodes added so far.
    pub(super) fn rank(&mut self, name: &str) -> Option<usize> {
        let known = |g: &Graph| g.value_type(name).and_then(|t| t.shape).map(|s| s.len());
        if let Some(r) = known(self.g) {
            return Some(r);
        }
        // Inference over the graph so far (errors are the verifier's to report later).
        let _ = aim_ir::infer::infer_types(self.g);
        known(self.g)
    }

    /// Adds `op(ins)` writing several new outputs `outs`.
    pub(super) fn op_multi(&mut self, op: &str, ins: &[&str], outs: &[String]) {
        self.op_to(op, ins, outs, vec![]);
    }

    /// The element count of `name` if its shape is known and static.
    pub(super) fn len(&mut self, name: &str) -> Option<usize> {
        if let Some(t) = self.g.initializers.get(name) {
            return Some(t.len());
        }
        self.g.value_type(name).and_then(|t| t.concrete_shape()).map(|s| s.iter().product())
    }

    /// `x` reshaped to `[d0, d1, heads, -1]` and transposed by `perm`.
    fn heads(&mut self, x: &str, heads: i64, perm: &[i64]) -> String {
        let shape = self.ints(&[0, 0, heads, -1]);
        let r = self.op("Reshape", &[x, &shape], vec![]);
        self.op("Transpose", &[&r], vec![("perm", Attr::Ints(perm.to_vec()))])
    }

    /// Adds dims of size 1 at `axes`.
    fn unsqueeze(&mut self, x: &str, axes: &[i64]) -> String {
        let a = self.ints(axes);
        self.op("Unsqueeze", &[x, &a], vec![])
    }

    /// Dim `axis` of `x` as a 1-element i64 tensor.
    fn dim(&mut self, x: &str, axis: i64) -> String {
        self.op("Shape", &[x], vec![("start", Attr::Int(axis)), ("end", Attr::Int(axis + 1))])
    }
}

fn gelu(e: &mut Emit, n: &Node, x: &str, approximate: &str) {
    e.op_to("Gelu", &[x], &n.outputs[..1], vec![("approximate", Attr::String(approximate.into()))]);
}

/// `Y = alpha · op(A) · op(B)`, op a transpose of the last two dims where asked.
fn fused_matmul(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    if n.int("transBatchA", 0) != 0 || n.int("transBatchB", 0) != 0 {
        return Err(bad(n, "transBatchA / transBatchB are not supported"));
    }
    let mut ab = [input(n, 0)?.to_string(), input(n, 1)?.to_string()];
    for (i, attr) in ["transA", "transB"].into_iter().enumerate() {
        if n.int(attr, 0) == 0 {
            continue;
        }
        let rank = e.rank(&ab[i]).ok_or_else(|| bad(n, format!("{attr}: the rank of input {i} is not known")))?;
        if rank < 2 {
            return Err(bad(n, format!("{attr}: input {i} has rank {rank}, below 2")));
        }
        let mut perm: Vec<i64> = (0..rank as i64).collect();
        perm.swap(rank - 2, rank - 1);
        ab[i] = e.op("Transpose", &[&ab[i]], vec![("perm", Attr::Ints(perm))]);
    }
    let alpha = n.float("alpha", 1.0);
    if alpha == 1.0 {
        e.op_to("MatMul", &[&ab[0], &ab[1]], &n.outputs[..1], vec![]);
    } else {
        let y = e.op("MatMul", &[&ab[0], &ab[1]], vec![]);
        let a = e.scalar(alpha);
        e.op_to("Mul", &[&y, &a], &n.outputs[..1], vec![]);
    }
    Ok(())
}

/// `Y = activation(Conv(X, W, B) + Z)`.
fn fused_conv(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let mut attrs: Vec<(&str, Attr)> = Vec::new();
    for k in ["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"] {
        if let Some(v) = n.attrs.get(k) {
            attrs.push((k, v.clone()));
        }
    }
    let ins: Vec<&str> = n.inputs.iter().take(3).map(|s| s.as_str()).collect();
    let act = n.string("activation", "");
    let params = n.floats("activation_params").unwrap_or_default().to_vec();
    let param = |i: usize, default: f32| params.get(i).copied().unwrap_or(default);
    let y = &n.outputs[..1];
    let mut v = e.op("Conv", &ins, attrs);
    if let Some(z) = n.input(3) {
        v = e.op("Add", &[&v, z], vec![]);
    }
    match act {
        "" | "Identity" => e.op_to("Identity", &[&v], y, vec![]),
        "Relu" | "Tanh" | "Sigmoid" => e.op_to(act, &[&v], y, vec![]),
        "LeakyRelu" => e.op_to("LeakyRelu", &[&v], y, vec![("alpha", Attr::Float(param(0, 0.01)))]),
        "HardSigmoid" => e.op_to(
            "HardSigmoid",
            &[&v],
            y,
            vec![("alpha", Attr::Float(param(0, 0.2))), ("beta", Attr::Float(param(1, 0.5)))],
        ),
        "Clip" => {
            let (lo, hi) = (e.scalar(param(0, f32::MIN)), e.scalar(param(1, f32::MAX)));
            e.op_to("Clip", &[&v, &lo, &hi], y, vec![])
        }
        other => return Err(bad(n, format!("activation '{other}' is not supported"))),
    }
    Ok(())
}

/// `input + skip (+ bias)`, then layer (or RMS) normalisation over the last axis; the
/// outputs: normalised, mean, inverse standard deviation, and the sum.
fn skip_layer_norm(e: &mut Emit, n: &Node, simplified: bool) -> Result<(), ImportError> {
    let mut s = e.op("Add", &[input(n, 0)?, input(n, 1)?], vec![]);
    let bias = if simplified { n.input(3) } else { n.input(4) };
    if let Some(b) = bias {
        s = e.op("Add", &[&s, b], vec![]);
    }
    if let Some(o) = output(n, 3) {
        e.op_to("Identity", &[&s], &[o.to_string()], vec![]);
    }
    let y = n.outputs.first().cloned().unwrap_or_default();
    if simplified {
        if output(n, 1).is_some() || output(n, 2).is_some() {
            return Err(bad(n, "the mean and inverse standard deviation outputs are not supported"));
        }
        // ONNX Runtime's default epsilon for the skip forms.
        return rms_norm(e, n, &s, input(n, 2)?, &y, 1e-12);
    }
    let mut ins = vec![s.as_str(), input(n, 2)?];
    if let Some(b) = n.input(3) {
        ins.push(b);
    }
    let outs: Vec<String> = (0..3).map(|i| output(n, i).unwrap_or_default().to_string()).collect();
    let eps = Attr::Float(n.float("epsilon", 1e-12));
    e.op_to("LayerNormalization", &ins, &outs, vec![("axis", Attr::Int(-1)), ("epsilon", eps)]);
    Ok(())
}

/// `x / sqrt(mean(x²) + ε) · scale` over the axes from `axis` (default the last) on,
/// into `y`; `epsilon` defaults to `eps`.
fn rms_norm(e: &mut Emit, n: &Node, x: &str, scale: &str, y: &str, eps: f32) -> Result<(), ImportError> {
    let axis = n.int("axis", -1);
    let axes: Vec<i64> = if axis == -1 {
        vec![-1]
    } else {
        let rank = e.rank(x).ok_or_else(|| bad(n, "the rank of the input is not known"))? as i64;
        if axis < -rank || axis >= rank {
            return Err(bad(n, format!("axis {axis} is outside the input's {rank} axes")));
        }
        ((axis + rank) % rank..rank).collect()
    };
    let sq = e.op("Mul", &[x, x], vec![]);
    let axes = e.ints(&axes);
    let mean = e.op("ReduceMean", &[&sq, &axes], vec![("keepdims", Attr::Int(1))]);
    let eps = e.scalar(n.float("epsilon", eps));
    let var = e.op("Add", &[&mean, &eps], vec![]);
    let rms = e.op("Sqrt", &[&var], vec![]);
    let normed = e.op("Div", &[x, &rms], vec![]);
    e.op_to("Mul", &[&normed, scale], &[y.to_string()], vec![]);
    Ok(())
}

/// Word + position (+ segment) embeddings, then layer normalisation; the mask index
/// (tokens per sequence, int32) and the embedding sum where asked.
fn embed_layer_norm(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let ins = EmbedInputs {
        tables: [input(n, 2)?.to_string(), input(n, 3)?.to_string(), n.input(4).unwrap_or_default().to_string()],
        gamma: input(n, 5)?.to_string(),
        beta: input(n, 6)?.to_string(),
        mask: n.input(7).map(str::to_string),
        positions: n.input(8).map(str::to_string),
    };
    embed_layer_norm_with(e, n, &ins, &|e, table, ids| Ok(e.op("Gather", &[table, ids], vec![])))
}

/// What `EmbedLayerNormalization` and its quantized form read, by role: the word, position
/// and segment tables (the last "" when absent), gamma and beta, the mask and the position
/// ids.
pub(crate) struct EmbedInputs {
    pub(crate) tables: [String; 3],
    pub(crate) gamma: String,
    pub(crate) beta: String,
    pub(crate) mask: Option<String>,
    pub(crate) positions: Option<String>,
}

/// A row lookup `gather(e, table, ids)` into one of the tables.
pub(crate) type Lookup<'a> = dyn Fn(&mut Emit, &str, &str) -> Result<String, ImportError> + 'a;

/// `EmbedLayerNormalization` of `n` (its ids at inputs 0 and 1, its attributes and outputs)
/// over `ins`, each table's rows read by `gather`.
pub(crate) fn embed_layer_norm_with(
    e: &mut Emit,
    n: &Node,
    ins: &EmbedInputs,
    gather: &Lookup,
) -> Result<(), ImportError> {
    let ids = input(n, 0)?;
    let word = gather(e, &ins.tables[0], ids)?;
    let pos = match ins.positions.as_deref() {
        Some(p) => gather(e, &ins.tables[1], p)?,
        None => {
            // Positions 0..sequence length, broadcast over the batch.
            let len = e.dim(ids, 1);
            let zero = e.konst(Tensor::from_i64(&[], vec![0]));
            let one = e.konst(Tensor::from_i64(&[], vec![1]));
            let axes = e.ints(&[0]);
            let limit = e.op("Squeeze", &[&len, &axes], vec![]);
            let range = e.op("Range", &[&zero, &limit, &one], vec![]);
            gather(e, &ins.tables[1], &range)?
        }
    };
    let mut sum = e.op("Add", &[&word, &pos], vec![]);
    if let (Some(seg_ids), false) = (n.input(1), ins.tables[2].is_empty()) {
        let s = gather(e, &ins.tables[2], seg_ids)?;
        sum = e.op("Add", &[&sum, &s], vec![]);
    }
    let eps = Attr::Float(n.float("epsilon", 1e-12));
    let norm_ins = [sum.as_str(), ins.gamma.as_str(), ins.beta.as_str()];
    e.op_to("LayerNormalization", &norm_ins, &n.outputs[..1], vec![("axis", Attr::Int(-1)), ("epsilon", eps)]);
    if let Some(mi) = output(n, 1) {
        match ins.mask.as_deref() {
            Some(mask) => {
                // Counted in f32 (exact up to 2^24 tokens), where the sum has a fast kernel.
                let axes = e.ints(&[1]);
                let m = e.op("Cast", &[mask], vec![("to", Attr::Int(DType::F32.onnx_code() as i64))]);
                let count = e.op("ReduceSum", &[&m, &axes], vec![("keepdims", Attr::Int(0))]);
                e.op_to("Cast", &[&count], &[mi.to_string()], vec![("to", Attr::Int(DType::I32.onnx_code() as i64))]);
            }
            None => {
                // No mask: ONNX Runtime writes zeros, one per sequence.
                let batch = e.dim(ids, 0);
                let zero = e.konst(Tensor::from_slice::<i32>(&[1], &[0]));
                e.op_to("Expand", &[&zero, &batch], &[mi.to_string()], vec![]);
            }
        }
    }
    if let Some(es) = output(n, 2) {
        e.op_to("Identity", &[&sum], &[es.to_string()], vec![]);
    }
    Ok(())
}

/// The additive mask of ONNX Runtime's attention ops from a mask input of `rank` dims
/// (values: 1 keep, 0 mask; or per-sequence lengths for rank 1), shaped to broadcast
/// against scores `[B, N, S, L]`.
fn additive_mask(e: &mut Emit, n: &Node, mask: &str, filter: f32, keys: &str) -> Result<String, ImportError> {
    let rank = e.rank(mask).ok_or_else(|| bad(n, "the rank of the mask input is not known"))?;
    let f = e.scalar(filter);
    let zero = e.scalar(0.0);
    let keep = match rank {
        1 => {
            // Lengths: key j of sequence b is kept when j < length[b].
            let len = e.dim(keys, 2);
            let axes = e.ints(&[0]);
            let limit = e.op("Squeeze", &[&len, &axes], vec![]);
            let (z, o) = (e.konst(Tensor::from_i64(&[], vec![0])), e.konst(Tensor::from_i64(&[], vec![1])));
            let j = e.op("Range", &[&z, &limit, &o], vec![]);
            let m = e.op("Cast", &[mask], vec![("to", Attr::Int(DType::I64.onnx_code() as i64))]);
            let m = e.unsqueeze(&m, &[1]);
            let keep = e.op("Less", &[&j, &m], vec![]);
            e.unsqueeze(&keep, &[1, 2])
        }
        2 | 3 => {
            // ONNX Runtime keeps keys whose mask value is positive.
            let zero_i = e.konst(Tensor::from_i64(&[], vec![0]));
            let m = e.op("Cast", &[mask], vec![("to", Attr::Int(DType::I64.onnx_code() as i64))]);
            let keep = e.op("Greater", &[&m, &zero_i], vec![]);
            e.unsqueeze(&keep, if rank == 2 { &[1, 2] } else { &[1] })
        }
        r => return Err(bad(n, format!("a mask of rank {r} is not supported (1, 2 or 3)"))),
    };
    Ok(e.op("Where", &[&keep, &zero, &f], vec![]))
}

/// The causal mask `[S, L]`: query i (at position L − S + i) sees keys up to its position.
fn causal_mask(e: &mut Emit, q: &str, k: &str, filter: f32) -> String {
    let (s, l) = (e.dim(q, 2), e.dim(k, 2));
    let axes = e.ints(&[0]);
    let (s, l) = (e.op("Squeeze", &[&s, &axes], vec![]), e.op("Squeeze", &[&l, &axes], vec![]));
    let (z, o) = (e.konst(Tensor::from_i64(&[], vec![0])), e.konst(Tensor::from_i64(&[], vec![1])));
    let i = e.op("Range", &[&z, &s, &o], vec![]);
    let past = e.op("Sub", &[&l, &s], vec![]);
    let pos = e.op("Add", &[&i, &past], vec![]);
    let pos = e.unsqueeze(&pos, &[1]);
    let j = e.op("Range", &[&z, &l, &o], vec![]);
    let future = e.op("Greater", &[&j, &pos], vec![]);
    let (f, zero) = (e.scalar(filter), e.scalar(0.0));
    e.op("Where", &[&future, &f, &zero], vec![])
}

/// The additive masks of an attention node: from its mask input (see [`additive_mask`]),
/// the causal mask when `unidirectional`, and its attention bias input.
fn masks(
    e: &mut Emit,
    n: &Node,
    mask: Option<&str>,
    bias: Option<&str>,
    q: &str,
    k: &str,
) -> Result<Vec<String>, ImportError> {
    let filter = n.float("mask_filter_value", -10000.0);
    let mut masks = Vec::new();
    if let Some(m) = mask {
        masks.push(additive_mask(e, n, m, filter, k)?);
    }
    if n.int("unidirectional", 0) != 0 {
        masks.push(causal_mask(e, q, k, filter));
    }
    masks.extend(bias.map(str::to_string));
    Ok(masks)
}

/// Scaled dot-product attention of `q` `[B, N, S, H]`, `k` `[B, N, L, H]`, `v`
/// `[B, N, L, Hv]` with additive masks, the scores multiplied by the scalar `scale`, into
/// `[B, S, N·Hv]` written to `y`.
fn sdpa(e: &mut Emit, q: &str, k: &str, v: &str, masks: &[String], scale: &str, y: &str) {
    let kt = e.op("Transpose", &[k], vec![("perm", Attr::Ints(vec![0, 1, 3, 2]))]);
    let qk = e.op("MatMul", &[q, &kt], vec![]);
    let mut scores = e.op("Mul", &[&qk, scale], vec![]);
    for m in masks {
        scores = e.op("Add", &[&scores, m], vec![]);
    }
    let p = e.op("Softmax", &[&scores], vec![("axis", Attr::Int(-1))]);
    let o = e.op("MatMul", &[&p, v], vec![]);
    let t = e.op("Transpose", &[&o], vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))]);
    let shape = e.ints(&[0, 0, -1]);
    e.op_to("Reshape", &[&t, &shape], &[y.to_string()], vec![]);
}

/// The scale of the scores: the `scale` attribute, else 1/√(head size) with the head size
/// from a weight of `width` columns split over `heads`.
fn score_scale(n: &Node, width: usize, heads: usize) -> f32 {
    let s = n.float("scale", 0.0);
    if s != 0.0 {
        s
    } else {
        1.0 / ((width / heads) as f32).sqrt()
    }
}

/// `Attention`: one packed QKV projection, heads, mask, softmax, output `[B, S, D]`.
fn attention(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    for (i, what) in [(4, "past"), (6, "past_sequence_length")] {
        if n.input(i).is_some() {
            return Err(bad(n, format!("the {what} input is not supported")));
        }
    }
    let w = input(n, 1)?;
    let width = match e.g.initializers.get(w).map(|t| t.shape().to_vec()) {
        Some(s) if s.len() == 2 => s[1],
        _ => return Err(bad(n, "the weights must be a constant [hidden, 3·hidden] matrix")),
    };
    let parts =
        AttentionInputs { x: input(n, 0)?, w, width, bias: n.input(2), mask: n.input(3), bias_scores: n.input(5) };
    attention_with(e, n, &parts)
}

/// What an `Attention` (or its quantized form) reads, by role: the input, the packed QKV
/// weight of `width` columns, its bias, the mask index and an additive bias of the scores.
pub(crate) struct AttentionInputs<'a> {
    pub(crate) x: &'a str,
    pub(crate) w: &'a str,
    pub(crate) width: usize,
    pub(crate) bias: Option<&'a str>,
    pub(crate) mask: Option<&'a str>,
    pub(crate) bias_scores: Option<&'a str>,
}

/// `Attention` of `n` (its attributes and output) over `ins`.
pub(crate) fn attention_with(e: &mut Emit, n: &Node, ins: &AttentionInputs) -> Result<(), ImportError> {
    if output(n, 1).is_some() {
        return Err(bad(n, "the present output is not supported"));
    }
    if n.int("do_rotary", 0) != 0 {
        return Err(bad(n, "do_rotary is not supported"));
    }
    let heads = n.int("num_heads", 0);
    if heads <= 0 {
        return Err(bad(n, "num_heads must be positive"));
    }
    let width = ins.width;
    let sizes: Vec<i64> = match n.ints("qkv_hidden_sizes") {
        Some(s) if s.len() == 3 && s.iter().all(|&v| v > 0) && s.iter().sum::<i64>() == width as i64 => s.to_vec(),
        Some(s) => return Err(bad(n, format!("qkv_hidden_sizes {s:?} do not split {width} columns"))),
        None if width.is_multiple_of(3) => vec![width as i64 / 3; 3],
        None => return Err(bad(n, format!("{width} weight columns do not split in three"))),
    };
    if sizes[0] != sizes[1] || sizes[0] % heads != 0 || sizes[2] % heads != 0 {
        return Err(bad(n, format!("qkv_hidden_sizes {sizes:?} do not split over {heads} heads")));
    }
    let mut qkv = e.op("MatMul", &[ins.x, ins.w], vec![]);
    if let Some(b) = ins.bias {
        qkv = e.op("Add", &[&qkv, b], vec![]);
    }
    let split = e.ints(&sizes);
    let parts: Vec<String> = (0..3).map(|i| e.fresh(["q", "k", "v"][i])).collect();
    e.op_to("Split", &[&qkv, &split], &parts, vec![("axis", Attr::Int(-1))]);
    let q = e.heads(&parts[0], heads, &[0, 2, 1, 3]);
    let k = e.heads(&parts[1], heads, &[0, 2, 1, 3]);
    let v = e.heads(&parts[2], heads, &[0, 2, 1, 3]);
    let masks = masks(e, n, ins.mask, ins.bias_scores, &q, &k)?;
    let scale = e.scalar(score_scale(n, sizes[0] as usize, heads as usize));
    sdpa(e, &q, &k, &v, &masks, &scale, &n.outputs[0]);
    Ok(())
}

/// `MultiHeadAttention` with separate 3-D query, key and value (optionally biased, with a
/// key padding mask, an attention bias and a past key/value).
fn multi_head_attention(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let heads = n.int("num_heads", 0);
    if heads <= 0 {
        return Err(bad(n, "num_heads must be positive"));
    }
    let (q, k, v) = (input(n, 0)?, input(n, 1)?, input(n, 2)?);
    for (name, x) in [("query", q), ("key", k), ("value", v)] {
        match e.rank(x) {
            Some(3) => {}
            Some(r) => {
                return Err(bad(n, format!("{name} has rank {r}: only 3-D query/key/value are supported (not packed)")))
            }
            None => return Err(bad(n, format!("the rank of {name} is not known"))),
        }
    }
    let mut qkv = [q.to_string(), k.to_string(), v.to_string()];
    if let Some(b) = n.input(3) {
        // The bias is [D + D + Dv]: split by the widths of q, k and v.
        let widths: Vec<String> = qkv.clone().iter().map(|x| e.dim(x, 2)).collect();
        let sizes = e.op("Concat", &[&widths[0], &widths[1], &widths[2]], vec![("axis", Attr::Int(0))]);
        let parts: Vec<String> = (0..3).map(|i| e.fresh(["bq", "bk", "bv"][i])).collect();
        e.op_to("Split", &[b, &sizes], &parts, vec![("axis", Attr::Int(0))]);
        for (x, p) in qkv.iter_mut().zip(&parts) {
            *x = e.op("Add", &[x, p], vec![]);
        }
    }
    let qh = e.heads(&qkv[0], heads, &[0, 2, 1, 3]);
    let mut kh = e.heads(&qkv[1], heads, &[0, 2, 1, 3]);
    let mut vh = e.heads(&qkv[2], heads, &[0, 2, 1, 3]);
    match (n.input(6), n.input(7)) {
        (Some(pk), Some(pv)) => {
            kh = e.op("Concat", &[pk, &kh], vec![("axis", Attr::Int(2))]);
            vh = e.op("Concat", &[pv, &vh], vec![("axis", Attr::Int(2))]);
        }
        (None, None) => {}
        _ => return Err(bad(n, "past_key and past_value come together")),
    }
    if let Some(pk) = output(n, 1) {
        e.op_to("Identity", &[&kh], &[pk.to_string()], vec![]);
    }
    if let Some(pv) = output(n, 2) {
        e.op_to("Identity", &[&vh], &[pv.to_string()], vec![]);
    }
    let masks = masks(e, n, n.input(4), n.input(5), &qh, &kh)?;
    let scale = n.float("scale", 0.0);
    let scale = if scale != 0.0 {
        e.scalar(scale)
    } else {
        // 1/√(head size), the head size read from the query at run time.
        let d = e.dim(q, 2);
        inv_sqrt_head_size(e, &d, heads)
    };
    sdpa(e, &qh, &kh, &vh, &masks, &scale, &n.outputs[0]);
    Ok(())
}

/// `RotaryEmbedding`: rotates pairs of the first `rotary_embedding_dim` features of each
/// head by the angles of the cos/sin caches at each token's position.
fn rotary(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let (x, pos, cos_c, sin_c) = (input(n, 0)?, input(n, 1)?, input(n, 2)?, input(n, 3)?);
    let rank = e.rank(x).ok_or_else(|| bad(n, "the rank of the input is not known"))?;
    let half = match e.g.initializers.get(cos_c).map(|t| t.shape().to_vec()) {
        Some(s) if s.len() == 2 => s[1] as i64,
        _ => return Err(bad(n, "cos_cache must be a constant [max position, rotary dim / 2] matrix")),
    };
    if e.rank(pos) != Some(2) {
        return Err(bad(n, "position_ids must be [batch, sequence]"));
    }
    if n.float("scale", 1.0) != 1.0 {
        return Err(bad(n, "a scale other than 1 is not supported"));
    }
    let rot = n.int("rotary_embedding_dim", 0);
    let rot = if rot > 0 { rot } else { 2 * half };
    if rot != 2 * half {
        return Err(bad(n, format!("rotary_embedding_dim {rot} does not match the caches' {}", 2 * half)));
    }
    // x as [B, S, N, H] (3-D input) or [B, N, S, H] (4-D).
    let heads = n.int("num_heads", 0);
    let xh = match rank {
        3 if heads > 0 => {
            let shape = e.ints(&[0, 0, heads, -1]);
            e.op("Reshape", &[x, &shape], vec![])
        }
        3 => {
            // Without num_heads the head size is the rotary dim: heads = hidden / rot.
            let shape = e.ints(&[0, 0, -1, rot]);
            e.op("Reshape", &[x, &shape], vec![])
        }
        4 => x.to_string(),
        r => return Err(bad(n, format!("input of rank {r}: 3 or 4 expected"))),
    };
    // cos/sin [B, S, rot/2], broadcast over heads: [B, S, 1, rot/2] or [B, 1, S, rot/2].
    let cos = e.op("Gather", &[cos_c, pos], vec![]);
    let sin = e.op("Gather", &[sin_c, pos], vec![]);
    let axis = if rank == 3 { 2 } else { 1 };
    let cos = e.unsqueeze(&cos, &[axis]);
    let sin = e.unsqueeze(&sin, &[axis]);
    let full = rotate_heads(e, &xh, &cos, &sin, half, n.int("interleaved", 0) != 0);
    if rank == 3 {
        let shape = e.ints(&[0, 0, -1]);
        e.op_to("Reshape", &[&full, &shape], &n.outputs[..1], vec![]);
    } else {
        e.op_to("Identity", &[&full], &n.outputs[..1], vec![]);
    }
    Ok(())
}

/// `x` (4-D, heads and features last) with its first `2·half` features rotated by the
/// angles whose cos/sin broadcast against `[.., half]`: pairs (x[i], x[i + half]), or
/// (x[2i], x[2i + 1]) when `interleaved`; the other features pass through.
fn rotate_heads(e: &mut Emit, x: &str, cos: &str, sin: &str, half: i64, interleaved: bool) -> String {
    let rot = 2 * half;
    let (z, r, big) = (e.ints(&[0]), e.ints(&[rot]), e.ints(&[i64::MAX]));
    let last = e.ints(&[-1]);
    let xr = e.op("Slice", &[x, &z, &r, &last], vec![]);
    let xp = e.op("Slice", &[x, &r, &big, &last], vec![]);
    let rotated = if interleaved {
        let shape = e.ints(&[0, 0, 0, -1, 2]);
        let pairs = e.op("Reshape", &[&xr, &shape], vec![]);
        let halves: Vec<String> = (0..2).map(|i| e.fresh(["even", "odd"][i])).collect();
        let two = e.ints(&[1, 1]);
        e.op_to("Split", &[&pairs, &two], &halves, vec![("axis", Attr::Int(-1))]);
        let sq = e.ints(&[-1]);
        let a = e.op("Squeeze", &[&halves[0], &sq], vec![]);
        let b = e.op("Squeeze", &[&halves[1], &sq], vec![]);
        let (ra, rb) = rotate(e, &a, &b, cos, sin);
        let ra = e.unsqueeze(&ra, &[-1]);
        let rb = e.unsqueeze(&rb, &[-1]);
        let cat = e.op("Concat", &[&ra, &rb], vec![("axis", Attr::Int(-1))]);
        let back = e.ints(&[0, 0, 0, rot]);
        e.op("Reshape", &[&cat, &back], vec![])
    } else {
        let halves: Vec<String> = (0..2).map(|i| e.fresh(["lo", "hi"][i])).collect();
        let sizes = e.ints(&[half, half]);
        e.op_to("Split", &[&xr, &sizes], &halves, vec![("axis", Attr::Int(-1))]);
        let (ra, rb) = rotate(e, &halves[0], &halves[1], cos, sin);
        e.op("Concat", &[&ra, &rb], vec![("axis", Attr::Int(-1))])
    };
    e.op("Concat", &[&rotated, &xp], vec![("axis", Attr::Int(-1))])
}

/// The head size of `x` (`[.., H]`) at run time as an f32 scalar's reciprocal square root:
/// the default scale of attention scores.
fn inv_sqrt_head_size(e: &mut Emit, width: &str, heads: i64) -> String {
    let h = e.ints(&[heads]);
    let hs = e.op("Div", &[width, &h], vec![]);
    let f = e.op("Cast", &[&hs], vec![("to", Attr::Int(DType::F32.onnx_code() as i64))]);
    let r = e.op("Sqrt", &[&f], vec![]);
    let one = e.scalar(1.0);
    e.op("Div", &[&one, &r], vec![])
}

/// `GroupQueryAttention`: `num_heads` query heads share `kv_num_heads` key/value heads;
/// causal over each sequence's positions (`seqlens_k` + 1 tokens in total), the new keys
/// and values appended to the past ones (present = past ++ new), optional rotary
/// embedding of queries and keys from the cos/sin caches.
fn group_query_attention(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let (heads, kv) = (n.int("num_heads", 0), n.int("kv_num_heads", 0));
    if heads <= 0 || kv <= 0 || heads % kv != 0 {
        return Err(bad(n, format!("num_heads {heads} must be a positive multiple of kv_num_heads {kv}")));
    }
    for (attr, default) in [("softcap", 0.0), ("smooth_softmax", 0.0)] {
        if n.float(attr, default) != default || n.int(attr, 0) != 0 {
            return Err(bad(n, format!("{attr} is not supported")));
        }
    }
    if n.int("local_window_size", -1) != -1 {
        return Err(bad(n, "local_window_size is not supported"));
    }
    for (i, what) in [(10, "attention_bias"), (11, "head_sink")] {
        if n.input(i).is_some() {
            return Err(bad(n, format!("the {what} input is not supported")));
        }
    }
    if output(n, 3).is_some() {
        return Err(bad(n, "the output_qk output is not supported"));
    }
    let q = input(n, 0)?;
    let (seqlens, total) = (input(n, 5)?, input(n, 6)?);
    // Queries [B, S, N, H], keys and values [B, S, KV, H].
    let (mut qh, mut kh, vh) = match (n.input(1), n.input(2)) {
        (Some(k), Some(v)) => {
            let (sq, skv) = (e.ints(&[0, 0, heads, -1]), e.ints(&[0, 0, kv, -1]));
            let qh = e.op("Reshape", &[q, &sq], vec![]);
            (qh, e.op("Reshape", &[k, &skv], vec![]), e.op("Reshape", &[v, &skv], vec![]))
        }
        (None, None) => {
            // Packed: [B, S, (N + 2·KV)·H].
            let shape = e.ints(&[0, 0, heads + 2 * kv, -1]);
            let packed = e.op("Reshape", &[q, &shape], vec![]);
            let parts: Vec<String> = (0..3).map(|i| e.fresh(["q", "k", "v"][i])).collect();
            let sizes = e.ints(&[heads, kv, kv]);
            e.op_to("Split", &[&packed, &sizes], &parts, vec![("axis", Attr::Int(2))]);
            let [a, b, c] = <[String; 3]>::try_from(parts).expect("three parts");
            (a, b, c)
        }
        _ => return Err(bad(n, "key and value come together (or neither, for packed QKV)")),
    };
    // Positions of the new tokens: seqlens_k + 1 − S + i.
    let s = e.dim(q, 1);
    let axes0 = e.ints(&[0]);
    let s = e.op("Squeeze", &[&s, &axes0], vec![]);
    let sk = e.op("Cast", &[seqlens], vec![("to", Attr::Int(DType::I64.onnx_code() as i64))]);
    let sk = e.unsqueeze(&sk, &[1]);
    let (z, o) = (e.konst(Tensor::from_i64(&[], vec![0])), e.konst(Tensor::from_i64(&[], vec![1])));
    let i = e.op("Range", &[&z, &s, &o], vec![]);
    let first = e.op("Sub", &[&o, &s], vec![]);
    let base = e.op("Add", &[&sk, &first], vec![]);
    let pos = e.op("Add", &[&base, &i], vec![]);
    if n.int("do_rotary", 0) != 0 {
        let (cos_c, sin_c) = (input(n, 7)?, input(n, 8)?);
        let half = match e.g.initializers.get(cos_c).map(|t| t.shape().to_vec()) {
            Some(s) if s.len() == 2 => s[1] as i64,
            _ => return Err(bad(n, "cos_cache must be a constant [max position, rotary dim / 2] matrix")),
        };
        let p = n.input(9).unwrap_or(&pos).to_string();
        let cos = e.op("Gather", &[cos_c, &p], vec![]);
        let sin = e.op("Gather", &[sin_c, &p], vec![]);
        let (cos, sin) = (e.unsqueeze(&cos, &[2]), e.unsqueeze(&sin, &[2]));
        let inter = n.int("rotary_interleaved", 0) != 0;
        qh = rotate_heads(e, &qh, &cos, &sin, half, inter);
        kh = rotate_heads(e, &kh, &cos, &sin, half, inter);
    }
    let t = |e: &mut Emit, x: &str| e.op("Transpose", &[x], vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))]);
    let (mut keys, mut values) = (t(e, &kh), t(e, &vh));
    match (n.input(3), n.input(4)) {
        (Some(pk), Some(pv)) => {
            keys = e.op("Concat", &[pk, &keys], vec![("axis", Attr::Int(2))]);
            values = e.op("Concat", &[pv, &values], vec![("axis", Attr::Int(2))]);
        }
        (None, None) => {}
        _ => return Err(bad(n, "past_key and past_value come together")),
    }
    for (i, x) in [(1, &keys), (2, &values)] {
        if let Some(o) = output(n, i) {
            e.op_to("Identity", &[x], &[o.to_string()], vec![]);
        }
    }
    // Key positions 0..total_sequence_length, shaped as the keys held: a past buffer shared
    // with the present one (longer than the past) fails here, clearly, instead of
    // attending to the wrong positions.
    let total = e.op("Cast", &[total], vec![("to", Attr::Int(DType::I64.onnx_code() as i64))]);
    let scalar = e.ints(&[]);
    let total = e.op("Reshape", &[&total, &scalar], vec![]);
    let j = e.op("Range", &[&z, &total, &o], vec![]);
    let held = e.dim(&keys, 2);
    let j = e.op("Reshape", &[&j, &held], vec![]);
    // Query (b, i) sees keys j ≤ pos[b, i]: [B, 1, 1, S, T].
    let pos3 = e.unsqueeze(&pos, &[2]);
    let future = e.op("Greater", &[&j, &pos3], vec![]);
    let (neg, zero) = (e.scalar(-1e30), e.scalar(0.0));
    let mask = e.op("Where", &[&future, &neg, &zero], vec![]);
    let mask = e.unsqueeze(&mask, &[1, 2]);
    // Grouped: queries [B, KV, G, S, H] against keys [B, KV, 1, T, H].
    let sg = e.ints(&[0, 0, kv, heads / kv, -1]);
    let q5 = e.op("Reshape", &[&qh, &sg], vec![]);
    let q5 = e.op("Transpose", &[&q5], vec![("perm", Attr::Ints(vec![0, 2, 3, 1, 4]))]);
    // Keys transposed on their last two axes right before the product (the form the cpu
    // backend's attention fusion reads in place).
    let k5 = e.unsqueeze(&keys, &[2]);
    let kt = e.op("Transpose", &[&k5], vec![("perm", Attr::Ints(vec![0, 1, 2, 4, 3]))]);
    let v5 = e.unsqueeze(&values, &[2]);
    let scale = n.float("scale", 0.0);
    let scale = if scale != 0.0 {
        e.scalar(scale)
    } else {
        let width = e.dim(&qh, 3);
        inv_sqrt_head_size(e, &width, 1)
    };
    let qk = e.op("MatMul", &[&q5, &kt], vec![]);
    let scores = e.op("Mul", &[&qk, &scale], vec![]);
    let scores = e.op("Add", &[&scores, &mask], vec![]);
    let p = e.op("Softmax", &[&scores], vec![("axis", Attr::Int(-1))]);
    let o5 = e.op("MatMul", &[&p, &v5], vec![]);
    let o5 = e.op("Transpose", &[&o5], vec![("perm", Attr::Ints(vec![0, 3, 1, 2, 4]))]);
    let shape = e.ints(&[0, 0, -1]);
    e.op_to("Reshape", &[&o5, &shape], &n.outputs[..1], vec![]);
    Ok(())
}

/// `(a·cos − b·sin, b·cos + a·sin)`.
fn rotate(e: &mut Emit, a: &str, b: &str, cos: &str, sin: &str) -> (String, String) {
    let (ac, bs) = (e.op("Mul", &[a, cos], vec![]), e.op("Mul", &[b, sin], vec![]));
    let (bc, as_) = (e.op("Mul", &[b, cos], vec![]), e.op("Mul", &[a, sin], vec![]));
    (e.op("Sub", &[&ac, &bs], vec![]), e.op("Add", &[&bc, &as_], vec![]))
}
