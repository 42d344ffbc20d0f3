//! Layer normalization written out — `d = x − mean(x)`, `d / √(mean(d²) + ε)`, then `· γ + β`
//! — as PyTorch exports `nn.LayerNorm` before opset 17 and paddle2onnx writes it, becomes one
//! `LayerNormalization` node (over the same trailing axes, with ε, γ and β), which the CPU
//! backend runs as one pass per row instead of nine nodes (a wake-word classifier's two
//! layer norms over 128 values were 18 of the 33 nodes of its main graph).
//! The node keeps every original node in `sources`. `Pow(d, 2)` or `d · d`, either operand
//! order of the add of ε and of the scale and shift, and no scale or shift are recognised;
//! intermediates read elsewhere, reductions that keep no dims or do not end at the last
//! axis, and a γ or β that is not a constant of the normalised shape stop the match.

use super::fuse::{sources_of, SOURCES};
use super::uses::{producers, readers};
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor};
use std::collections::HashMap;

fn scalar(g: &Graph, name: &str) -> Option<f64> {
    let t = g.initializers.get(name)?;
    (t.len() == 1 && t.dtype().is_float()).then(|| t.to_f64_vec()[0])
}

/// The other input of a binary node `n` when one of its inputs is `known`.
fn other<'a>(n: &'a Node, known: &str) -> Option<&'a str> {
    match (n.input(0)?, n.input(1)?) {
        (a, b) if a == known => Some(b),
        (a, b) if b == known => Some(a),
        _ => None,
    }
}

/// A match: the nodes (the last computes the normalised output), x, the first normalised
/// axis (negative, from the end), ε, and the names of γ and β when present.
struct Found {
    nodes: Vec<usize>,
    x: String,
    axis: i64,
    epsilon: f32,
    scale: Option<String>,
    bias: Option<String>,
}

struct Matcher<'a> {
    g: &'a Graph,
    readers: HashMap<String, Vec<usize>>,
    by_output: HashMap<&'a str, usize>,
}

impl Matcher<'_> {
    /// The readers of `value` (none when a graph output is among them).
    fn readers_of(&self, value: &str) -> Option<&[usize]> {
        let r = self.readers.get(value)?.as_slice();
        (!r.contains(&usize::MAX)).then_some(r)
    }

    /// The single node reading `value` (and nothing else reads it).
    fn only_reader(&self, value: &str) -> Option<usize> {
        match self.readers_of(value)? {
            &[i] => Some(i),
            _ => None,
        }
    }

    /// The node `i` when it is the default-domain `op`.
    fn node(&self, i: usize, op: &str) -> Option<&Node> {
        let n = &self.g.nodes[i];
        (n.op == op && n.domain.is_empty()).then_some(n)
    }

    /// The first reduced axis, counted from the end (−1 for the last), of a mean over
    /// trailing axes that keeps its dims, reading `x`.
    fn trailing_mean(&self, n: &Node, x: &str) -> Option<i64> {
        if n.op != "ReduceMean" || n.input(0)? != x || n.int("keepdims", 1) != 1 {
            return None;
        }
        let axes: Vec<i64> = match n.input(1) {
            Some(a) => self.g.initializers.get(a)?.to_i64_vec(),
            None => n.ints("axes")?.to_vec(),
        };
        let rank = self.g.value_type(x).and_then(|t| t.shape.as_ref().map(|s| s.len() as i64));
        let mut neg: Vec<i64> =
            axes.iter().map(|&a| if a < 0 { Some(a) } else { rank.map(|r| a - r) }).collect::<Option<Vec<i64>>>()?;
        neg.sort_unstable();
        neg.dedup();
        let first = *neg.first()?;
        // −k, …, −1: the last k axes, each once.
        (neg.len() as i64 == -first && neg.iter().enumerate().all(|(i, &a)| a == first + i as i64)).then_some(first)
    }

    /// The layer norm whose `Sqrt` is node `s`.
    fn match_at(&self, s: usize) -> Option<Found> {
        let g = self.g;
        let sqrt = self.node(s, "Sqrt")?;
        // √(mean(d²) + ε)
        let a = *self.by_output.get(sqrt.input(0)?)?;
        let add = self.node(a, "Add")?;
        let r2 = [add.input(0)?, add.input(1)?].into_iter().find_map(|v| {
            let i = *self.by_output.get(v)?;
            (self.g.nodes[i].op == "ReduceMean").then_some(i)
        })?;
        let epsilon = scalar(g, other(add, &g.nodes[r2].outputs[0])?)?;
        if self.only_reader(&add.outputs[0])? != s || self.only_reader(&g.nodes[r2].outputs[0])? != a {
            return None;
        }
        // d² as Pow(d, 2) or d · d.
        let sq_i = *self.by_output.get(g.nodes[r2].input(0)?)?;
        let sq = &g.nodes[sq_i];
        let d = sq.input(0)?.to_string();
        let squares = match sq.op.as_str() {
            "Pow" => scalar(g, sq.input(1)?) == Some(2.0),
            "Mul" => sq.input(1)? == d,
            _ => false,
        };
        if !squares || !sq.domain.is_empty() || self.only_reader(&sq.outputs[0])? != r2 {
            return None;
        }
        // d = x − mean(x), read by the square and the division only.
        let sub_i = *self.by_output.get(d.as_str())?;
        let sub = self.node(sub_i, "Sub")?;
        let (x, m) = (sub.input(0)?.to_string(), sub.input(1)?);
        let r1 = *self.by_output.get(m)?;
        let axis = self.trailing_mean(&g.nodes[r1], &x)?;
        if self.trailing_mean(&g.nodes[r2], &sq.outputs[0])? != axis || self.only_reader(m)? != sub_i {
            return None;
        }
        let div_i = self.only_reader(&sqrt.outputs[0])?;
        let div = self.node(div_i, "Div")?;
        if div.input(0)? != d || div.input(1)? != sqrt.outputs[0] {
            return None;
        }
        let mut d_readers = self.readers_of(&d)?.to_vec();
        d_readers.sort_unstable();
        d_readers.dedup();
        let mut want = vec![sq_i, div_i];
        want.sort_unstable();
        want.dedup();
        if d_readers != want {
            return None;
        }
        if self.g.value_type(&x).and_then(|t| t.dtype) != Some(DType::F32) {
            return None;
        }
        let mut nodes = vec![r1, sub_i, sq_i, r2, a, s, div_i];
        // Then · γ and + β, each optional, each a constant.
        let (mut scale, mut bias, mut last) = (None, None, div.outputs[0].clone());
        if let Some(i) = self.only_reader(&last) {
            let n = &g.nodes[i];
            if n.op == "Mul" && n.domain.is_empty() && other(n, &last).is_some_and(|w| g.initializers.contains_key(w)) {
                scale = other(n, &last).map(str::to_string);
                nodes.push(i);
                last = n.outputs[0].clone();
            }
        }
        if let Some(i) = self.only_reader(&last) {
            let n = &g.nodes[i];
            if n.op == "Add" && n.domain.is_empty() && other(n, &last).is_some_and(|w| g.initializers.contains_key(w)) {
                bias = other(n, &last).map(str::to_string);
                nodes.push(i);
            }
        }
        Some(Found { nodes, x, axis, epsilon: epsilon as f32, scale, bias })
    }
}

/// The normalised dims of `x` (its last `-axis` dims) when they are known.
fn normalised_dims(g: &Graph, x: &str, axis: i64) -> Option<Vec<usize>> {
    let ty = g.value_type(x)?;
    let shape = ty.shape.as_ref()?;
    let k = usize::try_from(-axis).ok()?;
    let tail = shape.get(shape.len().checked_sub(k)?..)?;
    tail.iter().map(|d| d.known()).collect()
}

/// `t` as an f32 tensor of `dims` when it holds one value per normalised element (leading
/// ones allowed, as `[1, 1, C]` for a `[N, T, C]` input).
fn per_element(t: &Tensor, dims: &[usize]) -> Option<Tensor> {
    let n: usize = dims.iter().product();
    let lead = t.shape().len().checked_sub(dims.len());
    let fits = match lead {
        Some(l) => t.shape()[..l].iter().all(|&d| d == 1) && t.shape()[l..] == *dims,
        None => t.len() == n && t.shape().iter().all(|&d| d == 1 || dims.contains(&d)) && dims.len() == 1,
    };
    (fits && t.dtype() == DType::F32 && t.len() == n).then(|| Tensor::from_vec(dims, t.data::<f32>().to_vec()))
}

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let found: Vec<Found> = {
        let m = Matcher { g, readers: readers(g), by_output: producers(g) };
        (0..g.nodes.len()).filter_map(|i| m.match_at(i)).collect()
    };
    let mut gone = vec![false; g.nodes.len()];
    for f in found {
        // The normalised dims from x's type, or else from γ's shape (leading ones dropped).
        let from_scale = || {
            let t = g.initializers.get(f.scale.as_ref()?)?;
            let dims: Vec<usize> = t.shape().iter().copied().skip_while(|&d| d == 1).collect();
            (dims.len() as i64 == -f.axis).then_some(dims)
        };
        let Some(dims) = normalised_dims(g, &f.x, f.axis).or_else(from_scale) else { continue };
        // γ and β as tensors of the normalised shape (ones where there is no scale).
        let constant = |name: &Option<String>| match name {
            Some(n) => g.initializers.get(n).and_then(|t| per_element(t, &dims)).map(Some),
            None => Some(None),
        };
        let (Some(scale), Some(bias)) = (constant(&f.scale), constant(&f.bias)) else { continue };
        let scale = scale.unwrap_or_else(|| Tensor::from_vec(&dims, vec![1f32; dims.iter().product()]));
        let end = *f.nodes.last().expect("a layer norm's nodes");
        let last = *f.nodes.iter().max().expect("a layer norm's nodes");
        let mut sources = Vec::new();
        for &i in &f.nodes {
            sources.extend(sources_of(&g.nodes[i]));
        }
        let name = g.nodes[end].name.clone();
        let out = g.nodes[end].outputs[0].clone();
        let scale_name = format!("{name}::scale");
        g.initializers.insert(scale_name.clone(), scale);
        let mut inputs = vec![f.x.clone(), scale_name];
        if let Some(b) = bias {
            let bias_name = format!("{name}::bias");
            g.initializers.insert(bias_name.clone(), b);
            inputs.push(bias_name);
        }
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("axis".to_string(), Attr::Int(f.axis));
        attrs.insert("epsilon".to_string(), Attr::Float(f.epsilon));
        attrs.insert(SOURCES.to_string(), Attr::Strings(sources));
        // The LayerNormalization takes the place of the last of its nodes (x and the
        // constants are defined before all of them).
        g.nodes[last] =
            Node { name, op: "LayerNormalization".into(), domain: String::new(), inputs, outputs: vec![out], attrs };
        for i in f.nodes.into_iter().filter(|&i| i != last) {
            gone[i] = true;
        }
    }
    super::uses::remove_marked(g, &gone);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::ValueType;

    fn node(op: &str, name: &str, ins: &[&str], outs: &[&str]) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            domain: String::new(),
            inputs: ins.iter().map(|s| s.to_string()).collect(),
            outputs: outs.iter().map(|s| s.to_string()).collect(),
            attrs: Default::default(),
        }
    }

    /// A torch-style layer norm over the last axis of `[2, 5, 8]`, with `square` as the
    /// squaring op ("Pow" or "Mul") and `affine` for γ and β.
    fn written_out(square: &str, affine: bool) -> Graph {
        let mut g = Graph::default();
        g.value_types.insert("x".into(), ValueType::known(DType::F32, &[2, 5, 8]));
        g.initializers.insert("axes".into(), Tensor::from_vec(&[1], vec![-1i64]));
        g.initializers.insert("two".into(), Tensor::from_vec(&[], vec![2f32]));
        g.initializers.insert("eps".into(), Tensor::from_vec(&[], vec![1e-5f32]));
        g.initializers.insert("gamma".into(), Tensor::from_vec(&[8], vec![0.5f32; 8]));
        g.initializers.insert("beta".into(), Tensor::from_vec(&[8], vec![0.25f32; 8]));
        g.nodes.push(node("ReduceMean", "m", &["x", "axes"], &["mu"]));
        g.nodes.push(node("Sub", "d", &["x", "mu"], &["dx"]));
        if square == "Pow" {
            g.nodes.push(node("Pow", "sq", &["dx", "two"], &["d2"]));
        } else {
            g.nodes.push(node("Mul", "sq", &["dx", "dx"], &["d2"]));
        }
        g.nodes.push(node("ReduceMean", "v", &["d2", "axes"], &["var"]));
        g.nodes.push(node("Add", "e", &["eps", "var"], &["ve"]));
        g.nodes.push(node("Sqrt", "s", &["ve"], &["sd"]));
        g.nodes.push(node("Div", "n", &["dx", "sd"], &["xn"]));
        let out = if affine {
            g.nodes.push(node("Mul", "g", &["xn", "gamma"], &["xg"]));
            g.nodes.push(node("Add", "b", &["beta", "xg"], &["y"]));
            "y"
        } else {
            "xn"
        };
        g.outputs.push(aim_ir::ValueInfo { name: out.into(), ty: ValueType::unknown() });
        g
    }

    #[test]
    fn written_out_layer_norms_become_one_node() {
        for (square, affine) in [("Pow", true), ("Mul", true), ("Pow", false)] {
            let mut g = written_out(square, affine);
            run(&mut g).unwrap();
            assert_eq!(g.nodes.len(), 1, "{square} {affine}: {:?}", g.nodes);
            let n = &g.nodes[0];
            assert_eq!(n.op, "LayerNormalization");
            assert_eq!(n.int("axis", 0), -1);
            assert!((n.float("epsilon", 0.0) - 1e-5).abs() < 1e-12);
            assert_eq!(n.inputs.len(), if affine { 3 } else { 2 });
            let scale = &g.initializers[&n.inputs[1]];
            assert_eq!(scale.shape(), &[8]);
            assert_eq!(scale.data::<f32>()[0], if affine { 0.5 } else { 1.0 });
            assert_eq!(n.strings(SOURCES).map(|s| s.len()), Some(if affine { 9 } else { 7 }));
        }
    }

    #[test]
    fn intermediates_read_elsewhere_or_other_axes_stop_the_match() {
        // The centred value read by a third node.
        let mut g = written_out("Pow", true);
        g.nodes.push(node("Relu", "other", &["dx"], &["r"]));
        g.outputs.push(aim_ir::ValueInfo { name: "r".into(), ty: ValueType::unknown() });
        run(&mut g).unwrap();
        assert!(g.nodes.iter().all(|n| n.op != "LayerNormalization"));
        // A mean over the middle axis.
        let mut g = written_out("Pow", true);
        g.initializers.insert("axes".into(), Tensor::from_vec(&[1], vec![1i64]));
        run(&mut g).unwrap();
        assert!(g.nodes.iter().all(|n| n.op != "LayerNormalization"));
        // The variance as a graph output.
        let mut g = written_out("Pow", false);
        g.outputs.push(aim_ir::ValueInfo { name: "var".into(), ty: ValueType::unknown() });
        run(&mut g).unwrap();
        assert!(g.nodes.iter().all(|n| n.op != "LayerNormalization"));
    }
}
