//! The contract between a plan's typed steps and the entry function the compiler generates
//! for them (`aim_compiler::codegen::lower_entry`): what the function does per step
//! ([`EntryOp`]), how it reaches the runtime ([`EntryEnv`]: the kernel entries and each
//! step's record), and the kernel entries themselves.
//!
//! A step with a kernel — a generated loop run over the pool, a prepared kernel, a byte
//! kernel — is one call of its kind's entry (`extern "C"`, [`KernelFn`]) with the step's
//! record (its operands' types and its prepared kernel: packed weights and geometry, bound
//! at load) and a table of its operands' addresses, which the generated code computes from
//! the arena's base and the io table. Only library steps (fast or reference kernels with
//! the node's op and attributes) go through the step runner by number ([`StepFn`]).

use super::plan::{Plan, RunCtx, Step};
use super::{KernelRef, Loc, Prepared};
use crate::exec::{panic_message, RunError};
use aim_ir::Graph;
use std::collections::HashMap;

/// What the generated entry function does for one step.
#[derive(Clone, Debug)]
pub enum EntryOp {
    /// Calls the generated loop `func` over `len` elements of the operands at `ins`, writing
    /// the operand at `out`, in place (one parallel task's worth).
    Loop {
        /// The step it runs.
        step: usize,
        /// The node whose generated loop it calls.
        node: usize,
        /// Where its inputs are.
        ins: Vec<Addr>,
        /// Where its output goes.
        out: Addr,
        /// Elements.
        len: usize,
    },
    /// Calls the entry of kernel kind `kernel` ([`EntryEnv::kernels`]) with the step's
    /// record and the addresses of its operands: its inputs in node order, then its
    /// outputs (`None`: omitted, passed as null).
    Kernel {
        /// The step it runs.
        step: usize,
        /// Its kind of kernel: a loop run over the pool, a prepared or a byte kernel.
        kernel: KernelRef,
        /// Where its operands are.
        ops: Vec<Option<Addr>>,
        /// The node's name and op, for the listing.
        what: String,
    },
    /// Calls the runtime's step runner ([`StepFn`]) for step `step` (a library kernel).
    Call {
        /// The step it runs.
        step: usize,
        /// The node's name and kernel, for the listing.
        what: String,
    },
}

impl EntryOp {
    /// The step it runs.
    pub fn step(&self) -> usize {
        match self {
            EntryOp::Loop { step, .. } | EntryOp::Kernel { step, .. } | EntryOp::Call { step, .. } => *step,
        }
    }
}

/// An operand's address as the entry function computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    /// The arena's first byte plus this offset.
    Arena(usize),
    /// Entry `k` of the `io` table (inputs, then outputs, then constants).
    Io(usize),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Arena(off) => write!(f, "arena+{off}"),
            Addr::Io(k) => write!(f, "io[{k}]"),
        }
    }
}

/// The runtime's step runner, called by the generated entry function: runs step `step` of
/// the run `ctx` describes; 0 when it succeeded, else 1 (the error is kept in `ctx`).
pub type StepFn = unsafe extern "C" fn(ctx: *const u8, step: usize) -> i64;

/// The entry of a kind of kernel, called by the generated entry function: runs the step
/// whose record is `rec` on the operands at `ops` (inputs, then outputs, null for omitted
/// ones); 0 when it succeeded, else 1 (the error is kept in `ctx`).
pub type KernelFn = unsafe extern "C" fn(ctx: *const u8, rec: *const u8, ops: *const *mut u8) -> i64;

/// The generated entry function of a plan: runs its steps in order, with the run's arena at
/// `base`, the addresses of the inputs, outputs and constants in `io` (in that order), and
/// the runtime's entries in `env`. Returns 0, or the number of the step that failed plus one.
pub type EntryFn = unsafe extern "C" fn(ctx: *const u8, base: *mut u8, io: *const *mut u8, env: *const EntryEnv) -> i64;

/// What the entry function reaches the runtime through: its layout is part of the ABI of
/// compiled objects (`embedded::EMBED_ABI_VERSION`), whose entry functions load from it;
/// the JIT's bake the same values in as constants ([`CpuProgram::entry_binding`]).
#[repr(C)]
pub struct EntryEnv {
    /// The step runner, for library steps.
    pub run_step: StepFn,
    /// The kernel entries, by [`KernelRef::entry_slot`].
    pub kernels: [KernelFn; KERNEL_ENTRIES],
    /// Per step, the address of its record (null for a step without one).
    pub recs: *const *const u8,
}

/// Kinds of kernel with an entry: loops, prepared kernels, byte kernels.
pub const KERNEL_ENTRIES: usize = 3;

/// Byte offsets of [`EntryEnv`]'s fields, for generated code (64-bit targets).
pub const ENV_RUN_STEP: i32 = 0;
/// See [`ENV_RUN_STEP`]: the first kernel entry.
pub const ENV_KERNELS: i32 = 8;
/// See [`ENV_RUN_STEP`]: the records' table.
pub const ENV_RECS: i32 = 8 + 8 * KERNEL_ENTRIES as i32;

impl KernelRef {
    /// Its entry's index in [`EntryEnv::kernels`] (`None`: library steps have none).
    pub fn entry_slot(self) -> Option<usize> {
        match self {
            KernelRef::Loop => Some(0),
            KernelRef::Prepared => Some(1),
            KernelRef::Int8 => Some(2),
            KernelRef::Library => None,
        }
    }
}

/// The runtime's addresses a JIT-compiled entry function bakes in: the step runner, the
/// kernel entries (as [`EntryEnv`] orders them) and each step's record (0 for none).
#[derive(Clone, Debug)]
pub struct EntryBinding {
    /// The step runner.
    pub run_step: usize,
    /// The kernel entries.
    pub kernels: [usize; KERNEL_ENTRIES],
    /// Each step's record.
    pub recs: Vec<usize>,
}

/// A generated entry function and what keeps its code mapped.
pub struct Entry {
    /// The function.
    pub func: EntryFn,
    /// The owner of the code.
    pub owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

/// A step's record, what its kernel entry receives: the step (its operands' shapes and
/// types) and its prepared kernel, bound when the program was built.
pub(super) struct StepRec {
    step: *const Step,
    prepared: *const Prepared,
}

/// The records of a plan's steps, and their addresses by step (0 for library steps).
///
/// The records point into the plan's steps and the program's prepared kernels, which the
/// program owns and never changes after building it (their heap allocations do not move
/// when the program does).
pub(super) struct Records {
    /// The records, which `addrs` points to.
    _recs: Vec<StepRec>,
    addrs: Vec<usize>,
}

// SAFETY: the records only point to data of the program that owns them, which is shared
// between threads as the program is (read only).
unsafe impl Send for Records {}
unsafe impl Sync for Records {}

impl Records {
    /// Records for `plan`'s steps with a kernel entry, bound to their `prepared` kernels.
    pub(super) fn bind(plan: &Plan, prepared: &HashMap<usize, Prepared>) -> Records {
        let mut recs = Vec::new();
        let mut at = Vec::with_capacity(plan.steps.len());
        for s in &plan.steps {
            match (s.kernel.entry_slot(), prepared.get(&s.node)) {
                (Some(_), Some(p)) => {
                    at.push(Some(recs.len()));
                    recs.push(StepRec { step: s, prepared: p });
                }
                _ => at.push(None),
            }
        }
        let addrs = at.iter().map(|k| k.map_or(0, |k| &recs[k] as *const StepRec as usize)).collect();
        Records { _recs: recs, addrs }
    }
}

/// The entries of the kernel kinds, in [`EntryEnv::kernels`]' order.
const KERNELS: [KernelFn; KERNEL_ENTRIES] = [loop_entry, prepared_entry, int8_entry];

impl Plan {
    /// What the entry function does, step by step: loops short enough for one task called
    /// in place, other kernels through their kind's entry, library steps through the step
    /// runner.
    pub(super) fn entry_ops(&self, g: &Graph, inputs: usize) -> Vec<EntryOp> {
        let outputs = self.outputs.len();
        let addr = |l: Loc| match l {
            Loc::Arena(off) => Addr::Arena(off),
            Loc::Input(k) => Addr::Io(k),
            Loc::Output(k) => Addr::Io(inputs + k),
            Loc::Const(k) => Addr::Io(inputs + outputs + k),
        };
        self.steps
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let n = &g.nodes[s.node];
                let op = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
                match (s.kernel, s.outs.first()) {
                    (KernelRef::Loop, Some(Some(y)))
                        if y.elements() <= super::plan::INLINE_LOOP
                            && s.ins.iter().flatten().all(|o| o.shape == y.shape) =>
                    {
                        EntryOp::Loop {
                            step: k,
                            node: s.node,
                            ins: s.ins.iter().flatten().map(|o| addr(o.loc)).collect(),
                            out: addr(y.loc),
                            len: y.elements(),
                        }
                    }
                    (KernelRef::Library, _) => {
                        EntryOp::Call { step: k, what: format!("{} ({op}, {})", n.name, s.kernel.label()) }
                    }
                    (kernel, _) => EntryOp::Kernel {
                        step: k,
                        kernel,
                        ops: s.ins.iter().chain(&s.outs).map(|o| o.as_ref().map(|o| addr(o.loc))).collect(),
                        what: format!("{} ({op})", n.name),
                    },
                }
            })
            .collect()
    }
}

/// A fingerprint of `ops` (FNV-1a over their description): a compiled object records the
/// one its entry function was generated for, and loading checks its own steps have it.
pub fn fingerprint(ops: &[EntryOp]) -> u64 {
    let text = format!("{ops:?}");
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

impl super::CpuProgram {
    /// The addresses a JIT-compiled entry function bakes in (`None` without steps).
    pub fn entry_binding(&self) -> Option<EntryBinding> {
        let recs = self.records.as_ref()?;
        Some(EntryBinding {
            run_step: super::plan::run_step_from_entry as *const () as usize,
            kernels: KERNELS.map(|f| f as usize),
            recs: recs.addrs.clone(),
        })
    }
}

/// The environment an entry function loads from (a compiled object's; the JIT's bake the
/// same values in): the runtime's entries and the addresses of the program's records
/// (`recs`, which the caller keeps alive for the call).
pub(super) fn entry_env(recs: &Records) -> EntryEnv {
    EntryEnv {
        run_step: super::plan::run_step_from_entry,
        kernels: KERNELS,
        recs: recs.addrs.as_ptr() as *const *const u8,
    }
}

/// What every kernel entry does: takes its context, record and operand table back, runs
/// `run` on them, and keeps its error (or a panic's message) in the context.
///
/// # Safety
/// `ctx` is the context the runtime gave the entry function, `rec` a record of
/// [`Records::bind`] of the same program, `ops` a table of the step's operand addresses.
unsafe fn kernel_entry(
    ctx: *const u8,
    rec: *const u8,
    ops: *const *mut u8,
    run: impl FnOnce(&super::CpuProgram, &Step, &Prepared, &[*mut u8]) -> Result<(), String>,
) -> i64 {
    // SAFETY: by the contract above; the records outlive the run, and the table holds one
    // address per input and output of the step.
    let cx = unsafe { &*(ctx as *const RunCtx) };
    if rec.is_null() {
        // A step the entry function was generated to call a kernel for has none here.
        let e = RunError::Node { node: String::new(), op: String::new(), msg: "a kernel step has no record".into() };
        *cx.error.borrow_mut() = Some(e);
        return 1;
    }
    // SAFETY: as above.
    let r = unsafe { &*(rec as *const StepRec) };
    let (s, p) = unsafe { (&*r.step, &*r.prepared) };
    let ops = unsafe { std::slice::from_raw_parts(ops, s.ins.len() + s.outs.len()) };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cx.prog, s, p, ops)))
        .unwrap_or_else(|e| Err(format!("internal error: {}", panic_message(&*e))));
    match result {
        Ok(()) => 0,
        Err(msg) => {
            let n = &cx.prog.graph.nodes[s.node];
            let e = RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg };
            *cx.error.borrow_mut() = Some(e);
            1
        }
    }
}

/// The entry of generated loops run over the pool ([`KernelFn`]).
unsafe extern "C" fn loop_entry(ctx: *const u8, rec: *const u8, ops: *const *mut u8) -> i64 {
    // SAFETY: the generated entry function passes what the runtime gave it.
    unsafe { kernel_entry(ctx, rec, ops, |prog, s, p, ops| prog.loop_step(s, p, ops)) }
}

/// The entry of prepared kernels ([`KernelFn`]).
unsafe extern "C" fn prepared_entry(ctx: *const u8, rec: *const u8, ops: *const *mut u8) -> i64 {
    // SAFETY: as for `loop_entry`.
    unsafe { kernel_entry(ctx, rec, ops, |prog, s, p, ops| prog.prepared_step(s, p, ops)) }
}

/// The entry of byte kernels ([`KernelFn`]).
unsafe extern "C" fn int8_entry(ctx: *const u8, rec: *const u8, ops: *const *mut u8) -> i64 {
    // SAFETY: as for `loop_entry`.
    unsafe { kernel_entry(ctx, rec, ops, |prog, s, p, ops| prog.int8_step(s, p, ops)) }
}
