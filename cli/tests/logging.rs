//! `AIM_LOG` / `--log` and `--pin-threads`, through the command line: what each level
//! writes, where (`AIM_LOG_FILE`), and pinned runs giving the same outputs.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};

/// A small conv net with a dense head, written as ONNX into `dir`.
fn model(dir: &std::path::Path) -> std::path::PathBuf {
    let w: Vec<String> = (0..8 * 3 * 9).map(|i| format!("{:.3}", ((i * 37) % 17) as f32 / 17.0 - 0.5)).collect();
    let d: Vec<String> = (0..8 * 4).map(|i| format!("{:.3}", ((i * 11) % 13) as f32 / 13.0 - 0.5)).collect();
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[1,3,8,8]\n  init %w = f32[8,3,3,3] [{}]\n  init %d = f32[8,4] [{}]\n  %c = Conv(%x, %w) {{pads=[1, 1, 1, 1]}}  # conv\n  %r = Relu(%c)  # relu\n  %p = GlobalAveragePool(%r)  # gap\n  %f = Flatten(%p)  # flat\n  %y = MatMul(%f, %d)  # head\n  output %y: f32[1,4]\n}}\n",
        w.join(", "),
        d.join(", ")
    );
    let p = dir.join("net.onnx");
    std::fs::write(&p, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    p
}

fn aim(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_aim"));
    c.args(args).env_remove("AIM_LOG").env_remove("AIM_LOG_FILE").env_remove("AIM_PIN_THREADS");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("running aim");
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    o
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn each_level_logs_what_it_says() {
    let d = common::tempdir("logging");
    let m = model(&d);
    let m = m.to_str().unwrap();
    assert_eq!(stderr(&aim(&["run", m], &[])), "", "off by default");
    let info = stderr(&aim(&["run", m], &[("AIM_LOG", "info")]));
    for want in [
        "imported: 5 nodes",
        "types inferred",
        "at -O3",
        "optimised at -O3",
        "memory plan",
        "weights packed",
        "loaded on the cpu backend",
    ] {
        assert!(info.contains(want), "info lacks {want:?}:\n{info}");
    }
    assert!(!info.contains("[debug") && !info.contains(": node "), "{info}");
    let debug = stderr(&aim(&["run", m, "--log", "debug"], &[]));
    assert!(debug.contains("pass fuse-epilogues ("), "{debug}");
    // Every node of the run, with its kernel and output type, then the total.
    assert!(debug.contains("aim:Dense: packed kernel -> f32[1,4]"), "{debug}");
    assert!(debug.contains("aim:Conv: packed kernel"), "{debug}");
    assert!(debug.contains("run: ") && debug.contains(" nodes in "), "{debug}");
    assert!(!debug.contains("[trace"), "{debug}");
    let trace = stderr(&aim(&["run", m], &[("AIM_LOG", "trace")]));
    assert!(
        trace.contains("run with x: f32[1,3,8,8]")
            && trace.contains(" reads ")
            && trace.contains("run gave y: f32[1,4]"),
        "{trace}"
    );
    // -O0: the reference kernels, each node logged as one.
    let o0 = stderr(&aim(&["run", m, "-O0", "--log", "debug"], &[]));
    assert!(o0.contains("Conv: reference -> f32[1,8,8,8]") && o0.contains("loaded on the reference backend"), "{o0}");
    // To a file instead of stderr.
    let file = d.join("aim.log");
    let o = aim(&["run", m], &[("AIM_LOG", "debug"), ("AIM_LOG_FILE", file.to_str().unwrap())]);
    assert_eq!(stderr(&o), "");
    let logged = std::fs::read_to_string(&file).unwrap();
    assert!(logged.lines().count() > 10 && logged.lines().all(|l| l.starts_with("aim[")), "{logged}");
}

#[test]
fn pinned_threads_give_the_same_outputs() {
    let d = common::tempdir("pinning");
    let m = model(&d);
    let m = m.to_str().unwrap();
    let plain = aim(&["run", m, "--threads", "2"], &[]);
    let pinned = aim(&["run", m, "--threads", "2", "--pin-threads", "--log", "info"], &[]);
    assert_eq!(plain.stdout, pinned.stdout);
    let e = stderr(&pinned);
    assert!(e.contains("workers pinned to CPUs ["), "{e}");
    let by_env = aim(&["run", m, "--threads", "2", "--log", "info"], &[("AIM_PIN_THREADS", "cores")]);
    assert_eq!(plain.stdout, by_env.stdout);
    assert!(stderr(&by_env).contains("workers pinned"));
}
