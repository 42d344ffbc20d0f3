//! `aim run`: one run of a model, its outputs summarised or written to `.npz`.

use aim::{npz, Model};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

pub(crate) fn summary(t: &aim::Tensor) -> String {
    let v = t.to_f64_vec();
    let shown: Vec<String> = v.iter().take(5).map(|x| format!("{x:.6}")).collect();
    let more = if v.len() > 5 { ", ..." } else { "" };
    if v.is_empty() {
        return format!("{}{:?} (empty)", t.dtype(), t.shape());
    }
    let (mn, mx) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    format!("{}{:?} min {mn:.6} max {mx:.6} mean {mean:.6} [{}{more}]", t.dtype(), t.shape(), shown.join(", "))
}

pub(crate) fn run(
    out: &mut dyn Write,
    model: PathBuf,
    inputs: Option<PathBuf>,
    outputs: Option<PathBuf>,
    opts: aim::Options,
    seed: u64,
) -> Result<()> {
    let m = Model::load_with_options(&model, &opts)?;
    let ins = match inputs {
        Some(p) => npz::read_npz(&p)?,
        None => aim::random_inputs_shaped(m.inputs(), opts.shapes.first().map_or(&[][..], Vec::as_slice), seed)
            .map_err(anyhow::Error::msg)?,
    };
    let outs = m.run(ins).with_context(|| format!("running {}", model.display()))?;
    for (name, t) in &outs {
        writeln!(out, "{name}: {}", summary(t))?;
    }
    if let Some(plan) = m.memory_plan() {
        eprintln!("{plan}");
    }
    if let Some(p) = outputs {
        npz::write_npz(&p, &outs)?;
    }
    Ok(())
}
