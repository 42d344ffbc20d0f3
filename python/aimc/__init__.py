"""aim: an inference compiler for neural networks, from Python.

Two ways in:

- ``aimc.Model(path)``: ``.run({"input": array})`` returns a dict of NumPy arrays by output
  name; ``.inputs`` / ``.outputs`` describe what the model takes and gives.
- ``aimc.compile(onnx_path, aim_path)``: the model compiled ahead of time into a ``.aim``
  file, which both of the above load (with no compile step) in place of the ONNX file.
- ``aimc.InferenceSession(path, sess_options=None, providers=None)``: ONNX Runtime's API
  (``get_inputs()``, ``get_outputs()``, ``run(output_names, input_feed)``, ``SessionOptions``
  with ``intra_op_num_threads``), so code written for ``onnxruntime`` runs on aim by
  changing the import.

The model is compiled for this CPU when it loads (and again for each new input shape where
its inputs have symbolic dims). The GIL is released while a model loads and runs, so runs
from several Python threads proceed in parallel. Errors are raised as ``aimc.AimError`` with
aim's message, naming the file, node or input at fault.
"""

import enum
import warnings

import numpy as np

from ._aim import AimError, __version__
from ._aim import Model as _NativeModel
from ._aim import compile as _compile
from ._aim import cuda_device as _cuda_device
from ._aim import register_custom_ops_library as _register_library
from ._aim import register_python_op as _register_python_op

__all__ = ["AimError", "GraphOptimizationLevel", "InferenceSession", "Model", "NodeArg", "SessionOptions", "compile",
           "get_available_providers", "operator", "register_custom_ops_library", "__version__"]


def register_custom_ops_library(path):
    """Loads a custom-op library (a shared object exporting ``aim_custom_ops``; see
    ``AimCustomOp`` in aim.h and examples/custom_op/) and registers its operators for the
    whole process; returns them as ``"domain:name"`` strings."""
    return _register_library(str(path))


def operator(op, inputs=None, outputs=("float32",), shape=None):
    """Registers a NumPy function as the custom operator ``op`` (``"domain::Name"``), for
    prototyping an op aim lacks::

        @aimc.operator("com.example::PairSum", inputs=["float32"], outputs=["float32"],
                      shape=lambda x: (*x[:-1], None if x[-1] is None else x[-1] // 2))
        def pair_sum(x):
            return x[..., 0::2] + x[..., 1::2]

    The function gets one NumPy array per input (None for an absent optional input) and the
    node's attributes as keyword arguments, and returns one array per output (a tuple for
    several); each is converted to the declared output dtype. ``inputs``: the dtypes the
    inputs must have (None: any). ``shape``: the output shape(s) from the input shapes
    (tuples with None for dims not known before the run; attributes as keyword
    arguments); default: the first input's shape. The interpreter lock is taken for each
    call, so a Python operator runs one call at a time. Returns the function unchanged.
    """
    domain, sep, name = op.rpartition("::")
    if not sep or not domain or not name:
        raise ValueError(f"operator name {op!r} must be 'domain::Name'")
    out_dtypes = [np.dtype(d).name for d in outputs]
    in_dtypes = None if inputs is None else [None if d is None else np.dtype(d).name for d in inputs]

    def infer(types, attrs):
        if in_dtypes is not None:
            if len(types) != len(in_dtypes):
                raise TypeError(f"{op} takes {len(in_dtypes)} inputs, the node gives {len(types)}")
            for i, (t, want) in enumerate(zip(types, in_dtypes)):
                if t is not None and want is not None and t[0] is not None and t[0] != want:
                    raise TypeError(f"{op} input {i} must be {want}, got {t[0]}")
        shapes = [None if t is None or t[1] is None else tuple(t[1]) for t in types]
        if shape is None:
            outs = [shapes[0] if shapes else None] * len(out_dtypes)
        else:
            got = shape(*shapes, **attrs)
            outs = [got] if len(out_dtypes) == 1 else list(got)
        if len(outs) != len(out_dtypes):
            raise ValueError(f"{op}: shape gave {len(outs)} shapes for {len(out_dtypes)} outputs")
        return [(d, None if s is None else [None if x is None else int(x) for x in s])
                for d, s in zip(out_dtypes, outs)]

    def compute(*arrays, **attrs):
        got = fn_ref[0](*arrays, **attrs)
        if len(out_dtypes) == 1 and not isinstance(got, (tuple, list)):
            got = (got,)
        if len(got) != len(out_dtypes):
            raise ValueError(f"{op} returned {len(got)} arrays for {len(out_dtypes)} outputs")
        return tuple(np.ascontiguousarray(np.asarray(a, dtype=d)) for a, d in zip(got, out_dtypes))

    fn_ref = [None]

    def decorate(fn):
        fn_ref[0] = fn
        _register_python_op(domain, name, compute, infer)
        return fn

    return decorate


def compile(model, output, cpu=None, shapes=None):
    """Compiles the ONNX model at ``model`` into the ``.aim`` file ``output``, as ``aim
    compile`` does: the optimised program for this CPU (or the ``cpu`` level, such as
    ``"x86-64-v3"``) with its weights prepacked, loaded by ``Model`` and
    ``InferenceSession`` in place of the ONNX file. ``shapes`` ({input name: dims})
    specialises a model with symbolic dims to those shapes. Returns a dict: ``stage``,
    ``level``, ``file_bytes``, ``nodes``."""
    return _compile(str(model), str(output), cpu=cpu, shapes=shapes)

# ONNX Runtime's type strings, by NumPy dtype name.
_ORT_TYPES = {
    "float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)", "int8": "tensor(int8)", "int16": "tensor(int16)", "int32": "tensor(int32)",
    "int64": "tensor(int64)", "uint8": "tensor(uint8)", "uint16": "tensor(uint16)", "uint32": "tensor(uint32)",
    "uint64": "tensor(uint64)", "bool": "tensor(bool)",
}

_CUDA = "CUDAExecutionProvider"
_CPU = "CPUExecutionProvider"
_cuda_probe = None


def _cuda_status():
    """(whether aim's cuda backend has a GPU here, the GPU or why not), probed once."""
    global _cuda_probe
    if _cuda_probe is None:
        try:
            _cuda_probe = (True, _cuda_device())
        except AimError as e:
            _cuda_probe = (False, str(e))
    return _cuda_probe


def get_available_providers():
    """The execution providers aim offers here, preferred first
    (onnxruntime.get_available_providers): CUDAExecutionProvider where aim's cuda backend
    has a GPU, and CPUExecutionProvider."""
    return ([_CUDA] if _cuda_status()[0] else []) + [_CPU]


def _feeds(feeds, declared):
    """Input arrays as aim reads them: C-contiguous NumPy arrays in native byte order
    (arrays that already are pass through without a copy; Python scalars and lists
    become arrays of the input's declared dtype)."""
    out = {}
    for name, value in feeds.items():
        a = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=declared.get(name))
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        out[name] = np.ascontiguousarray(a)
    return out


def _size(v):
    """Bytes from an int or a string such as ``"500M"`` or ``"2G"`` (powers of 1024); None
    stays None."""
    if v is None or isinstance(v, int):
        if v is not None and v <= 0:
            raise ValueError(f"a memory size must be positive, got {v}")
        return v
    s = str(v).strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    try:
        n = float(s[:-1] if scale > 1 else s) * scale
    except ValueError:
        raise ValueError(f"'{v}' is not a size (say 500M, 2G or a number of bytes)") from None
    if n < 1:
        raise ValueError(f"'{v}' is not a size of memory")
    return int(n)


class Model:
    """A model compiled for this CPU: ``Model(path_or_bytes, threads=None, cpu=None,
    backend=None, opt_level=None, disabled_passes=None)``.

    ``threads``: worker threads per run (default: one per physical core); ``cpu``: an ISA
    cap such as ``"x86-64-v3"``; ``backend``: ``"cpu"`` (default), ``"reference"`` (the
    reference kernels, interpreted) or ``"cuda"`` (aim's PTX on an NVIDIA GPU, sm_80 or
    later; an AimError says what is missing on a host without one); ``opt_level``: 0 to 3
    (the command line's ``-O``; default 3), ``disabled_passes``: pass names not to run
    (``--disable-pass``), both for the cpu backend; ``custom_ops``: custom-op libraries to
    register first (see ``register_custom_ops_library``); ``weights``: how dense layers
    hold their weights, ``"f32"`` (default), ``"f16"``, ``"int4"`` / ``"int4:BLOCK"`` or
    ``"int8"`` (the command line's ``--weights``); ``memory_budget``: the peak resident
    memory a run must fit in, in bytes or as ``"500M"`` / ``"2G"`` (the command line's
    ``--memory-budget``; an AimError with the breakdown when it cannot be met).
    """

    def __init__(self, model, threads=None, cpu=None, backend=None, opt_level=None, disabled_passes=None,
                 custom_ops=None, weights=None, memory_budget=None):
        for lib in custom_ops or []:
            register_custom_ops_library(lib)
        if not isinstance(model, (bytes, bytearray)):
            model = str(model)
        elif isinstance(model, bytearray):
            model = bytes(model)
        self._native = _NativeModel(model, threads=threads, cpu=cpu, backend=backend,
                                    opt_level=None if opt_level is None else int(opt_level),
                                    disabled_passes=None if disabled_passes is None else list(disabled_passes),
                                    weights=weights, memory_budget=_size(memory_budget))
        self._declared = {n: d for n, d, _ in self._native.inputs if d is not None and d != "bfloat16"}

    @property
    def inputs(self):
        """The inputs as ``(name, dtype, shape)``: dtype a NumPy dtype name, shape a list
        with ints for static dims and strings for symbolic ones."""
        return self._native.inputs

    @property
    def outputs(self):
        """The outputs as ``(name, dtype, shape)``."""
        return self._native.outputs

    @property
    def threads(self):
        """Worker threads a run uses."""
        return self._native.threads

    @property
    def opt_level(self):
        """The optimisation level (0 to 3, the command line's ``-O``) the model was
        compiled at."""
        return self._native.opt_level

    def run(self, feeds):
        """Runs the model on ``feeds`` ({input name: array}); returns {output name: array}
        for every output, in the model's order."""
        return self._native.run(_feeds(feeds, self._declared))

    def __repr__(self):
        return repr(self._native)


class NodeArg:
    """An input or output of an InferenceSession, as ONNX Runtime describes it: ``name``,
    ``type`` (``"tensor(float)"``) and ``shape`` (ints, strings for symbolic dims, None for
    unknown ones)."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, name, type, shape):
        self.name, self.type, self.shape = name, type, shape

    def __repr__(self):
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class GraphOptimizationLevel(enum.IntEnum):
    """ONNX Runtime's graph optimisation levels, with its values, as aim's ``-O`` levels
    run them: ``ORT_DISABLE_ALL`` is ``-O0`` (the reference kernels, interpreted),
    ``ORT_ENABLE_BASIC`` ``-O1`` (folding, simplification, dead code, BatchNormalization
    folding), ``ORT_ENABLE_EXTENDED`` ``-O2`` (fusion, packed and quantized kernels),
    ``ORT_ENABLE_LAYOUT`` and ``ORT_ENABLE_ALL`` ``-O3`` (blocked layouts: everything)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


def _opt_level(level):
    """aim's ``-O`` level for a ``graph_optimization_level``: aim's or ONNX Runtime's enum,
    or its integer value; None is ORT_ENABLE_ALL, ONNX Runtime's default."""
    if level is None:
        return 3
    try:
        value = int(level)
    except (TypeError, ValueError):
        raise ValueError(f"graph_optimization_level must be a GraphOptimizationLevel, got {level!r}") from None
    if value not in (0, 1, 2, 3, 99):
        raise ValueError(f"graph_optimization_level {value} is not one of ONNX Runtime's levels (0, 1, 2, 3, 99)")
    return min(value, 3)


class SessionOptions:
    """ONNX Runtime's session options, as far as they mean something to aim.

    ``intra_op_num_threads`` (0: one thread per physical core) sets aim's worker threads;
    ``graph_optimization_level`` (a GraphOptimizationLevel, aim's or ONNX Runtime's) picks
    aim's ``-O`` level on the CPU as the enum's documentation says (the cuda backend runs
    its whole pipeline whatever the level). aim runs nodes in order, so
    ``execution_mode`` and ``inter_op_num_threads`` are accepted and have no effect; the
    logging fields likewise. ``memory_budget`` (aim's own; None by default) is the peak
    resident memory a run must fit in, as ``Model``'s. Setting any other attribute is an
    AttributeError, as in ONNX Runtime.
    """

    __slots__ = ("intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
                 "log_severity_level", "log_verbosity_level", "enable_profiling", "enable_cpu_mem_arena",
                 "enable_mem_pattern", "optimized_model_filepath", "logid", "memory_budget", "_custom_ops")

    def __init__(self):
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = None
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.enable_profiling = False
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.optimized_model_filepath = ""
        self.logid = ""
        self.memory_budget = None
        self._custom_ops = []

    def register_custom_ops_library(self, path):
        """ONNX Runtime's name: a custom-op library (see ``aimc.register_custom_ops_library``)
        that sessions made with these options load first. aim registers its ops for the
        whole process."""
        self._custom_ops.append(str(path))


class InferenceSession:
    """ONNX Runtime's InferenceSession on aim: ``InferenceSession(path_or_bytes,
    sess_options=None, providers=None)``.

    ``providers`` are tried in order, as ONNX Runtime does: ``CUDAExecutionProvider`` runs the
    model on aim's cuda backend where it has a GPU and can compile the model (aim does not
    split a model between providers), ``CPUExecutionProvider`` on the CPU. A provider that
    is not available, or cannot run the model, warns and the next one is tried; the CPU is
    the last resort. None: the CPU.
    """

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
        opts = sess_options or SessionOptions()
        if not isinstance(opts, SessionOptions):
            raise TypeError(f"sess_options must be aimc.SessionOptions, got {type(opts).__name__}")
        threads = int(opts.intra_op_num_threads or 0)
        if threads < 0:
            raise ValueError(f"intra_op_num_threads must be 0 or more, got {threads}")
        level = _opt_level(opts.graph_optimization_level)
        for lib in opts._custom_ops:
            register_custom_ops_library(lib)
        self._model, self._providers = None, [_CPU]
        for p in providers or [_CPU]:
            name = p[0] if isinstance(p, tuple) else p
            if name == _CUDA:
                ok, why = _cuda_status()
                if not ok:
                    warnings.warn(f"{_CUDA} is not available ({why}): trying the next provider", RuntimeWarning,
                                  stacklevel=2)
                    continue
                try:
                    self._model, self._providers = Model(path_or_bytes, backend="cuda"), [_CUDA, _CPU]
                    break
                except AimError as e:
                    warnings.warn(f"{_CUDA} cannot run this model ({e}): trying the next provider", RuntimeWarning,
                                  stacklevel=2)
            elif name == _CPU:
                break
            else:
                warnings.warn(f"Specified provider '{name}' is not in available provider names "
                              f"({', '.join(get_available_providers())})", RuntimeWarning, stacklevel=2)
        if self._model is None:
            self._model = Model(path_or_bytes, threads=threads or None, opt_level=level,
                                memory_budget=opts.memory_budget)
        self._inputs = [NodeArg(n, _ORT_TYPES.get(d, "tensor(undefined)"), s) for n, d, s in self._model.inputs]
        self._outputs = [NodeArg(n, _ORT_TYPES.get(d, "tensor(undefined)"), s) for n, d, s in self._model.outputs]

    def get_inputs(self):
        """The model's inputs, as NodeArgs."""
        return list(self._inputs)

    def get_outputs(self):
        """The model's outputs, as NodeArgs."""
        return list(self._outputs)

    def get_providers(self):
        """The providers this session runs on."""
        return list(self._providers)

    def run(self, output_names, input_feed, run_options=None):
        """Runs the model; returns the outputs named by ``output_names`` (all of them, in
        the model's order, when None or empty) as a list of NumPy arrays."""
        known = [o.name for o in self._outputs]
        names = list(output_names) if output_names else known
        for n in names:
            if n not in known:
                raise AimError(f"the model has no output named '{n}' (its outputs: {', '.join(known)})")
        given = set(input_feed)
        missing = [i.name for i in self._inputs if i.name not in given]
        if missing:
            raise AimError(f"missing input{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
        outs = self._model.run(input_feed)
        return [outs[n] for n in names]
