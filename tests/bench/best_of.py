"""One model, aim against ONNX Runtime and OpenVINO, as the best of alternating rounds.

Usage: best_of.py MODEL.onnx INPUTS.npz THREADS [ROUNDS=5] [ITERS=10] [AIM_BINARY...]

On a shared machine a median moves with the other tenants; the fastest run of each
engine, taken in rounds that alternate between them, is what the engines can do. Each
round times ONNX Runtime and OpenVINO in this process (ITERS runs each, after a warm-up)
and then every aim binary given (default target/release/aim) through `aim bench --iters
ITERS --json` (its minimum). Prints each engine's best and the median of its round
minima, and aim's best over the faster peer's best. Several aim binaries (builds before
and after a change) are timed in the same rounds, so their ratio is measured in one run.
The peers' times include Python's call overhead (tens of microseconds): for models that
run in under a millisecond, `zoo.py`'s fresh-process figures are the fair comparison.
Needs: onnxruntime, openvino (optional), numpy.
"""

import json
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model, npz, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    iters = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    binaries = sys.argv[6:] or ["target/release/aim"]
    feeds = dict(np.load(npz))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    engines = {"onnxruntime": lambda: session.run(None, feeds)}
    try:
        import openvino

        core = openvino.Core()
        core.set_property("CPU", {"INFERENCE_NUM_THREADS": threads})
        request = core.compile_model(model, "CPU").create_infer_request()
        engines["openvino"] = lambda: request.infer(feeds)
    except Exception as e:  # a model OpenVINO cannot convert: timed without it
        print(f"openvino cannot run the model: {str(e).splitlines()[0][:100]}")
    best = {name: [] for name in list(engines) + binaries}
    for run in engines.values():
        for _ in range(3):
            run()
    for _ in range(rounds):
        for name, run in engines.items():
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            best[name].append(min(times) * 1e3)
        for binary in binaries:
            cmd = [binary, "bench", model, "--inputs", npz, "--threads", str(threads), "--iters", str(iters), "--json"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            best[binary].append(json.loads(out.strip().splitlines()[-1])["latency_ms"]["min"])
    for name, v in best.items():
        print(f"{name:32s} best {min(v):9.3f} ms   median of round minima {statistics.median(v):9.3f} ms")
    peer = min(min(best[name]) for name in engines)
    for binary in binaries:
        print(f"{binary}: aim / best peer {min(best[binary]) / peer:.3f}")


if __name__ == "__main__":
    main()
