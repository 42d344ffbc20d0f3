//! Ahead-of-time compilation into a shared object with a C ABI (`aim compile MODEL --target
//! TRIPLE[,LEVEL] -o libNAME.so`).
//!
//! The object holds the model's programs — the shape-generic one first, then one per
//! `--shape` signature — each as a `.aim` image (optimized for the target, weights
//! prepacked when this machine can pack for it, the arena plan recorded) in read-only data
//! with the Cranelift code of its elementwise loops, reductions and transposes; and it
//! exports `NAME_load(const AimLoadOptions *, AimModel **)`. That hands the programs to
//! `aim_runtime_load_embedded` in `libaim_runtime` (the runtime without the compiler) or
//! `libaim`; every other call is the `include/aim.h` API. Inputs whose shapes match a
//! `--shape` signature run its specialised program, any others the shape-generic one.

use crate::compiled::{header_for, import_checked, prepack};
use crate::{specialize, Error, InputShapes};
use aim_compiler::target::Target;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use target_lexicon::{Architecture, BinaryFormat, OperatingSystem, Triple};

/// What `aim compile --target` was asked for.
#[derive(Clone, Debug)]
pub struct AotOptions {
    /// `TRIPLE[,LEVEL]`: `x86_64-unknown-linux-gnu`, `x86_64-unknown-linux-gnu,x86-64-v3`,
    /// `aarch64-unknown-linux-gnu`; the level defaults to the host's for the host's
    /// architecture.
    pub target: String,
    /// The prefix of the exported symbols (`NAME_load`); `None`: from the output file's
    /// name (`libresnet.so` gives `resnet`).
    pub name: Option<String>,
    /// Input-shape signatures to compile specialised programs for.
    pub shapes: Vec<InputShapes>,
    /// The linker driver; `None`: `$CC`, else `cc` for the host's architecture and
    /// `<arch>-linux-gnu-gcc` for another.
    pub linker: Option<String>,
    /// Which passes run (`-O1` … `-O3`, `--disable-pass`); `-O0` has no program to write.
    pub optimization: aim_compiler::passes::Optimization,
    /// Dense layers' weights as f16 (`--weights f16`).
    pub half_weights: bool,
    /// Dense layers' weights as 4-bit blocks of this many rows (`--weights int4`).
    pub int4_weights: Option<usize>,
    /// Dense layers' weights as 8-bit codes per column (`--weights int8`).
    pub int8_weights: bool,
}

/// What a compile wrote.
#[derive(Clone, Debug)]
pub struct AotSummary {
    /// The triple compiled for.
    pub triple: String,
    /// The ISA level.
    pub level: String,
    /// The exported entry function.
    pub entry: String,
    /// Programs in the object (the generic one, then the specialised ones).
    pub programs: usize,
    /// Whether the weights are stored packed for the target (else the runtime packs them
    /// at load).
    pub prepacked: bool,
    /// Bytes of the shared object.
    pub file_bytes: u64,
}

fn bad(reason: String) -> Error {
    Error::BadOption { option: "target", reason }
}

/// The triple and level of `--target TRIPLE[,LEVEL]`.
fn parse_target(spec: &str) -> Result<(Triple, String), Error> {
    let (triple, level) = spec.split_once(',').unwrap_or((spec, "native"));
    let t = Triple::from_str(triple).map_err(|e| bad(format!("'{triple}' is not a target triple: {e}")))?;
    let arch_ok = matches!(t.architecture, Architecture::X86_64 | Architecture::Aarch64(_));
    if !arch_ok || t.operating_system != OperatingSystem::Linux || t.binary_format != BinaryFormat::Elf {
        return Err(bad(format!(
            "{triple}: aim compiles shared objects for x86_64-unknown-linux-gnu and aarch64-unknown-linux-gnu"
        )));
    }
    Ok((t, level.to_string()))
}

/// A C identifier from the output file's name: `libresnet-50.so` gives `resnet_50`.
fn default_name(out: &Path) -> String {
    let stem = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = stem.split('.').next().unwrap_or_default();
    let stem = stem.strip_prefix("lib").unwrap_or(stem);
    let mut s: String = stem.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "model_");
    }
    s
}

/// Compiles the ONNX model at `model` into the shared object `out`.
pub fn compile_shared_object(model: &Path, out: &Path, opts: &AotOptions) -> Result<AotSummary, Error> {
    let p = model.display().to_string();
    crate::guard::contain(&format!("compiling {p}"), || {
        let (triple, level) = parse_target(&opts.target)?;
        let arch = match triple.architecture {
            Architecture::X86_64 => "x86_64",
            _ => "aarch64",
        };
        let mut target = Target::for_arch(arch, &level)?;
        crate::compiled::something_to_write(opts.optimization.level)?;
        target.optimization = opts.optimization.clone();
        target.half_weights = opts.half_weights;
        target.int4_weights = opts.int4_weights;
        target.int8_weights = opts.int8_weights;
        target
            .optimization
            .check(&aim_compiler::passes::cpu_pass_names(&target))
            .map_err(|reason| Error::BadOption { option: "disable-pass", reason })?;
        let name = opts.name.clone().unwrap_or_else(|| default_name(out));
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(Error::BadOption { option: "name", reason: format!("'{name}' is not a C identifier") });
        }
        let ir = import_checked(model)?;
        let sigs = crate::signatures(&ir.graph, &opts.shapes, &p)?;
        let prepacked = target.runs_here();
        // The generic program first, then one per signature.
        let mut graphs = vec![ir.graph.clone()];
        for sig in &sigs {
            let mut g = ir.graph.clone();
            specialize::bind(&mut g, sig, &p)?;
            graphs.push(g);
        }
        let mut programs = Vec::with_capacity(graphs.len());
        for g in graphs {
            let mut g = crate::optimize(g, &target, &p)?;
            if prepacked {
                g = prepack(g, &target, &p)?;
            }
            let plan = aim_compiler::memory_plan::plan(&g);
            let plan = aim_ir::aim_file::ArenaPlan {
                arena_bytes: plan.arena_bytes,
                slots: plan.slots.iter().map(|s| (s.name.clone(), s.offset, s.bytes)).collect(),
            };
            let header = header_for("optimized", &target, model, Some(plan));
            let m = aim_ir::Model {
                graph: g,
                opset: ir.opset,
                producer: ir.producer.clone(),
                doc: ir.doc.clone(),
                metadata: ir.metadata.clone(),
            };
            let image = aim_ir::aim_file::to_bytes(&m, &header)
                .map_err(|msg| Error::Compile { path: out.display().to_string(), msg })?;
            programs.push((image, m.graph));
        }
        let objs: Vec<aim_compiler::codegen::ObjectProgram<'_>> = programs
            .iter()
            .map(|(image, graph)| {
                let entry = entry_of(image).map_err(|msg| Error::Compile { path: out.display().to_string(), msg })?;
                Ok(aim_compiler::codegen::ObjectProgram { image, graph, entry })
            })
            .collect::<Result<_, Error>>()?;
        let object = aim_compiler::codegen::emit_object(&objs, &target, &triple, &name)
            .map_err(|cause| Error::Codegen { path: p.clone(), cause })?;
        link(&object, out, arch, opts.linker.as_deref())?;
        Ok(AotSummary {
            triple: triple.to_string(),
            level: target.level.name().to_string(),
            entry: format!("{name}_load"),
            programs: programs.len(),
            prepacked,
            file_bytes: std::fs::metadata(out).map(|m| m.len()).unwrap_or(0),
        })
    })
}

/// Links `object` into the shared object `out` with the system linker driver.
fn link(object: &[u8], out: &Path, arch: &str, linker: Option<&str>) -> Result<(), Error> {
    let fail = |msg: String| Error::Compile { path: out.display().to_string(), msg };
    let obj = PathBuf::from(format!("{}.o", out.display()));
    std::fs::write(&obj, object).map_err(|e| fail(format!("cannot write {}: {e}", obj.display())))?;
    let driver = linker.map(str::to_string).unwrap_or_else(|| {
        if arch == std::env::consts::ARCH {
            std::env::var("CC").unwrap_or_else(|_| "cc".into())
        } else {
            format!("{arch}-linux-gnu-gcc")
        }
    });
    let soname = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let result = std::process::Command::new(&driver)
        .arg("-shared")
        .arg("-o")
        .arg(out)
        .arg(&obj)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-Wl,-z,noexecstack")
        .arg("-Wl,-z,relro,-z,now")
        .output();
    let _ = std::fs::remove_file(&obj);
    let output = result.map_err(|e| fail(format!("cannot run the linker '{driver}': {e} (give one with --linker)")))?;
    if !output.status.success() {
        return Err(fail(format!(
            "the linker '{driver}' failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// What the entry function of the program in `image` must do: the typed steps the runtime
/// makes of the image when it loads it (`None` when it will run node by node).
fn entry_of(image: &[u8]) -> Result<Option<Vec<aim_runtime::cpu::EntryOp>>, String> {
    let file = aim_ir::aim_file::parse_bytes(image)?;
    let plan = file.header.plan.as_ref().ok_or("the image records no arena plan")?;
    let placement = aim_runtime::cpu::Placement::from_arena_plan(plan);
    Ok(aim_runtime::cpu::entry_ops_for(&file.model.graph, &placement).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_file() {
        assert_eq!(default_name(Path::new("out/libresnet50.so")), "resnet50");
        assert_eq!(default_name(Path::new("libmy-model.so")), "my_model");
        assert_eq!(default_name(Path::new("3d.so")), "model_3d");
    }

    #[test]
    fn targets_are_checked() {
        assert!(parse_target("x86_64-unknown-linux-gnu,x86-64-v3").is_ok());
        assert!(parse_target("aarch64-unknown-linux-gnu").is_ok());
        let e = parse_target("x86_64-pc-windows-msvc").unwrap_err().to_string();
        assert!(e.contains("x86_64-unknown-linux-gnu"), "{e}");
        assert!(parse_target("not a triple").is_err());
    }
}
