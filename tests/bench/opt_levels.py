#!/usr/bin/env python3
"""aim's optimisation levels side by side: latency, load time and peak memory of each model
at -O0 (reference kernels) to -O3 (the default), and optionally with threads pinned.

Usage: opt_levels.py AIM_BINARY MODELS_DIR [NAME...] [--threads N] [--iters N] [--rounds R] [--levels 0,1,2,3]
       [--pin]

For each model, alternates R rounds over the levels (each round: a fresh `aim bench --json`
process per level) and prints the median latency, compile time and peak RSS per level, and
each level's latency relative to -O3. -O0 interprets every node on its reference kernel and
is timed over a tenth of the runs (at least 2). With --pin, the "levels" are -O3 unpinned
and -O3 with --pin-threads instead. Models and inputs are what tests/models/make_models.py
writes.
"""
import json
import statistics
import subprocess
import sys

DEFAULT = ["mlp_b64", "mobilenetv2", "resnet50", "bert_l6", "yolo_like", "crnn_like", "gpt2_step"]


def arg(args, flag, default):
    if flag in args:
        i = args.index(flag)
        v = args[i + 1]
        del args[i : i + 2]
        return v
    return default


def bench(aim, model, inputs, extra, threads, iters):
    cmd = [aim, "bench", model, "--inputs", inputs, "--threads", str(threads), "--iters", str(iters),
           "--warmup", str(max(1, iters // 10)), "--json"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    args = sys.argv[1:]
    threads = int(arg(args, "--threads", "1"))
    iters = int(arg(args, "--iters", "20"))
    rounds = int(arg(args, "--rounds", "3"))
    levels = arg(args, "--levels", "0,1,2,3").split(",")
    pin = "--pin" in args
    if pin:
        args.remove("--pin")
    if len(args) < 2:
        sys.exit(__doc__)
    aim, models, names = args[0], args[1], args[2:] or DEFAULT
    variants = [("-O3", []), ("-O3 pinned", ["--pin-threads"])] if pin else [(f"-O{l}", [f"-O{l}"]) for l in levels]
    print(f"threads {threads}, {rounds} rounds, medians")
    print(f"{'model':14} {'level':11} {'latency ms':>11} {'vs -O3':>7} {'compile ms':>11} {'peak MiB':>9}")
    for name in names:
        model, inputs = f"{models}/{name}.onnx", f"{models}/{name}.inputs.npz"
        got = {v: [] for v, _ in variants}
        for _ in range(rounds):
            for v, extra in variants:
                n = max(2, iters // 10) if v == "-O0" else iters
                got[v].append(bench(aim, model, inputs, extra, threads, n))
        med = {v: {k: statistics.median(r[k] if k != "latency_ms" else r[k]["median"] for r in runs)
                   for k in ("latency_ms", "compile_ms", "peak_rss_mb")} for v, runs in got.items()}
        base = med["-O3"]["latency_ms"]
        for v, _ in variants:
            m = med[v]
            print(f"{name:14} {v:11} {m['latency_ms']:11.3f} {m['latency_ms'] / base:7.2f} "
                  f"{m['compile_ms']:11.1f} {m['peak_rss_mb']:9.1f}")


if __name__ == "__main__":
    main()
