#!/usr/bin/env python3
"""A decode step's achieved weight bandwidth against the machine's measured read bandwidth.

Usage: decode_bandwidth.py AIM_BINARY MODEL.onnx INPUTS.npz [--threads N] [--iters N]

Measures the read bandwidth N cores get with a STREAM-like kernel (N processes at once, each
numpy's dot of two 256 MiB float32 vectors on one thread: the best of five), then times the
decode step with `aim bench` and divides the bytes of its 4-bit weights (every MatMulNBits'
codes, scales and zero points; GatherBlockQuantized's table is read a row at a time and not
counted) by its median latency. A decode step streams each weight byte once, so that ratio
is the share of the machine's bandwidth the step uses; the rest of the step (attention,
norms, the key/value cache) counts against it. Needs: pip install onnx numpy.
"""
import json
import os
import subprocess
import sys


def option(args, name, default):
    if name in args:
        i = args.index(name)
        value = args[i + 1]
        del args[i:i + 2]
        return value
    return default


def read_bandwidth(threads):
    """GB/s that `threads` processes read together, each the best of five dots of two of its
    own 256 MiB f32 vectors (one BLAS thread each), started together."""
    code = (
        "import numpy as np, time\n"
        "a = np.ones(64 * 2**20, np.float32); b = np.ones_like(a); best = 1e9\n"
        "for _ in range(5):\n"
        "    t = time.perf_counter(); np.dot(a, b); best = min(best, time.perf_counter() - t)\n"
        "print(2 * a.nbytes / best / 1e9)\n"
    )
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(int(threads))]
    return sum(float(p.communicate()[0]) for p in procs)


def weight_bytes(model):
    import onnx
    m = onnx.load(model)
    inits = {t.name: t for t in m.graph.initializer}
    total = 0
    for n in m.graph.node:
        if n.op_type == "MatMulNBits":
            for name in list(n.input)[1:4]:
                if name in inits:
                    t = inits[name]
                    total += len(t.raw_data) if t.raw_data else onnx.numpy_helper.to_array(t).nbytes
    return total


def main():
    args = sys.argv[1:]
    threads = option(args, "--threads", "1")
    iters = option(args, "--iters", "30")
    if len(args) != 3 or any(a.startswith("-") for a in args):
        sys.exit(__doc__)
    aim, model, inputs = args
    bw = read_bandwidth(threads)
    out = subprocess.run([aim, "bench", model, "--inputs", inputs, "--threads", threads, "--iters", iters, "--json"],
                         check=True, capture_output=True, text=True).stdout
    ms = json.loads(out.strip().splitlines()[-1])["latency_ms"]["median"]
    w = weight_bytes(model)
    got = w / (ms / 1e3) / 1e9
    print(f"read bandwidth ({threads} thread(s), numpy dot): {bw:.1f} GB/s")
    print(f"decode step: {ms:.3f} ms, {w / 2**20:.0f} MiB of 4-bit weights -> {got:.1f} GB/s = "
          f"{100 * got / bw:.0f}% of the read bandwidth")


if __name__ == "__main__":
    main()
