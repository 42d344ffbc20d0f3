//! The entry function of a program's typed steps (`aim_runtime::cpu::EntryOp`): one
//! generated function that runs the whole model in order, with every arena offset, element
//! count and loop address baked in as a constant —
//! `fn(ctx, base: *mut u8, io: *const *mut u8, env: *const EntryEnv) -> i64`. A short
//! elementwise loop is called directly, its operand addresses computed from `base` and `io`
//! into a table on the stack; every other kernel is a call of its kind's entry in the
//! runtime with the step's record (its prepared kernel: packed weights, geometry) and such a
//! table of its operands; a library kernel is a call of the runtime's step runner with the
//! step's number. The JIT bakes the runtime's addresses (entries, records) in as constants;
//! a compiled object, which only learns them at load, reads them from `env`. A step that
//! fails ends the function, returning its number plus one.

use super::CodegenError;
use aim_runtime::cpu::{Addr, Entry, EntryBinding, EntryOp, ENV_KERNELS, ENV_RECS, ENV_RUN_STEP};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    types, AbiParam, ExtFuncData, ExternalName, Function, InstBuilder, MemFlagsData, Signature, SourceLoc,
    StackSlotData, StackSlotKind, UserExternalName, Value,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// A signature of `params` pointer-sized integers, returning one when `returns`.
fn signature(call_conv: CallConv, params: usize, returns: bool) -> Signature {
    let mut sig = Signature::new(call_conv);
    sig.params.extend((0..params).map(|_| AbiParam::new(types::I64)));
    if returns {
        sig.returns.push(AbiParam::new(types::I64));
    }
    sig
}

/// Builds the CLIF of the entry function for `ops`.
///
/// `loops` says how to reach each generated loop, by its node: an address (the JIT), a
/// function of the module (a shared object), a name (a listing). `binding`, when given, is
/// the runtime's addresses to bake in (the JIT); else they are read from `env`.
pub fn lower_entry(
    ops: &[EntryOp],
    loops: &Loops,
    binding: Option<&EntryBinding>,
    func: &mut Function,
    cfg: TargetFrontendConfig,
) {
    let ptr = types::I64;
    let call_conv = cfg.default_call_conv;
    let mut fbc = FunctionBuilderContext::new();
    func.signature.returns.push(AbiParam::new(ptr));
    let (mut b, _, p) = super::begin(func, &mut fbc, 4);
    let (ctx, base, io, env) = (p[0], p[1], p[2], p[3]);
    // The io table holds one address per input, output and constant, `env` the runtime's
    // entries and one record address per step (the caller's contract): loads from them and
    // the stores into the operand tables on the stack stay in bounds.
    let flags = MemFlagsData::new().with_notrap().with_aligned();
    let step_sig = b.import_signature(signature(call_conv, 2, true));
    let loop_sig = b.import_signature(signature(call_conv, 4, false));
    let kernel_sig = b.import_signature(signature(call_conv, 3, true));
    let failed = b.create_block();
    b.append_block_param(failed, ptr);
    let addr = |b: &mut FunctionBuilder, a: Addr| -> Value {
        match a {
            Addr::Arena(off) => b.ins().iadd_imm_u(base, off as i64),
            Addr::Io(k) => b.ins().load(ptr, flags, io, (8 * k) as i32),
        }
    };
    // The address of a runtime entry: baked in, or loaded from `env` at `offset`.
    let runtime_addr = |b: &mut FunctionBuilder, baked: Option<usize>, offset: i32| -> Value {
        match baked {
            Some(a) => b.ins().iconst(ptr, a as i64),
            None => b.ins().load(ptr, flags, env, offset),
        }
    };
    // A call returning a status: a failure ends the function with the step's number.
    let check = |b: &mut FunctionBuilder, r: Value, step: usize| {
        let next = b.create_block();
        let code = b.ins().iconst(ptr, step as i64 + 1);
        let bad = b.ins().icmp_imm_u(IntCC::NotEqual, r, 0);
        b.ins().brif(bad, failed, &[code.into()], next, &[]);
        b.switch_to_block(next);
    };
    for op in ops {
        // Each step's instructions carry its number (plus one) as their source location, so
        // a listing can trace them to the step's node.
        let step = op.step();
        b.set_srcloc(SourceLoc::new(step as u32 + 1));
        match op {
            EntryOp::Loop { node, ins, out, len, .. } => {
                let table =
                    b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 8 * ins.len() as u32, 3));
                for (k, a) in ins.iter().enumerate() {
                    let v = addr(&mut b, *a);
                    b.ins().stack_store(ptr, v, table, (8 * k) as i32);
                }
                let table = b.ins().stack_addr(ptr, table, 0);
                let dst = addr(&mut b, *out);
                let (start, end) = (b.ins().iconst(ptr, 0), b.ins().iconst(ptr, *len as i64));
                let args = [table, dst, start, end];
                let (name, colocated) = match loops {
                    Loops::Addresses(at) => {
                        let callee = b.ins().iconst(ptr, at.get(node).copied().unwrap_or(0) as i64);
                        b.ins().call_indirect(loop_sig, callee, &args);
                        continue;
                    }
                    // As `cranelift_module` names the functions it declares.
                    Loops::Functions(ids) => {
                        let index = ids.get(node).copied().unwrap_or_default();
                        let name = b.func.declare_imported_user_function(UserExternalName { namespace: 0, index });
                        (ExternalName::user(name), true)
                    }
                    // A listing names the loop (its address changes from run to run).
                    Loops::Named => (ExternalName::testcase(format!("aim_ew_node{node}")), false),
                };
                let callee = b.import_function(ExtFuncData { name, signature: loop_sig, colocated, patchable: false });
                b.ins().call(callee, &args);
            }
            EntryOp::Kernel { step, kernel, ops, .. } => {
                let slot = kernel.entry_slot().unwrap_or_default();
                let table = b.create_sized_stack_slot(StackSlotData::new(
                    StackSlotKind::ExplicitSlot,
                    8 * ops.len().max(1) as u32,
                    3,
                ));
                for (k, a) in ops.iter().enumerate() {
                    let v = match a {
                        Some(a) => addr(&mut b, *a),
                        None => b.ins().iconst(ptr, 0),
                    };
                    b.ins().stack_store(ptr, v, table, (8 * k) as i32);
                }
                let table = b.ins().stack_addr(ptr, table, 0);
                let rec = match binding {
                    Some(bd) => b.ins().iconst(ptr, bd.recs.get(*step).copied().unwrap_or(0) as i64),
                    None => {
                        let recs = b.ins().load(ptr, flags, env, ENV_RECS);
                        b.ins().load(ptr, flags, recs, (8 * step) as i32)
                    }
                };
                let f = runtime_addr(&mut b, binding.map(|bd| bd.kernels[slot]), ENV_KERNELS + 8 * slot as i32);
                let call = b.ins().call_indirect(kernel_sig, f, &[ctx, rec, table]);
                let r = b.inst_results(call)[0];
                check(&mut b, r, *step);
            }
            EntryOp::Call { step, .. } => {
                let k = b.ins().iconst(ptr, *step as i64);
                let f = runtime_addr(&mut b, binding.map(|bd| bd.run_step), ENV_RUN_STEP);
                let call = b.ins().call_indirect(step_sig, f, &[ctx, k]);
                let r = b.inst_results(call)[0];
                check(&mut b, r, *step);
            }
        }
    }
    b.set_srcloc(SourceLoc::default());
    let zero = b.ins().iconst(ptr, 0);
    b.ins().return_(&[zero]);
    b.switch_to_block(failed);
    let code = b.block_params(failed)[0];
    b.ins().return_(&[code]);
    b.seal_all_blocks();
    b.finalize(cfg);
}

/// How the entry function reaches the generated loops, by node index.
pub enum Loops {
    /// At these addresses (in memory, generated by the JIT).
    Addresses(std::collections::HashMap<usize, usize>),
    /// As these functions of the module being built (`FuncId::as_u32`), local to it.
    Functions(std::collections::HashMap<usize, u32>),
    /// By name only, for a listing.
    Named,
}

/// Compiles the entry function for `ops` into memory for `target`, calling the loops at
/// the addresses `loop_fn` gives by node and the runtime at the addresses of `binding`.
pub fn compile_entry(
    ops: &[EntryOp],
    loop_fn: impl Fn(usize) -> Option<aim_runtime::cpu::ElementwiseFn>,
    binding: &EntryBinding,
    target: &crate::target::Target,
) -> Result<Entry, CodegenError> {
    let mut at = std::collections::HashMap::new();
    for op in ops {
        if let EntryOp::Loop { node, .. } = op {
            let f = loop_fn(*node).ok_or_else(|| CodegenError {
                node: format!("#{node}"),
                msg: "the entry function calls a loop that was not generated".into(),
            })?;
            at.insert(*node, f as usize);
        }
    }
    let loops = Loops::Addresses(at);
    let mut jit = super::Jit::new(target)?;
    let id =
        super::define(jit.module(), "", "aim_entry", false, |f, cfg| lower_entry(ops, &loops, Some(binding), f, cfg))?;
    jit.module().finalize_definitions().map_err(|e| CodegenError { node: String::new(), msg: e.to_string() })?;
    let p = jit.module().get_finalized_function(id);
    // SAFETY: the function has exactly this signature (four pointer-sized integers in, one
    // out, the platform C convention).
    let func = unsafe { std::mem::transmute::<*const u8, aim_runtime::cpu::EntryFn>(p) };
    Ok(Entry { func, owner: std::sync::Arc::new(jit) })
}

/// The entry function for `ops` as text — its Cranelift IR and machine code — for
/// `aim explore`: the runtime's addresses read from `env` (as a compiled object's do), since
/// the JIT's change from run to run.
pub fn entry_text(ops: &[EntryOp], target: &crate::target::Target) -> Result<(String, String), CodegenError> {
    super::function_text("aim_entry", target, |f, cfg| lower_entry(ops, &Loops::Named, None, f, cfg))
}
