//! The C ABI both libraries export (`libaim`, the JIT, and `libaim_runtime`, the runtime
//! alone for models compiled ahead of time), declared by `include/aim.h`: every function
//! but `aim_model_load`, which needs the compiler. `runtime-capi` includes this file as it
//! is, so the two libraries cannot drift apart.
//!
//! A C host gets an opaque [`AimModel`] (from `aim_model_load` in `libaim`, or from a
//! compiled object's `<name>_load`), asks for its inputs and outputs (name, ONNX dtype
//! code, shape with -1 for a dynamic dim), and runs it either into an owned [`AimOutputs`]
//! list (freed with [`aim_outputs_free`]) or into buffers it provides
//! ([`aim_model_run_into`]). Every call returns an [`AimStatus`]; on failure
//! [`aim_last_error`] gives the message (naming the file, node or input), per thread. No
//! Rust panic crosses the boundary: one becomes `AIM_STATUS_INTERNAL` with its message.
//!
//! Input buffers are read in place when aligned for their dtype (copied otherwise) and are
//! not kept after the call returns. A model may be run from several threads at once.

#![allow(clippy::missing_safety_doc)] // every `unsafe extern fn` documents its contract in prose.

use aim_ir::{DType, Dim, Tensor, ValueInfo, ValueType};
use aim_runtime::views::TensorView;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The version of this ABI: bumped when a declaration in `aim.h` changes incompatibly, so a
/// host can check at run time that it was built against the library it loaded. 2:
/// `AimLoadOptions` gained `weights` and `pin_threads`; 3: `memory_budget`.
pub const AIM_ABI_VERSION: u32 = 3;

/// What a call did: `AIM_STATUS_OK`, or why it failed (the message is in
/// [`aim_last_error`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AimStatus {
    /// The call succeeded.
    Ok = 0,
    /// An argument is wrong: a null pointer, an index out of range, an unknown input name,
    /// a buffer of the wrong size, a dtype code aim does not know.
    InvalidArgument = 1,
    /// The model could not be loaded: unreadable, malformed, or using ops aim cannot run.
    LoadFailed = 2,
    /// A run failed: shapes that do not fit the model, a timeout, an allocation over the
    /// limit.
    RunFailed = 3,
    /// A bug in aim, caught before it reached the host.
    Internal = 4,
}

/// Element types, by their ONNX `TensorProto.DataType` codes (the `dtype` fields of
/// [`AimTensor`] and [`AimTensorInfo`] hold these values; 0 means unknown).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AimDType {
    /// Not known (an input whose type the model does not declare).
    Undefined = 0,
    /// 32-bit float.
    F32 = 1,
    /// Unsigned 8-bit integer.
    U8 = 2,
    /// Signed 8-bit integer.
    I8 = 3,
    /// Unsigned 16-bit integer.
    U16 = 4,
    /// Signed 16-bit integer.
    I16 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Boolean, one byte per element (0 or 1).
    Bool = 9,
    /// IEEE half precision.
    F16 = 10,
    /// 64-bit float.
    F64 = 11,
    /// Unsigned 32-bit integer.
    U32 = 12,
    /// Unsigned 64-bit integer.
    U64 = 13,
    /// bfloat16.
    Bf16 = 16,
}

/// How to load a model; a null pointer where one is taken means every default.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AimLoadOptions {
    /// Worker threads of a run; 0: one per physical core.
    pub threads: u32,
    /// ISA cap (`"native"`, `"x86-64-v3"`, `"x86-64-v4"`, ...); null: the host's full ISA.
    pub cpu: *const c_char,
    /// `"cpu"` (compiled, the default when null), `"reference"` (the reference kernels,
    /// interpreted) or `"cuda"` (aim's PTX on an NVIDIA GPU, sm_80 or later; a load error
    /// says what is missing on a host without one).
    pub backend: *const c_char,
    /// How dense layers hold their weights: null or `"f32"`, `"f16"`, `"int4"`,
    /// `"int4:BLOCK"` or `"int8"` (as `aim run --weights`; `aim_model_load` only: a compiled
    /// model holds its weights as it was compiled).
    pub weights: *const c_char,
    /// Non-zero: each worker thread bound to a core of its own (as `--pin-threads`).
    pub pin_threads: u32,
    /// The peak resident memory a run must fit in, in bytes (as `--memory-budget`;
    /// `aim_model_load` only); 0: no limit. A budget that cannot be met fails the load
    /// with the breakdown in `aim_last_error`.
    pub memory_budget: u64,
}

/// A model input or output as the model declares it. The pointers stay valid as long as
/// the model does.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AimTensorInfo {
    /// Its name (UTF-8, NUL-terminated).
    pub name: *const c_char,
    /// Its element type ([`AimDType`] code; 0 if not declared).
    pub dtype: i32,
    /// Its rank, or -1 when the model does not declare one.
    pub rank: i64,
    /// `rank` dims; -1 for a dynamic dim (symbolic or unknown).
    pub shape: *const i64,
}

/// A tensor crossing the boundary: an input the host passes in (aim reads it during the
/// call and keeps nothing), or an output aim returns (valid until its [`AimOutputs`] is
/// freed). Elements are dense, row-major, little-endian; bool is one byte per element.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AimTensor {
    /// The input's or output's name.
    pub name: *const c_char,
    /// Element type ([`AimDType`] code).
    pub dtype: i32,
    /// Number of dims.
    pub rank: usize,
    /// `rank` non-negative dims.
    pub shape: *const i64,
    /// The elements (may be null when `byte_len` is 0).
    pub data: *const c_void,
    /// Bytes at `data`: the element count times the dtype's size.
    pub byte_len: usize,
}

/// A host-provided buffer for one output of [`aim_model_run_into`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AimBuffer {
    /// Which output goes here.
    pub name: *const c_char,
    /// Where its elements go.
    pub data: *mut c_void,
    /// The buffer's size: it must be exactly the output's size in bytes.
    pub byte_len: usize,
}

/// What a loaded model must do for the C ABI: the JIT's `aim::Model` in `libaim`, a
/// model compiled ahead of time (`aim_runtime::embedded::Compiled`) in both libraries.
pub trait Session: Send + Sync {
    /// The declared inputs.
    fn inputs(&self) -> &[ValueInfo];
    /// The declared outputs.
    fn outputs(&self) -> &[ValueInfo];
    /// Threads a run uses.
    fn threads(&self) -> usize;
    /// Runs on borrowed inputs, returning owned outputs in the model's order.
    fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, Failure>;
}

/// A loaded model (opaque to C).
pub struct AimModel {
    model: Box<dyn Session>,
    inputs: Vec<Declared>,
    outputs: Vec<Declared>,
}

impl AimModel {
    /// Wraps a loaded model, its inputs and outputs described in C form once.
    pub fn new(model: Box<dyn Session>) -> AimModel {
        let inputs = model.inputs().iter().map(|v| declared(&v.name, &v.ty)).collect();
        let outputs = model.outputs().iter().map(|v| declared(&v.name, &v.ty)).collect();
        AimModel { model, inputs, outputs }
    }
}

/// A declared input or output, in C form.
struct Declared {
    name: CString,
    dtype: i32,
    shape: Option<Vec<i64>>,
}

/// The outputs of one run (opaque to C).
pub struct AimOutputs {
    tensors: Vec<Returned>,
}

/// One returned output, in C form.
struct Returned {
    name: CString,
    shape: Vec<i64>,
    tensor: Tensor,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// An error on its way out: the status and the message kept for [`aim_last_error`].
pub struct Failure(pub AimStatus, pub String);

/// A failure of status `AIM_STATUS_INVALID_ARGUMENT`.
pub fn invalid(msg: impl Into<String>) -> Failure {
    Failure(AimStatus::InvalidArgument, msg.into())
}

/// Runs a call's body: sets the last error on failure, contains panics.
pub fn call(f: impl FnOnce() -> Result<(), Failure>) -> AimStatus {
    let outcome = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(Failure(AimStatus::Internal, format!("internal error in aim: {msg} (this is a bug; please report it)")))
    });
    match outcome {
        Ok(()) => AimStatus::Ok,
        Err(Failure(status, msg)) => {
            let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
            LAST_ERROR.with(|e| *e.borrow_mut() = c);
            status
        }
    }
}

/// A NUL-terminated UTF-8 string argument, or an error naming it.
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives `'a`.
pub unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    CStr::from_ptr(p).to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn declared(name: &str, ty: &ValueType) -> Declared {
    Declared {
        name: CString::new(name.replace('\0', " ")).unwrap_or_default(),
        dtype: ty.dtype.map_or(0, |d| d.onnx_code()),
        shape: ty.shape.as_ref().map(|dims| {
            dims.iter()
                .map(|d| match d {
                    Dim::Known(n) => *n as i64,
                    _ => -1,
                })
                .collect()
        }),
    }
}

/// The library's version (`"0.1.0"`), a static string.
#[no_mangle]
pub extern "C" fn aim_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// [`AIM_ABI_VERSION`] of the loaded library.
#[no_mangle]
pub extern "C" fn aim_abi_version() -> u32 {
    AIM_ABI_VERSION
}

/// The message of the last failed call on this thread (empty if none failed). Valid until
/// the next failing call on this thread.
#[no_mangle]
pub extern "C" fn aim_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Loads the custom-op library at `path` (UTF-8; it exports `aim_custom_ops`, see
/// `AimCustomOp`) and registers its operators for the whole process: models loaded after
/// this call may use them. On failure (the library cannot be opened, has no entry point,
/// or a table entry is malformed) nothing of it is registered and `aim_last_error` says why.
#[no_mangle]
pub unsafe extern "C" fn aim_register_custom_ops_library(path: *const c_char) -> AimStatus {
    call(|| {
        let path = text(path, "aim_register_custom_ops_library: path")?;
        aim_runtime::custom_library::load_library(std::path::Path::new(path))
            .map(|_| ())
            .map_err(|e| Failure(AimStatus::LoadFailed, e))
    })
}

/// Frees a model (null is allowed). No run may be in progress on it.
#[no_mangle]
pub unsafe extern "C" fn aim_model_free(model: *mut AimModel) {
    if !model.is_null() {
        drop(Box::from_raw(model));
    }
}

/// The number of inputs the model takes (0 for a null model).
#[no_mangle]
pub unsafe extern "C" fn aim_model_input_count(model: *const AimModel) -> usize {
    model.as_ref().map_or(0, |m| m.inputs.len())
}

/// The number of outputs the model gives (0 for a null model).
#[no_mangle]
pub unsafe extern "C" fn aim_model_output_count(model: *const AimModel) -> usize {
    model.as_ref().map_or(0, |m| m.outputs.len())
}

fn info_of(list: &[Declared], index: usize, what: &str, out: *mut AimTensorInfo) -> Result<(), Failure> {
    let d =
        list.get(index).ok_or_else(|| invalid(format!("{what} {index} does not exist (there are {})", list.len())))?;
    let info = AimTensorInfo {
        name: d.name.as_ptr(),
        dtype: d.dtype,
        rank: d.shape.as_ref().map_or(-1, |s| s.len() as i64),
        shape: d.shape.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
    };
    // SAFETY: the caller passes a valid `out` (checked non-null by the caller of this).
    unsafe { out.write(info) };
    Ok(())
}

/// Describes input `index` into `*out`.
#[no_mangle]
pub unsafe extern "C" fn aim_model_input(model: *const AimModel, index: usize, out: *mut AimTensorInfo) -> AimStatus {
    call(|| {
        let m = model.as_ref().ok_or_else(|| invalid("aim_model_input: model is null"))?;
        if out.is_null() {
            return Err(invalid("aim_model_input: out is null"));
        }
        info_of(&m.inputs, index, "input", out)
    })
}

/// Describes output `index` into `*out`.
#[no_mangle]
pub unsafe extern "C" fn aim_model_output(model: *const AimModel, index: usize, out: *mut AimTensorInfo) -> AimStatus {
    call(|| {
        let m = model.as_ref().ok_or_else(|| invalid("aim_model_output: model is null"))?;
        if out.is_null() {
            return Err(invalid("aim_model_output: out is null"));
        }
        info_of(&m.outputs, index, "output", out)
    })
}

/// The worker threads a run of this model uses (0 for a null model).
#[no_mangle]
pub unsafe extern "C" fn aim_model_threads(model: *const AimModel) -> usize {
    model.as_ref().map_or(0, |m| m.model.threads())
}

/// Runs `model` on `inputs` (`count` tensors, each naming a model input), returning
/// every output by name in a C-readable form.
unsafe fn run_model(m: &AimModel, inputs: *const AimTensor, count: usize) -> Result<Vec<(String, Tensor)>, Failure> {
    if count > 0 && inputs.is_null() {
        return Err(invalid(format!("inputs is null but count is {count}")));
    }
    let given = if count == 0 { &[][..] } else { std::slice::from_raw_parts(inputs, count) };
    let mut names = Vec::with_capacity(count);
    let mut shapes = Vec::with_capacity(count);
    for (i, t) in given.iter().enumerate() {
        let name = text(t.name, &format!("input {i}: name"))?;
        if t.rank > 0 && t.shape.is_null() {
            return Err(invalid(format!("input '{name}': shape is null but rank is {}", t.rank)));
        }
        let dims = if t.rank == 0 { &[][..] } else { std::slice::from_raw_parts(t.shape, t.rank) };
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| invalid(format!("input '{name}': negative dim {d} in {dims:?}"))))
            .collect::<Result<Vec<usize>, _>>()?;
        names.push(name);
        shapes.push(shape);
    }
    let mut views = Vec::with_capacity(count);
    for ((t, name), shape) in given.iter().zip(&names).zip(&shapes) {
        let dtype = DType::from_onnx_code(t.dtype)
            .ok_or_else(|| invalid(format!("input '{name}': {} is not a dtype aim supports", t.dtype)))?;
        if t.byte_len > 0 && t.data.is_null() {
            return Err(invalid(format!("input '{name}': data is null but byte_len is {}", t.byte_len)));
        }
        let bytes = if t.byte_len == 0 { &[][..] } else { std::slice::from_raw_parts(t.data.cast::<u8>(), t.byte_len) };
        views.push((*name, TensorView { dtype, shape, bytes }));
    }
    m.model.run_views(&views)
}

/// Runs the model on `count` named inputs; on success `*outputs` holds every output in the
/// model's order (free it with [`aim_outputs_free`]), on failure it is set to null.
#[no_mangle]
pub unsafe extern "C" fn aim_model_run(
    model: *const AimModel,
    inputs: *const AimTensor,
    count: usize,
    outputs: *mut *mut AimOutputs,
) -> AimStatus {
    call(|| {
        if outputs.is_null() {
            return Err(invalid("aim_model_run: outputs is null"));
        }
        *outputs = std::ptr::null_mut();
        let m = model.as_ref().ok_or_else(|| invalid("aim_model_run: model is null"))?;
        let tensors = run_model(m, inputs, count)?
            .into_iter()
            .map(|(name, tensor)| Returned {
                name: CString::new(name.replace('\0', " ")).unwrap_or_default(),
                shape: tensor.shape().iter().map(|&d| d as i64).collect(),
                tensor,
            })
            .collect();
        *outputs = Box::into_raw(Box::new(AimOutputs { tensors }));
        Ok(())
    })
}

/// Runs the model on `count` named inputs and copies the outputs named by `buffers`
/// (`buffer_count` of them) into them; each buffer must be exactly its output's size (the
/// error says the size and shape the run gave). Outputs not named are dropped.
#[no_mangle]
pub unsafe extern "C" fn aim_model_run_into(
    model: *const AimModel,
    inputs: *const AimTensor,
    count: usize,
    buffers: *const AimBuffer,
    buffer_count: usize,
) -> AimStatus {
    call(|| {
        let m = model.as_ref().ok_or_else(|| invalid("aim_model_run_into: model is null"))?;
        if buffer_count > 0 && buffers.is_null() {
            return Err(invalid(format!("aim_model_run_into: buffers is null but buffer_count is {buffer_count}")));
        }
        let wanted = if buffer_count == 0 { &[][..] } else { std::slice::from_raw_parts(buffers, buffer_count) };
        let mut names = Vec::with_capacity(wanted.len());
        for (i, b) in wanted.iter().enumerate() {
            let name = text(b.name, &format!("buffer {i}: name"))?;
            if !m.outputs.iter().any(|o| o.name.to_bytes() == name.as_bytes()) {
                let known: Vec<String> = m.outputs.iter().map(|o| o.name.to_string_lossy().into_owned()).collect();
                return Err(invalid(format!(
                    "the model has no output named '{name}' (its outputs: {})",
                    known.join(", ")
                )));
            }
            if b.byte_len > 0 && b.data.is_null() {
                return Err(invalid(format!("buffer for '{name}': data is null but byte_len is {}", b.byte_len)));
            }
            names.push(name);
        }
        let outs = run_model(m, inputs, count)?;
        for (b, name) in wanted.iter().zip(&names) {
            let (_, t) = outs.iter().find(|(n, _)| n == name).expect("every output is returned");
            if t.bytes().len() != b.byte_len {
                return Err(invalid(format!(
                    "buffer for '{name}' holds {} bytes; the output is {} {:?} ({} bytes)",
                    b.byte_len,
                    t.dtype(),
                    t.shape(),
                    t.bytes().len()
                )));
            }
            if b.byte_len > 0 {
                std::ptr::copy_nonoverlapping(t.bytes().as_ptr(), b.data.cast::<u8>(), b.byte_len);
            }
        }
        Ok(())
    })
}

/// How many outputs a run gave (0 for null).
#[no_mangle]
pub unsafe extern "C" fn aim_outputs_count(outputs: *const AimOutputs) -> usize {
    outputs.as_ref().map_or(0, |o| o.tensors.len())
}

/// Output `index` of a run into `*out`; its pointers stay valid until the outputs are
/// freed.
#[no_mangle]
pub unsafe extern "C" fn aim_outputs_get(outputs: *const AimOutputs, index: usize, out: *mut AimTensor) -> AimStatus {
    call(|| {
        let o = outputs.as_ref().ok_or_else(|| invalid("aim_outputs_get: outputs is null"))?;
        if out.is_null() {
            return Err(invalid("aim_outputs_get: out is null"));
        }
        let r = o
            .tensors
            .get(index)
            .ok_or_else(|| invalid(format!("output {index} does not exist (there are {})", o.tensors.len())))?;
        out.write(AimTensor {
            name: r.name.as_ptr(),
            dtype: r.tensor.dtype().onnx_code(),
            rank: r.shape.len(),
            shape: r.shape.as_ptr(),
            data: r.tensor.bytes().as_ptr().cast(),
            byte_len: r.tensor.bytes().len(),
        });
        Ok(())
    })
}

/// Frees the outputs of a run (null is allowed).
#[no_mangle]
pub unsafe extern "C" fn aim_outputs_free(outputs: *mut AimOutputs) {
    if !outputs.is_null() {
        drop(Box::from_raw(outputs));
    }
}

impl Session for aim_runtime::embedded::Compiled {
    fn inputs(&self) -> &[ValueInfo] {
        aim_runtime::embedded::Compiled::inputs(self)
    }
    fn outputs(&self) -> &[ValueInfo] {
        aim_runtime::embedded::Compiled::outputs(self)
    }
    fn threads(&self) -> usize {
        aim_runtime::embedded::Compiled::threads(self)
    }
    fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, Failure> {
        use aim_runtime::embedded::CompiledError;
        let opts = aim_runtime::RunOptions::default();
        let fail = |e: CompiledError| match e {
            CompiledError::Argument(msg) => invalid(msg),
            CompiledError::Run(e) => Failure(AimStatus::RunFailed, format!("{}: {e}", self.source())),
        };
        aim_runtime::views::run_on_views(
            inputs,
            |msg| fail(CompiledError::Argument(msg)),
            |t| self.run(t, &opts).map_err(fail),
        )
    }
}

/// Loads a model compiled ahead of time: what a compiled object's `<name>_load` calls,
/// passing its `count` programs (an array of `aim_runtime::embedded::EmbeddedProgram`,
/// layout version `abi`; hosts do not call it themselves). `options` may be null; its
/// `cpu` must be null or `"native"` (the object runs at the level it was compiled for), and
/// its `backend` null or `"cpu"`. On failure `*out` is set to null.
///
/// # Safety
/// `programs` points to `count` programs as a compiled object lays them out, living for
/// the rest of the process.
#[no_mangle]
pub unsafe extern "C" fn aim_runtime_load_embedded(
    abi: u32,
    programs: *const c_void,
    count: usize,
    options: *const AimLoadOptions,
    out: *mut *mut AimModel,
) -> AimStatus {
    call(|| {
        if out.is_null() {
            return Err(invalid("aim_runtime_load_embedded: out is null"));
        }
        *out = std::ptr::null_mut();
        if abi != aim_runtime::embedded::EMBED_ABI_VERSION {
            return Err(Failure(
                AimStatus::LoadFailed,
                format!(
                    "the compiled model uses embedding layout {abi}; this library reads layout {} (compile the model again with this aim)",
                    aim_runtime::embedded::EMBED_ABI_VERSION
                ),
            ));
        }
        if programs.is_null() || count == 0 {
            return Err(invalid("aim_runtime_load_embedded: no programs"));
        }
        let (mut threads, mut pin) = (None, false);
        if let Some(o) = options.as_ref() {
            if o.threads > 0 {
                threads = Some(o.threads as usize);
            }
            pin = o.pin_threads != 0;
            if o.memory_budget != 0 {
                return Err(invalid(
                    "memory budgets are planned by libaim's loader (aim_model_load): options.memory_budget must be 0 for a compiled model",
                ));
            }
            if !o.weights.is_null() && !matches!(text(o.weights, "options.weights")?, "f32" | "") {
                return Err(invalid(
                    "a compiled model holds its weights as it was compiled (options.weights must be null or \"f32\"; compile with aim compile --weights)",
                ));
            }
            if !o.backend.is_null() && text(o.backend, "options.backend")? != "cpu" {
                return Err(invalid(
                    "a compiled model runs on the cpu backend only (options.backend must be null or \"cpu\")",
                ));
            }
            if !o.cpu.is_null() && !matches!(text(o.cpu, "options.cpu")?, "native" | "") {
                return Err(invalid("a compiled model runs at the ISA level it was compiled for (options.cpu must be null or \"native\")"));
            }
        }
        let list = std::slice::from_raw_parts(programs.cast::<aim_runtime::embedded::EmbeddedProgram>(), count);
        let model = aim_runtime::embedded::Compiled::load(list, threads, pin)
            .map_err(|e| Failure(AimStatus::LoadFailed, format!("loading a compiled model: {e}")))?;
        *out = Box::into_raw(Box::new(AimModel::new(Box::new(model))));
        Ok(())
    })
}
