//! The `aim` command line, run as a user would: outputs, files written, and errors that are
//! one clear line with exit code 1 (never a panic).

#[path = "../../tests/common/mod.rs"]
mod common;

use aim::npz::{read_npz, write_npz};
use aim::Tensor;
use common::*;
use std::path::Path;
use std::process::{Command, Output};

fn aim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aim")).args(args).output().expect("running aim")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A user mistake: exit code 1, one line on stderr, no panic or backtrace.
fn assert_clean_error(o: &Output, contains: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {e}");
    assert_eq!(e.trim_end().lines().count(), 1, "expected one line, got: {e}");
    assert!(!e.contains("panicked") && !e.contains("RUST_BACKTRACE"), "{e}");
    assert!(e.contains(contains), "expected {contains:?} in: {e}");
}

#[test]
fn run_reads_and_writes_npz() {
    let d = tempdir("run");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let x = Tensor::from_slice(&[3, 2], &[1.0f32, 1.0, 0.0, 0.0, -1.0, 2.0]);
    write_npz(&d.join("in.npz"), &[("x".into(), x)]).unwrap();
    let (m, i, o) = (d.join("m.onnx"), d.join("in.npz"), d.join("out.npz"));
    let out = aim(&["run", m.to_str().unwrap(), "--inputs", i.to_str().unwrap(), "--outputs", o.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("y: f32[3, 2]"), "{stdout}");
    let got = read_npz(&o).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "y");
    // [1,1]·W + b = [4.5, -4] → relu; [0,0] → [0.5, 0]; [-1,2] → [5.5, -4] → [5.5, 0].
    assert_eq!(got[0].1.data::<f32>(), &[4.5, 0.0, 0.5, 0.0, 5.5, 0.0]);
}

#[test]
fn random_inputs_need_known_shapes() {
    let d = tempdir("random");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let out = aim(&["run", d.join("m.onnx").to_str().unwrap()]);
    assert_clean_error(&out, "'x' has type f32[N,2]");
    let fixed = model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![value("x", 1, &[Ok(2), Ok(3)])],
        vec![value("y", 1, &[Ok(2), Ok(3)])],
        vec![],
        13,
    );
    std::fs::write(d.join("f.onnx"), fixed).unwrap();
    let a = aim(&["run", d.join("f.onnx").to_str().unwrap(), "--seed", "7"]);
    let b = aim(&["run", d.join("f.onnx").to_str().unwrap(), "--seed", "7"]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout, "the same seed gives the same inputs");
    // With `--shape`, symbolic dims take the given sizes: run and bench make random data.
    let m = d.join("m.onnx");
    let m = m.to_str().unwrap();
    let run = aim(&["run", m, "--shape", "x=5x2"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(String::from_utf8_lossy(&run.stdout).contains("y: f32[5, 2]"), "{}", String::from_utf8_lossy(&run.stdout));
    let bench = aim(&["bench", m, "--shape", "x=3x2", "--iters", "2", "--json"]);
    assert!(bench.status.success(), "{}", stderr(&bench));
    assert_clean_error(&aim(&["run", m, "--shape", "x=5x3"]), "do not fit");
}

#[test]
fn bad_files_are_one_line_errors() {
    let d = tempdir("bad");
    let full = tiny_mlp();
    std::fs::write(d.join("trunc.onnx"), &full[..full.len() / 2]).unwrap();
    std::fs::write(d.join("text.onnx"), "this is not a model\n").unwrap();
    assert_clean_error(&aim(&["run", d.join("trunc.onnx").to_str().unwrap()]), "is not a valid ONNX model");
    assert_clean_error(&aim(&["run", d.join("text.onnx").to_str().unwrap()]), "is not a valid ONNX model");
    assert_clean_error(&aim(&["info", d.join("missing.onnx").to_str().unwrap()]), "cannot read");
    // Command-line usage errors are clap's: exit code 2 with the usage line.
    let usage = aim(&["run", d.join("trunc.onnx").to_str().unwrap(), "--backend", "gpu"]);
    assert_eq!(usage.status.code(), Some(2));
    assert!(stderr(&usage).contains("unknown backend 'gpu' (expected reference, cpu or cuda)"));
}

#[test]
fn unsupported_ops_are_all_listed() {
    let d = tempdir("unsupported");
    let m = model(
        vec![
            node("Relu", "r", &["x"], &["a"], vec![]),
            node("FancyOp", "fancy1", &["a"], &["b"], vec![]),
            node("OtherOp", "other", &["b"], &["c"], vec![]),
            node("FancyOp", "fancy2", &["c"], &["y"], vec![]),
        ],
        vec![value("x", 1, &[Ok(2)])],
        vec![value("y", 1, &[Ok(2)])],
        vec![],
        17,
    );
    std::fs::write(d.join("u.onnx"), m).unwrap();
    let out = aim(&["run", d.join("u.onnx").to_str().unwrap()]);
    assert_clean_error(&out, "FancyOp (nodes fancy1, fancy2); OtherOp (node other)");
}

#[test]
fn wrong_input_shape_names_the_input() {
    let d = tempdir("shape");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    write_npz(&d.join("in.npz"), &[("x".into(), Tensor::from_slice(&[2, 3], &[0f32; 6]))]).unwrap();
    let out = aim(&["run", d.join("m.onnx").to_str().unwrap(), "--inputs", d.join("in.npz").to_str().unwrap()]);
    assert_clean_error(&out, "input 'x': dimension 1 must be 2, got 3");
    write_npz(&d.join("in2.npz"), &[("z".into(), Tensor::from_slice(&[1, 2], &[0f32; 2]))]).unwrap();
    let out = aim(&["run", d.join("m.onnx").to_str().unwrap(), "--inputs", d.join("in2.npz").to_str().unwrap()]);
    assert_clean_error(&out, "no input named 'z'");
}

#[test]
fn info_describes_the_model() {
    let d = tempdir("info");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let out = aim(&["info", d.join("m.onnx").to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).replace(d.to_str().unwrap(), "DIR");
    insta::assert_snapshot!(text);
}

fn write_pb(path: &Path, t: aim_onnx::proto::TensorProto) {
    use prost::Message;
    std::fs::write(path, t.encode_to_vec()).unwrap();
}

#[test]
fn test_onnx_runs_case_directories() {
    let d = tempdir("cases");
    for (case, want) in [("good", [4.5f32, 0.0]), ("wrong", [1.0f32, 0.0])] {
        let c = d.join(case);
        std::fs::create_dir_all(c.join("test_data_set_0")).unwrap();
        std::fs::write(c.join("model.onnx"), tiny_mlp()).unwrap();
        write_pb(&c.join("test_data_set_0/input_0.pb"), f32_tensor("x", &[1, 2], &[1.0, 1.0]));
        write_pb(&c.join("test_data_set_0/output_0.pb"), f32_tensor("y", &[1, 2], &want));
    }
    let out = aim(&["test-onnx", d.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a failing case fails the run: {text}");
    assert!(text.contains("good: pass"), "{text}");
    assert!(text.contains("wrong: fail: output 'y': 1 of 2 values differ"), "{text}");
    assert_eq!(text.lines().last(), Some("1 passed, 1 failed, 0 skipped"));
}

#[test]
fn external_data_is_read_relative_to_the_model_and_confined_to_its_directory() {
    use aim_onnx::proto::{tensor_proto::DataLocation, StringStringEntryProto};
    let d = tempdir("external");
    let weights: Vec<u8> = [0f32, 2.0, 3.0, 4.0, 5.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(d.join("w.bin"), &weights).unwrap();
    let ext = |location: &str| {
        let kv = |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
        aim_onnx::proto::TensorProto {
            name: Some("W".into()),
            dims: vec![2, 2],
            data_type: Some(1),
            data_location: Some(DataLocation::External as i32),
            external_data: vec![kv("location", location), kv("offset", "4"), kv("length", "16")],
            ..Default::default()
        }
    };
    let m = |location: &str| {
        model(
            vec![node("MatMul", "mm", &["x", "W"], &["y"], vec![])],
            vec![value("x", 1, &[Ok(1), Ok(2)])],
            vec![value("y", 1, &[Ok(1), Ok(2)])],
            vec![ext(location)],
            17,
        )
    };
    std::fs::write(d.join("ok.onnx"), m("w.bin")).unwrap();
    let model = aim::Model::load(d.join("ok.onnx")).unwrap();
    let y = model.run(vec![("x".into(), Tensor::from_slice(&[1, 2], &[1.0f32, 1.0]))]).unwrap();
    assert_eq!(y[0].1.data::<f32>(), &[6.0, 8.0]);
    std::fs::write(d.join("up.onnx"), m("../w.bin")).unwrap();
    assert_clean_error(&aim(&["info", d.join("up.onnx").to_str().unwrap()]), "may not leave the model's directory");
    std::fs::write(d.join("abs.onnx"), m(d.join("w.bin").to_str().unwrap())).unwrap();
    assert_clean_error(&aim(&["info", d.join("abs.onnx").to_str().unwrap()]), "must be a relative path");
    // A symlink inside the directory that points outside it is refused too.
    let outside = tempdir("external-outside");
    std::fs::write(outside.join("secret.bin"), &weights).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.bin"), d.join("link.bin")).unwrap();
    std::fs::write(d.join("link.onnx"), m("link.bin")).unwrap();
    assert_clean_error(&aim(&["info", d.join("link.onnx").to_str().unwrap()]), "outside the model's directory");
    // One that stays inside is followed.
    std::os::unix::fs::symlink(d.join("w.bin"), d.join("inside.bin")).unwrap();
    std::fs::write(d.join("inside.onnx"), m("inside.bin")).unwrap();
    let y = aim::Model::load(d.join("inside.onnx")).unwrap();
    let y = y.run(vec![("x".into(), Tensor::from_slice(&[1, 2], &[1.0f32, 1.0]))]).unwrap();
    assert_eq!(y[0].1.data::<f32>(), &[6.0, 8.0]);
    std::fs::write(d.join("short.onnx"), m("w.bin")).unwrap();
    std::fs::write(d.join("w.bin"), &weights[..10]).unwrap();
    assert_clean_error(&aim(&["info", d.join("short.onnx").to_str().unwrap()]), "past the end");
}

#[test]
fn a_test_case_whose_data_cannot_be_read_fails() {
    let d = tempdir("unreadable-case");
    let case = d.join("test_relu_broken");
    std::fs::create_dir_all(case.join("test_data_set_0")).unwrap();
    let relu = model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![value("x", 1, &[Ok(2)])],
        vec![value("y", 1, &[Ok(2)])],
        vec![],
        13,
    );
    std::fs::write(case.join("model.onnx"), relu).unwrap();
    std::fs::write(case.join("test_data_set_0/input_0.pb"), b"\xff\xff\xff not a tensor").unwrap();
    std::fs::write(case.join("test_data_set_0/output_0.pb"), b"\xff").unwrap();
    let out = aim(&["test-onnx", d.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("test_relu_broken: fail: cannot read test data"), "{text}");
    assert_eq!(text.lines().last(), Some("0 passed, 1 failed, 0 skipped"));
}

#[test]
fn errors_are_one_line_even_when_they_quote_control_characters() {
    let d = tempdir("one-line");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let x = Tensor::from_slice(&[1, 2], &[1.0f32, 2.0]);
    write_npz(&d.join("in.npz"), &[("x\nsecond line\r".into(), x)]).unwrap();
    let out = aim(&["run", d.join("m.onnx").to_str().unwrap(), "--inputs", d.join("in.npz").to_str().unwrap()]);
    assert_clean_error(&out, "no input named 'x\\nsecond line\\r'");
}

#[test]
fn impossible_thread_counts_are_clean_errors() {
    let d = tempdir("threads");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let m = d.join("m.onnx");
    let out = aim(&["run", m.to_str().unwrap(), "--threads", "100000"]);
    assert_clean_error(&out, "threads: 100000 is more than 1024");
    // Usage errors are clap's: exit code 2 (documented in the README).
    let out = aim(&["run", m.to_str().unwrap(), "--threads", "many"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn compare_finds_the_first_node_that_diverges() {
    let d = tempdir("compare");
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[2,4]\n  init %w = f32[4,3] [0.5, -1.0, 0.25, 1.0, 0.5, -0.5, 0.0, 2.0, 1.0, -1.5, 0.5, 0.75]\n  %h = MatMul(%x, %w)  # mm\n  %a = Tanh(%h)  # act\n  %s = Mul(%a, %a)  # square\n  %y = Softmax(%s) {axis=1}  # sm\n  output %y: f32[2,3]\n}\n";
    let m = d.join("m.onnx");
    std::fs::write(&m, aim_onnx::export_bytes(&aim_ir::text::parse_model(text).unwrap())).unwrap();
    let x = Tensor::from_slice(&[2, 4], &[0.1f32, -0.2, 0.3, 0.4, 1.0, 0.5, -0.5, 0.25]);
    write_npz(&d.join("in.npz"), &[("x".into(), x.clone())]).unwrap();
    let (m_s, in_s) = (m.to_str().unwrap(), d.join("in.npz"));
    // Against the reference backend: every value within the tolerance.
    let out = aim(&["compare", m_s, "--inputs", in_s.to_str().unwrap()]);
    let text_out = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text_out}{}", stderr(&out));
    assert!(text_out.contains("0 over tolerance"), "{text_out}");
    // Values computed elsewhere, with one node made to diverge: that node is the first flagged.
    let r = aim::Model::load_with(&m, aim::Backend::Reference).unwrap();
    let mut values = r.run_capture(vec![("x".into(), x)]).unwrap().values;
    for (name, t) in values.iter_mut() {
        if name == "a" {
            let v: Vec<f32> = t.data::<f32>().iter().map(|v| v + 0.01).collect();
            *t = Tensor::from_slice(t.shape(), &v);
        }
    }
    write_npz(&d.join("elsewhere.npz"), &values).unwrap();
    let other = d.join("elsewhere.npz");
    let out = aim(&["compare", m_s, "--inputs", in_s.to_str().unwrap(), "--against", other.to_str().unwrap()]);
    let text_out = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text_out}");
    assert!(text_out.contains("first over tolerance: node 'act' (Tanh), output 'a'"), "{text_out}");
    assert!(text_out.lines().any(|l| l.contains(" act ") && l.contains("<- first over tolerance")), "{text_out}");
    let out =
        aim(&["compare", m_s, "--inputs", in_s.to_str().unwrap(), "--against", other.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["first_over"]["node"], "act");
    assert_eq!(v["rows"].as_array().unwrap().len(), 4);
}

#[test]
fn empty_window_lists_in_onnx_are_the_defaults() {
    // ONNX Runtime reads `strides = []` as "not given"; so does aim's importer.
    let d = tempdir("empty-lists");
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[1,1,4,4]\n  init %w = f32[1,1,3,3] [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]\n  %y = Conv(%x, %w) {dilations=ints[], pads=ints[], strides=ints[]}  # c\n  output %y: f32[1,1,2,2]\n}\n";
    let m = d.join("m.onnx");
    std::fs::write(&m, aim_onnx::export_bytes(&aim_ir::text::parse_model(text).unwrap())).unwrap();
    for b in [aim::Backend::Reference, aim::Backend::Cpu] {
        let model = aim::Model::load_with(&m, b).unwrap();
        let y = model.run(vec![("x".into(), Tensor::from_slice(&[1, 1, 4, 4], &[1.0f32; 16]))]).unwrap();
        assert_eq!(y[0].1.data::<f32>(), &[9.0; 4], "{b:?}");
    }
}

#[test]
fn explore_and_info_show_the_program_specialised_to_a_shape() {
    let d = tempdir("explore-shape");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let m = d.join("m.onnx");
    let m = m.to_str().unwrap();
    let generic = aim(&["explore", m, "--stage", "optimized"]);
    assert!(generic.status.success(), "{}", stderr(&generic));
    let text = String::from_utf8_lossy(&generic.stdout);
    assert!(text.contains("input %x: f32[N,2]") && text.contains("output %y: f32[N,2]"), "{text}");
    let special = aim(&["explore", m, "--stage", "optimized", "--shape", "x=3x2"]);
    assert!(special.status.success(), "{}", stderr(&special));
    let text = String::from_utf8_lossy(&special.stdout);
    // The input bound, and the declared symbolic output made static by inference.
    assert!(text.contains("input %x: f32[3,2]") && text.contains("output %y: f32[3,2]"), "{text}");
    let info = aim(&["info", m, "--shape", "x=3x2"]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("specialised to input shapes") && !text.contains("reference kernels"), "{text}");
    assert_clean_error(&aim(&["explore", m, "--shape", "x=3x2", "--shape", "x=4x2"]), "one program");
}

/// `aim quantize`: a static quantization of the small MLP with a calibration set writes a
/// QDQ model aim runs, with the accuracy table; the user's mistakes are one clear line.
#[test]
fn quantize_writes_a_model_and_refuses_bad_options() {
    let d = tempdir("quantize");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let cal = d.join("cal");
    std::fs::create_dir(&cal).unwrap();
    for (k, v) in [[1.0f32, 2.0, -1.0, 0.5], [0.25, -3.0, 2.0, 1.0]].iter().enumerate() {
        write_npz(&cal.join(format!("{k}.npz")), &[("x".into(), Tensor::from_slice(&[2, 2], v))]).unwrap();
    }
    let (m, q) = (d.join("m.onnx"), d.join("q.onnx"));
    let (m, q, c) = (m.to_str().unwrap(), q.to_str().unwrap(), cal.to_str().unwrap());
    let out = aim(&["quantize", m, "-o", q, "--calibration", c]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("quantized 1 nodes (1 MatMul)") && text.contains("RMS diff / RMS"), "{text}");
    let run = aim(&["run", q, "--inputs", cal.join("0.npz").to_str().unwrap()]);
    assert!(run.status.success(), "{}", stderr(&run));
    let ops = aim(&["info", q]);
    assert!(String::from_utf8_lossy(&ops.stdout).contains("QuantizeLinear"), "the model holds QDQ pairs");
    let dynamic = aim(&["quantize", m, "-o", q, "--mode", "dynamic"]);
    assert!(dynamic.status.success(), "{}", stderr(&dynamic));
    // Quantized and compiled in one go: a .aim file that runs, no intermediate left.
    let a = d.join("q.aim");
    let compiled = aim(&["compile", m, "-o", a.to_str().unwrap(), "--quantize", "static", "--calibration", c]);
    assert!(compiled.status.success(), "{}", stderr(&compiled));
    assert!(!d.join("q.quantized.onnx").exists());
    let run = aim(&["run", a.to_str().unwrap(), "--inputs", cal.join("1.npz").to_str().unwrap()]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_clean_error(&aim(&["quantize", m, "-o", q]), "static quantization needs --calibration DIR");
    assert_clean_error(
        &aim(&["quantize", m, "-o", q, "--calibration", c, "--method", "mse"]),
        "unknown calibration method 'mse'",
    );
    assert_clean_error(&aim(&["quantize", m, "-o", q, "--mode", "int4"]), "unknown mode 'int4'");
    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_clean_error(&aim(&["quantize", m, "-o", q, "--calibration", empty.to_str().unwrap()]), "no .npz input sets");
    assert_clean_error(
        &aim(&["quantize", m, "-o", q, "--exclude", "mm", "--calibration", c]),
        "no Conv, MatMul or Gemm node",
    );
}

#[test]
fn half_weights_round_each_weight_to_f16() {
    let d = tempdir("half-weights");
    // 0.1, 0.2, 0.3 are not f16 values: the f16 run differs, within f16's 2^-11.
    let m = model(
        vec![node("MatMul", "mm", &["x", "W"], &["h"], vec![]), node("Add", "bias", &["h", "b"], &["y"], vec![])],
        vec![value("x", 1, &[Err("N"), Ok(2)])],
        vec![value("y", 1, &[Err("N"), Ok(2)])],
        vec![f32_tensor("W", &[2, 2], &[0.1, 0.2, 0.3, 1.0]), f32_tensor("b", &[2], &[0.5, -1.0])],
        17,
    );
    std::fs::write(d.join("m.onnx"), m).unwrap();
    let x = Tensor::from_slice(&[3, 2], &[1.0f32, 1.0, 2.0, -3.0, -1.0, 2.0]);
    write_npz(&d.join("in.npz"), &[("x".into(), x)]).unwrap();
    let run = |w: &str| {
        let o = d.join(format!("out-{w}.npz"));
        let out = aim(&[
            "run",
            d.join("m.onnx").to_str().unwrap(),
            "--inputs",
            d.join("in.npz").to_str().unwrap(),
            "--outputs",
            o.to_str().unwrap(),
            "--weights",
            w,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        read_npz(&o).unwrap()[0].1.data::<f32>().to_vec()
    };
    let (full, half) = (run("f32"), run("f16"));
    assert_ne!(full, half, "the f16 weights are rounded");
    for (a, b) in full.iter().zip(&half) {
        // |x|·|w| sums to at most 7.6 here: each product off by at most 2^-11 of itself.
        assert!((a - b).abs() <= 7.6 / 2048.0, "{a} vs {b}");
    }
    assert_clean_error(&aim(&["run", d.join("m.onnx").to_str().unwrap(), "--weights", "f8"]), "--weights f8");
}

/// A model of two dense layers on the same `k × n` weight, `y = x·W + (x·Wtᵀ + 0.5)` (a
/// MatMul, and a Gemm reading the weight transposed with `transB` and a bias), `x` of
/// `rows` rows; and the weight.
fn two_dense_layers(k: usize, n: usize, rows: Result<i64, &str>) -> (Vec<f32>, Vec<u8>) {
    let w: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0).collect();
    let wt: Vec<f32> = (0..k * n).map(|i| w[(i % k) * n + i / k]).collect();
    let m = model(
        vec![
            node("MatMul", "mm", &["x", "W"], &["h"], vec![]),
            node("Gemm", "gemm", &["x", "Wt", "b"], &["g"], vec![int_attr("transB", 1)]),
            node("Add", "sum", &["h", "g"], &["y"], vec![]),
        ],
        vec![value("x", 1, &[rows, Ok(k as i64)])],
        vec![value("y", 1, &[rows, Ok(n as i64)])],
        vec![
            f32_tensor("W", &[k as i64, n as i64], &w),
            f32_tensor("Wt", &[n as i64, k as i64], &wt),
            f32_tensor("b", &[n as i64], &vec![0.5; n]),
        ],
        17,
    );
    (w, m)
}

/// `--weights int4`: each dense weight within half a quantization step of its block's range
/// (what bounds every output's error), kept at 4 bits by the kernel; a Gemm with `transB`
/// and a bias too; a layer shorter than a block stays f32.
#[test]
fn int4_weights_stay_within_half_a_step() {
    let d = tempdir("int4-weights");
    let (k, n) = (64usize, 8usize);
    let (w, m) = two_dense_layers(k, n, Ok(3));
    let path = d.join("m.onnx");
    std::fs::write(&path, m).unwrap();
    let xv: Vec<f32> = (0..3 * k).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
    let x = vec![("x".to_string(), Tensor::from_slice(&[3, k], &xv))];
    let load = |int4: Option<usize>| {
        aim::Model::load_with_options(&path, &aim::Options { int4_weights: int4, ..aim::Options::default() }).unwrap()
    };
    let q = load(Some(32));
    let q4_layers = q
        .optimized_graph()
        .unwrap()
        .nodes
        .iter()
        .filter(|n| matches!(n.attrs.get("weights"), Some(aim_ir::Attr::String(s)) if s == "q4"))
        .count();
    assert_eq!(q4_layers, 2, "both layers keep 4-bit weights");
    let full = load(None).run(x.clone()).unwrap()[0].1.data::<f32>().to_vec();
    let quant = q.run(x).unwrap()[0].1.data::<f32>().to_vec();
    assert_ne!(full, quant, "the weights are quantized");
    // Each weight moves by at most half a step, a step being its block's range (with 0) / 15.
    for r in 0..3 {
        for j in 0..n {
            let mut bound = 0f32;
            for kk in 0..k {
                let blk = (kk / 32) * 32..(kk / 32 + 1) * 32;
                let (lo, hi) = blk.fold((0f32, 0f32), |(lo, hi), b| (lo.min(w[b * n + j]), hi.max(w[b * n + j])));
                bound += xv[r * k + kk].abs() * (hi - lo) / 30.0;
            }
            // Two layers read the same weights.
            let (a, b) = (full[r * n + j], quant[r * n + j]);
            assert!((a - b).abs() <= 2.0 * bound + 1e-4, "[{r},{j}] {a} vs {b}, bound {}", 2.0 * bound);
        }
    }
    // Blocks of 64 rows: still bounded; K below a block (128): left in f32.
    assert_eq!(
        load(Some(128)).run(vec![("x".into(), Tensor::from_slice(&[3, k], &xv))]).unwrap()[0].1.data::<f32>(),
        &full[..]
    );
    // Compiled ahead of time with --weights int4: the same outputs, bit for bit.
    let file = d.join("m.aim");
    let o = aim(&["compile", path.to_str().unwrap(), "-o", file.to_str().unwrap(), "--weights", "int4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let x = vec![("x".to_string(), Tensor::from_slice(&[3, k], &xv))];
    assert_eq!(aim::Model::load(&file).unwrap().run(x).unwrap()[0].1.data::<f32>(), &quant[..]);
    assert_clean_error(&aim(&["run", path.to_str().unwrap(), "--weights", "int4:48"]), "32, 64 or 128");
    assert_clean_error(&aim(&["run", path.to_str().unwrap(), "--weights", "int4", "-O1"]), "need -O2");
}

/// `--weights int8`: each dense weight within half a step (its column's max|w| / 127) of
/// its value, kept at 8 bits by the kernel, for few rows (products on the codes) and many
/// (widened panels); a Gemm with `transB` and a bias too; an `.aim` file compiled with it
/// gives the same bits; with int4 at once, or at -O1, a clean error.
#[test]
fn int8_weights_stay_within_half_a_step() {
    let d = tempdir("int8-weights");
    let (k, n) = (40usize, 8usize);
    let (w, m) = two_dense_layers(k, n, Err("rows"));
    let path = d.join("m.onnx");
    std::fs::write(&path, m).unwrap();
    let load = |int8: bool| {
        aim::Model::load_with_options(&path, &aim::Options { int8_weights: int8, ..aim::Options::default() }).unwrap()
    };
    let (f, q) = (load(false), load(true));
    let file = d.join("m.aim");
    let o = aim(&["compile", path.to_str().unwrap(), "-o", file.to_str().unwrap(), "--weights", "int8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let compiled = aim::Model::load(&file).unwrap();
    for rows in [3usize, 20] {
        let xv: Vec<f32> = (0..rows * k).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        let x = vec![("x".to_string(), Tensor::from_slice(&[rows, k], &xv))];
        let full = f.run(x.clone()).unwrap()[0].1.data::<f32>().to_vec();
        let quant = q.run(x.clone()).unwrap()[0].1.data::<f32>().to_vec();
        assert_ne!(full, quant, "the weights are quantized");
        let coded = q
            .optimized_graph()
            .unwrap()
            .nodes
            .iter()
            .filter_map(|n| n.ints("q4_shape").map(|s| s.to_vec()))
            .filter(|s| s.last() == Some(&8))
            .count();
        assert_eq!(coded, 2, "both layers keep 8-bit weights");
        for r in 0..rows {
            for j in 0..n {
                let max = (0..k).map(|kk| w[kk * n + j].abs()).fold(0f32, f32::max);
                let bound: f32 = (0..k).map(|kk| xv[r * k + kk].abs() * max / 254.0).sum();
                // Two layers read the same weights.
                let (a, b) = (full[r * n + j], quant[r * n + j]);
                assert!((a - b).abs() <= 2.0 * bound + 1e-4, "{rows} rows [{r},{j}] {a} vs {b}, bound {}", 2.0 * bound);
            }
        }
        assert_eq!(compiled.run(x).unwrap()[0].1.data::<f32>(), &quant[..], "{rows} rows, compiled");
    }
    assert_clean_error(&aim(&["run", path.to_str().unwrap(), "--weights", "int8", "-O1"]), "need -O2");
    assert_clean_error(&aim(&["run", path.to_str().unwrap(), "--weights", "int8", "-O0"]), "need -O2");
    // The file's recorded choice is the cpu pipeline's: the reference backend runs it in f32.
    let reference = aim::Options { backend: aim::Backend::Reference, ..aim::Options::default() };
    assert!(aim::Model::load_with_options(&file, &reference).is_ok());
    assert_clean_error(
        &aim(&["run", path.to_str().unwrap(), "--weights", "int4", "--backend", "reference"]),
        "cpu backend",
    );
    assert_clean_error(&aim(&["run", path.to_str().unwrap(), "--weights", "int9"]), "int8");
}

/// `--backend cuda`: on a machine with an NVIDIA GPU the outputs are the cpu backend's;
/// without one, one line saying what is missing (driver, device or architecture).
#[test]
fn the_cuda_backend_runs_or_says_what_is_missing() {
    let d = tempdir("cuda");
    std::fs::write(d.join("m.onnx"), tiny_mlp()).unwrap();
    let x = Tensor::from_slice(&[3, 2], &[1.0f32, 1.0, 0.0, 0.0, -1.0, 2.0]);
    write_npz(&d.join("in.npz"), &[("x".into(), x)]).unwrap();
    let (m, i, o) = (d.join("m.onnx"), d.join("in.npz"), d.join("out.npz"));
    let out = aim(&[
        "run",
        m.to_str().unwrap(),
        "--backend",
        "cuda",
        "--inputs",
        i.to_str().unwrap(),
        "--outputs",
        o.to_str().unwrap(),
    ]);
    if out.status.success() {
        assert_eq!(read_npz(&o).unwrap()[0].1.data::<f32>(), &[4.5, 0.0, 0.5, 0.0, 5.5, 0.0]);
        return;
    }
    let e = stderr(&out);
    let said = ["no NVIDIA driver found", "reports no GPU", "aim's PTX needs sm_80", "too old for PTX"];
    let Some(reason) = said.iter().find(|s| e.contains(*s)) else { panic!("{e}") };
    assert_clean_error(&out, reason);
}
