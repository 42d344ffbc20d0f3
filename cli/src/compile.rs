//! `aim compile`: `.aim` files and shared objects.

use crate::args::{parse_shapes, parse_weights, PassArgs};
use anyhow::Result;
use std::io::Write;

/// `aim compile`: writes the `.aim` file and says what it holds.
pub(crate) fn compile_cmd(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    cpu: &str,
    shape: &[String],
    passes: &PassArgs,
) -> Result<()> {
    let weights = parse_weights(&passes.weights)?;
    let opts = aim::Options {
        cpu: cpu.to_string(),
        shapes: parse_shapes(shape)?,
        opt_level: passes.level()?,
        disabled_passes: passes.disable_pass.clone(),
        half_weights: weights.half,
        int4_weights: weights.int4,
        int8_weights: weights.int8,
        ..aim::Options::default()
    };
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
pub(crate) fn aot_options(
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

pub(crate) fn compile_so(
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
