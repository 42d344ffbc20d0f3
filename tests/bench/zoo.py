#!/usr/bin/env python3
"""The real-model corpus against ONNX Runtime and OpenVINO, natively and on the AVX2 path.

Usage: zoo.py AIM_BINARY [ZOO_DIR] [NAME...] [--threads 1,2] [--rounds 3] [--iters 30]
              [--paths native,avx2] [--no-timing] [--busy N] [--json FILE] [--markdown FILE]

ZOO_DIR (default target/zoo) is what tests/zoo/fetch.py writes: NAME.onnx and
NAME.inputs.npz for every entry of tests/zoo/manifest.toml. For each model:

- accuracy: ONNX Runtime runs it with all graph optimisations and with none; aim (cpu
  backend, natively and with --cpu x86-64-v3) passes when its largest difference from the
  nearer of ORT's two runs, relative to the output's largest magnitude, is within ORT's own
  spread between them, or 1e-3 where that is smaller. A model quantized from a corpus model
  (a [[derived]] entry) may also differ by a tenth of the quantization's own error (ORT's
  quantized output against ORT's f32 output of the source model): a rounding that flips
  in one activation moves everything after it, as it does between ORT's own ISAs;
  where aim is outside that and the model has integer products, both are also compared
  with an exact oracle (tests/exact_int.py: the products in int64, every other node run
  alone by ORT): where ORT itself is further from it than the tolerance (its u8 x s8 sums
  saturate on CPUs without VNNI), aim passes when it is within the tolerance of the oracle,
  and the line says so;
- census: the nodes the specialised program leaves on reference kernels (`aim info`, and
  after runs `aim bench`, which also sees fast kernels that declined a node), and the
  three ops that take most time (`aim bench --profile`);
- speed: median latency at each thread count, alternating R rounds of fresh processes of
  ORT, OpenVINO and aim (tests/bench/side_by_side.py's children), load time and peak RSS.
  The native path compares aim with the faster peer; the AVX2 path runs aim with
  --cpu x86-64-v3 and OpenVINO with ONEDNN_MAX_CPU_ISA=AVX2, and counts the primitives of
  OpenVINO's execution graph that still name AVX-512 or AMX (its own JIT kernels for
  eltwise and pooling do not read oneDNN's cap), so the table says how capped the peer is.

--busy N keeps N other processes spinning (`yes > /dev/null`) while it times: the
contention figure (on a 2-vCPU machine with one core busy, aim at 2 threads must not be
slower than at 1 by more than 10%). Prints one line per model and thread count as it goes; --markdown writes the table that
README.md's benchmark section holds, --json every figure. Needs: onnxruntime, openvino,
numpy, onnx.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import tomllib

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from side_by_side import aim_round, cpu_name, peer_round  # noqa: E402
from exact_int import OPS as INTEGER_PRODUCTS, exact_reference  # noqa: E402

MANIFEST = os.path.join(HERE, "..", "zoo", "manifest.toml")
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
TOL = 1e-3

OV_PRIMITIVES = r"""
import collections, json, sys
import numpy as np, openvino as ov
path, inputs = sys.argv[1], sys.argv[2]
feeds = dict(np.load(inputs))
core = ov.Core()
m = core.read_model(path)
m.reshape({name: list(a.shape) for name, a in feeds.items()})
c = core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})
kinds = collections.Counter()
for op in c.get_runtime_model().get_ops():
    info = op.get_rt_info()
    if "primitiveType" in info:
        kinds[info["primitiveType"].astype(str)] += 1
print(json.dumps(kinds))
"""


def corpus():
    """Every corpus entry of the manifest, models, derived then exported ones, as (name, meta)."""
    with open(MANIFEST, "rb") as f:
        m = tomllib.load(f)
    return [(e["name"], e) for e in m.get("model", []) + m.get("derived", []) + m.get("exported", [])]


def ort_outputs(path, feeds, level):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.graph_optimization_level = level
    s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
    return dict(zip([x.name for x in s.get_outputs()], s.run(None, feeds)))


def aim_outputs(aim, path, inputs, cpu):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.npz")
        r = subprocess.run([aim, "run", path, "--inputs", inputs, "--outputs", out, "--cpu", cpu],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        return dict(np.load(out)), None


def rel_diff(a, b):
    """Largest |a - b| relative to b's largest magnitude (0 for empty outputs)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not b.size:
        return 0.0
    return float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-30)


def accuracy(aim, path, inputs, source=None):
    """aim's error against ORT's nearer run, and the tolerance (ORT's spread or 1e-3, or a
    tenth of the quantization error where `source` is the f32 model it was quantized from)."""
    feeds = dict(np.load(inputs))
    full = ort_outputs(path, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    none = ort_outputs(path, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    spread = max(rel_diff(none[k], full[k]) for k in full)
    result = {"ort_spread": spread}
    tol = max(TOL, spread)
    if source:
        f32 = ort_outputs(source, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        result["quantization_error"] = max(rel_diff(full[k], f32[k]) for k in full)
        tol = max(tol, result["quantization_error"] / 10)
    result["tolerance"] = tol
    for cpu in ("native", "x86-64-v3"):
        got, err = aim_outputs(aim, path, inputs, cpu)
        if got is None:
            result[cpu] = {"error": err, "ok": False}
            continue
        missing = [k for k in full if k not in got]
        if missing:
            result[cpu] = {"error": f"outputs missing: {missing}", "ok": False}
            continue
        e = max(min(rel_diff(got[k], full[k]), rel_diff(got[k], none[k])) for k in full)
        result[cpu] = {"error_rel": e, "ok": e <= tol}
        if e > tol and exact_oracle(result, path, feeds, full) is not None:
            e = max(rel_diff(got[k], result["exact"][k]) for k in full)
            result[cpu] = {"error_rel": e, "ok": e <= tol, "against": "exact"}
    result.pop("exact", None)
    return result


def exact_oracle(result, path, feeds, full):
    """The exact oracle's outputs (kept in `result["exact"]`, ORT's distance from them in
    `result["ort_from_exact"]`) where the model has integer products and ORT is further
    from the oracle than the tolerance; else None."""
    if "exact" not in result:
        result["exact"] = None
        model = onnx.load(path)
        if any(n.op_type in INTEGER_PRODUCTS for n in model.graph.node):
            exact = exact_reference(model, feeds)
            if exact is not None:
                off = max(rel_diff(full[k], exact[k]) for k in full)
                if off > result["tolerance"]:
                    result["exact"], result["ort_from_exact"] = exact, off
    return result["exact"]


def symbolic_shapes(path, inputs):
    """--shape arguments binding every input that has a symbolic dim to its .npz shape."""
    model = onnx.load(path, load_external_data=False)
    feeds = dict(np.load(inputs))
    args = []
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        if i.name in feeds and any(not d.HasField("dim_value") for d in dims) and feeds[i.name].ndim:
            args += ["--shape", f"{i.name}=" + "x".join(str(d) for d in feeds[i.name].shape)]
    return args


def census(aim, path, inputs, cpu):
    """Reference-kernel nodes of the specialised program, and the top three ops by time."""
    info = subprocess.run([aim, "info", path, "--cpu", cpu] + symbolic_shapes(path, inputs),
                          capture_output=True, text=True)
    reference, names = 0, ""
    for line in info.stdout.splitlines():
        m = re.match(r"\s+(\d+)\s+reference kernels \(fallback\): (.*)", line)
        if m:
            reference, names = int(m.group(1)), m.group(2)
    with tempfile.TemporaryDirectory() as tmp:
        prof = subprocess.run([aim, "bench", path, "--inputs", inputs, "--iters", "5", "--threads", "1", "--cpu", cpu,
                               "--profile", os.path.join(tmp, "trace.json")], capture_output=True, text=True)
    top = []
    for line in prof.stdout.splitlines():
        # Counted again after runs: a fast kernel that declined a node shows only then.
        m = re.match(r"nodes on reference kernels in these runs: (\d+) ?(.*)", line)
        if m and int(m.group(1)) >= reference:
            reference, names = int(m.group(1)), m.group(2)
        m = re.match(r"\s+([\d.]+)%\s+[\d.]+ us\s+\d+ x (\S+)", line)
        if m and len(top) < 3:
            top.append(f"{m.group(2)} {float(m.group(1)):.0f}%")
    return {"reference_nodes": reference, "reference_names": names, "top_ops": top,
            "info_ok": info.returncode == 0, "profile_ok": prof.returncode == 0}


def ov_avx512_primitives(path, inputs):
    """How many primitives of OpenVINO's capped execution graph still use AVX-512 or AMX."""
    r = subprocess.run([sys.executable, "-c", OV_PRIMITIVES, path, inputs], capture_output=True, text=True,
                       env={**os.environ, **AVX2_ENV})
    if r.returncode != 0:
        return None
    kinds = json.loads(r.stdout.strip().splitlines()[-1])
    return sum(n for k, n in kinds.items() if "avx512" in k or "amx" in k)


def timing(aim, path, inputs, threads, rounds, iters, path_kind):
    """Medians over alternating rounds: the peers and aim, natively or on the AVX2 path."""
    if path_kind == "native":
        peers, env, cpu = ["ort", "openvino"], None, "native"
    else:
        peers, env, cpu = ["openvino"], AVX2_ENV, "x86-64-v3"
    # A peer that cannot load the model (OpenVINO's ONNX frontend refuses some) is left out
    # and named; aim is then compared with the peers that ran.
    failed = {}
    probe = None
    for p in list(peers):
        try:
            r = peer_round(p, path, inputs, threads, 5, 2, env)
            probe = probe or r
        except subprocess.CalledProcessError as e:
            # A peer killed by a signal (OpenVINO crashes on some models under the AVX2 cap)
            # prints nothing: say which signal.
            died = f"crashed (signal {-e.returncode})" if e.returncode < 0 else f"exit status {e.returncode}"
            failed[p] = (e.stderr or "").strip().splitlines()[-1:] or [died]
            peers.remove(p)
    base = probe["median"] if probe else aim_round(aim, path, inputs, threads, 5, 2, cpu)["median"]
    n = min(5000, max(iters, int(300.0 / max(base, 1e-3))))
    warm = max(3, n // 10)
    runs = {p: [] for p in peers + ["aim"]}
    for _ in range(rounds):
        for p in peers:
            runs[p].append(peer_round(p, path, inputs, threads, n, warm, env))
        runs["aim"].append(aim_round(aim, path, inputs, threads, n, warm, cpu))
    out = {p: {k: statistics.median(r[k] for r in rs) for k in ("median", "load_ms", "peak_rss_mb")}
           for p, rs in runs.items()}
    out["failed"] = failed
    return out


def main():
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        return
    opts = {"--threads": "1,2", "--rounds": "3", "--iters": "30", "--paths": "native,avx2", "--json": "",
            "--markdown": ""}
    for k in list(opts):
        if k in args:
            i = args.index(k)
            opts[k] = args[i + 1]
            del args[i:i + 2]
    no_timing = "--no-timing" in args
    if no_timing:
        args.remove("--no-timing")
    busy = 0
    if "--busy" in args:
        i = args.index("--busy")
        busy = int(args[i + 1])
        del args[i:i + 2]
    spinners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(busy)]
    try:
        run(args, opts, no_timing)
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def run(args, opts, no_timing):
    """Measures the models `args` names (see the module doc)."""
    if not args:
        sys.exit(__doc__)
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        sys.exit(f"zoo.py: unknown option {unknown[0]} (see --help)")
    aim = args[0]
    if not (os.path.isfile(aim) and os.access(aim, os.X_OK)):
        sys.exit(f"zoo.py: {aim}: not an executable aim binary (build it with cargo build --release)")
    zoo = args[1] if len(args) > 1 else os.path.join("target", "zoo")
    only = set(args[2:])
    names = {name for name, _ in corpus()}
    if only - names:
        sys.exit(f"zoo.py: not in tests/zoo/manifest.toml: {', '.join(sorted(only - names))}")
    threads = [int(t) for t in opts["--threads"].split(",")]
    paths = opts["--paths"].split(",")
    rounds, iters = int(opts["--rounds"]), int(opts["--iters"])
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores; onnxruntime {ort.__version__}", flush=True)
    results = []
    for name, meta in corpus():
        if only and name not in only:
            continue
        path, inputs = os.path.join(zoo, name + ".onnx"), os.path.join(zoo, name + ".inputs.npz")
        if not os.path.exists(path):
            print(f"{name}: missing (run tests/zoo/fetch.py)", flush=True)
            continue
        r = {"name": name, "exporter": meta.get("exporter", ""), "family": meta.get("family", "")}
        source = os.path.join(zoo, meta["from"] + ".onnx") if "from" in meta else None
        r["accuracy"] = accuracy(aim, path, inputs, source)
        r["census"] = census(aim, path, inputs, "native")
        r["census_avx2"] = census(aim, path, inputs, "x86-64-v3")
        r["ov_avx512_when_capped"] = ov_avx512_primitives(path, inputs) if "avx2" in paths else None
        a = r["accuracy"]
        acc = " ".join(f"{cpu}:{'ok' if a[cpu]['ok'] else 'FAIL'}"
                       f"({a[cpu].get('error_rel', float('nan')):.1e}{'' if 'error' not in a[cpu] else ' ' + a[cpu]['error']})"
                       for cpu in ("native", "x86-64-v3"))
        if "ort_from_exact" in a:
            acc += (f" (against exact integer products: ORT is {a['ort_from_exact']:.1e} from them on this CPU,"
                    " its u8 x s8 pair sums saturate without VNNI)")
        print(f"{name}: accuracy {acc} tol {a['tolerance']:.1e}; reference nodes {r['census']['reference_nodes']}"
              f" {r['census']['reference_names']}; top {', '.join(r['census']['top_ops'])}", flush=True)
        r["timing"] = {}
        # Timed when aim runs it, also outside ORT's spread (the table marks those).
        if not no_timing and "error" not in a["native"]:
            for kind in paths:
                for t in threads:
                    try:
                        tm = timing(aim, path, inputs, t, rounds, iters, kind)
                    except subprocess.CalledProcessError as e:
                        print(f"{name} {kind} {t}: failed: {(e.stderr or '').strip()[-300:]}", flush=True)
                        continue
                    r["timing"][f"{kind}/{t}"] = tm
                    print(f"{name} {kind} t={t}: " + " ".join(
                        f"{p} {v['median']:.3f} ms" for p, v in tm.items() if p != "failed") + "  " + ratio_text(tm)
                        + "".join(f"  ({p} failed: {why[0][:120]})" for p, why in tm["failed"].items()), flush=True)
        results.append(r)
    if opts["--json"]:
        with open(opts["--json"], "w") as f:
            json.dump({"cpu": cpu_name(), "results": results}, f, indent=1)
    if opts["--markdown"]:
        with open(opts["--markdown"], "w") as f:
            f.write(markdown(results, threads, paths))


def ratio_text(tm):
    """aim against the faster peer that ran ("—" where none did)."""
    aim_ms = tm["aim"]["median"]
    peers = [v["median"] for p, v in tm.items() if p not in ("aim", "failed")]
    if not peers:
        return "aim/best —"
    return f"aim/best {aim_ms / min(peers):.2f}"


def markdown(results, threads, paths):
    """The README table: one row per model, aim/best peer per path and thread count."""
    cols = [f"{k} {t}T" for k in paths for t in threads]
    head = "| model | exporter | " + " | ".join(f"aim/best {c}" if c.startswith("native") else f"aim/OV {c}"
                                              for c in cols)
    head += " | aim ms (native 1T) | load ms aim / ORT | peak MiB aim / ORT | ref. nodes | top ops (aim) | notes |\n"
    out = head + "|" + "---|" * (len(cols) + 8) + "\n"
    for r in results:
        cells = []
        for k in paths:
            for t in threads:
                tm = r["timing"].get(f"{k}/{t}")
                cells.append(ratio_text(tm).split()[-1] if tm else "—")
        n1 = r["timing"].get(f"native/{threads[0]}")
        ms = f"{n1['aim']['median']:.2f}" if n1 else "—"
        have_ort = n1 and "ort" in n1
        load = f"{n1['aim']['load_ms']:.0f} / {n1['ort']['load_ms']:.0f}" if have_ort else "—"
        rss = f"{n1['aim']['peak_rss_mb']:.0f} / {n1['ort']['peak_rss_mb']:.0f}" if have_ort else "—"
        acc = r["accuracy"]["native"]
        name = r["name"] + ("" if acc["ok"] else " (**outside ORT's spread**)")
        failed = {}
        for key, tm in r["timing"].items():
            for p in tm.get("failed", {}):
                failed.setdefault(p, set()).add(key.split("/")[0])
        notes = [f"{p} fails ({', '.join(sorted(k))} path)" for p, k in sorted(failed.items())]
        if r.get("ov_avx512_when_capped"):
            notes.append(f"OV capped still runs {r['ov_avx512_when_capped']} AVX-512 primitives")
        if "error_rel" in acc:
            notes.append(f"max rel. diff {acc['error_rel']:.1e}"
                         + (f" from exact integer products (ORT is {r['accuracy']['ort_from_exact']:.1e} from them:"
                            " u8 x s8 saturation without VNNI)" if acc.get("against") == "exact" else ""))
        out += (f"| {name} | {r['exporter']} | " + " | ".join(cells) + f" | {ms} | {load} | {rss} | "
                f"{r['census']['reference_nodes']} | {', '.join(r['census']['top_ops'])} | {'; '.join(notes)} |\n")
    return out


if __name__ == "__main__":
    main()
