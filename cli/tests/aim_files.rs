//! `.aim` files end to end: `aim compile`, then every command and the library loading the
//! result as they load ONNX, with the same outputs; damaged files as clean errors.

#[path = "../../tests/common/mod.rs"]
mod common;

use aim::npz::{read_npz, write_npz};
use aim::Tensor;
use common::*;
use std::process::{Command, Output};

fn aim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aim")).args(args).output().expect("running aim")
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A conv net with a weight large enough to land in the data section, written as ONNX.
fn conv_model(dir: &std::path::Path, batch: &str) -> std::path::PathBuf {
    let w: Vec<String> = (0..8 * 3 * 9).map(|i| format!("{:.3}", ((i * 37) % 17) as f32 / 17.0 - 0.5)).collect();
    let text = format!(
        "opset 17\nproducer \"tests\"\ndoc \"a test net\"\nmeta \"labels\" = \"a,b\"\ngraph \"g\" {{\n  input %x: f32[{batch},3,8,8]\n  init %w = f32[8,3,3,3] [{}]\n  init %b = f32[8] [0.1, -0.1, 0.2, -0.2, 0.3, -0.3, 0.0, 0.5]\n  %c = Conv(%x, %w, %b) {{pads=[1, 1, 1, 1]}}  # conv\n  %r = Relu(%c)  # relu\n  %p = GlobalAveragePool(%r)  # gap\n  %y = Flatten(%p)  # flat\n  output %y: f32[{batch},8]\n}}\n",
        w.join(", ")
    );
    let p = dir.join(format!("net_{batch}.onnx"));
    std::fs::write(&p, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    p
}

fn input(n: usize) -> Tensor {
    let v: Vec<f32> = (0..n * 3 * 64).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
    Tensor::from_slice(&[n, 3, 8, 8], &v)
}

fn outputs(model: &std::path::Path, inputs: &std::path::Path, out: &std::path::Path) -> Vec<(String, Tensor)> {
    ok(&aim(&[
        "run",
        model.to_str().unwrap(),
        "--inputs",
        inputs.to_str().unwrap(),
        "--outputs",
        out.to_str().unwrap(),
    ]));
    read_npz(out).unwrap()
}

#[test]
fn an_optimized_aim_file_runs_like_its_onnx_model() {
    let d = tempdir("aim-static");
    let onnx = conv_model(&d, "2");
    let file = d.join("net.aim");
    let said = ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    assert!(said.contains("optimized program"), "{said}");
    write_npz(&d.join("in.npz"), &[("x".into(), input(2))]).unwrap();
    let want = outputs(&onnx, &d.join("in.npz"), &d.join("a.npz"));
    let got = outputs(&file, &d.join("in.npz"), &d.join("b.npz"));
    assert_eq!(got[0].0, want[0].0);
    assert_eq!(got[0].1.bytes(), want[0].1.bytes(), "bit for bit the JIT's outputs");
    let info = ok(&aim(&["info", file.to_str().unwrap(), "--verify"]));
    for s in [
        "aim file: optimized program from net_2.onnx",
        "checksums: all 1 constants verified",
        "metadata: labels = a,b",
        "doc: a test net",
    ] {
        assert!(info.contains(s), "{s:?} not in:\n{info}");
    }
    let explored = ok(&aim(&["explore", file.to_str().unwrap(), "--stage", "optimized"]));
    assert!(explored.contains("aim:Conv"), "{explored}");
    // The library loads it too, and says what the reference backend cannot do with it.
    let m = aim::Model::load(&file).unwrap();
    assert_eq!(m.run(vec![("x".into(), input(2))]).unwrap()[0].1.bytes(), want[0].1.bytes());
    let e = aim::Model::load_with(&file, aim::Backend::Reference).err().expect("refused");
    assert!(e.to_string().contains("the reference backend needs the ONNX model"), "{e}");
}

#[test]
fn symbolic_dims_are_stored_as_source_or_specialised_with_a_shape() {
    let d = tempdir("aim-symbolic");
    let onnx = conv_model(&d, "N");
    let (src, one) = (d.join("src.aim"), d.join("one.aim"));
    assert!(ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", src.to_str().unwrap()])).contains("source program"));
    let said = ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", one.to_str().unwrap(), "--shape", "x=3x3x8x8"]));
    assert!(said.contains("optimized program"), "{said}");
    for n in [1usize, 3] {
        write_npz(&d.join("in.npz"), &[("x".into(), input(n))]).unwrap();
        let want = outputs(&onnx, &d.join("in.npz"), &d.join("a.npz"));
        let got = outputs(&src, &d.join("in.npz"), &d.join("b.npz"));
        assert_eq!(got[0].1.bytes(), want[0].1.bytes(), "batch {n}");
    }
    // The specialised file takes its shape and refuses others, naming the input.
    let want = outputs(&onnx, &d.join("in.npz"), &d.join("a.npz"));
    assert_eq!(outputs(&one, &d.join("in.npz"), &d.join("c.npz"))[0].1.bytes(), want[0].1.bytes());
    write_npz(&d.join("in1.npz"), &[("x".into(), input(1))]).unwrap();
    let o = aim(&["run", one.to_str().unwrap(), "--inputs", d.join("in1.npz").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains('x'), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `aim compile --target all` with a `.aim` output writes one package: it says what each
/// program reads, `aim info` lists the programs and which one runs here, `aim run` runs
/// that one as the single-target file does, and the flags of shared objects are refused.
#[test]
fn a_package_for_every_target_lists_and_runs_its_programs() {
    let d = tempdir("aim-package");
    let onnx = conv_model(&d, "2");
    let (all, single) = (d.join("all.aim"), d.join("single.aim"));
    let said = ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", all.to_str().unwrap(), "--target", "all"]));
    assert!(said.contains("5 optimized programs"), "{said}");
    assert!(said.contains("aarch64 aarch64-neon:") && said.contains("0.0 MiB of them its own"), "{said}");
    let info = ok(&aim(&["info", all.to_str().unwrap(), "--verify"]));
    for s in [
        "aim file: 5 programs from net_2.onnx",
        "program 0: optimized x86_64 baseline",
        "program 4: optimized aarch64 aarch64-neon",
        "(runs here)",
        "checksums: all 1 constants verified",
    ] {
        assert!(info.contains(s), "{s:?} not in:\n{info}");
    }
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", single.to_str().unwrap()]));
    write_npz(&d.join("in.npz"), &[("x".into(), input(2))]).unwrap();
    let want = outputs(&single, &d.join("in.npz"), &d.join("a.npz"));
    let got = outputs(&all, &d.join("in.npz"), &d.join("b.npz"));
    assert_eq!(got[0].1.bytes(), want[0].1.bytes(), "bit for bit the single-target file's outputs");
    for (target, extra, want) in [
        ("all", vec!["--cpu", "x86-64-v3"], "--cpu caps a single-target .aim file's level"),
        ("all", vec!["--name", "net"], "--name and --linker are for shared objects"),
        ("x86-64-v3,x86-64-v9", vec![], "'x86-64-v9' is not a target of a .aim file"),
    ] {
        let mut args = vec!["compile", onnx.to_str().unwrap(), "-o", all.to_str().unwrap(), "--target", target];
        args.extend(extra.iter().copied());
        let o = aim(&args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(e.contains(want) && !e.contains("panicked"), "{args:?}: wanted {want:?} in {e}");
    }
}

#[test]
fn damaged_aim_files_are_one_line_errors() {
    let d = tempdir("aim-damaged");
    let onnx = conv_model(&d, "2");
    let file = d.join("net.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let bytes = std::fs::read(&file).unwrap();
    let cut = d.join("cut.aim");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    let bad = d.join("flipped.aim");
    std::fs::write(&bad, &flipped).unwrap();
    for (args, want) in [
        (vec!["run", cut.to_str().unwrap()], "truncated"),
        (vec!["info", cut.to_str().unwrap()], "truncated"),
        (vec!["info", bad.to_str().unwrap(), "--verify"], "does not match its checksum"),
        (vec!["info", onnx.to_str().unwrap(), "--verify"], "is not one"),
    ] {
        let o = aim(&args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: {e}");
        assert!(e.contains(want) && !e.contains("panicked"), "{args:?}: wanted {want:?} in {e}");
    }
}

/// The benchmark models (in `AIM_MODELS`, set by tests/run.sh) as `.aim` files: their
/// direct, Winograd, depthwise and dense kernels read the prepacked weights in place and
/// give the JIT's outputs bit for bit.
#[test]
fn benchmark_models_run_from_aim_files_bit_for_bit() {
    let Ok(dir) = std::env::var("AIM_MODELS") else {
        eprintln!("AIM_MODELS not set: skipping the benchmark models (tests/run.sh sets it)");
        return;
    };
    let d = tempdir("aim-models");
    for name in ["mobilenetv2", "resnet50", "bert_l6", "mlp_b64"] {
        let onnx = std::path::Path::new(&dir).join(format!("{name}.onnx"));
        let inputs = read_npz(&std::path::Path::new(&dir).join(format!("{name}.inputs.npz"))).unwrap();
        let file = d.join(format!("{name}.aim"));
        ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
        let jit = aim::Model::load(&onnx).unwrap().run(inputs.clone()).unwrap();
        let m = aim::Model::load(&file).unwrap();
        assert_eq!(
            m.run(inputs).unwrap().iter().map(|(_, t)| t.bytes().to_vec()).collect::<Vec<_>>(),
            jit.iter().map(|(_, t)| t.bytes().to_vec()).collect::<Vec<_>>(),
            "{name}"
        );
        let kinds: Vec<String> = aim_ir::aim_file::read(&file)
            .unwrap()
            .model
            .graph
            .nodes
            .iter()
            .filter_map(|n| match n.attrs.get("prepacked") {
                Some(aim_ir::Attr::String(k)) => Some(k.clone()),
                _ => None,
            })
            .collect();
        let want = if name.starts_with("bert") || name.starts_with("mlp") { "dense" } else { "direct" };
        assert!(kinds.iter().any(|k| k == want), "{name}: {kinds:?}");
        if name == "resnet50" {
            assert!(kinds.iter().any(|k| k == "winograd"), "{kinds:?}");
        }
    }
}

/// A prepacked weight that does not fit its node (a file edited, or written by a buggy
/// aim) is an error naming the node, not wrong numbers.
#[test]
fn prepacked_weights_that_do_not_fit_are_errors() {
    let d = tempdir("aim-prepacked");
    let onnx = conv_model(&d, "2");
    let file = d.join("net.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    let (mut model, header) = (f.model.clone(), f.header.clone());
    let conv = model.graph.nodes.iter_mut().find(|n| n.attrs.contains_key("prepacked")).expect("a prepacked conv");
    conv.attrs.insert("weight_shape".into(), aim_ir::Attr::Ints(vec![8, 5, 3, 3]));
    let edited = d.join("edited.aim");
    aim_ir::aim_file::write(&edited, &model, &header).unwrap();
    let e = aim::Model::load(&edited).err().expect("refused").to_string();
    assert!(e.contains("conv") && e.contains("prepacked weights"), "{e}");
}

/// A file compiled for a lower ISA level runs with that level's kernels, as the JIT capped
/// to it does; a file for another machine is refused, saying what it was compiled for.
#[test]
fn aim_files_run_at_their_recorded_level_or_say_why_not() {
    let d = tempdir("aim-level");
    let onnx = conv_model(&d, "2");
    let host = aim_compiler::target::Target::host();
    if host.level >= aim_compiler::target::Level::X86V3 && host.arch == "x86_64" {
        let file = d.join("v3.aim");
        let said = ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap(), "--cpu", "x86-64-v3"]));
        assert!(said.contains("for x86-64-v3"), "{said}");
        let opts = aim::Options { cpu: "x86-64-v3".into(), ..aim::Options::default() };
        let want = aim::Model::load_with_options(&onnx, &opts).unwrap().run(vec![("x".into(), input(2))]).unwrap();
        let got = aim::Model::load(&file).unwrap().run(vec![("x".into(), input(2))]).unwrap();
        assert_eq!(got[0].1.bytes(), want[0].1.bytes());
    }
    let file = d.join("net.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    let mut header = f.header.clone();
    let other = if host.arch == "x86_64" { "aarch64" } else { "x86_64" };
    header.target.insert("arch".into(), other.into());
    let moved = d.join("moved.aim");
    aim_ir::aim_file::write(&moved, &f.model, &header).unwrap();
    let e = aim::Model::load(&moved).err().expect("refused").to_string();
    assert!(e.contains(&format!("compiled for {other}; this machine is {}", host.arch)), "{e}");
}

/// The kernel the compiler chose is checked against the node at load: one that cannot run
/// it is an error naming the node.
#[test]
fn a_recorded_kernel_that_does_not_fit_is_an_error() {
    let d = tempdir("aim-kernel");
    let onnx = conv_model(&d, "2");
    let file = d.join("net.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    let (mut model, header) = (f.model.clone(), f.header.clone());
    let conv = model.graph.nodes.iter_mut().find(|n| n.attrs.contains_key("kernel")).expect("a selected kernel");
    assert_eq!(conv.attrs.get("kernel"), Some(&aim_ir::Attr::String("direct".into())));
    conv.attrs.insert("kernel".into(), aim_ir::Attr::String("winograd".into()));
    let edited = d.join("edited.aim");
    aim_ir::aim_file::write(&edited, &model, &header).unwrap();
    let e = aim::Model::load(&edited).err().expect("refused").to_string();
    assert!(e.contains("conv") && e.contains("kernel 'winograd' cannot run this convolution"), "{e}");
}

/// The same for an unblocked convolution (1-D: NCHW kernels): the compiler records
/// `gemm_by_position` for one of six output positions and 40 channels; `gemm`, which can run it too, loads
/// and gives the same numbers; `depthwise` written over it is refused at load.
#[test]
fn a_recorded_nchw_kernel_that_does_not_fit_is_an_error() {
    let d = tempdir("aim-kernel-nchw");
    let w: Vec<String> = (0..40 * 2 * 3).map(|i| format!("{:.2}", (i % 5) as f32 / 5.0 - 0.4)).collect();
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[1,2,8]\n  init %w = f32[40,2,3] [{}]\n  %y = Conv(%x, %w)  # conv\n  output %y: f32[1,40,6]\n}}\n",
        w.join(", ")
    );
    let onnx = d.join("conv1d.onnx");
    std::fs::write(&onnx, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    let file = d.join("conv1d.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    let (mut model, header) = (f.model.clone(), f.header.clone());
    let conv = model.graph.nodes.iter_mut().find(|n| n.op == "Conv" && n.domain == "aim").expect("an aim:Conv");
    assert_eq!(conv.attrs.get("kernel"), Some(&aim_ir::Attr::String("gemm_by_position".into())));
    let x = Tensor::from_slice(&[1, 2, 8], &(0..16).map(|i| i as f32 / 8.0 - 1.0).collect::<Vec<f32>>());
    let want = aim::Model::load(&file).unwrap().run(vec![("x".into(), x.clone())]).unwrap();
    conv.attrs.insert("kernel".into(), aim_ir::Attr::String("gemm".into()));
    let other = d.join("other.aim");
    aim_ir::aim_file::write(&other, &model, &header).unwrap();
    let got = aim::Model::load(&other).unwrap().run(vec![("x".into(), x)]).unwrap();
    let (a, b) = (got[0].1.data::<f32>(), want[0].1.data::<f32>());
    assert!(a.iter().zip(b).all(|(a, b)| (a - b).abs() <= 1e-5), "{a:?} vs {b:?}");
    let conv = model.graph.nodes.iter_mut().find(|n| n.op == "Conv" && n.domain == "aim").expect("an aim:Conv");
    conv.attrs.insert("kernel".into(), aim_ir::Attr::String("depthwise".into()));
    let edited = d.join("edited.aim");
    aim_ir::aim_file::write(&edited, &model, &header).unwrap();
    let e = aim::Model::load(&edited).err().expect("refused").to_string();
    assert!(e.contains("conv") && e.contains("kernel 'depthwise' cannot run this convolution"), "{e}");
}

/// The cache sizes a `.aim` file records may only change speed, never results: a dense layer
/// deeper than every depth blocking (600, packed ahead of time with the blocking the
/// recorded L1 gave) and a convolution, with the header's L1 and L2 edited from tiny to huge,
/// give the ONNX model's numbers (within f32 rounding of a different summation order).
/// Before the blocking was recorded beside the packed weights, an L1 of 8 KiB read them
/// with the wrong depth: errors of about 2.
#[test]
fn recorded_cache_sizes_change_speed_not_results() {
    let d = tempdir("aim-caches");
    let (k, n) = (600, 24);
    let w: Vec<String> = (0..k * n).map(|i| format!("{:.3}", ((i * 37) % 23) as f32 / 23.0 - 0.5)).collect();
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[2,{k}]\n  init %w = f32[{k},{n}] [{}]\n  %m = MatMul(%x, %w)  # dense\n  %r = Reshape(%m, %s)  # as_image\n  init %s = i64[4] [2, 6, 2, 2]\n  init %cw = f32[4,6,1,1] [{}]\n  %y = Conv(%r, %cw)  # conv\n  output %y: f32[2,4,2,2]\n}}\n",
        w.join(", "),
        (0..24).map(|i| format!("{:.2}", (i % 5) as f32 / 5.0 - 0.4)).collect::<Vec<_>>().join(", ")
    );
    let onnx = d.join("deep.onnx");
    std::fs::write(&onnx, aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap())).unwrap();
    let x: Vec<f32> = (0..2 * k).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
    let inputs = vec![("x".to_string(), Tensor::from_slice(&[2, k], &x))];
    let want = aim::Model::load_with(&onnx, aim::Backend::Reference).unwrap().run(inputs.clone()).unwrap();
    let file = d.join("deep.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    let dense = f.model.graph.nodes.iter().find(|n| n.attrs.contains_key("prepacked")).expect("prepacked weights");
    assert!(dense.attrs.contains_key("packed_kc"), "{:?}", dense.attrs);
    for (l1, l2) in [(1u64 << 10, 1u64 << 12), (8 << 10, 256 << 10), (48 << 10, 2 << 20), (1 << 30, 1 << 34)] {
        let mut header = f.header.clone();
        header.target.insert("l1d".into(), l1.to_string());
        header.target.insert("l2".into(), l2.to_string());
        let edited = d.join(format!("l1_{l1}.aim"));
        aim_ir::aim_file::write(&edited, &f.model, &header).unwrap();
        let got = aim::Model::load(&edited).unwrap().run(inputs.clone()).unwrap();
        let (g, w) = (got[0].1.data::<f32>(), want[0].1.data::<f32>());
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 1e-4 * scale, "L1 {l1}, L2 {l2}: max error {err} (outputs up to {scale})");
    }
}

/// A fused activation the kernels do not know, written into a file, is an error naming the
/// node at load (it was once run as no activation).
#[test]
fn an_unknown_fused_activation_is_an_error() {
    let d = tempdir("aim-activation");
    let onnx = conv_model(&d, "2");
    let file = d.join("net.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    let (mut model, header) = (f.model.clone(), f.header.clone());
    let conv = model.graph.nodes.iter_mut().find(|n| n.attrs.contains_key("activation")).expect("a fused activation");
    conv.attrs.insert("activation".into(), aim_ir::Attr::String("bogus".into()));
    let edited = d.join("edited.aim");
    aim_ir::aim_file::write(&edited, &model, &header).unwrap();
    let e = aim::Model::load(&edited).err().expect("refused").to_string();
    assert!(e.contains("conv") && e.contains("unknown fused activation activation=\"bogus\""), "{e}");
}

/// An optimized program whose `aim` nodes do not fit the op table — an operand missing,
/// an attribute of the wrong type or one no pass writes, a word the kernels do not know, an
/// op that does not exist — is refused at load and by `aim info --verify`, naming the node
/// and what is wrong (a loader that trusted them read the wrong operands or ignored the
/// attribute).
#[test]
fn aim_nodes_that_do_not_fit_the_op_table_are_refused() {
    let d = tempdir("aim-schema");
    let onnx = conv_model(&d, "2");
    let file = d.join("net.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    type Edit = fn(&mut aim_ir::Node);
    let edits: [(&str, Edit, &str); 6] = [
        ("no weights", |n| n.inputs.truncate(1), "input 1 ('W') is required"),
        ("float strides", |n| drop(n.attrs.insert("strides".into(), aim_ir::Attr::Floats(vec![1.0, 1.0]))), "INTS"),
        (
            "a misspelt attribute",
            |n| drop(n.attrs.insert("stride".into(), aim_ir::Attr::Ints(vec![1, 1]))),
            "attribute 'stride' is not one aim:Conv takes",
        ),
        ("another op", |n| n.op = "Conv9".into(), "'Conv9' is not an op of the aim domain"),
        (
            "an unknown layout",
            |n| drop(n.attrs.insert("layout".into(), aim_ir::Attr::String("NHWC".into()))),
            "attribute 'layout' is 'NHWC'",
        ),
        ("too many operands", |n| n.inputs.extend(["x".to_string(), "x".to_string()]), "takes at most 4 inputs"),
    ];
    for (what, edit, want) in edits {
        let mut model = f.model.clone();
        let conv = model.graph.nodes.iter_mut().find(|n| n.domain == "aim" && n.op == "Conv").expect("an aim:Conv");
        let name = conv.name.clone();
        edit(conv);
        let edited = d.join("edited.aim");
        aim_ir::aim_file::write(&edited, &model, &f.header).unwrap();
        let e = aim::Model::load(&edited).err().unwrap_or_else(|| panic!("{what}: loaded")).to_string();
        assert!(e.contains(&name) && e.contains(want), "{what}: {e}");
        let o = aim(&["info", edited.to_str().unwrap(), "--verify"]);
        let said = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && said.contains(want), "{what}: aim info --verify said {said}");
    }
}

/// The target fields of a `.aim` header edited to nonsense — caches of 0 bytes or of 2^62,
/// a size that is not a number, an optimisation level that does not exist — are refused
/// naming the field, or change only speed: never a panic or other numbers.
#[test]
fn edited_target_fields_are_refused_or_change_only_speed() {
    let d = tempdir("aim-header-fields");
    let onnx = conv_model(&d, "2");
    let file = d.join("net.aim");
    ok(&aim(&["compile", onnx.to_str().unwrap(), "-o", file.to_str().unwrap()]));
    let f = aim_ir::aim_file::read(&file).unwrap();
    let inputs = vec![("x".to_string(), input(2))];
    let want = aim::Model::load(&file).unwrap().run(inputs.clone()).unwrap();
    let huge = (1u64 << 62).to_string();
    let edits: [(&str, &str); 9] = [
        ("l1d", "0"),
        ("l2", "0"),
        ("l3", "0"),
        ("l1d", &huge),
        ("l2", &huge),
        ("l1d", "48K"),
        ("l2", "-1"),
        ("opt_level", "9"),
        ("level", "x86-64-v9"),
    ];
    for (field, value) in edits {
        let mut header = f.header.clone();
        header.target.insert(field.into(), value.into());
        let edited = d.join("edited.aim");
        aim_ir::aim_file::write(&edited, &f.model, &header).unwrap();
        match aim::Model::load(&edited).and_then(|m| m.run(inputs.clone())) {
            Ok(got) => assert_eq!(got, want, "{field}={value}: other numbers"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(field) && !e.contains("internal error"), "{field}={value}: {e}");
            }
        }
    }
}
