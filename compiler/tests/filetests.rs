//! Pass filetests: each file under `compiler/tests/filetests/<pass>/` is a small graph in
//! aim's IR text, the pass (or passes) to run on it, and `; check:` lines on the IR that
//! comes out — Cranelift's `filetests` and LLVM's FileCheck tests are the model.
//!
//! ```text
//! ; test: fuse-epilogues            the passes to run, by their pipeline names, in order
//! ; target: x86-64-v3               optional: the cpu level (and +features) they run for
//! graph "g" {
//!   input %x: f32[1,8]
//!   init %w = f32[8,4] @0           @k: a deterministic tensor of that type (see `fill`)
//!   %m = MatMul(%x, %w)  # mm
//!   %y = Relu(%m)  # relu
//!   output %y: f32[1,4]
//! }
//! ; check: aim:Dense(%x, %w
//! ; check: activation="relu"
//! ; not: Relu(
//! ```
//!
//! The directives are the `filecheck` crate's (`check:`, `nextln:`, `sameln:`, `not:`,
//! `unordered:`, `regex:`), matched against the graph printed after the last pass, with
//! tensors of up to 16 values written out. Types are inferred before the first pass (as
//! import leaves them), and `aim_ir::verify` runs after every pass: a pass that leaves a
//! malformed graph fails its tests even where the checks would match.
//!
//! `; test: pipeline` runs the target's whole cpu pipeline; `; test: cuda-pipeline` the
//! cuda one. The target line may give an optimisation level (`-O1`) and passes to leave
//! out (`-disable=fuse-gelu`), which `pipeline` then honours.

use aim_compiler::passes::{cpu_pipeline, cuda_pipeline, Pass};
use aim_compiler::target::{Features, Level, Target};
use aim_ir::text::{parse_model_with_data, print_graph, TensorDetail};
use aim_ir::{DType, Tensor};
use std::path::{Path, PathBuf};

/// Each pass must have at least this many filetests of its own.
const MIN_TESTS_PER_PASS: usize = 3;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests")
}

/// Every `.aimir` file under `dir`, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else if p.extension().is_some_and(|x| x == "aimir") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The features an x86-64 or AArch64 level guarantees, with common cache sizes: the same
/// target whatever machine runs the test.
fn target_of(spec: &str) -> Result<Target, String> {
    let mut words = spec.split_whitespace();
    let level = match words.next().unwrap_or("x86-64-v3") {
        "x86-64-v4" => Level::X86V4,
        "x86-64-v3" => Level::X86V3,
        "x86-64-v2" => Level::X86V2,
        "baseline" => Level::Baseline,
        "aarch64-neon" => Level::Neon,
        other => return Err(format!("unknown target level '{other}'")),
    };
    let mut features = Features::guaranteed_by(level);
    let mut half_weights = false;
    let mut int4_weights = None;
    let mut int8_weights = false;
    let mut split_512 = false;
    let mut optimization = aim_compiler::passes::Optimization::default();
    for w in words {
        match w {
            "+avx512vnni" => features.avx512vnni = true,
            "+avx512bf16" => features.avx512bf16 = true,
            "+dotprod" => features.dotprod = true,
            "+f16-weights" => half_weights = true,
            "+int4-weights" => int4_weights = Some(32),
            "+int8-weights" => int8_weights = true,
            "+split512" => split_512 = true,
            _ if w.starts_with("-O") => {
                optimization.level = w[2..]
                    .parse()
                    .ok()
                    .and_then(aim_compiler::passes::OptLevel::from_number)
                    .ok_or_else(|| format!("unknown level '{w}'"))?
            }
            _ if w.starts_with("-disable=") => optimization.disabled.push(w["-disable=".len()..].to_string()),
            other => {
                return Err(format!(
                "unknown target option '{other}' (known: +avx512vnni, +avx512bf16, +dotprod, +f16-weights, +int4-weights, +int8-weights, +split512, -ON, -disable=PASS)"
            ))
            }
        }
    }
    Ok(Target {
        arch: if level == Level::Neon { "aarch64" } else { "x86_64" },
        vendor: String::new(),
        brand: String::new(),
        features,
        level,
        l1d: 32 << 10,
        l2: 1 << 20,
        l3: 0,
        physical_cores: 1,
        logical_cores: 1,
        capped_to: Some(level),
        half_weights,
        optimization,
        int4_weights,
        int8_weights,
        memory_budget: None,
        split_512,
    })
}

/// The `k`-th `@k` tensor: values from a generator seeded by `k`, the same on every run.
/// Floats are multiples of 1/64 in [-1, 1]; signed bytes span [-127, 127], unsigned ones
/// [0, 255]; wider integers [-8, 8]; bools alternate.
fn fill(k: usize, dtype: DType, shape: &[usize]) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    let mut state = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut unit = || ((next() % 129) as f32 - 64.0) / 64.0;
    let t = match dtype {
        DType::F32 => Tensor::from_slice(shape, &(0..n).map(|_| unit()).collect::<Vec<f32>>()),
        DType::F64 => Tensor::from_slice(shape, &(0..n).map(|_| unit() as f64).collect::<Vec<f64>>()),
        DType::F16 => Tensor::from_slice(shape, &(0..n).map(|_| half::f16::from_f32(unit())).collect::<Vec<_>>()),
        DType::I8 => Tensor::from_slice(shape, &(0..n).map(|_| (unit() * 127.0) as i8).collect::<Vec<i8>>()),
        DType::U8 => Tensor::from_slice(shape, &(0..n).map(|_| ((unit() + 1.0) * 127.5) as u8).collect::<Vec<u8>>()),
        DType::I32 => Tensor::from_slice(shape, &(0..n).map(|_| (unit() * 8.0) as i32).collect::<Vec<i32>>()),
        DType::I64 => Tensor::from_slice(shape, &(0..n).map(|_| (unit() * 8.0) as i64).collect::<Vec<i64>>()),
        DType::Bool => {
            let bytes: Vec<u8> = (0..n).map(|i| u8::from(i % 2 == 0)).collect();
            Tensor::from_bytes(DType::Bool, shape, &bytes).map_err(|e| e.to_string())?
        }
        other => return Err(format!("@{k}: no generated data for {other}")),
    };
    Ok(t)
}

/// The passes a `; test:` line names, looked up in the target's pipelines.
fn passes_of(spec: &str, target: &Target) -> Result<Vec<Pass>, String> {
    match spec.trim() {
        "pipeline" => return Ok(cpu_pipeline(target)),
        "cuda-pipeline" => return Ok(cuda_pipeline()),
        _ => {}
    }
    let mut out = Vec::new();
    for name in spec.split(',').map(str::trim) {
        let found = cpu_pipeline(target).into_iter().chain(cuda_pipeline()).find(|p| p.name == name);
        out.push(found.ok_or_else(|| format!("no pass named '{name}' in the cpu or cuda pipeline"))?);
    }
    Ok(out)
}

/// The value of a `; key:` header line.
fn header<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.trim_start().strip_prefix(';')?.trim_start().strip_prefix(key)?.strip_prefix(':'))
}

/// Runs one filetest; the error says what went wrong, with the graph the passes left.
fn run_one(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let test = header(&text, "test").ok_or("no '; test: PASS' line")?;
    let target = target_of(header(&text, "target").unwrap_or("x86-64-v3"))?;
    let passes = passes_of(test, &target)?;
    // The IR is every line that is not a `;` comment; those become blank lines, so the
    // parser's line numbers are the file's. The opset goes on the first line (the header).
    let mut ir: Vec<String> =
        text.lines().map(|l| if l.trim_start().starts_with(';') { String::new() } else { l.to_string() }).collect();
    if !ir.iter().any(|l| l.trim_start().starts_with("opset")) {
        ir[0] = "opset 21".into();
    }
    let model = parse_model_with_data(&ir.join("\n"), &fill).map_err(|e| format!("parse: {e}"))?;
    let mut g = model.graph;
    aim_ir::verify(&g).map_err(|e| format!("the input does not verify: {e}"))?;
    aim_ir::infer::infer_types(&mut g).map_err(|e| format!("infer-types on the input: {e}"))?;
    for p in &passes {
        (p.run)(&mut g).map_err(|e| e.to_string())?;
        aim_ir::verify(&g).map_err(|e| {
            format!("after {}: the graph does not verify: {e}\n{}", p.name, print_graph(&g, TensorDetail::Summary(16)))
        })?;
    }
    let out = print_graph(&g, TensorDetail::Summary(16));
    let mut b = filecheck::CheckerBuilder::new();
    b.text(&text).map_err(|e| format!("directives: {e}"))?;
    let checker = b.finish();
    if checker.is_empty() {
        return Err("no check directives".into());
    }
    match checker.check(&out, filecheck::NO_VARIABLES) {
        Ok(true) => Ok(()),
        Ok(false) => {
            let (_, explain) = checker.explain(&out, filecheck::NO_VARIABLES).map_err(|e| e.to_string())?;
            Err(format!("checks failed:\n{explain}\ngraph after the passes:\n{out}"))
        }
        Err(e) => Err(format!("checking: {e}")),
    }
}

#[test]
fn filetests() {
    let all = files(&root());
    assert!(!all.is_empty(), "no filetests under {}", root().display());
    let only = std::env::var("AIM_FILETEST").ok();
    let mut failed = Vec::new();
    let mut ran = 0;
    for p in &all {
        let rel = p.strip_prefix(root()).unwrap_or(p).display().to_string();
        if only.as_deref().is_some_and(|o| !rel.contains(o)) {
            continue;
        }
        ran += 1;
        if let Err(e) = run_one(p) {
            failed.push(format!("--- {rel}: {e}"));
        }
    }
    println!("{ran} filetests, {} failed", failed.len());
    assert!(failed.is_empty(), "{} of {ran} filetests failed:\n{}", failed.len(), failed.join("\n"));
}

/// Every pass of the cpu and cuda pipelines has a directory of at least
/// [`MIN_TESTS_PER_PASS`] filetests, named after it.
#[test]
fn every_pass_has_filetests() {
    let target = target_of("x86-64-v4 +avx512vnni").expect("target");
    let mut names: Vec<&str> = cpu_pipeline(&target).iter().chain(&cuda_pipeline()).map(|p| p.name).collect();
    let mut half = target.clone();
    half.half_weights = true;
    half.int4_weights = Some(32);
    names.extend(cpu_pipeline(&half).iter().map(|p| p.name));
    let mut int8 = target.clone();
    int8.int8_weights = true;
    names.extend(cpu_pipeline(&int8).iter().map(|p| p.name));
    names.sort();
    names.dedup();
    let mut short = Vec::new();
    for name in &names {
        let n = files(&root().join(name)).len();
        println!("{name}: {n} filetests");
        if n < MIN_TESTS_PER_PASS {
            short.push(format!("{name} ({n})"));
        }
    }
    assert!(short.is_empty(), "passes with fewer than {MIN_TESTS_PER_PASS} filetests: {}", short.join(", "));
}
