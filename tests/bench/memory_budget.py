#!/usr/bin/env python3
"""Peak resident memory and latency under `--memory-budget` (`aim::budget`).

For a model (best a `.aim` file, whose weights are read in place and can be handed back
between uses): its default peak RSS, then budgets at fractions of it (60% and 35% by
default). Each configuration runs `aim bench` in fresh processes, in alternating rounds;
the peak is the process's maximum resident set as `/usr/bin/time` reports it, the latency
the median of the rounds' medians. A budget that cannot be met prints aim's error.

    python3 tests/bench/memory_budget.py target/release/aim MODEL.aim INPUTS.npz [--threads 1]
"""

import argparse
import json
import re
import statistics
import subprocess
import sys


def bench(aim, model, inputs, threads, iters, budget):
    cmd = ["/usr/bin/time", "-f", "maxrss_kb=%M", aim, "bench", model, "--inputs", inputs, "--threads", str(threads),
           "--iters", str(iters), "--json"]
    if budget:
        cmd += ["--memory-budget", str(budget)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, next((l for l in r.stderr.splitlines() if l.startswith("error")), r.stderr.strip())
    peak = int(re.search(r"maxrss_kb=(\d+)", r.stderr).group(1)) / 1024
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    plan = next((l for l in r.stdout.splitlines() if l.startswith("memory budget")), "")
    return peak, stats["latency_ms"]["median"], plan


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("aim")
    ap.add_argument("model")
    ap.add_argument("inputs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fractions", default="0.6,0.35")
    a = ap.parse_args()
    base_peak, _, _ = bench(a.aim, a.model, a.inputs, a.threads, 3, None)
    if base_peak is None:
        sys.exit("the model does not run")
    budgets = [None] + [int(base_peak * float(f) * (1 << 20)) for f in a.fractions.split(",")]
    results = {b: ([], [], "") for b in budgets}
    for _ in range(a.rounds):
        for b in budgets:
            peak, ms, plan = bench(a.aim, a.model, a.inputs, a.threads, a.iters, b)
            if peak is None:
                results[b] = (None, None, plan)
                continue
            if results[b][0] is not None:
                results[b][0].append(peak)
                results[b][1].append(ms)
                results[b] = (results[b][0], results[b][1], plan)
    print(f"{a.model}, {a.threads} thread(s), {a.rounds} alternating rounds")
    print("| budget | peak RSS MiB | median ms | latency cost |")
    print("|---|---|---|---|")
    base_ms = statistics.median(results[None][1])
    for b in budgets:
        peaks, mss, plan = results[b]
        name = "none" if b is None else f"{b / (1 << 20):.0f} MiB ({b / (1 << 20) / base_peak:.0%})"
        if peaks is None:
            print(f"| {name} | refused: {plan} | | |")
            continue
        ms = statistics.median(mss)
        print(f"| {name} | {max(peaks):.1f} | {ms:.2f} | {ms / base_ms - 1:+.1%} |")
    for b in budgets[1:]:
        if results[b][2]:
            print(f"plan at {b / (1 << 20):.0f} MiB: {results[b][2]}")


if __name__ == "__main__":
    main()
