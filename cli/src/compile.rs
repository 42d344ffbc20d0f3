//! `aim compile`: `.aim` files and shared objects.

use crate::args::{parse_shapes, parse_weights, PassArgs};
use anyhow::Result;
use std::io::Write;

/// `aim compile` with its output decided by its flags: a shared object for `--target
/// TRIPLE[,LEVEL]`, a package for `--target` with a `.aim` output, else a `.aim` file for
/// this CPU (capped by `--cpu`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn compile_any(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    cpu: &str,
    shape: &[String],
    target: Option<String>,
    name: Option<String>,
    linker: Option<String>,
    passes: &PassArgs,
) -> Result<()> {
    let package = output.extension().is_some_and(|e| e == "aim");
    match target {
        Some(_) if cpu != "native" && package => {
            Err(anyhow::anyhow!("--cpu caps a single-target .aim file's level; with --target list the levels"))
        }
        Some(_) if cpu != "native" => {
            Err(anyhow::anyhow!("--cpu caps a .aim file's level; with --target give the level as TRIPLE,LEVEL"))
        }
        Some(_) if package && (name.is_some() || linker.is_some()) => {
            Err(anyhow::anyhow!("--name and --linker are for shared objects; {} is a .aim file", output.display()))
        }
        Some(t) if package => compile_package(out, model, output, &t, shape, passes),
        Some(t) => aot_options(t, name, linker, shape, passes).and_then(|o| compile_so(out, model, output, &o)),
        None if name.is_some() || linker.is_some() => {
            Err(anyhow::anyhow!("--name and --linker are for shared objects (--target)"))
        }
        None => compile_cmd(out, model, output, cpu, shape, passes),
    }
}

/// The compile options of `--shape`, `-O`, `--disable-pass` and `--weights`, for this CPU
/// capped by `cpu`.
fn compile_options(cpu: &str, shape: &[String], passes: &PassArgs) -> Result<aim::Options> {
    let weights = parse_weights(&passes.weights)?;
    Ok(aim::Options {
        cpu: cpu.to_string(),
        shapes: parse_shapes(shape)?,
        opt_level: passes.level()?,
        disabled_passes: passes.disable_pass.clone(),
        half_weights: weights.half,
        int4_weights: weights.int4,
        int8_weights: weights.int8,
        ..aim::Options::default()
    })
}

/// `aim compile --target LIST -o FILE.aim`: writes the package and says what each program
/// takes of it.
fn compile_package(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    spec: &str,
    shape: &[String],
    passes: &PassArgs,
) -> Result<()> {
    let opts = compile_options("native", shape, passes)?;
    let t0 = std::time::Instant::now();
    let s = aim::package::compile_package(model, output, spec, &opts)?;
    let mib = |b: f64| b / (1 << 20) as f64;
    writeln!(
        out,
        "{}: {} {} program{}, {:.1} MiB, in {:.0} ms",
        output.display(),
        s.programs.len(),
        s.stage,
        if s.programs.len() == 1 { "" } else { "s" },
        mib(s.file_bytes as f64),
        t0.elapsed().as_secs_f64() * 1e3
    )?;
    for p in &s.programs {
        writeln!(
            out,
            "  {} {}: {} nodes, reads {:.1} MiB of constants, {:.1} MiB of them its own",
            p.arch,
            p.level,
            p.nodes,
            mib(p.bytes.read as f64),
            mib(p.bytes.own as f64)
        )?;
    }
    Ok(())
}

/// `aim compile`: writes the `.aim` file and says what it holds.
fn compile_cmd(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    cpu: &str,
    shape: &[String],
    passes: &PassArgs,
) -> Result<()> {
    let opts = compile_options(cpu, shape, passes)?;
    let t0 = std::time::Instant::now();
    let s = aim::compiled::compile_to_file(model, output, &opts)?;
    writeln!(
        out,
        "{}: {} program ({} nodes) for {}, {:.1} MiB, in {:.0} ms",
        output.display(),
        s.stage,
        s.nodes,
        s.level,
        s.file_bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64() * 1e3
    )?;
    Ok(())
}

/// `aim compile --target`'s options from its flags.
fn aot_options(
    target: String,
    name: Option<String>,
    linker: Option<String>,
    shape: &[String],
    passes: &PassArgs,
) -> Result<aim::aot::AotOptions> {
    let weights = parse_weights(&passes.weights)?;
    Ok(aim::aot::AotOptions {
        target,
        name,
        shapes: parse_shapes(shape)?,
        linker,
        optimization: passes.optimization()?,
        half_weights: weights.half,
        int4_weights: weights.int4,
        int8_weights: weights.int8,
    })
}

fn compile_so(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    opts: &aim::aot::AotOptions,
) -> Result<()> {
    let t0 = std::time::Instant::now();
    let s = aim::aot::compile_shared_object(model, output, opts)?;
    writeln!(
        out,
        "{}: {} program{} for {} ({}), weights {}, entry {}, {:.1} MiB, in {:.0} ms",
        output.display(),
        s.programs,
        if s.programs == 1 { "" } else { "s" },
        s.triple,
        s.level,
        if s.prepacked { "prepacked" } else { "packed at load" },
        s.entry,
        s.file_bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64() * 1e3
    )?;
    Ok(())
}
