//! Running a [`CudaProgram`] on an NVIDIA GPU through the driver API (cudarc, loaded at
//! run time): the module JIT-compiled by the driver with its error log surfaced, weights
//! uploaded once, one device arena from the program's plan, inputs copied in and outputs
//! copied out at the graph's edges, every launch on one stream.

use aim_ir::Tensor;
use aim_runtime::cuda::{CudaProgram, Storage};
use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

/// Why the GPU could not run a program.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver library.
    #[error(
        "no NVIDIA driver found (libcuda.so could not be loaded): the cuda backend needs an NVIDIA GPU and its driver"
    )]
    NoDriver,
    /// A driver, but no device.
    #[error("the NVIDIA driver reports no GPU")]
    NoDevice,
    /// A GPU older than the PTX aim generates.
    #[error("GPU {name} is sm_{sm}: aim's PTX needs sm_80 (Ampere) or newer")]
    TooOld {
        /// The GPU's name.
        name: String,
        /// Its compute capability × 10.
        sm: u32,
    },
    /// The driver refused the module (too old for the PTX version, or a PTX error).
    #[error("the driver could not load the PTX module ({code}): {log}")]
    Jit {
        /// The driver's error name.
        code: String,
        /// The JIT's error log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA {what}: {code}")]
    Driver {
        /// What was being done.
        what: String,
        /// The driver's error name.
        code: String,
    },
    /// An input is missing or does not match the program.
    #[error("input '{name}': {msg}")]
    Input {
        /// The input (or output) name.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// A kernel raised the error flag (an index out of range).
    #[error("a kernel found an index out of range (Gather): the run's outputs are not valid")]
    BadIndex,
}

fn driver(what: &str) -> impl Fn(result::DriverError) -> CudaError + '_ {
    move |e| {
        let code = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
        CudaError::Driver { what: what.to_string(), code }
    }
}

/// An opened GPU.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Its name, as the driver gives it.
    pub name: String,
    /// Its compute capability × 10 (90 for an H100).
    pub sm: u32,
}

impl Device {
    /// Opens GPU `ordinal`; errors say whether the driver, the device or its architecture
    /// is what is missing.
    pub fn open(ordinal: usize) -> Result<Device, CudaError> {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(driver("counting devices"))?;
        if count <= 0 || ordinal >= count as usize {
            return Err(CudaError::NoDevice);
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("creating a context"))?;
        let name = ctx.name().unwrap_or_else(|_| "(unnamed)".into());
        let (major, minor) = ctx.compute_capability().map_err(driver("reading the compute capability"))?;
        let sm = (major * 10 + minor) as u32;
        if sm < 80 {
            return Err(CudaError::TooOld { name, sm });
        }
        let stream = ctx.default_stream();
        Ok(Device { ctx, stream, name, sm })
    }

    /// Loads `p`: JIT-compiles its module, uploads its constants, allocates its arena.
    pub fn load(&self, p: CudaProgram) -> Result<Loaded, CudaError> {
        self.ctx.bind_to_thread().map_err(driver("binding the context"))?;
        let module = load_module(&p.module())?;
        let mut funcs = Vec::with_capacity(p.kernels.len());
        for k in &p.kernels {
            let name = CString::new(k.name.as_str()).map_err(|_| CudaError::Driver {
                what: format!("kernel name {}", k.name),
                code: "contains a NUL".into(),
            })?;
            // SAFETY: `module` was just loaded and lives as long as `Loaded`.
            funcs.push(unsafe { result::module::get_function(module.0, name) }.map_err(driver("finding a kernel"))?);
        }
        let mut consts = HashMap::new();
        for (v, val) in p.values.iter().enumerate() {
            if let Storage::Constant(t) = &val.storage {
                let d = self.stream.clone_htod(t.bytes()).map_err(driver("uploading weights"))?;
                consts.insert(v, d);
            }
        }
        let arena = self.stream.alloc_zeros::<u8>(p.arena_bytes.max(1)).map_err(driver("allocating the arena"))?;
        let flag = self.stream.alloc_zeros::<u32>(1).map_err(driver("allocating the error flag"))?;
        // The weights are on the device: the host copies are dropped.
        let mut p = p;
        for val in p.values.iter_mut() {
            if let Storage::Constant(_) = val.storage {
                val.storage = Storage::Constant(Tensor::from_vec(&[0], Vec::<f32>::new()));
            }
        }
        Ok(Loaded {
            stream: self.stream.clone(),
            program: p,
            funcs,
            consts,
            state: Mutex::new(State { arena, flag }),
            _module: module,
        })
    }
}

/// A loaded module, unloaded on drop.
struct Module(sys::CUmodule);

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `load_module`, unloaded once.
        unsafe {
            let _ = result::module::unload(self.0);
        }
    }
}

// SAFETY: a CUmodule handle may be used from any thread with its context bound.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

/// JIT-compiles PTX text with the driver, returning its error log on failure.
fn load_module(ptx: &str) -> Result<Module, CudaError> {
    let src =
        CString::new(ptx).map_err(|_| CudaError::Jit { code: "bad text".into(), log: "a NUL in the PTX".into() })?;
    let mut log = vec![0u8; 16 * 1024];
    let mut options =
        [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let mut module = std::mem::MaybeUninit::uninit();
    // SAFETY: the options and values arrays have two entries each, the log buffer is as
    // long as its stated size, and the source is NUL-terminated.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            module.as_mut_ptr(),
            src.as_ptr() as *const c_void,
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let code = result::DriverError(r).error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let mut text = String::from_utf8_lossy(&log[..end]).trim().to_string();
        if r == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
            text = format!(
                "the driver is too old for PTX ISA {} (CUDA 11.8 or newer needed). {text}",
                aim_runtime::cuda::PTX_VERSION
            );
        }
        return Err(CudaError::Jit { code, log: text });
    }
    // SAFETY: the call succeeded, so the module is initialised.
    Ok(Module(unsafe { module.assume_init() }))
}

struct State {
    arena: CudaSlice<u8>,
    flag: CudaSlice<u32>,
}

/// A program ready to run on a GPU.
pub struct Loaded {
    stream: Arc<CudaStream>,
    program: CudaProgram,
    funcs: Vec<sys::CUfunction>,
    consts: HashMap<usize, CudaSlice<u8>>,
    /// The arena and the error flag; one run at a time.
    state: Mutex<State>,
    _module: Module,
}

// SAFETY: CUfunction handles are plain driver handles valid on any thread (the context is
// bound before use); everything mutable is behind the mutex.
unsafe impl Send for Loaded {}
unsafe impl Sync for Loaded {}

impl Loaded {
    /// The program.
    pub fn program(&self) -> &CudaProgram {
        &self.program
    }

    /// Runs the program: inputs copied to the device, every launch, outputs copied back.
    pub fn run(&self, inputs: &HashMap<String, Tensor>) -> Result<Vec<Tensor>, CudaError> {
        let p = &self.program;
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.stream.context().bind_to_thread().map_err(driver("binding the context"))?;
        let mut ins: HashMap<usize, CudaSlice<u8>> = HashMap::new();
        for (v, val) in p.values.iter().enumerate() {
            if let Storage::Input = val.storage {
                let t = p.input(v, inputs).map_err(|msg| CudaError::Input { name: val.name.clone(), msg })?;
                ins.insert(v, self.stream.clone_htod(t.bytes()).map_err(driver("copying an input"))?);
            }
        }
        let (arena, _a) = st.arena.device_ptr(&self.stream);
        let (flag, _f) = st.flag.device_ptr(&self.stream);
        // SAFETY: 4 bytes at `flag` are the flag's allocation.
        unsafe { result::memset_d8_async(flag, 0, 4, self.stream.cu_stream()) }.map_err(driver("clearing the flag"))?;
        let Ok(addr) = p.addresses::<std::convert::Infallible>(|v, val| {
            Ok(match &val.storage {
                Storage::Input => ins[&v].device_ptr(&self.stream).0,
                Storage::Constant(_) => self.consts[&v].device_ptr(&self.stream).0,
                Storage::Arena(off) => arena + *off as u64,
                // Not called for aliases: they take their root's address.
                Storage::Alias(_) => 0,
            })
        });
        for l in &p.launches {
            let k = &p.kernels[l.kernel];
            let mut args = p.params(l, &addr, flag);
            let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| a as *mut u64 as *mut c_void).collect();
            // SAFETY: each parameter is a .u64 in the kernel's signature (the lowering
            // writes both), every address points into an allocation at least as large
            // as the value the kernel reads or writes there.
            unsafe {
                result::launch_kernel(
                    self.funcs[l.kernel],
                    (k.grid[0], k.grid[1], k.grid[2]),
                    (k.block[0], k.block[1], k.block[2]),
                    k.shared_bytes as u32,
                    self.stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(driver(&format!("launching {} (node {})", k.name, l.node)))?;
        }
        let mut outs = Vec::with_capacity(p.outputs.len());
        for &o in &p.outputs {
            let val = &p.values[o];
            let mut host = vec![0u8; val.bytes()];
            let src = addr[o];
            // SAFETY: `val.bytes()` bytes at `src` belong to the value's allocation.
            unsafe { result::memcpy_dtoh_async(&mut host, src, self.stream.cu_stream()) }
                .map_err(driver("copying an output"))?;
            outs.push((val, host));
        }
        let mut flag_host = [0u32];
        self.stream.memcpy_dtoh(&st.flag, &mut flag_host).map_err(driver("reading the error flag"))?;
        self.stream.synchronize().map_err(driver("running the kernels"))?;
        if flag_host[0] != 0 {
            return Err(CudaError::BadIndex);
        }
        outs.into_iter()
            .map(|(val, host)| {
                Tensor::from_bytes(val.dtype, &val.shape, &host)
                    .map_err(|e| CudaError::Input { name: val.name.clone(), msg: e.to_string() })
            })
            .collect()
    }
}
