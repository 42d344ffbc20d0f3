//! Custom operators from a C library (`examples/custom_op/custom_ops.c`, built here with
//! the system's C compiler): a model using them gives what the same model with the ops
//! written out in ONNX gives — through the command line, the library and an `.aim` file —
//! and a kernel's failures are errors naming the node.

#[path = "../../tests/common/mod.rs"]
mod common;

use aim::npz::{read_npz, write_npz};
use aim::{Model, Options, Tensor};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The example library, compiled into `dir`.
fn library(dir: &Path) -> PathBuf {
    // The repository root (this package is its `cli/`).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("cli/ has a parent");
    let out = dir.join("libcustom_ops.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("examples/custom_op/custom_ops.c"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// `x -> ScaleShift(scale, shift) -> Relu -> PairSum -> y` with the custom ops (`attrs`
/// added to ScaleShift), or the same written out in ONNX ops.
fn model(dir: &Path, tag: &str, custom: bool, attrs: &str) -> PathBuf {
    let body = if custom {
        format!(
            "  %s = com.example:ScaleShift(%x) {{scale=2.0, shift=-1.0{attrs}}}  # ss\n  %r = Relu(%s)  # relu\n  %y = com.example:PairSum(%r)  # ps\n"
        )
    } else {
        "  init %k = f32[] [2.0]\n  init %b = f32[] [-1.0]\n  init %pairs = i64[3] [0, -1, 2]\n  init %axis = i64[1] [-1]\n  %m = Mul(%x, %k)  # mul\n  %s = Add(%m, %b)  # add\n  %r = Relu(%s)  # relu\n  %p = Reshape(%r, %pairs)  # pairs\n  %y = ReduceSum(%p, %axis) {keepdims=0}  # sum\n"
            .to_string()
    };
    let text = format!("opset 17\ngraph \"g\" {{\n  input %x: f32[batch,6]\n{body}  output %y: f32[batch,3]\n}}\n");
    let m = aim_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let p = dir.join(format!("{tag}.onnx"));
    std::fs::write(&p, aim_onnx::export_bytes(&m)).unwrap();
    p
}

fn input(batch: usize) -> Tensor {
    let v: Vec<f32> = (0..batch * 6).map(|i| ((i * 7919) % 23) as f32 / 11.0 - 1.0).collect();
    Tensor::from_slice(&[batch, 6], &v)
}

fn aim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aim")).args(args).env_remove("AIM_LOG").output().expect("running aim")
}

fn close(got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape());
    for (a, b) in got.to_f64_vec().iter().zip(want.to_f64_vec()) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
    }
}

#[test]
fn a_c_library_runs_like_the_ops_written_out() {
    let d = common::tempdir("custom-ops");
    let lib = library(&d);
    let custom = model(&d, "custom", true, "");
    let plain = model(&d, "plain", false, "");
    // The library API: a batch of 2 and one of 3 (the program is specialised per shape,
    // the custom ops' inference giving their outputs' shapes).
    let opts = Options { custom_ops: vec![lib.clone()], threads: Some(2), ..Options::default() };
    let with_ops = Model::load_with_options(&custom, &opts).unwrap();
    let written_out = Model::load(&plain).unwrap();
    for batch in [2, 3] {
        let x = vec![("x".to_string(), input(batch))];
        let got = with_ops.run(x.clone()).unwrap();
        let want = written_out.run(x).unwrap();
        close(&got[0].1, &want[0].1);
    }
    // The program runs them as custom ops, not reference-kernel fallbacks.
    let (_, kinds) = with_ops.node_kinds().unwrap();
    assert_eq!(kinds.iter().filter(|(_, k)| *k == aim_runtime::cpu::NodeKind::Custom).count(), 2, "{kinds:?}");
    // The command line, and an .aim file compiled with the library and loaded with it.
    let inputs = d.join("in.npz");
    write_npz(&inputs, &[("x".into(), input(4))]).unwrap();
    let run = |m: &Path, extra: &[&str], out: &str| -> Tensor {
        let mut args = vec!["run", m.to_str().unwrap(), "--inputs", inputs.to_str().unwrap()];
        let out = d.join(out);
        args.extend(["--outputs", out.to_str().unwrap()]);
        args.extend(extra);
        let o = aim(&args);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        read_npz(&out).unwrap().remove(0).1
    };
    let want = run(&plain, &[], "plain.npz");
    let lib_arg = lib.to_str().unwrap();
    close(&run(&custom, &["--custom-ops", lib_arg], "cli.npz"), &want);
    let file = d.join("custom.aim");
    let o = aim(&[
        "compile",
        custom.to_str().unwrap(),
        "-o",
        file.to_str().unwrap(),
        "--shape",
        "x=4x6",
        "--custom-ops",
        lib_arg,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    close(&run(&file, &["--custom-ops", lib_arg], "aim.npz"), &want);
}

#[test]
fn a_kernel_failure_is_an_error_naming_the_node() {
    let d = common::tempdir("custom-op-errors");
    let lib = library(&d);
    let opts = Options { custom_ops: vec![lib.clone()], ..Options::default() };
    let run_err = |tag: &str, attrs: &str| -> String {
        let m = Model::load_with_options(model(&d, tag, true, attrs), &opts).unwrap();
        m.run(vec![("x".into(), input(2))]).expect_err("the run fails").to_string()
    };
    // A non-zero status, with the kernel's message.
    let e = run_err("fails", ", fail=1");
    assert!(e.contains("ss") && e.contains("com.example:ScaleShift") && e.contains("status 7"), "{e}");
    assert!(e.contains("asked to fail by the node's 'fail' attribute"), "{e}");
    // A kernel that changes its output's size.
    let e = run_err("bad", ", bad_shape=1");
    assert!(e.contains("ss") && e.contains("changed output 0's type or size"), "{e}");
    // Inference refuses: an odd last dim is an error at load, naming the node.
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[2,5]\n  %y = com.example:PairSum(%x)  # odd\n  output %y: f32[2,2]\n}\n";
    let p = d.join("odd.onnx");
    std::fs::write(&p, aim_onnx::export_bytes(&aim_ir::text::parse_model(text).unwrap())).unwrap();
    let e = Model::load_with_options(&p, &opts).err().expect("refused").to_string();
    assert!(e.contains("odd") && e.contains("the last dim (5) must be even"), "{e}");
    // Without the library: the ops are named, with how to provide them.
    let o = aim(&["run", model(&d, "nolib", true, "").to_str().unwrap(), "--shape", "x=2x6"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("com.example:PairSum (node ps)") && e.contains("--custom-ops LIB.so"), "{e}");
    // Libraries that are not custom-op libraries.
    let o = aim(&["run", "x.onnx", "--custom-ops", d.join("missing.so").to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && e.contains("missing.so") && e.contains("cannot load"), "{e}");
    let not_ops = d.join("libnotops.so");
    let src = d.join("notops.c");
    std::fs::write(&src, "int not_an_entry_point(void) { return 1; }\n").unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    assert!(Command::new(&cc)
        .arg("-shared")
        .arg("-fPIC")
        .arg(&src)
        .arg("-o")
        .arg(&not_ops)
        .status()
        .unwrap()
        .success());
    let o = aim(&["run", "x.onnx", "--custom-ops", not_ops.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && e.contains("no aim_custom_ops entry point"), "{e}");
}

/// `x[..., 2i] + x[..., 2i + 1]` in Rust.
struct RustPairSum;

impl aim_ir::custom::CustomOp for RustPairSum {
    fn domain(&self) -> &str {
        "com.rust"
    }
    fn name(&self) -> &str {
        "PairSum"
    }
    fn infer(&self, _: &aim_ir::Node, inputs: &[Option<aim_ir::ValueType>]) -> Result<Vec<aim_ir::ValueType>, String> {
        let mut t = inputs.first().cloned().flatten().ok_or("PairSum takes one input")?;
        if let Some(last) = t.shape.as_mut().and_then(|s| s.last_mut()) {
            *last = match last {
                aim_ir::Dim::Known(n) if *n % 2 == 0 => aim_ir::Dim::Known(*n / 2),
                aim_ir::Dim::Known(n) => return Err(format!("the last dim ({n}) must be even")),
                _ => aim_ir::Dim::Unknown,
            };
        }
        Ok(vec![t])
    }
    fn compute(
        &self,
        _: &aim_ir::Node,
        inputs: &[Option<Tensor>],
        host: &aim_ir::custom::Host<'_>,
    ) -> Result<Vec<Tensor>, String> {
        let x = inputs[0].as_ref().ok_or("no input")?;
        // One task per pair, on the runtime's threads.
        let x32 = x.data::<f32>();
        let sums: Vec<std::sync::atomic::AtomicU32> =
            (0..x32.len() / 2).map(|_| std::sync::atomic::AtomicU32::new(0)).collect();
        (host.parallel_for)(sums.len(), &|i| {
            sums[i].store((x32[2 * i] + x32[2 * i + 1]).to_bits(), std::sync::atomic::Ordering::Relaxed)
        });
        let v: Vec<f32> = sums.iter().map(|s| f32::from_bits(s.load(std::sync::atomic::Ordering::Relaxed))).collect();
        let mut shape = x.shape().to_vec();
        *shape.last_mut().ok_or("a scalar")? /= 2;
        Ok(vec![Tensor::from_slice(&shape, &v)])
    }
}

#[test]
fn a_rust_custom_op_runs_in_a_compiled_program() {
    let d = common::tempdir("custom-op-rust");
    aim_ir::custom::register(std::sync::Arc::new(RustPairSum)).unwrap();
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[batch,6]\n  init %k = f32[] [2.0]\n  %m = Mul(%x, %k)  # mul\n  %y = com.rust:PairSum(%m)  # ps\n  %z = Relu(%y)  # relu\n  output %z: f32[batch,3]\n}\n";
    let p = d.join("rust.onnx");
    std::fs::write(&p, aim_onnx::export_bytes(&aim_ir::text::parse_model(text).unwrap())).unwrap();
    let m = Model::load(&p).unwrap();
    let x = input(3);
    let got = m.run(vec![("x".into(), x.clone())]).unwrap();
    let want: Vec<f32> = x.data::<f32>().chunks(2).map(|p| (2.0 * p[0] + 2.0 * p[1]).max(0.0)).collect();
    close(&got[0].1, &Tensor::from_slice(&[3, 3], &want));
}
