//! `aim compile --target`: shared objects for the host and for AArch64, their exported entry,
//! and the options refused with a message. (Running them is `tests/c_api.py`, from C, against
//! both libraries, and `tests/cross_aarch64.sh` under QEMU.)

#[path = "../../tests/common/mod.rs"]
mod common;

use common::*;
use std::process::{Command, Output};

fn aim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aim")).args(args).output().expect("running aim")
}

/// A small conv net with a symbolic batch, as ONNX.
fn net(dir: &std::path::Path) -> std::path::PathBuf {
    let w: Vec<String> = (0..8 * 3 * 9).map(|i| format!("{:.3}", ((i * 37) % 17) as f32 / 17.0 - 0.5)).collect();
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[N,3,8,8]\n  init %w = f32[8,3,3,3] [{}]\n  %c = Conv(%x, %w) {{pads=[1, 1, 1, 1]}}  # conv\n  %r = Relu(%c)  # relu\n  %p = GlobalAveragePool(%r)  # gap\n  %y = Flatten(%p)  # flat\n  output %y: f32[N,8]\n}}\n",
        w.join(", ")
    );
    let p = dir.join("net.onnx");
    std::fs::write(&p, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    p
}

fn host_triple() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "aarch64-unknown-linux-gnu",
        _ => "x86_64-unknown-linux-gnu",
    }
}

/// The object exports `NAME_load` and needs only `aim_runtime_load_embedded` from the
/// runtime; each `--shape` signature adds a program next to the shape-generic one.
#[test]
fn a_shared_object_exports_its_entry() {
    let d = tempdir("aot-entry");
    let onnx = net(&d);
    let so = d.join("libnet.so");
    let (m, o) = (onnx.to_str().unwrap(), so.to_str().unwrap());
    let out = aim(&["compile", m, "--target", host_triple(), "--shape", "x=1x3x8x8", "--shape", "x=4x3x8x8", "-o", o]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("3 programs") && said.contains("entry net_load"), "{said}");
    let bytes = std::fs::read(&so).unwrap();
    assert!(bytes.starts_with(b"\x7fELF"), "an ELF file");
    for sym in [&b"net_load"[..], b"aim_runtime_load_embedded", b"AIMFILE\0"] {
        assert!(bytes.windows(sym.len()).any(|w| w == sym), "{} is in the object", String::from_utf8_lossy(sym));
    }
    let named = d.join("libother.so");
    let out = aim(&["compile", m, "--target", host_triple(), "--name", "first_net", "-o", named.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("entry first_net_load"), "{out:?}");
}

/// Cross-compiling for AArch64 works on any host (the weights are packed at load there).
#[test]
fn aarch64_objects_are_made_anywhere() {
    if Command::new("aarch64-linux-gnu-gcc").arg("--version").output().is_err() {
        eprintln!("skipped: no aarch64-linux-gnu-gcc (tests/cross_aarch64.sh installs it)");
        return;
    }
    let d = tempdir("aot-a64");
    let onnx = net(&d);
    let so = d.join("libnet.so");
    let out =
        aim(&["compile", onnx.to_str().unwrap(), "--target", "aarch64-unknown-linux-gnu", "-o", so.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&so).unwrap();
    // e_machine 183: EM_AARCH64.
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 183, "an AArch64 object");
}

/// Bad targets, names, shapes and linkers are errors naming what is wrong.
#[test]
fn bad_options_are_refused_with_a_reason() {
    let d = tempdir("aot-bad");
    let onnx = net(&d);
    let m = onnx.to_str().unwrap();
    let so = d.join("libnet.so");
    let o = so.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--target", "x86_64-pc-windows-msvc"], "x86_64-unknown-linux-gnu"),
        (&["--target", "riscv64gc-unknown-linux-gnu"], "aarch64-unknown-linux-gnu"),
        (&["--target", "x86_64-unknown-linux-gnu,x86-64-v9"], "x86-64-v9"),
        (&["--target", host_triple(), "--name", "9lives"], "not a C identifier"),
        (&["--target", host_triple(), "--shape", "y=1x3x8x8"], "no input named 'y'"),
        (&["--target", host_triple(), "--linker", "/nonexistent/cc"], "cannot run the linker"),
        (&["--name", "net"], "--target"),
    ];
    for (args, want) in cases {
        let mut all = vec!["compile", m, "-o", o];
        all.extend_from_slice(args);
        let out = aim(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
}
