//! `aim info`: a model's inputs, outputs, ops and what the cpu backend makes of them.

use crate::args::parse_shapes;
use aim::{Backend, Model};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

pub(crate) fn info(out: &mut dyn Write, path: PathBuf, verify: bool) -> Result<()> {
    let aim_file = aim::compiled::is_aim_file(&path);
    if verify && !aim_file {
        bail!("--verify checks the checksums of a .aim file; {} is not one", path.display());
    }
    let ir = aim::compiled::import(&path)?;
    // A malformed graph is an error here too (unsupported ops are listed below instead).
    aim_ir::verify(&ir.graph).with_context(|| format!("{}: invalid graph", path.display()))?;
    let mut typed = ir.graph.clone();
    aim_ir::infer::infer_types(&mut typed).with_context(|| format!("{}: type inference", path.display()))?;
    let g = &ir.graph;
    writeln!(out, "model: {}", path.display())?;
    if aim_file {
        let (h, data, verified) = aim::compiled::header(&path, verify)?;
        let (programs, chosen) = aim::package::programs(&path, "native")?;
        let target = |h: &aim_ir::aim_file::Header| -> String {
            h.target.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
        };
        if programs.len() == 1 {
            writeln!(out, "aim file: {} program from {} by {} (target {})", h.stage, h.source, h.writer, target(&h))?;
        } else {
            writeln!(out, "aim file: {} programs from {} by {}", programs.len(), h.source, h.writer)?;
            for (i, p) in programs.iter().enumerate() {
                let mark = if chosen.as_ref().ok() == Some(&i) { "  (runs here)" } else { "" };
                writeln!(out, "  program {i}: {} {} (target {}){mark}", p.stage, aim::package::describe(p), target(p))?;
            }
            if let Err(why) = &chosen {
                writeln!(out, "  {why}")?;
            }
        }
        writeln!(out, "data section: {:.1} MiB", data as f64 / (1 << 20) as f64)?;
        if let Some(n) = verified {
            writeln!(out, "checksums: all {n} constants verified")?;
        }
    }
    if !ir.doc.is_empty() {
        writeln!(out, "doc: {}", ir.doc)?;
    }
    for (k, v) in &ir.metadata {
        writeln!(out, "metadata: {k} = {v}")?;
    }
    writeln!(
        out,
        "opset: {}{}",
        ir.opset,
        if ir.producer.is_empty() { String::new() } else { format!(" (producer: {})", ir.producer) }
    )?;
    writeln!(out, "inputs:")?;
    for i in &g.inputs {
        writeln!(out, "  {}: {}", i.name, i.ty)?;
    }
    writeln!(out, "outputs:")?;
    for o in &g.outputs {
        writeln!(out, "  {}: {}", o.name, o.ty)?;
    }
    let weights: usize = g.initializers.values().map(|t| t.bytes().len()).sum();
    writeln!(out, "initializers: {} ({:.1} MiB)", g.initializers.len(), weights as f64 / (1 << 20) as f64)?;
    writeln!(out, "nodes: {}", g.node_count_deep())?;
    writeln!(out, "ops:")?;
    for ((domain, op), nodes) in g.op_uses() {
        let d = if domain.is_empty() { String::new() } else { format!("{domain}:") };
        writeln!(out, "  {:>5}  {d}{op}", nodes.len())?;
    }
    // An optimized `.aim` program's `aim` ops are the cpu backend's own.
    let mut unsupported = aim_runtime::unsupported_ops(g);
    if aim_file {
        unsupported.retain(|op, _| !op.starts_with("aim:"));
    }
    if unsupported.is_empty() {
        writeln!(out, "unsupported ops: none")?;
    } else {
        writeln!(out, "unsupported ops:")?;
        for (op, nodes) in unsupported {
            writeln!(out, "  {op}: {}", nodes.join(", "))?;
        }
    }
    Ok(())
}

pub(crate) fn info_cmd(
    out: &mut dyn Write,
    model: Option<PathBuf>,
    verify: bool,
    target: bool,
    cpu: &str,
    shape: &[String],
) -> Result<()> {
    if model.is_none() && !target {
        bail!("give a model, --target, or both");
    }
    if target {
        let t = aim_compiler::target::Target::host().with_cpu(cpu)?;
        writeln!(out, "{t}")?;
    }
    if let Some(m) = model {
        info(out, m.clone(), verify)?;
        cpu_info(out, &m, cpu, &parse_shapes(shape)?)?;
    }
    Ok(())
}

/// What the cpu backend makes of a model: fused and compiled nodes, the nodes left to
/// fast or reference kernels, and the memory plan.
pub(crate) fn cpu_info(
    out: &mut dyn Write,
    path: &std::path::Path,
    cpu: &str,
    shapes: &[aim::InputShapes],
) -> Result<()> {
    let opts = aim::Options {
        backend: Backend::Cpu,
        threads: Some(1),
        cpu: cpu.into(),
        shapes: shapes.to_vec(),
        ..aim::Options::default()
    };
    let m = match Model::load_with_options(path, &opts) {
        Ok(m) => m,
        // A --shape the model does not take is the user's mistake; other failures are
        // reported as the cpu backend's state.
        Err(e @ aim::Error::BadOption { .. }) => return Err(e.into()),
        Err(e) => {
            writeln!(out, "cpu backend: not available: {e}")?;
            return Ok(());
        }
    };
    if let Some((sig, Some(_))) = m.specializations().into_iter().next() {
        writeln!(out, "cpu backend: the program specialised to input shapes {sig:?}")?;
    }
    let Some((g, kinds)) = m.node_kinds() else {
        writeln!(out, "cpu backend: not available: the program does not compile")?;
        return Ok(());
    };
    let g = &g;
    let plan = aim_compiler::memory_plan::plan(g);
    let mut by_kind: std::collections::BTreeMap<aim_runtime::cpu::NodeKind, Vec<&str>> = Default::default();
    for (name, kind) in &kinds {
        by_kind.entry(*kind).or_default().push(name);
    }
    writeln!(out, "cpu backend: {} nodes after optimisation (from {})", g.nodes.len(), m.ir().graph.node_count_deep())?;
    for (kind, nodes) in &by_kind {
        let shown: Vec<&str> = nodes.iter().take(8).copied().collect();
        let more = if nodes.len() > 8 { format!(", ... {} more", nodes.len() - 8) } else { String::new() };
        writeln!(out, "  {:>4}  {}: {}{more}", nodes.len(), kind.label(), shown.join(", "))?;
    }
    quantized_report(out, &m.ir().graph, g)?;
    if let Some(how) = m.runs_as() {
        writeln!(out, "runs as: {how}")?;
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let allocated: usize = plan.allocated.iter().map(|a| a.1).sum();
    writeln!(
        out,
        "memory: arena {:.1} MiB holds {:.1} MiB of kernel outputs ({} values, {} in place, {} views); {} values ({:.1} MiB) allocated by library kernels or returned{}",
        mib(plan.arena_bytes),
        mib(plan.placed_bytes),
        plan.slots.iter().filter(|s| s.view_of.is_none()).count(),
        plan.slots.iter().filter(|s| s.in_place_of.is_some()).count(),
        plan.slots.iter().filter(|s| s.view_of.is_some()).count(),
        plan.allocated.len(),
        mib(allocated),
        if plan.dynamic.is_empty() { String::new() } else { format!(", {} of dynamic size", plan.dynamic.len()) }
    )?;
    Ok(())
}

/// For a quantized model: which of its quantized nodes run as integer kernels
/// (`aim:QDense`, `aim:QConv`), which as f32 kernels between a dequantize and a quantize, and which are
/// left to the integer reference kernels.
pub(crate) fn quantized_report(out: &mut dyn Write, imported: &aim_ir::Graph, optimized: &aim_ir::Graph) -> Result<()> {
    let quantized = |op: &str| {
        matches!(
            op,
            "QuantizeLinear"
                | "DequantizeLinear"
                | "DynamicQuantizeLinear"
                | "QLinearConv"
                | "QLinearMatMul"
                | "MatMulInteger"
                | "ConvInteger"
        )
    };
    // Counted by ONNX node: a com.microsoft op expanded at import (QLinearAdd into
    // dequantize, add, quantize) is its one source node.
    let source = |n: &'_ aim_ir::Node| -> String {
        match n.attrs.get(aim_compiler::passes::SOURCES) {
            Some(aim_ir::Attr::Strings(s)) if !s.is_empty() => s[0].clone(),
            _ => n.name.clone(),
        }
    };
    let mut names: Vec<String> =
        imported.nodes.iter().filter(|n| n.domain.is_empty() && quantized(&n.op)).map(source).collect();
    names.sort();
    names.dedup();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    if names.is_empty() {
        return Ok(());
    }
    use aim_ir::schema::Quantized;
    let quantized_as = |n: &aim_ir::Node, q: Quantized| {
        n.domain == "aim" && aim_ir::schema::aim_op(&n.op).is_some_and(|o| o.quantized == q)
    };
    let integer: Vec<&aim_ir::Node> = optimized.nodes.iter().filter(|n| quantized_as(n, Quantized::Integer)).collect();
    let edges = optimized.nodes.iter().filter(|n| quantized_as(n, Quantized::Edge)).count();
    // The quantized nodes inside integer kernels and at the edges of byte regions: those
    // they name as sources, and the activation quantizations every reader of which went
    // into one (fused there).
    // A source names an imported node, or a node a pass made from one (`NAME/...`, as
    // the QOperator ops become quantize-dequantize pairs around f32 ops).
    let mut inside: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for n in optimized.nodes.iter().filter(|n| quantized_as(n, Quantized::Integer) || quantized_as(n, Quantized::Edge))
    {
        if let Some(aim_ir::Attr::Strings(s)) = n.attrs.get(aim_compiler::passes::SOURCES) {
            for src in s {
                let of = |name: &&str| src == name || src.strip_prefix(name).is_some_and(|r| r.starts_with('/'));
                inside.extend(names.iter().copied().filter(|n| of(n)));
            }
        }
    }
    let remaining: std::collections::HashSet<&str> = optimized.nodes.iter().map(|n| n.name.as_str()).collect();
    for d in imported.nodes.iter().filter(|n| n.op == "DynamicQuantizeLinear" && !remaining.contains(n.name.as_str())) {
        let mut readers = imported.nodes.iter().filter(|n| n.inputs.iter().any(|i| d.outputs.contains(i)));
        if readers.all(|r| inside.contains(r.name.as_str()) || r.op == "Mul") {
            inside.insert(d.name.as_str());
        }
    }
    let mut left: Vec<String> = optimized
        .nodes
        .iter()
        .filter(|n| n.domain.is_empty() && quantized(&n.op) && n.op != "DynamicQuantizeLinear")
        .map(source)
        .filter(|s| !inside.contains(s.as_str()))
        .collect();
    left.sort();
    left.dedup();
    let left: Vec<&str> = left.iter().map(|s| s.as_str()).collect();
    let shown: Vec<&str> = left.iter().take(8).copied().collect();
    let mut kinds: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for n in &integer {
        *kinds.entry(n.op.as_str()).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(op, k)| format!("{k} aim:{op}")).collect();
    writeln!(
        out,
        "quantized: {} integer kernels ({}: u8×s8 sums in i32{}) for {} quantized nodes; {} quantized nodes run as f32 kernels between dequantization and quantization; {} left to the integer reference kernels{}{}",
        integer.len(),
        if kinds.is_empty() { "none".to_string() } else { kinds.join(", ") },
        if edges > 0 { format!("; activations kept as bytes NHWC between them, {edges} region edges") } else { String::new() },
        inside.len(),
        names.len().saturating_sub(left.len() + inside.len()),
        left.len(),
        if left.is_empty() { "" } else { ": " },
        shown.join(", ")
    )?;
    Ok(())
}
