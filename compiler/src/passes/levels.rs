//! Optimisation levels (`-O0` … `-O3`) and passes the user turns off (`--disable-pass`):
//! which passes of a pipeline run. One table says at which level each pass starts, so a
//! new pass is placed by adding its name here (unnamed passes run at `-O2` and up).

use super::Pass;

/// How much of the compiler runs, as ONNX Runtime's graph optimisation levels and GCC's
/// `-O` do: each level adds to the one below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum OptLevel {
    /// No compiled program: every node on its reference kernel, interpreted (the oracle
    /// `--backend reference` runs). For bisecting a wrong result.
    O0,
    /// Graph clean-ups that keep every op as it is: constant folding, simplification,
    /// common subexpressions, dead code, BatchNormalization folded into the convolution
    /// before it; each node then runs on the runtime's library kernel, within the memory
    /// plan.
    O1,
    /// Plus fusion (epilogues, elementwise chains, GELU, layer norms, softmax, attention),
    /// quantized and 4-bit kernels, and packed-weight GEMM and convolution kernels.
    O2,
    /// Plus blocked (NCHWc) layouts and every other pass: the default.
    #[default]
    O3,
}

impl OptLevel {
    /// Every level, lowest first.
    pub const ALL: [OptLevel; 4] = [OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3];

    /// The level `0`..`3` names (`-O2`, `--opt-level 2`).
    pub fn from_number(n: u32) -> Option<OptLevel> {
        OptLevel::ALL.get(n as usize).copied()
    }

    /// The level's number.
    pub fn number(self) -> u32 {
        self as u32
    }
}

/// Which passes run: the level, and passes turned off by name on top of it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Optimization {
    /// The level.
    pub level: OptLevel,
    /// Passes not to run, by their pipeline names (every occurrence of a name).
    pub disabled: Vec<String>,
}

/// Passes the pipeline cannot run without: later passes, the code generator and the
/// runtime read the types they compute.
pub const REQUIRED: [&str; 1] = ["infer-types"];

/// The lowest level a pass runs at.
pub fn min_level(pass: &str) -> OptLevel {
    match pass {
        "half-to-float"
        | "infer-types"
        | "constant-folding"
        | "simplify"
        | "common-subexpressions"
        | "dead-code-elimination"
        | "fold-batchnorm" => OptLevel::O1,
        "layout-nchwc" => OptLevel::O3,
        _ => OptLevel::O2,
    }
}

impl Optimization {
    /// Whether the pass named `pass` runs.
    pub fn runs(&self, pass: &str) -> bool {
        REQUIRED.contains(&pass) || (min_level(pass) <= self.level && !self.disabled.iter().any(|d| d == pass))
    }

    /// The passes of `pipeline` that run, in order.
    pub fn select(&self, pipeline: Vec<Pass>) -> Vec<Pass> {
        pipeline.into_iter().filter(|p| self.runs(p.name)).collect()
    }

    /// Checks the disabled names against `known` (the pipeline's pass names): an unknown
    /// or required pass is an error that lists the ones that may be turned off.
    pub fn check(&self, known: &[&str]) -> Result<(), String> {
        for d in &self.disabled {
            if REQUIRED.contains(&d.as_str()) {
                return Err(format!("'{d}' cannot be disabled: the passes after it and the runtime read its types"));
            }
            if !known.contains(&d.as_str()) {
                let mut names: Vec<&str> = known.iter().copied().filter(|n| !REQUIRED.contains(n)).collect();
                names.sort();
                names.dedup();
                return Err(format!("no pass is named '{d}' (passes: {})", names.join(", ")));
            }
        }
        Ok(())
    }
}
