//! Code generation with Cranelift: functions compiled for the target into memory (JIT), the
//! module kept alive as long as any program uses its code.
//!
//! It generates the fused elementwise loops (`elementwise.rs`), row reductions
//! (`reduce.rs`), transposes (`transpose.rs`) and the portable GEMM microkernel
//! (`micro.rs`), written against the `cranelift_module::Module` trait: the JIT module here,
//! an object module for ahead-of-time compilation (`aot.rs`: `aim compile --target`).

mod aot;
mod elementwise;
mod entry;
mod micro;
mod reduce;
mod transpose;

pub use aot::{emit_object, isa_for_triple, ObjectProgram};
pub use elementwise::{compile_elementwise, lower_elementwise};
pub use entry::{compile_entry, entry_text, lower_entry, Loops};
pub use reduce::{compile_reduce, lower_reduce, ReduceMode};
pub use transpose::{compile_transpose, lower_transpose};

use crate::target::Target;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};

/// Why code could not be generated.
#[derive(Debug, thiserror::Error)]
#[error("code generation for node '{node}': {msg}")]
pub struct CodegenError {
    /// The node being compiled (empty for module-level failures).
    pub node: String,
    /// What went wrong.
    pub msg: String,
}

/// The Cranelift ISA for a target: the host's, with `opt_level=speed` and the features the
/// target (capped by `--cpu`) does not have turned off.
pub fn isa_for(target: &Target) -> Result<OwnedTargetIsa, CodegenError> {
    let err = |msg: String| CodegenError { node: String::new(), msg };
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").map_err(|e| err(e.to_string()))?;
    let mut isa = cranelift_native::builder().map_err(|e| err(e.to_string()))?;
    if target.arch == "x86_64" {
        let f = &target.features;
        let caps = [
            ("has_sse41", f.sse41),
            ("has_sse42", f.sse42),
            ("has_avx", f.avx),
            ("has_avx2", f.avx2),
            ("has_fma", f.fma),
            ("has_avx512f", f.avx512f),
            ("has_avx512vl", f.avx512vl),
            ("has_avx512dq", f.avx512dq),
        ];
        for (name, on) in caps {
            if !on {
                isa.set(name, "false").map_err(|e| err(format!("{name}: {e}")))?;
            }
        }
    }
    isa.finish(settings::Flags::new(flags)).map_err(|e| err(e.to_string()))
}

/// What one generated function is for.
enum Kind {
    Elementwise,
    Reduce,
    Transpose,
}

/// The transpose kernel an `aim:Transpose` node runs: its rank and whether the last axis
/// stays last. `None` for other nodes.
pub fn transpose_form(n: &aim_ir::Node) -> Option<Result<(usize, bool), CodegenError>> {
    if n.domain != "aim" {
        return None;
    }
    match n.op.as_str() {
        "Transpose" => Some(match n.ints("perm") {
            None => Err(CodegenError { node: n.name.clone(), msg: "aim:Transpose needs its perm".into() }),
            Some(p) if p.len() < 2 => Err(CodegenError {
                node: n.name.clone(),
                msg: format!("perm {p:?}: a transpose kernel has at least two dims"),
            }),
            Some(p) => Ok((p.len(), p[p.len() - 1] == p.len() as i64 - 1)),
        }),
        _ => None,
    }
}

/// Whether `n` is a node code generation makes a function for.
fn generated(n: &aim_ir::Node) -> bool {
    n.domain == "aim" && matches!(n.op.as_str(), "Elementwise" | "Reduce" | "Transpose")
}

/// Defines in `module` a function for every node of `g` that [`generated`] names, each
/// named `prefix` + kind + a counter and exported when `export`: the same code for the JIT
/// and for an object file. Returns each function's node index, kind and id.
fn define_kernels<M: cranelift_module::Module>(
    module: &mut M,
    g: &aim_ir::Graph,
    prefix: &str,
    export: bool,
) -> Result<Vec<(usize, Kind, cranelift_module::FuncId)>, CodegenError> {
    let mut ids = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !generated(n) {
            continue;
        }
        let err = |msg: String| CodegenError { node: n.name.clone(), msg };
        if let Some(form) = transpose_form(n) {
            let (rank, contiguous) = form?;
            let name = format!("{prefix}transpose_{}", ids.len());
            ids.push((i, Kind::Transpose, compile_transpose(module, &n.name, &name, export, rank, contiguous)?));
        } else if n.op == "Reduce" {
            let mode = ReduceMode::parse(n.string("mode", ""))
                .ok_or_else(|| err(format!("unknown reduction '{}'", n.string("mode", ""))))?;
            let name = format!("{prefix}reduce_{}", ids.len());
            ids.push((i, Kind::Reduce, compile_reduce(module, &n.name, &name, export, mode)?));
        } else {
            let prog =
                crate::ewprog::parse(n.strings("program").ok_or_else(|| err("no program".into()))?).map_err(err)?;
            let name = format!("{prefix}ew_{}", ids.len());
            ids.push((
                i,
                Kind::Elementwise,
                compile_elementwise(module, &n.name, &name, export, &prog, n.inputs.len())?,
            ));
        }
    }
    Ok(ids)
}

/// Generates machine code for every `aim:Elementwise`, `aim:Reduce` and `aim:Transpose`
/// node of an optimised graph.
pub fn generate(g: &aim_ir::Graph, target: &Target) -> Result<aim_runtime::cpu::Generated, CodegenError> {
    if !g.nodes.iter().any(generated) {
        return Ok(aim_runtime::cpu::Generated::default());
    }
    let mut jit = Jit::new(target)?;
    let ids = define_kernels(jit.module(), g, "aim_", false)?;
    jit.module().finalize_definitions().map_err(|e| CodegenError { node: String::new(), msg: e.to_string() })?;
    let mut out = aim_runtime::cpu::Generated::default();
    for (i, kind, id) in ids {
        let p = jit.module().get_finalized_function(id);
        match kind {
            // SAFETY: the function was generated with exactly this signature (four
            // pointer-sized integer parameters, no return value, the platform C convention).
            Kind::Elementwise => {
                out.elementwise
                    .insert(i, unsafe { std::mem::transmute::<*const u8, aim_runtime::cpu::ElementwiseFn>(p) });
            }
            // SAFETY: as above, with five pointer-sized parameters.
            Kind::Reduce => {
                out.reduce.insert(i, unsafe { std::mem::transmute::<*const u8, aim_runtime::cpu::ReduceFn>(p) });
            }
            // SAFETY: as above, with five pointer-sized parameters.
            Kind::Transpose => {
                out.transpose.insert(i, unsafe { std::mem::transmute::<*const u8, aim_runtime::cpu::TransposeFn>(p) });
            }
        }
    }
    out.owner = Some(std::sync::Arc::new(jit));
    Ok(out)
}

/// The Cranelift IR of a function built by `lower`, and the machine code Cranelift compiles
/// it to for `target` (its own disassembly: instructions after register allocation, no
/// addresses), for `aim explore`. `name` names the function.
fn function_text(
    name: &str,
    target: &Target,
    lower: impl FnOnce(&mut cranelift_codegen::ir::Function, cranelift_codegen::isa::TargetFrontendConfig),
) -> Result<(String, String), CodegenError> {
    let err = |msg: String| CodegenError { node: name.to_string(), msg };
    let isa = isa_for(target)?;
    let mut func = cranelift_codegen::ir::Function::new();
    func.signature.call_conv = isa.default_call_conv();
    lower(&mut func, isa.frontend_config());
    func.name = cranelift_codegen::ir::UserFuncName::testcase(name);
    let clif = func.display().to_string();
    let mut ctx = cranelift_codegen::Context::for_function(func);
    ctx.set_disasm(true);
    let code = ctx
        .compile(&*isa, &mut cranelift_codegen::control::ControlPlane::default())
        .map_err(|e| err(format!("{:?}", e.inner)))?;
    Ok((clif, code.vcode.clone().unwrap_or_default()))
}

/// The Cranelift IR and machine code of an `aim:Elementwise` program's loop.
pub fn elementwise_text(
    name: &str,
    prog: &[crate::ewprog::Inst],
    n_inputs: usize,
    target: &Target,
) -> Result<(String, String), CodegenError> {
    let fma = has_fma(&*isa_for(target)?);
    function_text(name, target, |f, cfg| lower_elementwise(prog, n_inputs, f, cfg, fma))
}

/// The Cranelift IR and machine code of an `aim:Reduce` node's loop.
pub fn reduce_text(name: &str, mode: ReduceMode, target: &Target) -> Result<(String, String), CodegenError> {
    function_text(name, target, |f, cfg| lower_reduce(mode, f, cfg))
}

/// The Cranelift IR and machine code of a transpose kernel (see [`transpose_form`]).
pub fn transpose_text(
    name: &str,
    rank: usize,
    contiguous: bool,
    target: &Target,
) -> Result<(String, String), CodegenError> {
    function_text(name, target, |f, cfg| lower_transpose(rank, contiguous, f, cfg))
}

/// Starts building `func` as a function of `params` pointer-sized integer parameters (the
/// C convention every generated function uses): returns the builder, positioned in the
/// entry block, the entry block, and the parameters.
fn begin<'a>(
    func: &'a mut cranelift_codegen::ir::Function,
    fbc: &'a mut cranelift_frontend::FunctionBuilderContext,
    params: usize,
) -> (cranelift_frontend::FunctionBuilder<'a>, cranelift_codegen::ir::Block, Vec<cranelift_codegen::ir::Value>) {
    use cranelift_codegen::ir::{types, AbiParam};
    for _ in 0..params {
        func.signature.params.push(AbiParam::new(types::I64));
    }
    let mut b = cranelift_frontend::FunctionBuilder::new(func, fbc);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let p = b.block_params(entry).to_vec();
    (b, entry, p)
}

/// Declares and defines in `module` the function `lower` builds, under `name`; exported
/// (`Linkage::Export`) when `export`. Errors name `node`.
/// Whether code for `isa` has fused multiply-adds as instructions (AArch64; x86-64 with
/// the FMA feature): generated loops fuse their polynomial steps there, as the kernels'
/// `FMA = true` forms do. Elsewhere Cranelift would call a library `fma`.
pub(crate) fn has_fma(isa: &dyn cranelift_codegen::isa::TargetIsa) -> bool {
    match isa.triple().architecture {
        target_lexicon::Architecture::Aarch64(_) => true,
        target_lexicon::Architecture::X86_64 => {
            isa.isa_flags().iter().any(|v| v.name == "has_fma" && v.as_bool() == Some(true))
        }
        _ => false,
    }
}

fn define<M: cranelift_module::Module>(
    module: &mut M,
    node: &str,
    name: &str,
    export: bool,
    lower: impl FnOnce(&mut cranelift_codegen::ir::Function, cranelift_codegen::isa::TargetFrontendConfig),
) -> Result<cranelift_module::FuncId, CodegenError> {
    let err = |msg: String| CodegenError { node: node.to_string(), msg };
    let mut ctx = module.make_context();
    let cfg = module.isa().frontend_config();
    lower(&mut ctx.func, cfg);
    let linkage = if export { cranelift_module::Linkage::Export } else { cranelift_module::Linkage::Local };
    let id = module.declare_function(name, linkage, &ctx.func.signature).map_err(|e| err(e.to_string()))?;
    module.define_function(id, &mut ctx).map_err(|e| err(format!("{e:?}")))?;
    module.clear_context(&mut ctx);
    Ok(id)
}

/// Compiles the portable GEMM microkernel with Cranelift for `target` and installs it for
/// this process (`aim_kernels::gemm::install_portable`); the code stays mapped for the rest
/// of the process. Returns whether a generated kernel is now in use.
pub fn install_portable_microkernel(target: &Target) -> Result<bool, CodegenError> {
    static DONE: std::sync::OnceLock<Result<bool, String>> = std::sync::OnceLock::new();
    let r = DONE.get_or_init(|| {
        let mut jit = Jit::new(target).map_err(|e| e.msg)?;
        let fma = target.features.fma;
        let id = define(jit.module(), "", "aim_portable_micro", false, |f, cfg| micro::lower_micro(f, cfg, fma))
            .map_err(|e| e.msg)?;
        jit.module().finalize_definitions().map_err(|e| e.to_string())?;
        let p = jit.module().get_finalized_function(id);
        // The code must outlive every program: the module is never freed.
        std::mem::forget(jit);
        // SAFETY: the function has exactly this signature (six pointer-sized integers, the
        // platform C convention) and computes the portable kernel's tile (tested).
        Ok(unsafe {
            aim_kernels::gemm::install_portable(std::mem::transmute::<*const u8, aim_kernels::gemm::MicroFn>(p))
        })
    });
    r.clone().map_err(|msg| CodegenError { node: String::new(), msg })
}

/// A JIT module owning generated code. The code stays mapped until this is dropped, so
/// programs hold it in an `Arc` next to the function pointers they call.
pub struct Jit {
    module: Option<JITModule>,
}

// SAFETY: after `finalize`, the module's code is immutable and only read (executed); the
// module itself is not touched again until it is dropped.
unsafe impl Send for Jit {}
unsafe impl Sync for Jit {}

impl Jit {
    /// A JIT module for `target`.
    pub fn new(target: &Target) -> Result<Jit, CodegenError> {
        let builder = JITBuilder::with_isa(isa_for(target)?, cranelift_module::default_libcall_names());
        Ok(Jit { module: Some(JITModule::new(builder)) })
    }

    pub(crate) fn module(&mut self) -> &mut JITModule {
        self.module.as_mut().expect("the module lives until drop")
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the programs that call into this code hold the Jit in an Arc, so it is
            // dropped only once no function pointer into it can be called any more.
            unsafe { m.free_memory() };
        }
    }
}
