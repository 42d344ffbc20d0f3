//! Custom operators written in Python (`@aimc.operator`, `python/aimc/__init__.py`): an
//! `aim_ir::custom` op whose inference and kernel call back into Python, taking the GIL
//! per call (runs release it, so the callback can take it). Inputs reach the function as
//! NumPy arrays (copies), attributes as keyword arguments; the Python side turns its
//! results into C-contiguous arrays of the declared dtypes.

use crate::{aim_dtype, to_numpy};
use aim_facade::{DType, Dim, Tensor};
use aim_ir::custom::CustomOp;
use aim_ir::{Attr, Node, ValueType};
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// A Python operator: its identity, and the two callables the decorator made.
struct PyOp {
    domain: String,
    name: String,
    /// `compute(*arrays, **attributes) -> tuple of arrays`.
    compute: Py<PyAny>,
    /// `infer(types, attributes) -> [(dtype name, dims or None)]`, `types` one
    /// `(dtype name or None, dims or None)` or None per input.
    infer: Py<PyAny>,
}

/// A node's attributes as Python values (tensors and graphs left out).
fn attributes<'py>(py: Python<'py>, n: &Node) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in &n.attrs {
        match v {
            Attr::Int(i) => d.set_item(k, i)?,
            Attr::Float(f) => d.set_item(k, f)?,
            Attr::String(s) => d.set_item(k, s)?,
            Attr::Ints(v) => d.set_item(k, v.clone())?,
            Attr::Floats(v) => d.set_item(k, v.clone())?,
            Attr::Strings(v) => d.set_item(k, v.clone())?,
            Attr::Tensor(_) | Attr::Graph(_) => {}
        }
    }
    Ok(d)
}

/// The message of a Python exception, with its type.
fn text(py: Python<'_>, e: PyErr) -> String {
    let e = e.value(py).repr().map(|r| r.to_string()).unwrap_or_else(|_| e.to_string());
    format!("the Python operator raised {e}")
}

impl CustomOp for PyOp {
    fn domain(&self) -> &str {
        &self.domain
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn infer(&self, node: &Node, inputs: &[Option<ValueType>]) -> Result<Vec<ValueType>, String> {
        Python::attach(|py| {
            let run = || -> PyResult<Vec<ValueType>> {
                let mut types = Vec::with_capacity(inputs.len());
                for t in inputs {
                    types.push(match t {
                        None => py.None().into_bound(py),
                        Some(t) => {
                            let dims: Option<Vec<Option<usize>>> =
                                t.shape.as_ref().map(|s| s.iter().map(Dim::known).collect());
                            (t.dtype.map(crate::numpy_name), dims).into_pyobject(py)?.into_any()
                        }
                    });
                }
                let got = self.infer.bind(py).call1((PyList::new(py, types)?, attributes(py, node)?))?;
                let mut outs = Vec::new();
                for item in got.try_iter()? {
                    let (dtype, dims): (String, Option<Vec<Option<usize>>>) = item?.extract()?;
                    let dtype = DType::ALL.into_iter().find(|&d| crate::numpy_name(d) == dtype).ok_or_else(|| {
                        pyo3::exceptions::PyTypeError::new_err(format!("dtype '{dtype}' is not one aim has"))
                    })?;
                    let shape = dims.map(|v| v.into_iter().map(|d| d.map_or(Dim::Unknown, Dim::Known)).collect());
                    outs.push(ValueType { dtype: Some(dtype), shape });
                }
                Ok(outs)
            };
            run().map_err(|e| text(py, e))
        })
    }

    fn compute(
        &self,
        node: &Node,
        inputs: &[Option<Tensor>],
        _: &aim_ir::custom::Host<'_>,
    ) -> Result<Vec<Tensor>, String> {
        Python::attach(|py| {
            let run = || -> PyResult<Vec<Tensor>> {
                let mut args = Vec::with_capacity(inputs.len());
                for t in inputs {
                    args.push(match t {
                        None => py.None().into_bound(py),
                        Some(t) => to_numpy(py, t)?,
                    });
                }
                let got = self.compute.bind(py).call(PyTuple::new(py, args)?, Some(&attributes(py, node)?))?;
                let mut outs = Vec::new();
                for item in got.try_iter()? {
                    let item = item?;
                    let arr = item.cast::<PyUntypedArray>()?;
                    let dtype = aim_dtype(py, &arr.dtype()).ok_or_else(|| {
                        pyo3::exceptions::PyTypeError::new_err(format!(
                            "aim does not take arrays of dtype {}",
                            arr.dtype()
                        ))
                    })?;
                    if !arr.is_c_contiguous() {
                        return Err(pyo3::exceptions::PyValueError::new_err("an output array is not C-contiguous"));
                    }
                    let shape = arr.shape().to_vec();
                    let len = shape.iter().product::<usize>() * dtype.size();
                    // SAFETY: a live, C-contiguous ndarray of `len` bytes, read while `item`
                    // holds it (and the GIL is held).
                    let bytes = if len == 0 {
                        &[][..]
                    } else {
                        unsafe { std::slice::from_raw_parts((*arr.as_array_ptr()).fields.data as *const u8, len) }
                    };
                    outs.push(
                        Tensor::from_bytes(dtype, &shape, bytes)
                            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?,
                    );
                }
                Ok(outs)
            };
            run().map_err(|e| text(py, e))
        })
    }
}

/// Registers a Python operator for the process (what `@aimc.operator` calls).
#[pyfunction]
pub fn register_python_op(domain: String, name: String, compute: Py<PyAny>, infer: Py<PyAny>) -> PyResult<()> {
    aim_ir::custom::register(std::sync::Arc::new(PyOp { domain, name, compute, infer }))
        .map_err(crate::AimError::new_err)
}

/// Loads a custom-op library and registers its ops for the process; returns them as
/// `domain:name`.
#[pyfunction]
pub fn register_custom_ops_library(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Vec<String>> {
    py.detach(|| aim_facade::register_custom_ops_library(&path)).map_err(crate::aim_err)
}
