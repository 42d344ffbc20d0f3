#!/usr/bin/env python3
"""The C API from C: builds examples/c/run_model.c with gcc against libaim.so and
include/aim.h, and once more against libaim_runtime.so alone, runs it on benchmark
models — each from its ONNX file, from the `.aim` file `aim compile` makes of it, and from
the shared object `aim compile --target` makes of it (through both libraries) — and checks
that its output is bit for bit what `aim run` gives the ONNX model for the same input (same
threads, same program). With --timed N, it also times N runs of the ONNX model (JIT) and of
the shared object in the same C host, alternating, and prints the ratio.

With --cross aarch64, it builds the runtime-only example with aarch64-linux-gnu-gcc
against LIBDIR's AArch64 libaim_runtime.so, compiles each model with `aim compile --target
aarch64-unknown-linux-gnu`, runs it under qemu-aarch64, and compares the output with `aim
run` on this machine within a tolerance (other kernels, so other rounding).

Usage: c_api.py AIM_BINARY LIBDIR MODELS_DIR NAME... [--threads N] [--timed N] [--cross aarch64]

LIBDIR holds libaim.so and libaim_runtime.so (cargo build --release -p aim-capi -p
aim-runtime-capi puts them in target/release). Models are what tests/models/make_models.py
writes.
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx


def shape_args(models, name):
    """`--shape NAME=DIMS` for each input with symbolic dims, at the test input's shape."""
    feeds = dict(np.load(os.path.join(models, name + ".inputs.npz")))
    m = onnx.load(os.path.join(models, name + ".onnx"), load_external_data=False)
    args = []
    for i in m.graph.input:
        dims = i.type.tensor_type.shape.dim
        if i.name in feeds and any(not d.HasField("dim_value") for d in dims):
            args += ["--shape", i.name + "=" + "x".join(str(d) for d in feeds[i.name].shape)]
    return args


def feed(models, name, work):
    """The model's inputs as run_model takes them: comma-separated .bin files and dims, in
    the model's input order."""
    feeds = dict(np.load(os.path.join(models, name + ".inputs.npz")))
    m = onnx.load(os.path.join(models, name + ".onnx"), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    order = [i.name for i in m.graph.input if i.name not in inits]
    files, dims = [], []
    for k, input_name in enumerate(order):
        x = np.ascontiguousarray(feeds[input_name])
        path = os.path.join(work, f"{name}.in{k}.bin")
        x.tofile(path)
        files.append(path)
        dims.append("x".join(str(d) for d in x.shape))
    return ",".join(files), ",".join(dims)


def main():
    args = sys.argv[1:]
    threads, timed = "1", "0"
    if "--threads" in args:
        i = args.index("--threads")
        threads = args[i + 1]
        del args[i:i + 2]
    if "--timed" in args:
        i = args.index("--timed")
        timed = args[i + 1]
        del args[i:i + 2]
    cross = None
    if "--cross" in args:
        i = args.index("--cross")
        cross = args[i + 1]
        del args[i:i + 2]
    if len(args) < 4:
        sys.exit(__doc__)
    aim, libdir, models, names = args[0], args[1], args[2], args[3:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="aim-c-api-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    if cross:
        sys.exit(run_cross(cross, aim, libdir, models, names, threads, root, work))
    exe, exe_rt = os.path.join(work, "run_model"), os.path.join(work, "run_model_rt")
    for out, flags, lib in [(exe, [], "-laim"), (exe_rt, ["-DAIM_RUNTIME_ONLY"], "-laim_runtime")]:
        subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", *flags, "-I", os.path.join(root, "include"),
                        os.path.join(root, "examples", "c", "run_model.c"), "-L", libdir, lib, "-ldl",
                        "-Wl,-rpath," + os.path.abspath(libdir), "-o", out], check=True)
    failed = 0
    # Each model four times: its ONNX file, the .aim file `aim compile` makes of it, and the
    # shared object `aim compile --target` makes of it through libaim and through
    # libaim_runtime (the same outputs, bit for bit).
    runs = []
    host = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}[os.uname().machine]
    for name in names:
        onnx = os.path.join(models, name + ".onnx")
        runs.append((name, onnx, exe))
        compiled = os.path.join(work, name + ".aim")
        subprocess.run([aim, "compile", onnx, "-o", compiled], check=True, capture_output=True)
        runs.append((name + ".aim", compiled, exe))
        so = os.path.join(work, "lib" + name + ".so")
        # A model with symbolic dims gets a program specialised to the test input's shapes,
        # as the JIT specialises at run time (other shapes would run the generic program).
        r = subprocess.run([aim, "compile", onnx, "--target", host, "-o", so, *shape_args(models, name)],
                           check=True, capture_output=True, text=True)
        print(r.stdout.strip())
        runs.append((name + ".so", so, exe))
        runs.append((name + ".so (libaim_runtime)", so, exe_rt))
    times = {}
    for label, model, program in runs:
        name = label.split(".")[0]
        bin_in, dims = feed(models, name, work)
        bin_out = os.path.join(work, name + ".out.bin")
        r = subprocess.run([program, model, bin_in, bin_out, dims, threads], capture_output=True, text=True)
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
    failed += custom_ops(aim, host, root, work, exe, exe_rt)
    if int(timed) > 0:
        # JIT and shared object in the same C host, alternating rounds; medians of medians.
        for name in names:
            onnx, so = os.path.join(models, name + ".onnx"), os.path.join(work, "lib" + name + ".so")
            bin_in, dims = feed(models, name, work)
            bin_out = os.path.join(work, name + ".t.bin")
            got = {"jit": [], "so": []}
            for _ in range(5):
                for kind, model, program in [("jit", onnx, exe), ("so", so, exe_rt)]:
                    r = subprocess.run([program, model, bin_in, bin_out, dims, threads, timed],
                                       capture_output=True, text=True, check=True)
                    got[kind].append(float(r.stdout.split("median ", 1)[1].split(" ms")[0]))
            jit, so_ms = sorted(got["jit"])[2], sorted(got["so"])[2]
            print(f"time {name}: JIT {jit:.3f} ms, shared object {so_ms:.3f} ms, so/JIT {so_ms / jit:.3f} "
                  f"({threads} threads, median of 5 rounds of {timed} runs); {os.path.getsize(so) / 2**20:.1f} MiB")
    if failed:
        sys.exit(f"{failed} of {len(runs)} runs failed")


def custom_ops(aim, host, root, work, exe, exe_rt):
    """A model with custom ops from a C library (examples/custom_op/custom_ops.c, built with
    gcc), run from C (AIM_CUSTOM_OPS makes run_model register the library) as ONNX through
    libaim and as a compiled shared object through libaim and libaim_runtime: each equal to
    aim run on the same model with the ops written out in ONNX. Returns the failures."""
    import onnx
    from onnx import TensorProto, helper
    lib = os.path.join(work, "libcustom_ops.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(root, "include"),
                    os.path.join(root, "examples", "custom_op", "custom_ops.c"), "-o", lib], check=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    custom = helper.make_model(helper.make_graph(
        [helper.make_node("ScaleShift", ["x"], ["s"], domain="com.example", scale=2.0, shift=-1.0),
         helper.make_node("Relu", ["s"], ["r"]), helper.make_node("PairSum", ["r"], ["y"], domain="com.example")],
        "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]),
         helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Reshape", ["r", "pairs"], ["p"]),
         helper.make_node("ReduceSum", ["p", "axis"], ["y"], keepdims=0)], "g", [x], [y],
        [helper.make_tensor("k", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("b", TensorProto.FLOAT, [], [-1.0]),
         helper.make_tensor("pairs", TensorProto.INT64, [3], [0, -1, 2]),
         helper.make_tensor("axis", TensorProto.INT64, [1], [-1])]), opset_imports=[helper.make_opsetid("", 17)])
    paths = {k: os.path.join(work, f"{k}.onnx") for k in ("custom", "plain")}
    onnx.save(custom, paths["custom"])
    onnx.save(plain, paths["plain"])
    xv = np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32)
    bin_in, npz_in, want_npz = (os.path.join(work, f) for f in ("custom.in.bin", "custom.in.npz", "plain.out.npz"))
    xv.tofile(bin_in)
    np.savez(npz_in, x=xv)
    subprocess.run([aim, "run", paths["plain"], "--inputs", npz_in, "--outputs", want_npz], check=True, capture_output=True)
    with np.load(want_npz) as z:
        want = z["y"]
    so = os.path.join(work, "libcustom_model.so")
    subprocess.run([aim, "compile", paths["custom"], "--target", host, "-o", so, "--shape", "x=4x6",
                    "--custom-ops", lib], check=True, capture_output=True)
    env = dict(os.environ, AIM_CUSTOM_OPS=lib)
    failed = 0
    for label, model, program in [("custom ops (ONNX)", paths["custom"], exe), ("custom ops (.so)", so, exe),
                                  ("custom ops (.so, libaim_runtime)", so, exe_rt)]:
        out = os.path.join(work, "custom.out.bin")
        r = subprocess.run([program, model, bin_in, out, "4x6", "2"], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(f"FAIL {label}: run_model exited {r.returncode}\n{r.stdout}{r.stderr}")
            failed += 1
            continue
        got = np.fromfile(out, dtype=np.float32).reshape(want.shape)
        if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
            print(f"FAIL {label}: differs from the ops written out by {np.max(np.abs(got - want)):.3g}")
            failed += 1
        else:
            print(f"ok   {label}: equal to the ops written out in ONNX")
    # Without the library, the load fails naming the ops and how to provide them.
    r = subprocess.run([exe, paths["custom"], bin_in, os.path.join(work, "none.bin"), "4x6", "1"],
                       capture_output=True, text=True)
    if r.returncode == 0 or "com.example:PairSum" not in r.stderr or "aim_register_custom_ops_library" not in r.stderr:
        print(f"FAIL custom ops without the library: exit {r.returncode}, {r.stderr.strip()}")
        failed += 1
    else:
        print("ok   custom ops without the library: refused, naming the ops")
    return failed


def run_cross(arch, aim, libdir, models, names, threads, root, work):
    """Compiles each model for `arch`, runs it from C under QEMU, compares with aim run here."""
    if arch != "aarch64":
        return f"--cross {arch}: only aarch64 is supported"
    exe = os.path.join(work, "run_model_rt")
    subprocess.run(["aarch64-linux-gnu-gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", "-DAIM_RUNTIME_ONLY",
                    "-I", os.path.join(root, "include"), os.path.join(root, "examples", "c", "run_model.c"),
                    "-L", libdir, "-laim_runtime", "-ldl", "-Wl,-rpath," + os.path.abspath(libdir), "-o", exe],
                   check=True)
    failed = 0
    for name in names:
        onnx = os.path.join(models, name + ".onnx")
        so = os.path.join(work, "lib" + name + ".so")
        r = subprocess.run([aim, "compile", onnx, "--target", "aarch64-unknown-linux-gnu", "-o", so,
                            *shape_args(models, name)], check=True, capture_output=True, text=True)
        print(r.stdout.strip())
        bin_in, dims = feed(models, name, work)
        bin_out = os.path.join(work, name + ".out.bin")
        r = subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", exe, so, bin_in, bin_out, dims, threads],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {name} (aarch64): run_model exited {r.returncode}\n{r.stdout}{r.stderr}")
            failed += 1
            continue
        outs = os.path.join(work, name + ".aim-run.npz")
        subprocess.run([aim, "run", onnx, "--inputs", os.path.join(models, name + ".inputs.npz"), "--outputs", outs],
                       check=True, capture_output=True)
        first = r.stdout.split("output ", 1)[1].split(":", 1)[0]
        with np.load(outs) as z:
            want = z[first]
        got = np.fromfile(bin_out, dtype=want.dtype).reshape(want.shape)
        scale = max(1.0, float(np.max(np.abs(want))))
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        if not np.isfinite(got).all() or diff > 1e-4 * scale:
            print(f"FAIL {name} (aarch64): max abs diff {diff:.3g} from aim run here (scale {scale:.3g})")
            failed += 1
        else:
            print(f"ok   {name} (aarch64, QEMU): {want.dtype} {list(want.shape)}, max abs diff {diff:.3g} "
                  f"from aim run on this machine; {os.path.getsize(so) / 2**20:.1f} MiB")
    return f"{failed} of {len(names)} models failed" if failed else None


if __name__ == "__main__":
    main()
