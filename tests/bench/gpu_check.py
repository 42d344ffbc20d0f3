#!/usr/bin/env python3
"""The cuda backend on a real GPU: are its outputs right, and how fast is it.

Usage: gpu_check.py AIM_BINARY MODELS_DIR [--iters N] [--no-sanitizer]

MODELS_DIR holds the models of tests/models/make_models.py. Needs an NVIDIA GPU and its
driver, Python with numpy and onnx, and for the timing peers PyTorch with CUDA (torchvision
and transformers where present). gpu.py measures against ONNX Runtime's CUDA provider; this
script is for a machine where onnxruntime-gpu is not installed.

1. Outputs: every model below runs once with `--backend cuda` and once with the cpu backend
   on the same inputs; the line gives the largest difference over the largest magnitude of
   each output (f32; with --allow-tf32; the half models as they are). A model the cuda
   backend does not lower says so and is not counted as a failure.
2. Latency, median of N runs after warm-up, each configuration a fresh process, host copies
   of inputs and outputs included on both sides: resnet50, mobilenetv2 and bert_l6 at batch
   1 and 8 against PyTorch eager on the same architecture with random weights
   (torchvision's resnet50 and mobilenet_v2, transformers' BertModel with bert_l6's sizes).
3. A 4096^3 MatMul against torch.matmul (cuBLAS), in TFLOP/s, f32, TF32 and f16.
4. Out-of-bounds accesses: the small models run under compute-sanitizer's memcheck where it
   is installed (generated code must never read or write outside its buffers).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import batched, matmul_model  # noqa: E402  (the same batch-8 files and GEMM model as gpu.py)

# (model, half model?) whose outputs are compared with the cpu backend's.
ACCURACY = ["mlp", "mlp_b64", "resnet50", "mobilenetv2", "bert_l6", "mobilenetv2_f16", "bert_l6_f16",
            "mobilenetv3", "yolo_like", "dbnet_like", "bert_hf", "gpt2_step", "crnn_unrolled",
            "bert_hf_ort", "gpt2_step_ort", "concat_split", "resizes", "crnn_like", "vad_like"]
TF32 = ["resnet50", "mobilenetv2", "bert_l6"]
SANITIZE = ["mlp", "resnet50_tiny", "mobilenetv2_tiny", "bert_tiny", "concat_split", "resizes"]
# Tolerances on max |cuda - cpu| / max |cpu| by arithmetic.
TOL = {"f32": 1e-3, "tf32": 2e-2, "f16": 3e-2}

TORCH_CHILD = r"""
import json, sys, time
import numpy as np, torch
name, batch, math, iters = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
torch.backends.cudnn.allow_tf32 = math == "tf32"
torch.backends.cudnn.benchmark = True
dt = torch.float16 if math == "f16" else torch.float32
if name == "bert_l6":
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512)
    m = BertModel(cfg, add_pooling_layer=False)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30522, (batch, 128)).astype(np.int64)
    mask = np.ones((batch, 128), np.int64)
    mask[:, 100:] = 0
    feeds = [ids, mask]
    def call(m, t):
        return m(input_ids=t[0], attention_mask=t[1]).last_hidden_state
else:
    import torchvision
    m = getattr(torchvision.models, {"resnet50": "resnet50", "mobilenetv2": "mobilenet_v2"}[name])()
    feeds = [np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)]
    def call(m, t):
        return m(t[0])
m = m.eval().cuda().to(dt)
def run():
    t = [torch.from_numpy(f).cuda() for f in feeds]
    t = [x.to(dt) if x.dtype == torch.float32 else x for x in t]
    return call(m, t).float().cpu().numpy()
with torch.inference_mode():
    for _ in range(max(5, iters // 10)):
        run()
    ts = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        ts.append((time.perf_counter() - t) * 1e3)
ts.sort()
print(json.dumps({"median": ts[len(ts) // 2]}))
"""

TORCH_GEMM = r"""
import json, sys, time
import torch
n, math = int(sys.argv[1]), sys.argv[2]
torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
dt = torch.float16 if math == "f16" else torch.float32
g = torch.Generator().manual_seed(0)
a_host = torch.randn(n, n, generator=g).to(dt)
w = torch.randn(n, n, generator=g).to(dt).cuda()
def timed(f, iters):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]
a = a_host.cuda()
with_copies = timed(lambda: (a_host.cuda() @ w).cpu(), 20)
kernel = timed(lambda: a @ w, 20)
print(json.dumps({"with_copies": with_copies, "kernel": kernel}))
"""


def sh(cmd, timeout=120):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    except OSError as e:
        return None, str(e)
    if r.returncode != 0:
        lines = (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()
        return None, " | ".join(lines[-3:])
    return r.stdout, None


def compare(aim, model, inputs, tmp, tf32):
    """max |cuda - cpu| / max |cpu| over the outputs, or an error."""
    outs = {}
    for backend in ["cpu", "cuda"]:
        path = os.path.join(tmp, f"out_{backend}.npz")
        cmd = [aim, "run", model, "--inputs", inputs, "--outputs", path, "--backend", backend]
        if backend == "cuda" and tf32:
            cmd.append("--allow-tf32")
        _, err = sh(cmd)
        if err:
            return None, f"{backend}: {err}"
        outs[backend] = dict(np.load(path))
    worst = 0.0
    for k, want in outs["cpu"].items():
        got = outs["cuda"].get(k)
        if got is None or got.shape != want.shape:
            return None, f"output {k}: shape {None if got is None else got.shape} against {want.shape}"
        want, got = want.astype(np.float64), got.astype(np.float64)
        if not np.isfinite(got).all() and np.isfinite(want).all():
            return None, f"output {k}: non-finite values"
        scale = max(np.abs(want).max(), 1e-30) if want.size else 1.0
        worst = max(worst, float(np.abs(got - want).max() / scale) if want.size else 0.0)
    return worst, None


def bert_batched(models, inputs, batch, half, tmp):
    """bert_l6_batch (bert_l6 with a symbolic batch dim; in f16 when `half`) and its inputs
    tiled to `batch` rows: bert_l6's reshapes fix the batch at 1."""
    import onnx
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
    from make_models import to_half
    model = os.path.join(models, "bert_l6_batch.onnx")
    feeds = {k: np.concatenate([v] * batch) for k, v in np.load(inputs).items()}
    if half:
        m, feeds = to_half(onnx.load(model), feeds)
        model = os.path.join(tmp, "bert_l6_batch_f16.onnx")
        onnx.save(m, model)
    path = os.path.join(tmp, f"bert_b{batch}.inputs.npz")
    np.savez(path, **feeds)
    return model, path


def aim_ms(aim, model, inputs, tf32, iters):
    cmd = [aim, "bench", model, "--backend", "cuda", "--inputs", inputs, "--iters", str(iters),
           "--warmup", str(max(5, iters // 10)), "--json"] + (["--allow-tf32"] if tf32 else [])
    out, err = sh(cmd)
    if err:
        return None, err
    return json.loads(out.strip().splitlines()[-1])["latency_ms"]["median"], None


def torch_ms(name, batch, math, iters):
    out, err = sh([sys.executable, "-c", TORCH_CHILD, name, str(batch), math, str(iters)])
    if err:
        return None, err
    return json.loads(out.strip().splitlines()[-1])["median"], None


def main():
    args = sys.argv[1:]
    iters, sanitize = 50, "--no-sanitizer" not in args
    args = [a for a in args if a != "--no-sanitizer"]
    if "--iters" in args:
        i = args.index("--iters")
        iters = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    aim, models = args
    tmp = tempfile.mkdtemp(prefix="aim-gpu-")
    out, err = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    print("GPU:", (out or err).strip(), flush=True)

    print("\n1. outputs: max |cuda - cpu| / max |cpu|", flush=True)
    failures = 0
    for name in ACCURACY:
        src, inputs = os.path.join(models, name + ".onnx"), os.path.join(models, name + ".inputs.npz")
        if not os.path.exists(src):
            print(f"  {name:16} (not in {models})")
            continue
        for math in (["f16"] if name.endswith("_f16") else ["f32"] + (["tf32"] if name in TF32 else [])):
            rel, err = compare(aim, src, inputs, tmp, math == "tf32")
            if err:
                lowered = "cuda backend: node" in err
                failures += 0 if lowered else 1
                print(f"  {name:16} {math:5} {'not lowered' if lowered else 'FAIL'}: {err}", flush=True)
            else:
                ok = rel <= TOL[math]
                failures += 0 if ok else 1
                print(f"  {name:16} {math:5} {rel:9.2e}  {'ok' if ok else 'FAIL (tolerance %g)' % TOL[math]}",
                      flush=True)

    print(f"\n2. latency, ms (median of {iters}; host copies included; PyTorch eager, same architecture)",
          flush=True)
    print(f"  {'model':12} {'batch':>5} {'math':>5} {'torch':>9} {'aim':>9} {'aim/torch':>9}", flush=True)
    for name in ["resnet50", "mobilenetv2", "bert_l6"]:
        for math in ["f32", "tf32", "f16"]:
            base = name + "_f16" if math == "f16" else name
            for batch in [1, 8]:
                src = os.path.join(models, base + ".onnx")
                if not os.path.exists(src):
                    continue
                inputs = os.path.join(models, base + ".inputs.npz")
                if batch == 1:
                    model, feeds = src, inputs
                elif name == "bert_l6":
                    model, feeds = bert_batched(models, inputs, batch, math == "f16", tmp)
                else:
                    model, feeds = batched(src, inputs, batch, tmp)
                t, terr = torch_ms(name, batch, math, iters)
                a, aerr = aim_ms(aim, model, feeds, math == "tf32", iters)
                ratio = f"{a / t:9.2f}" if a and t else ""
                line = f"  {name:12} {batch:5} {math:>5} {t or float('nan'):9.3f} {a or float('nan'):9.3f} {ratio}"
                for who, e in [("torch", terr), ("aim", aerr)]:
                    if e:
                        line += f"  ({who}: {e[-300:]})"
                print(line, flush=True)

    n = 4096
    flop = 2 * n ** 3
    print(f"\n3. MatMul {n}^3, TFLOP/s (host copies of A and Y included; torch's kernel alone in brackets)",
          flush=True)
    for math in ["f32", "tf32", "f16"]:
        model, feeds = matmul_model(n, tmp, half=math == "f16")
        a, aerr = aim_ms(aim, model, feeds, math == "tf32", 20)
        out, terr = sh([sys.executable, "-c", TORCH_GEMM, str(n), math])
        t = json.loads(out.strip().splitlines()[-1]) if out else None
        line = f"  {math:5}"
        line += f" torch {flop / t['with_copies'] / 1e9:7.1f} ({flop / t['kernel'] / 1e9:6.1f})" if t else \
            f" torch: {terr}"
        line += f"  aim {flop / a / 1e9:7.1f}" if a else f"  aim: {aerr}"
        print(line, flush=True)
    print("\n4. compute-sanitizer memcheck", flush=True)
    san = shutil.which("compute-sanitizer")
    if not sanitize or not san:
        print("  skipped" + ("" if sanitize else " (--no-sanitizer)") + (" (not installed)" if not san else ""))
    else:
        for name in SANITIZE:
            src, inputs = os.path.join(models, name + ".onnx"), os.path.join(models, name + ".inputs.npz")
            if not os.path.exists(src):
                continue
            out, err = sh([san, "--tool", "memcheck", "--error-exitcode", "9", aim, "run", src, "--inputs", inputs,
                           "--backend", "cuda", "--outputs", os.path.join(tmp, "san.npz")], timeout=240)
            summary = [ln for ln in (out or "").splitlines() if "ERROR SUMMARY" in ln]
            failures += 1 if err else 0
            print(f"  {name:16} {'FAIL: ' + err if err else (summary[-1].strip() if summary else 'ok')}", flush=True)

    print(f"\n{failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
