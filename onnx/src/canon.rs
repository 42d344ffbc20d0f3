//! Opset normalisation: every default-domain node is rewritten into the form of the newest
//! opset aim knows, so that kernels and passes see one form per op. Attributes that later
//! opsets turned into inputs become constant inputs; ops whose meaning changed are
//! expressed with ops of the current meaning.

use super::ImportError;
use aim_ir::{Attr, Graph, Node, Tensor};
use std::collections::BTreeMap;

/// Adds a constant to the graph under a name derived from the node, returning the name.
fn add_const(g: &mut Graph, node: &Node, what: &str, t: Tensor) -> String {
    let mut name = format!("{}::{what}", node.name);
    while g.initializers.contains_key(&name) {
        name.push('_');
    }
    g.initializers.insert(name.clone(), t);
    name
}

/// Moves integer-list attribute `attr` to input position `pos` as an i64 constant.
fn ints_to_input(g: &mut Graph, n: &mut Node, attr: &str, pos: usize) {
    if let Some(Attr::Ints(v)) = n.attrs.remove(attr) {
        let name = add_const(g, n, attr, Tensor::from_i64(&[v.len()], v));
        set_input(n, pos, name);
    }
}

fn set_input(n: &mut Node, pos: usize, name: String) {
    while n.inputs.len() <= pos {
        n.inputs.push(String::new());
    }
    n.inputs[pos] = name;
}

fn bad(n: &Node, reason: &str) -> ImportError {
    ImportError::BadNode { node: n.name.clone(), op: n.op.clone(), reason: reason.to_string() }
}

/// Rewrites `n` (of a model at `opset`) into canonical form and appends it to `g`.
pub(crate) fn canonicalize(mut n: Node, opset: i64, g: &mut Graph) -> Result<(), ImportError> {
    let op = n.op.clone();
    if matches!(
        op.as_str(),
        "Conv" | "ConvTranspose" | "ConvInteger" | "QLinearConv" | "MaxPool" | "AveragePool" | "LpPool"
    ) {
        // An empty list is the default, as ONNX Runtime reads it (the IR has no empty lists
        // for these: the verifier refuses them).
        for name in ["strides", "dilations", "pads", "kernel_shape"] {
            if n.ints(name).is_some_and(|v| v.is_empty()) {
                n.attrs.remove(name);
            }
        }
    }
    match op.as_str() {
        "Squeeze" | "Unsqueeze" if opset < 13 => ints_to_input(g, &mut n, "axes", 1),
        "ReduceSum" if opset < 13 => ints_to_input(g, &mut n, "axes", 1),
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2" | "ReduceLogSum"
        | "ReduceLogSumExp" | "ReduceSumSquare"
            if opset < 18 =>
        {
            ints_to_input(g, &mut n, "axes", 1)
        }
        "Split" if opset < 13 => ints_to_input(g, &mut n, "split", 1),
        "Slice" if opset < 10 => {
            ints_to_input(g, &mut n, "starts", 1);
            ints_to_input(g, &mut n, "ends", 2);
            ints_to_input(g, &mut n, "axes", 3);
        }
        "TopK" if opset < 10 => {
            let k = n.opt_int("k").ok_or_else(|| bad(&n, "attribute 'k' is required before opset 10"))?;
            n.attrs.remove("k");
            let name = add_const(g, &n, "k", Tensor::from_i64(&[1], vec![k]));
            set_input(&mut n, 1, name);
        }
        "Pad" if opset < 11 => {
            ints_to_input(g, &mut n, "pads", 1);
            if let Some(Attr::Float(v)) = n.attrs.remove("value") {
                let name = add_const(g, &n, "value", Tensor::scalar(v));
                set_input(&mut n, 2, name);
            }
        }
        "Clip" if opset < 11 => {
            for (attr, pos) in [("min", 1), ("max", 2)] {
                if let Some(Attr::Float(v)) = n.attrs.remove(attr) {
                    let name = add_const(g, &n, attr, Tensor::scalar(v));
                    set_input(&mut n, pos, name);
                }
            }
        }
        "Dropout" if opset < 12 => {
            n.attrs.clear();
            n.inputs.truncate(1);
        }
        "BatchNormalization" => {
            n.attrs.remove("spatial");
            n.attrs.remove("consumed_inputs");
        }
        "Scatter" => n.op = "ScatterElements".into(),
        "Upsample" | "Resize" if op == "Upsample" || opset < 11 => {
            // Upsample and Resize-10 scale with the asymmetric transform and floor rounding.
            if let Some(Attr::Floats(s)) = n.attrs.remove("scales") {
                let name = add_const(g, &n, "scales", Tensor::from_slice(&[s.len()], &s));
                set_input(&mut n, 1, name);
            }
            let scales = n.input(1).ok_or_else(|| bad(&n, "scales are required"))?.to_string();
            n.inputs = vec![n.inputs[0].clone(), String::new(), scales];
            n.op = "Resize".into();
            let mode = n.string("mode", "nearest").to_string();
            n.attrs.insert("mode".into(), Attr::String(mode));
            n.attrs.insert("coordinate_transformation_mode".into(), Attr::String("asymmetric".into()));
            n.attrs.insert("nearest_mode".into(), Attr::String("floor".into()));
        }
        "Softmax" | "LogSoftmax" | "Hardmax" if opset < 13 => {
            // Before opset 13 these flattened the input to 2-D at `axis` and normalised the rows.
            let axis = n.int("axis", 1);
            let (x, y) =
                (n.inputs.first().cloned().unwrap_or_default(), n.outputs.first().cloned().unwrap_or_default());
            let shape = format!("{}::shape", n.name);
            let flat = format!("{}::flat", n.name);
            let flat_out = format!("{}::flat_out", n.name);
            let mk =
                |name: String, op: &str, inputs: Vec<String>, outputs: Vec<String>, attrs: BTreeMap<String, Attr>| {
                    Node { name, op: op.into(), domain: String::new(), inputs, outputs, attrs }
                };
            g.nodes.push(mk(
                format!("{}::Shape", n.name),
                "Shape",
                vec![x.clone()],
                vec![shape.clone()],
                BTreeMap::new(),
            ));
            g.nodes.push(mk(
                format!("{}::Flatten", n.name),
                "Flatten",
                vec![x],
                vec![flat.clone()],
                BTreeMap::from([("axis".to_string(), Attr::Int(axis))]),
            ));
            g.nodes.push(mk(
                n.name.clone(),
                &op,
                vec![flat],
                vec![flat_out.clone()],
                BTreeMap::from([("axis".to_string(), Attr::Int(-1))]),
            ));
            g.nodes.push(mk(
                format!("{}::Reshape", n.name),
                "Reshape",
                vec![flat_out, shape],
                vec![y],
                BTreeMap::new(),
            ));
            return Ok(());
        }
        _ => {}
    }
    g.nodes.push(n);
    Ok(())
}
