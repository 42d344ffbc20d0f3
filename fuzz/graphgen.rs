//! Random small well-typed graphs from fuzzer bytes, for comparing the cpu backend with the
//! reference backend: the ops, shapes, attributes and dtypes aim supports, chained so that
//! every node reads earlier values. The same bytes always give the same graph and inputs.
//!
//! Shared by the `compile_vs_reference` fuzz target and the corpus replay in
//! `tests/fuzz_corpus.rs` (both include this file with `#[path]`).

#![allow(dead_code)]

use aim::{Backend, Model, Options, Tensor};
use std::fmt::Write;

/// Reads choices from the fuzzer's bytes (zeros once they run out).
pub struct Choices<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Choices<'a> {
        Choices { data, at: 0 }
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    /// A number below `n` (n ≥ 1).
    fn below(&mut self, n: usize) -> usize {
        let v = u16::from_le_bytes([self.byte(), self.byte()]) as usize;
        v % n.max(1)
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }

    fn coin(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// A value in [-1, 1] in steps of 1/64.
    fn value(&mut self) -> f32 {
        (self.byte() as f32 - 128.0) / 64.0 * 0.5
    }
}

/// A value of the graph being built: its name and static shape (all f32).
#[derive(Clone)]
struct Value {
    name: String,
    shape: Vec<usize>,
}

/// A generated case: the model in the IR text format, its inputs, and the tolerance the
/// cpu backend must meet relative to the largest magnitude of each reference output.
pub struct Case {
    pub text: String,
    pub inputs: Vec<(String, Tensor)>,
    pub tolerance: f64,
}

fn dims(s: &[usize]) -> String {
    s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

fn floats(c: &mut Choices, n: usize) -> String {
    (0..n).map(|_| format!("{:?}", c.value())).collect::<Vec<_>>().join(", ")
}

/// The graph the bytes describe.
pub fn generate(data: &[u8]) -> Case {
    let mut c = Choices::new(data);
    let mut body = String::new();
    let mut inits = String::new();
    let mut vals: Vec<Value> = Vec::new();
    let mut inputs = Vec::new();
    let mut tolerance = 0.0;
    let rank = c.pick(&[1, 2, 2, 3, 4, 4, 4]);
    let shape: Vec<usize> =
        (0..rank).map(|i| if rank == 4 && i >= 2 { c.pick(&[1, 3, 5, 8]) } else { c.pick(&[1, 2, 3, 4, 6]) }).collect();
    let mut header = String::new();
    for k in 0..(1 + c.below(2)) {
        let name = format!("x{k}");
        let _ = writeln!(header, "  input %{name}: f32[{}]", dims(&shape));
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| c.value() * 2.0).collect();
        inputs.push((name.clone(), Tensor::from_slice(&shape, &v)));
        vals.push(Value { name, shape: shape.clone() });
    }
    let nodes = 1 + c.below(6);
    for i in 0..nodes {
        let x = vals[c.below(vals.len())].clone();
        let y = format!("v{i}");
        let r = x.shape.len();
        let n: usize = x.shape.iter().product();
        let init = |inits: &mut String, name: &str, shape: &[usize], c: &mut Choices| {
            let count: usize = shape.iter().product();
            let _ = writeln!(inits, "  init %{name} = f32[{}] [{}]", dims(shape), floats(c, count));
        };
        let (line, out, tol): (String, Vec<usize>, f64) = match c.below(22) {
            0 => {
                let op =
                    c.pick(&["Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Exp", "Erf", "Softplus", "HardSwish", "Floor"]);
                (format!("{op}(%{})", x.name), x.shape.clone(), 1e-5)
            }
            1 => {
                let op = c.pick(&[
                    "LeakyRelu {alpha=0.1}",
                    "HardSigmoid {alpha=0.3, beta=0.4}",
                    "Elu {alpha=0.7}",
                    "Gelu",
                    "Selu",
                ]);
                let (name, attrs) = op.split_once(' ').unwrap_or((op, ""));
                (format!("{name}(%{}) {attrs}", x.name), x.shape.clone(), 1e-5)
            }
            2 | 3 => {
                // A binary op against a constant broadcast along some dims, or another value.
                let op = c.pick(&["Add", "Sub", "Mul", "Max", "Min", "Div"]);
                let other = match vals.iter().find(|v| v.shape == x.shape && v.name != x.name) {
                    Some(v) if c.coin() => v.name.clone(),
                    _ => {
                        let skip = c.below(r + 1);
                        let b: Vec<usize> = x.shape.iter().skip(skip).map(|&d| if c.coin() { 1 } else { d }).collect();
                        let name = format!("c{i}");
                        let count: usize = b.iter().product();
                        // Divisors are kept away from zero.
                        let v: Vec<String> = (0..count)
                            .map(|_| if op == "Div" { 0.5 + c.value().abs() } else { c.value() })
                            .map(|v| format!("{v:?}"))
                            .collect();
                        let _ = writeln!(inits, "  init %{name} = f32[{}] [{}]", dims(&b), v.join(", "));
                        name
                    }
                };
                (format!("{op}(%{}, %{other})", x.name), x.shape.clone(), 1e-5)
            }
            4 if r >= 1 => {
                let k = *x.shape.last().unwrap();
                let m = c.pick(&[1, 3, 8, 17]);
                let w = format!("w{i}");
                init(&mut inits, &w, &[k, m], &mut c);
                let mut out = x.shape.clone();
                *out.last_mut().unwrap() = m;
                (format!("MatMul(%{}, %{w})", x.name), out, 1e-4)
            }
            5 if r == 2 => {
                let (rows, k) = (x.shape[0], x.shape[1]);
                let m = c.pick(&[1, 4, 9]);
                let trans_b = c.coin();
                let (w, b) = (format!("w{i}"), format!("b{i}"));
                init(&mut inits, &w, &if trans_b { [m, k] } else { [k, m] }, &mut c);
                init(&mut inits, &b, &[m], &mut c);
                (format!("Gemm(%{}, %{w}, %{b}) {{transB={}}}", x.name, trans_b as i32), vec![rows, m], 1e-4)
            }
            6 | 7 if r == 4 => {
                let ch = x.shape[1];
                let depthwise = c.coin() && ch > 1;
                let group = if depthwise { ch } else { 1 };
                let m = if depthwise { ch } else { c.pick(&[1, 4, 8, 16]) };
                let k = c.pick(&[1, 3, 3]);
                let s = c.pick(&[1, 1, 2]);
                let d = if k > 1 { c.pick(&[1, 1, 2]) } else { 1 };
                let p = c.pick(&[0, 1]);
                let ek = (k - 1) * d + 1;
                if x.shape[2] + 2 * p < ek || x.shape[3] + 2 * p < ek {
                    continue;
                }
                let (w, b) = (format!("w{i}"), format!("b{i}"));
                init(&mut inits, &w, &[m, ch / group, k, k], &mut c);
                init(&mut inits, &b, &[m], &mut c);
                let oh = (x.shape[2] + 2 * p - ek) / s + 1;
                let ow = (x.shape[3] + 2 * p - ek) / s + 1;
                let line = format!(
                    "Conv(%{}, %{w}, %{b}) {{dilations=[{d}, {d}], group={group}, pads=[{p}, {p}, {p}, {p}], strides=[{s}, {s}]}}",
                    x.name
                );
                (line, vec![x.shape[0], m, oh, ow], 1e-4)
            }
            8 if r == 4 => {
                let op = c.pick(&["MaxPool", "AveragePool"]);
                let k = c.pick(&[1, 2, 3]);
                let s = c.pick(&[1, 2]);
                if x.shape[2] < k || x.shape[3] < k {
                    continue;
                }
                let (oh, ow) = ((x.shape[2] - k) / s + 1, (x.shape[3] - k) / s + 1);
                (
                    format!("{op}(%{}) {{kernel_shape=[{k}, {k}], strides=[{s}, {s}]}}", x.name),
                    vec![x.shape[0], x.shape[1], oh, ow],
                    1e-5,
                )
            }
            9 if r == 4 => (format!("GlobalAveragePool(%{})", x.name), vec![x.shape[0], x.shape[1], 1, 1], 1e-5),
            10 if r >= 1 => {
                let op = c.pick(&["Softmax", "LogSoftmax"]);
                let axis = c.below(r) as i64 - r as i64;
                (format!("{op}(%{}) {{axis={axis}}}", x.name), x.shape.clone(), 1e-5)
            }
            11 if r >= 2 => {
                let mut perm: Vec<usize> = (0..r).collect();
                for j in (1..r).rev() {
                    perm.swap(j, c.below(j + 1));
                }
                let out = perm.iter().map(|&p| x.shape[p]).collect();
                let p = perm.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
                (format!("Transpose(%{}) {{perm=[{p}]}}", x.name), out, 0.0)
            }
            12 if r >= 1 => {
                let axis = c.below(r);
                let keep = c.coin();
                let op = c.pick(&["ReduceMean", "ReduceSum", "ReduceMax"]);
                let a = format!("a{i}");
                let _ = writeln!(inits, "  init %{a} = i64[1] [{axis}]");
                let mut out = x.shape.clone();
                if keep {
                    out[axis] = 1;
                } else {
                    out.remove(axis);
                }
                (format!("{op}(%{}, %{a}) {{keepdims={}}}", x.name, keep as i32), out, 1e-5)
            }
            13 => {
                let t = format!("t{i}");
                let _ = writeln!(inits, "  init %{t} = i64[2] [-1, {}]", x.shape.last().copied().unwrap_or(1));
                (
                    format!("Reshape(%{}, %{t})", x.name),
                    vec![n / x.shape.last().copied().unwrap_or(1).max(1), x.shape.last().copied().unwrap_or(1)],
                    0.0,
                )
            }
            14 if r >= 2 => {
                let axis = c.below(r);
                let mut out = x.shape.clone();
                out[axis] *= 2;
                (format!("Concat(%{}, %{}) {{axis={axis}}}", x.name, x.name), out, 0.0)
            }
            15 if r >= 2 => {
                // epsilon 0.01: with the default 1e-5 a row of nearly equal values is scaled by
                // up to 300, and f32 against f64 rounding differences with it (an
                // ill-conditioned chain, not a wrong kernel).
                let last = *x.shape.last().unwrap();
                let (g, b) = (format!("g{i}"), format!("be{i}"));
                init(&mut inits, &g, &[last], &mut c);
                init(&mut inits, &b, &[last], &mut c);
                (
                    format!("LayerNormalization(%{}, %{g}, %{b}) {{axis=-1, epsilon=0.01}}", x.name),
                    x.shape.clone(),
                    1e-4,
                )
            }
            16 if r == 4 => {
                // A transposed convolution with constant weights.
                let ch = x.shape[1];
                let m = c.pick(&[1, 4, 8]);
                let (k, s) = (c.pick(&[1, 2, 3]), c.pick(&[1, 2]));
                let (w, b) = (format!("w{i}"), format!("b{i}"));
                init(&mut inits, &w, &[ch, m, k, k], &mut c);
                init(&mut inits, &b, &[m], &mut c);
                let (oh, ow) = (s * (x.shape[2] - 1) + k, s * (x.shape[3] - 1) + k);
                (
                    format!("ConvTranspose(%{}, %{w}, %{b}) {{strides=[{s}, {s}]}}", x.name),
                    vec![x.shape[0], m, oh, ow],
                    1e-4,
                )
            }
            17 if r == 4 => {
                let mode = c.pick(&["nearest", "linear"]);
                let sc = format!("sc{i}");
                let _ = writeln!(inits, "  init %{sc} = f32[4] [1.0, 1.0, 2.0, 2.0]");
                let out = vec![x.shape[0], x.shape[1], 2 * x.shape[2], 2 * x.shape[3]];
                (format!("Resize(%{}, _, %{sc}) {{mode=\"{mode}\"}}", x.name), out, 1e-5)
            }
            18 => (format!("Mul(%{}, %{})", x.name, x.name), x.shape.clone(), 1e-5),
            19 => {
                // SiLU as exporters write it (two nodes; the second reads the first).
                let gate = format!("g{i}");
                let _ = writeln!(body, "  %{gate} = Sigmoid(%{})  # s{i}", x.name);
                (format!("Mul(%{}, %{gate})", x.name), x.shape.clone(), 1e-5)
            }
            20 if r >= 1 && x.shape[0] > 1 => {
                let (a, e) = (format!("sa{i}"), format!("se{i}"));
                let _ = writeln!(inits, "  init %{a} = i64[1] [1]");
                let _ = writeln!(inits, "  init %{e} = i64[1] [{}]", x.shape[0]);
                let mut out = x.shape.clone();
                out[0] -= 1;
                (format!("Slice(%{}, %{a}, %{e})", x.name), out, 0.0)
            }
            21 if r >= 1 => {
                let idx = format!("ix{i}");
                let _ = writeln!(inits, "  init %{idx} = i64[2] [0, {}]", x.shape[0] - 1);
                let mut out = x.shape.clone();
                out[0] = 2;
                (format!("Gather(%{}, %{idx}) {{axis=0}}", x.name), out, 0.0)
            }
            _ => (format!("Relu(%{})", x.name), x.shape.clone(), 0.0),
        };
        let _ = writeln!(body, "  %{y} = {line}  # n{i}");
        tolerance += tol;
        vals.push(Value { name: y, shape: out });
    }
    let last = vals.last().expect("at least the inputs").clone();
    let mut outputs = format!("  output %{}: f32[{}]\n", last.name, dims(&last.shape));
    // Sometimes an earlier value is an output too (its slot must stay intact to the end).
    if vals.len() > 2 && c.coin() {
        let v = &vals[vals.len() - 2];
        if !v.name.starts_with('x') {
            let _ = writeln!(outputs, "  output %{}: f32[{}]", v.name, dims(&v.shape));
        }
    }
    let text = format!("opset 21\ngraph \"fuzz\" {{\n{header}{inits}{body}{outputs}}}\n");
    Case { text, inputs, tolerance: tolerance.max(1e-6) }
}

/// Runs the case on both backends: both must give the same outputs within the tolerance
/// (`Ok(true)`), or both refuse it (`Ok(false)`). Returns a description of a disagreement.
pub fn compare(case: &Case, threads: usize) -> Result<bool, String> {
    let load = |backend: Backend| -> Result<Vec<(String, Tensor)>, String> {
        let ir =
            aim_ir::text::parse_model(&case.text).map_err(|e| format!("the generated text does not parse: {e}"))?;
        let opts = Options { backend, threads: Some(threads), ..Options::default() };
        let m = Model::from_ir_with(ir, std::path::Path::new("fuzz.aimir"), &opts).map_err(|e| e.to_string())?;
        m.run(case.inputs.clone()).map_err(|e| e.to_string())
    };
    let (want, got) = (load(Backend::Reference), load(Backend::Cpu));
    for r in [&want, &got] {
        if let Err(e) = r {
            if e.contains("internal error") || e.contains("does not parse") {
                return Err(format!("{e}\n{}", case.text));
            }
        }
    }
    match (want, got) {
        (Err(_), Err(_)) => Ok(false),
        (Ok(_), Err(e)) => Err(format!("only the cpu backend fails: {e}\n{}", case.text)),
        (Err(e), Ok(_)) => Err(format!("only the reference backend fails: {e}\n{}", case.text)),
        (Ok(w), Ok(g)) => {
            for ((name, a), (_, b)) in g.iter().zip(&w) {
                if a.shape() != b.shape() {
                    return Err(format!("output {name}: shape {:?} vs {:?}\n{}", a.shape(), b.shape(), case.text));
                }
                let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
                let scale = b.iter().filter(|v| v.is_finite()).fold(1e-3f64, |m, v| m.max(v.abs()));
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    let same = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= case.tolerance * scale;
                    if !same {
                        return Err(format!(
                            "output {name}[{i}]: cpu {x} vs reference {y} (tolerance {:e} of {scale})\n{}",
                            case.tolerance, case.text
                        ));
                    }
                }
            }
            Ok(true)
        }
    }
}
