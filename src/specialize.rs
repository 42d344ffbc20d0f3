//! Shape specialisation: a model whose inputs have symbolic dims is compiled once with those
//! dims symbolic (its kernels bind sizes at run time), and — when the optimised graph still
//! computes shapes at run time (Shape or Size nodes, typically feeding Reshape targets in
//! exported transformers) — once more per input-shape signature on first use: with the dims
//! bound, constant folding removes the shape arithmetic, and the passes and memory plan see
//! static shapes. Compiled programs are cached per signature (the last few used), so a new
//! shape compiles once; a signature whose specialisation fails runs the generic program.

use crate::Error;
use aim_ir::{Dim, Graph, Tensor, ValueType};
use aim_runtime::cpu::CpuProgram;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Programs kept: the most recently used signatures.
const CAPACITY: usize = 4;

/// One input-shape signature: the shape of every graph input, in order.
pub type Signature = Vec<Vec<usize>>;

/// What specialising needs: the imported graph (with its weights) and the compile settings.
pub(crate) struct Specializer {
    graph: Graph,
    target: aim_compiler::target::Target,
    threads: usize,
    path: String,
    /// Most recently used first; `None` where specialising failed.
    cache: Mutex<Vec<(Signature, Option<Arc<CpuProgram>>)>>,
}

/// Whether a graph (optimised with symbolic dims) would gain from static shapes: it still
/// computes shapes at run time.
pub(crate) fn worthwhile(input: &Graph, optimized: &Graph) -> bool {
    let symbolic =
        input.inputs.iter().any(|v| v.ty.shape.as_ref().is_none_or(|s| s.iter().any(|d| !matches!(d, Dim::Known(_)))));
    symbolic && optimized.nodes.iter().any(|n| n.domain.is_empty() && matches!(n.op.as_str(), "Shape" | "Size"))
}

impl Specializer {
    pub(crate) fn new(graph: Graph, target: aim_compiler::target::Target, threads: usize, path: &Path) -> Specializer {
        Specializer { graph, target, threads, path: path.display().to_string(), cache: Mutex::new(Vec::new()) }
    }

    /// The program for these inputs: cached, compiled now, or None (run the generic one).
    pub(crate) fn program_for(&self, inputs: &HashMap<String, Tensor>) -> Option<Arc<CpuProgram>> {
        let sig: Signature =
            self.graph.inputs.iter().map(|v| inputs.get(&v.name).map(|t| t.shape().to_vec())).collect::<Option<_>>()?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = cache.iter().position(|(s, _)| *s == sig) {
            let hit = cache.remove(at);
            let prog = hit.1.clone();
            cache.insert(0, hit);
            return prog;
        }
        // Compiled under the lock: concurrent first runs of one new shape compile it once.
        let prog = self.compile(&sig).ok().map(Arc::new);
        cache.insert(0, (sig, prog.clone()));
        cache.truncate(CAPACITY);
        prog
    }

    /// The signatures compiled so far (most recent first) with the node count of each
    /// specialised graph, `None` where specialising failed.
    pub(crate) fn compiled(&self) -> Vec<(Signature, Option<Graph>)> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.iter().map(|(s, p)| (s.clone(), p.as_ref().map(|p| p.graph().clone()))).collect()
    }

    fn compile(&self, sig: &Signature) -> Result<CpuProgram, Error> {
        let mut g = self.graph.clone();
        for (v, shape) in g.inputs.iter_mut().zip(sig) {
            let dtype = v.ty.dtype;
            v.ty = ValueType { dtype, shape: Some(shape.iter().map(|&d| Dim::Known(d)).collect()) };
        }
        // Types inferred with the dims symbolic would be kept over the static ones.
        g.value_types.clear();
        aim_ir::infer::infer_types(&mut g).map_err(|cause| Error::Infer { path: self.path.clone(), cause })?;
        crate::compile_cpu(g, &self.target, self.threads, &self.path)
    }
}
