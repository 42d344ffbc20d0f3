//! Running a CPU program. Values are numbered once, at load time, with each node's operands
//! and the nodes after which values die, so a run does no name lookups. The outputs of
//! prepared kernels and generated loops are written straight into their slots of one
//! arena (laid out by the compiler's memory plan, reused from run to run); library kernels
//! read arena values in place, through tensors that borrow them; the fast ones write their
//! output into the slot offered them, and views of arena values (Reshape and the like) are
//! the same bytes. Other results are allocated by their kernels.
//! Graph outputs are allocated for the caller.

use super::{
    blocked, conv, deconv, dense, depthwise, elementwise, softmax, transpose, CpuProgram, In, Out, Placement, Prepared,
    Residual,
};
use crate::exec::{check_input, panic_message, run_node, Capture, Deadline, NodeTiming, RunError, RunOptions, Scope};
use aim_ir::{Attr, DType, Graph, Node, Tensor};
use std::collections::HashMap;
use std::time::Instant;

/// The numbering of a program's values and where each lives.
pub(super) struct Values {
    pub(super) names: Vec<String>,
    /// Per node: its inputs and outputs by value index (`None` for an omitted operand).
    pub(super) ins: Vec<Vec<Option<usize>>>,
    pub(super) outs: Vec<Vec<Option<usize>>>,
    /// Per node: the values read for the last time there (graph outputs never are).
    free: Vec<Vec<usize>>,
    /// Arena offset and bytes of placed values.
    pub(super) slot: Vec<Option<(usize, usize)>>,
    /// The graph's inputs and outputs, in order.
    pub(super) inputs: Vec<usize>,
    pub(super) outputs: Vec<usize>,
    /// Initializers the program still reads.
    pub(super) consts: Vec<(usize, Tensor)>,
    /// Per node with subgraphs: the outer values they read.
    subgraph_reads: HashMap<usize, Vec<usize>>,
    /// Per Reshape-like node whose output the plan made a view of its input: the output's
    /// static shape (the node then runs no kernel: its output is the input's slot).
    pub(super) views: HashMap<usize, Vec<usize>>,
    pub(super) arena_bytes: usize,
}

impl Values {
    /// Numbers the values of `g` and takes the slots of `placement` that are sound for it:
    /// inside the arena, and disjoint from every other operand of the node that writes
    /// them unless the node is a generated elementwise loop overwriting an input whole.
    pub(super) fn new(g: &Graph, placement: &Placement) -> Values {
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut names = Vec::new();
        let mut id = |name: &str| -> usize {
            *index.entry(name.to_string()).or_insert_with(|| {
                names.push(name.to_string());
                names.len() - 1
            })
        };
        let inputs: Vec<usize> = g.inputs.iter().map(|i| id(&i.name)).collect();
        let mut consts: Vec<(usize, Tensor)> = g.initializers.iter().map(|(k, t)| (id(k), t.clone())).collect();
        consts.sort_by_key(|c| c.0);
        let opt = |s: &String, id: &mut dyn FnMut(&str) -> usize| if s.is_empty() { None } else { Some(id(s)) };
        let ins: Vec<Vec<Option<usize>>> =
            g.nodes.iter().map(|n| n.inputs.iter().map(|s| opt(s, &mut id)).collect()).collect();
        let outs: Vec<Vec<Option<usize>>> =
            g.nodes.iter().map(|n| n.outputs.iter().map(|s| opt(s, &mut id)).collect()).collect();
        let mut subgraph_reads = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            let mut read = Vec::new();
            for a in n.attrs.values() {
                if let Attr::Graph(sub) = a {
                    sub.names_read(&mut read);
                }
            }
            if !read.is_empty() {
                let mut read: Vec<usize> = read.iter().map(|s| id(s)).collect();
                read.sort_unstable();
                read.dedup();
                subgraph_reads.insert(i, read);
            }
        }
        let outputs: Vec<usize> = g.outputs.iter().map(|o| id(&o.name)).collect();
        // The shared liveness rule (reads inside subgraphs count at the node holding them),
        // so the executor frees values exactly when the memory plan lets their bytes go.
        let reads: Vec<(usize, usize)> =
            aim_ir::liveness::last_reads(g).into_iter().map(|(name, i)| (id(&name), i)).collect();
        let count = names.len();
        let mut last = vec![None; count];
        for (x, i) in reads {
            last[x] = Some(i);
        }
        let mut free = vec![Vec::new(); g.nodes.len()];
        for (x, l) in last.iter().enumerate() {
            if let Some(l) = l {
                if !outputs.contains(&x) {
                    free[*l].push(x);
                }
            }
        }
        let mut slot: Vec<Option<(usize, usize)>> = names
            .iter()
            .map(|nm| {
                placement.slots.get(nm).copied().filter(|&(off, bytes)| {
                    off % 64 == 0 && off.checked_add(bytes).is_some_and(|e| e <= placement.arena_bytes)
                })
            })
            .collect();
        for &o in &outputs {
            slot[o] = None;
        }
        for (i, n) in g.nodes.iter().enumerate() {
            // Generated elementwise loops may overwrite any input whole, fused convolutions and
            // dense layers their residual (input 3); views (which write nothing) are their
            // input's bytes.
            let may_take = |k: usize| {
                (n.domain == "aim" && n.op == "Elementwise")
                    || (n.domain == "aim" && matches!(n.op.as_str(), "Conv" | "Dense") && k == 3)
                    || (is_view_op(n) && k == 0)
            };
            for o in outs[i].iter().flatten() {
                let Some((a, la)) = slot[*o] else { continue };
                let clash =
                    ins[i].iter().enumerate().filter_map(|(k, x)| Some((k, slot[(*x)?]?))).any(|(k, (b, lb))| {
                        let overlap = a < b + lb && b < a + la;
                        overlap && !(may_take(k) && a == b && la == lb)
                    });
                if clash {
                    slot[*o] = None;
                }
            }
        }
        let mut views = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            let view_op = is_view_op(n);
            let (Some(Some(x)), Some(Some(o))) = (ins[i].first(), outs[i].first()) else { continue };
            let shape = n.outputs.first().and_then(|o| g.value_type(o)).and_then(|t| t.concrete_shape());
            if let (true, Some(s), Some(shape)) = (view_op, slot[*o], shape) {
                if slot[*x] == Some(s) && aim_ir::limits::bytes_of(DType::F32, &shape).ok() == Some(s.1) {
                    views.insert(i, shape);
                }
            }
        }
        Values {
            names,
            ins,
            outs,
            free,
            slot,
            inputs,
            outputs,
            consts,
            subgraph_reads,
            views,
            arena_bytes: placement.arena_bytes,
        }
    }
}

impl Values {
    /// Whether node `i` runs as a view of its input (no kernel).
    pub(super) fn is_view(&self, i: usize) -> bool {
        self.views.contains_key(&i)
    }
}

/// Whether `n` is a Reshape-like op, whose output the memory plan may make a view of its
/// input (the same bytes).
pub(super) fn is_view_op(n: &Node) -> bool {
    n.domain.is_empty() && matches!(n.op.as_str(), "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity")
}

/// One cache line of the arena.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// The memory of one run's placed values.
pub(super) struct Arena(Vec<Line>);

impl Arena {
    /// An arena of `bytes`, filled with NaN so that a kernel that reads what it did not
    /// write shows in its results.
    pub(super) fn new(bytes: usize) -> Arena {
        Arena(vec![Line([f32::NAN; 16]); bytes.div_ceil(64)])
    }

    /// Its size in bytes.
    pub(super) fn bytes(&self) -> usize {
        64 * self.0.len()
    }

    /// Its first byte.
    pub(super) fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

/// Where a value is during a run.
enum Val {
    Empty,
    Tensor(Tensor),
    /// In the arena at a byte offset: f32, or u8 for the byte ops' values.
    Arena {
        off: usize,
        shape: Vec<usize>,
        dtype: DType,
    },
}

/// The arena of the run in progress, by address.
#[derive(Clone, Copy)]
pub(super) struct Base {
    pub(super) ptr: *mut u8,
    pub(super) bytes: usize,
}

impl Base {
    /// The f32 elements at `off` (the caller knows they are in the arena and not written
    /// while the slice lives).
    fn floats<'a>(self, off: usize, shape: &[usize]) -> &'a [f32] {
        let n: usize = shape.iter().product();
        assert!(off + 4 * n <= self.bytes, "arena value out of bounds");
        // SAFETY: in bounds (above), aligned (offsets are multiples of 64); the executor
        // writes no value while another that overlaps it is read, except the in-place
        // elementwise loops, which take raw pointers instead.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off) as *const f32, n) }
    }

    /// The `len` bytes at `off` (as for [`Base::floats`]).
    fn bytes<'a>(self, off: usize, len: usize) -> &'a [u8] {
        assert!(off + len <= self.bytes, "arena value out of bounds");
        // SAFETY: in bounds (above); not written while the slice lives (as for `floats`).
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// A copy of the arena value at `off` as a tensor.
    fn tensor(self, off: usize, shape: &[usize], dtype: DType) -> Tensor {
        match dtype {
            DType::F32 => Tensor::from_slice(shape, self.floats(off, shape)),
            _ => {
                let len = shape.iter().product::<usize>() * dtype.size();
                Tensor::from_bytes(dtype, shape, self.bytes(off, len)).expect("shape and bytes agree")
            }
        }
    }

    /// Whether `t`'s bytes lie in the arena, and at which offset.
    fn offset_of(self, t: &Tensor) -> Option<usize> {
        let p = t.bytes().as_ptr() as usize;
        let b = self.ptr as usize;
        (p >= b && p < b + self.bytes).then(|| p - b)
    }
}

impl CpuProgram {
    /// Runs the program.
    pub fn run(&self, inputs: HashMap<String, Tensor>) -> Result<Vec<Tensor>, RunError> {
        self.execute(inputs, &RunOptions::default(), None)
    }

    /// Runs the program within the bounds of `opts`.
    pub fn run_with(&self, inputs: HashMap<String, Tensor>, opts: &RunOptions) -> Result<Vec<Tensor>, RunError> {
        self.execute(inputs, opts, None)
    }

    /// Runs the program as the body of a control-flow node: within the enclosing run's
    /// deadline.
    pub(super) fn run_within(
        &self,
        inputs: HashMap<String, Tensor>,
        deadline: Option<Deadline>,
    ) -> Result<Vec<Tensor>, RunError> {
        self.execute_deadline(inputs, deadline, None, None)
    }

    /// Runs the program, recording every node's time.
    pub fn run_profiled(
        &self,
        inputs: HashMap<String, Tensor>,
        opts: &RunOptions,
    ) -> Result<(Vec<Tensor>, Vec<NodeTiming>), RunError> {
        let mut p = Vec::new();
        let outs = self.execute(inputs, opts, Some(&mut p))?;
        Ok((outs, p))
    }

    /// Bytes of the arena each run uses (the typed steps' where the program has them: the
    /// memory plan's and the values it left to their kernels).
    pub fn arena_bytes(&self) -> usize {
        self.plan.as_ref().map_or(self.values.arena_bytes, |p| p.arena_bytes)
    }

    /// Runs the program keeping a copy of every value a node makes, in the order they were
    /// made (values in the arena are copied out before anything overwrites them): what
    /// `aim compare` compares with the reference backend.
    pub fn run_capture(&self, inputs: HashMap<String, Tensor>, opts: &RunOptions) -> Result<Capture, RunError> {
        let mut kept = Vec::new();
        let outs = self.execute_with(inputs, opts, None, Some(&mut kept))?;
        Ok((outs, kept))
    }

    fn execute(
        &self,
        inputs: HashMap<String, Tensor>,
        opts: &RunOptions,
        profile: Option<&mut Vec<NodeTiming>>,
    ) -> Result<Vec<Tensor>, RunError> {
        self.execute_with(inputs, opts, profile, None)
    }

    fn execute_with(
        &self,
        inputs: HashMap<String, Tensor>,
        opts: &RunOptions,
        profile: Option<&mut Vec<NodeTiming>>,
        capture: Option<&mut Vec<(String, Tensor)>>,
    ) -> Result<Vec<Tensor>, RunError> {
        self.execute_deadline(inputs, Deadline::start(opts), profile, capture)
    }

    fn execute_deadline(
        &self,
        inputs: HashMap<String, Tensor>,
        deadline: Option<Deadline>,
        profile: Option<&mut Vec<NodeTiming>>,
        capture: Option<&mut Vec<(String, Tensor)>>,
    ) -> Result<Vec<Tensor>, RunError> {
        let _ftz = crate::denormals::FlushToZero::new();
        if let (Some(plan), None, None) = (&self.plan, &profile, &capture) {
            return self.run_steps(plan, inputs, deadline);
        }
        let taken = self.arenas.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut arena = taken
            .filter(|a| a.bytes() >= self.values.arena_bytes)
            .unwrap_or_else(|| Arena::new(self.values.arena_bytes));
        let base = Base { ptr: arena.0.as_mut_ptr() as *mut u8, bytes: self.values.arena_bytes };
        let r = self.execute_in(base, inputs, deadline, profile, capture);
        self.arenas.lock().unwrap_or_else(|e| e.into_inner()).push(arena);
        r
    }

    fn execute_in(
        &self,
        base: Base,
        mut inputs: HashMap<String, Tensor>,
        deadline: Option<Deadline>,
        mut profile: Option<&mut Vec<NodeTiming>>,
        mut capture: Option<&mut Vec<(String, Tensor)>>,
    ) -> Result<Vec<Tensor>, RunError> {
        let v = &self.values;
        let g = &self.graph;
        let start = Instant::now();
        let mut vals: Vec<Val> = (0..v.names.len()).map(|_| Val::Empty).collect();
        let mut syms = HashMap::new();
        for (decl, &x) in g.inputs.iter().zip(&v.inputs) {
            let t = inputs
                .remove(&decl.name)
                .ok_or_else(|| RunError::MissingInput { name: decl.name.clone(), expected: decl.ty.to_string() })?;
            check_input(&decl.name, &decl.ty, &t, &mut syms)?;
            vals[x] = Val::Tensor(t);
        }
        for (x, t) in &v.consts {
            if matches!(vals[*x], Val::Empty) {
                vals[*x] = Val::Tensor(t.clone());
            }
        }
        for (i, n) in g.nodes.iter().enumerate() {
            Deadline::check(deadline, &n.name)?;
            let t = Instant::now();
            self.node(i, n, &mut vals, base, deadline)?;
            if let Some(p) = profile.as_deref_mut() {
                let op = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
                p.push(NodeTiming { node: n.name.clone(), op, start: t - start, time: t.elapsed() });
            }
            if let Some(c) = capture.as_deref_mut() {
                for &o in v.outs[i].iter().flatten() {
                    match &vals[o] {
                        Val::Tensor(t) => c.push((v.names[o].clone(), t.clone())),
                        Val::Arena { off, shape, dtype } => {
                            c.push((v.names[o].clone(), base.tensor(*off, shape, *dtype)))
                        }
                        Val::Empty => {}
                    }
                }
            }
            for &x in &v.free[i] {
                vals[x] = Val::Empty;
            }
        }
        v.outputs
            .iter()
            .map(|&o| match &vals[o] {
                Val::Tensor(t) => Ok(t.clone()),
                Val::Arena { off, shape, dtype } => Ok(base.tensor(*off, shape, *dtype)),
                Val::Empty => Err(RunError::Missing { name: v.names[o].clone() }),
            })
            .collect()
    }

    /// Runs node `i`, storing its outputs in `vals`.
    fn node(
        &self,
        i: usize,
        n: &Node,
        vals: &mut [Val],
        base: Base,
        deadline: Option<Deadline>,
    ) -> Result<(), RunError> {
        let v = &self.values;
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg };
        let missing = |x: usize| RunError::Missing { name: v.names[x].clone() };
        if let Some(shape) = v.views.get(&i) {
            let (x, o) = (v.ins[i][0].expect("views have an input"), v.outs[i][0].expect("views have an output"));
            if let Val::Arena { off, dtype: DType::F32, .. } = vals[x] {
                vals[o] = Val::Arena { off, shape: shape.clone(), dtype: DType::F32 };
                return Ok(());
            }
        }
        let Some(p) = self.prepared.get(&i) else { return self.library_node(i, n, vals, base, deadline) };
        if let Prepared::Int8(p) = p {
            return self.int8_node(i, n, p, vals, base);
        }
        let out = v.outs[i].first().copied().flatten().ok_or_else(|| fail("the node has no output".into()))?;
        let slot = v.slot[out];
        let result = if let Prepared::Elementwise(f) = p {
            // The loop may write over an input in place: everything goes by raw pointer.
            let mut ptrs = Vec::with_capacity(v.ins[i].len());
            let mut shapes: Vec<&[usize]> = Vec::with_capacity(v.ins[i].len());
            for x in &v.ins[i] {
                let x = x.ok_or_else(|| fail("an input is missing".into()))?;
                let (ptr, s) = match &vals[x] {
                    Val::Empty => return Err(missing(x)),
                    Val::Tensor(t) if t.dtype() == DType::F32 => (t.data::<f32>().as_ptr(), t.shape()),
                    Val::Tensor(t) => {
                        return Err(fail(format!("input '{}' is {}, expected f32", v.names[x], t.dtype())))
                    }
                    Val::Arena { off, shape, dtype: DType::F32 } => {
                        (base.floats(*off, shape).as_ptr(), shape.as_slice())
                    }
                    Val::Arena { .. } => return Err(fail(format!("input '{}' is not f32", v.names[x]))),
                };
                shapes.push(s);
                ptrs.push(ptr);
            }
            if shapes.is_empty() {
                return Err(fail("no inputs".into()));
            }
            // The output has the inputs' broadcast shape (the fusion pass lets inputs that
            // broadcast into one loop).
            let shape = aim_kernels::util::broadcast_shapes(&shapes).map_err(|e| fail(format!("inputs: {e}")))?;
            let rows = elementwise::Rows::new(&shapes, &shape).map_err(fail)?;
            let len: usize = shape.iter().product();
            let (dst, made) = match slot {
                Some((off, bytes)) if bytes >= 4 * len => {
                    // SAFETY: in bounds (bytes ≥ 4·len and the slot is in the arena).
                    (unsafe { base.ptr.add(off) } as *mut f32, None)
                }
                _ => {
                    let mut t = Tensor::try_zeros(DType::F32, &shape).map_err(|e| fail(format!("output: {e}")))?;
                    (t.data_mut::<f32>().as_mut_ptr(), Some(t))
                }
            };
            // SAFETY: every pointer holds `len` floats; the output is a fresh tensor or its
            // slot, which overlaps no input or is exactly one (checked at load).
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                match rows.flat() {
                    true => elementwise::run_elementwise(f, &ptrs, dst, len, &self.pool),
                    false => elementwise::run_rows(f, &ptrs, &rows, dst, &self.pool),
                }
            }));
            run.map_err(|e| fail(format!("internal error: {}", panic_message(&*e))))?;
            made.map_or(Val::Arena { off: slot.map_or(0, |s| s.0), shape, dtype: DType::F32 }, Val::Tensor)
        } else {
            let get = |k: usize| -> Result<Option<In>, RunError> {
                let Some(x) = v.ins[i].get(k).copied().flatten() else { return Ok(None) };
                match &vals[x] {
                    Val::Empty => Err(missing(x)),
                    Val::Tensor(t) if t.dtype() == DType::F32 => {
                        Ok(Some(In { data: t.data::<f32>(), shape: t.shape() }))
                    }
                    Val::Tensor(t) => Err(fail(format!("input '{}' is {}, expected f32", v.names[x], t.dtype()))),
                    Val::Arena { off, shape, dtype: DType::F32 } => {
                        Ok(Some(In { data: base.floats(*off, shape), shape }))
                    }
                    Val::Arena { .. } => Err(fail(format!("input '{}' is not f32", v.names[x]))),
                }
            };
            let x = get(0)?.ok_or_else(|| fail("input 0 is missing".into()))?;
            let mask = if matches!(p, Prepared::Softmax(_)) { get(1)? } else { None };
            // A residual whose slot the output takes (in place): the kernels that can start
            // from it do; for the others it is copied out first.
            let res_value = v.ins[i].get(3).copied().flatten();
            let in_place = res_value.is_some_and(|r| {
                v.slot[r] == slot
                    && matches!(&vals[r], Val::Arena { off, dtype: DType::F32, .. } if slot.map(|s| s.0) == Some(*off))
            });
            let direct = Self::takes_residual_in_place(p);
            let saved: Option<(Vec<f32>, Vec<usize>)> = match (in_place, direct, res_value.map(|r| &vals[r])) {
                (true, false, Some(Val::Arena { off, shape, .. })) => {
                    Some((base.floats(*off, shape).to_vec(), shape.clone()))
                }
                _ => None,
            };
            let residual = match (&saved, in_place) {
                (Some((data, shape)), _) => Residual::Separate(In { data, shape }),
                (None, true) => Residual::InOutput,
                (None, false) => get(3)?.map_or(Residual::None, Residual::Separate),
            };
            // SAFETY: the slot is in the arena and overlaps none of this node's inputs
            // (checked at load) except a residual it takes in place, which is then read
            // through the slot only; and no other value alive now (the memory plan).
            let floats = slot.map(|(off, bytes)| unsafe {
                std::slice::from_raw_parts_mut(base.ptr.add(off) as *mut f32, bytes / 4)
            });
            let mut y = Out { slot: floats, shape: Vec::new(), made: None };
            self.run_prepared(p, x, mask, residual, &mut y).map_err(fail)?;
            match (y.made, y.slot) {
                (Some(t), _) => Val::Tensor(t),
                (None, Some(_)) => Val::Arena { off: slot.map_or(0, |s| s.0), shape: y.shape, dtype: DType::F32 },
                (None, None) => return Err(fail("the kernel wrote no output".into())),
            }
        };
        vals[out] = result;
        Ok(())
    }

    /// Whether prepared kernel `p` starts from a residual already in its output (the output
    /// overwriting the residual in place) rather than taking it apart.
    pub(super) fn takes_residual_in_place(p: &Prepared) -> bool {
        match p {
            Prepared::Dense(_) => true,
            Prepared::Blocked(c) => blocked::takes_residual_in_place(c),
            _ => false,
        }
    }

    /// Runs prepared kernel `p` (not a loop or a byte op) on `x`, writing `y`; a bug in the
    /// kernel surfaces as an error, not a crash.
    pub(super) fn run_prepared(
        &self,
        p: &Prepared,
        x: In,
        mask: Option<In>,
        residual: Residual,
        y: &mut Out,
    ) -> Result<(), String> {
        let pool = &self.pool;
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match p {
            Prepared::Conv(c) => residual.separate().and_then(|r| conv::run_conv(c, x, r, y, pool)).map(|()| {
                super::apply_post(c.post.as_deref(), y.written(), pool);
            }),
            Prepared::Depthwise(d) => residual
                .separate()
                .and_then(|r| depthwise::run_depthwise(d, x, r, y, self.isa, pool))
                .map(|()| super::apply_post(d.post.as_deref(), y.written(), pool)),
            Prepared::Dense(d) => dense::run_dense(d, x, residual, y, self.blocking, pool),
            Prepared::QDense(d) => super::qdense::run(d, self.isa, x, y, pool),
            Prepared::QConv(q) => super::qconv::run(q, self.isa, x, y, pool),
            Prepared::Deconv(d) => residual.separate().and_then(|r| deconv::run(d, x, r, y, pool)),
            Prepared::Blocked(c) => blocked::run(c, x, residual, y, pool),
            Prepared::Reorder(r) => blocked::run_reorder(r, x, y, pool),
            Prepared::Pool(q) => blocked::run_pool(q, x, y, pool),
            Prepared::Reduce(r) => elementwise::run_reduce(r, x, y, pool),
            Prepared::Transpose(t) => transpose::run(t, x, y, pool),
            Prepared::Softmax(scale) => softmax::run(*scale, self.isa, x, mask, y, pool),
            Prepared::Elementwise(_) | Prepared::Int8(_) => Err("a loop or byte op is not run here".to_string()),
        }));
        let done = run.map_err(|e| format!("internal error: {}", panic_message(&*e)))?;
        p.release_if_asked();
        done
    }

    /// Runs byte op `i` (`int8.rs`): its operands are bytes (u8 or f32) from the arena or
    /// tensors, its output goes into its slot when that holds it, else into a new tensor.
    fn int8_node(
        &self,
        i: usize,
        n: &Node,
        p: &super::int8::Int8Prep,
        vals: &mut [Val],
        base: Base,
    ) -> Result<(), RunError> {
        let v = &self.values;
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg };
        let mut ins = Vec::with_capacity(v.ins[i].len());
        for x in &v.ins[i] {
            let Some(x) = *x else {
                ins.push(None);
                continue;
            };
            ins.push(Some(match &vals[x] {
                Val::Empty => return Err(RunError::Missing { name: v.names[x].clone() }),
                Val::Tensor(t) => super::int8::Operand { bytes: t.bytes(), shape: t.shape(), dtype: t.dtype() },
                Val::Arena { off, shape, dtype } => super::int8::Operand {
                    bytes: base.bytes(*off, shape.iter().product::<usize>() * dtype.size()),
                    shape,
                    dtype: *dtype,
                },
            }));
        }
        let (dtype, shape) = super::int8::output(p, &ins).map_err(&fail)?;
        let len = aim_ir::limits::bytes_of(dtype, &shape).map_err(|e| fail(format!("output: {e}")))?;
        let out = v.outs[i].first().copied().flatten().ok_or_else(|| fail("the node has no output".into()))?;
        let (dst, made): (*mut u8, Option<Tensor>) = match v.slot[out] {
            // SAFETY: in the arena (checked at load), and overlapping none of this node's
            // inputs nor any value alive now.
            Some((off, bytes)) if bytes >= len => (unsafe { base.ptr.add(off) }, None),
            _ => {
                let mut t = Tensor::try_zeros(dtype, &shape).map_err(|e| fail(format!("output: {e}")))?;
                (t.bytes_mut().as_mut_ptr(), Some(t))
            }
        };
        // SAFETY: `len` bytes at `dst` are the slot's or the new tensor's, written by this
        // node alone while no input's bytes overlap them.
        let y = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            super::int8::run(p, self.isa, &ins, y, &self.pool)
        }));
        run.map_err(|e| fail(format!("internal error: {}", panic_message(&*e))))?.map_err(fail)?;
        drop(ins);
        vals[out] = match made {
            Some(t) => Val::Tensor(t),
            None => Val::Arena { off: v.slot[out].map_or(0, |s| s.0), shape, dtype },
        };
        Ok(())
    }

    /// Runs node `i` with a library kernel: the fast f32 kernels where they apply, else the
    /// reference ones (and control flow).
    fn library_node(
        &self,
        i: usize,
        n: &Node,
        vals: &mut [Val],
        base: Base,
        deadline: Option<Deadline>,
    ) -> Result<(), RunError> {
        let v = &self.values;
        let as_tensor = |x: usize| -> Result<Tensor, RunError> {
            match &vals[x] {
                Val::Empty => Err(RunError::Missing { name: v.names[x].clone() }),
                Val::Tensor(t) => Ok(t.clone()),
                Val::Arena { off, shape, dtype } => {
                    let len = shape.iter().product::<usize>() * dtype.size();
                    let data = base.bytes(*off, len);
                    // SAFETY: the value is not written before the node returns (its slot is
                    // taken by no output of this node, and nothing else runs meanwhile); the
                    // tensor and any clone the kernel returns are dropped or copied below
                    // before anything else writes to the arena.
                    let t = unsafe { Tensor::borrowed(*dtype, shape, data.as_ptr(), len) };
                    Ok(t.expect("shape and bytes agree"))
                }
            }
        };
        let ins: Vec<Option<Tensor>> =
            v.ins[i].iter().map(|x| x.map(as_tensor).transpose()).collect::<Result<_, _>>()?;
        let mut scope = Scope { values: HashMap::new(), parent: None, deadline };
        for &x in v.subgraph_reads.get(&i).into_iter().flatten() {
            if !matches!(vals[x], Val::Empty) {
                scope.values.insert(v.names[x].clone(), as_tensor(x)?);
            }
        }
        // The first output's slot, offered to the fast kernels (it overlaps no input: checked
        // at load).
        let slot = v.outs[i].first().copied().flatten().and_then(|o| v.slot[o]).filter(|_| !is_view_op(n)).map(
            |(off, bytes)| {
                // SAFETY: in the arena, aligned, disjoint from the inputs and from every other
                // value alive now; the returned tensor over it is adopted below (and dropped)
                // before anything else writes to the arena.
                unsafe { aim_kernels::fast::OutSlot::new(base.ptr.add(off) as *mut f32, bytes / 4) }
            },
        );
        let outs = match self.bodies.get(&i) {
            // Control flow whose bodies were compiled: they read the enclosing values from
            // the scope gathered above.
            Some(b) => {
                let value = |name: &str| scope.get(name).cloned().ok_or(RunError::Missing { name: name.to_string() });
                b.run(n, &ins, &value, deadline)?
            }
            None => self.library_kernel(i, n, &ins, &scope, slot)?,
        };
        drop((ins, scope));
        for (o, t) in v.outs[i].iter().zip(outs) {
            let Some(o) = *o else { continue };
            // A result in the arena was written into this value's slot, or is a view of an
            // input: kept there when the plan placed this value there, else copied out.
            vals[o] = match base.offset_of(&t) {
                None => Val::Tensor(t),
                Some(off) if t.dtype() == DType::F32 && v.slot[o] == Some((off, t.bytes().len())) => {
                    Val::Arena { off, shape: t.shape().to_vec(), dtype: DType::F32 }
                }
                Some(_) => Val::Tensor(Tensor::from_bytes(t.dtype(), t.shape(), t.bytes()).expect("same bytes")),
            };
        }
        Ok(())
    }

    pub(super) fn library_kernel(
        &self,
        i: usize,
        n: &Node,
        ins: &[Option<Tensor>],
        scope: &Scope,
        out: Option<aim_kernels::fast::OutSlot>,
    ) -> Result<Vec<Tensor>, RunError> {
        if n.domain == "aim" && matches!(n.op.as_str(), "Attention" | "QMatMul") {
            let cx = aim_kernels::fast::Ctx { par: &*self.pool, isa: self.isa, blocking: self.blocking, out };
            let node_err = |msg: String| RunError::Node { node: n.name.clone(), op: format!("aim:{}", n.op), msg };
            let run = || match n.op.as_str() {
                "Attention" => aim_kernels::fast::attention(n, ins, &cx),
                _ => aim_kernels::fast::qmatmul(n, ins, &cx),
            };
            return match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                Ok(Some(r)) => r.map_err(|e| node_err(e.0)),
                Ok(None) => Err(node_err("the inputs must be f32".into())),
                Err(e) => Err(node_err(format!("internal error: {}", panic_message(&*e)))),
            };
        }
        if let Some(custom) = aim_ir::custom::lookup(&n.domain, &n.op) {
            use aim_kernels::gemm::Parallel;
            let host = aim_ir::custom::Host {
                parallel_for: &|count, f| self.pool.for_each(count, f),
                threads: self.pool.size(),
            };
            return aim_ir::custom::run(&*custom, n, ins, &host).map_err(|msg| RunError::Node {
                node: n.name.clone(),
                op: format!("{}:{}", n.domain, n.op),
                msg,
            });
        }
        if n.domain.is_empty() {
            if let Some(k) = aim_kernels::fast::kernel(&n.op) {
                let cx = aim_kernels::fast::Ctx { par: &*self.pool, isa: self.isa, blocking: self.blocking, out };
                let node_err = |msg: String| RunError::Node { node: n.name.clone(), op: n.op.clone(), msg };
                let run = || match self.recurrent.get(&i) {
                    Some(w) => w.run(n, ins, &cx),
                    None => k(n, ins, &cx),
                };
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                    Ok(Some(r)) => return r.map_err(|e| node_err(e.0)),
                    Ok(None) => {
                        if let Some(d) = self.declined.get(i) {
                            d.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    Err(e) => return Err(node_err(format!("internal error: {}", panic_message(&*e)))),
                }
            }
        }
        run_node(n, ins, scope)
    }
}
