#!/usr/bin/env python3
"""`aim quantize` end to end: quantize benchmark models, statically (calibrated QDQ, each
calibration method, u8 and s8 activations) and dynamically, then check that

- ONNX Runtime loads and runs every quantized model;
- aim runs it within ONNX Runtime's own spread (tests/compare_ort.py --quantized), or for
  the dynamic model close to ORT next to the quantization's own error;
- aim runs it on its integer kernels where the CPU has them (aim info: byte convolutions
  for the CNNs, integer dense layers for the transformer);
- the accuracy cost aim quantize prints is there and small (relative RMS against the f32
  model under 15%, the top-1 class kept for the classifiers).

Usage: aim_quantize.py AIM_BINARY MODELS_DIR (models from tests/models/make_models.py).
Needs: pip install onnxruntime numpy.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exact_int import with_exact_products  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# aim's integer kernels need AVX-512 VNNI; elsewhere quantized models run in f32.
VNNI = os.path.exists("/proc/cpuinfo") and "avx512_vnni" in open("/proc/cpuinfo").read()

# (model, output suffix, aim quantize options, the op aim info must count)
CASES = [
    ("mobilenetv2", "aimq_minmax", ["--per-channel"], "aim:Conv8"),
    ("mobilenetv2", "aimq_percentile_s8", ["--per-channel", "--method", "percentile", "--symmetric"], "aim:Conv8"),
    ("resnet50", "aimq_entropy", ["--per-channel", "--method", "entropy"], "aim:Conv8"),
    ("bert_l6", "aimq_dynamic", ["--mode", "dynamic", "--per-channel"], "aim:QDense"),
]


def calibration_dir(models, model):
    """Four seeded input sets shaped like the model's own inputs (random floats, integer
    inputs such as token ids as given)."""
    d = os.path.join(models, "calibration", model)
    os.makedirs(d, exist_ok=True)
    feeds = dict(np.load(os.path.join(models, model + ".inputs.npz")))
    rng = np.random.default_rng(11)
    for i in range(4):
        np.savez(os.path.join(d, f"set{i}.npz"),
                 **{k: v if v.dtype.kind in "iu" else rng.standard_normal(v.shape).astype(v.dtype)
                    for k, v in feeds.items()})
    return d


def dynamic_check(aim, models, model, name, feeds):
    """A dynamically quantized model: ONNX Runtime's two runs agree almost exactly (both
    quantize each activation the same way), so its spread is no yardstick; aim's difference
    from ORT must instead be small next to the quantization's own error (a quarter of the
    RMS difference between ORT's quantized and f32 outputs): the activations' roundings flip
    where aim's f32 kernels and ORT's differ in the last bits. Where ORT is not exact on
    the CPU, see below."""
    sess = lambda m: ort.InferenceSession(os.path.join(models, m + ".onnx"), providers=["CPUExecutionProvider"])
    q, f = sess(name).run(None, feeds), sess(model).run(None, feeds)
    # Where ORT's integer products are not exact on this CPU (u8 x s8 pair sums saturate
    # without VNNI, tests/exact_int.py), the yardstick is ORT running the same graph with
    # exact products, unoptimised; aim must then be within that oracle's own spread (its
    # optimised run against its unoptimised one: roundings of the dynamic quantization flip
    # with the last bits of the f32 ops around it), and the check says so.
    rms = lambda a: float(np.sqrt(np.mean(np.square(a.astype(np.float64)))))
    spread = [0.0] * len(q)
    exact_bytes = with_exact_products(onnx.load(os.path.join(models, name + ".onnx"))).SerializeToString()
    exact = ort.InferenceSession(exact_bytes, providers=["CPUExecutionProvider"]).run(None, feeds)
    if any(rms(a - b) > 0.25 * rms(a - c) for a, b, c in zip(exact, q, f)):
        plain = ort.SessionOptions()
        plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        unopt = ort.InferenceSession(exact_bytes, plain, providers=["CPUExecutionProvider"]).run(None, feeds)
        spread = [rms(a - b) for a, b in zip(exact, unopt)]
        print(f"{name}: ONNX Runtime is not exact on this CPU (u8 x s8 pair sums saturate without VNNI): "
              "comparing aim with ORT running the graph with exact products (tests/exact_int.py), "
              f"whose own optimised/unoptimised spread is {max(spread):.3g}")
        q = unopt
    out = os.path.join(models, name + ".aim_out.npz")
    subprocess.run([aim, "run", os.path.join(models, name + ".onnx"), "--inputs",
                    os.path.join(models, name + ".inputs.npz"), "--outputs", out], check=True, capture_output=True)
    got = np.load(out)
    names = [o.name for o in sess(name).get_outputs()]
    problems = []
    for k, n in enumerate(names):
        d_aim, d_quant = rms(got[n] - q[k]), rms(q[k] - f[k])
        if d_aim > max(0.25 * d_quant, spread[k]):
            problems.append(f"{n}: RMS |aim - ORT| = {d_aim:.3g}, the quantization's own RMS error {d_quant:.3g}"
                            f", ORT's own spread {spread[k]:.3g}")
    os.remove(out)
    return problems


def main():
    aim, models = sys.argv[1], sys.argv[2]
    failures = 0
    for model, suffix, opts, kernel in CASES:
        name = f"{model}_{suffix}"
        out = os.path.join(models, name + ".onnx")
        cmd = [aim, "quantize", os.path.join(models, model + ".onnx"), "-o", out, "--threads", "2"] + opts
        if "dynamic" not in opts:
            cmd += ["--calibration", calibration_dir(models, model)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {name}: aim quantize failed: {r.stderr.strip()}")
            failures += 1
            continue
        report = r.stdout
        shutil.copyfile(os.path.join(models, model + ".inputs.npz"), os.path.join(models, name + ".inputs.npz"))
        problems = []
        # The accuracy table: each output's relative RMS difference, and top-1 agreement.
        rows = re.findall(r"^\s+(\S+)\s+(\S+)\s+([\d.]+)%\s+(.*)$", report, re.M)
        if not rows:
            problems.append("no accuracy table in the report")
        for out_name, _, rel, top1 in rows:
            if float(rel) > 15.0:
                problems.append(f"{out_name}: relative RMS {rel}% against the f32 model")
            m = re.match(r"(\d+)/(\d+)", top1)
            if m and m.group(1) != m.group(2):
                problems.append(f"{out_name}: top-1 agreement {top1}")
        # ONNX Runtime runs it.
        feeds = dict(np.load(os.path.join(models, name + ".inputs.npz")))
        try:
            ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, feeds)
        except Exception as e:  # noqa: BLE001 (any ORT failure is the finding)
            problems.append(f"ONNX Runtime cannot run it: {e}")
        # aim's integer kernels run it (where the CPU has them: AVX-512 VNNI).
        info = subprocess.run([aim, "info", out], capture_output=True, text=True).stdout
        if VNNI and kernel not in info:
            problems.append(f"aim info shows no {kernel}: {info.strip().splitlines()[-2:]}")
        if "dynamic" in opts:
            problems += dynamic_check(aim, models, model, name, feeds)
        else:
            # aim within ORT's own spread on it (where roundings flip between its integer
            # kernels and its f32 simulation).
            c = subprocess.run([sys.executable, os.path.join(HERE, "compare_ort.py"), aim, models, name, "--backend",
                                "cpu", "--quantized"], capture_output=True, text=True)
            if c.returncode != 0:
                problems.append(f"against ONNX Runtime: {c.stdout.strip()} {c.stderr.strip()}")
        summary = report.strip().splitlines()
        if problems:
            failures += 1
            print(f"FAIL {name}: " + "; ".join(problems))
        else:
            print(f"ok   {name}: {summary[0]}")
            for line in summary[1:]:
                print(f"       {line}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
