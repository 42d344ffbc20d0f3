//! Optimisation levels and disabled passes: every level, and the default pipeline with any
//! one pass turned off, computes what the reference kernels compute; wrong choices are
//! clean errors naming the option.

#[path = "../../tests/common/mod.rs"]
mod common;

use aim::{Model, OptLevel, Options, Tensor};
use std::path::{Path, PathBuf};

/// A benchmark model and its inputs (in `AIM_MODELS`, set by tests/run.sh), if there.
fn benchmark(name: &str) -> Option<(PathBuf, Vec<(String, Tensor)>)> {
    let dir = PathBuf::from(std::env::var_os("AIM_MODELS")?);
    let inputs = aim::npz::read_npz(&dir.join(format!("{name}.inputs.npz"))).ok()?;
    Some((dir.join(format!("{name}.onnx")), inputs))
}

fn run(path: &Path, inputs: &[(String, Tensor)], opts: &Options) -> Vec<(String, Tensor)> {
    let m = Model::load_with_options(path, opts).unwrap_or_else(|e| panic!("{}: {opts:?}: {e}", path.display()));
    m.run(inputs.to_vec()).unwrap_or_else(|e| panic!("{}: {opts:?}: {e}", path.display()))
}

/// The largest difference between two runs' outputs, relative to each output's largest
/// magnitude.
fn worst(got: &[(String, Tensor)], want: &[(String, Tensor)]) -> f64 {
    got.iter()
        .zip(want)
        .map(|((n, g), (_, w))| {
            assert_eq!(g.shape(), w.shape(), "{n}");
            let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
            let scale = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
            g.iter().zip(&w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
        })
        .fold(0.0, f64::max)
}

/// Each level and each pass disabled on its own, on a CNN, a transformer encoder and a
/// 4-bit decoder step: outputs within 1e-3 of the reference kernels' (what compare_ort.py
/// allows against ONNX Runtime), and `-O0` is the reference kernels exactly.
#[test]
fn every_level_and_every_disabled_pass_computes_the_same_outputs() {
    let target = aim_compiler::target::Target::host();
    let mut names = aim_compiler::passes::cpu_pass_names(&target);
    names.sort();
    names.dedup();
    names.retain(|n| !aim_compiler::passes::REQUIRED.contains(n) && *n != "half-weights");
    assert!(names.len() >= 20, "{names:?}");
    let mut checked = 0;
    for model in ["mobilenetv2", "bert_l6", "genai_int4_l0"] {
        let Some((path, inputs)) = benchmark(model) else {
            eprintln!("AIM_MODELS not set or without {model}: skipped (tests/run.sh sets it)");
            continue;
        };
        let reference = run(&path, &inputs, &Options { backend: aim::Backend::Reference, ..Options::default() });
        for level in OptLevel::ALL {
            let opts = Options { threads: Some(1), opt_level: level, ..Options::default() };
            let got = run(&path, &inputs, &opts);
            let w = worst(&got, &reference);
            if level == OptLevel::O0 {
                assert_eq!(w, 0.0, "{model} -O0 runs the reference kernels");
            }
            assert!(w <= 1e-3, "{model} at -O{}: {w:.2e} from the reference kernels", level.number());
        }
        for pass in &names {
            let opts = Options { threads: Some(1), disabled_passes: vec![pass.to_string()], ..Options::default() };
            let w = worst(&run(&path, &inputs, &opts), &reference);
            assert!(w <= 1e-3, "{model} without {pass}: {w:.2e} from the reference kernels");
            checked += 1;
        }
    }
    eprintln!("{checked} model and disabled-pass pairs checked");
}

/// A pass left out really is left out: at -O1 no fused or packed op appears, at -O2 no
/// blocked layout, and a disabled fusion leaves its ops.
#[test]
fn levels_and_disabled_passes_change_the_program() {
    let d = common::tempdir("opt-levels");
    let weights = |n: usize| -> String {
        (0..n).map(|i| format!("{:.3}", ((i * 37) % 17) as f32 / 17.0 - 0.5)).collect::<Vec<_>>().join(", ")
    };
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[1,16,16,16]\n  init %w = f32[32,16,3,3] [{}]\n  init %w2 = f32[32,32,1,1] [{}]\n  %c = Conv(%x, %w) {{pads=[1, 1, 1, 1]}}  # conv\n  %r = Relu(%c)  # relu\n  %c2 = Conv(%r, %w2)  # conv2\n  %p = GlobalAveragePool(%c2)  # gap\n  output %p: f32[1,32,1,1]\n}}\n",
        weights(32 * 16 * 9),
        weights(32 * 32)
    );
    let model = aim_ir::text::parse_model(&text).unwrap();
    let path = d.join("net.onnx");
    std::fs::write(&path, aim_onnx::export_bytes(&model)).unwrap();
    let graph = |opts: Options| -> String {
        let m = Model::load_with_options(&path, &opts).unwrap();
        aim_ir::text::print_graph(m.optimized_graph().unwrap(), aim_ir::text::TensorDetail::Summary(4))
    };
    let o1 = graph(Options { opt_level: OptLevel::O1, ..Options::default() });
    assert!(o1.contains(" Relu(") && !o1.contains("aim:") && !o1.contains("activation="), "{o1}");
    let o2 = graph(Options { opt_level: OptLevel::O2, ..Options::default() });
    assert!(!o2.contains(" Relu(") && o2.contains("activation=\"relu\"") && !o2.contains("NCHWc"), "{o2}");
    let o3 = graph(Options::default());
    assert!(!o3.contains(" Relu(") && o3.contains("NCHWc"), "{o3}");
    let unfused = graph(Options { disabled_passes: vec!["fuse-epilogues".into()], ..Options::default() });
    // fuse-epilogues also makes the packed-kernel aim:Conv that select-kernels and the
    // blocked layout work on: without it the convolutions stay ONNX Convs.
    assert!(unfused.contains(" Relu(") && !unfused.contains("aim:Conv"), "{unfused}");
    let unblocked = graph(Options { disabled_passes: vec!["layout-nchwc".into()], ..Options::default() });
    assert!(!unblocked.contains("NCHWc") && unblocked.contains("activation=\"relu\""), "{unblocked}");
    let m = Model::load_with_options(&path, &Options { opt_level: OptLevel::O0, ..Options::default() }).unwrap();
    assert_eq!(m.backend(), aim::Backend::Reference);
    assert_eq!(m.opt_level(), OptLevel::O0);
}

/// Wrong pass choices are errors that name the option and say what is allowed.
#[test]
fn wrong_pass_choices_are_clean_errors() {
    let d = common::tempdir("opt-errors");
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[2,4]\n  %y = Relu(%x)  # relu\n  output %y: f32[2,4]\n}\n";
    let path = d.join("relu.onnx");
    std::fs::write(&path, aim_onnx::export_bytes(&aim_ir::text::parse_model(text).unwrap())).unwrap();
    let err = |opts: Options| Model::load_with_options(&path, &opts).err().expect("refused").to_string();
    let e = err(Options { disabled_passes: vec!["fuse-everything".into()], ..Options::default() });
    assert!(e.contains("no pass is named 'fuse-everything'") && e.contains("fuse-epilogues"), "{e}");
    let e = err(Options { disabled_passes: vec!["infer-types".into()], ..Options::default() });
    assert!(e.contains("'infer-types' cannot be disabled"), "{e}");
    let e = err(Options { opt_level: OptLevel::O1, half_weights: true, ..Options::default() });
    assert!(e.contains("f16 weights") && e.contains("-O2"), "{e}");
    let e = err(Options { opt_level: OptLevel::O0, disabled_passes: vec!["simplify".into()], ..Options::default() });
    assert!(e.contains("-O0 runs no passes"), "{e}");
    let e = err(Options { backend: aim::Backend::Reference, opt_level: OptLevel::O1, ..Options::default() });
    assert!(e.contains("-O levels apply to the cpu backend"), "{e}");
    let e =
        err(Options { backend: aim::Backend::Cuda, disabled_passes: vec!["simplify".into()], ..Options::default() });
    assert!(e.contains("cuda backend runs its whole pipeline"), "{e}");
    // The command line: -O4 and an unknown pass, one line each.
    for (args, want) in
        [(vec!["-O4"], "the levels are 0, 1, 2 and 3"), (vec!["--disable-pass", "nope"], "no pass is named 'nope'")]
    {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_aim"))
            .args(["run", path.to_str().unwrap()])
            .args(&args)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(e.contains(want) && !e.contains("panicked"), "{args:?}: {e}");
    }
}
