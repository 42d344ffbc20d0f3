//! Shape specialisation, the JIT's normal mode: a model whose inputs have symbolic dims is
//! compiled again, with every dim bound, for each input-shape signature it meets (on first
//! use, or at load for the signatures `Options::shapes` names). With the dims bound,
//! constant folding removes the shape arithmetic of exported models, and fusion, the
//! blocked layout, the memory plan and the generated code all see static shapes. Programs
//! are cached per signature (the most recently used `Options::shape_cache` of them); runs
//! arriving together with one new signature compile it once (the others wait for that
//! compile, runs of other signatures do not), and a signature whose specialisation fails
//! runs the shape-generic program.

use crate::Error;
use aim_ir::{Dim, Graph, Tensor, ValueType};
use aim_runtime::cpu::CpuProgram;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// Programs kept by default: the most recently used signatures.
pub const DEFAULT_CAPACITY: usize = 8;

/// One input-shape signature: the shape of every graph input, in order.
pub type Signature = Vec<Vec<usize>>;

/// A signature's program, compiled once by whichever run asks first (`None`: specialising
/// failed, the generic program runs).
type Slot = Arc<OnceLock<Option<Arc<CpuProgram>>>>;

/// What specialising needs: the imported graph (with its weights) and the compile settings.
pub(crate) struct Specializer {
    graph: Graph,
    target: aim_compiler::target::Target,
    pool: Arc<aim_runtime::pool::ThreadPool>,
    path: String,
    capacity: usize,
    /// Most recently used first.
    cache: Mutex<Vec<(Signature, Slot)>>,
}

/// Whether a graph has inputs of symbolic or unknown dims (then each input shape gets a
/// program of its own).
pub(crate) fn worthwhile(input: &Graph) -> bool {
    input.inputs.iter().any(|v| v.ty.shape.as_ref().is_none_or(|s| s.iter().any(|d| !matches!(d, Dim::Known(_)))))
}

impl Specializer {
    pub(crate) fn new(
        graph: Graph,
        target: aim_compiler::target::Target,
        pool: Arc<aim_runtime::pool::ThreadPool>,
        path: &Path,
        capacity: usize,
    ) -> Specializer {
        Specializer {
            graph,
            target,
            pool,
            path: path.display().to_string(),
            capacity: capacity.max(1),
            cache: Mutex::new(Vec::new()),
        }
    }

    /// The signature of these inputs, if every graph input is given.
    fn signature(&self, inputs: &HashMap<String, Tensor>) -> Option<Signature> {
        self.graph.inputs.iter().map(|v| inputs.get(&v.name).map(|t| t.shape().to_vec())).collect()
    }

    /// The program for these inputs: cached, compiled now, or None (run the generic one).
    pub(crate) fn program_for(&self, inputs: &HashMap<String, Tensor>) -> Option<Arc<CpuProgram>> {
        let sig = self.signature(inputs)?;
        // Shapes the declared types refuse get no program: the generic one reports them.
        if !fits(&self.graph, &sig) {
            return None;
        }
        self.slot(sig.clone()).get_or_init(|| self.compile_now(&sig)).clone()
    }

    /// Compiles `sig` now (at load, for `Options::shapes`), returning the error if it fails.
    pub(crate) fn compile_eagerly(&self, sig: Signature) -> Result<(), Error> {
        let slot = self.slot(sig.clone());
        let mut err = None;
        slot.get_or_init(|| match self.compile(&sig) {
            Ok(p) => Some(Arc::new(p)),
            Err(e) => {
                err = Some(e);
                None
            }
        });
        err.map_or(Ok(()), Err)
    }

    /// The cache slot of `sig`, made most recent (and the least recent dropped past the
    /// capacity). The lock is held only for this lookup, never while compiling.
    fn slot(&self, sig: Signature) -> Slot {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let entry = match cache.iter().position(|(s, _)| *s == sig) {
            Some(at) => cache.remove(at),
            None => (sig, Arc::new(OnceLock::new())),
        };
        let slot = entry.1.clone();
        cache.insert(0, entry);
        cache.truncate(self.capacity);
        slot
    }

    fn compile_now(&self, sig: &Signature) -> Option<Arc<CpuProgram>> {
        self.compile(sig).ok().map(Arc::new)
    }

    /// The signatures compiled so far (most recent first) with each specialised graph,
    /// `None` where specialising failed (or is still under way).
    pub(crate) fn compiled(&self) -> Vec<(Signature, Option<Graph>)> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.iter().map(|(s, p)| (s.clone(), p.get().and_then(|p| p.as_ref()).map(|p| p.graph().clone()))).collect()
    }

    /// The most recently used specialised program, if one compiled.
    pub(crate) fn latest(&self) -> Option<Arc<CpuProgram>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.first().and_then(|(_, p)| p.get().cloned().flatten())
    }

    /// The shape-generic program (inputs of the declared types, symbolic dims kept).
    pub(crate) fn compile_generic(&self) -> Result<CpuProgram, Error> {
        crate::compile_cpu(self.graph.clone(), &self.target, &self.pool, &self.path)
    }

    fn compile(&self, sig: &Signature) -> Result<CpuProgram, Error> {
        let mut g = self.graph.clone();
        bind(&mut g, sig, &self.path)?;
        crate::compile_cpu(g, &self.target, &self.pool, &self.path)
    }
}

/// Gives the graph's inputs the shapes of `sig` and infers every type again from them: the
/// graph a specialised program is compiled from (`aim explore --shape` prints it).
pub(crate) fn bind(g: &mut Graph, sig: &Signature, path: &str) -> Result<(), Error> {
    for (v, shape) in g.inputs.iter_mut().zip(sig) {
        let dtype = v.ty.dtype;
        v.ty = ValueType { dtype, shape: Some(shape.iter().map(|&d| Dim::Known(d)).collect()) };
    }
    // Types inferred with the dims symbolic would be kept over the static ones.
    g.value_types.clear();
    aim_ir::infer::infer_types(g).map_err(|cause| Error::Infer { path: path.to_string(), cause })?;
    Ok(())
}

/// Whether a signature fits the graph's declared input types: ranks, known dims, and each
/// symbolic dim one size across all inputs.
pub(crate) fn fits(g: &Graph, sig: &Signature) -> bool {
    let mut syms: HashMap<&str, usize> = HashMap::new();
    g.inputs.len() == sig.len()
        && g.inputs.iter().zip(sig).all(|(v, shape)| match &v.ty.shape {
            None => true,
            Some(dims) => {
                dims.len() == shape.len()
                    && dims.iter().zip(shape).all(|(d, &s)| match d {
                        Dim::Known(k) => *k == s,
                        Dim::Sym(name) => *syms.entry(name.as_str()).or_insert(s) == s,
                        Dim::Unknown => true,
                    })
            }
        })
}
