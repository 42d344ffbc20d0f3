#!/usr/bin/env python3
"""Run models in aim and in ONNX Runtime on the same inputs and compare every output.

Usage: compare_ort.py AIM_BINARY MODELS_DIR NAME [NAME...] [--backend reference]

For each NAME, reads MODELS_DIR/NAME.onnx and MODELS_DIR/NAME.inputs.npz (as
tests/models/make_models.py writes them), runs both, and checks that every output matches
within 1e-3 of that output's largest magnitude. Prints one line per model and exits 1 on a
mismatch. Needs: pip install onnxruntime numpy.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort

TOL = 1e-3


def main():
    args = sys.argv[1:]
    backend = "reference"
    if "--backend" in args:
        i = args.index("--backend")
        backend = args[i + 1]
        del args[i : i + 2]
    if len(args) < 3:
        sys.exit(__doc__)
    aim, models, names = args[0], args[1], args[2:]
    ok = True
    for name in names:
        onnx_path = os.path.join(models, name + ".onnx")
        inputs_path = os.path.join(models, name + ".inputs.npz")
        feeds = dict(np.load(inputs_path))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.npz")
            subprocess.run(
                [aim, "run", onnx_path, "--inputs", inputs_path, "--outputs", out, "--backend", backend],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            got = dict(np.load(out))
        worst = 0.0
        for k, w in want.items():
            if k not in got:
                print(f"{name}: FAIL: output {k} missing from aim's outputs")
                ok = False
                continue
            g = got[k]
            if g.shape != w.shape:
                print(f"{name}: FAIL: output {k} shape {g.shape} vs {w.shape}")
                ok = False
                continue
            scale = max(float(np.max(np.abs(w))), 1e-30)
            rel = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) / scale
            worst = max(worst, rel)
        status = "ok" if worst <= TOL else "FAIL"
        ok &= worst <= TOL
        print(f"{name}: {status}: max |aim - ort| / max |ort| = {worst:.2e} (tolerance {TOL:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
