//! The malformed-input suite: files, structure, attributes, sizes, initializers, external
//! data, control flow, `.npz` inputs and command lines that aim must refuse — each with
//! one clear error line on stderr and exit code 1 (never a panic, an abort or a hang), on
//! both backends, and in `aim info` and `aim explore` when the model itself is at fault.
//! Inputs that are fine to load but fail when run must still load in info and explore.
//! Prints the count of cases and checks.

#[path = "../../tests/common/mod.rs"]
mod common;

use aim::npz::write_npz;
use aim::Tensor;
use aim_onnx::proto::{tensor_proto::DataLocation, AttributeProto, StringStringEntryProto, TensorProto};
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn aim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aim")).args(args).output().expect("running aim")
}

/// When a case must fail.
#[derive(Clone, Copy, PartialEq)]
enum When {
    /// Loading (the model itself is at fault): run on both backends, info and explore fail.
    Load,
    /// Running (the model loads; its inputs or its data at run time are at fault): run on
    /// both backends fails, info and explore succeed.
    Run,
    /// The command line: only the command given fails.
    Cli,
    /// Ops aim does not support: run and explore fail, `aim info` lists them.
    Unsupported,
}

/// One case: a model file (and inputs), when it must fail and what the error must say.
struct Case {
    class: &'static str,
    name: &'static str,
    model: PathBuf,
    inputs: Option<PathBuf>,
    extra: Vec<String>,
    when: When,
    wanted: &'static str,
}

/// Checks one run of aim: exit 1 and one clean line naming what `wanted` says.
fn clean_error(tag: &str, o: &Output, wanted: &str) -> Result<(), String> {
    let e = String::from_utf8_lossy(&o.stderr);
    let fail = |why: &str| Err(format!("{tag}: {why}; exit {:?}, stderr: {e}", o.status.code()));
    if o.status.code() != Some(1) {
        return fail("exit code is not 1");
    }
    if e.trim_end().lines().count() != 1 {
        return fail("not one line");
    }
    if e.contains("panicked") || e.contains("internal error") || e.contains("RUST_BACKTRACE") {
        return fail("a panic");
    }
    if !e.contains(wanted) {
        return fail(&format!("expected {wanted:?}"));
    }
    Ok(())
}

fn clean_success(tag: &str, o: &Output) -> Result<(), String> {
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{tag}: expected success, got exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr)))
    }
}

/// Runs every check of `c`, returning how many ran and the failures.
fn check(c: &Case) -> (usize, Vec<String>) {
    let m = c.model.to_str().unwrap();
    let mut runs: Vec<(String, Vec<String>)> = Vec::new();
    for backend in ["reference", "cpu"] {
        let mut args = vec!["run".to_string(), m.to_string(), "--backend".into(), backend.into()];
        if let Some(i) = &c.inputs {
            args.extend(["--inputs".to_string(), i.to_str().unwrap().to_string()]);
        }
        args.extend(c.extra.iter().cloned());
        runs.push((format!("run --backend {backend}"), args));
    }
    let mut failures = Vec::new();
    let mut count = 0;
    for (what, args) in &runs {
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        count += 1;
        if let Err(e) = clean_error(&format!("{}/{} [{what}]", c.class, c.name), &aim(&refs), c.wanted) {
            failures.push(e);
        }
    }
    if c.when == When::Cli {
        return (count, failures);
    }
    for cmd in [vec!["info", m], vec!["explore", m, "--stage", "optimized"]] {
        count += 1;
        let tag = format!("{}/{} [{}]", c.class, c.name, cmd[0]);
        let o = aim(&cmd);
        let r = match c.when {
            When::Load => clean_error(&tag, &o, c.wanted),
            When::Unsupported if cmd[0] == "explore" => clean_error(&tag, &o, c.wanted),
            When::Unsupported => clean_success(&tag, &o).and_then(|()| {
                let text = String::from_utf8_lossy(&o.stdout);
                if text.contains("unsupported ops:\n  NoSuchOp: n") {
                    Ok(())
                } else {
                    Err(format!("{tag}: the unsupported op is not listed: {text}"))
                }
            }),
            _ => clean_success(&tag, &o),
        };
        if let Err(e) = r {
            failures.push(e);
        }
    }
    (count, failures)
}

/// Builds the cases in `dir`.
struct Cases {
    dir: PathBuf,
    list: Vec<Case>,
}

impl Cases {
    fn path(&self, class: &str, name: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{class}-{name}.{ext}"))
    }

    /// A case whose model file holds `bytes`.
    fn bytes(&mut self, class: &'static str, name: &'static str, bytes: &[u8], when: When, wanted: &'static str) {
        let model = self.path(class, name, "onnx");
        std::fs::write(&model, bytes).unwrap();
        self.list.push(Case { class, name, model, inputs: None, extra: vec![], when, wanted });
    }

    /// A case whose model is written in the IR text format (saved as ONNX).
    fn text(&mut self, class: &'static str, name: &'static str, text: &str, when: When, wanted: &'static str) {
        let m = aim_ir::text::parse_model(text).unwrap_or_else(|e| panic!("{class}/{name}: {e}"));
        self.bytes(class, name, &aim_onnx::export_bytes(&m), when, wanted);
    }

    /// A case running `model_text` on the arrays `inputs` (written as an .npz).
    fn with_inputs(
        &mut self,
        class: &'static str,
        name: &'static str,
        model_text: &str,
        inputs: Option<&[u8]>,
        wanted: &'static str,
    ) {
        self.text(class, name, model_text, When::Run, wanted);
        let p = self.path(class, name, "npz");
        if let Some(bytes) = inputs {
            std::fs::write(&p, bytes).unwrap();
        }
        let c = self.list.last_mut().unwrap();
        c.inputs = Some(p);
    }

    /// A case about the command line: `extra` arguments on a model that is fine.
    fn cli(&mut self, name: &'static str, model: &Path, extra: &[&str], wanted: &'static str) {
        self.list.push(Case {
            class: "cli",
            name,
            model: model.to_path_buf(),
            inputs: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            when: When::Cli,
            wanted,
        });
    }
}

/// A one-node model over an f32 input `x` of `shape`, with `inits` lines before the node.
fn one(inits: &str, node: &str, shape: &str) -> String {
    format!("opset 21\ngraph \"g\" {{\n  input %x: f32[{shape}]\n{inits}  %y = {node}  # n\n  output %y: ?[*]\n}}\n")
}

/// An `.npz` holding `arrays`, as bytes.
fn npz_bytes(dir: &Path, arrays: &[(&str, Tensor)]) -> Vec<u8> {
    let p = dir.join("tmp.npz");
    write_npz(&p, &arrays.iter().map(|(n, t)| (n.to_string(), t.clone())).collect::<Vec<_>>()).unwrap();
    std::fs::read(&p).unwrap()
}

/// An `.npz` whose one entry `x.npy` holds `npy`.
fn raw_npz(dir: &Path, npy: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let p = dir.join("raw.npz");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&p).unwrap());
    z.start_file("x.npy", zip::write::SimpleFileOptions::default()).unwrap();
    z.write_all(npy).unwrap();
    z.finish().unwrap();
    std::fs::read(&p).unwrap()
}

/// A `.npy` file with header `dict` and `data`.
fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut h = dict.to_string();
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((h.len() as u16).to_le_bytes());
    out.extend(h.as_bytes());
    out.extend(data);
    out
}

/// A MatMul model whose weight `W` is the given initializer proto.
fn with_weight(w: TensorProto) -> Vec<u8> {
    model(
        vec![node("MatMul", "mm", &["x", "W"], &["y"], vec![])],
        vec![value("x", 1, &[Ok(1), Ok(2)])],
        vec![value("y", 1, &[Ok(1), Ok(2)])],
        vec![w],
        17,
    )
}

fn external(location: &str, offset: &str, length: &str) -> TensorProto {
    let kv = |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
    TensorProto {
        name: Some("W".into()),
        dims: vec![2, 2],
        data_type: Some(1),
        data_location: Some(DataLocation::External as i32),
        external_data: vec![kv("location", location), kv("offset", offset), kv("length", length)],
        ..Default::default()
    }
}

fn build(dir: &Path) -> Vec<Case> {
    let mut c = Cases { dir: dir.to_path_buf(), list: Vec::new() };
    let good = "opset 17\ngraph \"g\" {\n  input %x: f32[2,2]\n  %y = Relu(%x)  # r\n  output %y: f32[2,2]\n}\n";

    // Files.
    c.bytes("file", "empty", b"", When::Load, "");
    c.bytes("file", "text", b"this is not a model\nat all\n", When::Load, "");
    c.bytes(
        "file",
        "random-bytes",
        &(0..4096u32).map(|i| (i.wrapping_mul(2654435761u32) >> 13) as u8).collect::<Vec<_>>(),
        When::Load,
        "",
    );
    let whole = aim_onnx::export_bytes(&aim_ir::text::parse_model(good).unwrap());
    c.bytes("file", "truncated", &whole[..whole.len() / 2], When::Load, "");
    c.bytes(
        "file",
        "no-graph",
        &prost::Message::encode_to_vec(&aim_onnx::proto::ModelProto::default()),
        When::Load,
        "no graph",
    );
    c.text("file", "opset-too-new", &good.replace("opset 17", "opset 99"), When::Load, "opset 99 is not supported");
    c.text("file", "unsupported-op", &one("", "NoSuchOp(%x)", "2"), When::Unsupported, "unsupported ops: NoSuchOp");
    let missing = dir.join("does-not-exist.onnx");
    c.list.push(Case {
        class: "file",
        name: "missing",
        model: missing,
        inputs: None,
        extra: vec![],
        when: When::Cli,
        wanted: "does-not-exist.onnx",
    });
    c.list.push(Case {
        class: "file",
        name: "directory",
        model: dir.to_path_buf(),
        inputs: None,
        extra: vec![],
        when: When::Cli,
        wanted: "",
    });

    // Structure.
    c.text(
        "structure",
        "dangling",
        &one("", "Relu(%nothing)", "2"),
        When::Load,
        "which no input, initializer or node defines",
    );
    c.text(
        "structure",
        "cycle",
        "opset 17\ngraph \"g\" {\n  input %x: f32[2]\n  %a = Add(%x, %b)  # a\n  %b = Relu(%a)  # b\n  output %b: f32[2]\n}\n",
        When::Load,
        "before the node that defines it",
    );
    c.text(
        "structure",
        "defined-twice",
        "opset 17\ngraph \"g\" {\n  input %x: f32[2]\n  %a = Relu(%x)  # a\n  %a = Neg(%x)  # b\n  output %a: f32[2]\n}\n",
        When::Load,
        "defined twice",
    );
    c.text(
        "structure",
        "undefined-output",
        "opset 17\ngraph \"g\" {\n  input %x: f32[2]\n  %a = Relu(%x)  # a\n  output %zz: f32[2]\n}\n",
        When::Load,
        "graph output 'zz' is not defined",
    );
    c.text(
        "structure",
        "untyped-input",
        "opset 17\ngraph \"g\" {\n  input %x: ?[*]\n  %y = Relu(%x)  # r\n  output %y: ?[*]\n}\n",
        When::Load,
        "has no type",
    );

    // Arity and attribute types and values.
    for (name, node, wanted) in [
        ("conv-no-inputs", "Conv()", "is required"),
        ("batchnorm-no-inputs", "BatchNormalization()", "is required"),
        ("relu-two-inputs", "Relu(%x, %x)", "at most 1 input"),
        ("add-one-input", "Add(%x)", "is required"),
        ("transpose-string-perm", "Transpose(%x) {perm=\"1,0\"}", "must be a list of integers"),
        ("concat-no-axis", "Concat(%x, %x)", "'axis' is required"),
        ("softmax-float-axis", "Softmax(%x) {axis=1.0}", "must be an integer"),
        ("softmax-axis-out-of-range", "Softmax(%x) {axis=7}", "axis"),
        ("cast-unknown-type", "Cast(%x) {to=99}", ""),
        ("gather-axis-out-of-range", "Gather(%x, %x) {axis=5}", "axis"),
    ] {
        c.text("attributes", name, &one("", node, "2,2"), When::Load, wanted);
    }
    // An attribute with neither a type nor a value (ORT refuses it; it was dropped).
    let untyped = AttributeProto { name: Some("alpha".into()), ..Default::default() };
    let undefined = model(
        vec![node("LeakyRelu", "n", &["x"], &["y"], vec![untyped])],
        vec![value("x", 1, &[Ok(2)])],
        vec![value("y", 1, &[Ok(2)])],
        vec![],
        17,
    );
    c.bytes("attributes", "undefined-type", &undefined, When::Load, "its type is UNDEFINED and it holds no value");
    // More outputs than elements to split (ORT refuses; the last ones were empty).
    let split = model(
        vec![node("Split", "n", &["x"], &["a", "b", "c"], vec![int_attr("num_outputs", 3)])],
        vec![value("x", 1, &[Ok(2)])],
        ["a", "b", "c"].iter().map(|o| value(o, 1, &[Ok(1)])).collect(),
        vec![],
        18,
    );
    c.bytes("attributes", "split-more-outputs-than-elements", &split, When::Load, "3 outputs of an axis of 2 elements");
    let w = format!("  init %w = f32[1,1,3,3] [{}]\n", ["1.0"; 9].join(", "));
    for (name, attrs, wanted) in [
        ("conv-float-strides", "strides=[1.0, 1.0]", "must be a list of integers"),
        ("conv-string-strides", "strides=\"1\"", "must be a list of integers"),
        ("conv-zero-stride", "strides=[0, 1]", "must be positive"),
        ("conv-negative-dilation", "dilations=[1, -2]", "must be positive"),
        ("conv-negative-pads", "pads=[-1, 0, 0, 0]", "non-negative"),
        ("conv-group-zero", "group=0", "at least 1"),
        ("conv-ints-group", "group=[1]", "must be an integer"),
        ("conv-bad-auto-pad", "auto_pad=\"SAME\"", "auto_pad"),
        ("conv-strides-rank", "strides=[1, 1, 1]", "spatial dims"),
        ("conv-kernel-mismatch", "kernel_shape=[2, 2]", "kernel"),
    ] {
        c.text("attributes", name, &one(&w, &format!("Conv(%x, %w) {{{attrs}}}"), "1,1,4,4"), When::Load, wanted);
    }

    // Types and shapes that cannot go together.
    c.text("types", "add-f32-i64", &one("  init %i = i64[2] [1, 2]\n", "Add(%x, %i)", "2"), When::Load, "element type");
    c.text(
        "types",
        "matmul-inner",
        &one("  init %w = f32[3,2] [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]\n", "MatMul(%x, %w)", "2,2"),
        When::Load,
        "inner",
    );
    c.text(
        "types",
        "broadcast",
        &one("  init %b = f32[3] [1.0, 2.0, 3.0]\n", "Add(%x, %b)", "2,2"),
        When::Load,
        "broadcast",
    );
    c.text("types", "conv-channels", &one(&w, "Conv(%x, %w)", "1,2,4,4"), When::Load, "channels");

    // 4-bit weights (ONNX Runtime's contrib ops) whose attributes do not fit their tensors:
    // an error naming the node, never a read past the packed bytes.
    let codes = |n: usize| vec!["17"; n].join(", ");
    let nbits = |b_shape: &str, b_len: usize, scales: usize, attrs: &str| {
        let inits = format!(
            "  init %b = u8[{b_shape}] [{}]\n  init %s = f32[{scales}] [{}]\n",
            codes(b_len),
            vec!["0.5"; scales].join(", ")
        );
        one(&inits, &format!("com.microsoft:MatMulNBits(%x, %b, %s) {{{attrs}}}"), "2,64")
    };
    for (name, text, wanted) in [
        ("nbits-k-past-b", nbits("4,2,16", 128, 8, "K=96, N=4, bits=4, block_size=32"), "B is u8 of 128 values"),
        ("nbits-n-past-b", nbits("4,2,16", 128, 8, "K=64, N=9, bits=4, block_size=32"), "B is u8 of 128 values"),
        ("nbits-bits", nbits("4,2,16", 128, 8, "K=64, N=4, bits=9, block_size=32"), "bits 2 to 8"),
        ("nbits-block", nbits("4,2,16", 128, 8, "K=64, N=4, bits=4, block_size=24"), "block_size"),
        ("nbits-scales", nbits("4,2,16", 128, 5, "K=64, N=4, bits=4, block_size=32"), "the scales are"),
    ] {
        c.text("contrib", name, &text, When::Load, wanted);
    }
    let gather = |scales: &str, n: usize, attrs: &str| {
        let inits = format!(
            "  init %t = u8[8,16] [{}]\n  init %s = f32[{scales}] [{}]\n  init %i = i64[2] [1, 7]\n",
            codes(128),
            vec!["0.5"; n].join(", ")
        );
        one(&inits, &format!("com.microsoft:GatherBlockQuantized(%t, %i, %s) {{{attrs}}}"), "2")
    };
    for (name, text, wanted) in [
        ("gather-q-scales", gather("8,3", 24, "block_size=16"), "the scales are"),
        ("gather-q-block", gather("8,2", 16, "block_size=8"), "block_size"),
        ("gather-q-axis", gather("8,2", 16, "block_size=16, gather_axis=2"), "outside"),
    ] {
        c.text("contrib", name, &text, When::Load, wanted);
    }

    // Sizes: impossible (overflowing) and huge ones fail when run, not at load.
    for (name, inits, node, wanted) in [
        (
            "constant-of-shape-overflow",
            "  init %s = i64[3] [4611686018427387904, 4, 4]\n",
            "ConstantOfShape(%s)",
            "overflow",
        ),
        ("tile-overflow", "  init %s = i64[2] [4611686018427387904, 16]\n", "Tile(%x, %s)", "overflow"),
        ("pad-overflow", "  init %s = i64[4] [9223372036854775807, 0, 0, 0]\n", "Pad(%x, %s)", "overflow"),
        ("constant-of-shape-huge", "  init %s = i64[2] [1000000, 1000000]\n", "ConstantOfShape(%s)", "over the limit"),
        ("tile-huge", "  init %s = i64[2] [1000000, 1000000]\n", "Tile(%x, %s)", "over the limit"),
        (
            "range-huge",
            "  init %a = i64[] [0]\n  init %b = i64[] [1000000000000]\n  init %d = i64[] [1]\n",
            "Range(%a, %b, %d)",
            "over the limit",
        ),
        (
            "range-tiny-step",
            "  init %a = f32[] [0.0]\n  init %b = f32[] [1.0]\n  init %d = f32[] [1e-30]\n",
            "Range(%a, %b, %d)",
            "more elements",
        ),
        (
            "onehot-huge",
            "  init %i = i64[2] [0, 1]\n  init %d = i64[] [1000000000000]\n  init %v = f32[2] [0.0, 1.0]\n",
            "OneHot(%i, %d, %v)",
            "over the limit",
        ),
    ] {
        c.text("sizes", name, &one(inits, node, "2,2"), When::Run, wanted);
    }
    let resize = "  init %shape4 = i64[4] [1, 1, 2, 2]\n  %x4 = Reshape(%x, %shape4)  # r\n";
    c.text(
        "sizes",
        "resize-huge",
        &one(&format!("{resize}  init %sc = f32[4] [1.0, 1.0, 1000000.0, 1000000.0]\n"), "Resize(%x4, _, %sc)", "2,2"),
        When::Run,
        "over the limit",
    );
    c.text(
        "sizes",
        "resize-inf",
        &one(&format!("{resize}  init %sc = f32[4] [1.0, 1.0, inf, 1.0]\n"), "Resize(%x4, _, %sc)", "2,2"),
        When::Load,
        "positive and finite",
    );
    c.text(
        "sizes",
        "resize-nan",
        &one(&format!("{resize}  init %sc = f32[4] [1.0, 1.0, NaN, 1.0]\n"), "Resize(%x4, _, %sc)", "2,2"),
        When::Load,
        "positive and finite",
    );
    c.text("sizes", "reshape-count", &one("  init %s = i64[2] [3, 3]\n", "Reshape(%x, %s)", "2,2"), When::Load, "");

    // Initializers.
    let raw = |dims: Vec<i64>, bytes: usize| TensorProto {
        name: Some("W".into()),
        dims,
        data_type: Some(1),
        raw_data: Some(vec![0u8; bytes].into()),
        ..Default::default()
    };
    c.bytes("initializers", "raw-too-short", &with_weight(raw(vec![2, 2], 12)), When::Load, "needs 16 bytes, got 12");
    c.bytes("initializers", "negative-dim", &with_weight(raw(vec![-2, 2], 16)), When::Load, "negative dimension");
    c.bytes("initializers", "overflowing-dims", &with_weight(raw(vec![1 << 62, 8], 16)), When::Load, "too large");
    let floats = TensorProto {
        name: Some("W".into()),
        dims: vec![2, 2],
        data_type: Some(1),
        float_data: vec![1.0; 3],
        ..Default::default()
    };
    c.bytes("initializers", "float-data-count", &with_weight(floats), When::Load, "needs 4 values");
    let strings = TensorProto { name: Some("W".into()), dims: vec![1], data_type: Some(8), ..Default::default() };
    c.bytes("initializers", "string-dtype", &with_weight(strings), When::Load, "");

    // External data.
    let weights: Vec<u8> = (0..32).collect();
    std::fs::write(dir.join("w.bin"), &weights).unwrap();
    c.bytes("external", "parent-dir", &with_weight(external("../w.bin", "0", "16")), When::Load, "may not leave");
    c.bytes("external", "absolute", &with_weight(external("/etc/passwd", "0", "16")), When::Load, "relative path");
    c.bytes("external", "missing-file", &with_weight(external("nothing.bin", "0", "16")), When::Load, "cannot open");
    c.bytes("external", "past-the-end", &with_weight(external("w.bin", "24", "16")), When::Load, "past the end");
    c.bytes("external", "bad-offset", &with_weight(external("w.bin", "x", "16")), When::Load, "not a number");
    c.bytes("external", "wrong-length", &with_weight(external("w.bin", "0", "12")), When::Load, "does not match");
    let outside = outside_dir();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.bin"), &weights).unwrap();
    let _ = std::fs::remove_file(dir.join("link.bin"));
    std::os::unix::fs::symlink(outside.join("secret.bin"), dir.join("link.bin")).unwrap();
    c.bytes(
        "external",
        "symlink-outside",
        &with_weight(external("link.bin", "0", "16")),
        When::Load,
        "outside the model's directory",
    );

    // Control flow.
    let if_model = |then_out: &str, else_out: &str| {
        format!("opset 17\ngraph \"g\" {{\n  input %c: bool[]\n  init %a = f32[1] [1.0]\n  init %b = i64[1] [2]\n  %y = If(%c) {{else_branch=graph \"e\" {{\n{else_out}  }}, then_branch=graph \"t\" {{\n{then_out}  }}}}  # if\n  output %y: ?[*]\n}}\n")
    };
    c.text(
        "control-flow",
        "if-output-counts",
        &if_model("    output %a: f32[1]\n    output %a: f32[1]\n", "    output %a: f32[1]\n"),
        When::Load,
        "outputs",
    );
    c.text(
        "control-flow",
        "if-output-dtypes",
        &if_model("    output %a: f32[1]\n", "    output %b: i64[1]\n"),
        When::Load,
        "but i64 in else_branch",
    );
    c.text(
        "control-flow",
        "if-no-branch",
        "opset 17\ngraph \"g\" {\n  input %c: bool[]\n  %y = If(%c)  # if\n  output %y: ?[*]\n}\n",
        When::Load,
        "_branch' is required",
    );
    let loop_body = |inputs: &str| {
        format!("opset 17\ngraph \"g\" {{\n  input %x: f32[1]\n  init %n = i64[] [3]\n  %y = Loop(%n, _, %x) {{body=graph \"b\" {{\n{inputs}    %w = Neg(%v)  # neg\n    output %c: bool[]\n    output %w: f32[1]\n  }}}}  # loop\n  output %y: ?[*]\n}}\n")
    };
    c.text(
        "control-flow",
        "loop-body-arity",
        &loop_body("    input %i: i64[]\n    input %v: f32[1]\n"),
        When::Load,
        "the body takes 2 inputs",
    );
    c.text("control-flow", "scan-no-count", "opset 17\ngraph \"g\" {\n  input %x: f32[3,1]\n  %y = Scan(%x) {body=graph \"b\" {\n    input %v: f32[1]\n    output %v: f32[1]\n  }}  # scan\n  output %y: ?[*]\n}\n", When::Load, "num_scan_inputs");
    c.text("control-flow", "if-cond-not-scalar", "opset 17\ngraph \"g\" {\n  input %x: f32[2]\n  init %c = bool[2] [true, false]\n  %y = If(%c) {else_branch=graph \"e\" {\n    output %x: f32[2]\n  }, then_branch=graph \"t\" {\n    output %x: f32[2]\n  }}  # if\n  output %y: ?[*]\n}\n", When::Run, "one element");
    let endless = "opset 17\ngraph \"g\" {\n  input %x: f32[4]\n  init %cond = bool[] [true]\n  %out = Loop(_, %cond, %x) {body=graph \"b\" {\n    input %i: i64[]\n    input %c: bool[]\n    input %v: f32[4]\n    %keep = Identity(%c)  # keep\n    %w = Neg(%v)  # neg\n    output %keep: bool[]\n    output %w: f32[4]\n  }}  # loop\n  output %out: f32[4]\n}\n";
    c.text("control-flow", "endless-loop", endless, When::Run, "time limit");
    c.list.last_mut().unwrap().extra = vec!["--timeout".into(), "0.5".into()];

    // .npz inputs.
    let x22 = Tensor::from_slice(&[2, 2], &[1.0f32; 4]);
    let bytes = npz_bytes(dir, &[("x", Tensor::from_slice(&[2, 2], &[1i64; 4]))]);
    c.with_inputs("npz", "wrong-dtype", good, Some(&bytes), "expected element type f32");
    let bytes = npz_bytes(dir, &[("x", Tensor::from_slice(&[3, 2], &[1.0f32; 6]))]);
    c.with_inputs("npz", "wrong-shape", good, Some(&bytes), "dimension 0 must be 2");
    let bytes = npz_bytes(dir, &[("other", x22.clone())]);
    c.with_inputs("npz", "unknown-name", good, Some(&bytes), "no input named 'other'");
    let bytes = npz_bytes(dir, &[]);
    c.with_inputs("npz", "missing-input", good, Some(&bytes), "input 'x' is missing");
    c.with_inputs("npz", "not-a-zip", good, Some(b"PK? not really"), "not an .npz");
    c.with_inputs("npz", "no-file", good, None, "cannot open");
    c.with_inputs("npz", "bad-magic", good, Some(&raw_npz(dir, b"NOTNUMPY")), "bad magic");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
    c.with_inputs("npz", "truncated-array", good, Some(&raw_npz(dir, &npy(header, &[0; 7]))), "truncated");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387905, 4), }";
    c.with_inputs("npz", "overflowing-shape", good, Some(&raw_npz(dir, &npy(header, &[0; 64]))), "impossible shape");
    let header = "{'descr': '<c8', 'fortran_order': False, 'shape': (2, 2), }";
    c.with_inputs("npz", "complex-dtype", good, Some(&raw_npz(dir, &npy(header, &[0; 32]))), "not supported");
    let header = "{'descr': '<f4', 'fortran_order': maybe, 'shape': (2, 2), }";
    c.with_inputs("npz", "bad-fortran-order", good, Some(&raw_npz(dir, &npy(header, &[0; 16]))), "fortran_order");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }";
    c.with_inputs("npz", "bad-shape-text", good, Some(&raw_npz(dir, &npy(header, &[0; 16]))), "bad shape");

    // The command line.
    let ok = c.path("cli", "good", "onnx");
    std::fs::write(&ok, aim_onnx::export_bytes(&aim_ir::text::parse_model(good).unwrap())).unwrap();
    c.cli("unknown-cpu", &ok, &["--cpu", "pentium"], "pentium");
    c.cli("too-many-threads", &ok, &["--threads", "100000"], "more than 1024");
    c.cli("negative-timeout", &ok, &["--timeout", "-1"], "positive number of seconds");
    c.cli("bad-tensor-limit", &ok, &["--max-tensor-bytes", "lots"], "expected a size");
    c.list
}

#[test]
fn malformed_inputs_are_clean_errors() {
    let dir = tempdir("malformed");
    let cases = build(&dir);
    let mut checks = 0;
    let mut failures = Vec::new();
    for c in &cases {
        let (n, f) = check(c);
        checks += n;
        failures.extend(f);
    }
    let mut classes: Vec<&str> = cases.iter().map(|c| c.class).collect();
    classes.dedup();
    println!(
        "malformed-input suite: {} cases in {} classes ({}), {checks} checks, {} failed",
        cases.len(),
        classes.len(),
        classes.join(", "),
        failures.len()
    );
    let _ = std::fs::remove_dir_all(outside_dir());
    assert!(failures.is_empty(), "{} of {checks} checks failed:\n{}", failures.len(), failures.join("\n"));
}

/// Where the symlink case's target lives: outside the models' directory, removed with it.
fn outside_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("aim-malformed-outside-{}", std::process::id()))
}
