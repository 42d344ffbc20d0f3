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
DynamicQuantizeMatMul quantizes A as DynamicQuantizeLinear does (u8, range including 0).
"""
import numpy as np
from onnx import numpy_helper

SUPPORTED = {"QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "DynamicQuantizeLinear"}


def exact_outputs(model, feeds):
    """Outputs of `model` (an onnx.ModelProto) for `feeds`, computed exactly, or None when the
    graph has an op this oracle does not implement."""
    if any(n.op_type not in SUPPORTED for n in model.graph.node):
        return None
    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env.update(feeds)
    for node in model.graph.node:
        ins = [env[i] if i else None for i in node.input]
        attrs = {a.name: (a.f if a.type == a.FLOAT else a.i) for a in node.attribute}
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


OPS = {
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
