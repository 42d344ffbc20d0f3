#!/usr/bin/env python3
"""Build the memory-check models of issue-sized transformers with the project's generator.

Usage: large_models.py OUT_DIR

Writes OUT_DIR/bert_base.onnx (12 layers, hidden 768, 12 heads, ffn 3072, vocab 30522,
sequence 128: about 440 MB of weights) and OUT_DIR/gpt2_small.onnx (a GPT-2-small-sized
decoder step: 12 layers, hidden 768, 12 heads, vocab 50257, past length 7), each with its
.inputs.npz. Then compare peak memory and latency with ONNX Runtime:

  python3 tests/bench/side_by_side.py target/release/aim OUT_DIR bert_base gpt2_small --iters 5
"""
import os
import sys

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import make_models as mm  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    seq = 128
    mask = np.ones((1, seq), np.int64)
    mask[0, 100:] = 0
    ids = rng.integers(0, 30522, (1, seq)).astype(np.int64)
    gpt_in = {"input_ids": rng.integers(0, 50257, (1, 1)).astype(np.int64)}
    for layer in range(12):
        for kind in ("key", "value"):
            gpt_in[f"past_{kind}_{layer}"] = rng.standard_normal((1, 12, 7, 64)).astype(np.float32)
    models = {
        "bert_base": (mm.bert(layers=12, hidden=768, heads=12, ffn=3072, seq=seq), {"input_ids": ids,
                                                                                   "attention_mask": mask}),
        "gpt2_small": (mm.gpt2_step(layers=12, hidden=768, heads=12, vocab=50257), gpt_in),
    }
    past31 = {k: (rng.standard_normal((1, 12, 31, 64)).astype(np.float32) if k.startswith("past") else v)
              for k, v in gpt_in.items()}
    models["gpt2_small_int4"] = (int4(models["gpt2_small"][0]), past31)
    for name, (m, feeds) in models.items():
        onnx.save(m, os.path.join(out, f"{name}.onnx"))
        np.savez(os.path.join(out, f"{name}.inputs.npz"), **feeds)
        print(f"{name}: {sum(t.raw_data.__len__() or np.prod(t.dims) * 4 for t in m.graph.initializer) / 2**20:.0f} MiB "
              "of weights")


def int4(m):
    """`m` with its MatMul weights made 4-bit by ONNX Runtime's MatMulNBitsQuantizer."""
    import copy
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    q = MatMulNBitsQuantizer(copy.deepcopy(m), bits=4, block_size=32, is_symmetric=True, accuracy_level=4)
    q.process()
    return q.model.model


if __name__ == "__main__":
    main()
