#!/usr/bin/env python3
"""aim and ONNX Runtime side by side, on the same models, in the same run.

Usage: side_by_side.py AIM_BINARY MODELS_DIR [NAME...] [--threads 1,2] [--iters N] [--rounds R]

For each model and thread count, alternates R rounds of ORT and aim (each round: a fresh
process that loads the model, warms up and times N runs) so that both see the same machine
state. N is at least --iters, and more for fast models: enough runs for about 0.3 s of
timing (from an untimed ORT probe run), with a tenth as many warm-up runs, so that
microsecond-scale models are not measured on a cold core; then prints a table of median latencies and the aim/ORT ratio, load (session
creation / compile) times, and peak memory (each process's peak RSS). Models and inputs are
what tests/models/make_models.py writes. Needs: pip install onnxruntime numpy.
"""
import json
import os
import statistics
import subprocess
import sys

ORT_CHILD = r"""
import json, resource, sys, time
import numpy as np, onnxruntime as ort
path, inputs, threads, iters, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
feeds = dict(np.load(inputs))
t0 = time.perf_counter()
o = ort.SessionOptions()
o.intra_op_num_threads = threads
o.inter_op_num_threads = 1
o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
load_ms = (time.perf_counter() - t0) * 1e3
for _ in range(warmup):
    s.run(None, feeds)
ts = []
for _ in range(iters):
    t = time.perf_counter()
    s.run(None, feeds)
    ts.append((time.perf_counter() - t) * 1e3)
ts.sort()
print(json.dumps({"load_ms": load_ms, "median": ts[len(ts) // 2], "min": ts[0],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def ort_round(model, inputs, threads, iters, warmup):
    out = subprocess.run([sys.executable, "-c", ORT_CHILD, model, inputs, str(threads), str(iters), str(warmup)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def aim_round(aim, model, inputs, threads, iters, warmup):
    out = subprocess.run([aim, "bench", model, "--inputs", inputs, "--threads", str(threads), "--iters", str(iters),
                          "--warmup", str(warmup), "--json"], check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"load_ms": r["compile_ms"], "median": r["latency_ms"]["median"], "min": r["latency_ms"]["min"],
            "peak_rss_mb": r["peak_rss_mb"]}


def main():
    args = sys.argv[1:]
    opts = {"--threads": "1,2", "--iters": "30", "--rounds": "3"}
    for k in list(opts):
        if k in args:
            i = args.index(k)
            opts[k] = args[i + 1]
            del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    aim, models = args[0], args[1]
    names = args[2:] or ["mlp", "mlp_b64", "mobilenetv2", "bert_l6", "resnet50"]
    threads = [int(t) for t in opts["--threads"].split(",")]
    iters, rounds = int(opts["--iters"]), int(opts["--rounds"])
    print(f"{'model':<12} {'thr':>3} {'ORT ms':>9} {'aim ms':>9} {'aim/ORT':>8}   {'ORT load':>9} {'aim load':>9}   {'ORT MiB':>8} {'aim MiB':>8}")
    for name in names:
        model = os.path.join(models, name + ".onnx")
        inputs = os.path.join(models, name + ".inputs.npz")
        for t in threads:
            probe = ort_round(model, inputs, t, iters, 5)
            n = min(20000, max(iters, int(300.0 / max(probe["median"], 1e-3))))
            warm = max(5, n // 10)
            o, a = [], []
            for _ in range(rounds):
                o.append(ort_round(model, inputs, t, n, warm))
                a.append(aim_round(aim, model, inputs, t, n, warm))
            med = lambda rs, k: statistics.median(r[k] for r in rs)
            om, am = med(o, "median"), med(a, "median")
            print(f"{name:<12} {t:>3} {om:>9.3f} {am:>9.3f} {am / om:>8.2f}   {med(o, 'load_ms'):>9.1f} {med(a, 'load_ms'):>9.1f}   "
                  f"{med(o, 'peak_rss_mb'):>8.1f} {med(a, 'peak_rss_mb'):>8.1f}", flush=True)


if __name__ == "__main__":
    main()
