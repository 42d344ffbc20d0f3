#!/usr/bin/env python3
"""One-kernel models for measuring a single kernel against ONNX Runtime and OpenVINO.

Usage: kernel_models.py OUT_DIR

Writes NAME.onnx and NAME.inputs.npz (seeded) for:
- att128, att384: one multi-head self-attention layer as torch.onnx writes it for BERT
  (Q, K, V of [1, S, heads, head dim] split into heads by transposes, K straight to
  [.., head dim, S], the scores divided by sqrt(head dim) and masked, softmax, the product
  with V, the heads merged back): S 128 with 12 heads of 32 (all-MiniLM-L6's shape) and
  S 384 with 12 heads of 64 (BERT-base at 384 tokens);
- dense384, dense1536: six pairs of dense layers on 128 rows of 384 features, out to 384
  or 1536 features and back (BERT's attention projections and feed-forward shapes).

Then, e.g.: side_by_side.py target/release/aim OUT_DIR att128 dense384 --threads 1,2,
or `aim bench OUT_DIR/att128.onnx --inputs OUT_DIR/att128.inputs.npz`. Needs: onnx, numpy.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(out, name, graph, inputs):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, f"{name}.onnx"))
    np.savez(os.path.join(out, f"{name}.inputs.npz"), **inputs)


def attention(out, name, s, heads, d, rng):
    nodes = [
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["s"]),
        helper.make_node("Div", ["s", "c"], ["sd"]),
        helper.make_node("Add", ["sd", "m"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vt"], ["o"]),
        helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3]),
    ]
    shape = [1, s, heads, d]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
        + [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, 1, s])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "c")],
    )
    mask = np.zeros((1, 1, 1, s), np.float32)
    mask[..., s - s // 8:] = -10000.0  # padding tokens, as BERT's extended mask writes them
    inputs = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    save(out, name, graph, {**inputs, "m": mask})


def dense(out, name, rows, k, n, layers, rng):
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits += [
            numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype(np.float32), f"w{i}"),
            numpy_helper.from_array((rng.standard_normal(n) * 0.05).astype(np.float32), f"b{i}"),
            numpy_helper.from_array((rng.standard_normal((n, k)) * 0.05).astype(np.float32), f"v{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("MatMul", [f"a{i}", f"v{i}"], [f"y{i}"]),
        ]
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, rows, k])],
        inits,
    )
    save(out, name, graph, {"x": rng.standard_normal((1, rows, k)).astype(np.float32)})


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    attention(out, "att128", 128, 12, 32, rng)
    attention(out, "att384", 384, 12, 64, rng)
    dense(out, "dense384", 128, 384, 384, 6, rng)
    dense(out, "dense1536", 128, 384, 1536, 6, rng)
    print(f"wrote att128, att384, dense384, dense1536 to {out}")


if __name__ == "__main__":
    main()
