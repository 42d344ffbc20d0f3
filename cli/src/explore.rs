//! `aim explore`: every stage of the compiler, as text or a page.

use crate::args::{parse_shapes, parse_size};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

#[allow(clippy::too_many_arguments)]
/// The GPU of `aim explore`'s ptx stage: when `--gpu` is given or the stage is named.
pub(crate) fn gpu_for_explore(
    stages: &[String],
    gpu: Option<&str>,
    allow_tf32: bool,
    half: Option<&str>,
) -> Result<Option<aim_cuda::GpuTarget>> {
    if gpu.is_none() && !stages.iter().any(|s| s == "ptx") {
        return Ok(None);
    }
    let arch = gpu.unwrap_or("sm_80");
    let t = aim_cuda::GpuTarget::parse(arch)
        .with_context(|| format!("--gpu {arch}: expected sm_80, sm_86, sm_89 or sm_90"))?;
    let half = match half {
        None => None,
        Some("f16") => Some(aim_cuda::Half::F16),
        Some("bf16") => Some(aim_cuda::Half::Bf16),
        Some(h) => bail!("--half {h}: expected f16 or bf16"),
    };
    Ok(Some(t.with_tf32(allow_tf32).with_half(half)))
}

/// `aim explore`'s options from its flags.
pub(crate) fn explore_options(
    passes: bool,
    profile: Option<PathBuf>,
    cpu: String,
    caches: Option<String>,
    shape: &[String],
    gpu: Option<aim_cuda::GpuTarget>,
) -> Result<aim::explore::Options> {
    let shapes = parse_shapes(shape)?;
    let caches = match caches {
        None => None,
        Some(c) => {
            let v: Vec<usize> = c.split(',').map(parse_size).collect::<Result<_>>()?;
            let [l1, l2, l3] = v[..] else { bail!("--caches takes three sizes: L1D,L2,L3 (got '{c}')") };
            Some([l1, l2, l3])
        }
    };
    Ok(aim::explore::Options { cpu, caches, passes, profile, shapes, gpu, ..Default::default() })
}

pub(crate) fn explore(
    out: &mut dyn Write,
    model: &std::path::Path,
    stages: &[String],
    node: Option<&str>,
    html: Option<PathBuf>,
    opts: &aim::explore::Options,
) -> Result<()> {
    // Refuse an unknown stage before the (slower) work.
    for s in stages {
        if s != "all" && !aim::explore::STAGES.contains(&s.as_str()) {
            bail!("unknown stage '{s}' (expected one of {}, all)", aim::explore::STAGES.join(", "));
        }
    }
    let e = aim::explore::explore(model, opts)?;
    aim::explore::check_request(&e, stages, node)?;
    match html {
        Some(path) => {
            let page = aim::explore::html::render(&e);
            std::fs::write(&path, &page).with_context(|| format!("writing {}", path.display()))?;
            writeln!(out, "wrote {} ({} bytes)", path.display(), page.len())?;
        }
        None => out.write_all(aim::explore::render_text(&e, stages, node, opts.passes).as_bytes())?,
    }
    Ok(())
}
