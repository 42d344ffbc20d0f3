//! The C ABI of aim's JIT: `libaim.so`, declared by the committed header `include/aim.h`
//! (generated from this crate by cbindgen; a test checks it is current). `abi.rs` holds
//! everything it shares with the runtime-only library (`runtime-capi`, `libaim_runtime`);
//! this file adds loading `.onnx` and `.aim` files, which needs the compiler.

#![allow(clippy::missing_safety_doc)] // every `unsafe extern fn` documents its contract in prose.

mod abi;

pub use abi::*;
use aim_facade::{Model, Options};
use aim_ir::{Tensor, ValueInfo};
use aim_runtime::views::TensorView;
use std::ffi::c_char;
#[cfg(test)]
use std::ffi::{CStr, CString};

/// The status of a load that failed with `e`.
fn load_status(e: &aim_facade::Error) -> AimStatus {
    match e {
        aim_facade::Error::BadOption { .. } | aim_facade::Error::Cpu(_) => AimStatus::InvalidArgument,
        aim_facade::Error::Internal { .. } => AimStatus::Internal,
        _ => AimStatus::LoadFailed,
    }
}

/// The status of a run that failed with `e`.
fn run_status(e: &aim_facade::Error) -> AimStatus {
    match e {
        aim_facade::Error::BadOption { .. } | aim_facade::Error::UnknownInput { .. } => AimStatus::InvalidArgument,
        aim_facade::Error::Internal { .. } => AimStatus::Internal,
        _ => AimStatus::RunFailed,
    }
}

impl Session for Model {
    fn inputs(&self) -> &[ValueInfo] {
        Model::inputs(self)
    }
    fn outputs(&self) -> &[ValueInfo] {
        Model::outputs(self)
    }
    fn threads(&self) -> usize {
        Model::threads(self)
    }
    fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, Failure> {
        Model::run_views(self, inputs).map_err(|e| Failure(run_status(&e), e.to_string()))
    }
}

/// Loads the model at `path` (UTF-8): an ONNX file, compiled now for this CPU, or a `.aim`
/// file from `aim compile` (told apart by their first bytes), into `*out`. In `libaim`
/// only: `libaim_runtime` has no compiler (a compiled shared object loads with its own
/// `<name>_load`). `options` may
/// be null (every default). On failure `*out` is set to null.
#[no_mangle]
pub unsafe extern "C" fn aim_model_load(
    path: *const c_char,
    options: *const AimLoadOptions,
    out: *mut *mut AimModel,
) -> AimStatus {
    call(|| {
        if out.is_null() {
            return Err(invalid("aim_model_load: out is null"));
        }
        *out = std::ptr::null_mut();
        let path = text(path, "aim_model_load: path")?;
        let mut opts = Options::default();
        if let Some(o) = options.as_ref() {
            if o.threads > 0 {
                opts.threads = Some(o.threads as usize);
            }
            if !o.cpu.is_null() {
                opts.cpu = text(o.cpu, "aim_model_load: options.cpu")?.to_string();
            }
            if !o.backend.is_null() {
                opts.backend = text(o.backend, "aim_model_load: options.backend")?.parse().map_err(invalid)?;
            }
            if !o.weights.is_null() {
                let w = text(o.weights, "aim_model_load: options.weights")?;
                aim_facade::parse_weights(w)
                    .map_err(|e| invalid(format!("aim_model_load: options.weights '{w}': {e}")))?
                    .apply(&mut opts);
            }
            opts.pin_threads = o.pin_threads != 0;
            if o.memory_budget != 0 {
                opts.memory_budget = Some(usize::try_from(o.memory_budget).map_err(|_| {
                    invalid(format!("aim_model_load: options.memory_budget {} is too large", o.memory_budget))
                })?);
            }
        }
        let model = Model::load_with_options(path, &opts).map_err(|e| Failure(load_status(&e), e.to_string()))?;
        *out = Box::into_raw(Box::new(AimModel::new(Box::new(model))));
        Ok(())
    })
}

#[cfg(test)]
mod tests;
