//! `aim test-onnx`: ONNX backend test cases run and checked.

use aim::{conformance, Backend};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

pub(crate) fn test_onnx(out: &mut dyn Write, dirs: Vec<PathBuf>, backend: Backend, quiet: bool) -> Result<bool> {
    if dirs.is_empty() {
        bail!("give at least one directory of ONNX test cases");
    }
    let cases = conformance::find_cases(&dirs).context("listing test cases")?;
    if cases.is_empty() {
        bail!(
            "no test cases (directories with model.onnx) under {}",
            dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for c in &cases {
        let name = c.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        match conformance::run_case(c, backend) {
            conformance::Outcome::Pass => {
                pass += 1;
                if !quiet {
                    writeln!(out, "{name}: pass")?;
                }
            }
            conformance::Outcome::Fail(r) => {
                fail += 1;
                writeln!(out, "{name}: fail: {r}")?;
            }
            conformance::Outcome::Skipped(r) => {
                skip += 1;
                if !quiet {
                    writeln!(out, "{name}: skipped: {r}")?;
                }
            }
        }
    }
    writeln!(out, "{pass} passed, {fail} failed, {skip} skipped")?;
    Ok(fail == 0)
}
