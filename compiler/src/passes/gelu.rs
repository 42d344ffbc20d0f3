//! GELU written out — with Erf, `x · 0.5 · (1 + erf(x / √2))`, as PyTorch exports it before
//! opset 20, or with Tanh, `x · 0.5 · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`, as GPT-2
//! style models write it — becomes one `Gelu` node (ONNX opset 20 semantics, `approximate`
//! `"none"` or `"tanh"`), which the CPU backend runs as one vectorised loop (or a dense
//! layer's epilogue) instead of five to nine passes over memory. The node keeps every
//! original node in `sources`. Every multiplication order (`(x · a) · 0.5`,
//! `x · (0.5 · a)` as the torch dynamo exporter writes it, and `(x · 0.5) · a`), `x / √2` or `x · (1/√2)`, `Pow(x, 3)` or `x · x · x`, and either operand
//! order of the adds and multiplies are recognised; intermediates read elsewhere stop the
//! match.

use super::fuse::{sources_of, SOURCES};
use super::uses::{producers, readers};
use super::PassError;
use aim_ir::{Attr, Graph, Node};
use std::collections::HashMap;

fn scalar(g: &Graph, name: &str) -> Option<f64> {
    let t = g.initializers.get(name)?;
    (t.len() == 1 && t.dtype().is_float()).then(|| t.to_f64_vec()[0])
}

fn near(v: Option<f64>, want: f64) -> bool {
    v.is_some_and(|v| (v - want).abs() <= 1e-4 * want.abs())
}

/// The other input of a binary node `n` when one of its inputs is `known`.
fn other<'a>(n: &'a Node, known: &str) -> Option<&'a str> {
    match (n.input(0)?, n.input(1)?) {
        (a, b) if a == known => Some(b),
        (a, b) if b == known => Some(a),
        _ => None,
    }
}

struct Matcher<'a> {
    g: &'a Graph,
    readers: HashMap<String, Vec<usize>>,
    by_output: HashMap<&'a str, usize>,
}

impl Matcher<'_> {
    /// The single node reading `value` (and nothing else reads it).
    fn only_reader(&self, value: &str) -> Option<usize> {
        match self.readers.get(value).map(|v| v.as_slice()) {
            Some(&[i]) if i != usize::MAX => Some(i),
            _ => None,
        }
    }

    /// The nodes of an erf GELU whose Erf is node `e`, ending with the final Mul: [div, erf,
    /// add, mul, mul], and x.
    fn match_at(&self, e: usize) -> Option<(Vec<usize>, String)> {
        let g = self.g;
        let erf = &g.nodes[e];
        if erf.op != "Erf" || !erf.domain.is_empty() {
            return None;
        }
        // x / √2 or x · (1/√2), read only by the Erf.
        let d = *self.by_output.get(erf.input(0)?)?;
        let div = &g.nodes[d];
        let x = div.input(0)?.to_string();
        let scaled = match div.op.as_str() {
            "Div" => near(scalar(g, div.input(1)?), std::f64::consts::SQRT_2),
            "Mul" => {
                let (a, b) = (div.input(0)?, div.input(1)?);
                let (x2, c) = if scalar(g, b).is_some() { (a, b) } else { (b, a) };
                if x2 != x && scalar(g, a).is_none() {
                    return None;
                }
                near(scalar(g, c), std::f64::consts::FRAC_1_SQRT_2)
            }
            _ => false,
        };
        if !scaled || self.only_reader(&div.outputs[0])? != e {
            return None;
        }
        let x = if div.op == "Mul" && scalar(g, &x).is_some() { div.input(1)?.to_string() } else { x };
        let mut nodes = vec![d, e];
        self.tail(e, &x, &mut nodes)?;
        Some((nodes, x))
    }

    /// The `0.5 · x · (1 + f)` that ends both forms, from the node `f` computing f: pushes
    /// [add, mul, mul] to `nodes` (the last the GELU's output), or None.
    fn tail(&self, f: usize, x: &str, nodes: &mut Vec<usize>) -> Option<()> {
        let g = self.g;
        let fv = &g.nodes[f].outputs[0];
        let a = self.only_reader(fv)?;
        let add = &g.nodes[a];
        if add.op != "Add" || !near(scalar(g, other(add, fv)?), 1.0) {
            return None;
        }
        // (x · (1 + f)) · 0.5, x · (0.5 · (1 + f)), or (x · 0.5) · (1 + f).
        let m1 = self.only_reader(&add.outputs[0])?;
        let mul1 = &g.nodes[m1];
        if mul1.op != "Mul" {
            return None;
        }
        let partner = other(mul1, &add.outputs[0])?;
        if partner == x {
            let m2 = self.only_reader(&mul1.outputs[0])?;
            let mul2 = &g.nodes[m2];
            (mul2.op == "Mul" && near(scalar(g, other(mul2, &mul1.outputs[0])?), 0.5))
                .then(|| nodes.extend([a, m1, m2]))
        } else if scalar(g, partner).is_some() {
            let m2 = self.only_reader(&mul1.outputs[0])?;
            let mul2 = &g.nodes[m2];
            (near(scalar(g, partner), 0.5) && mul2.op == "Mul" && other(mul2, &mul1.outputs[0])? == x)
                .then(|| nodes.extend([a, m1, m2]))
        } else {
            let h = *self.by_output.get(partner)?;
            let half = &g.nodes[h];
            let ok = half.op == "Mul"
                && near(scalar(g, other(half, x)?), 0.5)
                && self.only_reader(&half.outputs[0]) == Some(m1);
            ok.then(|| nodes.extend([a, h, m1]))
        }
    }

    /// The node computing `value` when it is a binary `op` with a scalar constant near
    /// `c` and is read only by node `reader`: the node and its other input.
    fn scaled(&self, value: &str, op: &str, c: f64, reader: usize) -> Option<(usize, String)> {
        let i = *self.by_output.get(value)?;
        let n = &self.g.nodes[i];
        let (a, b) = (n.input(0)?, n.input(1)?);
        let (v, k) = if scalar(self.g, b).is_some() { (a, b) } else { (b, a) };
        let ok =
            n.op == op && n.domain.is_empty() && near(scalar(self.g, k), c) && self.only_reader(value) == Some(reader);
        ok.then(|| (i, v.to_string()))
    }

    /// The nodes of a tanh GELU whose Tanh is node `t`: [pow (or the two Muls of x·x·x),
    /// mul, add, mul, tanh, add, mul, mul] (the last the GELU's output), and x.
    fn match_tanh_at(&self, t: usize) -> Option<(Vec<usize>, String)> {
        let g = self.g;
        let tanh = &g.nodes[t];
        if tanh.op != "Tanh" || !tanh.domain.is_empty() {
            return None;
        }
        // √(2/π) · (x + 0.044715 · x³).
        let (s, r) = self.scaled(tanh.input(0)?, "Mul", (2.0 / std::f64::consts::PI).sqrt(), t)?;
        let ri = *self.by_output.get(r.as_str())?;
        let add = &g.nodes[ri];
        if add.op != "Add" || self.only_reader(&r) != Some(s) {
            return None;
        }
        let (a0, a1) = (add.input(0)?, add.input(1)?);
        // Either operand of the Add may be the 0.044715 · x³ term.
        let (q, cube, x) = [(a1, a0), (a0, a1)].into_iter().find_map(|(term, x)| {
            let (q, cube) = self.scaled(term, "Mul", 0.044715, ri)?;
            Some((q, cube, x.to_string()))
        })?;
        let mut nodes = self.cube_of(&cube, &x, q)?;
        nodes.extend([q, ri, s, t]);
        self.tail(t, &x, &mut nodes)?;
        Some((nodes, x))
    }

    /// The nodes computing `value` = x³ (`Pow(x, 3)`, or `(x · x) · x` in either order),
    /// read only by node `reader`.
    fn cube_of(&self, value: &str, x: &str, reader: usize) -> Option<Vec<usize>> {
        let g = self.g;
        let i = *self.by_output.get(value)?;
        let n = &g.nodes[i];
        if self.only_reader(value) != Some(reader) || !n.domain.is_empty() {
            return None;
        }
        match n.op.as_str() {
            "Pow" => (n.input(0)? == x && near(scalar(g, n.input(1)?), 3.0)).then(|| vec![i]),
            "Mul" => {
                let sq = other(n, x)?;
                let j = *self.by_output.get(sq)?;
                let m = &g.nodes[j];
                let ok = m.op == "Mul" && m.input(0)? == x && m.input(1)? == x && self.only_reader(sq) == Some(i);
                ok.then(|| vec![j, i])
            }
            _ => None,
        }
    }
}

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let found: Vec<(Vec<usize>, String, &str)> = {
        let m = Matcher { g, readers: readers(g), by_output: producers(g) };
        (0..g.nodes.len())
            .filter_map(|i| {
                m.match_at(i).map(|(v, x)| (v, x, "none")).or_else(|| m.match_tanh_at(i).map(|(v, x)| (v, x, "tanh")))
            })
            .collect()
    };
    let mut gone = vec![false; g.nodes.len()];
    for (nodes, x, approximate) in found {
        let last = *nodes.iter().max().expect("a GELU's nodes");
        let end = *nodes.last().expect("a GELU's nodes");
        let mut sources = Vec::new();
        for &i in &nodes {
            sources.extend(sources_of(&g.nodes[i]));
        }
        let out = g.nodes[end].outputs[0].clone();
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("approximate".to_string(), Attr::String(approximate.into()));
        attrs.insert(SOURCES.to_string(), Attr::Strings(sources));
        let name = g.nodes[end].name.clone();
        // The Gelu takes the place of the last of its nodes (x is defined before all).
        g.nodes[last] =
            Node { name, op: "Gelu".into(), domain: String::new(), inputs: vec![x], outputs: vec![out], attrs };
        for i in nodes.into_iter().filter(|&i| i != last) {
            gone[i] = true;
        }
    }
    super::uses::remove_marked(g, &gone);
    Ok(())
}
