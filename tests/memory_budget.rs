//! `--memory-budget` (`aim::budget`): a `.aim` file's weights, read in place from the
//! file, are handed back between uses as far as a budget needs, with outputs unchanged and
//! the process under the budget after a run; a budget that cannot be met is an error with
//! the breakdown, which for an ONNX model (its weights packed into memory at load) says to
//! compile a `.aim` file. One test, so that no other test's model shares the process's
//! memory while it measures.

mod common;

use aim::{Model, Options, Tensor};
use common::*;

/// Six dense layers of 1024×1024 (4 MiB of weights each), as ONNX.
fn chain(dir: &std::path::Path) -> std::path::PathBuf {
    let mut r = Rng(11);
    let mut text = String::from("opset 17\ngraph \"g\" {\n  input %x: f32[8,1024]\n");
    for i in 0..6 {
        let w: Vec<String> = r.values(1024 * 1024).iter().map(|v| format!("{:.3}", v / 32.0)).collect();
        text += &format!("  init %w{i} = f32[1024,1024] [{}]\n", w.join(", "));
    }
    let mut x = "x".to_string();
    for i in 0..6 {
        text += &format!("  %h{i} = MatMul(%{x}, %w{i})  # mm{i}\n");
        x = format!("h{i}");
    }
    text += &format!("  %y = Relu(%{x})  # relu\n  output %y: f32[8,1024]\n}}\n");
    let p = dir.join("chain.onnx");
    std::fs::write(&p, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    p
}

fn run(m: &Model) -> Vec<u8> {
    let x = Tensor::from_slice(&[8, 1024], &Rng(5).values(8 * 1024));
    m.run(vec![("x".into(), x)]).unwrap()[0].1.bytes().to_vec()
}

/// This process's resident bytes now.
fn resident() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: usize =
        status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// The "expected peak N MiB" of a plan, in bytes.
fn expected_peak(plan: &str) -> usize {
    let at = plan.find("expected peak ").expect("the plan gives its peak") + "expected peak ".len();
    let mib: f64 = plan[at..].split_whitespace().next().unwrap().parse().unwrap();
    (mib * (1 << 20) as f64) as usize
}

#[test]
fn weights_read_from_a_file_are_handed_back_as_far_as_the_budget_needs() {
    // (Linux: the planner reads /proc/self/status.)
    let d = tempdir("memory-budget");
    let onnx = chain(&d);
    let file = d.join("chain.aim");
    aim::compiled::compile_to_file(&onnx, &file, &Options::default()).unwrap();
    let budget = |b: usize| Options { memory_budget: Some(b), threads: Some(1), ..Options::default() };
    let want = run(&Model::load_with_options(&file, &Options { threads: Some(1), ..Options::default() }).unwrap());

    let roomy = Model::load_with_options(&file, &budget(64 << 30)).unwrap();
    let plan = roomy.memory_plan().expect("a budget gives a plan");
    assert!(plan.contains("of the 24.0 MiB of weights read from the model file; nothing needs handing back"), "{plan}");
    assert_eq!(run(&roomy), want);
    let peak = expected_peak(&plan);
    let roomy_resident = resident();
    drop(roomy);

    // 8 MiB less: three of the 4 MiB weights go back after each use (two save nothing but
    // the third's room, the largest being resident while it runs).
    let tight = Model::load_with_options(&file, &budget(peak - (8 << 20))).unwrap();
    let plan = tight.memory_plan().unwrap();
    assert!(plan.contains("weights (") && plan.contains("MiB) are handed back after each use"), "{plan}");
    assert!(expected_peak(&plan) <= peak - (8 << 20), "{plan}");
    for _ in 0..2 {
        assert_eq!(run(&tight), want, "handing pages back changes no output");
    }
    // After a run the handed-back weights are not resident: three of the 4 MiB weights
    // fewer than after a run with all of them kept (without handing back, no fewer).
    let fewer = roomy_resident.saturating_sub(resident());
    assert!(fewer >= 8 << 20, "{} MiB fewer resident than without a budget: {plan}", fewer >> 20);
    drop(tight);

    let e = Model::load_with_options(&file, &budget(4 << 20)).err().expect("refused").to_string();
    for part in [
        "chain.aim",
        "a budget of 4.0 MiB cannot be met",
        "4.0 for the weight read from the model file that is largest while in use",
    ] {
        assert!(e.contains(part), "wanted {part:?} in: {e}");
    }

    // Weights kept as 8-bit codes are read from the file and handed back the same way.
    let coded = d.join("chain_int8.aim");
    aim::compiled::compile_to_file(&onnx, &coded, &Options { int8_weights: true, ..Options::default() }).unwrap();
    let plan = Model::load_with_options(&coded, &budget(64 << 30)).unwrap().memory_plan().unwrap();
    assert!(plan.contains("of the 6.0 MiB of weights read from the model file"), "{plan}");

    // The ONNX model's weights are packed into memory at load: the error says what to do.
    let opts = Options { memory_budget: Some(8 << 20), ..Options::default() };
    let e = Model::load_with_options(&onnx, &opts).err().expect("refused").to_string();
    for part in ["chain.onnx", "a budget of 8.0 MiB cannot be met", "compile the model with `aim compile`"] {
        assert!(e.contains(part), "wanted {part:?} in: {e}");
    }
}
