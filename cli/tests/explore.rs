//! `aim explore`: every stage snapshot-tested on two small models (these snapshots are the
//! compiler's tests: a change in what a pass, the scheduler or the code generator does shows
//! up as a reviewed diff), determinism, source nodes on every item, `--node`, errors, and
//! — when the benchmark models have been generated (`AIM_MODELS`, set by tests/run.sh) —
//! every stage of ResNet-50, MobileNetV2 and BERT printed twice identically.
//!
//! The output is fixed to one target so that it reads the same on any x86-64 machine with
//! AVX2: `--cpu x86-64-v3 --caches 32K,1M,8M`.

#[path = "../../tests/common/mod.rs"]
mod common;

use aim_onnx::proto::{attribute_proto::AttributeType, AttributeProto};
use common::*;
use std::path::Path;
use std::process::{Command, Output};

fn aim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aim")).args(args).output().expect("running aim")
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn float_attr(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v),
        ..Default::default()
    }
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * scale).collect()
}

/// A MobileNet-like block: stem conv + BatchNorm + Relu, depthwise conv + Clip, pointwise
/// conv with a residual, global pooling and a classifier.
fn tiny_cnn() -> Vec<u8> {
    let c = 16;
    let nodes = vec![
        node(
            "Conv",
            "stem",
            &["x", "W0"],
            &["a0"],
            vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1]), ints("strides", &[2, 2])],
        ),
        node("BatchNormalization", "stem_bn", &["a0", "s", "b", "mu", "var"], &["a1"], vec![]),
        node("Relu", "stem_relu", &["a1"], &["a"], vec![]),
        node(
            "Conv",
            "dw",
            &["a", "W1", "B1"],
            &["d0"],
            vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1]), int_attr("group", c)],
        ),
        node("Clip", "dw_clip", &["d0", "lo", "hi"], &["d"], vec![]),
        node("Conv", "pw", &["d", "W2", "B2"], &["p"], vec![ints("kernel_shape", &[1, 1])]),
        node("Add", "residual", &["p", "d"], &["r"], vec![]),
        node("GlobalAveragePool", "pool", &["r"], &["g"], vec![]),
        node("Flatten", "flat", &["g"], &["f"], vec![]),
        node("Gemm", "fc", &["f", "Wf", "Bf"], &["y"], vec![int_attr("transB", 1)]),
    ];
    let c = c as usize;
    let inits = vec![
        f32_tensor("W0", &[16, 3, 3, 3], &ramp(16 * 27, 0.1)),
        f32_tensor("s", &[16], &ramp(16, 0.2)),
        f32_tensor("b", &[16], &ramp(16, 0.1)),
        f32_tensor("mu", &[16], &ramp(16, 0.05)),
        f32_tensor("var", &[16], &[1.0; 16]),
        f32_tensor("W1", &[16, 1, 3, 3], &ramp(c * 9, 0.1)),
        f32_tensor("B1", &[16], &ramp(c, 0.1)),
        f32_tensor("lo", &[], &[0.0]),
        f32_tensor("hi", &[], &[6.0]),
        f32_tensor("W2", &[16, 16, 1, 1], &ramp(c * c, 0.1)),
        f32_tensor("B2", &[16], &ramp(c, 0.1)),
        f32_tensor("Wf", &[4, 16], &ramp(64, 0.1)),
        f32_tensor("Bf", &[4], &ramp(4, 0.1)),
    ];
    model(nodes, vec![value("x", 1, &[Ok(1), Ok(3), Ok(8), Ok(8)])], vec![value("y", 1, &[Ok(1), Ok(4)])], inits, 17)
}

/// A transformer-like block: a dense layer, GELU written out with Erf (fused into one Gelu),
/// layer norm, an arithmetic chain (a generated elementwise loop), a transpose of the
/// leading dims (a generated copy), softmax, and a row maximum (a generated reduction).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn tiny_block() -> Vec<u8> {
    let nodes = vec![
        node("MatMul", "proj", &["x", "W"], &["h0"], vec![]),
        node("Add", "proj_bias", &["h0", "B"], &["h"], vec![]),
        node("Div", "gelu_div", &["h", "sqrt2"], &["g0"], vec![]),
        node("Erf", "gelu_erf", &["g0"], &["g1"], vec![]),
        node("Add", "gelu_add", &["g1", "one"], &["g2"], vec![]),
        node("Mul", "gelu_mul", &["h", "g2"], &["g3"], vec![]),
        node("Mul", "gelu_half", &["g3", "half"], &["g"], vec![]),
        node(
            "LayerNormalization",
            "norm",
            &["g", "gamma", "beta"],
            &["n"],
            vec![int_attr("axis", -1), float_attr("epsilon", 1e-5)],
        ),
        node("Mul", "gain", &["n", "g15"], &["n1"], vec![]),
        node("Add", "shift", &["n1", "b25"], &["n2"], vec![]),
        node("Relu", "clamp", &["n2"], &["n3"], vec![]),
        node("Transpose", "swap", &["n3"], &["t"], vec![ints("perm", &[1, 0, 2])]),
        node("Softmax", "attn", &["t"], &["y"], vec![int_attr("axis", -1)]),
        node("ReduceMax", "peak", &["y"], &["m"], vec![ints("axes", &[-1]), int_attr("keepdims", 0)]),
    ];
    let inits = vec![
        f32_tensor("W", &[8, 8], &ramp(64, 0.1)),
        f32_tensor("B", &[8], &ramp(8, 0.1)),
        f32_tensor("sqrt2", &[], &[std::f32::consts::SQRT_2]),
        f32_tensor("one", &[], &[1.0]),
        f32_tensor("half", &[], &[0.5]),
        f32_tensor("gamma", &[8], &[1.0; 8]),
        f32_tensor("beta", &[8], &[0.0; 8]),
        f32_tensor("g15", &[], &[1.5]),
        f32_tensor("b25", &[], &[0.25]),
    ];
    model(
        nodes,
        vec![value("x", 1, &[Ok(2), Ok(4), Ok(8)])],
        vec![value("y", 1, &[Ok(4), Ok(2), Ok(8)]), value("m", 1, &[Ok(4), Ok(2)])],
        inits,
        17,
    )
}

const FIXED: [&str; 4] = ["--cpu", "x86-64-v3", "--caches", "32K,1M,8M"];

fn explore(model: &Path, extra: &[&str]) -> String {
    let mut args = vec!["explore", model.to_str().unwrap()];
    args.extend(FIXED);
    args.extend(extra);
    let o = aim(&args);
    assert!(o.status.success(), "aim {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// Pass times vary from run to run: `(1.234 ms)` becomes `(… ms)`.
fn redact_times(s: &str) -> String {
    s.lines()
        .map(|l| match (l.starts_with("-- pass "), l.find(" ("), l.find(" ms)")) {
            (true, Some(a), Some(b)) if a < b => format!("{} (… ms){}", &l[..a], &l[b + 4..]),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines that are structure, not items: stage headers, braces, graph inputs and outputs,
/// summaries, blank lines.
fn is_structure(l: &str) -> bool {
    let t = l.trim_start();
    t.is_empty()
        || t.starts_with("== ")
        || t.starts_with("// == ")
        || t.starts_with("-- pass ")
        || t.starts_with("-- level -O")
        || t.starts_with("graph ")
        || t == "}"
        || t.starts_with("input %")
        || t.starts_with("output %")
        || t.starts_with("initializers:")
        || t.starts_with("model ir_version")
        || t.starts_with("; arena:")
        || t.starts_with("; no generated functions")
        || t.starts_with("; aim_entry: the whole model")
        || t.starts_with("; no entry function")
        || t.starts_with(".version")
        || t.starts_with(".target")
        || t.starts_with(".address_size")
        || t.starts_with("// device program:")
}

fn assert_items_have_sources(out: &str, what: &str) {
    for l in out.lines() {
        let l = l.strip_prefix("+ ").or_else(|| l.strip_prefix("- ")).unwrap_or(l).trim_start();
        let traced = l.contains("  ; from: ") || (what == "ptx" && l.contains("  // from: "));
        assert!(is_structure(l) || traced, "{what}: an item without its source nodes: {l}");
    }
}

/// Writes the model into a fresh directory, which lives as long as the returned guard.
fn write_model(tag: &str, bytes: Vec<u8>) -> (common::TempDir, std::path::PathBuf) {
    let d = tempdir(&format!("explore-{tag}"));
    let p = d.join(format!("{tag}.onnx"));
    std::fs::write(&p, bytes).unwrap();
    (d, p)
}

/// The ptx stage as printed is a module: ASCII, comments as `//`, each kernel once, and
/// ptxas assembles it for sm_80 (where ptxas is installed; `AIM_REQUIRE_PTXAS=1` requires it).
fn ptx_stage_assembles(out: &str, dir: &std::path::Path) {
    assert!(out.is_ascii(), "the ptx stage has non-ASCII characters");
    let entries: Vec<&str> = out.lines().filter_map(|l| l.trim_start().strip_prefix(".visible .entry ")).collect();
    let names: std::collections::BTreeSet<&str> = entries.iter().map(|e| e.split('(').next().unwrap()).collect();
    assert_eq!(names.len(), entries.len(), "a kernel is defined twice");
    let Some(ptxas) = aim_cuda::ptxas::find() else {
        assert!(std::env::var_os("AIM_REQUIRE_PTXAS").is_none(), "ptxas not found (pip install nvidia-cuda-nvcc-cu12)");
        return;
    };
    aim_cuda::ptxas::check(&ptxas, out, 80, dir).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
#[cfg(target_arch = "x86_64")]
fn every_stage_of_a_small_cnn() {
    if !std::arch::is_x86_feature_detected!("avx2") {
        return;
    }
    let (dir, m) = write_model("cnn", tiny_cnn());
    for stage in ["onnx", "graph", "optimized", "scheduled", "clif", "asm", "ptx"] {
        let out = explore(&m, &["--stage", stage]);
        assert_eq!(out, explore(&m, &["--stage", stage]), "{stage} printed twice differs");
        assert_items_have_sources(&out, stage);
        if stage == "ptx" {
            ptx_stage_assembles(&out, &dir.join("ptxas"));
        }
        insta::assert_snapshot!(format!("cnn_{stage}"), out);
    }
    let passes = explore(&m, &["--stage", "optimized", "--passes"]);
    assert_items_have_sources(&passes, "passes");
    insta::assert_snapshot!("cnn_passes", redact_times(&passes));
}

#[test]
#[cfg(target_arch = "x86_64")]
fn every_stage_of_a_small_transformer_block() {
    if !std::arch::is_x86_feature_detected!("avx2") {
        return;
    }
    let (dir, m) = write_model("block", tiny_block());
    for stage in ["optimized", "scheduled", "clif", "asm", "ptx"] {
        let out = explore(&m, &["--stage", stage]);
        assert_eq!(out, explore(&m, &["--stage", stage]), "{stage} printed twice differs");
        assert_items_have_sources(&out, stage);
        if stage == "ptx" {
            ptx_stage_assembles(&out, &dir.join("ptxas"));
        }
        insta::assert_snapshot!(format!("block_{stage}"), out);
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn one_nodes_journey() {
    if !std::arch::is_x86_feature_detected!("avx2") {
        return;
    }
    let (_dir, m) = write_model("journey", tiny_cnn());
    let out = explore(&m, &["--node", "dw_clip"]);
    // The Clip was fused into the depthwise conv: it shows in every stage up to the schedule,
    // and every line shown is one of its.
    for stage in ["onnx", "graph", "optimized", "scheduled"] {
        let part = out.split(&format!("== {stage}:")).nth(1).unwrap().split("\n== ").next().unwrap();
        assert!(part.lines().skip(1).any(|l| l.contains("; from: ")), "{stage}: no line of dw_clip:\n{out}");
    }
    for l in out.lines().filter(|l| l.contains("; from: ")) {
        assert!(l.split("; from: ").nth(1).unwrap().split(", ").any(|s| s == "dw_clip"), "{l}");
    }
    assert!(out.contains("= aim:Conv(") && out.contains("Clip(%d0"), "{out}");
}

/// A user mistake: exit code 1, one line on stderr.
/// A 1-D convolution over one short frame runs with its output positions as GEMM rows
/// (`gemm_by_position`, which keeps no weights packed as A): the scheduled stage describes
/// that kernel instead of failing on the weights it does not hold (it panicked on a
/// Whisper-style encoder's convolutions).
#[test]
#[cfg(target_arch = "x86_64")]
fn a_convolution_by_position_is_scheduled() {
    if !std::arch::is_x86_feature_detected!("avx2") {
        return;
    }
    let nodes =
        vec![node("Conv", "frame", &["x", "W"], &["y"], vec![ints("kernel_shape", &[3]), ints("pads", &[1, 1])])];
    let m = model(
        nodes,
        vec![value("x", 1, &[Ok(1), Ok(16), Ok(4)])],
        vec![value("y", 1, &[Ok(1), Ok(40), Ok(4)])],
        vec![f32_tensor("W", &[40, 16, 3], &ramp(40 * 16 * 3, 0.01))],
        17,
    );
    let (_dir, path) = write_model("by-position", m);
    let optimized = explore(&path, &["--stage", "optimized"]);
    assert!(optimized.contains("kernel=\"gemm_by_position\""), "{optimized}");
    let scheduled = explore(&path, &["--stage", "scheduled"]);
    assert!(scheduled.contains("positions as GEMM rows"), "{scheduled}");
}

fn assert_clean_error(o: &Output, contains: &str) {
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {e}");
    assert_eq!(e.trim_end().lines().count(), 1, "expected one line, got: {e}");
    assert!(!e.contains("panicked"), "{e}");
    assert!(e.contains(contains), "expected {contains:?} in: {e}");
}

#[test]
fn errors_are_one_line() {
    let (_dir, m) = write_model("errors", tiny_cnn());
    let ms = m.to_str().unwrap();
    assert_clean_error(&aim(&["explore", ms, "--stage", "llvm"]), "unknown stage 'llvm'");
    assert_clean_error(&aim(&["explore", ms, "--node", "nope"]), "no node named 'nope'");
    assert_clean_error(&aim(&["explore", ms, "--caches", "32K,1M"]), "three sizes");
    let bad = m.with_file_name("bad.onnx");
    std::fs::write(&bad, b"not a model").unwrap();
    assert_clean_error(&aim(&["explore", bad.to_str().unwrap()]), "not a valid ONNX model");
    assert_clean_error(&aim(&["explore", "/nonexistent/m.onnx"]), "m.onnx");
    assert_clean_error(&aim(&["explore", ms, "--profile", bad.to_str().unwrap()]), "not a Chrome trace");
}

#[test]
fn the_html_page_is_self_contained() {
    let (_dir, m) = write_model("html", tiny_cnn());
    let page = m.with_file_name("cnn.html");
    let o = aim(&["explore", m.to_str().unwrap(), "--html", page.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    // No network: nothing is fetched from elsewhere.
    for needle in ["http://", "https://", "src=", "<link"] {
        assert!(!html.contains(needle), "the page refers to {needle}");
    }
    // Every stage is a pane; the fused depthwise conv's lines carry both of its sources.
    for stage in ["onnx", "graph", "optimized", "scheduled", "clif", "asm"] {
        assert!(html.contains(&format!("data-stage=\"{stage}\"")), "{stage}");
    }
    assert!(html.contains("title=\"from: dw, dw_clip\""), "fused lines name all their sources");
}

/// The benchmark models (from tests/models/make_models.py, in `AIM_MODELS`): every stage
/// prints, twice identically, and every item names its sources.
#[test]
fn benchmark_models_print_every_stage() {
    let Ok(dir) = std::env::var("AIM_MODELS") else {
        eprintln!("AIM_MODELS not set: skipping the benchmark models (tests/run.sh sets it)");
        return;
    };
    for name in ["resnet50", "mobilenetv2", "bert_l6"] {
        let m = Path::new(&dir).join(format!("{name}.onnx"));
        let first = explore(&m, &["--passes"]);
        assert_eq!(redact_times(&first), redact_times(&explore(&m, &["--passes"])), "{name}: two runs differ");
        assert_items_have_sources(&first, name);
        for stage in ["onnx", "graph", "optimized", "scheduled", "clif", "asm", "passes"] {
            assert!(first.contains(&format!("== {stage}:")), "{name}: no {stage} stage");
        }
    }
}
