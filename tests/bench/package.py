#!/usr/bin/env python3
"""One .aim file for every target (`aim compile --target all`) against single-target files.

For each model: the ONNX file's size; the package's size and conversion time; a
single-target file's (this CPU) size and conversion time; which program loading picks here
and under each `--cpu` cap this CPU supports; whether the package's outputs are
bit-identical to those of the single-target file compiled for the same level; and the load
time of each (the package packs its weights at load, the single-target file does not).

    python3 tests/bench/package.py target/release/aim target/models resnet50 mobilenetv2 bert_l6
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

LEVELS = ["x86-64-v4", "x86-64-v3", "x86-64-v2", "baseline"]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def timed(cmd):
    t0 = time.perf_counter()
    run(cmd)
    return time.perf_counter() - t0


def outputs(aim, model, inputs, out, cpu):
    run([aim, "run", model, "--inputs", inputs, "--outputs", out, "--threads", "1", "--cpu", cpu])
    with np.load(out) as z:
        return {k: z[k].copy() for k in z.files}


def load_ms(aim, model, inputs, cpu, rounds):
    ms = []
    for _ in range(rounds):
        j = run([aim, "bench", model, "--inputs", inputs, "--iters", "1", "--threads", "1", "--cpu", cpu, "--json"])
        ms.append(json.loads(j.strip().splitlines()[-1])["compile_ms"])
    return float(np.median(ms))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("aim")
    ap.add_argument("dir")
    ap.add_argument("names", nargs="+")
    ap.add_argument("--rounds", type=int, default=3, help="load-time rounds (median)")
    a = ap.parse_args()
    aim = os.path.abspath(a.aim)
    info = run([aim, "info", "--target"])
    host = re.search(r"level[: =]+(\S+)", info)
    host = host.group(1) if host else "x86-64-v4"
    levels = LEVELS[LEVELS.index(host):] if host in LEVELS else []
    mib = lambda b: b / (1 << 20)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        print("| model | ONNX MiB | package MiB | package s | single-target MiB | single-target s | picked here | capped picks, bit-identical | load ms package / single |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in a.names:
            onnx = os.path.join(a.dir, f"{name}.onnx")
            inputs = os.path.join(a.dir, f"{name}.inputs.npz")
            pkg = os.path.join(tmp, f"{name}.all.aim")
            single = os.path.join(tmp, f"{name}.aim")
            t_pkg = timed([aim, "compile", onnx, "-o", pkg, "--target", "all"])
            t_single = timed([aim, "compile", onnx, "-o", single])
            listing = run([aim, "info", pkg])
            here = re.search(r"program \d+: \S+ (\S+ \S+) .*\(runs here\)", listing)
            picks = []
            for level in levels:
                lone = os.path.join(tmp, f"{name}.{level}.aim")
                run([aim, "compile", onnx, "-o", lone, "--cpu", level])
                got = outputs(aim, pkg, inputs, os.path.join(tmp, "p.npz"), level)
                want = outputs(aim, lone, inputs, os.path.join(tmp, "s.npz"), level)
                same = got.keys() == want.keys() and all(got[k].tobytes() == want[k].tobytes() for k in got)
                failed |= not same
                picks.append(f"{level}: {'yes' if same else 'NO'}")
            lp = load_ms(aim, pkg, inputs, "native", a.rounds)
            ls = load_ms(aim, single, inputs, "native", a.rounds)
            print(
                f"| {name} | {mib(os.path.getsize(onnx)):.1f} | {mib(os.path.getsize(pkg)):.1f} | {t_pkg:.1f} "
                f"| {mib(os.path.getsize(single)):.1f} | {t_single:.1f} | {here.group(1) if here else '?'} "
                f"| {', '.join(picks)} | {lp:.0f} / {ls:.0f} |",
                flush=True,
            )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
