#!/usr/bin/env python3
"""aim's cuda backend against ONNX Runtime's CUDA execution provider, same GPU, same run.

Usage: gpu.py AIM_BINARY MODELS_DIR [--iters N]

Needs an NVIDIA GPU with its driver, and: pip install onnxruntime-gpu onnx numpy
(onnxruntime-gpu brings its own CUDA and cuDNN libraries from PyPI: nvidia-*-cu12).

Prints one table: for resnet50, mobilenetv2 and bert_l6 at batch 1 and 8, median latency of
ORT CUDA and aim --backend cuda, with f32 arithmetic and with TF32 tensor cores allowed for
both (ORT's `use_tf32` provider option, aim's --allow-tf32), and the half-precision
versions of the models (NAME_f16: ORT's f16 kernels; aim keeps the weights f16 and
multiplies on f16 tensor cores with f32 sums and activations); then a 4096x4096x4096
MatMul (ORT runs it with cuBLAS) against aim's generated GEMM, in TFLOP/s, f32, TF32 and
f16. Each measurement is a fresh process; the models at batch 8 are the batch-1 files with
their batch dims rewritten (inputs tiled).
"""
import json
import os
import subprocess
import sys
import tempfile

ORT_CHILD = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
path, inputs, tf32, iters = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
feeds = dict(np.load(inputs))
s = ort.InferenceSession(path, providers=[("CUDAExecutionProvider", {"use_tf32": int(tf32)})])
assert s.get_providers()[0] == "CUDAExecutionProvider", s.get_providers()
for _ in range(max(3, iters // 10)):
    s.run(None, feeds)
ts = []
for _ in range(iters):
    t = time.perf_counter()
    s.run(None, feeds)
    ts.append((time.perf_counter() - t) * 1e3)
ts.sort()
print(json.dumps({"median": ts[len(ts) // 2]}))
"""


def ort_ms(model, inputs, tf32, iters):
    out = subprocess.run([sys.executable, "-c", ORT_CHILD, model, inputs, "1" if tf32 else "0", str(iters)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median"]


def aim_ms(aim, model, inputs, tf32, iters):
    cmd = [aim, "bench", model, "--backend", "cuda", "--inputs", inputs, "--iters", str(iters),
           "--warmup", str(max(3, iters // 10)), "--json"] + (["--allow-tf32"] if tf32 else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"
    return json.loads(r.stdout.strip().splitlines()[-1])["latency_ms"]["median"], None


def batched(src, inputs, batch, tmp):
    """The model and its inputs with every batch dim (dim 0 of inputs and outputs) = batch."""
    import numpy as np
    import onnx
    m = onnx.load(src)
    for v in list(m.graph.input) + list(m.graph.output):
        d = v.type.tensor_type.shape.dim
        if d:
            d[0].ClearField("dim_param")
            d[0].dim_value = batch
    name = os.path.basename(src).replace(".onnx", f"_b{batch}")
    path, feeds = os.path.join(tmp, name + ".onnx"), os.path.join(tmp, name + ".inputs.npz")
    onnx.save(m, path)
    np.savez(feeds, **{k: np.concatenate([v] * batch) for k, v in np.load(inputs).items()})
    return path, feeds


def matmul_model(n, tmp, half=False):
    """Y = A @ W with a constant W, in f32 (or f16: a half model)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    dt, ty = (np.float16, TensorProto.FLOAT16) if half else (np.float32, TensorProto.FLOAT)
    w = numpy_helper.from_array(rng.standard_normal((n, n)).astype(dt), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "gemm",
                          [helper.make_tensor_value_info("a", ty, [n, n])],
                          [helper.make_tensor_value_info("y", ty, [n, n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    tag = "gemm_f16" if half else "gemm"
    path, feeds = os.path.join(tmp, tag + ".onnx"), os.path.join(tmp, tag + ".inputs.npz")
    onnx.save(m, path)
    np.savez(feeds, a=rng.standard_normal((n, n)).astype(dt))
    return path, feeds


def main():
    args = sys.argv[1:]
    iters = 50
    if "--iters" in args:
        i = args.index("--iters")
        iters = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    aim, models = args
    tmp = tempfile.mkdtemp(prefix="aim-gpu-")
    print(f"{'model':14} {'batch':>5} {'math':>5} {'ORT ms':>9} {'aim ms':>9} {'aim/ORT':>8}")
    for name in ["resnet50", "mobilenetv2", "bert_l6"]:
        for math in ["f32", "tf32", "f16"]:
            base = name + "_f16" if math == "f16" else name
            src, inputs = os.path.join(models, base + ".onnx"), os.path.join(models, base + ".inputs.npz")
            for batch in [1, 8]:
                model, feeds = (src, inputs) if batch == 1 else batched(src, inputs, batch, tmp)
                tf32 = math == "tf32"
                o = ort_ms(model, feeds, tf32, iters)
                a, err = aim_ms(aim, model, feeds, tf32, iters)
                ratio = f"{a / o:8.2f}" if a else f"  ({err})"
                print(f"{name:14} {batch:5} {math:>5} {o:9.3f} {a or float('nan'):9.3f} {ratio}")
    n = 4096
    flop = 2 * n ** 3
    for math in ["f32", "tf32", "f16"]:
        model, feeds = matmul_model(n, tmp, half=math == "f16")
        o = ort_ms(model, feeds, math == "tf32", 20)
        a, err = aim_ms(aim, model, feeds, math == "tf32", 20)
        line = f"GEMM {n}^3 {math:4}: ORT (cuBLAS) {flop / o / 1e9:7.1f} TFLOP/s"
        line += f", aim {flop / a / 1e9:7.1f} TFLOP/s ({o / a:.0%} of cuBLAS)" if a else f", aim: {err}"
        print(line)


if __name__ == "__main__":
    main()
