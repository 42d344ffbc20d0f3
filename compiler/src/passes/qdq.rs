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
//!
//! The integer ops of QOperator models are first written the same way (`dequantize_ops`):
//! `QLinearConv` as DequantizeLinear → Conv → QuantizeLinear (the bias dequantized with the
//! product of the input and weight scales), `QLinearMatMul` likewise, and a
//! `MatMulInteger` whose only reader casts it to f32 (what `quantize_dynamic` writes) as an
//! f32 MatMul of the zero-point-shifted operands — exact while its sums stay below 2²⁴ in
//! magnitude, rounded to f32's 24 bits beyond (where ONNX Runtime's own int32 result is
//! rounded the same way by the Cast that follows). Then the weights' dequantization
//! folds, and the activations' pairs become the f32 loops above.

use super::fuse::{sources_of, SOURCES};
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor, ValueType};

/// A per-tensor quantisation: scale, zero point and the integer range.
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Params {
    pub(super) scale: f32,
    pub(super) zero: f32,
    pub(super) lo: f32,
    pub(super) hi: f32,
}

/// The parameters of a QuantizeLinear / DequantizeLinear node, when they are constant and
/// per tensor (scalar, or of one element) and the integer type is 8 or 16 bits.
pub(super) fn params(g: &Graph, n: &Node) -> Option<Params> {
    if four_bit(n) {
        return None;
    }
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

/// Whether a QuantizeLinear writes 4-bit values (held one per byte, saturating to the
/// 4-bit range): no pass rewrites those.
pub(super) fn four_bit(n: &Node) -> bool {
    matches!(n.attrs.get("output_dtype"), Some(Attr::Int(c)) if [aim_kernels::ops::quant::INT4, aim_kernels::ops::quant::UINT4].contains(c))
}

/// The integer type of a Q/DQ node's quantised side, from the value's recorded type.
fn quantized_type(g: &Graph, n: &Node) -> Option<DType> {
    let v = if n.op == "QuantizeLinear" { n.outputs.first()? } else { n.input(0)? };
    g.value_type(v)?.dtype
}

fn is(n: &Node, op: &str) -> bool {
    n.domain.is_empty() && n.op == op
}

/// Which dynamically quantized convolutions stay on bytes as `aim:ConvInteger`, and
/// whether products of two quantized activations become `aim:QMatMul`: what the target's
/// integer kernels make pay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntegerConv {
    /// Neither: ConvInteger runs as an f32 convolution of whole numbers (exact sums).
    Off,
    /// ConvInteger of one group (AVX2 without VNNI, where the exact 16-bit kernel
    /// `aim_kernels::qconv16` runs it: `vpmaddwd` beats f32 FMAs there, `vpmaddubsw` does
    /// not); grouped ones and activation products stay f32.
    OneGroup,
    /// Every ConvInteger the byte kernel takes, and activation products (AVX-512 VNNI,
    /// NEON `sdot`).
    Vnni,
}

/// Rewrites the integer ops, then every matching pair (see the module doc); then, if
/// anything changed, infers the new values' types and folds the weights' dequantization.
pub fn run(g: &mut Graph, int8: bool, integer_gemm: bool, integer_conv: IntegerConv) -> Result<(), PassError> {
    let before = g.nodes.len();
    let ops: Vec<String> = g.nodes.iter().map(|n| n.op.clone()).collect();
    let changed = |g: &Graph| g.nodes.len() != before || g.nodes.iter().zip(&ops).any(|(n, op)| &n.op != op);
    let infer = |g: &mut Graph| {
        aim_ir::infer::infer_types(g).map_err(|e| PassError { pass: "quantize-dequantize", msg: e.to_string() })
    };
    dequantize_ops(g, integer_conv);
    // Once more for the value-moving ops whose input the first round made a QuantizeLinear.
    dequantize_ops(g, integer_conv);
    if changed(g) {
        // The pairs below read the new values' types.
        infer(g)?;
    }
    if int8 {
        // Before the pairs become f32 loops: the byte regions and the convolutions read
        // them.
        super::int8::run(g);
        super::qconv::run(g);
    }
    if integer_conv != IntegerConv::Off {
        super::qconv::run_dynamic(g);
    }
    if int8 || integer_gemm {
        // Dense layers on the integer GEMM (`aim_kernels::qgemm`: VNNI, or AVX2's exact
        // 16-bit products), their sums ORT's exact integer ones. Not convolutions on AVX2:
        // packing their bytes per run made text_orientation_qdq 2.2x slower than its f32
        // emulation there.
        super::qdense_static::run(g);
    }
    if integer_conv == IntegerConv::Vnni {
        // Products of two activations too, where VNNI makes integer products pay for
        // quantizing both sides per run: AVX2's `vpmaddubsw` multiplies no faster than
        // f32 FMAs on the CPUs measured, and smart_turn_v3's attention products took
        // 3.1 ms each there against 2.2 ms in f32 (AMD EPYC, AVX2, 1 thread).
        super::qmatmul::run(g);
    }
    rewrite_pairs(g)?;
    // The dequantization of constants (weights, biases) was left for here by the first
    // constant folding: the integer kernels read the integers.
    let dequantize = g.nodes.iter().any(|n| n.domain.is_empty() && n.op == "DequantizeLinear");
    if changed(g) || dequantize {
        infer(g)?;
        // Weights the integer kernels took are read by nothing now: dropped before folding,
        // not dequantized into f32 copies first (for ResNet-50, 100 MB and most of its load).
        super::dce::run(g)?;
        super::const_fold::run(g)?;
    }
    Ok(())
}

/// Appends new nodes and constants with names no value or node of the graph has.
struct Emit {
    names: std::collections::HashSet<String>,
    nodes: Vec<Node>,
    /// Constants the new nodes read, added to the graph with them.
    consts: Vec<(String, Tensor)>,
    sources: Vec<String>,
    base: String,
}

impl Emit {
    fn fresh(&mut self, tag: &str) -> String {
        let mut k = 0;
        loop {
            let name = format!("{}/{tag}{}", self.base, if k == 0 { String::new() } else { format!("_{k}") });
            k += 1;
            if self.names.insert(name.clone()) {
                return name;
            }
        }
    }

    fn op_to(&mut self, op: &str, ins: &[&str], out: &str, attrs: Vec<(&str, Attr)>) {
        let mut a: std::collections::BTreeMap<String, Attr> =
            attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        a.insert(SOURCES.into(), Attr::Strings(self.sources.clone()));
        let name = self.fresh(&op.to_lowercase());
        self.nodes.push(Node {
            name,
            op: op.into(),
            domain: String::new(),
            inputs: ins.iter().map(|s| s.to_string()).collect(),
            outputs: vec![out.to_string()],
            attrs: a,
        });
    }

    fn op(&mut self, op: &str, ins: &[&str], attrs: Vec<(&str, Attr)>) -> String {
        let out = self.fresh(&format!("{}_out", op.to_lowercase()));
        self.op_to(op, ins, &out, attrs);
        out
    }
}

/// The per-axis axis of a weight's scale: `Some(axis)` for a 1-D scale of more than one
/// element, `None` (per tensor) otherwise; `Err` when it is not constant.
fn scale_axis(g: &Graph, scale: &str, axis: i64) -> Result<Option<i64>, ()> {
    let t = g.initializers.get(scale).ok_or(())?;
    Ok((t.len() > 1).then_some(axis))
}

/// Writes QLinearConv, QLinearMatMul and cast MatMulInteger nodes as f32 ops between
/// dequantize and quantize nodes (see the module doc); a cast ConvInteger that
/// `integer_conv`'s kernels take becomes `aim:ConvInteger`. Nodes whose parameters are not
/// constants, or whose forms this does not cover, stay.
fn dequantize_ops(g: &mut Graph, integer_conv: IntegerConv) {
    let integer = |n: &Node| {
        n.domain.is_empty()
            && (matches!(n.op.as_str(), "QLinearConv" | "QLinearMatMul" | "MatMulInteger" | "ConvInteger")
                || moves_values(&n.op))
    };
    if !g.nodes.iter().any(integer) {
        return;
    }
    let mut names: std::collections::HashSet<String> = g.nodes.iter().map(|n| n.name.clone()).collect();
    names.extend(g.nodes.iter().flat_map(|n| n.outputs.iter().cloned()));
    names.extend(g.initializers.keys().cloned());
    names.extend(g.inputs.iter().map(|v| v.name.clone()));
    let r = super::uses::readers(g);
    let by_output: std::collections::HashMap<&str, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    let mut skip = vec![false; g.nodes.len()];
    let mut pending = Vec::new();
    // Nodes replacing an integer product and the readers that make it f32 go where the
    // last reader was: a bias the Add reads may be computed after the product.
    let mut deferred: std::collections::HashMap<usize, Vec<Node>> = std::collections::HashMap::new();
    let mut out: Vec<Node> = Vec::with_capacity(g.nodes.len());
    // Types of values made here that inference cannot give (outputs of `aim` nodes).
    let mut typed: Vec<(String, ValueType)> = Vec::new();
    for i in 0..g.nodes.len() {
        if skip[i] {
            out.extend(deferred.remove(&i).unwrap_or_default());
            continue;
        }
        let n = &g.nodes[i];
        let mut e = Emit {
            names: std::mem::take(&mut names),
            nodes: Vec::new(),
            consts: Vec::new(),
            sources: sources_of(n),
            base: n.name.clone(),
        };
        let done = match (n.domain.as_str(), n.op.as_str()) {
            ("", "QLinearConv") => qlinear_conv(g, n, &mut e).is_ok(),
            ("", "QLinearMatMul") => qlinear_matmul(g, n, &mut e).is_ok(),
            ("", op @ ("MatMulInteger" | "ConvInteger")) => match cast_reader(g, &r, &n.outputs[0]) {
                Some((readers, bias, y)) => {
                    let product = if bias.is_some() { e.fresh("product") } else { y.clone() };
                    let ok = if op == "ConvInteger" {
                        match integer_conv_fits(g, n, integer_conv) {
                            true => {
                                // The product's type: the sums' shape, or (not inferred yet)
                                // the Cast's, which a bias does not widen.
                                let ty = [&n.outputs[0], &y]
                                    .into_iter()
                                    .filter_map(|v| g.value_type(v))
                                    .find(|t| t.shape.is_some())
                                    .map(|t| ValueType { dtype: Some(DType::F32), ..t });
                                typed.extend(ty.map(|t| (product.clone(), t)));
                                kept_integer(g, n, &product, &mut e)
                            }
                            false => conv_integer(g, n, &product, &mut e),
                        }
                    } else {
                        matmul_integer(g, n, &product, &mut e)
                    }
                    .is_ok();
                    if ok {
                        if let Some(b) = bias {
                            let fb = match g.initializers.get(&b) {
                                Some(t) => {
                                    let name = e.fresh("bias");
                                    e.consts.push((name.clone(), aim_kernels::cast(t, DType::F32)));
                                    name
                                }
                                None => e.op("Cast", &[&b], vec![("to", Attr::Int(1))]),
                            };
                            e.op_to("Add", &[&product, &fb], &y, vec![]);
                        }
                        for &c in &readers {
                            e.sources.extend(sources_of(&g.nodes[c]));
                            skip[c] = true;
                        }
                        for node in &mut e.nodes {
                            node.attrs.insert(SOURCES.into(), Attr::Strings(e.sources.clone()));
                        }
                        let last = readers.iter().copied().max().unwrap_or(i);
                        deferred.insert(last, std::mem::take(&mut e.nodes));
                    }
                    ok
                }
                None => false,
            },
            ("", op) if moves_values(op) => match n.input(0).and_then(|v| by_output.get(v)) {
                Some(&p) if is(&g.nodes[p], "QuantizeLinear") => lift(g, n, &g.nodes[p], &mut e).is_ok(),
                _ => false,
            },
            _ => false,
        };
        names = std::mem::take(&mut e.names);
        if done {
            pending.append(&mut e.consts);
            out.extend(e.nodes);
        } else {
            out.push(n.clone());
        }
    }
    g.nodes = out;
    g.initializers.extend(pending);
    let made: std::collections::HashSet<&String> = g.nodes.iter().flat_map(|n| &n.outputs).collect();
    let typed: Vec<(String, ValueType)> = typed.into_iter().filter(|(v, _)| made.contains(v)).collect();
    g.value_types.extend(typed);
}

/// Ops that move or select values without computing new ones: on quantized data they
/// commute with dequantization (by a positive scale), so they can run in f32 between a
/// dequantize and a quantize with the same parameters, exactly.
fn moves_values(op: &str) -> bool {
    matches!(op, "MaxPool" | "Reshape" | "Flatten" | "Transpose" | "Squeeze" | "Unsqueeze" | "Identity")
}

/// `op(q)` on the integer output `q` of a per-tensor QuantizeLinear `qn`, as
/// `QuantizeLinear(op(DequantizeLinear(q)))` with `qn`'s parameters.
fn lift(g: &Graph, n: &Node, qn: &Node, e: &mut Emit) -> Result<(), ()> {
    let p = params(g, qn).ok_or(())?;
    if p.scale <= 0.0 || n.outputs.len() != 1 || (n.op == "MaxPool" && n.outputs.len() > 1) {
        return Err(());
    }
    let (s, z) = (qn.input(1).ok_or(())?, qn.input(2));
    let x = dq(e, n.input(0).ok_or(())?, s, z, None);
    let mut ins: Vec<&str> = vec![&x];
    ins.extend(n.inputs.iter().skip(1).map(|s| s.as_str()));
    let attrs: Vec<(&str, Attr)> =
        n.attrs.iter().filter(|(k, _)| k.as_str() != SOURCES).map(|(k, v)| (k.as_str(), v.clone())).collect();
    let y = e.op(&n.op, &ins, attrs);
    q_to(e, &y, s, z, &n.outputs[0]);
    Ok(())
}

/// `DequantizeLinear(x, scale, zero_point[, axis])`.
fn dq(e: &mut Emit, x: &str, scale: &str, zero: Option<&str>, axis: Option<i64>) -> String {
    let mut ins = vec![x, scale];
    if let Some(z) = zero {
        ins.push(z);
    }
    e.op("DequantizeLinear", &ins, axis.map(|a| vec![("axis", Attr::Int(a))]).unwrap_or_default())
}

/// `QuantizeLinear(x, scale, zero_point)` into `y`.
fn q_to(e: &mut Emit, x: &str, scale: &str, zero: Option<&str>, y: &str) {
    let mut ins = vec![x, scale];
    if let Some(z) = zero {
        ins.push(z);
    }
    e.op_to("QuantizeLinear", &ins, y, vec![]);
}

fn qlinear_conv(g: &Graph, n: &Node, e: &mut Emit) -> Result<(), ()> {
    let inp = |k: usize| n.input(k).ok_or(());
    let (x, xs, xz, w, ws, wz, ys, yz) =
        (inp(0)?, inp(1)?, n.input(2), inp(3)?, inp(4)?, n.input(5), inp(6)?, n.input(7));
    let xf = dq(e, x, xs, xz, None);
    let wf = dq(e, w, ws, wz, scale_axis(g, ws, 0)?);
    let mut ins = vec![xf, wf];
    if let Some(b) = n.input(8) {
        // The int32 bias has the scale x_scale · w_scale (per output channel) and no zero point.
        let bs = e.op("Mul", &[xs, ws], vec![]);
        ins.push(dq(e, b, &bs, None, scale_axis(g, ws, 0)?));
    }
    let attrs: Vec<(&str, Attr)> = ["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"]
        .into_iter()
        .filter_map(|k| n.attrs.get(k).map(|v| (k, v.clone())))
        .collect();
    let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
    let y = e.op("Conv", &refs, attrs);
    q_to(e, &y, ys, yz, &n.outputs[0]);
    Ok(())
}

fn qlinear_matmul(g: &Graph, n: &Node, e: &mut Emit) -> Result<(), ()> {
    let inp = |k: usize| n.input(k).ok_or(());
    let (a, as_, az, b, bs, bz, ys, yz) =
        (inp(0)?, inp(1)?, n.input(2), inp(3)?, inp(4)?, n.input(5), inp(6)?, n.input(7));
    // Per-column scales of a 2-D B: axis 1.
    let b_rank = g.value_type(b).and_then(|t| t.shape).map(|s| s.len()).ok_or(())?;
    let af = dq(e, a, as_, az, None);
    if g.initializers.get(as_).ok_or(())?.len() != 1 {
        return Err(());
    }
    let bf = dq(e, b, bs, bz, scale_axis(g, bs, b_rank as i64 - 1)?);
    let y = e.op("MatMul", &[&af, &bf], vec![]);
    q_to(e, &y, ys, yz, &n.outputs[0]);
    Ok(())
}

/// Whether `v` holds one value (a constant of one element, or a value of shape [1, …, 1]
/// or []): a zero point that shifts a whole tensor.
fn one_value(g: &Graph, v: &str) -> bool {
    g.initializers.get(v).map(|t| t.len() == 1).unwrap_or_else(|| {
        g.value_type(v).and_then(|t| t.shape).is_some_and(|s| s.iter().all(|d| *d == aim_ir::Dim::Known(1)))
    })
}

/// `v` cast to f32 and shifted by its zero point `zero` (cast too): Cast and Sub, fast
/// kernels, for operands whose zero point is known only at run time.
fn shifted(e: &mut Emit, v: &str, zero: Option<&str>) -> String {
    let float = |e: &mut Emit, v: &str| e.op("Cast", &[v], vec![("to", Attr::Int(1))]);
    let f = float(e, v);
    match zero {
        Some(z) => {
            let zf = float(e, z);
            e.op("Sub", &[&f, &zf], vec![])
        }
        None => f,
    }
}

/// `MatMulInteger(A, B, a_zero, b_zero)` read only by a Cast to f32 (writing `y`).
fn matmul_integer(g: &Graph, n: &Node, y: &str, e: &mut Emit) -> Result<(), ()> {
    let (a, b) = (n.input(0).ok_or(())?, n.input(1).ok_or(())?);
    // A per-row zero point of A does not broadcast as a Sub over A's columns would.
    if n.input(2).is_some_and(|z| !one_value(g, z)) {
        return Err(());
    }
    let af = shifted(e, a, n.input(2));
    let bf = shifted(e, b, n.input(3));
    e.op_to("MatMul", &[&af, &bf], y, vec![]);
    Ok(())
}

/// The readers through which an integer product becomes f32, as `quantize_dynamic` writes
/// them: a Cast to f32 alone, or an Add of an int32 bias (a constant, or computed per run
/// from the activation's scale as older versions write it) whose only reader is that Cast.
/// Gives the readers' indices, the bias, and the f32 value they make.
fn cast_reader(
    g: &Graph,
    r: &std::collections::HashMap<String, Vec<usize>>,
    v: &str,
) -> Option<(Vec<usize>, Option<String>, String)> {
    let only = |v: &str| match r.get(v).map(|x| x.as_slice()) {
        Some(&[c]) if c != usize::MAX => Some(c),
        _ => None,
    };
    let is_cast = |c: usize| is(&g.nodes[c], "Cast") && g.nodes[c].int("to", 0) == 1;
    let c = only(v)?;
    if is_cast(c) {
        return Some((vec![c], None, g.nodes[c].outputs[0].clone()));
    }
    let add = &g.nodes[c];
    if !is(add, "Add") || add.inputs.len() != 2 {
        return None;
    }
    let other = if add.inputs[0] == v { &add.inputs[1] } else { &add.inputs[0] };
    let int32 = g.initializers.get(other).map(|t| t.dtype()).or_else(|| g.value_type(other)?.dtype);
    if int32 != Some(DType::I32) {
        return None;
    }
    let cast = only(&add.outputs[0]).filter(|&k| is_cast(k))?;
    Some((vec![c, cast], Some(other.clone()), g.nodes[cast].outputs[0].clone()))
}

/// `ConvInteger(X, W, x_zero, w_zero)` read only by a Cast to f32 (writing `y`), as what
/// `quantize_dynamic` writes for a convolution: an f32 Conv of the zero-point-shifted
/// operands (X cast and shifted; W by a DequantizeLinear with scale 1, per output channel
/// or per tensor, which folds into a constant), exact while the sums stay below 2²⁴ and
/// marked `exact_sums` so that kernel selection keeps them exact (no Winograd).
fn conv_integer(g: &Graph, n: &Node, y: &str, e: &mut Emit) -> Result<(), ()> {
    let (x, w) = (n.input(0).ok_or(())?, n.input(1).ok_or(())?);
    // X's zero point must be one value (a per-tensor shift): a constant, or a computed
    // scalar (DynamicQuantizeLinear's).
    if n.input(2).is_some_and(|z| !one_value(g, z)) {
        return Err(());
    }
    let xf = shifted(e, x, n.input(2));
    // W's zero point: one, or one per output channel (a constant, so this folds).
    let wz_len = match n.input(3) {
        Some(z) => g.initializers.get(z).ok_or(())?.len(),
        None => 1,
    };
    let ws = e.fresh("unit_scale");
    let unit = Tensor::from_vec(&[wz_len], vec![1f32; wz_len]);
    e.consts.push((ws.clone(), if wz_len == 1 { unit.reshaped(&[]) } else { unit }));
    let wf = dq(e, w, &ws, n.input(3), (wz_len > 1).then_some(0));
    let mut attrs: Vec<(&str, Attr)> = ["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"]
        .into_iter()
        .filter_map(|k| n.attrs.get(k).map(|v| (k, v.clone())))
        .collect();
    // Whole numbers in, their exact sums out: no kernel that rounds on the way (Winograd).
    attrs.push((aim_kernels::nchwc::EXACT_SUMS, Attr::Int(1)));
    e.op_to("Conv", &[&xf, &wf], y, attrs);
    Ok(())
}

/// The weights of ConvInteger `n` minus their zero point (constant: one, or one per output
/// channel), as whole numbers `[M, C/group, kh, kw]`; None when they are not constant 2-D
/// weights of 8 bits.
fn centred_weights(g: &Graph, n: &Node) -> Option<(Vec<i32>, Vec<usize>)> {
    let w = g.initializers.get(n.input(1)?).filter(|t| t.rank() == 4)?;
    let values: Vec<i32> = match w.dtype() {
        DType::I8 => w.data::<i8>().iter().map(|&v| v as i32).collect(),
        DType::U8 => w.data::<u8>().iter().map(|&v| v as i32).collect(),
        _ => return None,
    };
    let m = w.shape()[0];
    let zeros: Vec<i32> = match n.input(3) {
        None => vec![0],
        Some(z) => {
            let z = g.initializers.get(z).filter(|t| t.dtype() == w.dtype() && (t.len() == 1 || t.len() == m))?;
            match z.dtype() {
                DType::I8 => z.data::<i8>().iter().map(|&v| v as i32).collect(),
                _ => z.data::<u8>().iter().map(|&v| v as i32).collect(),
            }
        }
    };
    let per = values.len() / m.max(1);
    let centred =
        values.iter().enumerate().map(|(i, &v)| v - zeros[if zeros.len() == 1 { 0 } else { i / per }]).collect();
    Some((centred, w.shape().to_vec()))
}

/// Whether the integer convolution (`aim:ConvInteger`: `aim_kernels::qconv`, or
/// `aim_kernels::qconv16` for one group without VNNI) takes ConvInteger `n` on `kernels`:
/// u8 input, constant 2-D weights of 8 bits with a constant zero point, explicit pads, and
/// one group — or with VNNI, groups that are not depthwise (one channel per group fills
/// none of the byte kernel's 4-byte groups) where the weights less their zero point stay s8.
fn integer_conv_fits(g: &Graph, n: &Node, kernels: IntegerConv) -> bool {
    let u8_in = n.input(0).and_then(|x| g.value_type(x)).and_then(|t| t.dtype) == Some(DType::U8);
    let x_zero = n.input(2).is_none_or(|z| one_value(g, z));
    let group = n.int("group", 1);
    let Some((w, shape)) = centred_weights(g, n) else { return false };
    let fits_s8 = w.iter().all(|&v| (-128..=127).contains(&v));
    u8_in
        && x_zero
        && n.string("auto_pad", "NOTSET") == "NOTSET"
        && match kernels {
            IntegerConv::Off => false,
            IntegerConv::OneGroup => group == 1,
            IntegerConv::Vnni => group == 1 || (group > 1 && shape[1] >= 4 && fits_s8),
        }
}

/// ConvInteger `n` (which [`integer_conv_fits`]) kept on bytes as `aim:ConvInteger(X, W,
/// x_zero)` writing the Cast's f32 `y`: the sums are the integer ones. W is the weights
/// less their zero point, as s8; where a difference leaves s8 (u8 weights with a zero point,
/// what older `quantize_dynamic` writes), each is split into two s8 parts over the input
/// channels twice (`doubled`, read by the kernel from the same bytes).
fn kept_integer(g: &Graph, n: &Node, y: &str, e: &mut Emit) -> Result<(), ()> {
    let x = n.input(0).ok_or(())?;
    let (w, mut shape) = centred_weights(g, n).ok_or(())?;
    let doubled = !w.iter().all(|&v| (-128..=127).contains(&v));
    let bytes: Vec<i8> = if doubled {
        // d = d1 + d2 with both in s8: [M, C, kh, kw] becomes [M, 2C, kh, kw], each output
        // channel's C·kh·kw values of d1 then of d2.
        let per = w.len() / shape[0];
        let mut out = Vec::with_capacity(2 * w.len());
        for row in w.chunks(per) {
            out.extend(row.iter().map(|&d| d.clamp(-128, 127) as i8));
            out.extend(row.iter().map(|&d| (d - d.clamp(-128, 127)) as i8));
        }
        shape[1] *= 2;
        out
    } else {
        w.iter().map(|&v| v as i8).collect()
    };
    let unchanged = !doubled
        && g.initializers.get(n.input(1).ok_or(())?).is_some_and(|t| t.dtype() == DType::I8 && t.data::<i8>() == bytes);
    let name = match unchanged {
        // s8 weights with zero point 0: read as they are.
        true => n.input(1).ok_or(())?.to_string(),
        false => {
            let name = e.fresh("weights_s8");
            e.consts.push((name.clone(), Tensor::from_vec(&shape, bytes)));
            name
        }
    };
    let mut ins = vec![x, name.as_str()];
    ins.extend(n.input(2));
    let mut attrs: Vec<(&str, Attr)> = ["dilations", "group", "kernel_shape", "pads", "strides"]
        .into_iter()
        .filter_map(|k| n.attrs.get(k).map(|v| (k, v.clone())))
        .collect();
    if doubled {
        attrs.push(("doubled", Attr::Int(1)));
    }
    e.op_to("ConvInteger", &ins, y, attrs);
    e.nodes.last_mut().ok_or(())?.domain = "aim".into();
    Ok(())
}

/// Rewrites every matching quantize-dequantize pair (see the module doc).
fn rewrite_pairs(g: &mut Graph) -> Result<(), PassError> {
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
        if !is(qn, "QuantizeLinear") || qn.attrs.contains_key("block_size") || four_bit(qn) {
            continue;
        }
        let Some(x) = qn.input(0) else { continue };
        let f32_in = g.value_type(x).and_then(|t| t.dtype) == Some(DType::F32);
        // The output has the scale's type (f32, checked by `params`) unless told otherwise.
        let f32_out = !dq.attrs.contains_key("output_dtype");
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
        run(&mut h, false, false, IntegerConv::Off).expect("rewrites");
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
        run(&mut g, false, false, IntegerConv::Off).expect("runs");
        assert_eq!(g, m.graph);
    }
}

#[cfg(test)]
mod lift_tests {
    use super::*;

    /// A MaxPool on the integer output of a QuantizeLinear runs in f32 between a dequantize
    /// and a quantize of the same parameters, and gives the integer MaxPool's values.
    #[test]
    fn value_moving_ops_run_in_f32() {
        let text = "opset 21\ngraph \"g\" {\n  input %x: f32[1,1,4,4]\n  init %s = f32[] [0.5]\n  init %z = u8[] [10]\n  %q = QuantizeLinear(%x, %s, %z)  # q\n  %p = MaxPool(%q) {kernel_shape=[2, 2], strides=[2, 2]}  # pool\n  %y = DequantizeLinear(%p, %s, %z)  # dq\n  output %y: f32[1,1,2,2]\n}\n";
        let mut m = aim_ir::text::parse_model(text).expect("parses");
        aim_ir::infer::infer_types(&mut m.graph).expect("infers");
        let x: Vec<f32> = (0..16).map(|i| (i as f32 - 7.3) * 0.7).collect();
        let input = || [("x".to_string(), Tensor::from_slice(&[1, 1, 4, 4], &x))].into_iter().collect();
        let want = aim_runtime::run_graph(&m.graph, input()).expect("runs");
        let mut g = m.graph.clone();
        run(&mut g, false, false, IntegerConv::Off).expect("rewrites");
        crate::passes::dce::run(&mut g).expect("dce");
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert!(!ops.contains(&"QuantizeLinear") && !ops.contains(&"DequantizeLinear"), "{ops:?}");
        let got = aim_runtime::run_graph(&g, input()).expect("runs");
        assert_eq!(want[0].data::<f32>(), got[0].data::<f32>());
    }
}
