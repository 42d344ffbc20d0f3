#!/usr/bin/env python3
"""aim's outputs on a MatMulNBits model against ONNX Runtime's own spread between accuracy
levels: ORT as the file says (accuracy_level 4: activations quantized to int8 per block) and
with every MatMulNBits set to accuracy level 0 (f32 activations).

Usage: nbits_spread.py AIM_BINARY MODEL.onnx INPUTS.npz [--threads N]

Prints, per output, max |x - y| / max |y| for ORT level 0 vs level 4 (the spread), and aim
(as the file says) vs each. aim is within the spread when its distance to either is at most
the spread.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort


def rel(x, y):
    return float(np.abs(x.astype(np.float64) - y).max() / max(np.abs(y).max(), 1e-30))


def main():
    args = sys.argv[1:]
    threads = "1"
    if "--threads" in args:
        i = args.index("--threads")
        threads = args[i + 1]
        del args[i:i + 2]
    if len(args) != 3:
        sys.exit(__doc__)
    aim, model, inputs = args
    feeds = dict(np.load(inputs))
    tmp = tempfile.mkdtemp(prefix="aim-nbits-")
    m = onnx.load(model)
    for n in m.graph.node:
        for a in n.attribute:
            if n.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = 0
    level0 = os.path.join(tmp, "level0.onnx")
    onnx.save(m, level0)
    o = ort.SessionOptions()
    o.intra_op_num_threads = int(threads)
    names = [x.name for x in ort.InferenceSession(model, o).get_outputs()]
    r4 = dict(zip(names, ort.InferenceSession(model, o).run(None, feeds)))
    r0 = dict(zip(names, ort.InferenceSession(level0, o).run(None, feeds)))
    out = os.path.join(tmp, "aim.npz")
    subprocess.run([aim, "run", model, "--inputs", inputs, "--outputs", out, "--threads", threads], check=True,
                   capture_output=True)
    got = dict(np.load(out))
    ok = True
    for k in names:
        spread, a4, a0 = rel(r0[k], r4[k]), rel(got[k], r4[k]), rel(got[k], r0[k])
        within = min(a4, a0) <= spread
        ok &= within
        print(f"{k:24} ORT level 0 vs 4 {spread:.2e}   aim vs level 4 {a4:.2e}   aim vs level 0 {a0:.2e}   "
              f"{'within' if within else 'OUTSIDE'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
