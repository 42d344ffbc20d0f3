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
