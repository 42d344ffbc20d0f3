//! One `.aim` file for every target (`aim compile MODEL -o FILE.aim --target all`): a
//! program per CPU target — x86-64 at each ISA level, AArch64 with NEON — over one data
//! section that stores each distinct constant once, so the weights the targets' layouts
//! agree on are shared. Loading picks the best program the CPU it finds can run (the
//! highest ISA level of its architecture, within `--cpu`); `aim info` lists them.
//!
//! The programs keep their weights as the optimizer leaves them and pack them at load for
//! the CPU found, as a shared object for another architecture does: packed layouts depend
//! on the vector width (a ResNet-50's Winograd weights alone take four times their
//! filters), so packing ahead would store every weight once per level. A single-target
//! file (`aim compile` without `--target`) stores them packed.

use crate::compiled::{header_for, import_checked, recorded_target};
use crate::{specialize, Error, Options};
use aim_compiler::target::{Level, Target};
use aim_ir::aim_file::{self, Header};
use std::path::Path;

/// The targets `--target all` names: every level aim has kernels for.
pub const ALL: &[(&str, Level)] = &[
    ("x86_64", Level::Baseline),
    ("x86_64", Level::X86V2),
    ("x86_64", Level::X86V3),
    ("x86_64", Level::X86V4),
    ("aarch64", Level::Neon),
];

/// What [`compile_package`] wrote.
#[derive(Clone, Debug)]
pub struct PackageSummary {
    /// `optimized`, or `source` for a model with symbolic dims (one source graph, which
    /// every target specialises at load, is the whole package then).
    pub stage: String,
    /// Per program, in file order.
    pub programs: Vec<PackagedProgram>,
    /// Bytes of the file.
    pub file_bytes: u64,
}

/// One program of a package.
#[derive(Clone, Debug)]
pub struct PackagedProgram {
    /// `x86_64` or `aarch64`.
    pub arch: String,
    /// The ISA level (`Level::name`).
    pub level: String,
    /// Nodes of its graph.
    pub nodes: usize,
    /// Bytes of the constants it reads, and of those no other program reads.
    pub bytes: aim_file::ProgramBytes,
}

fn bad(reason: String) -> Error {
    Error::BadOption { option: "target", reason }
}

/// The `(arch, level)` pairs of `--target`: `all`, or a comma-separated list of target
/// triples (`x86_64-unknown-linux-gnu`: x86-64 without SIMD; `aarch64-unknown-linux-gnu`:
/// NEON) and ISA levels (`x86-64-v2`, `x86-64-v3`, `x86-64-v4`, `aarch64-neon`), in that
/// order with repeats dropped.
pub fn targets(spec: &str) -> Result<Vec<(&'static str, Level)>, Error> {
    let mut out: Vec<(&'static str, Level)> = Vec::new();
    for item in spec.split(',').map(str::trim) {
        let picked: &[(&str, Level)] = match item {
            "all" => ALL,
            "x86_64-unknown-linux-gnu" | "x86_64" | "baseline" => &ALL[0..1],
            "x86-64-v2" => &ALL[1..2],
            "x86-64-v3" => &ALL[2..3],
            "x86-64-v4" => &ALL[3..4],
            "aarch64-unknown-linux-gnu" | "aarch64" | "aarch64-neon" => &ALL[4..5],
            other => {
                return Err(bad(format!(
                    "'{other}' is not a target of a .aim file: give all, or a list of x86_64-unknown-linux-gnu, x86-64-v2, x86-64-v3, x86-64-v4 and aarch64-unknown-linux-gnu"
                )))
            }
        };
        for &t in picked {
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    Ok(out)
}

/// Compiles the ONNX model at `model` into the package `out`: one optimized program per
/// target of `spec` (see [`targets`]), with `opts`' shapes, level, passes and weights.
pub fn compile_package(model: &Path, out: &Path, spec: &str, opts: &Options) -> Result<PackageSummary, Error> {
    let p = model.display().to_string();
    crate::guard::contain(&format!("compiling {p}"), || {
        crate::compiled::something_to_write(opts.opt_level)?;
        let wanted = targets(spec)?;
        let mut ir = import_checked(model)?;
        let sigs = crate::signatures(&ir.graph, &opts.shapes, &p)?;
        let targets: Vec<Target> = wanted
            .iter()
            .map(|&(arch, level)| crate::with_options(Target::for_arch(arch, level.name())?, opts))
            .collect::<Result<_, Error>>()?;
        let mut programs = Vec::with_capacity(targets.len());
        match sigs.as_slice() {
            [] if specialize::worthwhile(&ir.graph) => {
                // Symbolic dims: every target specialises the one source graph at load.
                let host = crate::cpu_target(opts)?;
                programs.push((ir.clone(), header_for("source", &host, model, None)));
            }
            [] | [_] => {
                if let [sig] = sigs.as_slice() {
                    specialize::bind(&mut ir.graph, sig, &p)?;
                }
                for target in &targets {
                    let mut m = ir.clone();
                    m.graph = crate::optimize(ir.graph.clone(), target, &p)?;
                    programs.push((m, header_for("optimized", target, model, None)));
                }
            }
            _ => {
                return Err(Error::BadOption {
                    option: "shape",
                    reason: "a .aim file holds one specialised program per target: give each input one --shape".into(),
                })
            }
        }
        let pairs: Vec<(&aim_ir::Model, &Header)> = programs.iter().map(|(m, h)| (m, h)).collect();
        let bytes = aim_file::write_package(out, &pairs)?;
        let programs = programs
            .iter()
            .zip(bytes)
            .map(|((m, h), bytes)| PackagedProgram {
                arch: h.target.get("arch").cloned().unwrap_or_default(),
                level: h.target.get("level").cloned().unwrap_or_default(),
                nodes: m.graph.nodes.len(),
                bytes,
            })
            .collect();
        let stage = pairs[0].1.stage.clone();
        let file_bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
        Ok(PackageSummary { stage, programs, file_bytes })
    })
}

/// Which of a file's programs this CPU runs, capped by `cpu` (`native`, or an ISA level):
/// the optimized program of the highest level the CPU supports, else a source program;
/// a file of one program is read as it is (loading then says why it cannot run). The
/// error lists the programs and what this CPU is.
pub fn choose(programs: &[Header], cpu: &str) -> Result<usize, String> {
    if programs.len() == 1 {
        return Ok(0);
    }
    let level = |h: &Header| h.target.get("level").and_then(|l| Level::named(l));
    let runs = |h: &Header| h.stage == "optimized" && recorded_target(h, "", cpu).is_ok();
    let best = (0..programs.len()).filter(|&i| runs(&programs[i])).max_by_key(|&i| level(&programs[i]));
    if let Some(i) = best.or_else(|| programs.iter().position(|h| h.stage == "source")) {
        return Ok(i);
    }
    let host = Target::host();
    let listed: Vec<String> = programs.iter().map(describe).collect();
    let cap = if matches!(cpu, "native" | "") { String::new() } else { format!(", capped at {cpu}") };
    Err(format!(
        "none of its programs ({}) runs on this CPU ({} {}{cap}): compile the ONNX model for it",
        listed.join(", "),
        host.arch,
        host.level.name()
    ))
}

/// A program as `aim info` and errors name it: `x86_64 x86-64-v3`.
pub fn describe(h: &Header) -> String {
    let get = |k: &str| h.target.get(k).map(String::as_str).unwrap_or("?");
    format!("{} {}", get("arch"), get("level"))
}

/// The headers of every program of the `.aim` file at `path`, and which one this CPU would
/// load (capped by `cpu`), or why none.
pub fn programs(path: &Path, cpu: &str) -> Result<(Vec<Header>, Result<usize, String>), Error> {
    let f = aim_file::read(path)?;
    let chosen = choose(&f.programs, cpu);
    Ok((f.programs, chosen))
}
