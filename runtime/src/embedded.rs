//! Programs compiled ahead of time into a shared object (`aim compile --target`), run
//! without the compiler: each program is a `.aim` image of the optimised graph (weights
//! prepacked for the recorded target, the arena plan recorded) in the object's read-only
//! data, with a table of the machine code generated for its elementwise loops, reductions
//! and transposes. The object's entry function hands both to [`Compiled::load`].
//!
//! The layout of [`EmbeddedProgram`] and [`KernelEntry`] is part of the ABI between a
//! compiled object and this runtime (`EMBED_ABI_VERSION`).

use crate::cpu::{CpuProgram, ElementwiseFn, Generated, Placement, ReduceFn, TransposeFn};
use crate::pool::ThreadPool;
use crate::{RunError, RunOptions};
use aim_ir::{Tensor, ValueInfo};
use aim_kernels::gemm::{Blocking, Isa, IsaKind};
use std::collections::HashMap;
use std::sync::Arc;

/// The version of the layout a compiled object's entry function passes: bumped when
/// [`EmbeddedProgram`], [`KernelEntry`], the generated entry function's signature or the
/// [`crate::cpu::EntryEnv`] it reads change, so an object built by another aim is refused
/// with a message rather than misread.
pub const EMBED_ABI_VERSION: u32 = 3;

/// One generated function of a program: which node it runs, what kind of function it is
/// ([`KERNEL_ELEMENTWISE`], [`KERNEL_REDUCE`], [`KERNEL_TRANSPOSE`]) and its address.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelEntry {
    /// The index of the node in the program's graph.
    pub node: u64,
    /// Which signature `func` has.
    pub kind: u64,
    /// The function.
    pub func: *const std::ffi::c_void,
}

/// [`KernelEntry::kind`] of an `aim:Elementwise` loop ([`ElementwiseFn`]).
pub const KERNEL_ELEMENTWISE: u64 = 0;
/// [`KernelEntry::kind`] of an `aim:Reduce` loop ([`ReduceFn`]).
pub const KERNEL_REDUCE: u64 = 1;
/// [`KernelEntry::kind`] of an `aim:Transpose` copy ([`TransposeFn`]).
pub const KERNEL_TRANSPOSE: u64 = 2;

/// One program of a compiled object, as its entry function passes it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EmbeddedProgram {
    /// The `.aim` image (page-aligned, in the object's read-only data).
    pub image: *const u8,
    /// Its length in bytes.
    pub image_len: usize,
    /// The program's generated functions.
    pub kernels: *const KernelEntry,
    /// How many there are.
    pub kernel_count: usize,
    /// The entry function generated for the program's typed steps ([`crate::cpu::EntryFn`]),
    /// or null when the program runs node by node.
    pub entry: *const std::ffi::c_void,
    /// The [`crate::cpu::fingerprint`] of the steps the entry function was generated for.
    pub entry_fingerprint: u64,
}

/// A model compiled ahead of time, loaded: its programs (the first shape-generic, the others
/// specialised to one input-shape signature each) on one thread pool.
pub struct Compiled {
    /// The shape-generic program and its graph's declared inputs and outputs.
    generic: CpuProgram,
    /// Programs specialised to static input shapes: the shapes in input order, and the
    /// program.
    special: Vec<(Vec<Vec<usize>>, CpuProgram)>,
    threads: usize,
    source: String,
}

/// Why a run of a [`Compiled`] model failed.
#[derive(Debug, thiserror::Error)]
pub enum CompiledError {
    /// The inputs named are not the model's (an unknown name, a name given twice).
    #[error("{0}")]
    Argument(String),
    /// The run itself failed (shapes that do not fit, a kernel error).
    #[error(transparent)]
    Run(#[from] RunError),
}

/// The ISA family a recorded level runs on, and the CPU features its generated code may use.
fn level_isa(level: &str) -> Result<IsaKind, String> {
    Ok(match level {
        "x86-64-v4" => IsaKind::Avx512,
        "x86-64-v3" => IsaKind::Avx2,
        "aarch64-neon" => IsaKind::Neon,
        "x86-64-v2" | "baseline" => IsaKind::Portable,
        other => return Err(format!("unknown ISA level '{other}'")),
    })
}

/// Whether this CPU has every feature code compiled for ISA level `level` (`x86-64-v4`,
/// `aarch64-neon`, ...) may use: what running code compiled ahead of time needs.
pub fn host_supports(level: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let v2 = has!("sse4.1") && has!("sse4.2");
        let v3 = v2 && has!("avx") && has!("avx2") && has!("fma");
        match level {
            "x86-64-v4" => v3 && has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl"),
            "x86-64-v3" => v3,
            "x86-64-v2" => v2,
            "baseline" => true,
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        matches!(level, "aarch64-neon" | "baseline") && std::arch::is_aarch64_feature_detected!("neon")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        level == "baseline"
    }
}

impl Compiled {
    /// Loads the programs a compiled object passes, running on `threads` threads (`None`:
    /// one per physical core; workers pinned to cores when `pin`). The first program must
    /// be the shape-generic one.
    ///
    /// # Safety
    /// Every pointer must be what the object's entry function passes: images that live for
    /// the rest of the process (the object is never unloaded while the model lives, and
    /// `dlclose` of it is the host's error, as for any code it calls), and kernel tables whose
    /// functions have the signatures their kinds name.
    pub unsafe fn load(programs: &[EmbeddedProgram], threads: Option<usize>, pin: bool) -> Result<Compiled, String> {
        if programs.is_empty() {
            return Err("the object holds no program".into());
        }
        let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let threads = threads.unwrap_or_else(|| crate::pool::physical_cores(logical)).max(1);
        let pool = Arc::new(
            ThreadPool::with_pinning(threads, pin).map_err(|e| format!("cannot start {threads} threads: {e}"))?,
        );
        let mut loaded = Vec::with_capacity(programs.len());
        let mut source = String::new();
        for (k, p) in programs.iter().enumerate() {
            if p.image.is_null() || (p.kernel_count > 0 && p.kernels.is_null()) {
                return Err(format!("program {k}: a null image or kernel table"));
            }
            // SAFETY: by the contract above, the image lives for the process.
            let image: &'static [u8] = std::slice::from_raw_parts(p.image, p.image_len);
            let kernels: &[KernelEntry] =
                if p.kernel_count == 0 { &[] } else { std::slice::from_raw_parts(p.kernels, p.kernel_count) };
            let (prog, src) = program(image, kernels, &pool).map_err(|e| format!("program {k}: {e}"))?;
            let prog = with_entry(prog, p).map_err(|e| format!("program {k}: {e}"))?;
            source = src;
            loaded.push(prog);
        }
        let mut loaded = loaded.into_iter();
        let generic = loaded.next().expect("at least one program");
        let special = loaded
            .map(|p| {
                let shapes = p.graph().inputs.iter().map(|i| i.ty.concrete_shape()).collect::<Option<Vec<_>>>();
                shapes.map(|s| (s, p)).ok_or("a specialised program has inputs of symbolic shape".to_string())
            })
            .collect::<Result<_, _>>()?;
        Ok(Compiled { generic, special, threads, source })
    }

    /// The model's inputs, as declared (symbolic dims by name).
    pub fn inputs(&self) -> &[ValueInfo] {
        &self.generic.graph().inputs
    }

    /// The model's outputs, as declared.
    pub fn outputs(&self) -> &[ValueInfo] {
        &self.generic.graph().outputs
    }

    /// Threads a run uses.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The file the model was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The input shapes of the specialised programs, in input order.
    pub fn signatures(&self) -> Vec<&[Vec<usize>]> {
        self.special.iter().map(|(s, _)| s.as_slice()).collect()
    }

    /// Runs the model on named inputs (each a model input, none twice): the program
    /// specialised to their shapes if there is one, else the shape-generic program.
    /// Outputs come back in the model's order with their names.
    pub fn run(
        &self,
        inputs: Vec<(String, Tensor)>,
        opts: &RunOptions,
    ) -> Result<Vec<(String, Tensor)>, CompiledError> {
        let mut map = HashMap::with_capacity(inputs.len());
        for (name, t) in inputs {
            if !self.inputs().iter().any(|i| i.name == name) {
                let known: Vec<&str> = self.inputs().iter().map(|i| i.name.as_str()).collect();
                return Err(CompiledError::Argument(format!(
                    "the model has no input named '{name}' (its inputs: {})",
                    known.join(", ")
                )));
            }
            if map.insert(name.clone(), t).is_some() {
                return Err(CompiledError::Argument(format!("input '{name}' is given twice")));
            }
        }
        let matches = |shapes: &[Vec<usize>]| {
            self.inputs().iter().zip(shapes).all(|(i, s)| map.get(&i.name).is_some_and(|t| t.shape() == s.as_slice()))
        };
        let prog = self.special.iter().find(|(s, _)| matches(s)).map_or(&self.generic, |(_, p)| p);
        let outs = prog.run_with(map, opts)?;
        Ok(self.outputs().iter().map(|o| o.name.clone()).zip(outs).collect())
    }
}

/// One program from its image and kernel table: the graph, the recorded target checked
/// against this CPU, the generated functions by node, the recorded arena plan.
fn program(
    image: &'static [u8],
    kernels: &[KernelEntry],
    pool: &Arc<ThreadPool>,
) -> Result<(CpuProgram, String), String> {
    let file = aim_ir::aim_file::parse_static(image)?;
    let h = &file.header;
    if h.stage != "optimized" {
        return Err(format!("stage '{}' (a compiled object holds optimized programs)", h.stage));
    }
    let get = |k: &str| h.target.get(k).ok_or_else(|| format!("the image records no target '{k}'"));
    let (arch, level) = (get("arch")?, get("level")?);
    if arch != std::env::consts::ARCH {
        return Err(format!("compiled for {arch}; this is {}", std::env::consts::ARCH));
    }
    if !host_supports(level) {
        return Err(format!("compiled for {level}, which this CPU does not support: compile the model again for it"));
    }
    let kind = level_isa(level)?;
    let isa = Isa::new(kind).ok_or_else(|| format!("compiled for {level}, whose kernels this CPU cannot run"))?;
    let cache = |k: &str| -> Result<usize, String> { get(k)?.parse().map_err(|_| format!("bad target '{k}'")) };
    let blocking = Blocking::for_caches(isa, cache("l1d")?, cache("l2")?);
    let plan = h.plan.as_ref().ok_or("the image records no arena plan")?;
    let placement = Placement::from_arena_plan(plan);
    let graph = file.model.graph;
    aim_ir::verify(&graph).map_err(|e| format!("invalid graph: {e}"))?;
    let mut code = Generated::default();
    for e in kernels {
        let node = usize::try_from(e.node).ok().filter(|&n| n < graph.nodes.len());
        let node = node.ok_or_else(|| format!("a kernel for node {}, which the program does not have", e.node))?;
        if e.func.is_null() {
            return Err(format!("node '{}': a null kernel", graph.nodes[node].name));
        }
        // SAFETY: by `Compiled::load`'s contract each function has the signature its kind
        // names (the compiler emits them with exactly those parameters).
        unsafe {
            match e.kind {
                KERNEL_ELEMENTWISE => {
                    code.elementwise
                        .insert(node, std::mem::transmute::<*const std::ffi::c_void, ElementwiseFn>(e.func));
                }
                KERNEL_REDUCE => {
                    code.reduce.insert(node, std::mem::transmute::<*const std::ffi::c_void, ReduceFn>(e.func));
                }
                KERNEL_TRANSPOSE => {
                    code.transpose.insert(node, std::mem::transmute::<*const std::ffi::c_void, TransposeFn>(e.func));
                }
                other => return Err(format!("node '{}': unknown kernel kind {other}", graph.nodes[node].name)),
            }
        }
    }
    let prog = CpuProgram::new(graph, isa, blocking, pool.clone(), code, &placement).map_err(|e| e.to_string())?;
    Ok((prog, h.source.clone()))
}

/// `prog` running its steps from the entry function the object holds for it, once its own
/// steps are checked to be those the function was generated for.
///
/// # Safety
/// `p.entry`, when not null, is a function of the [`crate::cpu::EntryFn`] signature that
/// lives as long as the process (see [`Compiled::load`]).
unsafe fn with_entry(prog: CpuProgram, p: &EmbeddedProgram) -> Result<CpuProgram, String> {
    if p.entry.is_null() {
        return Ok(prog);
    }
    let ops = prog.entry_ops().ok_or_else(|| {
        format!(
            "the object has an entry function for this program, but it runs node by node here ({})",
            prog.why_no_steps().unwrap_or("no static steps")
        )
    })?;
    if crate::cpu::fingerprint(&ops) != p.entry_fingerprint {
        return Err("the object's entry function was generated for other steps than this runtime makes of the program (an object from another version of aim?)".into());
    }
    // SAFETY: by the contract above.
    let func = unsafe { std::mem::transmute::<*const std::ffi::c_void, crate::cpu::EntryFn>(p.entry) };
    Ok(prog.with_entry(crate::cpu::Entry { func, owner: Arc::new(()) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The image of a one-node program (Relu over f32[1,8]) compiled for the portable
    /// kernels of this architecture, page-aligned and leaked as a compiled object's data is.
    fn image() -> (&'static [u8], aim_ir::Graph) {
        let text = "opset 17\ngraph \"g\" {\n  input %x: f32[1,8]\n  %y = Relu(%x)  # r\n  output %y: f32[1,8]\n}\n";
        let model = aim_ir::text::parse_model(text).unwrap();
        let target = [("arch", std::env::consts::ARCH), ("level", "baseline"), ("l1d", "32768"), ("l2", "1048576")];
        let header = aim_ir::aim_file::Header {
            stage: "optimized".into(),
            target: target.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            writer: "test".into(),
            source: "g".into(),
            plan: Some(aim_ir::aim_file::ArenaPlan::default()),
        };
        let bytes = aim_ir::aim_file::to_bytes(&model, &header).unwrap();
        let layout = std::alloc::Layout::from_size_align(bytes.len(), aim_ir::aim_file::DATA_ALIGN).unwrap();
        // SAFETY: a fresh allocation of the layout's size, filled before it is read, and
        // never freed (the image must live for the process).
        let image = unsafe {
            let p = std::alloc::alloc(layout);
            assert!(!p.is_null());
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
            std::slice::from_raw_parts(p as *const u8, bytes.len())
        };
        (image, model.graph)
    }

    static ENTRY_RUNS: AtomicUsize = AtomicUsize::new(0);

    /// An entry function for the one-step program (a library kernel), as the compiler would
    /// generate it.
    unsafe extern "C" fn entry(ctx: *const u8, _: *mut u8, _: *const *mut u8, env: *const crate::cpu::EntryEnv) -> i64 {
        ENTRY_RUNS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the runtime passes its own environment and context.
        match unsafe { ((*env).run_step)(ctx, 0) } {
            0 => 0,
            _ => 1,
        }
    }

    fn program(fingerprint: u64) -> EmbeddedProgram {
        let (image, _) = image();
        EmbeddedProgram {
            image: image.as_ptr(),
            image_len: image.len(),
            kernels: std::ptr::null(),
            kernel_count: 0,
            entry: entry as *const std::ffi::c_void,
            entry_fingerprint: fingerprint,
        }
    }

    #[test]
    fn an_object_entry_function_runs_the_steps_it_was_generated_for() {
        let (_, graph) = image();
        let ops = crate::cpu::entry_ops_for(&graph, &Placement::default()).unwrap();
        // SAFETY: the image lives for the process and `entry` has the entry signature.
        let m = unsafe { Compiled::load(&[program(crate::cpu::fingerprint(&ops))], Some(1), false) }.unwrap();
        let before = ENTRY_RUNS.load(Ordering::SeqCst);
        let x = Tensor::from_vec(&[1, 8], vec![-2.0f32, -1.0, 0.0, 1.0, 2.0, -3.0, 3.0, 0.5]);
        let y = m.run(vec![("x".into(), x)], &RunOptions::default()).unwrap();
        assert_eq!(y[0].1.data::<f32>(), &[0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 3.0, 0.5]);
        assert!(ENTRY_RUNS.load(Ordering::SeqCst) > before, "the object's entry function ran");
    }

    #[test]
    fn an_object_entry_function_for_other_steps_is_refused() {
        // SAFETY: as above.
        let r = unsafe { Compiled::load(&[program(0x1234)], Some(1), false) };
        let e = r.err().expect("a wrong fingerprint is refused");
        assert!(e.contains("other steps"), "{e}");
    }
}
