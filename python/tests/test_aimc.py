"""aim's Python package against ONNX Runtime: the same models, the same inputs, the same
API. The models are what tests/models/make_models.py writes, in the directory AIM_MODELS
names (tests/run.sh sets it)."""

import os
import threading

import numpy as np
import onnxruntime as ort
import pytest

import aimc

MODELS = os.environ.get("AIM_MODELS")
needs_models = pytest.mark.skipif(not MODELS, reason="AIM_MODELS is not set (tests/run.sh sets it)")

BENCHMARK = ["mlp", "mlp_b64", "mobilenetv2", "bert_l6", "resnet50", "yolo_like", "gpt2_step"]


def path(name):
    return os.path.join(MODELS, name + ".onnx")


def feeds(name):
    with np.load(os.path.join(MODELS, name + ".inputs.npz")) as z:
        return {k: z[k] for k in z.files}


def ort_session(name):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    return ort.InferenceSession(path(name), o, providers=["CPUExecutionProvider"])


def close(got, want):
    """Within 1e-3 of the output's largest magnitude (integers exactly)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if np.issubdtype(want.dtype, np.floating):
        scale = max(float(np.max(np.abs(want))), 1e-6)
        assert float(np.max(np.abs(got.astype(np.float64) - want))) <= 1e-3 * scale
    else:
        np.testing.assert_array_equal(got, want)


@needs_models
@pytest.mark.parametrize("name", BENCHMARK)
def test_inference_session_matches_onnxruntime(name):
    ref = ort_session(name)
    opts = aimc.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = aimc.InferenceSession(path(name), sess_options=opts, providers=["CPUExecutionProvider"])
    x = feeds(name)
    want = ref.run(None, x)
    got = sess.run(None, x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        close(g, w)
    # Inputs described as ONNX Runtime describes them: names, type strings, shapes with
    # strings for symbolic dims.
    assert [(i.name, i.type, i.shape) for i in sess.get_inputs()] == \
        [(i.name, i.type, i.shape) for i in ref.get_inputs()]
    assert [(o.name, o.type) for o in sess.get_outputs()] == [(o.name, o.type) for o in ref.get_outputs()]


@needs_models
def test_model_api_and_output_selection():
    m = aimc.Model(path("yolo_like"), threads=1)
    assert m.threads == 1
    assert m.inputs == [("images", "float32", ["batch", 3, 320, 320])]
    x = feeds("yolo_like")
    outs = m.run(x)
    assert list(outs) == [o[0] for o in m.outputs]
    sess = aimc.InferenceSession(path("yolo_like"))
    second = sess.get_outputs()[1].name
    (only,) = sess.run([second], x)
    np.testing.assert_array_equal(only, outs[second])
    # A new batch size compiles its own program and still matches ORT.
    x2 = {"images": np.concatenate([x["images"], x["images"][:, :, ::-1]], axis=0)}
    want = ort_session("yolo_like").run(None, x2)
    for g, w in zip(sess.run(None, x2), want):
        close(g, w)


@needs_models
def test_inputs_in_any_layout_and_from_bytes():
    x = feeds("mlp")["input"]
    m = aimc.Model(path("mlp"), threads=1)
    base = m.run({"input": x})
    # A Fortran-ordered copy, a big-endian copy and a nested list all give the same result.
    for variant in [np.asfortranarray(x), x.astype(">f4"), x.tolist()]:
        got = m.run({"input": variant})
        for k in base:
            np.testing.assert_array_equal(got[k], base[k])
    with open(path("mlp"), "rb") as f:
        from_bytes = aimc.InferenceSession(f.read())
    np.testing.assert_array_equal(from_bytes.run(None, {"input": x})[0], list(base.values())[0])


@needs_models
def test_errors_are_aim_errors_with_the_reason():
    sess = aimc.InferenceSession(path("mlp"))
    x = feeds("mlp")["input"]
    with pytest.raises(aimc.AimError, match="no input named 'nope'"):
        sess.run(None, {"input": x, "nope": x})
    with pytest.raises(aimc.AimError, match="missing input: input"):
        sess.run(None, {})
    with pytest.raises(aimc.AimError, match="no output named 'y'"):
        sess.run(["y"], {"input": x})
    with pytest.raises(aimc.AimError, match="input"):
        sess.run(None, {"input": x[:, :100]})
    with pytest.raises(aimc.AimError, match="dtype"):
        sess.run(None, {"input": x.astype(np.complex64)})
    with pytest.raises(aimc.AimError, match="missing.onnx"):
        aimc.InferenceSession(os.path.join(MODELS, "missing.onnx"))
    with pytest.raises(aimc.AimError):
        aimc.InferenceSession(b"not an onnx model")
    with pytest.raises(AttributeError):
        aimc.SessionOptions().no_such_option = 1
    with pytest.warns(RuntimeWarning, match="TensorrtExecutionProvider"):
        aimc.InferenceSession(path("mlp"), providers=["TensorrtExecutionProvider", "CPUExecutionProvider"])


def _quantized_mlp(model, x, quantize):
    """The mlp (Gemm with transB, Relu) in numpy, each weight (K x N) replaced by
    `quantize(w)`: its dequantized values."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(model)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    h = x
    for n in m.graph.node:
        if n.op_type == "Gemm":
            h = h @ quantize(inits[n.input[1]].T) + inits[n.input[2]]
        elif n.op_type == "Relu":
            h = np.maximum(h, 0)
    return h.astype(np.float32)


def _q8(w):
    """8 bits per column, symmetric: scale max|w| / 127, codes round(w / scale)."""
    s = np.abs(w).max(0) / np.float32(127)
    s = np.where(s > 0, s, 1.0).astype(np.float32)
    return (np.clip(np.round(w / s), -127, 127) * s).astype(np.float32)


def _q4(w, block=32):
    """4 bits per block of `block` rows along K: scale (max - min) / 15 over the block and
    0, zero point round(-min / scale), codes clamp(round(w / scale) + zero, 0, 15)."""
    out = np.empty_like(w)
    for b in range(0, w.shape[0], block):
        blk = w[b:b + block]
        lo, hi = np.minimum(blk.min(0), 0), np.maximum(blk.max(0), 0)
        s = np.where(hi > lo, (hi - lo) / 15, 1.0).astype(np.float32)
        z = np.clip(np.round(-lo / s), 0, 15)
        out[b:b + block] = (np.clip(np.round(blk / s) + z, 0, 15) - z) * s
    return out


@needs_models
def test_graph_optimization_level_picks_the_opt_level():
    x = feeds("mobilenetv2")
    want = ort_session("mobilenetv2").run(None, x)
    levels = [(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 0), (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, 1),
              (aimc.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, 2), (ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT, 3),
              (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, 3), (2, 2)]
    for level, o in levels:
        opts = aimc.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.graph_optimization_level = level
        sess = aimc.InferenceSession(path("mobilenetv2"), opts)
        assert sess._model.opt_level == o, level
        for g, w in zip(sess.run(None, x), want):
            close(g, w)
    assert aimc.InferenceSession(path("mlp"))._model.opt_level == 3
    opts = aimc.SessionOptions()
    opts.graph_optimization_level = 7
    with pytest.raises(ValueError, match="not one of ONNX Runtime's levels"):
        aimc.InferenceSession(path("mlp"), opts)
    with pytest.raises(aimc.AimError, match="no pass is named 'nope'"):
        aimc.Model(path("mlp"), disabled_passes=["nope"])
    # weights="int4": the mlp's three Gemms with blockwise 4-bit weights, as numpy computes
    # them with the same quantization (ORT's MatMulNBits asymmetric formula, blocks of 32).
    q = aimc.Model(path("mlp"), weights="int4")
    got = q.run(feeds("mlp"))["gemm_15"]
    close(got, _quantized_mlp(path("mlp"), feeds("mlp")["input"], _q4))
    with pytest.raises(aimc.AimError, match="int4:BLOCK"):
        aimc.Model(path("mlp"), weights="int3")
    # weights="int8": per-column symmetric 8-bit weights, as numpy computes them.
    q8 = aimc.Model(path("mlp"), weights="int8")
    close(q8.run(feeds("mlp"))["gemm_15"], _quantized_mlp(path("mlp"), feeds("mlp")["input"], _q8))
    m = aimc.Model(path("mlp"), opt_level=2, disabled_passes=["fuse-epilogues"])
    assert m.opt_level == 2
    close(m.run(feeds("mlp"))["gemm_15"], aimc.Model(path("mlp")).run(feeds("mlp"))["gemm_15"])


@needs_models
def test_concurrent_runs_from_python_threads():
    m = aimc.Model(path("mlp_b64"), threads=1)
    x = feeds("mlp_b64")
    want = m.run(x)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(m.run(x))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 80
    for r in results:
        for k in want:
            np.testing.assert_array_equal(r[k], want[k])


def test_providers_and_version():
    available = aimc.get_available_providers()
    assert available[-1] == "CPUExecutionProvider" and set(available) <= {"CUDAExecutionProvider",
                                                                          "CPUExecutionProvider"}
    assert aimc.__version__


@needs_models
def test_cuda_provider_runs_on_the_gpu_or_falls_back_to_the_cpu():
    """ONNX Runtime's provider list: the CUDA provider where aim has a GPU, else a warning
    saying why and the CPU."""
    x = feeds("mlp")
    want = aimc.InferenceSession(path("mlp")).run(None, x)
    if "CUDAExecutionProvider" in aimc.get_available_providers():
        sess = aimc.InferenceSession(path("mlp"), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        assert sess.get_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
        np.testing.assert_allclose(sess.run(None, x)[0], want[0], rtol=1e-4, atol=1e-5)
    else:
        with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider is not available"):
            sess = aimc.InferenceSession(path("mlp"), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        assert sess.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_array_equal(sess.run(None, x)[0], want[0])


@needs_models
def test_the_gil_is_released_during_a_run():
    """While one thread runs a model, another runs Python code: the longest pause the
    main thread sees is far shorter than one run."""
    import time
    m = aimc.Model(path("resnet50"), threads=1)
    x = feeds("resnet50")
    m.run(x)
    t0 = time.perf_counter()
    m.run(x)
    one_run = time.perf_counter() - t0
    done = threading.Event()

    def work():
        for _ in range(5):
            m.run(x)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    longest, last = 0.0, time.perf_counter()
    while not done.is_set():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    t.join()
    assert longest < 0.5 * one_run, f"the main thread stalled {longest * 1e3:.1f} ms; one run takes {one_run * 1e3:.1f} ms"


@needs_models
def test_compiled_aim_files_load_in_place_of_onnx(tmp_path):
    x = feeds("mobilenetv2")
    onnx_out = aimc.InferenceSession(path("mobilenetv2")).run(None, x)
    info = aimc.compile(path("mobilenetv2"), tmp_path / "m.aim")
    assert info["stage"] == "optimized" and info["file_bytes"] > 0
    got = aimc.InferenceSession(str(tmp_path / "m.aim")).run(None, x)
    np.testing.assert_array_equal(got[0], onnx_out[0])
    # A model with symbolic dims, specialised to one shape.
    y = feeds("yolo_like")
    assert aimc.compile(path("yolo_like"), tmp_path / "y.aim", shapes={"images": [1, 3, 320, 320]})["stage"] == "optimized"
    want = aimc.Model(path("yolo_like")).run(y)
    for k, v in aimc.Model(tmp_path / "y.aim").run(y).items():
        np.testing.assert_array_equal(v, want[k])
    with pytest.raises(aimc.AimError, match="no input named 'nope'"):
        aimc.compile(path("yolo_like"), tmp_path / "z.aim", shapes={"nope": [1]})


@needs_models
def test_a_memory_budget_keeps_outputs_and_refuses_what_it_cannot_meet(tmp_path):
    x = feeds("bert_l6")
    aimc.compile(path("bert_l6"), tmp_path / "b.aim")
    want = aimc.Model(tmp_path / "b.aim").run(x)
    # What this process holds already (Python, NumPy, ONNX Runtime), and 64 MiB more: the
    # model's largest weight (44.7 MiB) and its intermediates fit, its 85 MiB of weights not.
    rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) << 10
    opts = aimc.SessionOptions()
    opts.memory_budget = rss + (64 << 20)
    got = aimc.InferenceSession(str(tmp_path / "b.aim"), sess_options=opts).run(None, x)
    np.testing.assert_array_equal(got[0], next(iter(want.values())))
    with pytest.raises(aimc.AimError, match="a budget of 1.0 MiB cannot be met"):
        aimc.Model(tmp_path / "b.aim", memory_budget=1 << 20)
    with pytest.raises(ValueError, match="not a size"):
        aimc.Model(tmp_path / "b.aim", memory_budget="lots")


def _custom_model(domain, attrs=None):
    """x -> ScaleShift(scale=2, shift=-1) -> Relu -> PairSum -> y, the custom ops in
    `domain` (None: written out in ONNX ops), as serialized ONNX."""
    import onnx
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    inits = []
    if domain is None:
        inits = [helper.make_tensor("k", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("b", TensorProto.FLOAT, [], [-1.0]),
                 helper.make_tensor("pairs", TensorProto.INT64, [3], [0, -1, 2]),
                 helper.make_tensor("axis", TensorProto.INT64, [1], [-1])]
        nodes = [helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]),
                 helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Reshape", ["r", "pairs"], ["p"]),
                 helper.make_node("ReduceSum", ["p", "axis"], ["y"], keepdims=0)]
        opsets = [helper.make_opsetid("", 17)]
    else:
        nodes = [helper.make_node("ScaleShift", ["x"], ["s"], domain=domain, name="ss", scale=2.0, shift=-1.0,
                                  **(attrs or {})),
                 helper.make_node("Relu", ["s"], ["r"], name="relu"),
                 helper.make_node("PairSum", ["r"], ["y"], domain=domain, name="ps")]
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=opsets).SerializeToString()


def test_python_operators_run_like_the_ops_written_out():
    @aimc.operator("com.pyops::PairSum", inputs=["float32"], outputs=["float32"],
                  shape=lambda x: (*x[:-1], None if x[-1] is None else x[-1] // 2))
    def pair_sum(x):
        return x[..., 0::2] + x[..., 1::2]

    @aimc.operator("com.pyops::ScaleShift", inputs=["float32"])
    def scale_shift(x, scale=1.0, shift=0.0, fail=0):
        if fail:
            raise ValueError("asked to fail")
        return x * scale + shift

    want = ort.InferenceSession(_custom_model(None), providers=["CPUExecutionProvider"])
    sess = aimc.InferenceSession(_custom_model("com.pyops"))
    for batch in (2, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        close(sess.run(None, {"x": x})[0], want.run(None, {"x": x})[0])
    # An exception in the function is an AimError naming the node and the exception.
    failing = aimc.Model(_custom_model("com.pyops", {"fail": 1}))
    with pytest.raises(aimc.AimError, match=r"ss.*ValueError\('asked to fail'\)"):
        failing.run({"x": np.zeros((1, 6), np.float32)})
    # A name without a domain is refused.
    with pytest.raises(ValueError, match="domain::Name"):
        aimc.operator("NoDomain")


def test_a_c_custom_op_library_through_session_options(tmp_path):
    import subprocess
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    lib = str(tmp_path / "libcustom_ops.so")
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-I", os.path.join(root, "include"),
                    os.path.join(root, "examples", "custom_op", "custom_ops.c"), "-o", lib], check=True)
    opts = aimc.SessionOptions()
    opts.register_custom_ops_library(lib)
    sess = aimc.InferenceSession(_custom_model("com.example"), opts)
    want = ort.InferenceSession(_custom_model(None), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    close(sess.run(None, {"x": x})[0], want.run(None, {"x": x})[0])
    assert "com.example:PairSum" in aimc.register_custom_ops_library(lib)
    with pytest.raises(aimc.AimError, match="status 7.*asked to fail"):
        aimc.Model(_custom_model("com.example", {"fail": 1})).run({"x": x})
