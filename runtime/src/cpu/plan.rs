//! The typed steps of a program whose every value has a shape known at load time: which
//! kernel runs each node (a [`KernelRef`], decided once, here) and where each of its
//! operands lives during a run (a [`Loc`]: an arena offset, a caller's input, an output
//! allocated for the run, a constant). Running them needs no value table, no name or node
//! lookups and no per-node decisions: the steps run in order, either from the entry
//! function the compiler generates for them (`entry.rs`: calling the short generated
//! loops in place, every other kernel through its kind's entry with the step's record and
//! operand addresses, library kernels through the step runner) or, where no code was
//! generated, from [`CpuProgram::run_steps`]'s loop. Programs with shapes only known at run
//! time, or with control flow, keep the node-by-node executor (`run.rs`).

use super::entry::{Entry, EntryOp};
use super::run::{is_view_op, Arena, Base, Values};
use super::Placement;
use super::{elementwise, CpuProgram, ElementwiseFn, In, Out, Prepared, Residual};
use crate::exec::{check_input, panic_message, Deadline, RunError, Scope};
use aim_ir::{DType, Graph, Node, Tensor};
use std::collections::HashMap;

/// Where an operand of a step is during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// At this byte offset of the run's arena.
    Arena(usize),
    /// In the caller's input `k`.
    Input(usize),
    /// In output `k`, allocated for the run.
    Output(usize),
    /// In constant `k` of the plan.
    Const(usize),
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loc::Arena(off) => write!(f, "arena+{off}"),
            Loc::Input(k) => write!(f, "input {k}"),
            Loc::Output(k) => write!(f, "output {k}"),
            Loc::Const(k) => write!(f, "constant {k}"),
        }
    }
}

/// One operand of a step: where it is, and its static type.
#[derive(Clone, Debug)]
pub struct Operand {
    /// Where its bytes are.
    pub loc: Loc,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its element type.
    pub dtype: DType,
}

impl Operand {
    pub(super) fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    fn bytes(&self) -> usize {
        self.elements() * self.dtype.size()
    }
}

/// Which code runs a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelRef {
    /// A generated elementwise loop (`aim:Elementwise`).
    Loop,
    /// A kernel prepared at load: packed GEMMs, blocked, Winograd and depthwise
    /// convolutions, pooling, layout reorders, generated reductions and transposes, the
    /// fused softmax.
    Prepared,
    /// A byte op of a quantized region.
    Int8,
    /// A fast kernel of the library where it applies to the operands, else the reference
    /// kernel of the node's op and attributes.
    Library,
}

impl KernelRef {
    /// The kind as the entry function's comments and `aim explore` name it.
    pub fn label(self) -> &'static str {
        match self {
            KernelRef::Loop => "generated loop",
            KernelRef::Prepared => "prepared kernel",
            KernelRef::Int8 => "byte kernel",
            KernelRef::Library => "library kernel",
        }
    }
}

/// One step: the node it runs (by index in [`CpuProgram::graph`]), its kernel and operands.
#[derive(Clone, Debug)]
pub struct Step {
    /// The node.
    pub node: usize,
    /// The code that runs it.
    pub kernel: KernelRef,
    /// Its inputs in node order (`None`: omitted, or baked into the prepared kernel).
    pub ins: Vec<Option<Operand>>,
    /// Its outputs in node order (`None`: omitted).
    pub outs: Vec<Option<Operand>>,
}

/// The steps of a static program and what a run of them needs.
pub struct Plan {
    /// The steps, in order. Views of arena values (Reshape and the like) have none: their
    /// output is their input's bytes.
    pub steps: Vec<Step>,
    /// Bytes of arena a run needs: the memory plan's, and after it room for the values the
    /// plan left to their kernels.
    pub arena_bytes: usize,
    /// The constants steps read (by [`Loc::Const`] index), and their addresses: for the f32
    /// constants loops and prepared kernels read, aligned for f32 (a constant whose bytes in
    /// a memory map are not is viewed through its aligned copy); else the bytes as they are.
    consts: Vec<Tensor>,
    const_addrs: Vec<usize>,
    /// Per constant: whether library steps hand its pages back after reading it (a memory
    /// budget's choice for a constant read in place from a mapped file).
    release_consts: Vec<std::sync::atomic::AtomicBool>,
    /// The graph's outputs: their types.
    pub(super) outputs: Vec<(DType, Vec<usize>)>,
}

impl Plan {
    /// The constants library steps read that lie in a memory-mapped file: each one's index,
    /// bytes, and a bound on the bytes one run makes resident ([`Plan::touched_bound`]) —
    /// what a memory budget can have handed back after each such step
    /// ([`Plan::release_constant`]).
    pub(super) fn mapped_library_consts(&self, g: &Graph) -> Vec<(usize, usize, usize)> {
        let mut touched: Vec<Option<usize>> = vec![None; self.consts.len()];
        for s in self.steps.iter().filter(|s| s.kernel == KernelRef::Library) {
            for (i, o) in s.ins.iter().enumerate() {
                let Some(Operand { loc: Loc::Const(k), .. }) = o else { continue };
                let bound = self.touched_bound(g, s, i, *k);
                touched[*k] = Some(touched[*k].map_or(bound, |t| t.max(bound)));
            }
        }
        (0..self.consts.len())
            .filter_map(|k| touched[k].map(|t| (k, t)))
            .filter(|&(k, _)| aim_ir::mapped::in_map(self.consts[k].bytes()))
            .map(|(k, t)| (k, self.consts[k].bytes().len(), t))
            .collect()
    }

    /// The most bytes of constant `k` that step `s` (reading it as input `i`) makes
    /// resident: all of them, but for the table of a Gather along its first axis, whose
    /// rows read are as many as the indices. The page cache maps file pages in folios of up
    /// to 2 MiB, so each row read counts as that much (or the whole table, if less).
    fn touched_bound(&self, g: &Graph, s: &Step, i: usize, k: usize) -> usize {
        const FOLIO: usize = 2 << 20;
        let bytes = self.consts[k].bytes().len();
        let n = &g.nodes[s.node];
        let rows = match (n.domain.as_str(), n.op.as_str(), i, s.ins.get(1)) {
            ("", "Gather", 0, Some(Some(idx))) if n.int("axis", 0) == 0 => idx.elements(),
            _ => return bytes,
        };
        let row = self.consts[k].shape().iter().skip(1).product::<usize>() * self.consts[k].dtype().size();
        bytes.min(rows.saturating_mul(row.div_ceil(FOLIO).max(1) * FOLIO + FOLIO))
    }

    /// Makes library steps hand the pages of constant `k` back after reading it.
    pub(super) fn release_constant(&self, k: usize) -> bool {
        match self.release_consts.get(k) {
            Some(flag) => {
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// The Reshape-like nodes whose result is a graph output and whose input another step
/// makes (not an input, a constant or another output): the input is then made in the
/// output's buffer (`loc` set to it, through chains of such views), and the node runs no
/// step. Without this the node copied its whole input into the output on every run (a
/// 2.9 MiB softmax reshaped into a recogniser's output took 1.3% of its time).
fn output_views(g: &Graph, v: &Values, loc: &mut [Option<Loc>]) -> Vec<usize> {
    let mut producer = HashMap::new();
    for (i, outs) in v.outs.iter().enumerate() {
        for &o in outs.iter().flatten() {
            producer.insert(o, i);
        }
    }
    let bytes = |x: usize| {
        let t = g.value_type(&v.names[x])?;
        Some(t.dtype?.size() * t.concrete_shape()?.iter().product::<usize>())
    };
    let mut views = Vec::new();
    for (k, &out) in v.outputs.iter().enumerate() {
        // (view node, its input) from the output back.
        let mut chain: Vec<(usize, usize)> = Vec::new();
        let mut o = out;
        while let Some(&i) = producer.get(&o) {
            match v.ins[i].first().copied().flatten() {
                Some(x)
                    if is_view_op(&g.nodes[i])
                        && loc[x].is_none()
                        && producer.contains_key(&x)
                        && !chain.iter().any(|c| c.1 == x)
                        && bytes(x).is_some_and(|b| Some(b) == bytes(o)) =>
                {
                    chain.push((i, x));
                    o = x;
                }
                _ => break,
            }
        }
        // The first value of the chain must be written by a step, not be a view itself.
        while let Some(&(_, x)) = chain.last() {
            if producer.get(&x).is_some_and(|&p| v.views.contains_key(&p) || is_view_op(&g.nodes[p])) {
                chain.pop();
            } else {
                break;
            }
        }
        for (i, x) in chain {
            loc[x] = Some(Loc::Output(k));
            views.push(i);
        }
    }
    views
}

/// Loops over fewer elements than this run inline in the entry function (one parallel
/// task's worth); longer ones go through the step runner, which splits them over the pool.
pub(super) const INLINE_LOOP: usize = elementwise::CHUNK;

impl Plan {
    /// Steps for `prog`, or why it has none: a value whose shape is only known at run time,
    /// control flow, an operand of the wrong type for its kernel.
    pub(super) fn build(g: &Graph, v: &Values) -> Result<Plan, String> {
        let mut loc: Vec<Option<Loc>> = vec![None; v.names.len()];
        let mut types: Vec<Option<(DType, Vec<usize>)>> = vec![None; v.names.len()];
        let static_type = |x: usize| -> Result<(DType, Vec<usize>), String> {
            let name = &v.names[x];
            let t = g.value_type(name).ok_or_else(|| format!("value '{name}' has no type"))?;
            match (t.dtype, t.concrete_shape()) {
                (Some(d), Some(s)) => Ok((d, s)),
                _ => Err(format!("value '{name}' has no static type ({t})")),
            }
        };
        for (k, &x) in v.inputs.iter().enumerate() {
            loc[x] = Some(Loc::Input(k));
            types[x] = Some(static_type(x)?);
        }
        let mut consts = Vec::new();
        for (x, t) in &v.consts {
            if loc[*x].is_none() {
                loc[*x] = Some(Loc::Const(consts.len()));
                types[*x] = Some((t.dtype(), t.shape().to_vec()));
                consts.push(t.clone());
            }
        }
        let mut outputs = Vec::new();
        for (k, &x) in v.outputs.iter().enumerate() {
            if loc[x].is_some() {
                return Err(format!("output '{}' is an input or a constant", v.names[x]));
            }
            loc[x] = Some(Loc::Output(k));
            let t = static_type(x)?;
            outputs.push(t.clone());
            types[x] = Some(t);
        }
        let output_views = output_views(g, v, &mut loc);
        let mut arena_bytes = v.arena_bytes.next_multiple_of(64);
        let mut steps = Vec::new();
        for (i, n) in g.nodes.iter().enumerate() {
            if n.attrs.values().any(|a| matches!(a, aim_ir::Attr::Graph(_))) {
                return Err(format!("node '{}' has subgraphs", n.name));
            }
            let view = v.views.contains_key(&i) || output_views.contains(&i);
            for &o in v.outs[i].iter().flatten() {
                if loc[o].is_some() && !matches!(loc[o], Some(Loc::Output(_))) {
                    return Err(format!("value '{}' is made twice", v.names[o]));
                }
                let t = static_type(o)?;
                if loc[o].is_none() {
                    loc[o] = Some(match (view, v.ins[i].first().copied().flatten(), v.slot[o]) {
                        (true, Some(x), _) => loc[x].ok_or_else(|| format!("value '{}' is read unmade", v.names[x]))?,
                        (false, _, Some((off, bytes))) if bytes >= t.0.size() * t.1.iter().product::<usize>() => {
                            Loc::Arena(off)
                        }
                        _ => {
                            let bytes = aim_ir::limits::bytes_of(t.0, &t.1).map_err(|e| e.to_string())?;
                            let off = arena_bytes;
                            arena_bytes = off
                                .checked_add(bytes.next_multiple_of(64))
                                .ok_or_else(|| "the arena is too large".to_string())?;
                            Loc::Arena(off)
                        }
                    });
                }
                types[o] = Some(t);
            }
            if view {
                continue;
            }
            let operand = |x: &Option<usize>| -> Result<Option<Operand>, String> {
                let Some(x) = *x else { return Ok(None) };
                let l = loc[x].ok_or_else(|| format!("value '{}' is read before it is made", v.names[x]))?;
                let (dtype, shape) = types[x].clone().ok_or_else(|| format!("value '{}' has no type", v.names[x]))?;
                Ok(Some(Operand { loc: l, shape, dtype }))
            };
            let ins = v.ins[i].iter().map(operand).collect::<Result<Vec<_>, _>>()?;
            let outs = v.outs[i].iter().map(operand).collect::<Result<Vec<_>, _>>()?;
            let kernel = kernel_of(n);
            let f32_at = |k: usize| ins.get(k).and_then(|o| o.as_ref()).is_none_or(|o| o.dtype == DType::F32);
            let first = outs.first().and_then(|o| o.as_ref());
            match kernel {
                KernelRef::Loop => {
                    let y = first.ok_or_else(|| format!("node '{}' has no output", n.name))?;
                    let f32s = ins.iter().all(|o| o.as_ref().is_some_and(|o| o.dtype == DType::F32));
                    if !f32s || y.dtype != DType::F32 || ins.is_empty() {
                        return Err(format!("node '{}': a loop's operands must all be f32", n.name));
                    }
                    let shapes: Vec<&[usize]> = ins.iter().flatten().map(|o| o.shape.as_slice()).collect();
                    elementwise::Rows::new(&shapes, &y.shape).map_err(|e| format!("node '{}': {e}", n.name))?;
                }
                KernelRef::Prepared => {
                    if ins.first().is_none_or(|x| x.is_none()) || !(0..4).all(f32_at) || first.is_none() {
                        return Err(format!("node '{}': its kernel takes f32 operands", n.name));
                    }
                }
                KernelRef::Int8 | KernelRef::Library => {}
            }
            steps.push(Step { node: i, kernel, ins, outs });
        }
        for (k, &x) in v.outputs.iter().enumerate() {
            if types[x].is_none() || !steps.iter().any(|s| s.outs.iter().flatten().any(|o| o.loc == Loc::Output(k))) {
                return Err(format!("output '{}' is made by no step", v.names[x]));
            }
        }
        // Loops and prepared kernels read their f32 constants as slices, through aligned
        // addresses; the other constants are read as bytes or handed over as tensors, so a
        // memory-mapped one (an embedding table, say) is not copied to align it.
        let mut as_floats = vec![false; consts.len()];
        for s in steps.iter().filter(|s| matches!(s.kernel, KernelRef::Loop | KernelRef::Prepared)) {
            for o in s.ins.iter().flatten() {
                if let (Loc::Const(k), DType::F32) = (o.loc, o.dtype) {
                    as_floats[k] = true;
                }
            }
        }
        let const_addrs = consts
            .iter()
            .zip(as_floats)
            .map(|(t, floats)| match floats {
                true => t.data::<f32>().as_ptr() as usize,
                false => t.bytes().as_ptr() as usize,
            })
            .collect();
        let release_consts = consts.iter().map(|_| Default::default()).collect();
        Ok(Plan { steps, arena_bytes, consts, const_addrs, release_consts, outputs })
    }
}

/// The code that runs node `n` of a prepared program: what the op table
/// (`aim_ir::schema::aim_op`) says for `aim` nodes (every one but the library kernels has
/// a prepared kernel: a program whose `aim` node cannot be prepared does not load), a
/// library kernel for the rest.
fn kernel_of(n: &Node) -> KernelRef {
    use aim_ir::schema::Kernel;
    match (n.domain.as_str(), aim_ir::schema::aim_op(&n.op).map(|o| o.kernel)) {
        ("aim", Some(Kernel::Loop)) => KernelRef::Loop,
        ("aim", Some(Kernel::Bytes)) => KernelRef::Int8,
        ("aim", Some(Kernel::Prepared)) => KernelRef::Prepared,
        _ => KernelRef::Library,
    }
}

/// Drops from `graph` the operands its prepared kernels hold baked in — the weights, biases
/// and quantization parameters of `aim` nodes whose operands are not all computed — and
/// the initializers nothing reads any more.
pub(super) fn bake_constants(graph: &mut Graph) {
    for n in graph.nodes.iter_mut().filter(|n| n.domain == "aim") {
        // The operands the op table says its prepared kernel holds: a quantized layer's
        // inputs after the first, a byte convolution's up to its residual, the weights
        // only of `aim:ConvInteger` (its zero point is computed).
        let baked = aim_ir::schema::aim_op(&n.op).map_or(0, |o| o.baked).min(n.inputs.len());
        for k in 1..baked {
            n.inputs[k].clear();
        }
    }
    let mut read = Vec::new();
    graph.names_read(&mut read);
    let read: std::collections::HashSet<String> = read.into_iter().collect();
    graph.initializers.retain(|k, _| read.contains(k));
}

/// What the entry function of `graph` (an optimised graph, as a `.aim` image holds it) with
/// the arena `placement` does, computed as loading it will: what an ahead-of-time compiler
/// generates the entry function from. Fails where the program will run node by node.
pub fn entry_ops_for(graph: &Graph, placement: &Placement) -> Result<Vec<EntryOp>, String> {
    let mut g = graph.clone();
    bake_constants(&mut g);
    let values = Values::new(&g, placement);
    Ok(Plan::build(&g, &values)?.entry_ops(&g, g.inputs.len()))
}

/// The memory of one run of a plan: the arena, and the addresses of its inputs, outputs and
/// constants in that order (what the entry function's `io` points to).
struct Frame {
    base: Base,
    io: Vec<*mut u8>,
    inputs: usize,
    outputs: usize,
}

impl Frame {
    /// The address of `loc`.
    fn ptr(&self, loc: Loc) -> *mut u8 {
        match loc {
            // SAFETY: the plan's offsets lie inside the arena (it was sized for them).
            Loc::Arena(off) => unsafe { self.base.ptr.add(off) },
            Loc::Input(k) => self.io[k],
            Loc::Output(k) => self.io[self.inputs + k],
            Loc::Const(k) => self.io[self.inputs + self.outputs + k],
        }
    }

    /// The addresses of `s`'s operands, as the entry function passes them to a kernel entry:
    /// its inputs, then its outputs, null for an omitted one.
    fn ops(&self, s: &Step) -> Vec<*mut u8> {
        s.ins.iter().chain(&s.outs).map(|o| o.as_ref().map_or(std::ptr::null_mut(), |o| self.ptr(o.loc))).collect()
    }
}

/// The f32 elements of `o` (f32, checked when the plan was built) at `at`.
///
/// # Safety
/// `at` holds the operand's bytes, not written while the slice is read but by the in-place
/// cases the kernels handle (see `run.rs`).
unsafe fn floats<'a>(at: *mut u8, o: &Operand) -> &'a [f32] {
    // SAFETY: by the contract above (inputs were checked against their static types,
    // outputs allocated with them, the arena sized for them).
    unsafe { std::slice::from_raw_parts(at as *const f32, o.elements()) }
}

/// What the step runner needs: the program, its plan, the run's memory and the first error.
pub(super) struct RunCtx<'a> {
    pub(super) prog: &'a CpuProgram,
    plan: &'a Plan,
    frame: &'a Frame,
    deadline: Option<Deadline>,
    pub(super) error: std::cell::RefCell<Option<RunError>>,
}

/// The step runner the entry function calls ([`StepFn`]).
pub(super) unsafe extern "C" fn run_step_from_entry(ctx: *const u8, step: usize) -> i64 {
    // SAFETY: the entry function passes back the context `run_steps` gave it.
    let cx = unsafe { &*(ctx as *const RunCtx) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cx.prog.step(cx, step)));
    let r = r.unwrap_or_else(|e| {
        Err(RunError::Node {
            node: String::new(),
            op: String::new(),
            msg: format!("internal error: {}", panic_message(&*e)),
        })
    });
    match r {
        Ok(()) => 0,
        Err(e) => {
            *cx.error.borrow_mut() = Some(e);
            1
        }
    }
}

impl CpuProgram {
    /// The typed steps this program runs, when every shape is static (else `None`).
    pub fn steps(&self) -> Option<&[Step]> {
        self.plan.as_ref().map(|p| p.steps.as_slice())
    }

    /// Why the program runs node by node rather than as typed steps (`None` when it has them).
    pub fn why_no_steps(&self) -> Option<&str> {
        self.no_plan.as_deref()
    }

    /// What a generated entry function for the steps must do, in order (`None` without
    /// steps).
    pub fn entry_ops(&self) -> Option<Vec<EntryOp>> {
        self.plan.as_ref().map(|p| p.entry_ops(&self.graph, self.values.inputs.len()))
    }

    /// The generated loop of node `node`, when it runs one.
    pub fn loop_fn(&self, node: usize) -> Option<ElementwiseFn> {
        match self.prepared.get(&node) {
            Some(Prepared::Elementwise(l)) => Some(l.generated()),
            _ => None,
        }
    }

    /// The program running its steps from `entry`, generated for [`CpuProgram::entry_ops`].
    pub fn with_entry(mut self, entry: Entry) -> CpuProgram {
        self.entry = Some(entry);
        self
    }

    /// Whether runs go through a generated entry function.
    pub fn has_entry(&self) -> bool {
        self.entry.is_some()
    }

    /// Runs the plan's steps: from the entry function when there is one, else in a loop.
    pub(super) fn run_steps(
        &self,
        plan: &Plan,
        mut inputs: HashMap<String, Tensor>,
        deadline: Option<Deadline>,
    ) -> Result<Vec<Tensor>, RunError> {
        let g = &self.graph;
        let mut syms = HashMap::new();
        let mut given = Vec::with_capacity(g.inputs.len());
        for decl in &g.inputs {
            let t = inputs
                .remove(&decl.name)
                .ok_or_else(|| RunError::MissingInput { name: decl.name.clone(), expected: decl.ty.to_string() })?;
            check_input(&decl.name, &decl.ty, &t, &mut syms)?;
            // Steps view inputs in place as typed slices: bytes not aligned for their type
            // (a borrowed or memory-mapped buffer) are copied first.
            let t = match (t.bytes().as_ptr() as usize).is_multiple_of(t.dtype().size().max(1)) {
                true => t,
                false => Tensor::from_bytes(t.dtype(), t.shape(), t.bytes()).expect("the same shape and bytes"),
            };
            given.push(t);
        }
        let mut outs = Vec::with_capacity(plan.outputs.len());
        for (k, (dtype, shape)) in plan.outputs.iter().enumerate() {
            let t = Tensor::try_zeros(*dtype, shape).map_err(|e| RunError::Node {
                node: g.outputs[k].name.clone(),
                op: "output".into(),
                msg: e.to_string(),
            })?;
            outs.push(t);
        }
        let taken = self.arenas.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut arena = taken.filter(|a| a.bytes() >= plan.arena_bytes).unwrap_or_else(|| Arena::new(plan.arena_bytes));
        let base = Base { ptr: arena.ptr(), bytes: plan.arena_bytes };
        let mut io: Vec<*mut u8> = given.iter().map(|t| t.bytes().as_ptr() as *mut u8).collect();
        io.extend(outs.iter_mut().map(|t| t.bytes_mut().as_mut_ptr()));
        io.extend(plan.const_addrs.iter().map(|&a| a as *mut u8));
        let frame = Frame { base, io, inputs: given.len(), outputs: outs.len() };
        let cx = RunCtx { prog: self, plan, frame: &frame, deadline, error: Default::default() };
        let r = match (&self.entry, &self.records, deadline) {
            (Some(e), Some(recs), None) => {
                let env = super::entry::entry_env(recs);
                // SAFETY: the function was generated for this plan's steps (its operands'
                // locations and sizes, its kinds of kernel); `frame` holds the run's arena
                // and io addresses, all of the sizes the plan's types give; `env` the
                // runtime's entries and this program's records.
                let failed = unsafe { (e.func)(&cx as *const RunCtx as *const u8, base.ptr, frame.io.as_ptr(), &env) };
                match failed {
                    0 => Ok(()),
                    k => Err(cx.error.borrow_mut().take().unwrap_or_else(|| RunError::Node {
                        node: String::new(),
                        op: String::new(),
                        msg: format!("step {} failed without an error", k - 1),
                    })),
                }
            }
            _ => (0..plan.steps.len()).try_for_each(|k| self.step(&cx, k)),
        };
        self.arenas.lock().unwrap_or_else(|e| e.into_inner()).push(arena);
        drop(given);
        r.map(|()| outs)
    }

    /// Runs step `k` of the run `cx`.
    fn step(&self, cx: &RunCtx, k: usize) -> Result<(), RunError> {
        let s = &cx.plan.steps[k];
        let n = &self.graph.nodes[s.node];
        Deadline::check(cx.deadline, &n.name)?;
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg };
        let p = self.prepared.get(&s.node);
        let ops = || cx.frame.ops(s);
        match (s.kernel, p) {
            (KernelRef::Library, None) => self.library_step(s, cx.plan, cx.frame),
            (KernelRef::Loop, Some(p)) => self.loop_step(s, p, &ops()).map_err(fail),
            (KernelRef::Prepared, Some(p)) => self.prepared_step(s, p, &ops()).map_err(fail),
            (KernelRef::Int8, Some(p)) => self.int8_step(s, p, &ops()).map_err(fail),
            _ => Err(fail(format!("step {k}: its kernel ({}) was not prepared", s.kernel.label()))),
        }
    }

    /// Runs the generated loop `p` of step `s` over the pool, its operands at `ops` (inputs,
    /// then outputs: a kernel entry's table).
    pub(super) fn loop_step(&self, s: &Step, p: &Prepared, ops: &[*mut u8]) -> Result<(), String> {
        let Prepared::Elementwise(func) = p else { return Err("the step's kernel is not a loop".into()) };
        let y = s.outs[0].as_ref().ok_or("the node has no output")?;
        let ptrs: Vec<*const f32> = ops[..s.ins.len()].iter().map(|&a| a as *const f32).collect();
        let shapes: Vec<&[usize]> = s.ins.iter().flatten().map(|o| o.shape.as_slice()).collect();
        let rows = elementwise::Rows::new(&shapes, &y.shape)?;
        let out = ops[s.ins.len()] as *mut f32;
        // SAFETY: every operand holds its shape's floats, which broadcast to the output's
        // (checked when the plan was built); the output overlaps no input or is exactly one
        // (the memory plan's rule for loops).
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            match rows.flat() {
                true => elementwise::run_elementwise(func, &ptrs, out, y.elements(), &self.pool),
                false => elementwise::run_rows(func, &ptrs, &rows, out, &self.pool),
            }
        }));
        run.map_err(|e| format!("internal error: {}", panic_message(&*e)))
    }

    /// Runs the prepared kernel `p` of step `s`, its operands at `ops` (as for `loop_step`).
    pub(super) fn prepared_step(&self, s: &Step, p: &Prepared, ops: &[*mut u8]) -> Result<(), String> {
        // SAFETY (every `floats` below): `ops` holds the addresses of the step's operands.
        let get = |k: usize| {
            s.ins.get(k).and_then(|o| o.as_ref()).map(|o| In { data: unsafe { floats(ops[k], o) }, shape: &o.shape })
        };
        let x = get(0).ok_or("input 0 is missing")?;
        let mask = if matches!(p, Prepared::Softmax(_)) { get(1) } else { None };
        let y = s.outs[0].as_ref().ok_or("the node has no output")?;
        let y_at = ops[s.ins.len()];
        let res = s.ins.get(3).and_then(|o| o.as_ref());
        let in_place = res.is_some_and(|r| r.loc == y.loc);
        let saved: Option<Vec<f32>> = match (in_place, Self::takes_residual_in_place(p)) {
            (true, false) => res.map(|r| unsafe { floats(ops[3], r) }.to_vec()),
            _ => None,
        };
        let residual = match (&saved, in_place) {
            (Some(data), _) => Residual::Separate(In { data, shape: &y.shape }),
            (None, true) => Residual::InOutput,
            (None, false) => get(3).map_or(Residual::None, Residual::Separate),
        };
        // SAFETY: the output's location holds its bytes and overlaps no input but a
        // residual taken in place (see `Plan::build` and the memory plan).
        let slot = unsafe { std::slice::from_raw_parts_mut(y_at as *mut f32, y.elements()) };
        let mut out = Out { slot: Some(slot), shape: Vec::new(), made: None };
        self.run_prepared(p, x, mask, residual, &mut out)?;
        match (out.made, out.slot) {
            (None, Some(_)) if out.shape == y.shape => Ok(()),
            (made, _) => Err(format!(
                "the kernel made {:?}; the program was planned for {:?}",
                made.map_or(out.shape, |t| t.shape().to_vec()),
                y.shape
            )),
        }
    }

    /// Runs the byte kernel `p` of step `s`, its operands at `ops` (as for `loop_step`).
    pub(super) fn int8_step(&self, s: &Step, p: &Prepared, ops: &[*mut u8]) -> Result<(), String> {
        let Prepared::Int8(p) = p else { return Err("the step's kernel is not a byte kernel".into()) };
        let ins: Vec<Option<super::int8::Operand>> = s
            .ins
            .iter()
            .zip(ops)
            .map(|(o, &at)| {
                o.as_ref().map(|o| super::int8::Operand {
                    // SAFETY: the location holds the operand's bytes (as for `floats`).
                    bytes: unsafe { std::slice::from_raw_parts(at, o.bytes()) },
                    shape: &o.shape,
                    dtype: o.dtype,
                })
            })
            .collect();
        let (dtype, shape) = super::int8::output(p, &ins)?;
        let y = s.outs[0].as_ref().ok_or("the node has no output")?;
        if dtype != y.dtype || shape != y.shape {
            return Err(format!(
                "the kernel makes {dtype} {shape:?}; the program was planned for {} {:?}",
                y.dtype, y.shape
            ));
        }
        // SAFETY: the output's location holds its bytes and overlaps none of the inputs.
        let out = unsafe { std::slice::from_raw_parts_mut(ops[s.ins.len()], y.bytes()) };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            super::int8::run(p, self.isa, &ins, out, &self.pool)
        }));
        run.map_err(|e| format!("internal error: {}", panic_message(&*e)))?
    }

    fn library_step(&self, s: &Step, plan: &Plan, f: &Frame) -> Result<(), RunError> {
        let consts = &plan.consts;
        let n = &self.graph.nodes[s.node];
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg };
        let ins: Vec<Option<Tensor>> = s
            .ins
            .iter()
            .map(|o| {
                o.as_ref().map(|o| {
                    if let Loc::Const(k) = o.loc {
                        return consts[k].clone();
                    }
                    // SAFETY: the location holds the operand's bytes, not written while the
                    // node runs (its outputs overlap none of its inputs); the tensors are
                    // dropped below, before anything writes there.
                    let t = unsafe { Tensor::borrowed(o.dtype, &o.shape, f.ptr(o.loc), o.bytes()) };
                    t.expect("shape and bytes agree")
                })
            })
            .collect();
        let slot = match s.outs.first() {
            Some(Some(y)) if y.dtype == DType::F32 && !is_view_op(n) => {
                // SAFETY: 64-byte aligned (arena offsets and fresh outputs are), disjoint
                // from the inputs; a tensor the kernel returns over it is copied or dropped
                // below before anything else writes there.
                Some(unsafe { aim_kernels::fast::OutSlot::new(f.ptr(y.loc) as *mut f32, y.elements()) })
            }
            _ => None,
        };
        let scope = Scope { values: HashMap::new(), parent: None, deadline: None };
        let made = self.library_kernel(s.node, n, &ins, &scope, slot)?;
        for (k, y) in s.outs.iter().enumerate() {
            let Some(y) = y else { continue };
            let t = made.get(k).ok_or_else(|| fail(format!("the kernel made no output {k}")))?;
            if t.dtype() != y.dtype || t.shape() != y.shape.as_slice() {
                return Err(fail(format!(
                    "the kernel made {} {:?}; the program was planned for {} {:?}",
                    t.dtype(),
                    t.shape(),
                    y.dtype,
                    y.shape
                )));
            }
            let dst = f.ptr(y.loc);
            if !std::ptr::eq(t.bytes().as_ptr(), dst) {
                // SAFETY: `dst` holds the operand's bytes; `copy` allows the source (an
                // input the kernel returned as it was) to overlap them.
                unsafe { std::ptr::copy(t.bytes().as_ptr(), dst, y.bytes()) };
            }
        }
        drop((made, ins));
        for o in s.ins.iter().flatten() {
            if let Loc::Const(k) = o.loc {
                if plan.release_consts[k].load(std::sync::atomic::Ordering::Relaxed) {
                    aim_ir::mapped::release_range(consts[k].bytes());
                }
            }
        }
        Ok(())
    }
}
