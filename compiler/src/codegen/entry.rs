//! The entry function of a program's typed steps (`aim_runtime::cpu::EntryOp`): one
//! generated function that runs the whole model in order, with every arena offset, element
//! count and loop address baked in as a constant —
//! `fn(ctx, base: *mut u8, io: *const *mut u8, run_step) -> i64`. A short elementwise loop
//! is called directly, its operand addresses computed from `base` and `io` into a table on
//! the stack; every other step is a call of the runtime's step runner with the step's
//! number. A step that fails ends the function, returning its number plus one.

use super::CodegenError;
use aim_runtime::cpu::{Addr, Entry, EntryOp};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    types, AbiParam, ExtFuncData, ExternalName, Function, InstBuilder, MemFlagsData, Signature, SourceLoc,
    StackSlotData, StackSlotKind, Value,
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
/// For a `listing`, the loops are called by name rather than by their addresses.
pub fn lower_entry(ops: &[EntryOp], listing: bool, func: &mut Function, cfg: TargetFrontendConfig) {
    let ptr = types::I64;
    let call_conv = cfg.default_call_conv;
    let mut fbc = FunctionBuilderContext::new();
    func.signature.returns.push(AbiParam::new(ptr));
    let (mut b, _, p) = super::begin(func, &mut fbc, 4);
    let (ctx, base, io, run_step) = (p[0], p[1], p[2], p[3]);
    // The io table holds one address per input, output and constant (the caller's
    // contract): loads from it and the stores into the loop's table on the stack stay in
    // bounds.
    let flags = MemFlagsData::new().with_notrap().with_aligned();
    let step_sig = b.import_signature(signature(call_conv, 2, true));
    let loop_sig = b.import_signature(signature(call_conv, 4, false));
    let failed = b.create_block();
    b.append_block_param(failed, ptr);
    let addr = |b: &mut FunctionBuilder, a: Addr| -> Value {
        match a {
            Addr::Arena(off) => b.ins().iadd_imm_u(base, off as i64),
            Addr::Io(k) => b.ins().load(ptr, flags, io, (8 * k) as i32),
        }
    };
    for op in ops {
        // Each step's instructions carry its number (plus one) as their source location, so
        // a listing can trace them to the step's node.
        let step = match op {
            EntryOp::Loop { step, .. } | EntryOp::Call { step, .. } => *step,
        };
        b.set_srcloc(SourceLoc::new(step as u32 + 1));
        match op {
            EntryOp::Loop { func: f, ins, out, len, .. } => {
                let table =
                    b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 8 * ins.len() as u32, 3));
                for (k, a) in ins.iter().enumerate() {
                    let v = addr(&mut b, *a);
                    b.ins().stack_store(ptr, v, table, (8 * k) as i32);
                }
                let table = b.ins().stack_addr(ptr, table, 0);
                let dst = addr(&mut b, *out);
                let (start, end) = (b.ins().iconst(ptr, 0), b.ins().iconst(ptr, *len as i64));
                match listing {
                    // A listing names the loop as the code generator does (its address
                    // changes from run to run).
                    true => {
                        let name = ExternalName::testcase(format!("aim_ew_step{step}"));
                        let callee = b.import_function(ExtFuncData {
                            name,
                            signature: loop_sig,
                            colocated: false,
                            patchable: false,
                        });
                        b.ins().call(callee, &[table, dst, start, end]);
                    }
                    false => {
                        let callee = b.ins().iconst(ptr, *f as usize as i64);
                        b.ins().call_indirect(loop_sig, callee, &[table, dst, start, end]);
                    }
                }
            }
            EntryOp::Call { step, .. } => {
                let k = b.ins().iconst(ptr, *step as i64);
                let call = b.ins().call_indirect(step_sig, run_step, &[ctx, k]);
                let r = b.inst_results(call)[0];
                let next = b.create_block();
                let code = b.ins().iconst(ptr, *step as i64 + 1);
                let bad = b.ins().icmp_imm_u(IntCC::NotEqual, r, 0);
                b.ins().brif(bad, failed, &[code.into()], next, &[]);
                b.switch_to_block(next);
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

/// Compiles the entry function for `ops` into memory for `target`.
pub fn compile_entry(ops: &[EntryOp], target: &crate::target::Target) -> Result<Entry, CodegenError> {
    let mut jit = super::Jit::new(target)?;
    let id = super::define(jit.module(), "", "aim_entry", false, |f, cfg| lower_entry(ops, false, f, cfg))?;
    jit.module().finalize_definitions().map_err(|e| CodegenError { node: String::new(), msg: e.to_string() })?;
    let p = jit.module().get_finalized_function(id);
    // SAFETY: the function has exactly this signature (four pointer-sized integers in, one
    // out, the platform C convention).
    let func = unsafe { std::mem::transmute::<*const u8, aim_runtime::cpu::EntryFn>(p) };
    Ok(Entry { func, owner: std::sync::Arc::new(jit) })
}

/// The entry function for `ops` as text — its Cranelift IR and machine code — for
/// `aim explore`.
pub fn entry_text(ops: &[EntryOp], target: &crate::target::Target) -> Result<(String, String), CodegenError> {
    super::function_text("aim_entry", target, |f, cfg| lower_entry(ops, true, f, cfg))
}
