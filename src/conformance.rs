//! Running ONNX backend test cases: a directory with `model.onnx` and
//! `test_data_set_N/{input,output}_K.pb`, as `onnx`'s own test generator writes them.
//! Outputs are compared as ONNX's backend runner does: same dtype and shape, and values
//! within `rtol = 1e-3`, `atol = 1e-7` (NaN equal to NaN).

use crate::{Backend, Error, Model};
use aim_ir::Tensor;
use std::path::{Path, PathBuf};

/// Relative tolerance of ONNX's backend test runner.
pub const RTOL: f64 = 1e-3;
/// Absolute tolerance of ONNX's backend test runner.
pub const ATOL: f64 = 1e-7;

/// Tensors by name, in order: a data set's inputs, or a run's outputs.
pub type Named = Vec<(String, Tensor)>;

/// How one case went.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every data set matched.
    Pass,
    /// A data set did not match, or the model failed to load or run.
    Fail(String),
    /// The model needs something aim does not support (an op, a dtype, a sequence type).
    Skipped(String),
}

/// Every case directory under `roots` (a root that holds `model.onnx` is a case itself),
/// sorted by path.
pub fn find_cases(roots: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for r in roots {
        if r.join("model.onnx").is_file() {
            out.push(r.clone());
            continue;
        }
        let mut subs: Vec<PathBuf> = std::fs::read_dir(r)?.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        subs.sort();
        for s in subs {
            if s.join("model.onnx").is_file() {
                out.push(s);
            }
        }
    }
    Ok(out)
}

/// Compares one output against its expected value.
pub fn compare(name: &str, got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!("output '{name}': dtype {} instead of {}", got.dtype(), want.dtype()));
    }
    if got.shape() != want.shape() {
        return Err(format!("output '{name}': shape {:?} instead of {:?}", got.shape(), want.shape()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = !want.dtype().is_float();
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if exact {
            a == b
        } else if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= ATOL + RTOL * b.abs()
        };
        if !ok {
            let err = (a - b).abs();
            if worst.is_none_or(|(_, e)| err > e || err.is_nan()) {
                worst = Some((i, err));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => {
            let bad = g.iter().zip(&w).filter(|(a, b)| a != b).count();
            Err(format!(
                "output '{name}': {bad} of {} values differ; worst at {i}: got {}, want {}",
                w.len(),
                g[i],
                w[i]
            ))
        }
    }
}

fn read_pb(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    aim_onnx::decode_tensor_proto(&bytes, &path.display().to_string()).map(|(_, t)| t).map_err(|e| e.to_string())
}

fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for k in 0.. {
        let p = dir.join(format!("{prefix}_{k}.pb"));
        if !p.is_file() {
            break;
        }
        v.push(p);
    }
    v
}

/// Runs one case on `backend`.
pub fn run_case(dir: &Path, backend: Backend) -> Outcome {
    run_case_with(dir, |_| {
        let model = load(dir, backend)?;
        Ok(move |inputs: Named| model.run(inputs).map_err(|e| Outcome::Fail(e.to_string())))
    })
}

/// The model of case `dir` on `backend`, or why the case cannot run: ops, dtypes
/// or value kinds aim does not support are [`Outcome::Skipped`], anything else fails it.
fn load(dir: &Path, backend: Backend) -> Result<Model, Outcome> {
    match Model::load_with(dir.join("model.onnx"), backend) {
        Ok(m) => Ok(m),
        Err(Error::Unsupported { ops, .. }) => {
            Err(Outcome::Skipped(format!("unsupported op {}", ops.keys().cloned().collect::<Vec<_>>().join(", "))))
        }
        Err(Error::Import(e @ aim_onnx::ImportError::DType { .. }))
        | Err(Error::Import(e @ aim_onnx::ImportError::NonTensorValue { .. })) => Err(Outcome::Skipped(e.to_string())),
        Err(e) => Err(Outcome::Fail(e.to_string())),
    }
}

/// Runs one case through `runner`, which gets the case's model (loaded on the reference
/// backend: imported, verified, type-inferred, weights kept) and returns what runs each data
/// set: its outputs, or the outcome that ends the case (a backend that cannot compile the
/// graph reports [`Outcome::Skipped`]). Another backend or an executor outside [`Model`] (the
/// cuda backend in the PTX interpreter) plugs in here and is judged as [`run_case`] judges.
pub fn run_case_with<R>(dir: &Path, runner: impl FnOnce(&Model) -> Result<R, Outcome>) -> Outcome
where
    R: Fn(Named) -> Result<Named, Outcome>,
{
    let model = match load(dir, Backend::Reference) {
        Ok(m) => m,
        Err(o) => return o,
    };
    let run = match runner(&model) {
        Ok(r) => r,
        Err(o) => return o,
    };
    let mut sets: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect(),
        Err(e) => return Outcome::Fail(e.to_string()),
    };
    sets.sort();
    for set in sets {
        let inputs: Result<Vec<Tensor>, String> = numbered(&set, "input").iter().map(|p| read_pb(p)).collect();
        let expected: Result<Vec<Tensor>, String> = numbered(&set, "output").iter().map(|p| read_pb(p)).collect();
        let (inputs, expected) = match (inputs, expected) {
            (Ok(i), Ok(e)) => (i, e),
            // The model loaded, so its inputs and outputs are tensors aim supports: data
            // it cannot read is a failure, not something to skip.
            (Err(e), _) | (_, Err(e)) => return Outcome::Fail(format!("cannot read test data: {e}")),
        };
        let named: Vec<(String, Tensor)> = model.inputs().iter().map(|i| i.name.clone()).zip(inputs).collect();
        let outs = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(named))) {
            Ok(Ok(o)) => o,
            Ok(Err(o)) => return o,
            Err(p) => return Outcome::Fail(format!("panic: {}", aim_runtime::panic_message(&*p))),
        };
        if outs.len() != expected.len() {
            return Outcome::Fail(format!("{} outputs, expected {}", outs.len(), expected.len()));
        }
        for ((name, got), want) in outs.iter().zip(&expected) {
            if let Err(e) = compare(name, got, want) {
                return Outcome::Fail(e);
            }
        }
    }
    Outcome::Pass
}
