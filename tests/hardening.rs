//! Regression tests for defects found by trying aim as a new user would (malformed and
//! edge-case models and inputs): each test failed before its fix.

use aim::{Backend, Model, Options, Tensor};
use std::path::Path;

/// Loads a model written in the IR text format on `backend`.
fn load(text: &str, backend: Backend) -> Result<Model, aim::Error> {
    let ir = aim_ir::text::parse_model(text).expect("test model parses");
    Model::from_ir_with(ir, Path::new("test.aimir"), &Options { backend, threads: Some(2), ..Options::default() })
}

/// Runs `text` on both backends with `inputs` and returns both results.
fn both(text: &str, inputs: &[(&str, Tensor)]) -> Vec<Result<Vec<(String, Tensor)>, String>> {
    [Backend::Reference, Backend::Cpu]
        .iter()
        .map(|&b| {
            let m = load(text, b).map_err(|e| e.to_string())?;
            m.run(inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect()).map_err(|e| e.to_string())
        })
        .collect()
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.data::<f32>().to_vec()
}

/// Values a subgraph reads live until the node holding the subgraph: the memory plan must
/// not give `keep` (read only inside the If's then-branch) the bytes of `t0`.
#[test]
fn values_read_inside_subgraphs_stay_alive() {
    let text = r#"opset 17
graph "g" {
  input %x: f32[1,1024]
  input %c: bool[]
  init %two = f32[] [2.0]
  init %three = f32[] [3.0]
  %keep = Mul(%x, %two)  # keep
  %t0 = Sigmoid(%x)  # sig
  %y = If(%c) {else_branch=graph "else" {
    %e = Identity(%t0)  # eid
    output %e: f32[1,1024]
  }, then_branch=graph "then" {
    %inner = If(%c) {else_branch=graph "e2" {
      %e2 = Identity(%t0)  # eid2
      output %e2: f32[1,1024]
    }, then_branch=graph "t2" {
      %r = Add(%keep, %three)  # add
      output %r: f32[1,1024]
    }}  # inner_if
    output %inner: f32[1,1024]
  }}  # if
  %z = Neg(%t0)  # neg
  output %y: f32[1,1024]
  output %z: f32[1,1024]
}
"#;
    let x: Vec<f32> = (0..1024).map(|i| i as f32 / 512.0 - 1.0).collect();
    let inputs = [("x", Tensor::from_slice(&[1, 1024], &x)), ("c", Tensor::from_bools(&[], &[true]))];
    for r in both(text, &inputs) {
        let outs = r.unwrap();
        let y = floats(&outs[0].1);
        let z = floats(&outs[1].1);
        for i in 0..1024 {
            assert_eq!(y[i], x[i] * 2.0 + 3.0, "y[{i}]");
            assert!((z[i] + 1.0 / (1.0 + (-x[i]).exp())).abs() < 1e-6, "z[{i}]");
        }
    }
}

/// Loads and runs `text` on `backend`, returning the error text (load or run).
fn error_of(text: &str, backend: Backend, inputs: &[(&str, Tensor)]) -> Option<String> {
    let m = match load(text, backend) {
        Ok(m) => m,
        Err(e) => return Some(e.to_string()),
    };
    m.run(inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect()).err().map(|e| e.to_string())
}

/// On both backends: an error (at load or run) containing one of `wanted`, and not an
/// internal error (a caught panic).
fn assert_error(tag: &str, text: &str, inputs: &[(&str, Tensor)], wanted: &[&str]) {
    for b in [Backend::Reference, Backend::Cpu] {
        let e = error_of(text, b, inputs).unwrap_or_else(|| panic!("{tag} [{b:?}]: accepted"));
        assert!(!e.contains("internal error"), "{tag} [{b:?}]: a panic: {e}");
        assert!(wanted.iter().any(|w| e.contains(w)), "{tag} [{b:?}]: expected one of {wanted:?} in: {e}");
    }
}

/// A one-node model `%y = <node>` over initializers and an f32 input `x` of `xshape`.
fn one_node(inits: &str, node: &str, xshape: &str) -> String {
    format!("opset 21\ngraph \"g\" {{\n  input %x: f32[{xshape}]\n{inits}  %y = {node}  # n\n  output %y: ?[*]\n}}\n")
}

#[test]
fn impossible_sizes_are_errors_not_wrapped_counts() {
    let x = [("x", Tensor::from_slice(&[2, 2], &[1.0f32; 4]))];
    let cases = [
        ("constant-of-shape", "  init %s = i64[3] [4611686018427387904, 4, 4]\n", "ConstantOfShape(%s)"),
        (
            "expand",
            "  init %s = i64[3] [4611686018427387904, 4, 4]\n  init %one = f32[1,1] [1.0]\n",
            "Expand(%one, %s)",
        ),
        ("tile", "  init %s = i64[2] [4611686018427387904, 16]\n", "Tile(%x, %s)"),
        ("pad", "  init %s = i64[4] [9223372036854775807, 0, 0, 0]\n", "Pad(%x, %s)"),
    ];
    for (tag, inits, node) in cases {
        assert_error(tag, &one_node(inits, node, "2,2"), &x, &["overflow", "more elements than can be addressed"]);
    }
}

#[test]
fn huge_sizes_are_refused_by_the_tensor_limit() {
    let x = [("x", Tensor::from_slice(&[2, 2], &[1.0f32; 4]))];
    let big = "  init %s = i64[2] [1000000, 1000000]\n";
    let cases = [
        ("constant-of-shape", big.to_string(), "ConstantOfShape(%s)"),
        ("expand", format!("{big}  init %one = f32[1,1] [1.0]\n"), "Expand(%one, %s)"),
        ("tile", "  init %s = i64[2] [1000000, 1000000]\n".to_string(), "Tile(%x, %s)"),
        (
            "range",
            "  init %a = i64[] [0]\n  init %b = i64[] [1000000000000]\n  init %c = i64[] [1]\n".to_string(),
            "Range(%a, %b, %c)",
        ),
        ("pad", "  init %s = i64[4] [1000000, 1000000, 1000000, 1000000]\n".to_string(), "Pad(%x, %s)"),
        (
            "onehot",
            "  init %i = i64[2] [0, 1]\n  init %d = i64[] [1000000000000]\n  init %v = f32[2] [0.0, 1.0]\n".to_string(),
            "OneHot(%i, %d, %v)",
        ),
        ("resize", "  init %sc = f32[4] [1.0, 1.0, 1000000.0, 1000000.0]\n".to_string(), "Resize(%x4, _, %sc)"),
        ("resize-inf", "  init %sc = f32[4] [1.0, 1.0, inf, 1.0]\n".to_string(), "Resize(%x4, _, %sc)"),
        ("resize-nan", "  init %sc = f32[4] [1.0, 1.0, NaN, 1.0]\n".to_string(), "Resize(%x4, _, %sc)"),
    ];
    for (tag, inits, node) in cases {
        let inits = format!("{inits}  init %shape4 = i64[4] [1, 1, 2, 2]\n  %x4 = Reshape(%x, %shape4)  # r\n");
        // Constant folding leaves such nodes alone: loading works (info and explore too),
        // and the run is what fails.
        let text = one_node(&inits, node, "2,2");
        // (Non-finite scales are refused by type inference already, at load.)
        for b in [Backend::Reference, Backend::Cpu] {
            if !tag.starts_with("resize-") || tag == "resize" {
                assert!(load(&text, b).is_ok(), "{tag} [{b:?}]: {:?}", load(&text, b).err());
            }
        }
        assert_error(
            tag,
            &one_node(&inits, node, "2,2"),
            &x,
            &["over the limit", "overflow", "positive and finite", "more elements"],
        );
    }
}

#[test]
fn malformed_einsum_and_tiny_range_steps_are_errors_not_panics() {
    let x = [("x", Tensor::from_slice(&[2, 2], &[1.0f32; 4]))];
    for eq in ["ij,jk->ikz", "ij,jk->i->k", "ij,jk", "i j,jk->ik", "ij,,jk->ik", "...ij,jk->ik..."] {
        let text = one_node("", &format!("Einsum(%x, %x) {{equation=\"{eq}\"}}"), "2,2");
        match error_of(&text, Backend::Reference, &x) {
            None => {} // a valid reading of the equation (numpy accepts some of these)
            Some(e) => assert!(!e.contains("internal error"), "{eq}: {e}"),
        }
        if let Some(e) = error_of(&text, Backend::Cpu, &x) {
            assert!(!e.contains("internal error"), "{eq}: {e}");
        }
    }
    for eq in ["ij,jk->ikz", "ij,jk->i->k"] {
        let text = one_node("", &format!("Einsum(%x, %x) {{equation=\"{eq}\"}}"), "2,2");
        assert_error(eq, &text, &x, &["equation"]);
    }
    let range = "  init %a = f32[] [0.0]\n  init %b = f32[] [1.0]\n  init %c = f32[] [1e-30]\n";
    assert_error("range", &one_node(range, "Range(%a, %b, %c)", "2,2"), &x, &["more elements", "over the limit"]);
}

#[test]
fn convolutions_on_empty_batches_and_with_bad_lists_are_handled() {
    let w = "  init %w = f32[2,1,3,3] <18 values>\n";
    let w = w.replace("<18 values>", &format!("[{}]", vec!["0.5"; 18].join(", ")));
    // A zero-size batch gives a zero-size output on both backends.
    let text = one_node(&w, "Conv(%x, %w) {pads=[1, 1, 1, 1]}", "0,1,4,4");
    for r in both(&text, &[("x", Tensor::from_slice::<f32>(&[0, 1, 4, 4], &[]))]) {
        assert_eq!(r.unwrap()[0].1.shape(), &[0, 2, 4, 4]);
    }
    let x = [("x", Tensor::from_slice(&[1, 1, 4, 4], &[1.0f32; 16]))];
    for (attrs, wanted) in [
        ("strides=ints[]", "empty list"),
        ("strides=[1.0, 1.0]", "must be a list of integers"),
        ("strides=[0, 1]", "must be positive"),
        ("strides=[-1, 1]", "must be positive"),
        ("dilations=[0, 1]", "must be positive"),
        ("pads=[-1, 0, 0, 0]", "non-negative"),
        ("group=0", "at least 1"),
        ("group=[1]", "must be an integer"),
        ("auto_pad=\"SAME\"", "auto_pad"),
        ("strides=[1, 1, 1]", "spatial"),
    ] {
        let text = one_node(&w, &format!("Conv(%x, %w) {{{attrs}}}"), "1,1,4,4");
        assert_error(attrs, &text, &x, &[wanted]);
    }
}

#[test]
fn nodes_must_fit_their_op_schema() {
    let x = [("x", Tensor::from_slice(&[1, 2, 2, 2], &[1.0f32; 8]))];
    for (tag, node, wanted) in [
        ("conv-no-inputs", "Conv()", "is required"),
        ("batchnorm-no-inputs", "BatchNormalization()", "is required"),
        ("batchnorm-one-input", "BatchNormalization(%x)", "is required"),
        ("relu-two-inputs", "Relu(%x, %x)", "at most 1 input"),
        ("transpose-string-perm", "Transpose(%x) {perm=\"0123\"}", "must be a list of integers"),
        ("concat-no-axis", "Concat(%x, %x)", "'axis' is required"),
        ("softmax-float-axis", "Softmax(%x) {axis=1.0}", "must be an integer"),
    ] {
        assert_error(tag, &one_node("", node, "1,2,2,2"), &x, &[wanted]);
    }
}

#[test]
fn control_flow_subgraphs_must_fit_their_node() {
    let c = [("c", Tensor::from_bools(&[], &[true]))];
    let if_model = |then_out: &str, else_out: &str| {
        format!(
            "opset 17\ngraph \"g\" {{\n  input %c: bool[]\n  init %a = f32[1] [1.0]\n  init %b = i64[1] [2]\n  %y = If(%c) {{else_branch=graph \"e\" {{\n{else_out}  }}, then_branch=graph \"t\" {{\n{then_out}  }}}}  # if\n  output %y: ?[*]\n}}\n"
        )
    };
    let two = "    output %a: f32[1]\n    output %a: f32[1]\n";
    let one_f = "    output %a: f32[1]\n";
    let one_i = "    output %b: i64[1]\n";
    assert_error("if-counts", &if_model(two, one_f), &c, &["outputs"]);
    assert_error("if-dtypes", &if_model(one_f, one_i), &c, &["f32 in then_branch but i64"]);
    let untyped = "opset 17\ngraph \"g\" {\n  input %x: ?[*]\n  %y = Relu(%x)  # r\n  output %y: ?[*]\n}\n";
    assert_error("untyped-input", untyped, &[("x", Tensor::from_slice(&[1], &[1.0f32]))], &["has no type"]);
}

#[test]
fn slices_with_extreme_bounds_match_numpy() {
    // x[::INT64_MIN] on axis 1 of a [2, 3]: numpy and ONNX Runtime give the last column.
    let inits = "  init %s = i64[1] [9223372036854775807]\n  init %e = i64[1] [-9223372036854775808]\n  init %a = i64[1] [1]\n  init %st = i64[1] [-9223372036854775808]\n";
    let text = one_node(inits, "Slice(%x, %s, %e, %a, %st)", "2,3");
    let x = Tensor::from_slice(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
    for r in both(&text, &[("x", x.clone())]) {
        let y = &r.unwrap()[0].1;
        assert_eq!(y.shape(), &[2, 1]);
        assert_eq!(y.data::<f32>(), &[3.0, 6.0]);
    }
}

#[test]
fn a_loop_that_never_runs_gives_empty_scan_outputs_of_the_right_rank() {
    let text = r#"opset 17
graph "g" {
  input %x: f32[1]
  init %trips = i64[] [-1]
  init %cond = bool[] [true]
  %out, %scan = Loop(%trips, %cond, %x) {body=graph "body" {
    input %i: i64[]
    input %c: bool[]
    input %v: f32[1]
    %w = Neg(%v)  # neg
    %keep = Identity(%c)  # keep
    output %keep: bool[]
    output %w: f32[1]
    output %w: f32[1]
  }}  # loop
  output %out: f32[1]
  output %scan: ?[*]
}
"#;
    for r in both(text, &[("x", Tensor::from_slice(&[1], &[2.0f32]))]) {
        let outs = r.unwrap();
        assert_eq!(outs[0].1.data::<f32>(), &[2.0]);
        assert_eq!(outs[1].1.shape(), &[0, 1]);
    }
}

#[test]
fn an_endless_loop_stops_at_the_time_limit_and_runaway_scans_at_the_size_limit() {
    let text = |scan: bool| {
        format!(
            r#"opset 17
graph "g" {{
  input %x: f32[256]
  init %cond = bool[] [true]
  %out{} = Loop(_, %cond, %x) {{body=graph "body" {{
    input %i: i64[]
    input %c: bool[]
    input %v: f32[256]
    %keep = Identity(%c)  # keep
    %w = Neg(%v)  # neg
    output %keep: bool[]
    output %w: f32[256]
{}  }}}}  # loop
  output %out: f32[256]
{}}}
"#,
            if scan { ", %scan" } else { "" },
            if scan { "    output %w: f32[256]\n" } else { "" },
            if scan { "  output %scan: ?[*]\n" } else { "" },
        )
    };
    let x = [("x", Tensor::from_slice(&[256], &[1.0f32; 256]))];
    for b in [Backend::Reference, Backend::Cpu] {
        let ir = aim_ir::text::parse_model(&text(false)).unwrap();
        let opts = Options { backend: b, timeout: Some(std::time::Duration::from_millis(300)), ..Options::default() };
        let m = Model::from_ir_with(ir, Path::new("loop.aimir"), &opts).unwrap();
        let t = std::time::Instant::now();
        let e = m.run(x.iter().map(|(n, t)| (n.to_string(), t.clone())).collect()).unwrap_err().to_string();
        assert!(e.contains("time limit"), "{b:?}: {e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "{b:?}: stopped late");
    }
    // 1 KiB per iteration against a 1 MiB limit: stopped after about a thousand iterations.
    let ir = aim_ir::text::parse_model(&text(true)).unwrap();
    let opts = Options { backend: Backend::Reference, max_tensor_bytes: Some(1 << 20), ..Options::default() };
    let m = Model::from_ir_with(ir, Path::new("loop.aimir"), &opts).unwrap();
    let e = m.run(x.iter().map(|(n, t)| (n.to_string(), t.clone())).collect()).unwrap_err().to_string();
    aim_ir::limits::set_max_tensor_bytes(0);
    assert!(e.contains("scan outputs grew too large"), "{e}");
}

#[test]
fn a_convolution_with_no_output_channels_gives_an_empty_output() {
    let text = one_node("  init %w = f32[0,1,3,3] []\n", "Conv(%x, %w) {pads=[1, 1, 1, 1]}", "1,1,4,4");
    for r in both(&text, &[("x", Tensor::from_slice(&[1, 1, 4, 4], &[1.0f32; 16]))]) {
        assert_eq!(r.unwrap()[0].1.shape(), &[1, 0, 4, 4]);
    }
}

/// Unnamed dims (`?`, an empty `dim_param`, `dim_value: -1`) are each their own unknown:
/// they need not agree with one another.
#[test]
fn unnamed_dims_are_independent() {
    use aim_onnx::proto::{tensor_shape_proto::dimension, TensorShapeProto};
    let mut x = aim_onnx::proto::ValueInfoProto {
        name: Some("x".into()),
        r#type: Some(aim_onnx::proto::TypeProto {
            value: Some(aim_onnx::proto::type_proto::Value::TensorType(aim_onnx::proto::type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto { dim: vec![] }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let dims = [
        dimension::Value::DimValue(-1),
        dimension::Value::DimValue(3),
        dimension::Value::DimParam("?".into()),
        dimension::Value::DimParam("?".into()),
        dimension::Value::DimParam(String::new()),
    ];
    if let Some(aim_onnx::proto::type_proto::Value::TensorType(t)) = x.r#type.as_mut().and_then(|t| t.value.as_mut()) {
        t.shape = Some(TensorShapeProto {
            dim: dims
                .iter()
                .map(|v| aim_onnx::proto::tensor_shape_proto::Dimension {
                    value: Some(v.clone()),
                    ..Default::default()
                })
                .collect(),
        });
    }
    use prost::Message;
    let y = x.clone();
    let bytes = aim_onnx::proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![aim_onnx::proto::OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(aim_onnx::proto::GraphProto {
            name: Some("g".into()),
            node: vec![aim_onnx::proto::NodeProto {
                op_type: Some("Relu".into()),
                name: Some("r".into()),
                input: vec!["x".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![x],
            output: vec![aim_onnx::proto::ValueInfoProto { name: Some("y".into()), ..y }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let dir = std::env::temp_dir().join(format!("aim-unnamed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.onnx");
    std::fs::write(&path, bytes).unwrap();
    let x = Tensor::from_slice(&[2, 3, 5, 7, 4], &vec![-1.0f32; 840]);
    for b in [Backend::Reference, Backend::Cpu] {
        let m = Model::load_with(&path, b).unwrap();
        let y = m.run(vec![("x".into(), x.clone())]).unwrap();
        assert_eq!(y[0].1.shape(), &[2, 3, 5, 7, 4], "{b:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// If branches and Loop bodies compiled by the cpu backend (programs of their own) give
/// what the reference interpreter gives: branches reading enclosing values and constants,
/// a nested If, a Loop with loop-carried values, scan outputs and an enclosing value read
/// every iteration, on both condition values.
#[test]
fn compiled_control_flow_matches_the_interpreter() {
    let text = r#"opset 17
graph "g" {
  input %x: f32[2,8]
  input %c: bool[]
  input %n: i64[]
  init %w = f32[8,8] <W>
  init %one = f32[] [1.0]
  %h = MatMul(%x, %w)  # mm
  %y = If(%c) {else_branch=graph "e" {
    %e1 = Sigmoid(%h)  # e_sig
    %e2 = Mul(%e1, %x)  # e_mul
    output %e2: f32[2,8]
  }, then_branch=graph "t" {
    %t1 = Relu(%h)  # t_relu
    %t2 = If(%c) {else_branch=graph "e2" {
      output %t1: f32[2,8]
    }, then_branch=graph "t2" {
      %t3 = Add(%t1, %one)  # t_add
      output %t3: f32[2,8]
    }}  # inner
    output %t2: f32[2,8]
  }}  # branch
  %cond = Identity(%c)  # cond
  %z, %scan = Loop(%n, _, %y) {body=graph "body" {
    input %i: i64[]
    input %ci: bool[]
    input %v: f32[2,8]
    %v1 = MatMul(%v, %w)  # b_mm
    %v2 = Tanh(%v1)  # b_tanh
    %v3 = Add(%v2, %x)  # b_add
    %keep = Identity(%ci)  # b_keep
    output %keep: bool[]
    output %v3: f32[2,8]
    output %v2: f32[2,8]
  }}  # loop
  output %y: f32[2,8]
  output %z: f32[2,8]
  output %scan: ?[*]
}
"#;
    let w: Vec<String> = (0..64).map(|i| format!("{:?}", ((i * 37 % 17) as f32 - 8.0) / 16.0)).collect();
    let text = text.replace("<W>", &format!("[{}]", w.join(", ")));
    let x: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
    for c in [true, false] {
        for trips in [0i64, 1, 3] {
            let inputs = [
                ("x", Tensor::from_slice(&[2, 8], &x)),
                ("c", Tensor::from_bools(&[], &[c])),
                ("n", Tensor::scalar(trips)),
            ];
            let r = both(&text, &inputs);
            let (want, got) = (r[0].as_ref().unwrap(), r[1].as_ref().unwrap());
            for ((name, a), (_, b)) in got.iter().zip(want) {
                assert_eq!(a.shape(), b.shape(), "{name} (c = {c}, {trips} trips)");
                for (p, q) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                    assert!((p - q).abs() <= 1e-5 * (1.0 + q.abs()), "{name} (c = {c}, {trips} trips): {p} vs {q}");
                }
            }
        }
    }
    // The cpu backend did compile the bodies.
    let m = load(&text, Backend::Cpu).unwrap();
    let g = m.optimized_graph().unwrap();
    assert!(g.nodes.iter().any(|n| n.op == "If") && g.nodes.iter().any(|n| n.op == "Loop"));
    assert_eq!(m.compiled_bodies(), 2, "the If and the Loop run compiled bodies");
}
