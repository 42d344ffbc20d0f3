//! Custom operators from C: a shared library that exports
//! `const AimCustomOp *const *aim_custom_ops(uint32_t abi_version, size_t *count)` (declared
//! in `include/aim.h`), loaded with [`load_library`] (`--custom-ops LIB.so`,
//! `aim_register_custom_ops_library`, Python's `SessionOptions.register_custom_ops_library`)
//! and registered as `aim_ir::custom` ops.
//!
//! The table is versioned and append-only: `abi_version` says which layout the library was
//! built against and `struct_size` how many bytes of it it has, so a newer aim reads an
//! older library's table and refuses one newer than itself. A kernel instance is created
//! once per node (`create`, from the node's attributes) and destroyed when aim unloads the
//! op; aim allocates each output from the shapes `infer` gives for the run's inputs, and
//! the kernel writes into it. Calls to one kernel instance are serialised unless the op
//! says `AIM_CUSTOM_OP_THREAD_SAFE`.

use aim_ir::custom::CustomOp;
use aim_ir::{Attr, DType, Dim, Node, Tensor, ValueType};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex};

/// The custom-op ABI this aim speaks; a library's table of a higher version is refused.
pub const AIM_CUSTOM_OP_ABI_VERSION: u32 = 1;
/// The most dims a custom op's tensor has.
pub const AIM_CUSTOM_MAX_RANK: usize = 8;
/// `flags`: `compute` may run on one kernel instance from several threads at once.
pub const AIM_CUSTOM_OP_THREAD_SAFE: u32 = 1;
/// The bytes an error message may take, its NUL included.
pub const AIM_CUSTOM_ERROR_LEN: usize = 512;

/// One attribute of the node, as a custom op's `infer` and `create` read it.
#[repr(C)]
pub struct AimCustomAttribute {
    /// Its name (UTF-8, NUL-terminated).
    pub name: *const c_char,
    /// 1 int, 2 float, 3 string, 4 ints, 5 floats, 6 strings (as `count` NUL-terminated
    /// strings in `strings`), 0 another kind (a tensor or a graph: not passed on).
    pub kind: i32,
    /// The value of an int.
    pub int_value: i64,
    /// The value of a float.
    pub float_value: f32,
    /// The value of a string.
    pub string_value: *const c_char,
    /// The values of ints.
    pub ints: *const i64,
    /// The values of floats.
    pub floats: *const f32,
    /// The values of strings.
    pub strings: *const *const c_char,
    /// How many values a list has.
    pub count: usize,
}

/// A tensor type: dtype (an `AimDtype` code; 0 not known), rank (-1 not known) and dims
/// (-1 for a dim not known before the run).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AimCustomType {
    /// The element type, an `AimDtype` code.
    pub dtype: i32,
    /// The rank, at most `AIM_CUSTOM_MAX_RANK`.
    pub rank: i32,
    /// The dims.
    pub dims: [i64; AIM_CUSTOM_MAX_RANK],
}

/// A tensor a kernel reads (an input) or writes (an output aim allocated): its type and
/// `bytes` bytes at `data`, dense, row-major. An absent optional input has null `data`.
#[repr(C)]
pub struct AimCustomTensor {
    /// Its type (every dim known).
    pub ty: AimCustomType,
    /// The elements.
    pub data: *mut c_void,
    /// Their size in bytes.
    pub bytes: usize,
}

/// What aim lends a kernel while it computes: its worker threads. `parallel_for(pool, n,
/// task, ctx)` calls `task(ctx, i)` for every `i` in `0..n`, spread over `threads` threads
/// (the calling one included), and returns when all have returned; `task` may run on
/// several threads at once and must not call `parallel_for` itself.
#[repr(C)]
pub struct AimCustomHost {
    /// `sizeof(AimCustomHost)` as aim has it: fields past it are absent.
    pub struct_size: u32,
    /// How many threads `parallel_for` spreads over.
    pub threads: u32,
    /// Passed back to `parallel_for` as it is.
    pub pool: *mut c_void,
    /// Runs `task(ctx, 0..n)` on the runtime's threads.
    pub parallel_for: Option<
        unsafe extern "C" fn(
            pool: *mut c_void,
            n: usize,
            task: Option<unsafe extern "C" fn(ctx: *mut c_void, i: usize)>,
            ctx: *mut c_void,
        ),
    >,
}

/// `AimCustomHost::parallel_for`: `pool` is the `Host` the adapter lent.
unsafe extern "C" fn parallel_for(
    pool: *mut c_void,
    n: usize,
    task: Option<unsafe extern "C" fn(ctx: *mut c_void, i: usize)>,
    ctx: *mut c_void,
) {
    /// The task's context, shared by the threads that run it (the kernel's to make safe).
    struct Shared(*mut c_void);
    // SAFETY: `parallel_for`'s contract: the task may run on several threads at once.
    unsafe impl Sync for Shared {}
    let (Some(task), Some(host)) = (task, (pool as *const aim_ir::custom::Host<'_>).as_ref()) else { return };
    let shared = Shared(ctx);
    let shared = &shared;
    // A panic must not unwind into the C caller: the runtime's pool re-raises a task's
    // panic on this thread, caught here (the tasks are C, which does not panic).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        (host.parallel_for)(n, &|i| {
            // SAFETY: the task and its context are the kernel's, valid for this call.
            unsafe { task(shared.0, i) }
        })
    }));
}

/// One custom operator of a library: its identity and its callbacks. A library exports
/// `const AimCustomOp *const *aim_custom_ops(uint32_t abi_version, size_t *count)`, which
/// sets `*count` and returns its table (or null when it cannot serve `abi_version`);
/// `examples/custom_op/custom_ops.c` is one.
#[repr(C)]
pub struct AimCustomOp {
    /// The layout the library was built against: `AIM_CUSTOM_OP_ABI_VERSION` of its header.
    pub abi_version: u32,
    /// `sizeof(AimCustomOp)` as the library was built: fields past it are absent.
    pub struct_size: u32,
    /// Its domain (not `""`, `ai.onnx` or `aim`).
    pub domain: *const c_char,
    /// Its op type.
    pub name: *const c_char,
    /// `AIM_CUSTOM_OP_THREAD_SAFE` or 0.
    pub flags: u32,
    /// Passed to `infer` and `create` as they are.
    pub user_data: *mut c_void,
    /// Required: fills `outputs` (one type per output of the node) from the input types
    /// and the node's attributes; returns 0, or non-zero with a message in `error`. Dims
    /// may be -1 where the inputs' are; for inputs whose dims are all known, every output
    /// dim must be known.
    pub infer: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            attributes: *const AimCustomAttribute,
            num_attributes: usize,
            inputs: *const AimCustomType,
            num_inputs: usize,
            outputs: *mut AimCustomType,
            num_outputs: usize,
            error: *mut c_char,
            error_len: usize,
        ) -> i32,
    >,
    /// Optional: a kernel instance for a node with these attributes (made once per node),
    /// or null with a message in `error`. Without it the instance is `user_data`.
    pub create: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            attributes: *const AimCustomAttribute,
            num_attributes: usize,
            error: *mut c_char,
            error_len: usize,
        ) -> *mut c_void,
    >,
    /// Required: computes every output into the buffers aim allocated from `infer`'s
    /// types (it must not change their types, write past `bytes`, or write its inputs),
    /// with the runtime's threads in `host`; returns 0, or non-zero with a message in
    /// `error`. C++ exceptions must not escape it.
    pub compute: Option<
        unsafe extern "C" fn(
            kernel: *mut c_void,
            inputs: *const AimCustomTensor,
            num_inputs: usize,
            outputs: *mut AimCustomTensor,
            num_outputs: usize,
            host: *const AimCustomHost,
            error: *mut c_char,
            error_len: usize,
        ) -> i32,
    >,
    /// Optional: frees a kernel instance from `create`.
    pub destroy: Option<unsafe extern "C" fn(kernel: *mut c_void)>,
}

/// The entry point a custom-op library exports as `aim_custom_ops`.
type Entry = unsafe extern "C" fn(abi_version: u32, count: *mut usize) -> *const *const AimCustomOp;

/// Libraries loaded so far: kept loaded for the life of the process (their ops may be
/// registered and running).
fn libraries() -> &'static Mutex<Vec<libloading::Library>> {
    static LIBS: std::sync::OnceLock<Mutex<Vec<libloading::Library>>> = std::sync::OnceLock::new();
    LIBS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Loads the custom-op library at `path` and registers its ops; returns them as
/// `domain:name`. Errors name the library and what is wrong with it.
pub fn load_library(path: &std::path::Path) -> Result<Vec<String>, String> {
    let p = path.display().to_string();
    // A library loaded before is not registered again (its kernel instances stay).
    let key = std::fs::canonicalize(path).map_err(|e| format!("{p}: cannot load: {e}"))?;
    let mut loaded = loaded().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(names) = loaded.get(&key) {
        return Ok(names.clone());
    }
    // SAFETY: loading a library runs its initialisers: the user asked for this library.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{p}: cannot load: {e}"))?;
    let mut count = 0usize;
    let table = unsafe {
        let entry: libloading::Symbol<Entry> = lib
            .get(b"aim_custom_ops\0")
            .map_err(|e| format!("{p}: no aim_custom_ops entry point (see include/aim.h): {e}"))?;
        entry(AIM_CUSTOM_OP_ABI_VERSION, &mut count)
    };
    if table.is_null() {
        return Err(format!("{p}: aim_custom_ops returned no table for ABI version {AIM_CUSTOM_OP_ABI_VERSION}"));
    }
    if count > 4096 {
        return Err(format!("{p}: aim_custom_ops says it has {count} ops"));
    }
    let mut ops = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: the library says its table holds `count` pointers.
        let op = unsafe { *table.add(i) };
        ops.push(Arc::new(unsafe { LibraryOp::new(op, &p, i)? }));
    }
    let mut names = Vec::new();
    for op in ops {
        names.push(format!("{}:{}", op.domain, op.name));
        aim_ir::custom::register(op).map_err(|e| format!("{p}: {e}"))?;
    }
    libraries().lock().unwrap_or_else(|e| e.into_inner()).push(lib);
    loaded.insert(key, names.clone());
    Ok(names)
}

/// The ops each library loaded so far registered, by its canonical path.
fn loaded() -> &'static Mutex<HashMap<std::path::PathBuf, Vec<String>>> {
    static LOADED: std::sync::OnceLock<Mutex<HashMap<std::path::PathBuf, Vec<String>>>> = std::sync::OnceLock::new();
    LOADED.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A C library's op, as an `aim_ir::custom` op: its table entry (the library stays loaded
/// for the life of the process, so the entry does too), checked at load.
struct LibraryOp {
    table: &'static AimCustomOp,
    domain: String,
    name: String,
    /// Kernel instances by node (name and attributes), each with the lock that serialises
    /// its calls unless the op is thread-safe.
    kernels: Mutex<HashMap<String, Arc<Instance>>>,
}

// SAFETY: the library's callbacks and `user_data` are the library's to make safe across
// threads; calls on one kernel instance are serialised unless the op says it is
// thread-safe (`Instance::lock`).
unsafe impl Send for LibraryOp {}
unsafe impl Sync for LibraryOp {}

struct Instance {
    kernel: *mut c_void,
    lock: Mutex<()>,
    destroy: Option<unsafe extern "C" fn(kernel: *mut c_void)>,
}

// SAFETY: see `LibraryOp`.
unsafe impl Send for Instance {}
unsafe impl Sync for Instance {}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(d) = self.destroy {
            // SAFETY: `kernel` came from this op's `create`, and is destroyed once.
            unsafe { d(self.kernel) }
        }
    }
}

/// A C string field of the table, as UTF-8.
unsafe fn c_text(p: *const c_char, what: &str) -> Result<String, String> {
    if p.is_null() {
        return Err(format!("{what} is null"));
    }
    CStr::from_ptr(p).to_str().map(str::to_string).map_err(|_| format!("{what} is not UTF-8"))
}

impl LibraryOp {
    /// The op the table entry `op` (the `i`-th of library `lib`, which stays loaded) describes,
    /// checked.
    unsafe fn new(op: *const AimCustomOp, lib: &str, i: usize) -> Result<LibraryOp, String> {
        let at = |m: String| format!("{lib}: op {i}: {m}");
        let table: &'static AimCustomOp = op.as_ref().ok_or_else(|| at("null entry".into()))?;
        if table.abi_version == 0 || table.abi_version > AIM_CUSTOM_OP_ABI_VERSION {
            return Err(at(format!(
                "built for custom-op ABI version {}, this aim speaks {AIM_CUSTOM_OP_ABI_VERSION}",
                table.abi_version
            )));
        }
        if (table.struct_size as usize) < std::mem::size_of::<AimCustomOp>() {
            return Err(at(format!(
                "struct_size {} is less than version 1's {} bytes",
                table.struct_size,
                std::mem::size_of::<AimCustomOp>()
            )));
        }
        let domain = c_text(table.domain, "domain").map_err(at)?;
        let name = c_text(table.name, "name").map_err(at)?;
        for (missing, what) in [(table.infer.is_none(), "infer"), (table.compute.is_none(), "compute")] {
            if missing {
                return Err(format!("{lib}: {domain}:{name}: no {what} callback"));
            }
        }
        Ok(LibraryOp { table, kernels: Mutex::new(HashMap::new()), domain, name })
    }

    /// Calls on one kernel instance are serialised unless the op says otherwise.
    fn thread_safe(&self) -> bool {
        self.table.flags & AIM_CUSTOM_OP_THREAD_SAFE != 0
    }

    /// The kernel instance for `node`, created on first use.
    fn instance(&self, node: &Node) -> Result<Arc<Instance>, String> {
        let key = format!("{}\u{0}{:?}", node.name, node.attrs);
        let mut kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kernels.get(&key) {
            return Ok(k.clone());
        }
        let kernel = match self.table.create {
            None => self.table.user_data,
            Some(create) => {
                let attrs = Attributes::of(node);
                let mut err = ErrorBuf::new();
                // SAFETY: the attribute array lives across the call; `err` is writable.
                let k = unsafe {
                    create(self.table.user_data, attrs.list.as_ptr(), attrs.list.len(), err.ptr(), err.len())
                };
                if k.is_null() {
                    return Err(format!("create failed: {}", err.message()));
                }
                k
            }
        };
        let destroy = if self.table.create.is_some() { self.table.destroy } else { None };
        let inst = Arc::new(Instance { kernel, lock: Mutex::new(()), destroy });
        kernels.insert(key, inst.clone());
        Ok(inst)
    }
}

/// A message buffer a callback writes into.
struct ErrorBuf(Vec<u8>);

impl ErrorBuf {
    fn new() -> ErrorBuf {
        ErrorBuf(vec![0; AIM_CUSTOM_ERROR_LEN])
    }
    fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    /// What the callback wrote (up to the first NUL, or the whole buffer).
    fn message(&self) -> String {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(self.0.len());
        let m = String::from_utf8_lossy(&self.0[..end]).into_owned();
        if m.is_empty() {
            "no message".into()
        } else {
            m
        }
    }
}

/// A node's attributes as the C table reads them, with the storage they point into.
struct Attributes {
    list: Vec<AimCustomAttribute>,
    _names: Vec<CString>,
    _strings: Vec<CString>,
    _lists: Vec<Vec<*const c_char>>,
}

impl Attributes {
    fn of(node: &Node) -> Attributes {
        let c = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        let mut names = Vec::new();
        let mut strings = Vec::new();
        let mut lists = Vec::new();
        let mut list = Vec::new();
        for (k, v) in &node.attrs {
            let name = c(k);
            let mut a = AimCustomAttribute {
                name: name.as_ptr(),
                kind: 0,
                int_value: 0,
                float_value: 0.0,
                string_value: std::ptr::null(),
                ints: std::ptr::null(),
                floats: std::ptr::null(),
                strings: std::ptr::null(),
                count: 0,
            };
            names.push(name);
            match v {
                Attr::Int(i) => (a.kind, a.int_value) = (1, *i),
                Attr::Float(f) => (a.kind, a.float_value) = (2, *f),
                Attr::String(s) => {
                    let s = c(s);
                    (a.kind, a.string_value) = (3, s.as_ptr());
                    strings.push(s);
                }
                Attr::Ints(v) => (a.kind, a.ints, a.count) = (4, v.as_ptr(), v.len()),
                Attr::Floats(v) => (a.kind, a.floats, a.count) = (5, v.as_ptr(), v.len()),
                Attr::Strings(v) => {
                    let ptrs: Vec<*const c_char> = v
                        .iter()
                        .map(|s| {
                            let s = c(s);
                            let p = s.as_ptr();
                            strings.push(s);
                            p
                        })
                        .collect();
                    (a.kind, a.strings, a.count) = (6, ptrs.as_ptr(), ptrs.len());
                    lists.push(ptrs);
                }
                Attr::Tensor(_) | Attr::Graph(_) => {}
            }
            list.push(a);
        }
        Attributes { list, _names: names, _strings: strings, _lists: lists }
    }
}

/// A value type as the C table writes it.
fn to_c_type(t: Option<&ValueType>) -> Result<AimCustomType, String> {
    let mut c = AimCustomType { dtype: 0, rank: -1, dims: [-1; AIM_CUSTOM_MAX_RANK] };
    let Some(t) = t else { return Ok(c) };
    c.dtype = t.dtype.map_or(0, DType::onnx_code);
    if let Some(s) = &t.shape {
        if s.len() > AIM_CUSTOM_MAX_RANK {
            return Err(format!("rank {} is more than a custom op takes ({AIM_CUSTOM_MAX_RANK})", s.len()));
        }
        c.rank = s.len() as i32;
        for (d, dim) in c.dims.iter_mut().zip(s) {
            *d = dim.known().map_or(-1, |k| k as i64);
        }
    }
    Ok(c)
}

/// The value type a C table entry describes.
fn from_c_type(c: &AimCustomType, i: usize) -> Result<ValueType, String> {
    let dtype = match c.dtype {
        0 => None,
        code => Some(
            DType::from_onnx_code(code).ok_or_else(|| format!("output {i}: dtype code {code} is not one aim has"))?,
        ),
    };
    let shape = match c.rank {
        -1 => None,
        r if (0..=AIM_CUSTOM_MAX_RANK as i32).contains(&r) => Some(
            c.dims[..r as usize]
                .iter()
                .map(|&d| match d {
                    -1 => Ok(Dim::Unknown),
                    d if d >= 0 => Ok(Dim::Known(d as usize)),
                    d => Err(format!("output {i}: dim {d}")),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        r => return Err(format!("output {i}: rank {r}")),
    };
    Ok(ValueType { dtype, shape })
}

impl CustomOp for LibraryOp {
    fn domain(&self) -> &str {
        &self.domain
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn infer(&self, node: &Node, inputs: &[Option<ValueType>]) -> Result<Vec<ValueType>, String> {
        let ins: Vec<AimCustomType> = inputs.iter().map(|t| to_c_type(t.as_ref())).collect::<Result<_, _>>()?;
        let mut outs = vec![AimCustomType { dtype: 0, rank: -1, dims: [-1; AIM_CUSTOM_MAX_RANK] }; node.outputs.len()];
        let attrs = Attributes::of(node);
        let mut err = ErrorBuf::new();
        let infer = self.table.infer.ok_or("no infer callback")?;
        // SAFETY: every array lives across the call, with the lengths given.
        let status = unsafe {
            infer(
                self.table.user_data,
                attrs.list.as_ptr(),
                attrs.list.len(),
                ins.as_ptr(),
                ins.len(),
                outs.as_mut_ptr(),
                outs.len(),
                err.ptr(),
                err.len(),
            )
        };
        if status != 0 {
            return Err(format!("infer failed (status {status}): {}", err.message()));
        }
        outs.iter().enumerate().map(|(i, c)| from_c_type(c, i)).collect()
    }

    fn compute(
        &self,
        node: &Node,
        inputs: &[Option<Tensor>],
        host: &aim_ir::custom::Host<'_>,
    ) -> Result<Vec<Tensor>, String> {
        let types: Vec<Option<ValueType>> =
            inputs.iter().map(|t| t.as_ref().map(|t| ValueType::known(t.dtype(), t.shape()))).collect();
        let want = self.infer(node, &types)?;
        // Outputs allocated here, from the types inference gives for these inputs.
        let mut outs: Vec<Tensor> = want
            .iter()
            .enumerate()
            .map(|(i, t)| match (t.dtype, t.concrete_shape()) {
                (Some(d), Some(s)) => Tensor::try_zeros(d, &s).map_err(|e| format!("output {i}: {e}")),
                _ => Err(format!("output {i}: infer gave {t} for inputs whose types are all known")),
            })
            .collect::<Result<_, _>>()?;
        // Inputs are read in place: the kernel gets a pointer it must not write through.
        let c_ins: Vec<AimCustomTensor> = inputs
            .iter()
            .map(|t| {
                Ok(match t {
                    None => AimCustomTensor { ty: to_c_type(None)?, data: std::ptr::null_mut(), bytes: 0 },
                    Some(t) => AimCustomTensor {
                        ty: to_c_type(Some(&ValueType::known(t.dtype(), t.shape())))?,
                        data: t.bytes().as_ptr() as *mut c_void,
                        bytes: t.bytes().len(),
                    },
                })
            })
            .collect::<Result<_, String>>()?;
        let mut c_outs: Vec<AimCustomTensor> = outs
            .iter_mut()
            .map(|t| {
                let ty = to_c_type(Some(&ValueType::known(t.dtype(), t.shape())))?;
                let b = t.bytes_mut();
                Ok(AimCustomTensor { ty, data: b.as_mut_ptr().cast(), bytes: b.len() })
            })
            .collect::<Result<_, String>>()?;
        let before: Vec<(i32, i32, [i64; AIM_CUSTOM_MAX_RANK], usize)> =
            c_outs.iter().map(|o| (o.ty.dtype, o.ty.rank, o.ty.dims, o.bytes)).collect();
        let inst = self.instance(node)?;
        let compute = self.table.compute.ok_or("no compute callback")?;
        let c_host = AimCustomHost {
            struct_size: std::mem::size_of::<AimCustomHost>() as u32,
            threads: host.threads as u32,
            pool: host as *const aim_ir::custom::Host<'_> as *mut c_void,
            parallel_for: Some(parallel_for),
        };
        let mut err = ErrorBuf::new();
        let status = {
            let _serial = (!self.thread_safe()).then(|| inst.lock.lock().unwrap_or_else(|e| e.into_inner()));
            // SAFETY: the arrays and the buffers they point to live across the call, with
            // the lengths given; the kernel instance came from this op.
            unsafe {
                compute(
                    inst.kernel,
                    c_ins.as_ptr(),
                    c_ins.len(),
                    c_outs.as_mut_ptr(),
                    c_outs.len(),
                    &c_host,
                    err.ptr(),
                    err.len(),
                )
            }
        };
        if status != 0 {
            return Err(format!("compute failed (status {status}): {}", err.message()));
        }
        for (i, (o, b)) in c_outs.iter().zip(&before).enumerate() {
            if (o.ty.dtype, o.ty.rank, o.ty.dims, o.bytes) != *b {
                return Err(format!(
                    "compute changed output {i}'s type or size (outputs are allocated by aim from infer's types)"
                ));
            }
        }
        Ok(outs)
    }
}
