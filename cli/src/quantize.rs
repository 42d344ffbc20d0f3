//! `aim quantize`: an f32 model to its QDQ or dynamic int8 form, with the accuracy cost.

use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

/// `aim quantize`'s options from the command line's words.
pub(crate) fn quantize_options(
    mode: &str,
    calibration: Option<PathBuf>,
    method: &str,
    symmetric: bool,
    per_channel: bool,
    exclude: Vec<String>,
    threads: Option<usize>,
) -> Result<aim::quantize::Options> {
    Ok(aim::quantize::Options {
        mode: mode.parse().map_err(anyhow::Error::msg)?,
        calibration,
        method: method.parse().map_err(anyhow::Error::msg)?,
        symmetric,
        per_channel,
        exclude,
        threads,
    })
}

pub(crate) fn quantize_cmd(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    opts: &aim::quantize::Options,
) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let mut progress = |phase: &str, done: usize, total: usize| {
        if tty {
            let filled = (done * 30).checked_div(total).unwrap_or(30);
            eprint!("\r{phase:12} [{}{}] {done}/{total}", "#".repeat(filled), ".".repeat(30 - filled));
            if done == total {
                eprintln!();
            }
        }
    };
    let s = aim::quantize::quantize(model, output, opts, &mut progress)?;
    let mut ops: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for (_, op) in &s.quantized {
        *ops.entry(op.as_str()).or_default() += 1;
    }
    let ops: Vec<String> = ops.iter().map(|(op, k)| format!("{k} {op}")).collect();
    let how = match opts.mode {
        aim::quantize::Mode::Static => format!(
            "static QDQ, {} activations calibrated by {:?} over {} input sets, s8 weights {}",
            if opts.symmetric { "s8 symmetric" } else { "u8 asymmetric" },
            opts.method,
            s.calibration_sets,
            if opts.per_channel { "per channel" } else { "per tensor" }
        ),
        aim::quantize::Mode::Dynamic => {
            format!("dynamic, s8 weights {}", if opts.per_channel { "per channel" } else { "per tensor" })
        }
    };
    writeln!(out, "{}: quantized {} nodes ({}): {how}", output.display(), s.quantized.len(), ops.join(", "))?;
    let (sets, random) = s.accuracy_sets;
    if sets == 0 {
        writeln!(out, "accuracy not measured: the inputs have symbolic dims; pass --calibration DIR with input sets")?;
        return Ok(());
    }
    writeln!(
        out,
        "accuracy against the f32 model over {sets} {}input sets:",
        if random { "seeded random " } else { "calibration " }
    )?;
    writeln!(out, "  {:24} {:>12} {:>14} {:>16}", "output", "max |diff|", "RMS diff / RMS", "top-1 agreement")?;
    for e in &s.accuracy {
        let top1 = e.top1.map_or("-".to_string(), |(a, n)| format!("{a}/{n} ({:.1}%)", 100.0 * a as f64 / n as f64));
        writeln!(out, "  {:24} {:>12.4e} {:>13.3}% {:>16}", e.name, e.max_abs, 100.0 * e.rel_rms, top1)?;
    }
    Ok(())
}
