//! Algebraic simplification: nodes that return their input unchanged (Identity, inference
//! Dropout, Cast to the same type, adding 0, multiplying or dividing by 1, Reshape to the same
//! shape) are removed, and back-to-back Transposes and Reshapes collapse into one.

use super::rename::{is_output, replace_uses};
use super::uses::readers;
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node};

/// The constant `name` if every element equals `v`.
fn all_equal(g: &Graph, name: &str, v: f64) -> bool {
    g.initializers.get(name).is_some_and(|t| t.dtype().is_float() && t.to_f64_vec().iter().all(|&x| x == v))
}

/// If `n` returns its input `k` unchanged, `Some(k)`.
fn passthrough(g: &Graph, n: &Node) -> Option<usize> {
    if !n.domain.is_empty() || n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return None;
    }
    let same_type = |k: usize| {
        let a = g.value_type(n.input(k)?)?;
        let b = g.value_type(&n.outputs[0])?;
        (a.dtype.is_some()
            && a.dtype == b.dtype
            && a.shape.is_some()
            && a.shape == b.shape
            && !a.shape.as_ref()?.contains(&aim_ir::Dim::Unknown))
        .then_some(k)
    };
    match n.op.as_str() {
        "Identity" => Some(0),
        "Dropout" if n.input(2).is_none() => Some(0),
        "Cast" => {
            let t = g.value_type(n.input(0)?)?;
            (t.dtype.is_some() && t.dtype == DType::from_onnx_code(n.int("to", 0) as i32)).then_some(0)
        }
        "Add" => (0..2).find(|&k| all_equal(g, n.input(1 - k).unwrap_or(""), 0.0) && same_type(k).is_some()),
        "Sub" => (all_equal(g, n.input(1)?, 0.0)).then(|| same_type(0)).flatten(),
        "Mul" => (0..2).find(|&k| all_equal(g, n.input(1 - k).unwrap_or(""), 1.0) && same_type(k).is_some()),
        "Div" => (all_equal(g, n.input(1)?, 1.0)).then(|| same_type(0)).flatten(),
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => same_type(0),
        _ => None,
    }
}

/// Simplifies until nothing changes.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    loop {
        let mut changed = false;
        let mut i = 0;
        while i < g.nodes.len() {
            let n = &g.nodes[i];
            if let Some(k) = passthrough(g, n) {
                let (out, src) = (n.outputs[0].clone(), n.inputs[k].clone());
                if !is_output(g, &out) {
                    g.nodes.remove(i);
                    replace_uses(g, &out, &src);
                    changed = true;
                    continue;
                }
                if let Some((p, j)) = renamable_producer(g, &src, i) {
                    // A graph output copied from a value that other nodes read too (a
                    // decoder's present key/value, also read by its attention): the
                    // producer writes the output itself, and its readers read that.
                    g.nodes.remove(i);
                    g.nodes[p].outputs[j] = out.clone();
                    replace_uses(g, &src, &out);
                    g.value_types.remove(&src);
                    changed = true;
                    continue;
                }
            }
            if collapse_pair(g, i) {
                changed = true;
                continue;
            }
            i += 1;
        }
        if !changed {
            return Ok(());
        }
    }
}

/// The node (and output slot) of this graph that defines `src`, when node `at` may hand
/// its graph output's name to it: `src` is no graph input, initializer or output, and is
/// defined before `at` in this graph (not in an enclosing one).
fn renamable_producer(g: &Graph, src: &str, at: usize) -> Option<(usize, usize)> {
    if is_output(g, src) || g.initializers.contains_key(src) || g.inputs.iter().any(|v| v.name == src) {
        return None;
    }
    g.nodes[..at].iter().enumerate().find_map(|(p, n)| Some((p, n.outputs.iter().position(|o| o == src)?)))
}

/// Transpose∘Transpose and Reshape∘Reshape where the inner node has no other reader: the
/// outer node reads the inner one's input directly (with the composed permutation).
fn collapse_pair(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    if !n.domain.is_empty() || !matches!(n.op.as_str(), "Transpose" | "Reshape") {
        return false;
    }
    let Some(x) = n.input(0) else { return false };
    let Some(pi) = g.nodes.iter().position(|p| p.outputs.first().map(|s| s.as_str()) == Some(x)) else { return false };
    let p = &g.nodes[pi];
    if p.op != n.op || !p.domain.is_empty() || is_output(g, x) || readers(g).get(x).is_none_or(|r| r.len() != 1) {
        return false;
    }
    let src = p.inputs[0].clone();
    if n.op == "Transpose" {
        let (Some(outer), Some(inner)) = (n.ints("perm").map(|v| v.to_vec()), p.ints("perm").map(|v| v.to_vec()))
        else {
            return false;
        };
        if outer.len() != inner.len() || outer.iter().any(|&v| v < 0 || v as usize >= inner.len()) {
            return false;
        }
        // y[i] = t[outer[i]] = x[inner[outer[i]]].
        let composed: Vec<i64> = outer.iter().map(|&o| inner[o as usize]).collect();
        let identity = composed.iter().enumerate().all(|(k, &v)| v == k as i64);
        let out = n.outputs[0].clone();
        if identity && !is_output(g, &out) {
            g.nodes.remove(i);
            replace_uses(g, &out, &src);
        } else {
            g.nodes[i].inputs[0] = src;
            g.nodes[i].attrs.insert("perm".into(), Attr::Ints(composed));
        }
    } else {
        // Reshape keeps the element order, so only the last target matters (unless it copies
        // dims with 0, which refer to the intermediate shape).
        let zero_copy = g.initializers.get(n.input(1).unwrap_or("")).is_none_or(|t| t.to_i64_vec().contains(&0))
            && n.int("allowzero", 0) == 0;
        if zero_copy {
            return false;
        }
        g.nodes[i].inputs[0] = src;
    }
    // The inner node is now unread; DCE removes it.
    true
}

#[cfg(test)]
mod tests {
    use aim_ir::text::{parse_graph, print_graph, TensorDetail};

    fn simplified(text: &str) -> String {
        let mut g = parse_graph(text).unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        super::run(&mut g).unwrap();
        super::super::dce::run(&mut g).unwrap();
        print_graph(&g, TensorDetail::Full)
    }

    #[test]
    fn a_graph_output_copied_from_a_value_read_elsewhere_is_written_by_its_producer() {
        let t = simplified(
            "graph \"g\" {\n input %x: f32[2,3]\n %c = Concat(%x, %x) {axis=0}  # cat\n %p = Identity(%c)  # id\n %y = Relu(%c)  # relu\n output %p: f32[4,3]\n output %y: f32[4,3]\n}\n",
        );
        assert!(
            !t.contains("Identity") && t.contains("%p: f32[4,3] = Concat(%x, %x)") && t.contains("Relu(%p)"),
            "{t}"
        );
        // An output that is a graph input stays a copy.
        let t = simplified(
            "graph \"g\" {\n input %x: f32[2,3]\n %p = Identity(%x)  # id\n %y = Relu(%x)  # relu\n output %p: f32[2,3]\n output %y: f32[2,3]\n}\n",
        );
        assert!(t.contains("Identity"), "{t}");
    }

    #[test]
    fn identities_and_neutral_constants_go() {
        let t = simplified(
            "graph \"g\" {\n input %x: f32[2,3]\n init %one = f32[] [1.0]\n init %zero = f32[1] [0.0]\n %a = Identity(%x)  # id\n %b = Mul(%a, %one)  # mul1\n %c = Add(%zero, %b)  # add0\n %y = Relu(%c)  # relu\n output %y: f32[2,3]\n}\n",
        );
        assert!(t.contains("%y: f32[2,3] = Relu(%x)") && !t.contains("Mul") && !t.contains("Identity"), "{t}");
    }

    #[test]
    fn broadcasting_neutral_adds_stay() {
        // Adding a [2,3] zero to a [3] value changes the shape: not an identity.
        let t = simplified("graph \"g\" {\n input %x: f32[3]\n init %z = f32[2,3] [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]\n %y = Add(%x, %z)  # a\n output %y: f32[2,3]\n}\n");
        assert!(t.contains("Add"), "{t}");
    }

    #[test]
    fn transposes_compose() {
        let t = simplified(
            "graph \"g\" {\n input %x: f32[2,3,4]\n %a = Transpose(%x) {perm=[1, 0, 2]}  # t1\n %b = Transpose(%a) {perm=[1, 0, 2]}  # t2\n %c = Transpose(%b) {perm=[2, 0, 1]}  # t3\n %d = Transpose(%c) {perm=[0, 2, 1]}  # t4\n output %d: f32[2,4,3]\n}\n",
        );
        assert_eq!(t.matches("Transpose").count(), 1, "{t}");
        assert!(t.contains("Transpose(%x) {perm=[2, 1, 0]}"), "{t}");
    }
}
