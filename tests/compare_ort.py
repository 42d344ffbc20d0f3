#!/usr/bin/env python3
"""Run models in aim and in ONNX Runtime on the same inputs and compare every output.

Usage: compare_ort.py AIM_BINARY MODELS_DIR NAME [NAME...] [--backend reference] [--opt-level N] [--quantized]
       [--one-quantum] [--half]

For each NAME, reads MODELS_DIR/NAME.onnx and MODELS_DIR/NAME.inputs.npz (as
tests/models/make_models.py writes them), runs both, and checks that every output matches
within 1e-3 of that output's largest magnitude. Prints one line per model and exits 1 on a
mismatch. Needs: pip install onnxruntime numpy.

--opt-level N runs aim at -ON (cpu backend): each level must give the same answers.

With --half (f16 or bf16 models) outputs must have ORT's dtype and agree within 1e-2 of
their largest magnitude: ten f16 steps, the rounding of intermediates that ORT's half
kernels do and aim's f32 computation does not.

With --one-quantum (models of single quantized ops), integer outputs may differ from ORT's
by one unit — a rounding tie or ORT's fixed-point rescaling resolved the other way — and
float outputs are compared as usual. Models made only of quantized matrix products are also
computed exactly (numpy int64, tests/exact_int.py): where ORT's outputs disagree with the
exact ones — its u8 x s8 kernels saturate pair sums at 16 bits on CPUs without VNNI — the
line says so and aim is compared with the exact outputs instead.

With --quantized (models with integer quantization, whose rounding differs between
implementations: one flipped rounding moves an activation by a quantum, and deep nets carry
it on), ONNX Runtime runs each model twice, with its graph optimisations (integer kernels)
and without (quantize/dequantize in f32, the semantics aim implements), and an output
passes when aim's RMS difference from the unoptimised run is at most twice ORT's own RMS
difference between its two runs (the largest differences are printed too): one input is
one sample of where roundings flip — on mobilenetv2_qdq aim's reference kernels, which
compute the f32 semantics in f64, land at 1.2 times ORT's spread. A QOperator model
(`NAME_qop`) runs ORT's integer kernels whether optimised or not; its f32-simulated
counterpart is ORT's unoptimised run of the QDQ model of the same network (`NAME_qdq`,
the same quantizer, calibration and scales), which must be in MODELS_DIR.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

from exact_int import exact_outputs

TOL = 1e-3
# Half-precision models: ten f16 steps (2^-10) of the output's largest magnitude. ONNX
# Runtime rounds every intermediate to f16, aim's cpu backend computes in f32 and its
# reference kernels round per op as the spec does: they differ by that rounding.
TOL_HALF = 1e-2


def main():
    args = sys.argv[1:]
    backend = "reference"
    if "--backend" in args:
        i = args.index("--backend")
        backend = args[i + 1]
        del args[i : i + 2]
    level = []
    if "--opt-level" in args:
        i = args.index("--opt-level")
        level = ["--opt-level", args[i + 1]]
        del args[i : i + 2]
    quantized = "--quantized" in args
    if quantized:
        args.remove("--quantized")
    one_quantum = "--one-quantum" in args
    if one_quantum:
        args.remove("--one-quantum")
    half = "--half" in args
    if half:
        args.remove("--half")
    tol = TOL_HALF if half else TOL
    if len(args) < 3:
        sys.exit(__doc__)
    aim, models, names = args[0], args[1], args[2:]
    ok = True
    for name in names:
        onnx_path = os.path.join(models, name + ".onnx")
        inputs_path = os.path.join(models, name + ".inputs.npz")
        feeds = dict(np.load(inputs_path))
        def ort_run(level, path=onnx_path):
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.graph_optimization_level = level
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))

        want, ref = ort_run(ort.GraphOptimizationLevel.ORT_ENABLE_ALL), "ort"
        exact = exact_outputs(onnx.load(onnx_path), feeds) if one_quantum else None
        if exact is not None and not all(within(w, exact[k], tol, one_quantum) for k, w in want.items()):
            print(f"{name}: ONNX Runtime is not exact on this CPU (u8 x s8 pair sums saturate without VNNI): "
                  "comparing aim with exact int64 arithmetic (tests/exact_int.py)")
            want, ref = exact, "exact"
        raw = None
        if quantized:
            twin = os.path.join(models, name.removesuffix("_qop") + "_qdq.onnx")
            if name.endswith("_qop") and not os.path.exists(twin):
                sys.exit(f"{name}: its QDQ twin {twin} is missing (see --quantized)")
            raw = ort_run(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, twin if name.endswith("_qop") else onnx_path)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.npz")
            run = subprocess.run(
                [aim, "run", onnx_path, "--inputs", inputs_path, "--outputs", out, "--backend", backend] + level,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            if run.returncode != 0:
                # aim's own error line names what it could not do; the next model still runs.
                print(f"{name}: FAIL: aim run exited {run.returncode}: {run.stderr.strip()}")
                ok = False
                continue
            got = dict(np.load(out))
        if quantized:
            ok &= compare_quantized(name, want, raw, got)
            continue
        worst = 0.0
        for k, w in want.items():
            if k not in got:
                print(f"{name}: FAIL: output {k} missing from aim's outputs")
                ok = False
                continue
            g = got[k]
            if g.shape != w.shape or g.dtype != w.dtype:
                print(f"{name}: FAIL: output {k} {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}")
                ok = False
                continue
            diff = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if w.size else 0.0
            if one_quantum and np.issubdtype(w.dtype, np.integer):
                differing = int(np.count_nonzero(g != w))
                if diff > 1:
                    print(f"{name}: FAIL: output {k} differs by {diff:g} units (at most 1 allowed)")
                    ok = False
                else:
                    print(f"{name}: output {k}: {'bytes equal' if differing == 0 else f'{differing} of {w.size} values one unit apart'}")
                continue
            scale = max(float(np.max(np.abs(w))), 1e-30)
            rel = diff / scale
            worst = max(worst, rel)
        status = "ok" if worst <= tol else "FAIL"
        ok &= worst <= tol
        print(f"{name}: {status}: max |aim - {ref}| / max |{ref}| = {worst:.2e} (tolerance {tol:g})")
    sys.exit(0 if ok else 1)


def within(got, want, tol, one_quantum):
    """Whether `got` equals `want` up to one unit (integers under --one-quantum) or `tol` of
    want's largest magnitude."""
    if got.shape != want.shape:
        return False
    if not want.size:
        return True
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    if one_quantum and np.issubdtype(want.dtype, np.integer):
        return diff <= 1
    return diff <= tol * max(float(np.max(np.abs(want))), 1e-30)


def compare_quantized(name, opt, raw, got):
    """Checks aim's outputs against ORT's spread between its optimised and unoptimised runs."""
    rms = lambda a, b: float(np.sqrt(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))
    ok = True
    for k, w in opt.items():
        g = got.get(k)
        if g is None or g.shape != w.shape:
            print(f"{name}: FAIL: output {k} missing or of shape {None if g is None else g.shape} vs {w.shape}")
            ok = False
            continue
        spread, mine = rms(w, raw[k]), rms(g, raw[k])
        good = mine <= 2 * spread
        ok &= good
        print(f"{name}: {'ok' if good else 'FAIL'}: {k}: RMS |aim - ORT unoptimised| = {mine:.3g}, "
              f"ORT's own |optimised - unoptimised| = {spread:.3g}; max |aim - ORT| = "
              f"{float(np.max(np.abs(g.astype(np.float64) - w))):.3g} (ORT's own "
              f"{float(np.max(np.abs(w.astype(np.float64) - raw[k]))):.3g}, largest |output| "
              f"{float(np.max(np.abs(w))):.3g})")
    return ok


if __name__ == "__main__":
    main()
