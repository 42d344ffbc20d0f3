#!/usr/bin/env python3
"""Peak memory of aim and ONNX Runtime after runs at three input shapes, in one process each.

Usage: three_shapes.py AIM_BINARY MODELS_DIR [NAME...] [--threads N] [--iters N]

A model with symbolic input dims gets a program per input shape in aim (shape
specialisation), so its memory after several shapes is what a server sees. For each model
of tests/models/make_models.py with symbolic dims, this writes three input sets of
different shapes (seeded values), runs them round-robin in one `aim bench` process and in
one ONNX Runtime session, and prints both peak RSS figures and each side's median latency
over all the runs. Needs: pip install onnxruntime numpy.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# Three shape sets per model (input name -> dims), as its declared symbolic dims allow.
SHAPES = {
    "yolo_like": [{"images": (b, 3, 320, 320)} for b in (1, 2, 3)],
    "dbnet_like": [{"x": (1, 3, 320, 320)}, {"x": (1, 3, 256, 256)}, {"x": (2, 3, 320, 320)}],
    "crnn_like": [{"image": (1, 1, 32, 160)}, {"image": (1, 1, 32, 96)}, {"image": (2, 1, 32, 160)}],
    "crnn_unrolled": [{"image": (1, 1, 32, 96)}, {"image": (2, 1, 32, 96)}, {"image": (4, 1, 32, 96)}],
    "mobilenetv3": [{"input": (b, 3, 224, 224)} for b in (1, 2, 3)],
    "bert_hf": [{n: s for n in ("input_ids", "attention_mask", "token_type_ids")} for s in ((1, 64), (1, 32), (2, 64))],
    "gpt2_step": [
        dict({"input_ids": (b, 1)}, **{f"past_{kv}_{i}": (b, 4, p, 64) for i in range(4) for kv in ("key", "value")})
        for b, p in ((1, 7), (1, 15), (2, 7))
    ],
}

ORT_CHILD = r"""
import json, resource, sys, time
import numpy as np, onnxruntime as ort
path, threads, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sets = [dict(np.load(p)) for p in sys.argv[4:]]
o = ort.SessionOptions()
o.intra_op_num_threads = threads
o.inter_op_num_threads = 1
s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
for f in sets:
    s.run(None, f)
ts = []
for k in range(iters):
    t = time.perf_counter()
    s.run(None, sets[k % len(sets)])
    ts.append((time.perf_counter() - t) * 1e3)
ts.sort()
print(json.dumps({"median": ts[len(ts) // 2], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def inputs_for(like, shapes, seed):
    """An input set of the given shapes, with the dtypes of the model's shipped inputs."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims in shapes.items():
        dt = like[name].dtype
        if np.issubdtype(dt, np.floating):
            out[name] = rng.standard_normal(dims).astype(dt)
        elif "mask" in name:
            out[name] = np.ones(dims, dt)
        elif "type" in name:
            out[name] = np.zeros(dims, dt)
        else:
            out[name] = rng.integers(0, 100, dims).astype(dt)
    return out


def main():
    args = sys.argv[1:]
    opt = {"--threads": "1", "--iters": "60"}
    for k in list(opt):
        if k in args:
            i = args.index(k)
            opt[k] = args[i + 1]
            del args[i:i + 2]
    aim, models, names = args[0], args[1], args[2:] or list(SHAPES)
    print(f"{'model':<14} {'shapes':>6} {'ORT ms':>8} {'aim ms':>8} {'ORT MiB':>8} {'aim MiB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model = os.path.join(models, name + ".onnx")
            like = dict(np.load(os.path.join(models, name + ".inputs.npz")))
            files = []
            for k, shapes in enumerate(SHAPES[name]):
                f = os.path.join(tmp, f"{name}.{k}.npz")
                np.savez(f, **inputs_for(like, shapes, k))
                files.append(f)
            o = json.loads(subprocess.run([sys.executable, "-c", ORT_CHILD, model, opt["--threads"], opt["--iters"]] + files,
                                          check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            cmd = [aim, "bench", model, "--threads", opt["--threads"], "--iters", opt["--iters"], "--json"]
            for f in files:
                cmd += ["--inputs", f]
            a = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            print(f"{name:<14} {len(files):>6} {o['median']:>8.3f} {a['latency_ms']['median']:>8.3f} "
                  f"{o['peak_rss_mb']:>8.1f} {a['peak_rss_mb']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
