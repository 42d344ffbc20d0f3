//! Byte tables: an elementwise function of one byte tensor whose result is quantized back
//! to bytes has only 256 possible inputs, so it is a 256-entry table.
//!
//! Between two byte regions a quantized model often runs an activation the integer kernels
//! do not fuse (HardSwish, SiLU, Sigmoid: a QLinearMul of a value and its HardSigmoid, as
//! paddle2onnx's QOperator export writes it). After the quantization passes that is
//! `aim:Dequantize8(X)` (bytes NHWC to f32 NCHW, once per reader) → `aim:Elementwise` →
//! `aim:Quantize8` (back to bytes NHWC). When every input of the elementwise program is a
//! dequantization of the same bytes `X` and the Quantize8 alone reads its result, the three
//! become `aim:Lut8(X)` with `table` the program evaluated on each byte's dequantized
//! values and quantized as the Quantize8 does: one lookup per byte, channels last in and
//! out, instead of two layout changes and an f32 loop. The values are the ones the f32
//! path gives (the program in f32 in its own order, the same approximations of the
//! transcendental functions).

use super::fuse::{sources_of, SOURCES};
use super::uses::{readers, remove_marked};
use super::PassError;
use crate::ewprog;
use aim_ir::{Attr, Graph, Node};
use aim_kernels::int8::Q8;
use std::collections::HashMap;

/// The quantization (`scale`, `zero` in u8 terms) of an `aim:Quantize8` / `aim:Dequantize8`.
fn q8(n: &Node) -> Option<Q8> {
    let scale = match n.attrs.get("scale") {
        Some(Attr::Float(s)) if *s > 0.0 && s.is_finite() => *s,
        _ => return None,
    };
    let zero = u8::try_from(n.opt_int("zero")?).ok()?;
    Some(Q8 { scale, zero })
}

fn is_aim(n: &Node, op: &str) -> bool {
    n.domain == "aim" && n.op == op
}

/// What sits between the dequantizations and the quantization.
enum Middle {
    /// An `aim:Elementwise` program.
    Program(Vec<ewprog::Inst>),
    /// One pointwise ONNX op (`aim_kernels::ops::elementwise::is_pointwise`).
    Op,
}

impl Middle {
    /// The f32 results for the 256 bytes, each input dequantized as `inputs` says: the
    /// program in f32 as its loop computes it, an op by its reference kernel.
    fn values(&self, e: &Node, inputs: &[Q8]) -> Option<Vec<f32>> {
        match self {
            Middle::Program(prog) => (0..=255u8)
                .map(|b| ewprog::eval(prog, &inputs.iter().map(|d| d.dequantize(b)).collect::<Vec<_>>()))
                .collect(),
            Middle::Op => {
                let x: Vec<f32> = (0..=255u8).map(|b| inputs[0].dequantize(b)).collect();
                let y = aim_kernels::kernel(&e.op)?(e, &[Some(aim_ir::Tensor::from_vec(&[256], x))]).ok()?;
                let y = y.into_iter().next().filter(|t| t.dtype() == aim_ir::DType::F32 && t.len() == 256)?;
                Some(y.data::<f32>().to_vec())
            }
        }
    }
}

/// Rewrites every Dequantize8 → Elementwise → Quantize8 chain of one byte tensor into an
/// `aim:Lut8` (see the module doc).
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let r = readers(g);
    let by_output: HashMap<String, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i))).collect();
    let mut removed = vec![false; g.nodes.len()];
    let mut tables: Vec<(usize, String, Vec<i64>, Vec<String>)> = Vec::new();
    for (qi, q) in g.nodes.iter().enumerate() {
        if !is_aim(q, "Quantize8") {
            continue;
        }
        let Some(out_q) = q8(q) else { continue };
        let Some(&ei) = q.input(0).and_then(|v| by_output.get(v)) else { continue };
        let e = &g.nodes[ei];
        let single_reader = r.get(&e.outputs[0]).is_some_and(|rd| rd.as_slice() == [qi]);
        let middle = if is_aim(e, "Elementwise") {
            match e.strings("program").map(ewprog::parse) {
                Some(Ok(prog)) => Middle::Program(prog),
                _ => continue,
            }
        } else if e.domain.is_empty() && aim_kernels::ops::elementwise::is_pointwise(&e.op) && e.inputs.len() == 1 {
            Middle::Op
        } else {
            continue;
        };
        if !single_reader || removed[ei] || e.outputs.len() != 1 {
            continue;
        }
        // Every input a dequantization of the same bytes.
        let mut bytes: Option<&str> = None;
        let mut inputs: Vec<Q8> = Vec::new();
        let mut sources = Vec::new();
        for v in &e.inputs {
            let Some(d) = by_output.get(v).map(|&di| &g.nodes[di]).filter(|d| is_aim(d, "Dequantize8")) else {
                break;
            };
            let (Some(x), Some(qd)) = (d.input(0), q8(d)) else { break };
            if bytes.is_some_and(|b| b != x) {
                break;
            }
            bytes = Some(x);
            inputs.push(qd);
            sources.extend(sources_of(d));
        }
        let Some(x) = bytes.filter(|_| inputs.len() == e.inputs.len()) else { continue };
        let Some(values) = middle.values(e, &inputs) else { continue };
        let table: Vec<i64> = values.iter().map(|&y| out_q.quantize(y) as i64).collect();
        sources.extend(sources_of(e));
        sources.extend(sources_of(q));
        let mut seen = std::collections::HashSet::new();
        sources.retain(|s| seen.insert(s.clone()));
        removed[ei] = true;
        tables.push((qi, x.to_string(), table, sources));
    }
    for (qi, x, table, sources) in tables {
        let n = &mut g.nodes[qi];
        n.op = "Lut8".into();
        n.inputs = vec![x];
        n.attrs.clear();
        n.attrs.insert("table".into(), Attr::Ints(table));
        n.attrs.insert(SOURCES.into(), Attr::Strings(sources));
    }
    remove_marked(g, &removed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use aim_ir::text::{parse_graph, print_graph, TensorDetail};

    /// A HardSwish between byte regions becomes one table: each entry the program's value
    /// of that byte, quantized.
    #[test]
    fn dequantize_program_quantize_becomes_a_table() {
        let mut g = parse_graph(concat!(
            "graph \"g\" {\n",
            " input %x: u8[1,2,2,3]\n",
            " %a: f32[1,3,2,2] = aim:Dequantize8(%x) {scale=0.1, zero=128}  # d1\n",
            " %b: f32[1,3,2,2] = aim:Dequantize8(%x) {scale=0.1, zero=128}  # d2\n",
            " %e: f32[1,3,2,2] = aim:Elementwise(%a, %b) {program=[\"in 0\", \"add 0 c3.0\", \"clip 1 0.0 6.0\", \"in 1\", \"mul 3 2\", \"div 4 c6.0\"]}  # hs\n",
            " %y: u8[1,2,2,3] = aim:Quantize8(%e) {scale=0.05, zero=10}  # q\n",
            " output %y: u8[1,2,2,3]\n",
            "}\n"
        ))
        .unwrap();
        super::run(&mut g).unwrap();
        let text = print_graph(&g, TensorDetail::Full);
        let lut = g.nodes.iter().find(|n| n.op == "Lut8").unwrap_or_else(|| panic!("{text}"));
        assert_eq!(lut.inputs, ["x"]);
        assert!(!g.nodes.iter().any(|n| n.op == "Elementwise" || n.op == "Quantize8"), "{text}");
        let table = lut.ints("table").unwrap();
        for b in [0u8, 100, 128, 158, 255] {
            let x = (b as f32 - 128.0) * 0.1;
            let hs = x * (x + 3.0).clamp(0.0, 6.0) / 6.0;
            let want = ((hs / 0.05).round_ties_even() + 10.0).clamp(0.0, 255.0);
            assert_eq!(table[b as usize], want as i64, "byte {b}");
        }
    }

    /// A program that also reads another tensor is not a function of the byte alone.
    #[test]
    fn other_inputs_keep_the_loop() {
        let mut g = parse_graph(concat!(
            "graph \"g\" {\n",
            " input %x: u8[1,2,2,3]\n",
            " input %z: f32[1,3,2,2]\n",
            " %a: f32[1,3,2,2] = aim:Dequantize8(%x) {scale=0.1, zero=128}  # d1\n",
            " %e: f32[1,3,2,2] = aim:Elementwise(%a, %z) {program=[\"in 0\", \"in 1\", \"mul 0 1\"]}  # m\n",
            " %y: u8[1,2,2,3] = aim:Quantize8(%e) {scale=0.05, zero=10}  # q\n",
            " output %y: u8[1,2,2,3]\n",
            "}\n"
        ))
        .unwrap();
        super::run(&mut g).unwrap();
        assert!(!g.nodes.iter().any(|n| n.op == "Lut8"));
    }
}
