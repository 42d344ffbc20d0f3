//! `aim bench`: compile time, latency over repeated runs, peak memory, and a per-node
//! profile.

use aim::{npz, Model};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

/// Peak resident memory of this process in MiB (Linux: VmHWM), or 0 where unknown.
pub(crate) fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Prints the nodes that took longest and writes a Chrome trace of the median of `runs`
/// profiled runs per node.
pub(crate) fn profile(
    out: &mut dyn Write,
    m: &Model,
    ins: &[(String, aim::Tensor)],
    trace: &std::path::Path,
) -> Result<()> {
    let runs: Vec<Vec<aim_runtime::NodeTiming>> =
        (0..5).map(|_| m.run_profiled(ins.to_vec())).collect::<Result<_, _>>()?;
    let first = &runs[0];
    let median_us = |i: usize| {
        let mut v: Vec<f64> = runs.iter().map(|r| r[i].time.as_secs_f64() * 1e6).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let mut events = Vec::new();
    let mut clock = 0.0;
    let mut by_node: Vec<(f64, &aim_runtime::NodeTiming)> = Vec::new();
    for (i, t) in first.iter().enumerate() {
        let us = median_us(i);
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        events.push(format!(
            "{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {clock:.3}, \"dur\": {us:.3}, \"pid\": 1, \"tid\": 1}}",
            esc(&t.node),
            esc(&t.op)
        ));
        clock += us;
        by_node.push((us, t));
    }
    std::fs::write(trace, format!("{{\"traceEvents\": [\n{}\n]}}\n", events.join(",\n")))
        .with_context(|| format!("writing {}", trace.display()))?;
    by_node.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = by_node.iter().map(|x| x.0).sum();
    writeln!(out, "profile (median of 5 runs per node; {total:.0} us in nodes; trace: {}):", trace.display())?;
    let mut per_op: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
    for (us, t) in &by_node {
        let e = per_op.entry(t.op.as_str()).or_default();
        e.0 += us;
        e.1 += 1;
    }
    let mut ops: Vec<_> = per_op.into_iter().collect();
    ops.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    for (op, (us, n)) in ops.iter().take(12) {
        writeln!(out, "  {:>6.1}%  {us:>10.1} us  {n:>4} x {op}", 100.0 * us / total)?;
    }
    writeln!(out, "top nodes:")?;
    for (us, t) in by_node.iter().take(15) {
        writeln!(out, "  {us:>10.1} us  {}  ({})", t.node, t.op)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn bench(
    out: &mut dyn Write,
    model: PathBuf,
    inputs: Vec<PathBuf>,
    iters: usize,
    warmup: usize,
    opts: aim::Options,
    json: bool,
    trace: Option<PathBuf>,
) -> Result<()> {
    if iters == 0 {
        bail!("--iters must be at least 1");
    }
    let given: Vec<Vec<(String, aim::Tensor)>> = inputs.iter().map(|p| npz::read_npz(p)).collect::<Result<_, _>>()?;
    // The programs the runs use are compiled at load and counted in the compile time: for a
    // model with symbolic dims, those specialised to the inputs' shapes.
    let mut opts = opts;
    if let (false, true, aim::Backend::Cpu) = (given.is_empty(), opts.shapes.is_empty(), opts.backend) {
        let ir = aim::compiled::import(&model)?;
        if ir.graph.inputs.iter().any(|i| i.ty.concrete_shape().is_none()) {
            opts.shapes =
                given.iter().map(|ins| ins.iter().map(|(n, t)| (n.clone(), t.shape().to_vec())).collect()).collect();
        }
    }
    let t0 = std::time::Instant::now();
    let m = Model::load_with_options(&model, &opts)?;
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    let sets = if given.is_empty() {
        // Random inputs of the first `--shape` signature where dims are symbolic.
        let shaped = opts.shapes.first().map_or(&[][..], Vec::as_slice);
        vec![aim::random_inputs_shaped(m.inputs(), shaped, 0).map_err(anyhow::Error::msg)?]
    } else {
        given
    };
    let ins = &sets[0];
    for k in 0..warmup.max(sets.len()) {
        m.run(sets[k % sets.len()].clone())?;
    }
    let mut times: Vec<f64> = (0..iters)
        .map(|k| {
            let t = std::time::Instant::now();
            m.run(sets[k % sets.len()].clone()).map(|_| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()?;
    times.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let (min, median, p90, max) = (times[0], pick(0.5), pick(0.9), times[times.len() - 1]);
    let threads = m.threads();
    writeln!(out, "{}: {:?} backend, {threads} thread(s)", model.display(), m.backend())?;
    writeln!(out, "compile: {compile_ms:.1} ms")?;
    writeln!(
        out,
        "latency over {iters} runs: min {min:.3} ms, median {median:.3} ms, p90 {p90:.3} ms, max {max:.3} ms"
    )?;
    let rss = peak_rss_mb();
    writeln!(out, "peak RSS: {rss:.1} MiB")?;
    if let Some(plan) = m.memory_plan() {
        writeln!(out, "{plan}")?;
    }
    // After the runs: a fast kernel that declined a node's attributes or shapes shows here
    // (`aim info` cannot know without running).
    if let Some((_, kinds)) = m.node_kinds() {
        let reference: Vec<&str> = kinds
            .iter()
            .filter(|(_, k)| *k == aim_runtime::cpu::NodeKind::Reference)
            .map(|(n, _)| n.as_str())
            .collect();
        writeln!(out, "nodes on reference kernels in these runs: {} {}", reference.len(), reference.join(", "))?;
    }
    if let Some(trace) = trace {
        profile(out, &m, ins, &trace)?;
    }
    if json {
        writeln!(
            out,
            "{{\"compile_ms\": {compile_ms:.3}, \"latency_ms\": {{\"min\": {min:.4}, \"median\": {median:.4}, \"p90\": {p90:.4}, \"max\": {max:.4}}}, \"iters\": {iters}, \"threads\": {threads}, \"peak_rss_mb\": {rss:.1}}}"
        )?;
    }
    Ok(())
}
