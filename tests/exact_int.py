"""Exact integer arithmetic (numpy int64) for the quantized matrix products, as an oracle
where ONNX Runtime is not exact.

ORT's u8 x s8 GEMM on x86-64 without AVX-512 VNNI / AVX-VNNI sums pairs of products with
`vpmaddubsw`, which saturates at 16 bits: with weights that use the whole s8 range
(|w| near 127 and activations near 255) a pair sum overflows and ORT's output is off by
many quanta. aim's kernels are exact. compare_ort.py asks `exact_outputs` for models made
only of the ops below; where ORT's outputs disagree with the exact ones, aim is compared
with the exact outputs instead, and the test says so.

Semantics follow ONNX Runtime's contrib-op documentation: QGemm computes
`alpha * a_scale * b_scale * ((A - a_zp)(B - b_zp) + C)` (C an int32 bias at scale
a_scale * b_scale), requantized to y_scale / y_zero_point when they are given;
DynamicQuantizeMatMul quantizes A as DynamicQuantizeLinear does (u8, range including 0);
DynamicQuantizeLSTM quantizes X the same way over the whole sequence and each step's hidden
state over the batch. `with_exact_products` instead makes ORT itself exact on a whole graph
(its MatMulInteger nodes computed in float64), for graphs with ops this oracle lacks.
"""
import numpy as np
from onnx import numpy_helper

SUPPORTED = {"QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "DynamicQuantizeLinear",
             "DynamicQuantizeLSTM", "QLinearConv", "QLinearMatMul", "ConvInteger"}


def exact_outputs(model, feeds):
    """Outputs of `model` (an onnx.ModelProto) for `feeds`, computed exactly, or None when the
    graph has an op this oracle does not implement."""
    if any(n.op_type not in SUPPORTED for n in model.graph.node):
        return None
    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env.update(feeds)
    for node in model.graph.node:
        ins = [env[i] if i else None for i in node.input]
        attrs = {a.name: (a.f if a.type == a.FLOAT else a.s if a.type == a.STRING else a.i) for a in node.attribute}
        for name, value in zip(node.output, OPS[node.op_type](ins, attrs)):
            env[name] = value
    return {o.name: env[o.name] for o in model.graph.output}


def _int(a):
    return np.asarray(a).astype(np.int64)


def _zero_point(zp, cols):
    """A zero point as an int64 row over the product's columns (per tensor or per column)."""
    z = np.zeros(1, np.int64) if zp is None else _int(zp).reshape(-1)
    return np.broadcast_to(z, (cols,)) if z.size == 1 else z


def _acc(a, za, b, zb):
    """(A - za)(B - zb) in int64; `zb` per tensor or per column of B."""
    a64 = _int(a) - _int(0 if za is None else za)
    return a64 @ (_int(b) - _zero_point(zb, b.shape[-1]))


def _requantize(y, scale, zp, dtype):
    info = np.iinfo(dtype)
    q = np.rint(y / np.float64(scale)) + int(zp if zp is not None else 0)
    return np.clip(q, info.min, info.max).astype(dtype)


def _qgemm(ins, attrs):
    a, sa, za, b, sb, zb = ins[:6]
    c = ins[6] if len(ins) > 6 else None
    sy = ins[7] if len(ins) > 7 else None
    zy = ins[8] if len(ins) > 8 else None
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    acc = _acc(a, za, b, zb)
    if c is not None:
        acc = acc + _int(c)
    scale = np.float64(attrs.get("alpha", 1.0)) * np.float64(sa) * np.asarray(sb, np.float64).reshape(-1)
    y = acc * scale
    if sy is None:
        return [y.astype(np.float32)]
    return [_requantize(y, sy, zy, zy.dtype if zy is not None else np.uint8)]


def _dynamic_quantize(x):
    """DynamicQuantizeLinear: u8, the range widened to include 0."""
    x = np.asarray(x, np.float32)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
    zp = np.uint8(np.clip(np.rint(-lo / scale), 0, 255))
    q = np.clip(np.rint(x / scale) + int(zp), 0, 255).astype(np.uint8)
    return q, scale, zp


def _dynamic_quantize_matmul(ins, attrs):
    x, b, sb, zb = ins[:4]
    bias = ins[4] if len(ins) > 4 else None
    q, sx, zx = _dynamic_quantize(x)
    y = _acc(q, zx, b, zb) * (np.float64(sx) * np.asarray(sb, np.float64).reshape(-1))
    return [(y + (0 if bias is None else bias)).astype(np.float32)]


def _matmul_integer_to_float(ins, attrs):
    a, b, sa, sb = ins[:4]
    za = ins[4] if len(ins) > 4 else None
    zb = ins[5] if len(ins) > 5 else None
    bias = ins[6] if len(ins) > 6 else None
    y = _acc(a, za, b, zb) * (np.float64(sa) * np.asarray(sb, np.float64).reshape(-1))
    return [(y + (0 if bias is None else bias)).astype(np.float32)]


def _matmul_integer(ins, attrs):
    a, b = ins[:2]
    za = ins[2] if len(ins) > 2 else None
    zb = ins[3] if len(ins) > 3 else None
    return [_acc(a, za, b, zb).astype(np.int32)]


def _dynamic_quantize_linear(ins, attrs):
    return list(_dynamic_quantize(ins[0]))


def _dynamic_quantize_lstm(ins, attrs):
    """com.microsoft DynamicQuantizeLSTM (ONNX LSTM, gates i, o, f, c) with its integer
    products exact and the rest in f32, as ONNX Runtime computes it (in f64 a hidden state
    that lands near a quantization step rounds the other way, and a recurrent model carries
    that on: 1e-2 of difference at the output of a real model, where f32 gives 5e-4): X
    quantized as DynamicQuantizeLinear does, over the whole sequence; each
    step's hidden state the same way, over the batch of one direction; W `[D, input, 4H]`
    and R `[D, H, 4H]` s8/u8 with their zero points and scales (per column or per
    direction). Sequence lengths, peepholes and clipping are not modelled (None refuses)."""
    x, w, r, b, lens, h0, c0, p, ws, wz, rs, rz = (ins + [None] * 12)[:12]
    if lens is not None or p is not None or "clip" in attrs:
        raise NotImplementedError("DynamicQuantizeLSTM oracle: sequence_lens, peepholes, clip")
    seq, batch, _ = x.shape
    dirs, hidden = w.shape[0], r.shape[1]
    g4 = 4 * hidden
    xq, sx, zx = _dynamic_quantize(x)
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))
    y = np.zeros((seq, dirs, batch, hidden), np.float64)
    yh = np.zeros((dirs, batch, hidden), np.float64)
    yc = np.zeros((dirs, batch, hidden), np.float64)

    def per_column(v, d):
        v = np.asarray(v).reshape(dirs, -1)[d] if np.asarray(v).size > 1 else np.asarray(v).reshape(-1)
        return np.broadcast_to(v, (g4,))

    for d in range(dirs):
        wsd, rsd = per_column(ws, d).astype(np.float64), per_column(rs, d).astype(np.float64)
        wzd, rzd = per_column(wz, d).astype(np.int64), per_column(rz, d).astype(np.int64)
        wd, rd = _int(w[d]) - wzd, _int(r[d]) - rzd
        bias = np.zeros(g4) if b is None else (b[d][:g4].astype(np.float64) + b[d][g4:].astype(np.float64))
        h = np.zeros((batch, hidden)) if h0 is None else h0[d].astype(np.float32)
        c = np.zeros((batch, hidden)) if c0 is None else c0[d].astype(np.float64)
        steps = range(seq - 1, -1, -1) if d == 1 or attrs.get("direction") == b"reverse" else range(seq)
        for t in steps:
            hq, sh, zh = _dynamic_quantize(np.asarray(h, np.float32))
            gx = (((_int(xq[t]) - int(zx)) @ wd).astype(np.float32) * (np.float32(sx) * wsd.astype(np.float32)))
            gh = (((_int(hq) - int(zh)) @ rd).astype(np.float32) * (np.float32(sh) * rsd.astype(np.float32)))
            g = (gx + gh + bias.astype(np.float32)).astype(np.float32)
            i, o, f, cc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = (sig(f) * c.astype(np.float32) + sig(i) * np.tanh(cc)).astype(np.float32)
            h = (sig(o) * np.tanh(c)).astype(np.float32)
            y[t, d] = h
        yh[d], yc[d] = h, c
    return [y.astype(np.float32), yh.astype(np.float32), yc.astype(np.float32)]


def _windows(x, kernel, strides, dilations, pads):
    """im2col of `x` [N, C, *spatial] (int64, the zero point already subtracted, so the
    padding is zeros): [N, C, *out, *kernel]."""
    rank = len(kernel)
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + rank]) for i in range(rank)])
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    w = np.lib.stride_tricks.sliding_window_view(x, span, axis=tuple(range(2, 2 + rank)))
    picks = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides) + tuple(
        slice(None, None, d) for d in dilations)
    return w[picks]


def _conv_acc(x, zx, w, zw, attrs):
    """Σ (x − zx)(w − zw) of a convolution (ONNX Conv attributes, groups included), in int64."""
    rank = w.ndim - 2
    kernel = list(attrs.get("kernel_shape") or w.shape[2:])
    strides = list(attrs.get("strides") or [1] * rank)
    dilations = list(attrs.get("dilations") or [1] * rank)
    pads = list(attrs.get("pads") or [0] * (2 * rank))
    auto = attrs.get("auto_pad", b"NOTSET")
    if auto not in (b"NOTSET", b"VALID"):
        # SAME_UPPER / SAME_LOWER: the output is ceil(in / stride), the extra pad at the end
        # (upper) or the start (lower).
        pads = [0] * (2 * rank)
        for i in range(rank):
            out = -(-x.shape[2 + i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - x.shape[2 + i])
            lo = total // 2 if auto == b"SAME_UPPER" else total - total // 2
            pads[i], pads[i + rank] = lo, total - lo
    groups = int(attrs.get("group", 1))
    xs = _int(x) - _int(zx)
    ws = _int(w) - _zero_point(zw, w.shape[0]).reshape((-1,) + (1,) * (w.ndim - 1))
    cin, cout = w.shape[1], w.shape[0] // groups
    outs = []
    for g in range(groups):
        win = _windows(xs[:, g * cin:(g + 1) * cin], kernel, strides, dilations, pads)
        # [N, cin, *out, *k] · [cout, cin, *k] → [N, cout, *out]
        flat = np.moveaxis(win, 1, 1 + rank).reshape(win.shape[0], *win.shape[2:2 + rank], -1)
        outs.append(np.moveaxis(flat @ ws[g * cout:(g + 1) * cout].reshape(cout, -1).T, -1, 1))
    return np.concatenate(outs, axis=1)


def _requantize_f32(acc, scale, zp):
    """ONNX Runtime's requantization of int32 sums: the combined scale in f32, the product
    rounded half to even, the zero point added, clamped to the zero point's type."""
    dtype = zp.dtype if zp is not None else np.uint8
    info = np.iinfo(dtype)
    shape = (1, -1) + (1,) * (acc.ndim - 2) if np.asarray(scale).size > 1 else ()
    y = np.rint(acc.astype(np.float32) * np.asarray(scale, np.float32).reshape(shape))
    return np.clip(y + int(zp if zp is not None else 0), info.min, info.max).astype(dtype)


def _qlinear_conv(ins, attrs):
    x, sx, zx, w, sw, zw, sy, zy = ins[:8]
    bias = ins[8] if len(ins) > 8 else None
    acc = _conv_acc(x, zx, w, zw, attrs)
    if bias is not None:
        acc = acc + _int(bias).reshape(1, -1, *([1] * (acc.ndim - 2)))
    scale = np.float32(sx) * np.asarray(sw, np.float32).reshape(-1) / np.float32(sy)
    return [_requantize_f32(acc, scale, zy)]


def _qlinear_matmul(ins, attrs):
    a, sa, za, b, sb, zb, sy, zy = ins[:8]
    acc = _acc(a, za, b, zb)
    scale = np.float32(sa) * np.asarray(sb, np.float32).reshape(-1) / np.float32(sy)
    y = np.rint(acc.astype(np.float32) * scale)
    info = np.iinfo(zy.dtype)
    return [np.clip(y + int(zy), info.min, info.max).astype(zy.dtype)]


def _conv_integer(ins, attrs):
    x, w = ins[:2]
    zx = ins[2] if len(ins) > 2 else None
    zw = ins[3] if len(ins) > 3 else None
    return [_conv_acc(x, 0 if zx is None else zx, w, zw, attrs).astype(np.int32)]


OPS = {
    "QLinearConv": _qlinear_conv,
    "QLinearMatMul": _qlinear_matmul,
    "ConvInteger": _conv_integer,
    "DynamicQuantizeLSTM": _dynamic_quantize_lstm,
    "QGemm": _qgemm,
    "DynamicQuantizeMatMul": _dynamic_quantize_matmul,
    "MatMulIntegerToFloat": _matmul_integer_to_float,
    "MatMulInteger": _matmul_integer,
    "DynamicQuantizeLinear": _dynamic_quantize_linear,
}


def with_exact_products(model):
    """A copy of `model` (an onnx.ModelProto) whose MatMulInteger nodes compute in float64
    (the operands and zero points cast, subtracted, multiplied, the sums cast back to
    int32): exact for any depth under 2**53 / 255**2, so ONNX Runtime running the copy is an
    exact oracle for a whole quantized graph — every other op runs as ORT runs it."""
    import onnx
    from onnx import helper, TensorProto

    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = []
    for i, n in enumerate(m.graph.node):
        if n.op_type != "MatMulInteger" or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        p = f"__exact{i}_"
        ins = list(n.input) + [""] * (4 - len(n.input))
        side = []
        for k, (x, z) in enumerate([(ins[0], ins[2]), (ins[1], ins[3])]):
            nodes.append(helper.make_node("Cast", [x], [p + f"x{k}"], to=TensorProto.DOUBLE))
            if z:
                nodes.append(helper.make_node("Cast", [z], [p + f"z{k}"], to=TensorProto.DOUBLE))
                nodes.append(helper.make_node("Sub", [p + f"x{k}", p + f"z{k}"], [p + f"c{k}"]))
                side.append(p + f"c{k}")
            else:
                side.append(p + f"x{k}")
        nodes.append(helper.make_node("MatMul", side, [p + "y"]))
        nodes.append(helper.make_node("Cast", [p + "y"], list(n.output), to=TensorProto.INT32))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.checker.check_model(m)
    return m


def exact_reference(model, feeds):
    """Outputs of `model` (an onnx.ModelProto) for `feeds` with every integer product exact:
    the ops of `OPS` computed here in int64, every other node run alone by ONNX Runtime
    (one single-node session each, no graph optimisation), so that a whole quantized model
    has an exact oracle on a CPU where ORT's own u8 x s8 products saturate. None for a
    graph with subgraphs (If, Loop, Scan), which this does not walk."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    if any(a.type in (a.GRAPH, a.GRAPHS) for n in model.graph.node for a in n.attribute):
        return None
    types = {}
    inferred = onnx.shape_inference.infer_shapes(model)
    for v in list(inferred.graph.value_info) + list(inferred.graph.output):
        types[v.name] = v.type.tensor_type.elem_type
    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env.update(feeds)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    for node in model.graph.node:
        if node.op_type in OPS:
            ins = [env[i] if i else None for i in node.input]
            attrs = {a.name: (a.f if a.type == a.FLOAT else a.s if a.type == a.STRING
                              else list(a.ints) if a.type == a.INTS else a.i) for a in node.attribute}
            for name, value in zip(node.output, OPS[node.op_type](ins, attrs)):
                env[name] = value
            continue
        names = [i for i in dict.fromkeys(node.input) if i]
        inputs = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(np.asarray(env[i]).dtype),
                                                np.asarray(env[i]).shape) for i in names]
        # An output whose type inference does not know (contrib ops) is left untyped:
        # ORT infers it from the op's own schema.
        outputs = [helper.make_tensor_value_info(o, types[o], None) if types.get(o)
                   else helper.make_empty_tensor_value_info(o) for o in node.output if o]
        one = helper.make_model(helper.make_graph([node], "node", inputs, outputs),
                                opset_imports=model.opset_import, ir_version=model.ir_version)
        s = ort.InferenceSession(one.SerializeToString(), options, providers=["CPUExecutionProvider"])
        got = s.run(None, {i: np.asarray(env[i]) for i in names})
        env.update(zip([o for o in node.output if o], got))
    return {o.name: env[o.name] for o in model.graph.output}
