//! GELU written out with Erf — `x · 0.5 · (1 + erf(x / √2))`, as PyTorch exports it before
//! opset 20 — becomes one `Gelu` node (ONNX opset 20 semantics, `approximate = "none"`),
//! which the CPU backend runs as one vectorised loop instead of five passes over memory.
//! The node keeps every original node in `sources`. Both multiplication orders
//! (`(x · a) · 0.5` and `(x · 0.5) · a`), `x / √2` or `x · (1/√2)`, and either operand order
//! of the adds and multiplies are recognised; intermediates read elsewhere stop the match.

use super::fuse::{sources_of, SOURCES};
use super::uses::readers;
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

    /// The nodes of a GELU whose Erf is node `e`, ending with the final Mul: [div, erf, add,
    /// mul, mul], and x.
    fn match_at(&self, e: usize) -> Option<([usize; 5], String)> {
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
        // 1 + erf.
        let a = self.only_reader(&erf.outputs[0])?;
        let add = &g.nodes[a];
        if add.op != "Add" || !near(scalar(g, other(add, &erf.outputs[0])?), 1.0) {
            return None;
        }
        // (x · (1 + erf)) · 0.5, or (x · 0.5) · (1 + erf).
        let m1 = self.only_reader(&add.outputs[0])?;
        let mul1 = &g.nodes[m1];
        if mul1.op != "Mul" {
            return None;
        }
        let partner = other(mul1, &add.outputs[0])?;
        if partner == x {
            let m2 = self.only_reader(&mul1.outputs[0])?;
            let mul2 = &g.nodes[m2];
            (mul2.op == "Mul" && near(scalar(g, other(mul2, &mul1.outputs[0])?), 0.5)).then_some(([d, e, a, m1, m2], x))
        } else {
            let h = *self.by_output.get(partner)?;
            let half = &g.nodes[h];
            let ok = half.op == "Mul"
                && near(scalar(g, other(half, &x)?), 0.5)
                && self.only_reader(&half.outputs[0]) == Some(m1);
            ok.then_some(([d, e, a, h, m1], x))
        }
    }
}

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let found: Vec<([usize; 5], String)> = {
        let m = Matcher {
            g,
            readers: readers(g),
            by_output: g
                .nodes
                .iter()
                .enumerate()
                .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i)))
                .collect(),
        };
        (0..g.nodes.len()).filter_map(|e| m.match_at(e)).collect()
    };
    let mut gone = Vec::new();
    for (nodes, x) in found {
        let last = *nodes.iter().max().expect("five nodes");
        let mut sources = Vec::new();
        for &i in &nodes {
            sources.extend(sources_of(&g.nodes[i]));
        }
        let out = g.nodes[nodes[4]].outputs[0].clone();
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("approximate".to_string(), Attr::String("none".into()));
        attrs.insert(SOURCES.to_string(), Attr::Strings(sources));
        let name = g.nodes[nodes[4]].name.clone();
        // The Gelu takes the place of the last of its nodes (x is defined before all five).
        g.nodes[last] =
            Node { name, op: "Gelu".into(), domain: String::new(), inputs: vec![x], outputs: vec![out], attrs };
        gone.extend(nodes.iter().copied().filter(|&i| i != last));
    }
    gone.sort_unstable_by(|a, b| b.cmp(a));
    gone.dedup();
    for i in gone {
        g.nodes.remove(i);
    }
    Ok(())
}
