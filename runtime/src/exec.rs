//! The reference executor: a graph, its inputs and an enclosing scope in, outputs out.

use aim_ir::{Attr, Dim, Graph, Node, Tensor};
use std::collections::HashMap;

/// Why a run failed: a bad input, or a node that failed on its inputs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// A graph input was not given.
    #[error("input '{name}' is missing (expected {expected})")]
    MissingInput { name: String, expected: String },
    /// A given input does not match the graph's declared type.
    #[error("input '{name}': {reason}")]
    BadInput { name: String, reason: String },
    /// A node failed.
    #[error("node '{node}' ({op}): {msg}")]
    Node { node: String, op: String, msg: String },
    /// A value the graph needs was never computed.
    #[error("value '{name}' is needed but was never computed")]
    Missing { name: String },
    /// The thread pool could not be started.
    #[error("cannot start {threads} threads: {reason}")]
    Threads { threads: usize, reason: String },
    /// The run was stopped because it took longer than its time limit.
    #[error("the run was stopped at node '{node}': it took longer than its time limit of {limit:?}")]
    TimedOut { node: String, limit: std::time::Duration },
}

/// Bounds on one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// The longest the run may take: checked before every node and every loop iteration
    /// (a kernel already running is not interrupted). `None`: no limit.
    pub timeout: Option<std::time::Duration>,
}

/// When a run must stop, and the limit that set it (for the error).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    at: std::time::Instant,
    limit: std::time::Duration,
}

impl Deadline {
    /// The deadline of a run starting now, if it has a time limit.
    pub(crate) fn start(opts: &RunOptions) -> Option<Deadline> {
        let limit = opts.timeout?;
        let at = std::time::Instant::now().checked_add(limit)?;
        Some(Deadline { at, limit })
    }

    /// An error naming `node` once the deadline has passed.
    pub(crate) fn check(d: Option<Deadline>, node: &str) -> Result<(), RunError> {
        match d {
            Some(d) if std::time::Instant::now() >= d.at => {
                Err(RunError::TimedOut { node: node.to_string(), limit: d.limit })
            }
            _ => Ok(()),
        }
    }
}

/// Values visible to a graph: its own, then those of the graphs around it.
pub(crate) struct Scope<'a> {
    pub values: HashMap<String, Tensor>,
    pub parent: Option<&'a Scope<'a>>,
    /// When the run this scope belongs to must stop.
    pub deadline: Option<Deadline>,
}

impl Scope<'_> {
    /// An error once the run's deadline has passed (loops check it every iteration).
    pub(crate) fn check_deadline(&self) -> Result<(), String> {
        match Deadline::check(self.deadline, "") {
            Err(RunError::TimedOut { limit, .. }) => Err(format!("it took longer than its time limit of {limit:?}")),
            _ => Ok(()),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Tensor> {
        self.values.get(name).or_else(|| self.parent.and_then(|p| p.get(name)))
    }
}

/// Checks `t` against the declared type of input `name`, binding symbolic dims in `syms`.
pub(crate) fn check_input(
    name: &str,
    decl: &aim_ir::ValueType,
    t: &Tensor,
    syms: &mut HashMap<String, usize>,
) -> Result<(), RunError> {
    let bad = |reason: String| RunError::BadInput { name: name.to_string(), reason };
    if let Some(d) = decl.dtype {
        if d != t.dtype() {
            return Err(bad(format!("expected element type {d}, got {}", t.dtype())));
        }
    }
    if let Some(dims) = &decl.shape {
        if dims.len() != t.rank() {
            return Err(bad(format!("expected shape {decl}, got rank {} shape {:?}", t.rank(), t.shape())));
        }
        for (i, (d, &a)) in dims.iter().zip(t.shape()).enumerate() {
            match d {
                Dim::Known(k) if *k != a => {
                    return Err(bad(format!(
                        "dimension {i} must be {k}, got {a} (expected {decl}, got {:?})",
                        t.shape()
                    )))
                }
                Dim::Sym(s) => {
                    let bound = *syms.entry(s.clone()).or_insert(a);
                    if bound != a {
                        return Err(bad(format!(
                            "dimension {i} is '{s}', already bound to {bound} by another input, got {a}"
                        )));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The message of a caught panic, for the error that reports it.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// Executes one node: the reference kernels, or a backend's compiled form of the node.
pub(crate) trait Runner {
    /// Runs node `index` of the graph being executed.
    fn run(&self, index: usize, n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError>;
}

/// The reference kernels.
pub(crate) struct Reference;

impl Runner for Reference {
    fn run(&self, _index: usize, n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError> {
        run_node(n, ins, scope)
    }
}

/// Runs `g` on `inputs` (by graph input name) and returns its outputs in order.
pub fn run_graph(g: &Graph, inputs: HashMap<String, Tensor>) -> Result<Vec<Tensor>, RunError> {
    run_graph_with(g, inputs, &RunOptions::default())
}

/// Runs `g` on `inputs` within the bounds of `opts`.
pub fn run_graph_with(g: &Graph, inputs: HashMap<String, Tensor>, opts: &RunOptions) -> Result<Vec<Tensor>, RunError> {
    run_with(g, inputs, None, Deadline::start(opts), &Reference, None, None)
}

/// A run's outputs, and every value its nodes made, by name, in the order they were made.
pub type Capture = (Vec<Tensor>, Vec<(String, Tensor)>);

/// Runs `g` on `inputs` keeping every value a node of `g` makes (not those inside
/// subgraphs), in the order they were made: what `aim compare` compares.
pub fn run_graph_capture(g: &Graph, inputs: HashMap<String, Tensor>, opts: &RunOptions) -> Result<Capture, RunError> {
    let mut kept = Vec::new();
    let outs = run_with(g, inputs, None, Deadline::start(opts), &Reference, None, Some(&mut kept))?;
    Ok((outs, kept))
}

pub(crate) fn run_scoped(
    g: &Graph,
    inputs: HashMap<String, Tensor>,
    parent: Option<&Scope>,
) -> Result<Vec<Tensor>, RunError> {
    run_with(g, inputs, parent, parent.and_then(|p| p.deadline), &Reference, None, None)
}

/// Runs `g` on the reference kernels, recording every node's time.
pub fn run_graph_profiled(
    g: &Graph,
    inputs: HashMap<String, Tensor>,
    opts: &RunOptions,
) -> Result<(Vec<Tensor>, Vec<NodeTiming>), RunError> {
    let mut p = Vec::new();
    let outs = run_with(g, inputs, None, Deadline::start(opts), &Reference, Some(&mut p), None)?;
    Ok((outs, p))
}

/// One node's execution, as a profile records it.
#[derive(Debug, Clone)]
pub struct NodeTiming {
    /// The node's name.
    pub node: String,
    /// Its op (`domain:op` outside the default domain).
    pub op: String,
    /// Start, from the beginning of the run.
    pub start: std::time::Duration,
    /// How long it took.
    pub time: std::time::Duration,
}

/// Runs `g` with `runner` executing its nodes (subgraphs always run on the reference),
/// recording each node's time into `profile` when given.
pub(crate) fn run_with(
    g: &Graph,
    mut inputs: HashMap<String, Tensor>,
    parent: Option<&Scope>,
    deadline: Option<Deadline>,
    runner: &dyn Runner,
    mut profile: Option<&mut Vec<NodeTiming>>,
    mut capture: Option<&mut Vec<(String, Tensor)>>,
) -> Result<Vec<Tensor>, RunError> {
    let run_start = std::time::Instant::now();
    let mut syms = HashMap::new();
    let mut scope = Scope { values: HashMap::new(), parent, deadline };
    for i in &g.inputs {
        let t = inputs
            .remove(&i.name)
            .ok_or_else(|| RunError::MissingInput { name: i.name.clone(), expected: i.ty.to_string() })?;
        check_input(&i.name, &i.ty, &t, &mut syms)?;
        scope.values.insert(i.name.clone(), t);
    }
    for (k, t) in &g.initializers {
        scope.values.entry(k.clone()).or_insert_with(|| t.clone());
    }
    // Last use of each value (the shared liveness rule), so intermediates are freed as
    // soon as possible.
    let last_use = aim_ir::liveness::last_reads(g);
    let keep: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    for (i, n) in g.nodes.iter().enumerate() {
        let ins: Vec<Option<Tensor>> = n
            .inputs
            .iter()
            .map(|name| {
                if name.is_empty() {
                    Ok(None)
                } else {
                    scope.get(name).cloned().map(Some).ok_or_else(|| RunError::Missing { name: name.clone() })
                }
            })
            .collect::<Result<_, _>>()?;
        Deadline::check(deadline, &n.name)?;
        let t = std::time::Instant::now();
        let outs = runner.run(i, n, &ins, &scope)?;
        if let Some(p) = profile.as_deref_mut() {
            let op = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
            p.push(NodeTiming { node: n.name.clone(), op, start: t - run_start, time: t.elapsed() });
        }
        let mut read = Vec::new();
        for a in n.attrs.values() {
            if let Attr::Graph(sub) = a {
                sub.names_read(&mut read);
            }
        }
        for name in n.inputs.iter().chain(&read) {
            if last_use.get(name.as_str()) == Some(&i)
                && !keep.contains(&name.as_str())
                && !g.initializers.contains_key(name)
            {
                scope.values.remove(name);
            }
        }
        for (name, t) in n.outputs.iter().zip(outs) {
            if !name.is_empty() {
                if let Some(c) = capture.as_deref_mut() {
                    c.push((name.clone(), t.clone()));
                }
                scope.values.insert(name.clone(), t);
            }
        }
    }
    g.outputs
        .iter()
        .map(|o| scope.get(&o.name).cloned().ok_or_else(|| RunError::Missing { name: o.name.clone() }))
        .collect()
}

/// Runs one node with its reference kernel (or, for control flow, its subgraphs).
pub(crate) fn run_node(n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError> {
    let fail = |msg: String| RunError::Node { node: n.name.clone(), op: n.op.clone(), msg };
    if let Some(custom) = aim_ir::custom::lookup(&n.domain, &n.op) {
        return aim_ir::custom::run(&*custom, n, ins, &aim_ir::custom::Host::sequential())
            .map_err(|msg| RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg });
    }
    if !matches!(n.domain.as_str(), "" | "ai.onnx") {
        return Err(fail(format!("op domain '{}' is not supported", n.domain)));
    }
    let outs = match n.op.as_str() {
        "If" => crate::control::run_if(n, ins, scope)?,
        "Loop" => crate::control::run_loop(n, ins, scope)?,
        "Scan" => crate::control::run_scan(n, ins, scope)?,
        op => {
            let k = aim_kernels::kernel(op).ok_or_else(|| fail("no kernel for this op".into()))?;
            // A kernel that panics has a bug; the user still gets an error naming the node.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| k(n, ins))) {
                Ok(r) => r.map_err(|e| fail(e.0))?,
                Err(p) => return Err(fail(format!("internal error in the reference kernel: {}", panic_message(&*p)))),
            }
        }
    };
    let wanted = n.outputs.iter().rposition(|o| !o.is_empty()).map_or(0, |p| p + 1);
    if outs.len() < wanted {
        return Err(fail(format!("produced {} outputs, the node names {}", outs.len(), n.outputs.len())));
    }
    Ok(outs)
}
