//! The quantized `com.microsoft` ops ONNX Runtime's quantizer writes in QOperator format
//! (QLinearAdd, QLinearMul, QGemm, QLinearGlobalAveragePool, QLinearAveragePool,
//! QLinearConcat, QLinearSigmoid, QLinearLeakyRelu) and its dynamic forms
//! (DynamicQuantizeMatMul, MatMulIntegerToFloat), expanded at import into default-domain
//! DequantizeLinear → f32 op → QuantizeLinear, which is ONNX Runtime's definition of them up
//! to the rounding of its fixed-point arithmetic. MatMulNBits (blockwise 2- to 8-bit
//! weights, as LLM exports write them) has its constant weights dequantized at import into
//! an f32 (or f16) MatMul weight. QAttention and QEmbedLayerNormalization (what
//! `quantize_dynamic` makes of the transformer optimizer's Attention and
//! EmbedLayerNormalization) become those ops over dequantized operands, the embedding tables
//! staying bytes: each gathered row is dequantized. Both backends then run them; the cpu
//! pipeline turns the quantize-dequantize pairs between them into f32 loops
//! (`passes/qdq.rs`). Forms not covered (channels-last pooling) are import errors naming
//! the node.

use super::contrib::{attention_with, bad, embed_layer_norm_with, input, AttentionInputs, EmbedInputs, Emit};
use super::ImportError;
use aim_ir::{Attr, Node};

/// Whether this module expands `op` of the contrib domain.
pub fn expands(op: &str) -> bool {
    matches!(
        op,
        "QLinearAdd"
            | "QLinearMul"
            | "QGemm"
            | "QLinearGlobalAveragePool"
            | "QLinearAveragePool"
            | "QLinearConcat"
            | "QLinearSigmoid"
            | "QLinearLeakyRelu"
            | "DynamicQuantizeMatMul"
            | "MatMulIntegerToFloat"
            | "MatMulNBits"
            | "QLinearSoftmax"
            | "DynamicQuantizeLSTM"
            | "QAttention"
            | "QEmbedLayerNormalization"
    )
}

/// Expands `n` (one of [`expands`]).
pub fn expand(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    match n.op.as_str() {
        "QLinearAdd" | "QLinearMul" => {
            let a = dq(e, n, 0, None)?;
            let b = dq(e, n, 3, None)?;
            let y = e.op(&n.op["QLinear".len()..], &[&a, &b], vec![]);
            q_out(e, n, &y, 6)
        }
        "QLinearSigmoid" => {
            let x = dq(e, n, 0, None)?;
            let y = e.op("Sigmoid", &[&x], vec![]);
            q_out(e, n, &y, 3)
        }
        "QLinearLeakyRelu" => {
            let x = dq(e, n, 0, None)?;
            let y = e.op("LeakyRelu", &[&x], vec![("alpha", Attr::Float(n.float("alpha", 0.01)))]);
            q_out(e, n, &y, 3)
        }
        "QLinearGlobalAveragePool" | "QLinearAveragePool" => {
            if n.int("channels_last", 0) != 0 {
                return Err(bad(n, "channels_last pooling is not supported"));
            }
            let x = dq(e, n, 0, None)?;
            let attrs: Vec<(&str, Attr)> =
                ["auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"]
                    .into_iter()
                    .filter_map(|k| n.attrs.get(k).map(|v| (k, v.clone())))
                    .collect();
            let y = e.op(&n.op["QLinear".len()..], &[&x], attrs);
            q_out(e, n, &y, 3)
        }
        "QLinearConcat" => {
            // Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input.
            if n.inputs.len() < 5 || !(n.inputs.len() - 2).is_multiple_of(3) {
                return Err(bad(n, format!("{} inputs: expected 2 + 3 per concatenated tensor", n.inputs.len())));
            }
            let mut parts = Vec::new();
            for k in (2..n.inputs.len()).step_by(3) {
                parts.push(dq(e, n, k, None)?);
            }
            let refs: Vec<&str> = parts.iter().map(|s| s.as_str()).collect();
            let y = e.op("Concat", &refs, vec![("axis", Attr::Int(n.int("axis", 0)))]);
            let (s, z) = (input(n, 0)?, n.input(1));
            quantize_to(e, &y, s, z, &n.outputs[0]);
            Ok(())
        }
        "QGemm" => qgemm(e, n),
        "QLinearSoftmax" => qlinear_softmax(e, n),
        "DynamicQuantizeLSTM" => dynamic_quantize_lstm(e, n),
        "QAttention" => q_attention(e, n),
        "QEmbedLayerNormalization" => q_embed_layer_norm(e, n),
        "MatMulNBits" => matmul_nbits(e, n),
        "DynamicQuantizeMatMul" => {
            // A (f32) is quantized per run to u8 (DynamicQuantizeLinear), B with its scale and
            // zero point, then an f32 product plus the optional bias.
            let a = input(n, 0)?;
            let (aq, as_, az) = (e.fresh("a_quantized"), e.fresh("a_scale"), e.fresh("a_zero_point"));
            e.op_multi("DynamicQuantizeLinear", &[a], &[aq.clone(), as_.clone(), az.clone()]);
            let af = e.op("DequantizeLinear", &[&aq, &as_, &az], vec![]);
            let bf = dq_weight(e, n, input(n, 1)?, input(n, 2)?, n.input(3))?;
            matmul_bias(e, n, &af, &bf, n.input(4))
        }
        "MatMulIntegerToFloat" => {
            // A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias.
            let af = {
                let mut ins = vec![input(n, 0)?, input(n, 2)?];
                if let Some(z) = n.input(4) {
                    ins.push(z);
                }
                e.op("DequantizeLinear", &ins, vec![])
            };
            let bf = dq_weight(e, n, input(n, 1)?, input(n, 3)?, n.input(5))?;
            matmul_bias(e, n, &af, &bf, n.input(6))
        }
        _ => unreachable!("expands() lists the ops matched here"),
    }
}

/// DequantizeLinear of input `k` of `n` with its scale and zero point at `k + 1`, `k + 2`.
fn dq(e: &mut Emit, n: &Node, k: usize, axis: Option<i64>) -> Result<String, ImportError> {
    let mut ins = vec![input(n, k)?, input(n, k + 1)?];
    if let Some(z) = n.input(k + 2) {
        ins.push(z);
    }
    Ok(e.op("DequantizeLinear", &ins, axis.map(|a| vec![("axis", Attr::Int(a))]).unwrap_or_default()))
}

/// `y` quantized with the scale and zero point at inputs `k`, `k + 1` of `n` into its output.
fn q_out(e: &mut Emit, n: &Node, y: &str, k: usize) -> Result<(), ImportError> {
    let (s, z) = (input(n, k)?, n.input(k + 1));
    quantize_to(e, y, s, z, &n.outputs[0]);
    Ok(())
}

fn quantize_to(e: &mut Emit, y: &str, scale: &str, zero: Option<&str>, out: &str) {
    let mut ins = vec![y, scale];
    if let Some(z) = zero {
        ins.push(z);
    }
    e.op_to("QuantizeLinear", &ins, &[out.to_string()], vec![]);
}

/// A weight B of a matrix product dequantized: per tensor, or per column (a 1-D scale of
/// B's last dim) for a 2-D B.
fn dq_weight(e: &mut Emit, n: &Node, b: &str, scale: &str, zero: Option<&str>) -> Result<String, ImportError> {
    let rank = e.rank(b).ok_or_else(|| bad(n, "the rank of B is not known"))?;
    let per_column = e.rank(scale).is_some_and(|r| r == 1) && e.len(scale).is_none_or(|l| l > 1);
    let mut ins = vec![b, scale];
    if let Some(z) = zero {
        ins.push(z);
    }
    let attrs = if per_column { vec![("axis", Attr::Int(rank as i64 - 1))] } else { vec![] };
    Ok(e.op("DequantizeLinear", &ins, attrs))
}

/// `a @ b (+ bias)` into the node's output.
fn matmul_bias(e: &mut Emit, n: &Node, a: &str, b: &str, bias: Option<&str>) -> Result<(), ImportError> {
    match bias {
        Some(c) => {
            let y = e.op("MatMul", &[a, b], vec![]);
            e.op_to("Add", &[&y, c], &n.outputs[..1], vec![]);
        }
        None => e.op_to("MatMul", &[a, b], &n.outputs[..1], vec![]),
    }
    Ok(())
}

/// `QGemm(A, a_scale, a_zp, B, b_scale, b_zp, C, y_scale, y_zp)`: `alpha · (A'B' + C')` with
/// the int32 bias C at scale a_scale · b_scale (added before alpha scales the sum, as ONNX
/// Runtime does: Gemm's beta is alpha), quantized when y_scale is given (f32 otherwise).
fn qgemm(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let a = dq(e, n, 0, None)?;
    let trans_b = n.int("transB", 0);
    // Per output channel: the columns of B, or its rows when B is transposed.
    let per_channel = e.len(input(n, 4)?).is_none_or(|l| l > 1) && e.rank(input(n, 4)?) == Some(1);
    let b_axis = per_channel.then_some(if trans_b != 0 { 0 } else { 1 });
    let b = dq(e, n, 3, b_axis)?;
    let mut ins = vec![a, b];
    if let Some(c) = n.input(6) {
        let scale = e.op("Mul", &[input(n, 1)?, input(n, 4)?], vec![]);
        let attrs = if per_channel { vec![("axis", Attr::Int(0))] } else { vec![] };
        ins.push(e.op("DequantizeLinear", &[c, &scale], attrs));
    }
    let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
    let alpha = n.float("alpha", 1.0);
    let attrs = vec![
        ("alpha", Attr::Float(alpha)),
        ("beta", Attr::Float(alpha)),
        ("transA", Attr::Int(n.int("transA", 0))),
        ("transB", Attr::Int(trans_b)),
    ];
    match n.input(7) {
        Some(ys) => {
            let y = e.op("Gemm", &refs, attrs);
            quantize_to(e, &y, ys, n.input(8), &n.outputs[0]);
        }
        None => e.op_to("Gemm", &refs, &n.outputs[..1], attrs),
    }
    Ok(())
}

/// `MatMulNBits(A, B, scales, zero_points?, g_idx?, bias?)`: `A · W + bias` where `W[k][n]`
/// is the `bits`-bit value `q` at position k of column n's blocks of `block_size` (packed
/// low bits first, `B` shaped `[N, blocks, block_size·bits/8]`), `(q − zero_point) · scale`
/// of its block (the block `g_idx[k]` when given, else `k / block_size`; zero points packed
/// like B or of the scales' type, `2^(bits−1)` without them). B, scales, zero points and
/// g_idx must be constants (other forms are import errors naming the node). With integer
/// zero points and blocks in order, the weight is a blocked `DequantizeLinear` of the codes;
/// otherwise it is dequantized here, once, into a constant of the scales' type.
fn matmul_nbits(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    use aim_ir::{DType, Tensor};
    let (k, cols, bits, block) = (n.int("K", 0), n.int("N", 0), n.int("bits", 4), n.int("block_size", 0));
    if k <= 0 || cols <= 0 || !(2..=8).contains(&bits) || block < 16 || (block & (block - 1)) != 0 {
        return Err(bad(n, format!("K={k}, N={cols}, bits={bits}, block_size={block}: K and N positive, bits 2 to 8, block_size a power of two from 16")));
    }
    let (k, cols, bits, block) = (k as usize, cols as usize, bits as usize, block as usize);
    let blocks = k.div_ceil(block);
    let blob = block * bits / 8;
    let constant = |e: &Emit, i: usize, what: &str| -> Result<Tensor, ImportError> {
        let name = input(n, i)?;
        e.constant(name).cloned().ok_or_else(|| bad(n, format!("{what} ('{name}') must be a constant")))
    };
    let b = constant(e, 1, "the packed weights B")?;
    if b.dtype() != DType::U8 || b.len() != cols * blocks * blob {
        return Err(bad(
            n,
            format!("B is {} of {} values, expected u8 [{cols}, {blocks}, {blob}]", b.dtype(), b.len()),
        ));
    }
    let scales = constant(e, 2, "the scales")?;
    let sdtype = scales.dtype();
    if !matches!(sdtype, DType::F32 | DType::F16) || scales.len() != cols * blocks {
        return Err(bad(
            n,
            format!("the scales are {sdtype} of {} values, expected f32 or f16 [{}]", scales.len(), cols * blocks),
        ));
    }
    let scale: Vec<f64> = scales.to_f64_vec();
    // Zero points: packed like B (u8), or one per block of the scales' type.
    let mut integer_zeros = true;
    let zero: Vec<f64> = match n.input(3) {
        None => vec![(1u32 << (bits - 1)) as f64; cols * blocks],
        Some(_) => {
            let z = constant(e, 3, "the zero points")?;
            let per_col = (blocks * bits).div_ceil(8);
            if z.dtype() == DType::U8 && z.len() == cols * per_col {
                let zb = z.bytes();
                (0..cols * blocks)
                    .map(|i| aim_ir::field(&zb[(i / blocks) * per_col..], i % blocks, bits) as f64)
                    .collect()
            } else if z.dtype() == sdtype && z.len() == cols * blocks {
                integer_zeros = false;
                z.to_f64_vec()
            } else {
                return Err(bad(
                    n,
                    format!(
                        "the zero points are {} of {} values: u8 packed [{}] or {sdtype} [{}] expected",
                        z.dtype(),
                        z.len(),
                        cols * per_col,
                        cols * blocks
                    ),
                ));
            }
        }
    };
    let g_idx: Option<Vec<usize>> = match n.input(4) {
        None => None,
        Some(_) => {
            let g = constant(e, 4, "g_idx")?;
            let v = g.to_f64_vec();
            if v.len() != k || v.iter().any(|&x| x < 0.0 || x as usize >= blocks) {
                return Err(bad(n, format!("g_idx must hold {k} block indices below {blocks}")));
            }
            Some(v.iter().map(|&x| x as usize).collect())
        }
    };
    let form = aim_ir::ColumnCodes { bits, block, k, n: cols };
    // Integer codes and zero points in blocks along K: the weight is a blocked
    // DequantizeLinear of the codes, one byte each (a quarter of f32's bytes), which the cpu
    // backend keeps at 4 bits where they fit (`passes::q4_weights`) and the others fold.
    if integer_zeros && g_idx.as_ref().is_none_or(|g| g.iter().enumerate().all(|(kk, &b)| b == kk / block)) {
        // [N, blocks] to [blocks, N].
        let t = |s: &[f64]| -> Vec<f64> { (0..blocks * cols).map(|i| s[(i % cols) * blocks + i / cols]).collect() };
        let scales = Tensor::from_f64(sdtype, &[blocks, cols], &t(&scale));
        let zeros = Tensor::from_vec(&[blocks, cols], t(&zero).iter().map(|&z| z as u8).collect::<Vec<u8>>());
        // The codes stay packed as the file holds them (`Tensor::from_column_codes`): the
        // cpu backend's 4-bit layout is made from those bytes directly, and the other
        // backends unpack them when they fold the weight.
        let codes = Tensor::from_column_codes(b, form).map_err(|err| bad(n, format!("B: {err}")))?;
        let (q, s, z) = (e.konst(codes), e.konst(scales), e.konst(zeros));
        // ONNX Runtime's accuracy_level (4: activations may be quantized to int8 per block)
        // travels with the dequantization, for the kernel that reads the codes.
        let mut attrs = vec![("axis", Attr::Int(0)), ("block_size", Attr::Int(block as i64))];
        if let Some(level) = n.opt_int("accuracy_level") {
            // Under the attribute's own name, which the compiler's 4-bit pass reads
            // (`aim_compiler::passes::coded_weights::ACCURACY_LEVEL`).
            attrs.push(("accuracy_level", Attr::Int(level)));
        }
        let wn = e.op("DequantizeLinear", &[&q, &s, &z], attrs);
        return matmul_bias(e, n, input(n, 0)?, &wn, n.input(5));
    }
    let codes = form.unpack_rows(b.bytes());
    let mut w = vec![0f32; k * cols];
    for c in 0..cols {
        for kk in 0..k {
            let q = codes[kk * cols + c] as f64;
            let g = g_idx.as_ref().map_or(kk / block, |g| g[kk]);
            w[kk * cols + c] = ((q - zero[c * blocks + g]) * scale[c * blocks + g]) as f32;
        }
    }
    let w = Tensor::from_vec(&[k, cols], w);
    let w = if sdtype == DType::F16 { aim_kernels::cast(&w, DType::F16) } else { w };
    let wn = e.konst(w);
    matmul_bias(e, n, input(n, 0)?, &wn, n.input(5))
}

/// `QLinearSoftmax(X, x_scale, x_zp, y_scale, y_zp)`: Softmax over `axis` between a
/// dequantization and a quantization. Its `opset` attribute names the Softmax it replaced;
/// before opset 13 that one flattened from `axis` on, which equals the later form only over
/// the last axis (other axes are an import error naming the node).
fn qlinear_softmax(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let x = dq(e, n, 0, None)?;
    let axis = n.int("axis", -1);
    if n.int("opset", 13) < 13 {
        let rank = e.rank(input(n, 0)?).ok_or_else(|| bad(n, "the rank of X is not known"))? as i64;
        if axis != -1 && axis != rank - 1 {
            return Err(bad(
                n,
                format!(
                    "softmax of opset < 13 over axis {axis} of a rank-{rank} input: only the last axis is supported"
                ),
            ));
        }
    }
    let y = e.op("Softmax", &[&x], vec![("axis", Attr::Int(axis))]);
    q_out(e, n, &y, 3)
}

/// `DynamicQuantizeLSTM(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale,
/// W_zero_point, R_scale, R_zero_point)`, as ONNX Runtime's `quantize_dynamic` writes an
/// LSTM: 8-bit W `[D, input, 4H]` and R `[D, H, 4H]` (transposed from LSTM's layout), with a
/// scale and zero point per direction or per direction and gate column. The node becomes
/// an ONNX LSTM with the same attributes and `dynamic_quantize=1`: W and R stay 8-bit,
/// transposed into LSTM's `[D, 4H, input]` / `[D, 4H, H]`, with their scales and zero
/// points as attributes (`w_scale`, `w_zero_point`, `r_scale`, `r_zero_point`). The LSTM
/// kernels then round X and every step's hidden state to u8 and multiply the integers
/// exactly, as ORT's kernel does (see `aim_kernels::qrecurrent`).
fn dynamic_quantize_lstm(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    use aim_ir::{DType, Tensor};
    let constant = |e: &Emit, i: usize, what: &str| -> Result<Tensor, ImportError> {
        let name = input(n, i)?;
        e.constant(name).cloned().ok_or_else(|| bad(n, format!("{what} ('{name}') must be a constant")))
    };
    let mut weights = Vec::new();
    let mut attrs: Vec<(&str, Attr)> = vec![("dynamic_quantize", Attr::Int(1))];
    for (k, what, scale_attr, zero_attr) in
        [(1usize, "W", "w_scale", "w_zero_point"), (2, "R", "r_scale", "r_zero_point")]
    {
        let q = constant(e, k, what)?;
        let scale = constant(e, 8 + 2 * (k - 1), &format!("{what}_scale"))?;
        let zero = constant(e, 9 + 2 * (k - 1), &format!("{what}_zero_point"))?;
        let s = q.shape().to_vec();
        if s.len() != 3 || !matches!(q.dtype(), DType::I8 | DType::U8) {
            return Err(bad(n, format!("{what} is {} {s:?}: 8-bit [directions, rows, 4·hidden] expected", q.dtype())));
        }
        if zero.dtype() != q.dtype() {
            return Err(bad(n, format!("{what}_zero_point is {}, {what} is {}", zero.dtype(), q.dtype())));
        }
        let (dirs, rows, cols) = (s[0], s[1], s[2]);
        for (t, name) in [(&scale, format!("{what}_scale")), (&zero, format!("{what}_zero_point"))] {
            if t.len() != dirs && t.len() != dirs * cols {
                return Err(bad(n, format!("{name} has {} values: {dirs} or {} expected", t.len(), dirs * cols)));
            }
        }
        if scale.dtype() != DType::F32 {
            return Err(bad(n, format!("{what}_scale is {}: f32 expected", scale.dtype())));
        }
        // [D, rows, cols] to [D, cols, rows], byte for byte.
        let v = q.bytes();
        let mut t = vec![0u8; v.len()];
        for d in 0..dirs {
            for r in 0..rows {
                for c in 0..cols {
                    t[(d * cols + c) * rows + r] = v[(d * rows + r) * cols + c];
                }
            }
        }
        let transposed =
            Tensor::from_bytes(q.dtype(), &[dirs, cols, rows], &t).map_err(|e| bad(n, format!("{what}: {e}")))?;
        weights.push(e.konst(transposed));
        attrs.push((scale_attr, Attr::Floats(scale.data::<f32>().to_vec())));
        attrs.push((zero_attr, Attr::Ints(zero.to_i64_vec())));
    }
    let mut ins: Vec<&str> = vec![input(n, 0)?, &weights[0], &weights[1]];
    ins.extend((3..8).map(|i| n.input(i).unwrap_or("")));
    while ins.last() == Some(&"") {
        ins.pop();
    }
    attrs.extend(
        ["activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "input_forget"]
            .into_iter()
            .filter_map(|k| n.attrs.get(k).map(|v| (k, v.clone()))),
    );
    e.op_to("LSTM", &ins, &n.outputs, attrs);
    Ok(())
}

/// `QAttention(input, weight, bias, input_scale, weight_scale, mask_index, input_zero_point,
/// weight_zero_point, past)`: `Attention` of the dequantized input and weight (per tensor,
/// or per column of the packed QKV weight). ONNX Runtime sums the projection in integers and
/// scales it once; the product of the dequantized values is that sum up to f32 rounding
/// (and exact where the integer passes run it on the integer kernels).
fn q_attention(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    if n.input(8).is_some() {
        return Err(bad(n, "the past input is not supported"));
    }
    let wq = input(n, 1)?;
    let width = match e.constant(wq).map(|t| t.shape().to_vec()) {
        Some(s) if s.len() == 2 => s[1],
        _ => return Err(bad(n, "the weights must be a constant [hidden, 3·hidden] matrix")),
    };
    let mut xs = vec![input(n, 0)?, input(n, 3)?];
    xs.extend(n.input(6));
    let x = e.op("DequantizeLinear", &xs, vec![]);
    let w = dq_weight(e, n, wq, input(n, 4)?, n.input(7))?;
    let ins = AttentionInputs { x: &x, w: &w, width, bias: n.input(2), mask: n.input(5), bias_scores: None };
    attention_with(e, n, &ins)
}

/// `QEmbedLayerNormalization(input_ids, segment_ids, word, position, segment, gamma, beta,
/// mask, then the scales and the zero points of the five)`: `EmbedLayerNormalization` whose
/// tables stay bytes — each row gathered, then dequantized (with the table's scale, per
/// tensor or per column) — and whose gamma and beta are dequantized (constants, folded).
fn q_embed_layer_norm(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    // Scale and zero point of quantized input k (2..=6) at k + 6 and k + 11.
    let params = |k: usize| -> Result<(String, Option<String>), ImportError> {
        Ok((input(n, k + 6)?.to_string(), n.input(k + 11).map(str::to_string)))
    };
    let mut lookup: Vec<(String, String, Option<String>)> = Vec::new();
    let mut tables = [String::new(), String::new(), String::new()];
    for (slot, k) in [2usize, 3, 4].into_iter().enumerate() {
        let Some(t) = n.input(k) else {
            if k == 4 {
                continue;
            }
            return Err(bad(n, format!("input {k} (an embedding table) is missing")));
        };
        let (scale, zero) = params(k)?;
        tables[slot] = t.to_string();
        lookup.push((t.to_string(), scale, zero));
    }
    let dq_const = |e: &mut Emit, k: usize| -> Result<String, ImportError> {
        let (scale, zero) = params(k)?;
        let mut ins = vec![input(n, k)?, scale.as_str()];
        ins.extend(zero.as_deref());
        Ok(e.op("DequantizeLinear", &ins, vec![]))
    };
    let (gamma, beta) = (dq_const(e, 5)?, dq_const(e, 6)?);
    let ins = EmbedInputs { tables, gamma, beta, mask: n.input(7).map(str::to_string), positions: None };
    let gather = |e: &mut Emit, table: &str, ids: &str| -> Result<String, ImportError> {
        let (_, scale, zero) =
            lookup.iter().find(|(t, _, _)| t == table).ok_or_else(|| bad(n, format!("no table {table}")))?;
        let rows = e.op("Gather", &[table, ids], vec![]);
        let per_column = e.rank(scale).is_some_and(|r| r == 1) && e.len(scale).is_none_or(|l| l > 1);
        let mut ins = vec![rows.as_str(), scale.as_str()];
        ins.extend(zero.as_deref());
        let attrs = if per_column { vec![("axis", Attr::Int(-1))] } else { vec![] };
        Ok(e.op("DequantizeLinear", &ins, attrs))
    };
    embed_layer_norm_with(e, n, &ins, &gather)
}
