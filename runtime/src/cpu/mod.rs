//! The CPU program: an optimised graph whose `aim` nodes run prepared kernels (weights
//! packed once, here) — blocked NCHWc convolutions, Winograd, depthwise and pooling, packed
//! GEMMs for dense layers and other convolutions, the elementwise loops and reductions the
//! compiler generated — on a persistent thread pool; other nodes run the fast f32 kernels
//! where they apply, else their reference kernels.

use crate::exec::{run_node, run_with, RunError, Runner, Scope};
use crate::pool::ThreadPool;
use aim_ir::{DType, Graph, Node, Tensor};
use aim_kernels::gemm::{Activation, Blocking, Isa, Parallel};
use std::collections::HashMap;

mod blocked;
mod conv;
mod dense;
mod depthwise;
mod elementwise;
mod phases;
mod schedule;

use conv::{prepare_conv, run_conv, ConvPrep};
use dense::{prepare_dense, run_dense, DensePrep};
use depthwise::{run_depthwise, DepthwisePrep};
use elementwise::run_elementwise;

/// A generated elementwise loop: `out[i] = f(inputs[0][i], ...)` for `start <= i < end`.
pub type ElementwiseFn = unsafe extern "C" fn(inputs: *const *const f32, out: *mut f32, start: usize, end: usize);

/// A generated row reduction: `out[r] = reduce(x[r·len .. (r+1)·len])` for
/// `row0 <= r < row1`.
pub type ReduceFn = unsafe extern "C" fn(x: *const f32, out: *mut f32, len: usize, row0: usize, row1: usize);

/// Machine code generated for a program's nodes, by node index, and what keeps it alive.
#[derive(Default)]
pub struct Generated {
    /// The loops of `aim:Elementwise` nodes.
    pub elementwise: HashMap<usize, ElementwiseFn>,
    /// The loops of `aim:Reduce` nodes.
    pub reduce: HashMap<usize, ReduceFn>,
    /// The owner of the code (a JIT module): held as long as the program lives.
    pub owner: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

/// Per-node work prepared at load time.
enum Prepared {
    Conv(Box<ConvPrep>),
    Depthwise(Box<DepthwisePrep>),
    Dense(Box<DensePrep>),
    Elementwise(ElementwiseFn),
    Blocked(Box<blocked::BlockedConv>),
    Reorder(blocked::Reorder),
    Pool(blocked::BlockedPool),
    Reduce(elementwise::Reduce),
}

/// Why a node could not be prepared.
fn prep_err(n: &Node, msg: impl Into<String>) -> RunError {
    RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg: msg.into() }
}

fn activation(n: &Node) -> Option<Activation> {
    match n.string("activation", "") {
        "relu" => Some(Activation::Relu),
        "clip" => Some(Activation::Clip(n.float("clip_min", f32::NEG_INFINITY), n.float("clip_max", f32::INFINITY))),
        _ => None,
    }
}

fn const_f32<'a>(g: &'a Graph, name: Option<&str>) -> Option<&'a Tensor> {
    g.initializers.get(name?).filter(|t| t.dtype() == DType::F32)
}

/// A graph compiled for this CPU.
pub struct CpuProgram {
    graph: Graph,
    prepared: HashMap<usize, Prepared>,
    pool: ThreadPool,
    isa: Isa,
    blocking: Blocking,
    /// Keeps generated code mapped.
    _code: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl CpuProgram {
    /// Prepares `graph` (already optimised by the compiler's passes): packs the weights of
    /// every `aim:Conv` and `aim:Dense` node for `isa` with `blocking`, takes the generated
    /// loops of `aim:Elementwise` nodes from `code`, and starts `threads` threads.
    pub fn new(graph: Graph, isa: Isa, blocking: Blocking, threads: usize, code: Generated) -> Result<CpuProgram, RunError> {
        // Packing is independent per node: it runs on the program's threads (for ResNet-50
        // the Winograd filter transforms and panel packing are most of the load time).
        let pool = ThreadPool::new(threads);
        let slots: Vec<std::sync::Mutex<Option<Result<Prepared, RunError>>>> = graph.nodes.iter().map(|_| std::sync::Mutex::new(None)).collect();
        let prepare = |i: usize| -> Option<Result<Prepared, RunError>> {
            let n = &graph.nodes[i];
            if n.domain != "aim" {
                return None;
            }
            Some(match n.op.as_str() {
                "Conv" if n.attrs.contains_key("layout") => blocked::prepare(&graph, n, isa, blocking),
                "Conv" => prepare_conv(&graph, n, isa, blocking),
                "ToBlocked" | "FromBlocked" => blocked::prepare_reorder(n, isa),
                "MaxPool" | "AveragePool" | "GlobalAveragePool" if n.attrs.contains_key("layout") => blocked::prepare_pool(n, isa),
                "Dense" => prepare_dense(&graph, n, isa, blocking),
                "Reduce" => elementwise::prepare_reduce(n, code.reduce.get(&i).copied()),
                "Elementwise" => code.elementwise.get(&i).map(|f| Prepared::Elementwise(*f)).ok_or_else(|| prep_err(n, "no code was generated for this node")),
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
        // Weights now live packed in the prepared nodes: their inputs are baked in, and the
        // unpacked copies nothing else reads (for ResNet-50, 100 MB) are dropped.
        let mut graph = graph;
        for (i, n) in graph.nodes.iter_mut().enumerate() {
            if prepared.contains_key(&i) && !matches!(n.op.as_str(), "Elementwise" | "Reduce") {
                for k in 1..3.min(n.inputs.len()) {
                    n.inputs[k].clear();
                }
            }
        }
        let mut read = Vec::new();
        graph.names_read(&mut read);
        let read: std::collections::HashSet<String> = read.into_iter().collect();
        graph.initializers.retain(|k, _| read.contains(k));
        Ok(CpuProgram { graph, prepared, pool, isa, blocking, _code: code.owner })
    }

    /// The optimised graph this program runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
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

    /// Runs the program.
    pub fn run(&self, inputs: HashMap<String, Tensor>) -> Result<Vec<Tensor>, RunError> {
        run_with(&self.graph, inputs, None, self, None)
    }

    /// Runs the program, recording every node's time.
    pub fn run_profiled(&self, inputs: HashMap<String, Tensor>) -> Result<(Vec<Tensor>, Vec<crate::NodeTiming>), RunError> {
        let mut p = Vec::new();
        let outs = run_with(&self.graph, inputs, None, self, Some(&mut p))?;
        Ok((outs, p))
    }
}

impl Runner for CpuProgram {
    fn run(&self, index: usize, n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError> {
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("aim:{}", n.op), msg };
        match self.prepared.get(&index) {
            None => {
                if n.domain.is_empty() {
                    if let Some(k) = aim_kernels::fast::kernel(&n.op) {
                        let cx = aim_kernels::fast::Ctx { par: &self.pool, isa: self.isa, blocking: self.blocking };
                        let node_err = |msg: String| RunError::Node { node: n.name.clone(), op: n.op.clone(), msg };
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| k(n, ins, &cx))) {
                            Ok(Some(r)) => return r.map_err(|e| node_err(e.0)),
                            Ok(None) => {}
                            Err(e) => return Err(node_err(format!("internal error: {}", crate::exec::panic_message(&*e)))),
                        }
                    }
                }
                run_node(n, ins, scope)
            }
            Some(p) => {
                // A bug in a fast path must surface as an error naming the node, not a crash.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_prepared(p, n, ins))) {
                    Ok(r) => r,
                    Err(e) => Err(fail(format!("internal error: {}", crate::exec::panic_message(&*e)))),
                }
            }
        }
    }
}

impl CpuProgram {
    fn run_prepared(&self, p: &Prepared, n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>, RunError> {
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("aim:{}", n.op), msg };
        match p {
            Prepared::Elementwise(f) => Ok(vec![run_elementwise(*f, ins, &self.pool).map_err(fail)?]),
            p => {
                let x = ins.first().and_then(|t| t.as_ref()).ok_or_else(|| fail("input 0 is missing".into()))?;
                if x.dtype() != DType::F32 {
                    return Err(fail(format!("expected f32 input, got {}", x.dtype())));
                }
                let residual = ins.get(3).and_then(|t| t.as_ref());
                let y = match p {
                    Prepared::Conv(c) => run_conv(c, x, residual, &self.pool),
                    Prepared::Depthwise(d) => run_depthwise(d, x, residual, &self.pool),
                    Prepared::Dense(d) => run_dense(d, x, residual, self.blocking, &self.pool),
                    Prepared::Blocked(c) => blocked::run(c, x, residual, &self.pool),
                    Prepared::Reorder(r) => blocked::run_reorder(r, x, &self.pool),
                    Prepared::Pool(p) => blocked::run_pool(p, self.isa, x, &self.pool),
                    Prepared::Reduce(r) => elementwise::run_reduce(r, x, &self.pool),
                    Prepared::Elementwise(_) => unreachable!("handled above"),
                };
                Ok(vec![y.map_err(fail)?])
            }
        }
    }
}

fn check_residual<'a>(r: Option<&'a Tensor>, shape: &[usize]) -> Result<Option<&'a [f32]>, String> {
    match r {
        None => Ok(None),
        Some(t) if t.dtype() == DType::F32 && t.shape() == shape => Ok(Some(t.data::<f32>())),
        Some(t) => Err(format!("residual {}{:?} does not match the output {shape:?}", t.dtype(), t.shape())),
    }
}

/// Shares an output buffer between tasks that write disjoint parts of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every user hands each task a disjoint part of the buffer.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
