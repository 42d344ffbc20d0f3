//! Ahead-of-time compilation into a relocatable object (`aim compile --target`): the same
//! generated functions as the JIT's, position-independent, for any triple Cranelift
//! supports; each program's `.aim` image as page-aligned read-only data; a table per
//! program of its functions (node, kind, address: `aim_runtime::embedded::KernelEntry`);
//! and one exported entry function, `<name>_load`, that hands the programs to the runtime
//! library (`aim_runtime_load_embedded`, in `libaim_runtime` and `libaim`). The system
//! linker makes a shared object of it.

use super::{define_kernels, CodegenError, Kind};
use crate::target::Target;
use cranelift_codegen::ir::{types, AbiParam, InstBuilder};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_module::{DataDescription, Linkage, Module};
use target_lexicon::{Architecture, Triple};

/// One program to embed: its `.aim` image (optimized stage, arena plan recorded) and the
/// graph it holds (whose nodes get generated functions).
pub struct ObjectProgram<'a> {
    /// The `.aim` bytes.
    pub image: &'a [u8],
    /// The program's graph, as in the image.
    pub graph: &'a aim_ir::Graph,
    /// What the entry function of its typed steps does (`aim_runtime::cpu::entry_ops_for`),
    /// when it has them.
    pub entry: Option<Vec<aim_runtime::cpu::EntryOp>>,
}

/// The Cranelift ISA for `triple` with the features of `target` (its level), compiling
/// position-independent code for a shared object.
pub fn isa_for_triple(triple: &Triple, target: &Target) -> Result<OwnedTargetIsa, CodegenError> {
    let err = |msg: String| CodegenError { node: String::new(), msg };
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").map_err(|e| err(e.to_string()))?;
    flags.set("is_pic", "true").map_err(|e| err(e.to_string()))?;
    let mut isa = cranelift_codegen::isa::lookup(triple.clone()).map_err(|e| match e {
        cranelift_codegen::isa::LookupError::SupportDisabled => err(format!(
            "{triple}: this build of aim generates code for its host only (built without the `cross` feature)"
        )),
        e => err(format!("{triple}: {e}")),
    })?;
    if triple.architecture == Architecture::X86_64 {
        let f = &target.features;
        let v2 = f.sse41 && f.sse42;
        let v3 = v2 && f.avx && f.avx2 && f.fma;
        // The x86-64 psABI levels' features that Cranelift knows.
        let on = [
            ("has_sse3", v2),
            ("has_ssse3", v2),
            ("has_cmpxchg16b", v2),
            ("has_popcnt", v2),
            ("has_sse41", f.sse41),
            ("has_sse42", f.sse42),
            ("has_avx", f.avx),
            ("has_avx2", f.avx2),
            ("has_fma", f.fma),
            ("has_bmi1", v3),
            ("has_bmi2", v3),
            ("has_lzcnt", v3),
            ("has_avx512f", f.avx512f),
            ("has_avx512vl", f.avx512vl),
            ("has_avx512dq", f.avx512dq),
        ];
        for (name, value) in on {
            isa.set(name, if value { "true" } else { "false" }).map_err(|e| err(format!("{name}: {e}")))?;
        }
    }
    isa.finish(settings::Flags::new(flags)).map_err(|e| err(e.to_string()))
}

/// Compiles `programs` (the first shape-generic, the others specialised) into a relocatable
/// object for `triple`, exporting `<name>_load`. Returns the object's bytes.
pub fn emit_object(
    programs: &[ObjectProgram<'_>],
    target: &Target,
    triple: &Triple,
    name: &str,
) -> Result<Vec<u8>, CodegenError> {
    let err = |msg: String| CodegenError { node: String::new(), msg };
    let isa = isa_for_triple(triple, target)?;
    let ptr = isa.pointer_type();
    let ptr_bytes = ptr.bytes() as usize;
    let builder = cranelift_object::ObjectBuilder::new(isa, name, cranelift_module::default_libcall_names())
        .map_err(|e| err(e.to_string()))?;
    let mut module = cranelift_object::ObjectModule::new(builder);
    let mut table = DataDescription::new();
    // EmbeddedProgram: image pointer, image length, kernel table pointer, kernel count,
    // entry function, the entry's fingerprint (u64).
    let entry_bytes = 5 * ptr_bytes + 8;
    let mut table_bytes = vec![0u8; programs.len() * entry_bytes];
    let mut relocs = Vec::new();
    let mut entry_funcs = Vec::new();
    for (k, p) in programs.iter().enumerate() {
        let ids = define_kernels(&mut module, p.graph, &format!("{name}_p{k}_"), false)?;
        let image = module
            .declare_data(&format!("{name}_p{k}_image"), Linkage::Local, false, false)
            .map_err(|e| err(e.to_string()))?;
        let mut d = DataDescription::new();
        d.define(p.image.into());
        d.set_align(aim_ir::aim_file::DATA_ALIGN as u64);
        module.define_data(image, &d).map_err(|e| err(e.to_string()))?;
        // KernelEntry: node (u64), kind (u64), function address.
        let kernel_bytes = 16 + ptr_bytes;
        let kernels = module
            .declare_data(&format!("{name}_p{k}_kernels"), Linkage::Local, false, false)
            .map_err(|e| err(e.to_string()))?;
        let mut d = DataDescription::new();
        let mut bytes = vec![0u8; ids.len().max(1) * kernel_bytes];
        for (j, (node, kind, id)) in ids.iter().enumerate() {
            let at = j * kernel_bytes;
            let kind = match kind {
                Kind::Elementwise => aim_runtime::embedded::KERNEL_ELEMENTWISE,
                Kind::Reduce => aim_runtime::embedded::KERNEL_REDUCE,
                Kind::Transpose => aim_runtime::embedded::KERNEL_TRANSPOSE,
            };
            bytes[at..at + 8].copy_from_slice(&(*node as u64).to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&kind.to_le_bytes());
            let f = module.declare_func_in_data(*id, &mut d);
            d.write_function_addr((at + 16) as u32, f);
        }
        d.define(bytes.into_boxed_slice());
        d.set_align(8);
        module.define_data(kernels, &d).map_err(|e| err(e.to_string()))?;
        let at = k * entry_bytes;
        table_bytes[at + ptr_bytes..at + 2 * ptr_bytes].copy_from_slice(&p.image.len().to_le_bytes()[..ptr_bytes]);
        table_bytes[at + 3 * ptr_bytes..at + 4 * ptr_bytes].copy_from_slice(&ids.len().to_le_bytes()[..ptr_bytes]);
        relocs.push((at, image));
        relocs.push((at + 2 * ptr_bytes, kernels));
        if let Some(ops) = &p.entry {
            let loops: std::collections::HashMap<usize, u32> = ids
                .iter()
                .filter(|(_, kind, _)| matches!(kind, Kind::Elementwise))
                .map(|(node, _, id)| (*node, id.as_u32()))
                .collect();
            let loops = super::Loops::Functions(loops);
            let entry = super::define(&mut module, "", &format!("{name}_p{k}_entry"), false, |f, cfg| {
                super::lower_entry(ops, &loops, None, f, cfg)
            })?;
            entry_funcs.push((at + 4 * ptr_bytes, entry));
            let fp = aim_runtime::cpu::fingerprint(ops);
            table_bytes[at + 5 * ptr_bytes..at + 5 * ptr_bytes + 8].copy_from_slice(&fp.to_le_bytes());
        }
    }
    let programs_id = module
        .declare_data(&format!("{name}_programs"), Linkage::Local, false, false)
        .map_err(|e| err(e.to_string()))?;
    for (at, id) in relocs {
        let gv = module.declare_data_in_data(id, &mut table);
        table.write_data_addr(at as u32, gv, 0);
    }
    for (at, id) in entry_funcs {
        let f = module.declare_func_in_data(id, &mut table);
        table.write_function_addr(at as u32, f);
    }
    table.define(table_bytes.into_boxed_slice());
    table.set_align(8);
    module.define_data(programs_id, &table).map_err(|e| err(e.to_string()))?;
    define_entry(&mut module, name, programs_id, programs.len())?;
    let product = module.finish();
    product.emit().map_err(|e| err(format!("cannot write the object: {e}")))
}

/// Defines `<name>_load(const AimLoadOptions *options, AimModel **out) -> AimStatus`,
/// exported: it calls `aim_runtime_load_embedded(EMBED_ABI_VERSION, programs, count,
/// options, out)` and returns its status.
fn define_entry(
    module: &mut cranelift_object::ObjectModule,
    name: &str,
    programs: cranelift_module::DataId,
    count: usize,
) -> Result<(), CodegenError> {
    let err = |msg: String| CodegenError { node: String::new(), msg };
    let ptr = module.isa().pointer_type();
    let cc = module.isa().default_call_conv();
    let mut callee = module.make_signature();
    callee.call_conv = cc;
    for t in [types::I32, ptr, ptr, ptr, ptr] {
        callee.params.push(AbiParam::new(t));
    }
    callee.returns.push(AbiParam::new(types::I32));
    let load = module
        .declare_function("aim_runtime_load_embedded", Linkage::Import, &callee)
        .map_err(|e| err(e.to_string()))?;
    let mut ctx = module.make_context();
    ctx.func.signature.call_conv = cc;
    ctx.func.signature.params.push(AbiParam::new(ptr));
    ctx.func.signature.params.push(AbiParam::new(ptr));
    ctx.func.signature.returns.push(AbiParam::new(types::I32));
    let cfg = module.isa().frontend_config();
    let mut fbc = cranelift_frontend::FunctionBuilderContext::new();
    {
        let mut b = cranelift_frontend::FunctionBuilder::new(&mut ctx.func, &mut fbc);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let (options, out) = (b.block_params(entry)[0], b.block_params(entry)[1]);
        let gv = module.declare_data_in_func(programs, b.func);
        let table = b.ins().symbol_value(ptr, gv);
        let version = b.ins().iconst(types::I32, aim_runtime::embedded::EMBED_ABI_VERSION as i64);
        let n = b.ins().iconst(ptr, count as i64);
        let f = module.declare_func_in_func(load, b.func);
        let call = b.ins().call(f, &[version, table, n, options, out]);
        let status = b.inst_results(call)[0];
        b.ins().return_(&[status]);
        b.seal_all_blocks();
        b.finalize(cfg);
    }
    let entry_name = format!("{name}_load");
    let id =
        module.declare_function(&entry_name, Linkage::Export, &ctx.func.signature).map_err(|e| err(e.to_string()))?;
    module.define_function(id, &mut ctx).map_err(|e| err(format!("{entry_name}: {e:?}")))?;
    Ok(())
}
