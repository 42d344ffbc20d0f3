#!/usr/bin/env python3
"""Build the memory-check models of issue-sized transformers with the project's generator.

Usage: large_models.py OUT_DIR [NAME...]

Writes OUT_DIR/bert_base.onnx (12 layers, hidden 768, 12 heads, ffn 3072, vocab 30522,
sequence 128: about 440 MB of weights) and OUT_DIR/gpt2_small.onnx (a GPT-2-small-sized
decoder step: 12 layers, hidden 768, 12 heads, vocab 50257, past length 7), each with its
.inputs.npz; gpt2_small_int4 (its MatMuls made 4-bit by ORT's MatMulNBitsQuantizer, past 31);
and llm05b_int4 / llm05b_int4_tied: a ~0.5B-parameter decoder as onnxruntime-genai's model
builder writes one at int4 (hidden 896, 24 layers, 14 query and 2 key/value heads of 64,
intermediate 4864, vocabulary 32000; MatMulNBits 4-bit block 32 accuracy level 4,
GroupQueryAttention with rotary embedding, SkipSimplifiedLayerNormalization; tied: the
embeddings gathered from the output projection's codes), each written once with three input
sets beside links to it: _prefill128 (a 128-token prompt), _decode128 and _decode1024 (one
token after 128 or 1024 cached). With NAMEs, only those models. Then compare peak memory and
latency with ONNX Runtime:

  python3 tests/bench/side_by_side.py target/release/aim OUT_DIR bert_base gpt2_small --iters 5
"""
import os
import sys

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import make_models as mm  # noqa: E402


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    out, only = sys.argv[1], set(sys.argv[2:])
    os.makedirs(out, exist_ok=True)
    for tied in (False, True):
        name = "llm05b_int4" + ("_tied" if tied else "")
        if name in only:
            llm(out, name, tied)
    if only - {"llm05b_int4", "llm05b_int4_tied"}:
        sys.exit(f"unknown models: {sorted(only - {'llm05b_int4', 'llm05b_int4_tied'})}")
    if only:
        return
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


LLM = dict(layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64, ffn=4864, vocab=32000, max_pos=4096)


def llm(out, name, tied):
    """Writes OUT/NAME.onnx (the ~0.5B genai-form decoder at int4) and its input sets."""
    m = mm.genai_int4(mm.genai_decoder(tied=tied, name=name, **LLM))
    onnx.save(m, os.path.join(out, f"{name}.onnx"))
    rng = np.random.default_rng(7)
    shape = dict(layers=LLM["layers"], kv_heads=LLM["kv_heads"], head_dim=LLM["head_dim"], vocab=LLM["vocab"])
    for suffix, past, seq in [("prefill128", 0, 128), ("decode128", 128, 1), ("decode1024", 1024, 1)]:
        np.savez(os.path.join(out, f"{name}_{suffix}.inputs.npz"), **mm.genai_inputs(rng, past=past, seq=seq, **shape))
        link = os.path.join(out, f"{name}_{suffix}.onnx")
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(f"{name}.onnx", link)
    weights = sum(len(t.raw_data) for t in m.graph.initializer)
    print(f"{name}: {weights / 2**20:.0f} MiB of initializers")


def int4(m):
    """`m` with its MatMul weights made 4-bit by ONNX Runtime's MatMulNBitsQuantizer."""
    import copy
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    q = MatMulNBitsQuantizer(copy.deepcopy(m), bits=4, block_size=32, is_symmetric=True, accuracy_level=4)
    q.process()
    return q.model.model


if __name__ == "__main__":
    main()
