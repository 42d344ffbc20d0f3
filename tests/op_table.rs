//! The cpu pipeline's output on every ISA aim targets, whatever this machine has: each
//! benchmark model optimized for x86-64 at each level (AVX-512 with VNNI and BF16 among
//! them) and for AArch64 NEON must verify, its `aim` nodes fitting their rows of the op
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
        let mut ir = aim_compiler::onnx::import_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
    }
    eprintln!("aim ops made: {aim_nodes:?}");
    // The models reach most of the table: the checks above are not vacuous.
    let made =
        ["Conv", "Conv8", "ConvInteger", "ConvTranspose", "Dense", "Elementwise", "MaxPool8", "QDense", "QMatMul"];
    for op in made.into_iter().chain(["Quantize8", "Reduce", "Softmax", "ToBlocked", "Transpose"]) {
        assert!(aim_nodes.contains(op), "no model made aim:{op}: {aim_nodes:?}");
    }
}
