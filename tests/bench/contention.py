"""Threads under contention: aim and ONNX Runtime at 1 and 2 threads, on a quiet machine
and with other processes spinning beside them.

Usage: contention.py AIM_BINARY ZOO_DIR [NAME ...] [--rounds R] [--iters N] [--busy K]

A model served on a shared machine meets cores that other processes hold. A runtime whose
threads spin, or whose work is split statically, then waits for a preempted thread each
loop, and its second thread makes it slower than one. The claim checked here (the corpus
issue's): with K busy processes beside it (default 1: one core of a 2-vCPU machine),
aim at 2 threads is at most 10% slower than aim at 1 thread, and its ratio to ONNX
Runtime at 2 threads is no worse than on the quiet machine.

For each model (ZOO_DIR/NAME.onnx with NAME.inputs.npz, as `tests/zoo/fetch.py` writes
them; default: a few of the corpus's families), first quiet and then busy, R rounds
(default 5) alternate aim at 1 and 2 threads (`aim bench --iters N --json`, its median)
and ONNX Runtime at 1 and 2 threads (N runs in this process, their median). Medians, not
minima: under contention the typical run is what a user waits for. Each busy process is
`python3 -c 'while True: pass'`, started by this script and ended by it; the scheduler
places them as it would any neighbour. Prints one row per model: the median over rounds
of each figure, aim 2T / aim 1T busy (claim: at most 1.10), and aim / ORT at 2 threads
quiet and busy.
Needs: onnxruntime, numpy.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

DEFAULT = ["ppocr_v4_rec", "minilm_l6", "smart_turn_v3", "nudenet_320n", "ddddocr_ocr", "oww_embedding"]


def aim_median(binary, model, npz, threads, iters):
    cmd = [binary, "bench", model, "--inputs", npz, "--threads", str(threads), "--iters", str(iters), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["latency_ms"]["median"]


def ort_median(session, feeds, iters):
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(binary, model, npz, sessions, feeds, rounds, iters):
    """Median over rounds of each engine's median: aim1, aim2, ort1, ort2."""
    got = {k: [] for k in ("aim1", "aim2", "ort1", "ort2")}
    for _ in range(rounds):
        for t in (1, 2):
            got[f"aim{t}"].append(aim_median(binary, model, npz, t, iters))
            got[f"ort{t}"].append(ort_median(sessions[t], feeds, iters))
    return {k: statistics.median(v) for k, v in got.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("aim")
    p.add_argument("zoo")
    p.add_argument("names", nargs="*")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--busy", type=int, default=1)
    a = p.parse_args()
    names = a.names or DEFAULT
    print(f"{os.cpu_count()} logical CPUs; busy phase: {a.busy} spinning process(es); medians of {a.rounds} rounds")
    header = "| model | quiet aim 1T / 2T ms | quiet ORT 1T / 2T ms | busy aim 1T / 2T ms | busy ORT 1T / 2T ms"
    print(header + " | busy aim 2T / 1T | aim / ORT at 2T quiet | aim / ORT at 2T busy |")
    print("|---" * 8 + "|")
    worst = 0.0
    for name in names:
        model, npz = os.path.join(a.zoo, f"{name}.onnx"), os.path.join(a.zoo, f"{name}.inputs.npz")
        feeds = dict(np.load(npz))
        sessions = {}
        for t in (1, 2):
            so = ort.SessionOptions()
            so.intra_op_num_threads = t
            so.inter_op_num_threads = 1
            so.log_severity_level = 3
            sessions[t] = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            for _ in range(3):
                sessions[t].run(None, feeds)
        quiet = measure(a.aim, model, npz, sessions, feeds, a.rounds, a.iters)
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
        try:
            time.sleep(0.5)
            busy = measure(a.aim, model, npz, sessions, feeds, a.rounds, a.iters)
        finally:
            for s in spinners:
                s.kill()
                s.wait()
        scaling = busy["aim2"] / busy["aim1"]
        worst = max(worst, scaling)
        print(
            f"| {name} | {quiet['aim1']:.2f} / {quiet['aim2']:.2f} | {quiet['ort1']:.2f} / {quiet['ort2']:.2f} "
            f"| {busy['aim1']:.2f} / {busy['aim2']:.2f} | {busy['ort1']:.2f} / {busy['ort2']:.2f} "
            f"| {scaling:.2f} | {quiet['aim2'] / quiet['ort2']:.2f} | {busy['aim2'] / busy['ort2']:.2f} |",
            flush=True,
        )
    print(f"worst busy aim 2T / 1T: {worst:.2f} (claim: at most 1.10)")


if __name__ == "__main__":
    main()
