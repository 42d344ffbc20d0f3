//! `--memory-budget`: fitting a program's peak resident memory under a size the user
//! gives. After loading, the process holds its code, its runtime and the weights packed at
//! load; each run adds its arena of intermediate values, and the weights its kernels read
//! in place from a memory-mapped model file (a `.aim` file's prepacked dense and
//! convolution weights) as their pages are touched. Those pages can be handed back to the
//! kernel after each use and read again from the page cache on the next run, so that only
//! the weights of the node running count: the planner chooses, largest first, as few of
//! them as the budget needs, and says what it chose, what the peak should be and what is
//! read again per run. A budget that cannot be met is an error with the breakdown.
//!
//! Weights packed at load (an ONNX model's) live in ordinary memory, which cannot be handed
//! back without losing them: for such models the error says to compile a `.aim` file (whose
//! weights are read in place) or to store the weights smaller (`--weights int8|f16`).

use crate::Error;
use aim_runtime::cpu::CpuProgram;

const MIB: f64 = (1 << 20) as f64;

/// The resident memory of this process now, in bytes (Linux: `VmRSS` of `/proc/self/status`).
fn resident_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// What the planner chose for one program under a budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The budget, in bytes.
    pub budget: usize,
    /// Resident bytes after loading: code, runtime, weights packed in memory.
    pub loaded: usize,
    /// Bytes of the arena a run adds, with its inputs and outputs.
    pub arena: usize,
    /// Bytes of weights the kernels read in place from the mapped model file.
    pub mapped: usize,
    /// Of those, the bytes handed back after each use (read again on every run).
    pub released: usize,
    /// How many weights are handed back.
    pub released_weights: usize,
    /// The expected peak resident bytes of a run.
    pub peak: usize,
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = |b: usize| b as f64 / MIB;
        write!(
            f,
            "memory budget {:.1} MiB: expected peak {:.1} MiB = {:.1} loaded (code, runtime, weights packed in memory) + {:.1} intermediates, inputs and outputs + {:.1} of the {:.1} MiB of weights read from the model file",
            m(self.budget),
            m(self.peak),
            m(self.loaded),
            m(self.arena),
            m(self.peak - self.loaded - self.arena),
            m(self.mapped),
        )?;
        if self.released > 0 {
            write!(
                f,
                "; {} weights ({:.1} MiB) are handed back after each use and read again from the page cache on every run",
                self.released_weights,
                m(self.released)
            )
        } else {
            write!(f, "; nothing needs handing back")
        }
    }
}

/// Checks that the process, with a model loaded, is under `budget` bytes: the error names
/// `path` and what is resident.
pub(crate) fn check_loaded(budget: usize, path: &str) -> Result<(), Error> {
    match resident_bytes() {
        Some(loaded) if loaded > budget => Err(Error::BadOption {
            option: "memory-budget",
            reason: format!(
                "{path}: a budget of {:.1} MiB cannot be met: {:.1} MiB are resident once the model is loaded (code, runtime, weights packed in memory), before any run",
                budget as f64 / MIB,
                loaded as f64 / MIB
            ),
        }),
        _ => Ok(()),
    }
}

/// Fits `prog` under `budget` bytes: chooses which nodes hand their mapped weights back
/// after each use (the largest first, as few as the budget needs), tells the program, and
/// returns the plan; or the error naming `path` with the breakdown, when even handing
/// back every mapped weight leaves the peak above the budget.
pub(crate) fn fit(prog: &CpuProgram, budget: usize, path: &str) -> Result<Plan, Error> {
    let bad = |reason: String| Error::BadOption { option: "memory-budget", reason: format!("{path}: {reason}") };
    let loaded = resident_bytes()
        .ok_or_else(|| bad("the process's resident memory cannot be read here (it needs Linux's /proc)".into()))?;
    // The arena, and the inputs a caller passes and the outputs a run returns.
    let arena = prog.arena_bytes() + prog.io_bytes();
    let mut weights = prog.mapped_weights();
    let mapped: usize = weights.iter().map(|&(_, b, _)| b).sum();
    // Largest first: each one handed back saves its bytes but what it makes resident while
    // its step runs (all of it, but a few rows of a table a Gather reads).
    weights.sort_by_key(|&(w, b, _)| (std::cmp::Reverse(b), w));
    let peak_with = |n: usize| {
        let released: usize = weights[..n].iter().map(|&(_, b, _)| b).sum();
        let in_flight = weights[..n].iter().map(|&(_, _, t)| t).max().unwrap_or(0);
        loaded + arena + mapped - released + in_flight
    };
    let Some(n) = (0..=weights.len()).find(|&n| peak_with(n) <= budget) else {
        let least = peak_with(weights.len());
        let m = |b: usize| b as f64 / MIB;
        // An ONNX model's weights are packed into memory at load; a `.aim` file's are read
        // from the file, and only smaller weights help.
        let hint = if crate::compiled::is_aim_file(std::path::Path::new(path)) {
            "store the weights smaller: aim compile --weights int8|f16"
        } else {
            "weights packed at load stay in memory: compile the model with `aim compile` so that its weights are read from the file, or store them smaller with --weights int8|f16"
        };
        return Err(bad(format!(
            "a budget of {:.1} MiB cannot be met: a run needs at least {:.1} MiB = {:.1} loaded (code, runtime, weights packed in memory) + {:.1} intermediates, inputs and outputs + {:.1} for the weight read from the model file that is largest while in use ({:.1} MiB read so, all handed back between uses); {hint}",
            m(budget),
            m(least),
            m(loaded),
            m(arena),
            m(least - loaded - arena),
            m(mapped),
        )));
    };
    for &(w, _, _) in &weights[..n] {
        prog.release_after_use(w);
    }
    let released = weights[..n].iter().map(|&(_, b, _)| b).sum();
    Ok(Plan { budget, loaded, arena, mapped, released, released_weights: n, peak: peak_with(n) })
}
