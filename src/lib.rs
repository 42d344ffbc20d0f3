//! aim: an inference compiler for neural networks.
//!
//! ```no_run
//! let model = aim::Model::load("model.onnx")?;
//! let x = aim::Tensor::from_slice(&[1, 4], &[1.0f32, 2.0, 3.0, 4.0]);
//! let outputs = model.run(vec![("x".to_string(), x)])?;
//! # Ok::<(), aim::Error>(())
//! ```
//!
//! `Model::load` imports the ONNX file, verifies the graph, infers types and refuses a model
//! whose ops aim cannot run (naming all of them). `run` executes it on the selected backend.

pub mod aot;
pub mod compare;
pub mod compiled;
pub mod conformance;
pub mod explore;
mod guard;
pub mod npz;
pub mod quantize;
mod random;
#[cfg(feature = "serve")]
pub mod serve;
mod specialize;
mod views;

pub use aim_ir::{DType, Dim, Tensor, ValueType};
pub use random::random_inputs;
pub use views::TensorView;

use aim_runtime::RunOptions;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The reference kernels, interpreted node by node: the oracle.
    Reference,
    /// Compiled and optimised for this CPU: fused, packed and vectorised kernels, and
    /// Cranelift-generated loops.
    Cpu,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Backend, String> {
        match s {
            "reference" => Ok(Backend::Reference),
            "cpu" => Ok(Backend::Cpu),
            _ => Err(format!("unknown backend '{s}' (expected reference or cpu)")),
        }
    }
}

/// Everything that can go wrong loading or running a model, with its context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be imported.
    #[error(transparent)]
    Import(#[from] aim_compiler::onnx::ImportError),
    /// The graph is malformed.
    #[error("{path}: invalid graph: {cause}")]
    Verify { path: String, cause: aim_ir::VerifyError },
    /// Type inference found inputs that cannot go together.
    #[error("{path}: {cause}")]
    Infer { path: String, cause: aim_ir::infer::InferError },
    /// The model uses ops aim cannot run; every one is listed with its nodes.
    #[error("{path}: unsupported ops: {}", list_unsupported(.ops))]
    Unsupported { path: String, ops: BTreeMap<String, Vec<String>> },
    /// A run failed.
    #[error(transparent)]
    Run(#[from] aim_runtime::RunError),
    /// An input was given that the graph does not have.
    #[error("the model has no input named '{name}' (its inputs: {known})")]
    UnknownInput { name: String, known: String },
    /// A compile-time pass failed.
    #[error("{path}: {cause}")]
    Pass { path: String, cause: aim_compiler::passes::PassError },
    /// Code generation failed.
    #[error("{path}: {cause}")]
    Codegen { path: String, cause: aim_compiler::codegen::CodegenError },
    /// A `--cpu` value that names no ISA level.
    #[error(transparent)]
    Cpu(#[from] aim_compiler::target::UnknownCpu),
    /// An option out of its range.
    #[error("{option}: {reason}")]
    BadOption { option: &'static str, reason: String },
    /// Compiling the shape-generic program (deferred to the first run that needed it) failed.
    #[error("{path}: {msg}")]
    Compile { path: String, msg: String },
    /// A `.aim` file could not be written or read.
    #[error(transparent)]
    AimFile(#[from] aim_ir::aim_file::AimFileError),
    /// A bug in aim (a panic), caught before it reached the caller.
    #[error("internal error in aim while {what}: {msg} (this is a bug; please report it)")]
    Internal { what: String, msg: String },
}

fn list_unsupported(ops: &BTreeMap<String, Vec<String>>) -> String {
    ops.iter()
        .map(|(op, nodes)| {
            let shown: Vec<&str> = nodes.iter().take(5).map(|s| s.as_str()).collect();
            let more = if nodes.len() > 5 { format!(" and {} more", nodes.len() - 5) } else { String::new() };
            format!("{op} (node{} {}{more})", if nodes.len() == 1 { "" } else { "s" }, shown.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// How to load a model.
#[derive(Clone, Debug)]
pub struct Options {
    /// The backend.
    pub backend: Backend,
    /// Threads (the cpu backend); `None`: the physical core count. At most
    /// [`MAX_THREADS`].
    pub threads: Option<usize>,
    /// ISA cap for the cpu backend (`native`, `x86-64-v3`, ...).
    pub cpu: String,
    /// The longest one run may take (checked before every node and loop iteration; a
    /// kernel already running finishes first): a run past it stops with an error. `None`:
    /// no limit.
    pub timeout: Option<std::time::Duration>,
    /// The largest tensor aim may allocate, in bytes (`None`: `AIM_MAX_TENSOR_BYTES`, else
    /// half the machine's memory). Process-wide: loading a model with it set changes it for
    /// every model (see `aim_ir::limits`).
    pub max_tensor_bytes: Option<usize>,
    /// Input shapes to compile specialised programs for at load (the cpu backend compiles
    /// one on first use for any other shape): each entry one signature, giving the shape of
    /// every input with symbolic dims, by name.
    pub shapes: Vec<InputShapes>,
    /// How many specialised programs the cpu backend keeps (the most recently used);
    /// `None`: 8.
    pub shape_cache: Option<usize>,
    /// Keep dense layers' (MatMul / Gemm) weights as f16 on the cpu backend: half their
    /// memory, widened to f32 panel by panel inside the GEMM; each weight rounded to the
    /// nearest f16 (relative error at most 2^-11).
    pub half_weights: bool,
}

/// The shapes of a model's inputs by name: one signature to specialise for.
pub type InputShapes = Vec<(String, Vec<usize>)>;

/// The most threads a model runs on: more is a mistake (each is a spinning worker).
pub const MAX_THREADS: usize = 1024;

impl Default for Options {
    fn default() -> Options {
        Options {
            backend: Backend::Cpu,
            threads: None,
            cpu: "native".into(),
            timeout: None,
            max_tensor_bytes: None,
            shapes: Vec::new(),
            shape_cache: None,
            half_weights: false,
        }
    }
}

enum Exec {
    Reference,
    /// The program compiled with the input dims as declared (for a model with symbolic
    /// dims, compiled only when a run needs it: every shape first gets a specialised
    /// program), and the specialiser for models with symbolic dims.
    Cpu(Generic, Option<Box<specialize::Specializer>>),
}

/// The shape-generic program: compiled at load for a model with static inputs, on first
/// need otherwise (its error kept, as text, for every run that needs it).
struct Generic {
    cell: std::sync::OnceLock<Result<Box<aim_runtime::cpu::CpuProgram>, String>>,
    threads: usize,
}

impl Generic {
    fn get(&self, spec: Option<&specialize::Specializer>, path: &str) -> Result<&aim_runtime::cpu::CpuProgram, Error> {
        let r = self.cell.get_or_init(|| match spec {
            Some(s) => s.compile_generic().map(Box::new).map_err(|e| e.to_string()),
            None => Err("the generic program is missing".into()),
        });
        r.as_deref().map_err(|msg| Error::Compile { path: path.to_string(), msg: msg.clone() })
    }
}

/// Optimises and compiles a type-inferred graph for the cpu backend.
pub(crate) fn compile_cpu(
    g: aim_ir::Graph,
    target: &aim_compiler::target::Target,
    pool: &std::sync::Arc<aim_runtime::pool::ThreadPool>,
    path: &str,
) -> Result<aim_runtime::cpu::CpuProgram, Error> {
    let g = optimize(g, target, path)?;
    build_program(g, target, pool, path)
}

/// Runs the cpu pipeline on a type-inferred graph: what a `.aim` file of stage
/// `optimized` stores.
pub(crate) fn optimize(
    mut g: aim_ir::Graph,
    target: &aim_compiler::target::Target,
    path: &str,
) -> Result<aim_ir::Graph, Error> {
    aim_compiler::passes::run_pipeline(&mut g, &aim_compiler::passes::cpu_pipeline(target), false)
        .map_err(|cause| Error::Pass { path: path.to_string(), cause })?;
    // Folding has read the weights it rewrote: their file pages need not stay resident
    // while the packed forms are built (packing reads the others in again, once).
    aim_compiler::onnx::release_pages();
    Ok(g)
}

/// Compiles an optimised graph: generated code, the memory plan, control-flow bodies and
/// packed weights.
pub(crate) fn build_program(
    g: aim_ir::Graph,
    target: &aim_compiler::target::Target,
    pool: &std::sync::Arc<aim_runtime::pool::ThreadPool>,
    path: &str,
) -> Result<aim_runtime::cpu::CpuProgram, Error> {
    if target.gemm_isa() == aim_kernels::gemm::Isa::PORTABLE {
        // Where no hand-written microkernel fits the CPU, the Cranelift one (measured 32%
        // faster than the compiler-vectorised Rust one at 512³ on SSE only) stands in; if it
        // cannot be generated, the Rust one stays.
        let _ = aim_compiler::codegen::install_portable_microkernel(target);
    }
    let code = aim_compiler::codegen::generate(&g, target)
        .map_err(|cause| Error::Codegen { path: path.to_string(), cause })?;
    let placement = placement(&aim_compiler::memory_plan::plan(&g));
    let bodies = compile_bodies(&g, target, pool, path);
    let prog = aim_runtime::cpu::CpuProgram::new(
        g,
        target.gemm_isa(),
        target.gemm_blocking(),
        pool.clone(),
        code,
        &placement,
    )?;
    // Everything the program reads is packed or copied now.
    aim_compiler::onnx::release_pages();
    Ok(prog.with_bodies(bodies))
}

/// Compiles the branches of every `If` and the body of every `Loop` of `g` into programs of
/// their own; a node whose bodies do not compile (an unsupported op inside, say) keeps
/// interpreting them.
fn compile_bodies(
    g: &aim_ir::Graph,
    target: &aim_compiler::target::Target,
    pool: &std::sync::Arc<aim_runtime::pool::ThreadPool>,
    path: &str,
) -> aim_runtime::cpu::Bodies {
    use aim_runtime::cpu::Body;
    let compile =
        |sub: &aim_ir::Graph, own: &[aim_ir::ValueInfo]| -> Result<Box<aim_runtime::cpu::CpuProgram>, Error> {
            let mut body = body_graph(g, sub, own);
            aim_ir::infer::infer_types(&mut body).map_err(|cause| Error::Infer { path: path.to_string(), cause })?;
            if !aim_runtime::unsupported_ops(&body).is_empty() {
                return Err(Error::BadOption { option: "body", reason: "unsupported ops".into() });
            }
            Ok(Box::new(compile_cpu(body, target, pool, path)?))
        };
    let mut bodies = aim_runtime::cpu::Bodies::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.domain.is_empty() {
            continue;
        }
        let body = match n.op.as_str() {
            "If" => match (n.graph("then_branch"), n.graph("else_branch")) {
                (Some(t), Some(e)) => match (compile(t, &[]), compile(e, &[])) {
                    (Ok(then), Ok(otherwise)) => Some(Body::If { then, otherwise }),
                    _ => None,
                },
                _ => None,
            },
            "Loop" => n.graph("body").and_then(|b| compile(b, &b.inputs).ok()).map(Body::Loop),
            _ => None,
        };
        if let Some(b) = body {
            bodies.insert(i, b);
        }
    }
    bodies
}

/// A control-flow body as a graph of its own: its own inputs (`own`), then every value of
/// the enclosing graph `outer` it reads (constants of `outer` become its constants).
fn body_graph(outer: &aim_ir::Graph, sub: &aim_ir::Graph, own: &[aim_ir::ValueInfo]) -> aim_ir::Graph {
    let mut free = Vec::new();
    free_names(sub, &mut free);
    let mut g = aim_ir::Graph {
        name: sub.name.clone(),
        inputs: own.to_vec(),
        outputs: sub.outputs.clone(),
        initializers: sub.initializers.clone(),
        nodes: sub.nodes.clone(),
        value_types: sub.value_types.clone(),
    };
    for name in free {
        if let Some(t) = outer.initializers.get(&name) {
            g.initializers.insert(name, t.clone());
        } else {
            let ty = outer.value_type(&name).unwrap_or_else(aim_ir::ValueType::unknown);
            g.inputs.push(aim_ir::ValueInfo { name, ty });
        }
    }
    g
}

/// The names `g` reads (its nodes, its outputs, its subgraphs at any depth) that it does
/// not define itself, in the order they are first read.
fn free_names(g: &aim_ir::Graph, out: &mut Vec<String>) {
    let mut bound: std::collections::HashSet<&str> = g.inputs.iter().map(|i| i.name.as_str()).collect();
    bound.extend(g.initializers.keys().map(|k| k.as_str()));
    for n in &g.nodes {
        bound.extend(n.outputs.iter().map(|o| o.as_str()));
    }
    let add = |name: &str, out: &mut Vec<String>| {
        if !name.is_empty() && !bound.contains(name) && !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    };
    for n in &g.nodes {
        for x in &n.inputs {
            add(x, out);
        }
        for a in n.attrs.values() {
            if let aim_ir::Attr::Graph(sub) = a {
                let mut inner = Vec::new();
                free_names(sub, &mut inner);
                for x in inner {
                    add(&x, out);
                }
            }
        }
    }
    for o in &g.outputs {
        add(&o.name, out);
    }
}

/// The full input signatures `shapes` asks for (`Options::shapes`): every input of the
/// graph in order, inputs with static shapes filled in, each checked against its type.
pub(crate) fn signatures(
    g: &aim_ir::Graph,
    shapes: &[InputShapes],
    path: &str,
) -> Result<Vec<specialize::Signature>, Error> {
    let bad = |reason: String| Error::BadOption { option: "shape", reason };
    let mut out = Vec::new();
    for given in shapes {
        for (name, _) in given {
            if !g.inputs.iter().any(|i| &i.name == name) {
                let known: Vec<&str> = g.inputs.iter().map(|i| i.name.as_str()).collect();
                return Err(bad(format!("{path} has no input named '{name}' (its inputs: {})", known.join(", "))));
            }
        }
        let sig: specialize::Signature = g
            .inputs
            .iter()
            .map(|i| match given.iter().find(|(n, _)| *n == i.name) {
                Some((_, s)) => Ok(s.clone()),
                None => {
                    i.ty.concrete_shape()
                        .ok_or_else(|| bad(format!("no shape given for input '{}' ({})", i.name, i.ty)))
                }
            })
            .collect::<Result<_, _>>()?;
        if !specialize::fits(g, &sig) {
            let shown: Vec<String> =
                g.inputs.iter().zip(&sig).map(|(i, s)| format!("{} {:?} for {}", i.name, s, i.ty)).collect();
            return Err(bad(format!("the shapes do not fit the inputs' types: {}", shown.join(", "))));
        }
        out.push(sig);
    }
    Ok(out)
}

/// The runtime's view of a memory plan: each placed value's offset and size.
pub(crate) fn placement(plan: &aim_compiler::memory_plan::MemoryPlan) -> aim_runtime::cpu::Placement {
    aim_runtime::cpu::Placement {
        arena_bytes: plan.arena_bytes,
        slots: plan.slots.iter().map(|s| (s.name.clone(), (s.offset, s.bytes))).collect(),
    }
}

/// A loaded model, ready to run.
pub struct Model {
    ir: aim_ir::Model,
    path: PathBuf,
    backend: Backend,
    exec: Exec,
    run_opts: RunOptions,
}

impl Model {
    /// Loads an ONNX file with the default options: the cpu backend, one thread per
    /// physical core, the host's full ISA.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, Error> {
        Model::load_with_options(path, &Options::default())
    }

    /// Loads an ONNX file for a given backend.
    pub fn load_with(path: impl AsRef<Path>, backend: Backend) -> Result<Model, Error> {
        Model::load_with_options(path, &Options { backend, ..Options::default() })
    }

    /// Loads an ONNX or `.aim` file (told apart by their first bytes) with options.
    pub fn load_with_options(path: impl AsRef<Path>, opts: &Options) -> Result<Model, Error> {
        let path = path.as_ref();
        guard::contain(&format!("loading {}", path.display()), || {
            if compiled::is_aim_file(path) {
                return compiled::load(path, opts);
            }
            let ir = aim_compiler::onnx::import_file(path)?;
            Model::from_ir_with(ir, path, opts)
        })
    }

    /// Wraps an imported model for the reference backend: verifies it, infers types and
    /// checks op support.
    pub fn from_ir(ir: aim_ir::Model, path: &Path, backend: Backend) -> Result<Model, Error> {
        Model::from_ir_with(ir, path, &Options { backend, ..Options::default() })
    }

    /// Wraps an imported model: verifies it, infers types, checks op support and, for the
    /// cpu backend, optimises and compiles it for the target.
    pub fn from_ir_with(ir: aim_ir::Model, path: &Path, opts: &Options) -> Result<Model, Error> {
        guard::contain(&format!("loading {}", path.display()), || Model::from_ir_inner(ir, path, opts))
    }

    fn from_ir_inner(mut ir: aim_ir::Model, path: &Path, opts: &Options) -> Result<Model, Error> {
        let p = path.display().to_string();
        if let Some(t) = opts.threads.filter(|&t| t > MAX_THREADS) {
            return Err(Error::BadOption { option: "threads", reason: format!("{t} is more than {MAX_THREADS}") });
        }
        if let Some(b) = opts.max_tensor_bytes {
            aim_ir::limits::set_max_tensor_bytes(b);
        }
        aim_ir::verify(&ir.graph).map_err(|cause| Error::Verify { path: p.clone(), cause })?;
        let ops = aim_runtime::unsupported_ops(&ir.graph);
        if !ops.is_empty() {
            return Err(Error::Unsupported { path: p, ops });
        }
        aim_ir::infer::infer_types(&mut ir.graph).map_err(|cause| Error::Infer { path: p.clone(), cause })?;
        let exec = match opts.backend {
            Backend::Reference => Exec::Reference,
            Backend::Cpu => {
                let mut target = aim_compiler::target::Target::host().with_cpu(&opts.cpu)?;
                target.half_weights = opts.half_weights;
                let threads = opts.threads.unwrap_or(target.physical_cores).max(1);
                let pool = aim_runtime::pool::ThreadPool::new(threads)
                    .map(std::sync::Arc::new)
                    .map_err(|e| aim_runtime::RunError::Threads { threads, reason: e.to_string() })?;
                let generic = Generic { cell: std::sync::OnceLock::new(), threads };
                // Models with symbolic input dims keep their weights to specialise per input
                // shape; the others do not need the imported weights (memory-mapped or
                // copied) any more: the program holds them packed.
                let spec = if specialize::worthwhile(&ir.graph) {
                    let cap = opts.shape_cache.unwrap_or(specialize::DEFAULT_CAPACITY);
                    let s = specialize::Specializer::new(ir.graph.clone(), target, pool, path, cap);
                    for sig in signatures(&ir.graph, &opts.shapes, &p)? {
                        s.compile_eagerly(sig)?;
                    }
                    Some(Box::new(s))
                } else {
                    if !opts.shapes.is_empty() {
                        return Err(Error::BadOption {
                            option: "shape",
                            reason: format!("{p} has no symbolic input dims to specialise"),
                        });
                    }
                    let prog = compile_cpu(ir.graph.clone(), &target, &pool, &p)?;
                    let _ = generic.cell.set(Ok(Box::new(prog)));
                    None
                };
                ir.graph.initializers.clear();
                Exec::Cpu(generic, spec)
            }
        };
        Ok(Model {
            ir,
            path: path.to_path_buf(),
            backend: opts.backend,
            exec,
            run_opts: RunOptions { timeout: opts.timeout },
        })
    }

    /// Runs the model recording each node's time (the nodes of the graph the backend runs:
    /// fused nodes name their sources in their `sources` attribute).
    pub fn run_profiled(&self, inputs: Vec<(String, Tensor)>) -> Result<Vec<aim_runtime::NodeTiming>, Error> {
        let map = self.input_map(inputs)?;
        let o = &self.run_opts;
        guard::contain(&format!("running {}", self.path.display()), || {
            Ok(match &self.exec {
                Exec::Reference => aim_runtime::run_graph_profiled(&self.ir.graph, map, o)?.1,
                Exec::Cpu(g, spec) => match spec.as_ref().and_then(|s| s.program_for(&map)) {
                    Some(special) => special.run_profiled(map, o)?.1,
                    None => g.get(spec.as_deref(), &self.path_text())?.run_profiled(map, o)?.1,
                },
            })
        })
    }

    /// Threads a run uses.
    pub fn threads(&self) -> usize {
        match &self.exec {
            Exec::Cpu(g, _) => g.threads,
            Exec::Reference => 1,
        }
    }

    /// How many control-flow nodes of the cpu program run compiled bodies (the others
    /// interpret theirs); 0 on the reference backend.
    pub fn compiled_bodies(&self) -> usize {
        match &self.exec {
            Exec::Cpu(g, spec) => g.get(spec.as_deref(), &self.path_text()).map_or(0, |p| p.bodies().len()),
            Exec::Reference => 0,
        }
    }

    /// How the cpu backend runs each node — of the program specialised most recently, else
    /// of the shape-generic one (compiled now if it was not yet): each node's name and kind,
    /// in order, with the program's graph. None on the reference backend or if nothing compiles.
    pub fn node_kinds(&self) -> Option<(aim_ir::Graph, Vec<(String, aim_runtime::cpu::NodeKind)>)> {
        let Exec::Cpu(g, spec) = &self.exec else { return None };
        let kinds = |p: &aim_runtime::cpu::CpuProgram| {
            let names = p.graph().nodes.iter().map(|n| n.name.clone());
            (p.graph().clone(), names.zip(p.node_kinds()).collect())
        };
        match spec.as_ref().and_then(|s| s.latest()) {
            Some(p) => Some(kinds(&p)),
            None => g.get(spec.as_deref(), &self.path_text()).ok().map(kinds),
        }
    }

    /// The optimised graph of the cpu backend's shape-generic program (compiled now if
    /// it was not yet); None on the reference backend or if it does not compile.
    pub fn optimized_graph(&self) -> Option<&aim_ir::Graph> {
        match &self.exec {
            Exec::Cpu(g, spec) => g.get(spec.as_deref(), &self.path_text()).ok().map(|p| p.graph()),
            Exec::Reference => None,
        }
    }

    fn path_text(&self) -> String {
        self.path.display().to_string()
    }

    /// The input-shape signatures this model has been specialised for so far (most recent
    /// first), each with its specialised graph (`None` where specialising failed and the
    /// generic program runs). Empty unless the model has symbolic input dims and computes
    /// shapes at run time.
    pub fn specializations(&self) -> Vec<(specialize::Signature, Option<aim_ir::Graph>)> {
        match &self.exec {
            Exec::Cpu(_, Some(s)) => s.compiled(),
            _ => Vec::new(),
        }
    }

    /// The imported IR (on the cpu backend, without its initializers: the compiled program
    /// holds the weights it needs, packed).
    pub fn ir(&self) -> &aim_ir::Model {
        &self.ir
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The backend it runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Graph inputs: names and declared types.
    pub fn inputs(&self) -> &[aim_ir::ValueInfo] {
        &self.ir.graph.inputs
    }

    /// Graph outputs: names and declared types.
    pub fn outputs(&self) -> &[aim_ir::ValueInfo] {
        &self.ir.graph.outputs
    }

    /// Runs the model. Inputs are keyed by graph input name; outputs come back in graph
    /// order with their names.
    pub fn run(&self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, Error> {
        let map = self.input_map(inputs)?;
        let o = &self.run_opts;
        let outs = guard::contain(&format!("running {}", self.path.display()), || {
            Ok(match &self.exec {
                Exec::Reference => aim_runtime::run_graph_with(&self.ir.graph, map, o)?,
                Exec::Cpu(g, spec) => match spec.as_ref().and_then(|s| s.program_for(&map)) {
                    Some(special) => special.run_with(map, o)?,
                    None => g.get(spec.as_deref(), &self.path_text())?.run_with(map, o)?,
                },
            })
        })?;
        Ok(self.ir.graph.outputs.iter().map(|o| o.name.clone()).zip(outs).collect())
    }

    /// Runs the model keeping every value its nodes make, in the order they were made: on
    /// the reference backend the values of the imported graph, on the cpu backend those of
    /// the optimised graph (fused nodes make the values they stand for under their last
    /// node's output name; values fused away do not appear). Returns the outputs and the
    /// values. `aim compare` is built on it.
    pub fn run_capture(&self, inputs: Vec<(String, Tensor)>) -> Result<Captured, Error> {
        let map = self.input_map(inputs)?;
        let o = &self.run_opts;
        let (outs, values) = guard::contain(&format!("running {}", self.path.display()), || {
            Ok(match &self.exec {
                Exec::Reference => aim_runtime::run_graph_capture(&self.ir.graph, map, o)?,
                Exec::Cpu(g, spec) => match spec.as_ref().and_then(|s| s.program_for(&map)) {
                    Some(special) => special.run_capture(map, o)?,
                    None => g.get(spec.as_deref(), &self.path_text())?.run_capture(map, o)?,
                },
            })
        })?;
        Ok(Captured { outputs: self.ir.graph.outputs.iter().map(|o| o.name.clone()).zip(outs).collect(), values })
    }

    /// The inputs by name, refusing names the graph does not have and names given twice.
    fn input_map(&self, inputs: Vec<(String, Tensor)>) -> Result<HashMap<String, Tensor>, Error> {
        let mut map = HashMap::new();
        for (name, t) in inputs {
            if !self.ir.graph.inputs.iter().any(|i| i.name == name) {
                let known: Vec<&str> = self.ir.graph.inputs.iter().map(|i| i.name.as_str()).collect();
                return Err(Error::UnknownInput { name, known: known.join(", ") });
            }
            if map.insert(name.clone(), t).is_some() {
                return Err(Error::BadOption { option: "inputs", reason: format!("input '{name}' is given twice") });
            }
        }
        Ok(map)
    }
}

/// What [`Model::run_capture`] gives: the outputs, and every value the nodes made.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Graph outputs, in order, with their names.
    pub outputs: Vec<(String, Tensor)>,
    /// Every value a node made, by name, in the order they were made.
    pub values: Vec<(String, Tensor)>,
}

/// Imports, verifies, type-checks and op-checks a model held in memory, discarding the
/// result: the entry point of the importer fuzz target and of its corpus replay test.
/// Returns whether the model was accepted.
pub fn check_model_bytes(data: &[u8]) -> bool {
    match aim_compiler::onnx::import_bytes(data, "input") {
        Ok(ir) => Model::from_ir(ir, Path::new("input"), Backend::Reference).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    /// A loaded model can be shared by serving threads.
    #[test]
    fn model_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::Model>();
    }
}
