#!/usr/bin/env python3
"""aim, ONNX Runtime and OpenVINO side by side, on the same models, in the same run.

Usage: side_by_side.py AIM_BINARY MODELS_DIR [NAME...] [--threads 1,2] [--iters N] [--rounds R]
       [--peers ort,openvino]

For each model and thread count, alternates R rounds of each peer and aim (each round: a
fresh process that loads the model, warms up and times N runs) so that all see the same
machine state. The peers are ONNX Runtime's CPU provider, and OpenVINO's CPU plugin where
the `openvino` package is installed (f32 inference precision, a latency hint, one stream,
the model reshaped to the inputs' shapes as aim specialises to them); aim is compared with
each and with the faster of the two ("best"). N is at least --iters, and more for fast models: enough runs for about 0.3 s of
timing (from an untimed ORT probe run), with a tenth as many warm-up runs, so that
microsecond-scale models are not measured on a cold core; then prints a table of median
latencies and ratios, load (session creation / compile) times, and peak memory (each
process's peak RSS). Models and inputs are what tests/models/make_models.py writes. Needs:
pip install onnxruntime numpy (and openvino for the second peer).
"""
import json
import os
import statistics
import subprocess
import sys

ORT_CHILD = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
PEAK_RSS
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
                  "peak_rss_mb": peak_rss_mb()}))
"""


OPENVINO_CHILD = r"""
import json, sys, time
import numpy as np, openvino as ov
PEAK_RSS
path, inputs, threads, iters, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
feeds = dict(np.load(inputs))
t0 = time.perf_counter()
core = ov.Core()
m = core.read_model(path)
m.reshape({name: list(a.shape) for name, a in feeds.items()})
c = core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                                  "INFERENCE_PRECISION_HINT": "f32"})
r = c.create_infer_request()
load_ms = (time.perf_counter() - t0) * 1e3
for _ in range(warmup):
    r.infer(feeds)
ts = []
for _ in range(iters):
    t = time.perf_counter()
    r.infer(feeds)
    ts.append((time.perf_counter() - t) * 1e3)
ts.sort()
print(json.dumps({"load_ms": load_ms, "median": ts[len(ts) // 2], "min": ts[0],
                  "peak_rss_mb": peak_rss_mb()}))
"""

# The process's own high-water mark (VmHWM, reset by exec). getrusage's ru_maxrss is not:
# Linux keeps the parent's peak across fork and exec, so a child of a large parent reads high.
PEAK_RSS = r"""
def peak_rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""
ORT_CHILD = ORT_CHILD.replace("PEAK_RSS\n", PEAK_RSS)
OPENVINO_CHILD = OPENVINO_CHILD.replace("PEAK_RSS\n", PEAK_RSS)

CHILDREN = {"ort": ORT_CHILD, "openvino": OPENVINO_CHILD}


def peer_round(peer, model, inputs, threads, iters, warmup, env=None):
    """One fresh process of a peer: load, warm up, time; `env` adds variables (an ISA cap)."""
    out = subprocess.run([sys.executable, "-c", CHILDREN[peer], model, inputs, str(threads), str(iters), str(warmup)],
                         check=True, capture_output=True, text=True, env={**os.environ, **(env or {})}).stdout
    return json.loads(out.strip().splitlines()[-1])


def aim_round(aim, model, inputs, threads, iters, warmup, cpu="native"):
    """One fresh `aim bench` process; `cpu` caps the ISA level (x86-64-v3: the AVX2 path)."""
    out = subprocess.run([aim, "bench", model, "--inputs", inputs, "--threads", str(threads), "--iters", str(iters),
                          "--warmup", str(warmup), "--json", "--cpu", cpu], check=True, capture_output=True,
                         text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"load_ms": r["compile_ms"], "median": r["latency_ms"]["median"], "min": r["latency_ms"]["min"],
            "peak_rss_mb": r["peak_rss_mb"]}


def cpu_name():
    """The CPU's model name, for the tables (figures mean nothing without it)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def have_openvino():
    return subprocess.run([sys.executable, "-c", "import openvino"], capture_output=True).returncode == 0


def main():
    args = sys.argv[1:]
    opts = {"--threads": "1,2", "--iters": "30", "--rounds": "3", "--peers": ""}
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
    peers = opts["--peers"].split(",") if opts["--peers"] else ["ort"] + (["openvino"] if have_openvino() else [])
    unknown = [p for p in peers if p not in CHILDREN]
    if unknown or "ort" not in peers:
        sys.exit(f"--peers: {','.join(unknown) or 'ort is required'} (known: {', '.join(CHILDREN)})")
    ov = "openvino" in peers
    head = f"{'model':<14} {'thr':>3} {'ORT ms':>9}" + (f" {'OV ms':>9}" if ov else "") + f" {'aim ms':>9} {'aim/ORT':>8}"
    head += (f" {'aim/OV':>7} {'aim/best':>8}" if ov else "") + f"   {'ORT load':>9}" + (f" {'OV load':>8}" if ov else "")
    head += f" {'aim load':>9}   {'ORT MiB':>8}" + (f" {'OV MiB':>7}" if ov else "") + f" {'aim MiB':>8}"
    print(head)
    for name in names:
        model = os.path.join(models, name + ".onnx")
        inputs = os.path.join(models, name + ".inputs.npz")
        for t in threads:
            probe = peer_round("ort", model, inputs, t, iters, 5)
            n = min(20000, max(iters, int(300.0 / max(probe["median"], 1e-3))))
            warm = max(5, n // 10)
            runs = {p: [] for p in peers + ["aim"]}
            for _ in range(rounds):
                for p in peers:
                    runs[p].append(peer_round(p, model, inputs, t, n, warm))
                runs["aim"].append(aim_round(aim, model, inputs, t, n, warm))
            med = lambda p, k: statistics.median(r[k] for r in runs[p])
            om, am = med("ort", "median"), med("aim", "median")
            line = f"{name:<14} {t:>3} {om:>9.3f}"
            if ov:
                vm = med("openvino", "median")
                line += f" {vm:>9.3f}"
            line += f" {am:>9.3f} {am / om:>8.2f}"
            if ov:
                line += f" {am / vm:>7.2f} {am / min(om, vm):>8.2f}"
            line += f"   {med('ort', 'load_ms'):>9.1f}" + (f" {med('openvino', 'load_ms'):>8.1f}" if ov else "")
            line += f" {med('aim', 'load_ms'):>9.1f}   {med('ort', 'peak_rss_mb'):>8.1f}"
            line += (f" {med('openvino', 'peak_rss_mb'):>7.1f}" if ov else "") + f" {med('aim', 'peak_rss_mb'):>8.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
