#!/usr/bin/env python3
"""`--weights int4` / `--weights int8` measured: for each model, the error it adds (aim
quantized against aim f32, as relative RMS of every output and the largest difference over
the largest magnitude) next to the error ONNX Runtime's own quantization adds (ORT quantized
against ORT f32) — for int4 MatMulNBitsQuantizer (blocks of 32, asymmetric, accuracy level
0; MatMul layers only, as that quantizer takes them), for int8 `quantize_dynamic` (per-channel
int8 weights; it also quantizes the activations, which weight-only int8 does not) — and
latency and peak RSS of aim at f32 and quantized (medians of alternating rounds of fresh
`aim bench --json` processes).

Usage: weight_quantization.py AIM_BINARY MODELS_DIR NAME... [--weights int4|int8]
       [--threads N] [--iters N] [--rounds R] [--cpu LEVEL]
Needs onnxruntime (with onnxruntime.quantization) and, for int4, onnx_ir.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort


def arg(args, flag, default):
    if flag in args:
        i = args.index(flag)
        v = args[i + 1]
        del args[i : i + 2]
        return v
    return default


def rel(got, want):
    rms = float(np.sqrt(np.mean((got.astype(np.float64) - want) ** 2) / max(np.mean(want.astype(np.float64) ** 2), 1e-30)))
    peak = float(np.max(np.abs(got.astype(np.float64) - want)) / max(float(np.max(np.abs(want))), 1e-30))
    return rms, peak


def aim_outputs(aim, model, inputs, weights, tmp, cpu):
    out = os.path.join(tmp, f"{os.path.basename(model)}.{weights}.npz")
    subprocess.run([aim, "run", model, "--inputs", inputs, "--outputs", out, "--weights", weights, "--cpu", cpu],
                   check=True, capture_output=True)
    return dict(np.load(out))


def ort_outputs(model, feeds):
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def main():
    args = sys.argv[1:]
    threads, iters, rounds = arg(args, "--threads", "1"), arg(args, "--iters", "20"), int(arg(args, "--rounds", "3"))
    scheme = arg(args, "--weights", "int4")
    cpu = arg(args, "--cpu", "native")
    if scheme not in ("int4", "int8"):
        sys.exit(f"--weights {scheme}: int4 or int8")
    if len(args) < 3:
        sys.exit(__doc__)
    aim, models, names = args[0], args[1], args[2:]
    tmp = tempfile.mkdtemp(prefix=f"aim-{scheme}-")
    print(f"{'model':12} {'aim rel RMS':>11} {'aim max':>9} {'ORT rel RMS':>11} {'ORT max':>9} "
          f"{'f32 ms':>8} {scheme + ' ms':>8} {'f32 MiB':>8} {scheme + ' MiB':>9}")
    for name in names:
        model, inputs = f"{models}/{name}.onnx", f"{models}/{name}.inputs.npz"
        feeds = dict(np.load(inputs))
        f32, q = (aim_outputs(aim, model, inputs, w, tmp, cpu) for w in ("f32", scheme))
        aim_err = [rel(q[k], f32[k]) for k in f32]
        qpath = os.path.join(tmp, f"{name}.ort_{scheme}.onnx")
        ort_quantize(model, qpath, scheme)
        want, got = ort_outputs(model, feeds), ort_outputs(qpath, feeds)
        ort_err = [rel(got[k], want[k]) for k in want]
        runs = {"f32": [], scheme: []}
        for _ in range(rounds):
            for w in runs:
                r = subprocess.run([aim, "bench", model, "--inputs", inputs, "--threads", threads, "--iters", iters,
                                    "--weights", w, "--cpu", cpu, "--json"], check=True, capture_output=True, text=True)
                runs[w].append(json.loads(r.stdout.strip().splitlines()[-1]))
        med = {w: (statistics.median(r["latency_ms"]["median"] for r in v), statistics.median(r["peak_rss_mb"] for r in v))
               for w, v in runs.items()}
        print(f"{name:12} {max(e[0] for e in aim_err):11.2e} {max(e[1] for e in aim_err):9.2e} "
              f"{max(e[0] for e in ort_err):11.2e} {max(e[1] for e in ort_err):9.2e} "
              f"{med['f32'][0]:8.3f} {med[scheme][0]:8.3f} {med['f32'][1]:8.1f} {med[scheme][1]:9.1f}")


def ort_quantize(model, out, scheme):
    """Writes `model` quantized by ONNX Runtime's own tool for `scheme` to `out`."""
    if scheme == "int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        qm = MatMulNBitsQuantizer(onnx.load(model), block_size=32, is_symmetric=False, accuracy_level=0)
        qm.process()
        onnx.save(qm.model.model, out)
    else:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        quantize_dynamic(model, out, per_channel=True, weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gemm"])


if __name__ == "__main__":
    main()
