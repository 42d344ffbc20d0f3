//! Graph passes: each a named function over the graph that the pass manager runs in order,
//! timing each and (on request) keeping the graph after each for printing.

mod const_fold;
mod dce;
mod fold_batchnorm;
mod fuse;
mod fuse_elementwise;
mod uses;

pub use fuse::{ACTIVATION, CLIP_MAX, CLIP_MIN, SOURCES};

use aim_ir::Graph;
use std::time::{Duration, Instant};

/// Why a pass failed (a node it evaluated at compile time failed on its constants).
#[derive(Debug, thiserror::Error)]
#[error("pass {pass}: {msg}")]
pub struct PassError {
    /// The pass.
    pub pass: &'static str,
    /// What went wrong, naming the node.
    pub msg: String,
}

/// A pass: a name and a function that rewrites the graph in place.
pub struct Pass {
    /// Its name, as `aim explore --passes` prints it.
    pub name: &'static str,
    /// The rewrite.
    pub run: fn(&mut Graph) -> Result<(), PassError>,
}

/// The CPU pipeline, in order.
pub const CPU_PIPELINE: &[Pass] = &[
    Pass { name: "infer-types", run: infer },
    Pass { name: "constant-folding", run: const_fold::run },
    Pass { name: "dead-code-elimination", run: dce::run },
    Pass { name: "fold-batchnorm", run: fold_batchnorm::run },
    Pass { name: "fuse-epilogues", run: fuse::run },
    Pass { name: "infer-types", run: infer },
    Pass { name: "fuse-elementwise", run: fuse_elementwise::run },
    Pass { name: "dead-code-elimination", run: dce::run },
    Pass { name: "infer-types", run: infer },
];

fn infer(g: &mut Graph) -> Result<(), PassError> {
    aim_ir::infer::infer_types(g).map_err(|e| PassError { pass: "infer-types", msg: e.to_string() })
}

/// What one pass did.
#[derive(Debug, Clone)]
pub struct PassRecord {
    /// The pass.
    pub name: &'static str,
    /// Wall time it took.
    pub time: Duration,
    /// The graph after it, when asked for.
    pub after: Option<Graph>,
}

/// Runs `passes` over `g`, returning a record per pass (with snapshots if `keep`).
pub fn run_pipeline(g: &mut Graph, passes: &[Pass], keep: bool) -> Result<Vec<PassRecord>, PassError> {
    let mut out = Vec::new();
    for p in passes {
        let t = Instant::now();
        (p.run)(g)?;
        out.push(PassRecord { name: p.name, time: t.elapsed(), after: keep.then(|| g.clone()) });
    }
    Ok(out)
}
