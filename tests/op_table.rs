//! The cpu pipeline's output on every ISA aim targets, whatever this machine has: each
//! benchmark model optimized for x86-64 at each level (AVX-512 with VNNI and BF16 among
//! them), for AArch64 NEON and for the cuda backend must verify, its `aim` nodes fitting their rows of the op
//! table (`aim_ir::schema::aim_op`). The pipeline verifies its result, so a pass that
//! writes an attribute or an operand its row does not name fails here even where this CPU
//! would never take that path (the integer passes on VNNI, the NEON blocking).

use aim_compiler::target::{Level, Target};
use std::path::PathBuf;

fn targets() -> Vec<(&'static str, Target)> {
    let mut vnni = Target::for_arch("x86_64", "x86-64-v4").expect("x86-64-v4");
    vnni.features.avx512vnni = true;
    vnni.features.avx512bf16 = true;
    assert_eq!(vnni.level, Level::X86V4);
    vec![
        ("x86-64-v4 with VNNI and BF16", vnni),
        ("x86-64-v4", Target::for_arch("x86_64", "x86-64-v4").expect("x86-64-v4")),
        ("x86-64-v3", Target::for_arch("x86_64", "x86-64-v3").expect("x86-64-v3")),
        ("x86-64-v2", Target::for_arch("x86_64", "x86-64-v2").expect("x86-64-v2")),
        ("aarch64-neon", Target::for_arch("aarch64", "aarch64-neon").expect("aarch64")),
    ]
}

#[test]
fn every_benchmark_model_optimizes_to_a_verified_graph_on_every_isa() {
    let Some(dir) = std::env::var_os("AIM_MODELS").map(PathBuf::from) else {
        eprintln!("AIM_MODELS is not set (tests/run.sh sets it): skipped");
        return;
    };
    let mut models: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("AIM_MODELS is a directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    models.sort();
    assert!(models.len() >= 20, "{} models in {}", models.len(), dir.display());
    let targets = targets();
    let mut aim_nodes = std::collections::BTreeSet::new();
    for path in &models {
        let mut ir = aim_onnx::import_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        aim_ir::verify(&ir.graph).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        aim_ir::infer::infer_types(&mut ir.graph).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (name, target) in &targets {
            let mut g = ir.graph.clone();
            let passes = aim_compiler::passes::cpu_pipeline(target);
            if let Err(e) = aim_compiler::passes::run_pipeline(&mut g, &passes, false) {
                panic!("{} for {name}: {e}", path.display());
            }
            aim_nodes.extend(g.nodes.iter().filter(|n| n.domain == "aim").map(|n| n.op.clone()));
        }
        let mut g = ir.graph.clone();
        if let Err(e) = aim_compiler::passes::run_pipeline(&mut g, &aim_compiler::passes::cuda_pipeline(), false) {
            panic!("{} for the cuda backend: {e}", path.display());
        }
    }
    eprintln!("aim ops made: {aim_nodes:?}");
    // The models reach most of the table: the checks above are not vacuous.
    let made =
        ["Conv", "Conv8", "ConvInteger", "ConvTranspose", "Dense", "Elementwise", "MaxPool8", "QDense", "QMatMul"];
    for op in made.into_iter().chain(["Quantize8", "Reduce", "Softmax", "ToBlocked", "Transpose"]) {
        assert!(aim_nodes.contains(op), "no model made aim:{op}: {aim_nodes:?}");
    }
}

/// Attributes a model file adds beyond ONNX's schema (aim ignores them on ONNX ops, as
/// ONNX Runtime's older versions did) do not travel into the `aim` ops made from those
/// nodes, which would then fail verification: such a model loads and computes what the
/// reference kernels compute.
#[test]
fn attributes_beyond_the_onnx_schema_do_not_reach_aim_nodes() {
    let w: Vec<String> = (0..8 * 3 * 9).map(|i| format!("{:.3}", ((i * 37) % 17) as f32 / 17.0 - 0.5)).collect();
    let d: Vec<String> = (0..8 * 4).map(|i| format!("{:.3}", ((i * 13) % 11) as f32 / 11.0 - 0.5)).collect();
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[1,3,16,16]\n  init %w = f32[8,3,3,3] [{}]\n  init %d = f32[8,4] [{}]\n  \
         %c = Conv(%x, %w) {{pads=[1, 1, 1, 1], exporter_note=\"x\"}}  # conv\n  \
         %p = MaxPool(%c) {{kernel_shape=[2, 2], strides=[2, 2], count_include_pad=0}}  # pool\n  \
         %g = GlobalAveragePool(%p) {{keep=1}}  # gap\n  %f = Flatten(%g)  # flat\n  \
         %y = Gemm(%f, %d) {{transA=0, legacy=7}}  # dense\n  output %y: f32[1,4]\n}}\n",
        w.join(", "),
        d.join(", ")
    );
    let dir = std::env::temp_dir().join(format!("aim-stray-attrs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let onnx = dir.join("m.onnx");
    std::fs::write(&onnx, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    let x: Vec<f32> = (0..3 * 256).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
    let inputs = vec![("x".to_string(), aim::Tensor::from_slice(&[1, 3, 16, 16], &x))];
    let want = aim::Model::load_with(&onnx, aim::Backend::Reference).unwrap().run(inputs.clone()).unwrap();
    let m = aim::Model::load(&onnx).unwrap_or_else(|e| panic!("{e}"));
    let made: Vec<String> =
        m.optimized_graph().unwrap().nodes.iter().map(|n| format!("{}:{}", n.domain, n.op)).collect();
    assert!(made.iter().any(|o| o == "aim:Conv") && made.iter().any(|o| o == "aim:Dense"), "{made:?}");
    let got = m.run(inputs).unwrap();
    let (g, w) = (got[0].1.data::<f32>(), want[0].1.data::<f32>());
    let err = g.iter().zip(w).fold(0f32, |e, (a, b)| e.max((a - b).abs()));
    assert!(err < 1e-4, "max difference {err}");
    std::fs::remove_dir_all(&dir).ok();
}
