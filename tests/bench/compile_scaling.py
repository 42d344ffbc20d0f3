#!/usr/bin/env python3
"""Compile time against model size: aim's load + compile and ONNX Runtime's session creation
for 1x, 4x and 16x a repeated block (a transformer layer and a conv/BN/Relu block).

Usage: compile_scaling.py AIM_BINARY [--rounds R]

Builds the models with tests/models/make_models.py's builders into a temporary directory
and prints one line per model: nodes, aim ms, ORT ms, and ms per node for each. Linear
compile time shows as a flat ms-per-node column.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import make_models as mm  # noqa: E402


def conv_stack(blocks):
    g = mm.G(5)
    x = "input"
    for _ in range(blocks):
        x = mm.conv_bn(g, x, 32, 32, 3)
    ins = [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [1, 32, 28, 28])]
    outs = [onnx.helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [1, 32, 28, 28])]
    return g.model(f"conv_x{blocks}", ins, outs)


def median(xs):
    return float(np.median(xs))


def main():
    args = sys.argv[1:]
    rounds = 3
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    aim = args[0]
    print(f"{'model':14s} {'nodes':>6s} {'aim ms':>8s} {'ORT ms':>8s} {'aim us/node':>12s} {'ORT us/node':>12s}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("bert", "conv"):
            for reps in (1, 4, 16):
                m = (mm.bert(layers=reps, hidden=128, heads=4, ffn=512, seq=64, vocab=1000) if kind == "bert"
                     else conv_stack(reps))
                path = os.path.join(tmp, f"{kind}_x{reps}.onnx")
                onnx.save(m, path)
                aim_ms, ort_ms = [], []
                for _ in range(rounds):
                    out = subprocess.run([aim, "bench", path, "--iters", "1", "--warmup", "0", "--threads", "1",
                                          "--json"], check=True, capture_output=True, text=True).stdout
                    aim_ms.append(json.loads(out.strip().splitlines()[-1])["compile_ms"])
                    so = ort.SessionOptions()
                    so.intra_op_num_threads = 1
                    t = time.perf_counter()
                    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
                    ort_ms.append((time.perf_counter() - t) * 1e3)
                n = len(m.graph.node)
                a, o = median(aim_ms), median(ort_ms)
                print(f"{kind + '_x' + str(reps):14s} {n:6d} {a:8.1f} {o:8.1f} {1e3 * a / n:12.1f} {1e3 * o / n:12.1f}")


if __name__ == "__main__":
    main()
