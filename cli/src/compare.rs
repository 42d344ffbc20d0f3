//! `aim compare`: per-layer comparison of two backends.

use aim::npz;
use anyhow::{bail, Result};
use std::io::Write;
use std::path::PathBuf;

/// `aim compare`: the report, and whether every value is within the tolerance.
pub(crate) fn compare(
    out: &mut dyn Write,
    model: &std::path::Path,
    inputs: Option<PathBuf>,
    against: &str,
    tolerance: f64,
    json: bool,
    opts: &aim::Options,
) -> Result<bool> {
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        bail!("--tolerance {tolerance}: expected a non-negative number");
    }
    let against = match against {
        "reference" => aim::compare::Against::Reference,
        file => {
            let values = npz::read_npz(std::path::Path::new(file))?.into_iter().collect();
            aim::compare::Against::Values { what: file.to_string(), values }
        }
    };
    let ins = match inputs {
        Some(p) => npz::read_npz(&p)?,
        None => {
            let ir = aim::compiled::import(model)?;
            aim::random_inputs(&ir.graph.inputs, 0).map_err(anyhow::Error::msg)?
        }
    };
    let report = aim::compare::compare(model, ins, &against, tolerance, opts)?;
    let name = model.display().to_string();
    if json {
        writeln!(out, "{}", aim::compare::render_json(&report, &name))?;
    } else {
        out.write_all(aim::compare::render_text(&report, &name).as_bytes())?;
    }
    Ok(report.first_over().is_none())
}
