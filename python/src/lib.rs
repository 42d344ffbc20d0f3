//! `aimc._aim`: the native half of aim's Python package (`aimc`). It holds one class, [`Model`]; the
//! ONNX Runtime-style `InferenceSession` is written in Python on top of it
//! (`python/aimc/__init__.py`).
//!
//! Inputs are read from NumPy's memory in place (C-contiguous arrays in native byte order;
//! the Python side makes others contiguous first), the GIL is released while a model loads
//! or runs, and every aim error is raised as `aimc.AimError` with aim's message.

mod operator;

use aim_facade::{DType, Dim, Model as Inner, OptLevel, Options, Tensor, TensorView};
use numpy::{PyArray, PyArrayDescr, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

pyo3::create_exception!(aim, AimError, PyRuntimeError, "An error aim reported: loading, compiling or running a model.");

fn aim_err(e: impl std::fmt::Display) -> PyErr {
    AimError::new_err(e.to_string())
}

/// A loaded model: `Model(path_or_bytes, threads=None, cpu=None, backend=None)`.
#[pyclass(frozen, module = "aimc._aim")]
struct Model {
    inner: Inner,
}

/// The NumPy dtype that stands for an aim dtype (bf16, which NumPy lacks, is returned as
/// float32).
fn numpy_dtype<'py>(py: Python<'py>, d: DType) -> Bound<'py, PyArrayDescr> {
    match d {
        DType::F32 | DType::BF16 => numpy::dtype::<f32>(py),
        DType::F64 => numpy::dtype::<f64>(py),
        DType::F16 => numpy::dtype::<half::f16>(py),
        DType::I8 => numpy::dtype::<i8>(py),
        DType::I16 => numpy::dtype::<i16>(py),
        DType::I32 => numpy::dtype::<i32>(py),
        DType::I64 => numpy::dtype::<i64>(py),
        DType::U8 => numpy::dtype::<u8>(py),
        DType::U16 => numpy::dtype::<u16>(py),
        DType::U32 => numpy::dtype::<u32>(py),
        DType::U64 => numpy::dtype::<u64>(py),
        DType::Bool => numpy::dtype::<bool>(py),
    }
}

/// NumPy's name for an aim dtype (`"float32"`, `"int64"`, `"bool"`; bf16 is `"bfloat16"`).
fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
    }
}

/// The aim dtype of a NumPy array's dtype, if aim has one.
fn aim_dtype(py: Python<'_>, d: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    // bf16 has no NumPy dtype of its own (numpy_dtype stands float32 in for it).
    DType::ALL.into_iter().filter(|&c| c != DType::BF16).find(|&c| d.is_equiv_to(&numpy_dtype(py, c)))
}

/// A NumPy array holding a copy of `t`.
fn to_numpy<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    fn typed<'py, T: numpy::Element + aim_ir::Elem>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyArray::from_slice(py, t.data::<T>()).reshape(t.shape())?.into_any())
    }
    match t.dtype() {
        DType::F32 => typed::<f32>(py, t),
        DType::F64 => typed::<f64>(py, t),
        DType::F16 => typed::<half::f16>(py, t),
        DType::BF16 => {
            let v: Vec<f32> = t.data::<half::bf16>().iter().map(|x| x.to_f32()).collect();
            Ok(PyArray::from_vec(py, v).reshape(t.shape())?.into_any())
        }
        DType::I8 => typed::<i8>(py, t),
        DType::I16 => typed::<i16>(py, t),
        DType::I32 => typed::<i32>(py, t),
        DType::I64 => typed::<i64>(py, t),
        DType::U8 => typed::<u8>(py, t),
        DType::U16 => typed::<u16>(py, t),
        DType::U32 => typed::<u32>(py, t),
        DType::U64 => typed::<u64>(py, t),
        DType::Bool => {
            let v: Vec<bool> = t.bytes().iter().map(|&b| b != 0).collect();
            Ok(PyArray::from_vec(py, v).reshape(t.shape())?.into_any())
        }
    }
}

/// A declared input or output as `(name, dtype, shape)`: the dtype a NumPy name
/// (`"float32"`, or None when the model does not say), the shape a list of ints for static
/// dims, strings for symbolic ones and None for unknown ones (None for the whole shape when
/// even the rank is unknown).
fn describe<'py>(py: Python<'py>, v: &aim_ir::ValueInfo) -> PyResult<Bound<'py, PyAny>> {
    let dtype = v.ty.dtype.map(numpy_name);
    let shape = match &v.ty.shape {
        None => py.None().into_bound(py),
        Some(dims) => {
            let items: Vec<Bound<'py, PyAny>> = dims
                .iter()
                .map(|d| match d {
                    Dim::Known(n) => Ok::<_, PyErr>(n.into_pyobject(py)?.into_any()),
                    Dim::Sym(s) => Ok(s.into_pyobject(py)?.into_any()),
                    Dim::Unknown => Ok(py.None().into_bound(py)),
                })
                .collect::<PyResult<_>>()?;
            PyList::new(py, items)?.into_any()
        }
    };
    (v.name.as_str(), dtype, shape).into_pyobject(py).map(|o| o.into_any())
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (model, threads=None, cpu=None, backend=None, opt_level=None, disabled_passes=None, weights=None, memory_budget=None))]
    // Each argument is one of Python's keyword arguments.
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        threads: Option<usize>,
        cpu: Option<String>,
        backend: Option<String>,
        opt_level: Option<u32>,
        disabled_passes: Option<Vec<String>>,
        weights: Option<String>,
        memory_budget: Option<usize>,
    ) -> PyResult<Model> {
        let mut opts = Options { threads: threads.filter(|&t| t > 0), memory_budget, ..Options::default() };
        if let Some(l) = opt_level {
            opts.opt_level = OptLevel::from_number(l)
                .ok_or_else(|| AimError::new_err(format!("opt_level {l}: the levels are 0, 1, 2 and 3")))?;
        }
        opts.disabled_passes = disabled_passes.unwrap_or_default();
        if let Some(w) = weights.as_deref() {
            aim_facade::parse_weights(w)
                .map_err(|e| AimError::new_err(format!("weights '{w}': {e}")))?
                .apply(&mut opts);
        }
        if let Some(c) = cpu {
            opts.cpu = c;
        }
        if let Some(b) = backend {
            opts.backend = b.parse().map_err(aim_err)?;
        }
        let inner = if let Ok(bytes) = model.cast::<PyBytes>() {
            let data = bytes.as_bytes().to_vec();
            py.detach(move || {
                let ir = aim_onnx::import_bytes(&data, "<bytes>").map_err(|e| e.to_string())?;
                Inner::from_ir_with(ir, std::path::Path::new("<bytes>"), &opts).map_err(|e| e.to_string())
            })
        } else {
            let path: std::path::PathBuf = model.extract()?;
            py.detach(move || Inner::load_with_options(&path, &opts).map_err(|e| e.to_string()))
        }
        .map_err(AimError::new_err)?;
        Ok(Model { inner })
    }

    /// The inputs as `(name, dtype, shape)` tuples.
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.inner.inputs().iter().map(|v| describe(py, v)).collect()
    }

    /// The outputs as `(name, dtype, shape)` tuples.
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.inner.outputs().iter().map(|v| describe(py, v)).collect()
    }

    /// The optimisation level (`-O`) its program was compiled at.
    #[getter]
    fn opt_level(&self) -> u32 {
        self.inner.opt_level().number()
    }

    /// Worker threads a run uses.
    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }

    /// The model file it was loaded from.
    #[getter]
    fn path(&self) -> String {
        self.inner.path().display().to_string()
    }

    /// Runs the model: `feeds` maps input names to NumPy arrays (C-contiguous, native byte
    /// order); returns a dict of every output by name, in the model's order.
    fn run<'py>(&self, py: Python<'py>, feeds: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
        // Pointers into the arrays, taken with the GIL held; the arrays stay alive (and
        // referenced by `arrays`) until the run has returned.
        let mut arrays = Vec::with_capacity(feeds.len());
        let mut raw: Vec<(String, DType, Vec<usize>, usize, usize)> = Vec::with_capacity(feeds.len());
        for (k, v) in feeds.iter() {
            let name: String = k.extract()?;
            let arr = v.cast::<PyUntypedArray>().map_err(|_| {
                AimError::new_err(format!("input '{name}': expected a numpy.ndarray, got {}", v.get_type()))
            })?;
            let dtype = aim_dtype(py, &arr.dtype()).ok_or_else(|| {
                AimError::new_err(format!("input '{name}': aim does not take arrays of dtype {}", arr.dtype()))
            })?;
            if !arr.is_c_contiguous() {
                return Err(AimError::new_err(format!("input '{name}': the array is not C-contiguous")));
            }
            let shape = arr.shape().to_vec();
            let len = shape.iter().product::<usize>() * dtype.size();
            // SAFETY: a live ndarray's data pointer.
            let data = unsafe { (*arr.as_array_ptr()).fields.data } as usize;
            raw.push((name, dtype, shape, data, len));
            arrays.push(arr.clone());
        }
        let outs = py
            .detach(|| {
                let views: Vec<(&str, TensorView<'_>)> = raw
                    .iter()
                    .map(|(name, dtype, shape, data, len)| {
                        // SAFETY: `data` points at `len` bytes of a C-contiguous array kept
                        // alive by `arrays` for the whole run (an empty array may have a
                        // dangling pointer: no bytes are read then).
                        let bytes = if *len == 0 {
                            &[][..]
                        } else {
                            unsafe { std::slice::from_raw_parts(*data as *const u8, *len) }
                        };
                        (name.as_str(), TensorView { dtype: *dtype, shape, bytes })
                    })
                    .collect();
                self.inner.run_views(&views)
            })
            .map_err(aim_err)?;
        drop(arrays);
        let d = PyDict::new(py);
        for (name, t) in &outs {
            d.set_item(name, to_numpy(py, t)?)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("aimc.Model({:?}, threads={})", self.inner.path().display().to_string(), self.inner.threads())
    }
}

/// Compiles the ONNX model at `model` into the `.aim` file `output` (as `aim compile`
/// does), for this CPU or the `cpu` level, specialised to `shapes` ({input: dims}) when
/// given; returns what was written as a dict.
#[pyfunction]
#[pyo3(signature = (model, output, cpu=None, shapes=None))]
fn compile<'py>(
    py: Python<'py>,
    model: std::path::PathBuf,
    output: std::path::PathBuf,
    cpu: Option<String>,
    shapes: Option<std::collections::BTreeMap<String, Vec<usize>>>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut opts = Options::default();
    if let Some(c) = cpu {
        opts.cpu = c;
    }
    if let Some(s) = shapes {
        opts.shapes = vec![s.into_iter().collect()];
    }
    let s = py.detach(|| aim_facade::compiled::compile_to_file(&model, &output, &opts)).map_err(aim_err)?;
    let d = PyDict::new(py);
    d.set_item("stage", s.stage)?;
    d.set_item("level", s.level)?;
    d.set_item("file_bytes", s.file_bytes)?;
    d.set_item("nodes", s.nodes)?;
    Ok(d)
}

/// The native module.
/// The GPU aim's cuda backend would run on (name and architecture); raises AimError saying
/// why there is none (no driver, no GPU, too old a GPU).
#[pyfunction]
fn cuda_device(py: Python<'_>) -> PyResult<String> {
    py.detach(aim_facade::gpu::device).map_err(AimError::new_err)
}

#[pymodule]
fn _aim(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(cuda_device, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(operator::register_python_op, m)?)?;
    m.add_function(wrap_pyfunction!(operator::register_custom_ops_library, m)?)?;
    m.add("AimError", m.py().get_type::<AimError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
