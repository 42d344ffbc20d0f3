#!/usr/bin/env python3
"""The C API from C: builds examples/c/run_model.c with gcc against libaim.so and
include/aim.h, runs it on benchmark models — each from its ONNX file and from the `.aim`
file `aim compile` makes of it — and checks that its output is bit for bit what `aim run`
gives the ONNX model for the same input (same threads, same program).

Usage: c_api.py AIM_BINARY LIBDIR MODELS_DIR NAME... [--threads N]

LIBDIR holds libaim.so (cargo build --release -p aim-capi puts it in target/release).
Models are what tests/models/make_models.py writes; each must have one input.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np


def main():
    args = sys.argv[1:]
    threads = "1"
    if "--threads" in args:
        i = args.index("--threads")
        threads = args[i + 1]
        del args[i:i + 2]
    if len(args) < 4:
        sys.exit(__doc__)
    aim, libdir, models, names = args[0], args[1], args[2], args[3:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="aim-c-api-")
    exe = os.path.join(work, "run_model")
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", "-I", os.path.join(root, "include"),
                    os.path.join(root, "examples", "c", "run_model.c"), "-L", libdir, "-laim",
                    "-Wl,-rpath," + os.path.abspath(libdir), "-o", exe], check=True)
    failed = 0
    # Each model twice: its ONNX file, and the .aim file `aim compile` makes of it (the
    # same outputs, bit for bit).
    runs = []
    for name in names:
        runs.append((name, os.path.join(models, name + ".onnx")))
        compiled = os.path.join(work, name + ".aim")
        subprocess.run([aim, "compile", runs[-1][1], "-o", compiled], check=True, capture_output=True)
        runs.append((name + ".aim", compiled))
    for label, model in runs:
        name = label.removesuffix(".aim")
        feeds = dict(np.load(os.path.join(models, name + ".inputs.npz")))
        if len(feeds) != 1:
            sys.exit(f"{label}: has {len(feeds)} inputs; run_model feeds one")
        (x,) = feeds.values()
        x = np.ascontiguousarray(x)
        bin_in, bin_out = os.path.join(work, name + ".in.bin"), os.path.join(work, name + ".out.bin")
        x.tofile(bin_in)
        dims = "x".join(str(d) for d in x.shape)
        r = subprocess.run([exe, model, bin_in, bin_out, dims, threads], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {label}: run_model exited {r.returncode}\n{r.stdout}{r.stderr}")
            failed += 1
            continue
        outs = os.path.join(work, name + ".aim-run.npz")
        subprocess.run([aim, "run", os.path.join(models, name + ".onnx"), "--inputs", os.path.join(models, name + ".inputs.npz"), "--outputs", outs,
                        "--threads", threads], check=True, capture_output=True)
        with np.load(outs) as z:
            want = z[z.files[0]] if len(z.files) == 1 else None
            if want is None:
                # The first graph output: run_model writes output 0.
                first = r.stdout.split("output ", 1)[1].split(":", 1)[0]
                want = z[first]
        got = np.fromfile(bin_out, dtype=want.dtype).reshape(want.shape)
        if got.tobytes() != want.tobytes():
            diff = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
            print(f"FAIL {label}: the C API's output differs from aim run's (max abs diff {diff:.3g})")
            failed += 1
        else:
            refused = [line for line in r.stdout.splitlines() if line.startswith("a half-sized input is refused")]
            print(f"ok   {label}: {want.dtype} {list(want.shape)} identical to aim run; {refused[0] if refused else ''}")
    if failed:
        sys.exit(f"{failed} of {len(names)} models failed")


if __name__ == "__main__":
    main()
