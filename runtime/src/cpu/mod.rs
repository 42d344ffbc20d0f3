//! The CPU program: an optimised graph whose `aim` nodes run prepared kernels (weights
//! packed once, here) — blocked NCHWc convolutions, Winograd, depthwise and pooling, packed
//! GEMMs for dense layers and other convolutions, the elementwise loops and reductions the
//! compiler generated — on a persistent thread pool; other nodes run the fast f32 kernels
//! where they apply, else their reference kernels. Intermediates of the prepared kernels
//! live in one arena laid out by the compiler's memory plan (see `run`).

use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{DType, Graph, Node, Tensor};
use aim_kernels::ewprog::wide::Wide;
use aim_kernels::gemm::{Activation, Blocking, Isa, Parallel};
use std::collections::HashMap;

mod blocked;
mod bodies;
mod conv;
mod deconv;
mod dense;
mod depthwise;
mod elementwise;
mod entry;
mod int8;
mod kind;
mod phases;
mod plan;
mod prepacked;
mod qconv;
mod qdense;
mod run;
mod schedule;
mod shared;
mod softmax;
mod transpose;

pub use bodies::{Bodies, Body};
pub use conv::{nchw_conv_kernel, nchw_conv_kernel_of, static_output};
use conv::{prepare_conv, ConvPrep};
use dense::{prepare_dense, DensePrep};
use depthwise::DepthwisePrep;
pub use entry::{
    fingerprint, Addr, Entry, EntryBinding, EntryEnv, EntryFn, EntryOp, KernelFn, StepFn, ENV_KERNELS, ENV_RECS,
    ENV_RUN_STEP, KERNEL_ENTRIES,
};
pub use kind::NodeKind;
pub use plan::{entry_ops_for, KernelRef, Loc, Operand, Step};

/// A generated elementwise loop: `out[i] = f(inputs[0][i], ...)` for `start <= i < end`.
pub type ElementwiseFn = unsafe extern "C" fn(inputs: *const *const f32, out: *mut f32, start: usize, end: usize);

/// A generated row reduction: `out[r] = reduce(x[r·len .. (r+1)·len])` for
/// `row0 <= r < row1`.
pub type ReduceFn = unsafe extern "C" fn(x: *const f32, out: *mut f32, len: usize, row0: usize, row1: usize);

/// A generated transpose: output rows `row0 <= o < row1` of `y` from `x`, as `desc`
/// describes them (the outer output dims, their source strides, the row length and its
/// source stride; see the compiler's `codegen::lower_transpose`).
pub type TransposeFn = unsafe extern "C" fn(x: *const f32, y: *mut f32, desc: *const usize, row0: usize, row1: usize);

/// Machine code generated for a program's nodes, by node index, and what keeps it alive.
#[derive(Default)]
pub struct Generated {
    /// The loops of `aim:Elementwise` nodes.
    pub elementwise: HashMap<usize, ElementwiseFn>,
    /// The loops of `aim:Reduce` nodes.
    pub reduce: HashMap<usize, ReduceFn>,
    /// The copies of `aim:Transpose` nodes and of the blocked-layout reorders.
    pub transpose: HashMap<usize, TransposeFn>,
    /// The owner of the code (a JIT module): held as long as the program lives.
    pub owner: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

/// Per-node work prepared at load time.
enum Prepared {
    Conv(Box<ConvPrep>),
    Depthwise(Box<DepthwisePrep>),
    Dense(Box<DensePrep>),
    QDense(Box<qdense::QDensePrep>),
    QConv(Box<qconv::QConvPrep>),
    Deconv(Box<deconv::DeconvPrep>),
    Elementwise(elementwise::Loop),
    Blocked(Box<blocked::BlockedConv>),
    Reorder(blocked::Reorder),
    Pool(blocked::BlockedPool),
    Reduce(elementwise::Reduce),
    Transpose(transpose::Transpose),
    /// `aim:Softmax` with its scale.
    Softmax(f32),
    /// The byte ops of quantized regions (`aim:Conv8`, `aim:Quantize8`, ...).
    Int8(Box<int8::Int8Prep>),
}

impl Prepared {
    /// Bytes of the weights this kernel reads from a memory-mapped file (prepacked dense
    /// and blocked convolution weights of a `.aim` file), and its flag saying whether each
    /// run hands their pages back.
    fn mapped_weights(&self) -> Option<(usize, &std::sync::atomic::AtomicBool)> {
        match self {
            Prepared::Dense(d) => Some((d.weight.mapped_bytes(), &d.release)),
            Prepared::Blocked(c) => Some((blocked::mapped_bytes(c), &c.release)),
            _ => None,
        }
        .filter(|(bytes, _)| *bytes > 0)
    }

    /// After a run of the kernel: hands the pages of its mapped weights back if asked to.
    fn release_if_asked(&self) {
        let asked = |f: &std::sync::atomic::AtomicBool| f.load(std::sync::atomic::Ordering::Relaxed);
        match self {
            Prepared::Dense(d) if asked(&d.release) => d.weight.release_pages(),
            Prepared::Blocked(c) if asked(&c.release) => blocked::release_pages(c),
            _ => {}
        }
    }
}

/// Why a node could not be prepared.
fn prep_err(n: &Node, msg: impl Into<String>) -> RunError {
    RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg: msg.into() }
}

/// The activation fused into an `aim:Conv` / `aim:Dense` (`activation` and its parameters:
/// `clip_min` / `clip_max` for clip, `act_alpha` / `act_beta` for the others).
fn activation(n: &Node) -> Option<Activation> {
    activation_with(n, "")
}

/// A fused activation a kernel does not know (an edited `.aim` file, or a compiler bug) is
/// an error naming the node, never run as no activation (`none`, the identity's name, is
/// known).
fn check_activations(n: &Node) -> Result<(), RunError> {
    for prefix in ["", "res_"] {
        let key = format!("{prefix}activation");
        let name = n.string(&key, "none");
        if name != "none" && activation_with(n, prefix).is_none() {
            return Err(prep_err(n, format!("unknown fused activation {key}=\"{name}\"")));
        }
    }
    Ok(())
}

/// The activation whose attributes carry `prefix` (`res_activation`, `res_clip_min`, ...
/// for the one after a fused residual).
fn activation_with(n: &Node, prefix: &str) -> Option<Activation> {
    let key = |k: &str| format!("{prefix}{k}");
    let name = n.string(&key("activation"), "");
    let get = |k: &str| n.attrs.contains_key(&key(k)).then(|| n.float(&key(k), 0.0));
    let (a, b) = if name == "clip" { (get("clip_min"), get("clip_max")) } else { (get("act_alpha"), get("act_beta")) };
    Activation::parse(name, a, b)
}

/// The program that followed an `aim:Conv` / `aim:Dense` in the graph (its `post`
/// attribute, the one-input elementwise node the compiler fused after it), compiled for
/// `isa`; the kernels apply it after the activation, to each tile they have just written.
fn post_program(n: &Node, isa: Isa) -> Result<Option<std::sync::Arc<Wide>>, RunError> {
    let Some(attr) = n.attrs.get("post") else { return Ok(None) };
    let aim_ir::Attr::Strings(lines) = attr else {
        return Err(prep_err(n, "post must be a list of program lines"));
    };
    let prog = aim_kernels::ewprog::parse(lines).map_err(|e| prep_err(n, format!("post: {e}")))?;
    let w =
        Wide::anywhere(isa, &prog).ok_or_else(|| prep_err(n, "post: the program is empty or reads a later step"))?;
    if w.inputs() != 1 {
        return Err(prep_err(n, format!("post: the program reads {} inputs where it may read one", w.inputs())));
    }
    Ok(Some(std::sync::Arc::new(w)))
}

/// Applies `post` to every value of `y` in place, in parallel chunks: for the kernels
/// that do not apply it tile by tile as they write (NCHW convolutions).
fn apply_post(post: Option<&Wide>, y: &mut [f32], pool: &ThreadPool) {
    let Some(post) = post else { return };
    const CHUNK: usize = 16 * 1024;
    let (p, n) = (OutPtr(y.as_mut_ptr()), y.len());
    pool.for_each(n.div_ceil(CHUNK), &|i| {
        let p = p;
        let (start, end) = (i * CHUNK, ((i + 1) * CHUNK).min(n));
        // SAFETY: chunk i is in `y` and written by this task only.
        unsafe { post.apply(p.0.add(start), end - start) };
    });
}

fn const_f32<'a>(g: &'a Graph, name: Option<&str>) -> Option<&'a Tensor> {
    g.initializers.get(name?).filter(|t| t.dtype() == DType::F32)
}

/// Where a program keeps intermediate values during a run: the arena size and each
/// placed value's byte offset and size in it (the compiler's memory plan). Values not
/// named here are allocated by the kernels that make them.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Bytes of the arena.
    pub arena_bytes: usize,
    /// Offset and size in bytes, by value name.
    pub slots: HashMap<String, (usize, usize)>,
}

impl Placement {
    /// The placement an `.aim` image records.
    pub fn from_arena_plan(plan: &aim_ir::aim_file::ArenaPlan) -> Placement {
        Placement {
            arena_bytes: plan.arena_bytes,
            slots: plan.slots.iter().map(|(n, o, b)| (n.clone(), (*o, *b))).collect(),
        }
    }
}

/// A weight a program reads in place from a memory-mapped file
/// ([`CpuProgram::mapped_weights`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MappedWeight {
    /// The packed weights of the prepared kernel of this node.
    Node(usize),
    /// This constant of the typed steps, read by library kernels.
    Constant(usize),
}

/// A graph compiled for this CPU.
pub struct CpuProgram {
    graph: Graph,
    prepared: HashMap<usize, Prepared>,
    pool: std::sync::Arc<ThreadPool>,
    isa: Isa,
    blocking: Blocking,
    /// Values by index, each node's operands, and where values live.
    values: run::Values,
    /// Arenas of finished runs, reused by the next ones (one per concurrent run).
    arenas: std::sync::Mutex<Vec<run::Arena>>,
    /// Compiled bodies of control-flow nodes (the others are interpreted).
    bodies: Bodies,
    /// The packed weights of LSTMs, GRUs and RNNs whose weights are constants, by node index.
    recurrent: HashMap<usize, aim_kernels::fast::RecurrentWeights>,
    /// Per node: whether its fast kernel declined the node in some run (an attribute or
    /// shape it does not take), so the reference kernel ran; [`CpuProgram::node_kinds`]
    /// then says so.
    declined: Vec<std::sync::atomic::AtomicBool>,
    /// The typed steps, when every shape is static; else why not (`no_plan`).
    plan: Option<plan::Plan>,
    no_plan: Option<String>,
    /// The steps' records, which the entry function hands their kernel entries (with the
    /// plan: they point into it and into `prepared`, which do not change after `new`).
    records: Option<entry::Records>,
    /// The generated function that runs the steps, when there is one.
    entry: Option<entry::Entry>,
    /// Keeps generated code mapped.
    _code: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
    /// What a memory budget chose for this program, in words ([`CpuProgram::set_memory_note`]).
    memory_note: std::sync::OnceLock<String>,
}

impl CpuProgram {
    /// Prepares `graph` (already optimised by the compiler's passes): packs the weights of
    /// every `aim:Conv` and `aim:Dense` node for `isa` with `blocking`, takes the generated
    /// loops of `aim:Elementwise` nodes from `code`, runs on `pool` (which programs of one
    /// model share), and keeps the intermediates named in `placement` in its arena.
    pub fn new(
        graph: Graph,
        isa: Isa,
        blocking: Blocking,
        pool: std::sync::Arc<ThreadPool>,
        code: Generated,
        placement: &Placement,
    ) -> Result<CpuProgram, RunError> {
        // Packing is independent per node: it runs on the program's threads (for ResNet-50
        // the Winograd filter transforms and panel packing are most of the load time).
        let slots: Vec<std::sync::Mutex<Option<Result<Prepared, RunError>>>> =
            graph.nodes.iter().map(|_| std::sync::Mutex::new(None)).collect();
        let prepare = |i: usize| -> Option<Result<Prepared, RunError>> {
            let n = &graph.nodes[i];
            // Library kernels (`aim:Attention`, `aim:QMatMul`) run over their operands
            // where they are.
            if n.domain != "aim" {
                return None;
            }
            let Some(op) = aim_ir::schema::aim_op(&n.op) else {
                return Some(Err(prep_err(n, "unknown aim op")));
            };
            if op.kernel == aim_ir::schema::Kernel::Library {
                return None;
            }
            if let Err(e) = check_activations(n) {
                return Some(Err(e));
            }
            Some(match n.op.as_str() {
                "Conv" if n.attrs.contains_key("layout") => blocked::prepare(&graph, n, isa, blocking),
                "Conv" => prepare_conv(&graph, n, isa, blocking),
                "ToBlocked" | "FromBlocked" => blocked::prepare_reorder(n, isa),
                "MaxPool" | "AveragePool" | "GlobalAveragePool" if n.attrs.contains_key("layout") => {
                    blocked::prepare_pool(n, isa)
                }
                "Dense" => prepare_dense(&graph, n, isa, blocking),
                "QDense" => qdense::prepare(&graph, n, isa),
                "QConv" => qconv::prepare(&graph, n),
                "ConvTranspose" => deconv::prepare(&graph, n, isa, blocking),
                "Reduce" => elementwise::prepare_reduce(n, code.reduce.get(&i).copied()),
                "Transpose" => transpose::prepare(n, code.transpose.get(&i).copied()),
                "Softmax" => Ok(Prepared::Softmax(n.float("scale", 1.0))),
                _ if op.kernel == aim_ir::schema::Kernel::Bytes => int8::prepare(&graph, n, isa),
                "Elementwise" => code
                    .elementwise
                    .get(&i)
                    .map(|f| Prepared::Elementwise(elementwise::Loop::new(*f, n, isa)))
                    .ok_or_else(|| prep_err(n, "no code was generated for this node")),
                _ => Err(prep_err(n, "unknown aim op")),
            })
        };
        pool.for_each(graph.nodes.len(), &|i| {
            let r = prepare(i);
            *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = r;
        });
        let mut prepared = HashMap::new();
        for (i, slot) in slots.into_iter().enumerate() {
            if let Some(r) = slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
                prepared.insert(i, r?);
            }
        }
        // LSTMs, GRUs and RNNs with constant weights get them packed now, not on every run.
        let recurrent: HashMap<usize, aim_kernels::fast::RecurrentWeights> = graph
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.domain.is_empty() && matches!(n.op.as_str(), "LSTM" | "GRU" | "RNN"))
            .filter_map(|(i, n)| {
                let init = |k: usize| n.input(k).map(|v| graph.initializers.get(v));
                let (w, r) = (init(1)??, init(2)??);
                let b = match init(3) {
                    None => None,
                    Some(b) => Some(b?),
                };
                aim_kernels::fast::RecurrentWeights::pack(n, w, r, b, isa, blocking).map(|p| (i, p))
            })
            .collect();
        // Weights now live packed in the prepared nodes: their inputs are baked in, and the
        // unpacked copies nothing else reads (for ResNet-50, 100 MB) are dropped.
        let mut graph = graph;
        plan::bake_constants(&mut graph);
        if let Err(e) = aim_ir::limits::check_count(placement.arena_bytes, 1) {
            return Err(RunError::Node {
                node: graph.name.clone(),
                op: "memory plan".into(),
                msg: format!("the arena of intermediate values is too large: {e}"),
            });
        }
        let values = run::Values::new(&graph, placement);
        let declined = (0..graph.nodes.len()).map(|_| Default::default()).collect();
        let mut prog = CpuProgram {
            graph,
            prepared,
            pool,
            isa,
            blocking,
            values,
            arenas: Default::default(),
            bodies: Bodies::new(),
            recurrent,
            declined,
            plan: None,
            no_plan: None,
            records: None,
            entry: None,
            _code: code.owner,
            memory_note: Default::default(),
        };
        match plan::Plan::build(&prog.graph, &prog.values) {
            Ok(p) => {
                prog.records = Some(entry::Records::bind(&p, &prog.prepared));
                prog.plan = Some(p);
            }
            Err(why) => prog.no_plan = Some(why),
        }
        Ok(prog)
    }

    /// The weights this program reads in place from a memory-mapped file — prepacked
    /// dense and convolution weights of a `.aim` file, 4- and 8-bit codes, and the
    /// constants library kernels read (an embedding table) — each with its bytes and a bound
    /// on the bytes one run makes resident (less than all of them for a table a Gather reads
    /// a few rows of): what a memory budget can hand back between uses
    /// ([`CpuProgram::release_after_use`]).
    pub fn mapped_weights(&self) -> Vec<(MappedWeight, usize, usize)> {
        let mut w: Vec<(MappedWeight, usize, usize)> = self
            .prepared
            .iter()
            .filter_map(|(&i, p)| p.mapped_weights().map(|(b, _)| (MappedWeight::Node(i), b, b)))
            .collect();
        if let Some(plan) = &self.plan {
            w.extend(
                plan.mapped_library_consts(&self.graph).into_iter().map(|(k, b, t)| (MappedWeight::Constant(k), b, t)),
            );
        }
        w.sort();
        w
    }

    /// Bytes of the graph's inputs and outputs where their shapes are known: what a run's
    /// caller holds and a run returns, beside the arena.
    pub fn io_bytes(&self) -> usize {
        let g = &self.graph;
        g.inputs
            .iter()
            .chain(&g.outputs)
            .filter_map(|v| Some(v.ty.concrete_shape()?.iter().product::<usize>() * v.ty.dtype?.size()))
            .sum()
    }

    /// Makes every run hand the pages of weight `w` back to the kernel once the step that
    /// reads it has run, so that they count in the process's memory only while it runs;
    /// the next run reads them again from the file (the page cache). False where `w` is
    /// not one of [`CpuProgram::mapped_weights`].
    pub fn release_after_use(&self, w: MappedWeight) -> bool {
        match w {
            MappedWeight::Node(i) => match self.prepared.get(&i).and_then(Prepared::mapped_weights) {
                Some((_, flag)) => {
                    flag.store(true, std::sync::atomic::Ordering::Relaxed);
                    true
                }
                None => false,
            },
            MappedWeight::Constant(k) => self.plan.as_ref().is_some_and(|p| p.release_constant(k)),
        }
    }

    /// Records what a memory budget chose for this program (once), for
    /// [`CpuProgram::memory_note`].
    pub fn set_memory_note(&self, note: String) {
        let _ = self.memory_note.set(note);
    }

    /// What a memory budget chose for this program, in words, if one was given.
    pub fn memory_note(&self) -> Option<&str> {
        self.memory_note.get().map(String::as_str)
    }

    /// The weights this program's kernels hold packed, by node index: the kind of kernel
    /// (`direct`, `winograd`, `dense`) and the packed floats, which a graph given back to
    /// [`CpuProgram::new`] with them as the node's weight (and the attributes `prepacked` =
    /// kind and `weight_shape` = the weight's dims; see `prepacked.rs`) reads in place
    /// instead of packing again. Only valid for the same ISA and blocking. Dense layers with
    /// 4-bit weights are left out: their weight input is their packing.
    pub fn prepacked(&self) -> Vec<(usize, &'static str, Tensor)> {
        let mut out: Vec<(usize, &'static str, Tensor)> = self
            .prepared
            .iter()
            .filter_map(|(&i, p)| match p {
                Prepared::Blocked(c) => blocked::packed(c).map(|(kind, v)| (i, kind, v)),
                // Coded weights are already stored in the kernel's layout (and would grow
                // four- or eightfold as floats).
                Prepared::Dense(d) if d.weight.is_coded() => None,
                Prepared::Dense(d) => Some((i, "dense", d.weight.packed().to_vec())),
                _ => None,
            })
            .map(|(i, kind, v)| {
                let n = v.len();
                (i, kind, Tensor::from_vec(&[n], v))
            })
            .collect();
        out.sort_by_key(|(i, _, _)| *i);
        out
    }

    /// The depth blocking (`kc`) node `i`'s dense weights were packed with, which their
    /// packed layout depends on: recorded with them (`packed_kc`), so that a program that
    /// derives another blocking from other cache sizes still reads them right.
    pub fn packed_kc(&self, i: usize) -> Option<usize> {
        match self.prepared.get(&i) {
            Some(Prepared::Dense(d)) => Some(d.weight.kc()),
            _ => None,
        }
    }

    /// The optimised graph this program runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The program with compiled bodies for its control-flow nodes (by node index; nodes
    /// without one interpret their subgraphs).
    pub fn with_bodies(mut self, bodies: Bodies) -> CpuProgram {
        self.bodies = bodies;
        self
    }

    /// The compiled bodies.
    pub fn bodies(&self) -> &Bodies {
        &self.bodies
    }

    /// The microkernel family in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The cache blocking in use.
    pub fn blocking(&self) -> Blocking {
        self.blocking
    }

    /// Threads the program runs on.
    pub fn threads(&self) -> usize {
        self.pool.size()
    }
}

/// A prepared kernel's f32 input: its elements and shape.
#[derive(Clone, Copy)]
struct In<'a> {
    data: &'a [f32],
    shape: &'a [usize],
}

/// The residual of a fused convolution or dense layer.
#[derive(Clone, Copy)]
enum Residual<'a> {
    None,
    /// A tensor of the output's shape.
    Separate(In<'a>),
    /// The output's arena slot already holds it (the output overwrites it in place).
    InOutput,
}

impl<'a> Residual<'a> {
    /// The residual for kernels that take it apart only.
    fn separate(self) -> Result<Option<In<'a>>, String> {
        match self {
            Residual::Separate(r) => Ok(Some(r)),
            Residual::None => Ok(None),
            Residual::InOutput => Err("this kernel takes its residual as a separate tensor".into()),
        }
    }

    /// The separate residual, checked against the output `shape`, or whether the output
    /// (which must then be its slot) holds it.
    fn check(self, shape: &[usize], y: &Out) -> Result<(Option<&'a [f32]>, bool), String> {
        match self {
            Residual::None => Ok((None, false)),
            Residual::Separate(r) => Ok((check_residual(Some(r), shape)?, false)),
            Residual::InOutput if y.fits(shape) => Ok((None, true)),
            Residual::InOutput => Err(format!("the residual's slot does not hold the output {shape:?}")),
        }
    }
}

/// Where a prepared kernel writes its output: the value's arena slot when the output fits
/// it, else a new tensor. Slots are not cleared between runs: kernels write every element.
struct Out<'a> {
    slot: Option<&'a mut [f32]>,
    shape: Vec<usize>,
    made: Option<Tensor>,
}

impl<'a> Out<'a> {
    /// Whether an output of `shape` goes into the slot (exactly its size).
    fn fits(&self, shape: &[usize]) -> bool {
        self.slot.as_ref().is_some_and(|s| s.len() == shape.iter().product::<usize>())
    }

    /// The output a kernel has written (`take`n for `self.shape`).
    fn written(&mut self) -> &mut [f32] {
        let n = self.shape.iter().product::<usize>();
        match (&mut self.made, &mut self.slot) {
            (Some(t), _) => t.data_mut::<f32>(),
            (None, Some(s)) => &mut s[..n],
            (None, None) => &mut [],
        }
    }

    /// Room for an output of `shape` (an error when a new tensor that large may not be
    /// allocated: `aim_ir::limits`).
    fn take(&mut self, shape: &[usize]) -> Result<&mut [f32], String> {
        let n = aim_ir::limits::elements(shape).map_err(|e| format!("output: {e}"))?;
        self.shape = shape.to_vec();
        if self.slot.as_ref().is_some_and(|s| s.len() >= n) {
            return Ok(&mut self.slot.as_mut().expect("checked above")[..n]);
        }
        self.slot = None;
        let t = Tensor::try_zeros(DType::F32, shape).map_err(|e| format!("output: {e}"))?;
        Ok(self.made.insert(t).data_mut::<f32>())
    }
}

fn check_residual<'a>(r: Option<In<'a>>, shape: &[usize]) -> Result<Option<&'a [f32]>, String> {
    match r {
        None => Ok(None),
        Some(t) if t.shape == shape => Ok(Some(t.data)),
        Some(t) => Err(format!("residual {:?} does not match the output {shape:?}", t.shape)),
    }
}

/// Shares an output buffer between tasks that write disjoint parts of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every user hands each task a disjoint part of the buffer.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
