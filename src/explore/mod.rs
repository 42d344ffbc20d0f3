//! `aim explore`: what aim does to a model, stage by stage, the way Compiler Explorer shows
//! source beside assembly. Every stage is a list of lines, and every line that stands for
//! part of the model carries the ONNX nodes it came from (a fused node: all of them), so a
//! node can be followed from the file to the machine code (`--node`), and the HTML page can
//! highlight one node across every pane.
//!
//! Output is deterministic: no addresses, no timings (except the pass times of `--passes`,
//! which are printed on their own header lines), no hash-map order.

pub mod html;

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The stages, in pipeline order.
pub const STAGES: [&str; 7] = ["onnx", "graph", "optimized", "scheduled", "clif", "asm", "ptx"];

/// One printed line and the ONNX nodes it came from (empty for structure: headers, braces).
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// The text, without the `; from:` suffix.
    pub text: String,
    /// Source ONNX node names (as the importer names them).
    pub sources: Vec<String>,
}

/// One stage's lines.
#[derive(Clone, Debug)]
pub struct Stage {
    /// Its key (`onnx`, `graph`, ...).
    pub key: &'static str,
    /// A one-line description.
    pub title: &'static str,
    /// The lines.
    pub lines: Vec<Line>,
}

/// The level a target's pipeline ran at and the passes it left out, with why.
fn pass_choice(target: &aim_compiler::target::Target) -> String {
    let o = &target.optimization;
    let mut skipped: Vec<String> = Vec::new();
    for name in aim_compiler::passes::cpu_pass_names(target) {
        // Passes of options not asked for are not "left out".
        if (name == "half-weights" && !target.half_weights)
            || (name == "int4-weights" && target.int4_weights.is_none())
            || (name == "int8-weights" && !target.int8_weights)
        {
            continue;
        }
        let why = if o.disabled.iter().any(|d| d == name) {
            "disabled".to_string()
        } else if aim_compiler::passes::min_level(name) > o.level {
            format!("from -O{}", aim_compiler::passes::min_level(name).number())
        } else {
            continue;
        };
        let entry = format!("{name} ({why})");
        if !skipped.contains(&entry) {
            skipped.push(entry);
        }
    }
    let level = format!("-O{}", o.level.number());
    if skipped.is_empty() {
        format!("{level}: every pass")
    } else {
        format!("{level}; not run: {}", skipped.join(", "))
    }
}

/// The graph after one pass of the pipeline.
#[derive(Clone, Debug)]
pub struct PassView {
    /// The pass.
    pub name: &'static str,
    /// How long it took.
    pub time: std::time::Duration,
    /// The node lines after it; `true` marks a line the pass added or changed.
    pub lines: Vec<(bool, Line)>,
    /// Node lines the pass removed (or changed: their old text).
    pub removed: Vec<Line>,
}

/// Per-node figures of the optimised graph.
#[derive(Clone, Debug)]
pub struct Figures {
    /// The node of the optimised graph.
    pub node: String,
    /// Its op.
    pub op: String,
    /// The ONNX nodes it came from.
    pub sources: Vec<String>,
    /// Floating-point operations (multiply-add = 2) for the shapes the graph's types give.
    pub flops: u64,
    /// Bytes read and written (inputs, weights and outputs once each).
    pub bytes: u64,
    /// Measured time from a profile, in microseconds.
    pub time_us: Option<f64>,
}

/// Everything `aim explore` shows for a model.
#[derive(Clone, Debug)]
pub struct Exploration {
    /// The model file.
    pub model: String,
    /// The target, as `aim info --target` prints it (one line).
    pub target: String,
    /// The stages, in order.
    pub stages: Vec<Stage>,
    /// The graph after each pass (when asked for).
    pub passes: Vec<PassView>,
    /// The optimisation level and the passes of the full pipeline that did not run, with
    /// why (`-O1; not run: fuse-gelu (-O2), ...`).
    pub pass_choice: String,
    /// Figures per node of the optimised graph.
    pub figures: Vec<Figures>,
}

/// What to explore for.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// ISA cap (`--cpu`), as for `aim run`.
    pub cpu: String,
    /// Cache sizes (L1d, L2, L3 bytes) to schedule for instead of this CPU's, so that the
    /// scheduled stage reads the same on every machine.
    pub caches: Option<[usize; 3]>,
    /// Keep the graph after every pass.
    pub passes: bool,
    /// A Chrome trace from `aim bench --profile`, for measured times.
    pub profile: Option<PathBuf>,
    /// Input shapes to specialise for (at most one signature), as the JIT does on a run with
    /// them: the stages after import show that program instead of the shape-generic one.
    pub shapes: Vec<crate::InputShapes>,
    /// The GPU to show the cuda backend's PTX for (the `ptx` stage; computed only when
    /// asked, as it runs the cuda pipeline too).
    pub gpu: Option<aim_cuda::GpuTarget>,
    /// Which passes of the cpu pipeline run (`-O`, `--disable-pass`), as for `aim run`.
    pub optimization: aim_compiler::passes::Optimization,
    /// Dense layers' weights as f16 (`--weights f16`), as for `aim run`.
    pub half_weights: bool,
    /// Dense layers' weights as 4-bit blocks of this many rows (`--weights int4`).
    pub int4_weights: Option<usize>,
    /// Dense layers' weights as 8-bit codes per column (`--weights int8`).
    pub int8_weights: bool,
}

/// The node line of the IR printer without its `# name` comment and `sources` attribute
/// (both said by the `; from:` column instead).
fn ir_lines(g: &aim_ir::Graph, n: &aim_ir::Node) -> Vec<String> {
    let mut n = n.clone();
    n.attrs.remove(aim_compiler::passes::SOURCES);
    let text = aim_ir::text::print_node(g, &n);
    let text = text.trim_end();
    let text = text.strip_suffix(&format!("# {}", n.name)).unwrap_or(text).trim_end();
    text.lines().map(str::to_string).collect()
}

fn sources(n: &aim_ir::Node) -> Vec<String> {
    aim_compiler::passes::sources_of(n)
}

/// The lines of a graph: inputs, an initializer summary, one item per node, outputs.
fn graph_lines(g: &aim_ir::Graph) -> Vec<Line> {
    let mut out = vec![Line { text: format!("graph {:?} {{", g.name), sources: vec![] }];
    for v in &g.inputs {
        out.push(Line { text: format!("  input %{}: {}", v.name, v.ty), sources: vec![] });
    }
    if !g.initializers.is_empty() {
        let bytes: usize = g.initializers.values().map(|t| t.len() * t.dtype().size()).sum();
        out.push(Line {
            text: format!("  initializers: {} tensors, {bytes} bytes", g.initializers.len()),
            sources: vec![],
        });
    }
    for n in &g.nodes {
        let src = sources(n);
        for l in ir_lines(g, n) {
            out.push(Line { text: format!("  {l}"), sources: src.clone() });
        }
    }
    for v in &g.outputs {
        out.push(Line { text: format!("  output %{}: {}", v.name, v.ty), sources: vec![] });
    }
    out.push(Line { text: "}".into(), sources: vec![] });
    out
}

/// Floating-point operations of one node of the optimised graph (multiply-add = 2).
fn flops(g: &aim_ir::Graph, n: &aim_ir::Node) -> u64 {
    let shape = |name: &str| g.value_type(name).and_then(|t| t.concrete_shape());
    let elems = |name: &str| shape(name).map_or(0, |s| s.iter().product::<usize>() as u64);
    let out = n.outputs.first().map_or(0, |o| elems(o));
    let w = n.input(1).and_then(|w| g.initializers.get(w));
    match (n.domain.as_str(), n.op.as_str()) {
        ("aim", "Conv") => {
            let Some(w) = w else { return 0 };
            // Blocked outputs count their padding channels out: true channels from W.
            let cout = w.shape()[0] as u64;
            let per_out: u64 = w.shape()[1..].iter().product::<usize>() as u64;
            let spatial = n.outputs.first().and_then(|o| shape(o)).map_or(0, |s| {
                if n.attrs.contains_key("layout") {
                    (s[0] * s[2] * s[3]) as u64
                } else {
                    (s[0] * s[2..].iter().product::<usize>()) as u64
                }
            });
            2 * cout * spatial * per_out
        }
        ("aim", "Dense") => {
            w.and_then(|w| aim_compiler::passes::fuse::dense_dims(n, w)).map_or(0, |(k, _)| 2 * out * k as u64)
        }
        ("", "MatMul") | ("", "Gemm") => {
            n.input(0).and_then(shape).and_then(|s| s.last().copied()).map_or(0, |k| 2 * out * k as u64)
        }
        ("aim", "Elementwise") => out * n.strings("program").map_or(1, |p| p.len() as u64),
        ("aim", _) => 0,
        _ => out,
    }
}

/// Bytes a node reads and writes.
fn bytes(g: &aim_ir::Graph, n: &aim_ir::Node) -> u64 {
    n.inputs
        .iter()
        .chain(&n.outputs)
        .filter(|s| !s.is_empty())
        .map(|s| {
            g.value_type(s)
                .and_then(|t| Some(t.concrete_shape()?.iter().product::<usize>() * t.dtype?.size()))
                .unwrap_or(0) as u64
        })
        .sum()
}

/// Median node times from a Chrome trace written by `aim bench --profile`.
fn read_profile(path: &Path) -> Result<BTreeMap<String, f64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading profile {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not a Chrome trace (JSON)", path.display()))?;
    let events = v
        .get("traceEvents")
        .and_then(|e| e.as_array())
        .with_context(|| format!("{}: no traceEvents list", path.display()))?;
    let mut out = BTreeMap::new();
    for e in events {
        if let (Some(name), Some(dur)) = (e.get("name").and_then(|n| n.as_str()), e.get("dur").and_then(|d| d.as_f64()))
        {
            *out.entry(name.to_string()).or_insert(0.0) += dur;
        }
    }
    Ok(out)
}

/// Runs every stage of the cpu backend on the model at `path`.
pub fn explore(path: &Path, opts: &Options) -> Result<Exploration> {
    let p = path.display().to_string();
    // A `.aim` file holds no ONNX graph; one of stage `optimized` holds the cpu pipeline's
    // output, which is shown as is (no pass runs again).
    let aim_stage =
        if crate::compiled::is_aim_file(path) { Some(crate::compiled::header(path, false)?.0.stage) } else { None };
    let onnx: Vec<Line> = match &aim_stage {
        Some(stage) => {
            vec![Line { text: format!("; {p} is a .aim file ({stage} program): no ONNX graph"), sources: vec![] }]
        }
        None => {
            let bytes_in = std::fs::read(path).with_context(|| format!("reading {p}"))?;
            aim_onnx::print_onnx(&bytes_in, &p)?
                .into_iter()
                .map(|(text, src)| Line { text, sources: src.into_iter().collect() })
                .collect()
        }
    };
    let optimized_file = aim_stage.as_deref() == Some("optimized");
    let mut ir = crate::compiled::import(path)?;
    aim_ir::verify(&ir.graph).with_context(|| format!("{p}: invalid graph"))?;
    // An optimized program's `aim` ops are the cpu backend's own, already typed.
    if !optimized_file {
        let ops = aim_runtime::unsupported_ops(&ir.graph);
        if !ops.is_empty() {
            return Err(crate::Error::Unsupported { path: p, ops }.into());
        }
        aim_ir::infer::infer_types(&mut ir.graph).with_context(|| format!("{p}: type inference"))?;
    }
    let graph = graph_lines(&ir.graph);

    let mut target = aim_compiler::target::Target::host().with_cpu(&opts.cpu)?;
    if opts.optimization.level == crate::OptLevel::O0 {
        bail!("-O0 runs every node on its reference kernel: it compiles nothing to explore (try -O1)");
    }
    target.optimization = opts.optimization.clone();
    target.half_weights = opts.half_weights;
    target.int4_weights = opts.int4_weights;
    target.int8_weights = opts.int8_weights;
    target.optimization.check(&aim_compiler::passes::cpu_pass_names(&target)).map_err(anyhow::Error::msg)?;
    if let Some([l1, l2, l3]) = opts.caches {
        target = target.with_caches(l1, l2, l3);
    }
    let mut g = ir.graph.clone();
    match crate::signatures(&g, &opts.shapes, &p)?.as_slice() {
        [] => {}
        [sig] => crate::specialize::bind(&mut g, sig, &p)?,
        _ => bail!("explore shows one program: give each input one --shape"),
    }
    let bound = opts.passes.then(|| g.clone());
    let ptx = match opts.gpu {
        Some(gpu) if !optimized_file => ptx_lines(&g, &gpu),
        Some(_) => vec![Line { text: format!("; {p} holds the cpu backend's program: no PTX"), sources: vec![] }],
        None => Vec::new(),
    };
    let records = if optimized_file {
        Vec::new()
    } else {
        aim_compiler::passes::run_pipeline(&mut g, &aim_compiler::passes::cpu_pipeline(&target), opts.passes)
            .with_context(|| format!("{p}: optimising"))?
    };
    let optimized = graph_lines(&g);
    let passes = if opts.passes { pass_views(bound.as_ref().unwrap_or(&ir.graph), &records) } else { Vec::new() };

    let profile = match &opts.profile {
        Some(f) => Some(read_profile(f)?),
        None => None,
    };
    let figures = g
        .nodes
        .iter()
        .map(|n| Figures {
            node: n.name.clone(),
            op: if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) },
            sources: sources(n),
            flops: flops(&g, n),
            bytes: bytes(&g, n),
            time_us: profile.as_ref().and_then(|p| p.get(&n.name).copied()),
        })
        .collect();

    // Generated code: the Cranelift IR and machine code of every fused elementwise loop, row
    // reduction and transpose, named as the code generator names them.
    let mut clif = Vec::new();
    let mut asm = Vec::new();
    let mut k = 0;
    for n in &g.nodes {
        let src = sources(n);
        let texts = match (n.domain.as_str(), n.op.as_str()) {
            ("aim", "Elementwise") => {
                let prog = aim_compiler::ewprog::parse(n.strings("program").unwrap_or_default())
                    .map_err(|e| anyhow::anyhow!("node {}: {e}", n.name))?;
                let name = format!("aim_ew_{k}");
                Some((aim_compiler::codegen::elementwise_text(&name, &prog, n.inputs.len(), &target)?, name))
            }
            ("aim", "Transpose") => {
                let (rank, contiguous) = aim_compiler::codegen::transpose_form(n).context("a data-movement node")??;
                let name = format!("aim_transpose_{k}");
                Some((aim_compiler::codegen::transpose_text(&name, rank, contiguous, &target)?, name))
            }
            ("aim", "Reduce") => {
                let mode = aim_compiler::codegen::ReduceMode::parse(n.string("mode", ""))
                    .with_context(|| format!("node {}: unknown reduction", n.name))?;
                let name = format!("aim_reduce_{k}");
                Some((aim_compiler::codegen::reduce_text(&name, mode, &target)?, name))
            }
            _ => None,
        };
        if let Some(((c, a), name)) = texts {
            k += 1;
            for (lines, text) in [(&mut clif, c), (&mut asm, a)] {
                lines.push(Line { text: format!("; {name}: node {}", n.name), sources: src.clone() });
                lines.extend(text.lines().map(|l| Line {
                    text: l.to_string(),
                    sources: if l.trim().is_empty() { vec![] } else { src.clone() },
                }));
                lines.push(Line { text: String::new(), sources: vec![] });
            }
        }
    }

    // The schedule: the program the cpu backend builds, node by node.
    let memory = aim_compiler::memory_plan::plan(&g);
    let slots: BTreeMap<&str, &aim_compiler::memory_plan::Slot> =
        memory.slots.iter().map(|s| (s.name.as_str(), s)).collect();
    let code = aim_compiler::codegen::generate(&g, &target)?;
    let pool = std::sync::Arc::new(aim_runtime::pool::ThreadPool::new(1)?);
    let prog = aim_runtime::cpu::CpuProgram::new(
        g.clone(),
        target.gemm_isa(),
        target.gemm_blocking(),
        pool,
        code,
        &crate::placement(&memory),
    )?;
    entry_lines(&prog, &g, &target, &mut clif, &mut asm)?;
    if clif.is_empty() {
        let none = Line {
            text: "; no generated functions: every node runs a precompiled kernel (see the scheduled stage)".into(),
            sources: vec![],
        };
        clif.push(none.clone());
        asm.push(none);
    }
    let mut scheduled = vec![Line {
        text: format!(
            "; arena: {} bytes for {} bytes of kernel outputs (first fit by lifetime); {} values allocated by library kernels or returned; microkernels: {:?}, kc {}, mc {}",
            memory.arena_bytes,
            memory.placed_bytes,
            memory.allocated.len(),
            target.gemm_isa(),
            target.gemm_blocking().kc,
            target.gemm_blocking().mc
        ),
        sources: vec![],
    }];
    let steps = prog.steps();
    for (i, (n, plan)) in g.nodes.iter().zip(prog.schedule()).enumerate() {
        let src = sources(n);
        let outs: Vec<String> = n
            .outputs
            .iter()
            .filter(|o| !o.is_empty())
            .map(|o| match slots.get(o.as_str()) {
                Some(s) => {
                    let how = match (&s.view_of, &s.in_place_of) {
                        (Some(v), _) => format!(" (view of %{v})"),
                        (_, Some(v)) => format!(" (in place of %{v})"),
                        _ => String::new(),
                    };
                    format!("%{o} @ arena[{}..{}]{how}", s.offset, s.offset + s.bytes)
                }
                None if memory.dynamic.contains(o) => format!("%{o} (size known at run time)"),
                None => format!("%{o} (allocated)"),
            })
            .collect();
        let op = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
        scheduled.push(Line { text: format!("{} {op} -> {}", n.name, outs.join(", ")), sources: src.clone() });
        for l in plan {
            scheduled.push(Line { text: format!("    {l}"), sources: src.clone() });
        }
        if let Some(steps) = steps {
            let text = match steps.iter().enumerate().find(|(_, s)| s.node == i) {
                Some((k, s)) => {
                    let locs = |ops: &[Option<aim_runtime::cpu::Operand>]| -> String {
                        let v: Vec<String> = ops.iter().flatten().map(|o| o.loc.to_string()).collect();
                        if v.is_empty() {
                            "-".into()
                        } else {
                            v.join(", ")
                        }
                    };
                    format!("step {k}: {}, reads {}, writes {}", s.kernel.label(), locs(&s.ins), locs(&s.outs))
                }
                None => "no step: its output is its input's bytes".to_string(),
            };
            scheduled.push(Line { text: format!("    {text}"), sources: src.clone() });
        }
    }

    let stages = vec![
        Stage { key: "onnx", title: "the ONNX graph as the file holds it", lines: onnx },
        Stage { key: "graph", title: "the IR after import (canonical op forms, inferred types)", lines: graph },
        Stage { key: "optimized", title: "the IR after the cpu pipeline's passes", lines: optimized },
        Stage {
            key: "scheduled",
            title: "how each node runs: kernel, loop nest, tiles, parallel tasks, arena offsets",
            lines: scheduled,
        },
        Stage { key: "clif", title: "Cranelift IR of each generated function", lines: clif },
        Stage { key: "asm", title: "machine code of each generated function (Cranelift's disassembly)", lines: asm },
    ];
    let mut stages = stages;
    if opts.gpu.is_some() {
        stages.push(Stage {
            key: "ptx",
            title: "the cuda backend's PTX: each kernel with its launch geometry",
            lines: ptx,
        });
    }
    Ok(Exploration {
        model: p,
        target: target.to_string().lines().take(3).collect::<Vec<_>>().join("; "),
        stages,
        passes,
        pass_choice: pass_choice(&target),
        figures,
    })
}

/// The cuda backend's kernels for `g` (before any cpu pass): the module header, the arena,
/// then each launch's kernel with its geometry; a graph the backend cannot lower gets the
/// reason as its one line.
fn ptx_lines(g: &aim_ir::Graph, gpu: &aim_cuda::GpuTarget) -> Vec<Line> {
    // A half model's weights stay half, as the backend compiles it.
    let gpu = &gpu.with_half(crate::gpu::half_model(g).or(gpu.half));
    let mut g = g.clone();
    if let Err(e) = aim_compiler::passes::run_pipeline(&mut g, &aim_compiler::passes::cuda_pipeline(), false) {
        return vec![Line { text: format!("// {e}"), sources: vec![] }];
    }
    let p = match aim_cuda::lower::lower(&g, gpu) {
        Ok(p) => p,
        Err(e) => {
            // The node's ONNX sources, when the failing node is one of the graph's.
            let src = g.nodes.iter().find(|n| n.name == e.node).map(sources).unwrap_or_default();
            return vec![Line { text: format!("// {e}"), sources: src }];
        }
    };
    let mut out: Vec<Line> =
        aim_cuda::ptx::module(gpu.sm, &[]).lines().map(|l| Line { text: l.to_string(), sources: vec![] }).collect();
    out.push(Line {
        text: format!(
            "// device program: {} launches; arena {} bytes; TF32 tensor cores {}; half weights {}",
            p.launches.len(),
            p.arena_bytes,
            if gpu.allow_tf32 { "on" } else { "off" },
            gpu.half.map_or("off", |h| h.ptx())
        ),
        sources: vec![],
    });
    // Each kernel once (ptxas refuses a module defining one twice), in the order of its
    // first launch, its launches listed in a comment.
    let mut order: Vec<usize> = Vec::new();
    for l in &p.launches {
        if !order.contains(&l.kernel) {
            order.push(l.kernel);
        }
    }
    for ki in order {
        let k = &p.kernels[ki];
        let nodes: Vec<&str> = p.launches.iter().filter(|l| l.kernel == ki).map(|l| l.node.as_str()).collect();
        out.push(Line { text: String::new(), sources: vec![] });
        out.push(Line { text: k.header(), sources: k.sources.clone() });
        out.push(Line {
            text: format!("// launched {} time(s), for: {}", nodes.len(), nodes.join(", ")),
            sources: k.sources.clone(),
        });
        out.extend(k.ptx.lines().map(|t| Line { text: t.to_string(), sources: k.sources.clone() }));
    }
    out
}

/// The graph after each pass, with the node lines each pass added, changed or removed.
fn pass_views(start: &aim_ir::Graph, records: &[aim_compiler::passes::PassRecord]) -> Vec<PassView> {
    let node_lines = |g: &aim_ir::Graph| -> Vec<Line> {
        g.nodes
            .iter()
            .flat_map(|n| {
                let src = sources(n);
                ir_lines(g, n).into_iter().map(move |t| Line { text: t, sources: src.clone() })
            })
            .collect()
    };
    let mut before = node_lines(start);
    let mut out = Vec::new();
    for r in records {
        let Some(g) = &r.after else { continue };
        let after = node_lines(g);
        let old: BTreeSet<&str> = before.iter().map(|l| l.text.as_str()).collect();
        let new: BTreeSet<&str> = after.iter().map(|l| l.text.as_str()).collect();
        let removed = before.iter().filter(|l| !new.contains(l.text.as_str())).cloned().collect();
        let lines = after.iter().map(|l| (!old.contains(l.text.as_str()), l.clone())).collect();
        out.push(PassView { name: r.name, time: r.time, lines, removed });
        before = after;
    }
    out
}

/// Whether a line belongs to `node` (an ONNX node name, or a node of the optimised graph).
fn matches(l: &Line, node: &str) -> bool {
    l.sources.iter().any(|s| s == node)
}

/// Checks `--node` and `--stage` before printing: one clear error for either.
pub fn check_request(e: &Exploration, stages: &[String], node: Option<&str>) -> Result<()> {
    for s in stages {
        if s != "all" && !STAGES.contains(&s.as_str()) {
            bail!("unknown stage '{s}' (expected one of {}, all)", STAGES.join(", "));
        }
    }
    if let Some(node) = node {
        if !e.stages.iter().any(|s| s.lines.iter().any(|l| matches(l, node))) {
            let names: BTreeSet<&str> =
                e.stages[0].lines.iter().flat_map(|l| l.sources.iter().map(String::as_str)).collect();
            let some: Vec<&str> = names.iter().take(5).copied().collect();
            bail!("{}: no node named '{node}' (nodes include {})", e.model, some.join(", "));
        }
    }
    Ok(())
}

fn push_line(out: &mut String, mark: &str, l: &Line) {
    out.push_str(mark);
    out.push_str(&l.text);
    if !l.sources.is_empty() {
        out.push_str("  ; from: ");
        out.push_str(&l.sources.join(", "));
    }
    out.push('\n');
}

/// A line of the ptx stage as PTX: the sources in a `//` comment, and ASCII only (node
/// names are the model's; ptxas takes nothing else), so that the stage as printed is a
/// module ptxas assembles.
fn push_ptx_line(out: &mut String, l: &Line) {
    let mut text = l.text.clone();
    if !l.sources.is_empty() {
        text += "  // from: ";
        text += &l.sources.join(", ");
    }
    out.extend(text.chars().map(|c| if c.is_ascii() { c } else { '?' }));
    out.push('\n');
}

/// The terminal view: the chosen stages (and the pass pipeline), optionally only the lines
/// of one node.
pub fn render_text(e: &Exploration, stages: &[String], node: Option<&str>, passes: bool) -> String {
    let all = stages.is_empty() || stages.iter().any(|s| s == "all");
    let mut out = String::new();
    for s in &e.stages {
        if !all && !stages.iter().any(|k| k == s.key) {
            continue;
        }
        let ptx = s.key == "ptx";
        out.push_str(&format!("{}== {}: {} ==\n", if ptx { "// " } else { "" }, s.key, s.title));
        for l in s.lines.iter().filter(|l| node.is_none_or(|n| matches(l, n))) {
            if ptx {
                push_ptx_line(&mut out, l);
            } else {
                push_line(&mut out, "", l);
            }
        }
        out.push('\n');
    }
    if passes {
        out.push_str(
            "== passes: the graph after each pass; + marks lines it added or changed, - lines it removed ==\n",
        );
        out.push_str(&format!("-- level {}\n", e.pass_choice));
        for (i, p) in e.passes.iter().enumerate() {
            let changed = p.lines.iter().any(|(c, _)| *c) || !p.removed.is_empty();
            out.push_str(&format!(
                "-- pass {}: {} ({:.3} ms){}\n",
                i + 1,
                p.name,
                p.time.as_secs_f64() * 1e3,
                if changed { "" } else { ": no change" }
            ));
            if !changed {
                continue;
            }
            for l in p.removed.iter().filter(|l| node.is_none_or(|n| matches(l, n))) {
                push_line(&mut out, "- ", l);
            }
            for (c, l) in p.lines.iter().filter(|(_, l)| node.is_none_or(|n| matches(l, n))) {
                push_line(&mut out, if *c { "+ " } else { "  " }, l);
            }
        }
    }
    out
}

/// The program's entry function, when its shapes are static: a comment per step (traced to
/// the step's node) saying what runs it, then its Cranelift IR and machine code. Without
/// one, a comment saying why the program runs node by node.
fn entry_lines(
    prog: &aim_runtime::cpu::CpuProgram,
    g: &aim_ir::Graph,
    target: &aim_compiler::target::Target,
    clif: &mut Vec<Line>,
    asm: &mut Vec<Line>,
) -> Result<()> {
    let (Some(ops), Some(steps)) = (prog.entry_ops(), prog.steps()) else {
        let why = prog.why_no_steps().unwrap_or("no static plan");
        let line =
            Line { text: format!("; no entry function: the program runs node by node ({why})"), sources: vec![] };
        clif.push(line.clone());
        asm.push(line);
        return Ok(());
    };
    let (c, a) = aim_compiler::codegen::entry_text(&ops, target)?;
    for lines in [&mut *clif, &mut *asm] {
        lines.push(Line {
            text: format!(
                "; aim_entry: the whole model, {} steps in order: generated loops called in place {}, kernels called through their kind's entry {}, library kernels through the step runner {}",
                ops.len(),
                ops.iter().filter(|o| matches!(o, aim_runtime::cpu::EntryOp::Loop { .. })).count(),
                ops.iter().filter(|o| matches!(o, aim_runtime::cpu::EntryOp::Kernel { .. })).count(),
                ops.iter().filter(|o| matches!(o, aim_runtime::cpu::EntryOp::Call { .. })).count()
            ),
            sources: vec![],
        });
        for op in &ops {
            let (step, what) = match op {
                aim_runtime::cpu::EntryOp::Loop { step, ins, out, len, .. } => {
                    let ins: Vec<String> = ins.iter().map(|a| a.to_string()).collect();
                    (*step, format!("generated loop over {len} elements, [{}] -> {out}", ins.join(", ")))
                }
                aim_runtime::cpu::EntryOp::Kernel { step, kernel, ops, what } => {
                    let ops: Vec<String> = ops.iter().map(|a| a.map_or("-".to_string(), |a| a.to_string())).collect();
                    (*step, format!("{}: {what}, operands [{}]", kernel.label(), ops.join(", ")))
                }
                aim_runtime::cpu::EntryOp::Call { step, what } => (*step, format!("run_step: {what}")),
            };
            let src = g.nodes.get(steps[step].node).map(sources).unwrap_or_default();
            lines.push(Line { text: format!(";   step {step}: {what}"), sources: src });
        }
    }
    let step_sources =
        |k: usize| -> Vec<String> { steps.get(k).and_then(|s| g.nodes.get(s.node)).map(sources).unwrap_or_default() };
    // The IR: instructions carry their step's number plus one as a source location
    // (`@000a`); other lines (block headers) belong to the step of the next instruction.
    let parsed: Vec<(Option<usize>, String)> = c
        .lines()
        .map(|l| {
            let t = l.trim_start();
            match t.strip_prefix('@').and_then(|r| r.split_once(' ')) {
                Some((hex, rest)) => match usize::from_str_radix(hex, 16) {
                    Ok(k) if k > 0 => (Some(k - 1), format!("    {}", rest.trim_start())),
                    _ => (None, format!("    {}", rest.trim_start())),
                },
                // Block headers are padded to the width of the source locations.
                None if t.starts_with("block") => (None, t.to_string()),
                None => (None, l.to_string()),
            }
        })
        .collect();
    let mut owner = vec![0; parsed.len()];
    let mut next = ops.len().saturating_sub(1);
    for (i, (k, _)) in parsed.iter().enumerate().rev() {
        next = k.unwrap_or(next);
        owner[i] = next;
    }
    for ((_, text), k) in parsed.into_iter().zip(owner) {
        let sources = if text.trim().is_empty() { vec![] } else { step_sources(k) };
        clif.push(Line { text, sources });
    }
    // The machine code: each step ends with its call, so a line belongs to the step whose
    // call is the next one.
    let mut k = 0;
    for l in a.lines() {
        let t = l.trim_start();
        asm.push(Line {
            text: l.to_string(),
            sources: if t.is_empty() { vec![] } else { step_sources(k.min(ops.len().saturating_sub(1))) },
        });
        if t.starts_with("call") || t.starts_with("blr") || t.starts_with("bl ") {
            k += 1;
        }
    }
    for lines in [clif, asm] {
        lines.push(Line { text: String::new(), sources: vec![] });
    }
    Ok(())
}
