//! Static shape and type inference, symbolic where dims are symbolic.
//!
//! Each op's rule derives output types from input types (and from constant inputs, for
//! ops such as Reshape whose output shape is data). Ops without a rule get unknown output
//! types: inference is an aid to the passes and to `aim info`, while the executor always
//! works from real shapes. A rule that finds inputs that cannot go together (Add of f32 and
//! i64, broadcasting 3 against 4, MatMul with mismatched inner dims) is an error naming
//! the node.

use crate::{DType, Dim, Graph, Node, ValueType};

mod aim;
mod data;
mod elementwise;
mod linalg;
mod nn;
mod shape;

/// A type error found by inference.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("node '{node}' ({op}): {msg}")]
pub struct InferError {
    /// The node's name.
    pub node: String,
    /// Its op.
    pub op: String,
    /// What does not fit.
    pub msg: String,
}

/// Infers the type of every node output of `g` (not descending into subgraphs), recording
/// them in `g.value_types`; declared types of graph outputs are kept where they say more.
pub fn infer_types(g: &mut Graph) -> Result<(), InferError> {
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        let ins: Vec<Option<ValueType>> =
            n.inputs.iter().map(|s| if s.is_empty() { None } else { g.value_type(s) }).collect();
        let outs = infer_node(g, n, &ins).map_err(|msg| InferError { node: n.name.clone(), op: n.op.clone(), msg })?;
        let names = n.outputs.clone();
        for (name, ty) in names.iter().zip(outs) {
            if name.is_empty() {
                continue;
            }
            let declared = g.value_types.get(name).cloned();
            let keep = match &declared {
                Some(d) => more_known(d, &ty),
                None => false,
            };
            if !keep {
                g.value_types.insert(name.clone(), ty);
            }
        }
    }
    Ok(())
}

fn known_count(t: &ValueType) -> usize {
    t.dtype.is_some() as usize
        + t.shape.as_ref().map_or(0, |s| 1 + s.iter().filter(|d| !matches!(d, Dim::Unknown)).count())
}

fn more_known(a: &ValueType, b: &ValueType) -> bool {
    known_count(a) > known_count(b)
}

type Ins<'a> = &'a [Option<ValueType>];

fn dtype_of(ins: Ins, i: usize) -> Option<DType> {
    ins.get(i).and_then(|t| t.as_ref()).and_then(|t| t.dtype)
}

fn shape_of(ins: Ins, i: usize) -> Option<Vec<Dim>> {
    ins.get(i).and_then(|t| t.as_ref()).and_then(|t| t.shape.clone())
}

fn same_as(ins: Ins, i: usize) -> ValueType {
    ins.get(i).and_then(|t| t.clone()).unwrap_or_else(ValueType::unknown)
}

/// The broadcast of two shapes under ONNX (numpy) rules.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let da = if i + a.len() >= r { &a[i + a.len() - r] } else { &Dim::Known(1) };
        let db = if i + b.len() >= r { &b[i + b.len() - r] } else { &Dim::Known(1) };
        out.push(match (da, db) {
            (Dim::Known(1), d) | (d, Dim::Known(1)) => d.clone(),
            (Dim::Known(x), Dim::Known(y)) if x != y => {
                return Err(format!("cannot broadcast dimension {x} against {y}"));
            }
            (x, y) if x == y => x.clone(),
            (Dim::Known(x), _) | (_, Dim::Known(x)) => Dim::Known(*x),
            _ => Dim::Unknown,
        });
    }
    Ok(out)
}

fn broadcast_all(ins: Ins, idx: &[usize]) -> Result<Option<Vec<Dim>>, String> {
    let mut acc: Option<Vec<Dim>> = Some(vec![]);
    for &i in idx {
        match (acc, shape_of(ins, i)) {
            (Some(a), Some(b)) => acc = Some(broadcast_dims(&a, &b)?),
            _ => acc = None,
        }
    }
    Ok(acc)
}

fn same_dtype(ins: Ins, idx: &[usize]) -> Result<Option<DType>, String> {
    let mut d: Option<DType> = None;
    for &i in idx {
        if let Some(x) = dtype_of(ins, i) {
            if let Some(prev) = d {
                if prev != x {
                    return Err(format!("inputs must share one element type, found {prev} and {x}"));
                }
            }
            d = Some(x);
        }
    }
    Ok(d)
}

fn const_ints(g: &Graph, n: &Node, i: usize) -> Option<Vec<i64>> {
    let name = n.input(i)?;
    let t = g.initializers.get(name)?;
    if t.dtype().is_int() {
        Some(t.to_i64_vec())
    } else {
        None
    }
}

fn norm_axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if x < 0 || x >= r.max(1) && !(r == 0 && x == 0) {
        return Err(format!("axis {a} is out of range for rank {rank}"));
    }
    Ok(x as usize)
}

fn mul_dims(dims: &[Dim]) -> Dim {
    let mut p = 1usize;
    for d in dims {
        match d {
            Dim::Known(k) => match p.checked_mul(*k) {
                Some(v) => p = v,
                None => return Dim::Unknown, // impossible: the kernel will say so with the value
            },
            _ => return Dim::Unknown,
        }
    }
    Dim::Known(p)
}

/// Ops whose `axis` attribute indexes the dims of input 0 (`[-r, r)`).
const AXIS_OPS: &[&str] = &[
    "ArgMax",
    "ArgMin",
    "Compress",
    "Gather",
    "GatherElements",
    "Hardmax",
    "LayerNormalization",
    "LogSoftmax",
    "LpNormalization",
    "ScatterElements",
    "Softmax",
    "Split",
    "TopK",
];

/// An `axis` attribute out of range for input 0's rank is an error, as in ONNX Runtime
/// (Flatten takes `[-r, r]`).
fn check_axis(n: &Node, ins: Ins) -> Result<(), String> {
    let (Some(a), Some(r)) = (n.opt_int("axis"), shape_of(ins, 0).map(|s| s.len() as i64)) else { return Ok(()) };
    let ok = match n.op.as_str() {
        "Flatten" => (-r..=r).contains(&a),
        op if AXIS_OPS.contains(&op) => (-r..r).contains(&a) || (r == 0 && a == 0 && op == "Compress"),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("axis {a} is out of range for an input of rank {r}"))
    }
}

/// One op's inference rule: its node's output types from its inputs' types (and, for ops
/// whose output shape is data, from the graph's constants), or the error that they do not
/// go together.
type Rule = fn(&Graph, &Node, Ins) -> Result<Vec<ValueType>, String>;

/// The default domain's rules by family: each family's file holds its ops' rules, and an op
/// is found here by name. `tests::every_op_has_one_rule` checks that no op is listed twice
/// and that every one is an ONNX op.
const FAMILIES: &[(&[&str], Rule)] = &[
    (elementwise::UNARY_SAME, elementwise::unary),
    (elementwise::BINARY_SAME, elementwise::binary),
    (&["Pow"], elementwise::binary),
    (elementwise::COMPARE, elementwise::compare),
    (&["IsNaN", "IsInf"], elementwise::is_special),
    (&["Where"], elementwise::where_),
    (&["Cast"], elementwise::cast),
    (&["CastLike"], elementwise::cast_like),
    (&["MatMul", "MatMulInteger"], linalg::matmul),
    (&["Gemm"], linalg::gemm),
    (&["Conv", "ConvInteger", "MaxPool", "AveragePool", "LpPool"], linalg::window),
    (&["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"], linalg::global_pool),
    (&["Shape"], shape::shape),
    (&["Size"], shape::size),
    (&["Flatten"], shape::flatten),
    (&["Reshape"], shape::reshape),
    (&["Transpose"], shape::transpose),
    (&["Concat"], shape::concat),
    (&["Unsqueeze", "Squeeze"], shape::squeeze),
    (&["Gather"], shape::gather),
    (shape::REDUCE, shape::reduce),
    (&["Constant"], shape::constant),
    (&["ConstantOfShape"], shape::constant_of_shape),
    (data::OPS, data::infer),
    (nn::OPS, nn::infer),
];

/// The rule of default-domain op `op`, if it has one.
fn rule(op: &str) -> Option<Rule> {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<&'static str, Rule>> = std::sync::OnceLock::new();
    let table =
        TABLE.get_or_init(|| FAMILIES.iter().flat_map(|&(ops, r)| ops.iter().map(move |&op| (op, r))).collect());
    table.get(op).copied()
}

/// Unknown types for every output of `n`.
fn unknown(n: &Node) -> Vec<ValueType> {
    vec![ValueType::unknown(); n.outputs.len()]
}

/// One output of this type and shape.
fn one(dtype: Option<DType>, shape: Option<Vec<Dim>>) -> Result<Vec<ValueType>, String> {
    Ok(vec![ValueType { dtype, shape }])
}

fn infer_node(g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    if let Some(custom) = crate::custom::lookup(&n.domain, &n.op) {
        return crate::custom::infer(&*custom, n, ins);
    }
    if n.domain == "aim" {
        return Ok(aim::infer(g, n, ins));
    }
    if !n.domain.is_empty() && n.domain != "ai.onnx" {
        return Ok(unknown(n));
    }
    check_axis(n, ins)?;
    match rule(&n.op) {
        Some(r) => r(g, n, ins),
        None => Ok(unknown(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_graph;

    fn ty(g: &Graph, v: &str) -> String {
        g.value_types.get(v).map(|t| t.to_string()).unwrap_or_default()
    }

    /// Squeeze's axes as an attribute (before opset 13) are the axes squeezed, negative
    /// ones included, and axes computed at run time leave the shape unknown: neither is
    /// every dim of 1 (the output's computed type once came out `[3,5]` for `[1,3,5]`).
    #[test]
    fn squeeze_reads_its_axes_attribute() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[1,3,1,5]\n input %a: i64[1]\n %y = Squeeze(%x) {axes=[-2]}  # sq\n %z = Squeeze(%x, %a)  # run_time_axes\n output %y: f32[*]\n output %z: f32[*]\n}\n",
        )
        .unwrap();
        infer_types(&mut g).unwrap();
        assert_eq!(ty(&g, "y"), "f32[1,3,5]");
        // Axes known only at run time: no shape is guessed.
        assert!(g.value_types.get("z").is_none_or(|t| t.shape.is_none()), "{}", ty(&g, "z"));
    }

    /// Each op is in one family (a second listing would be shadowed by whichever the table
    /// took last), every op listed is an ONNX op, and each family's rule answers for it.
    #[test]
    fn every_op_has_one_rule() {
        let mut seen = std::collections::BTreeSet::new();
        for &(ops, r) in FAMILIES {
            for &op in ops {
                assert!(seen.insert(op), "{op} is listed twice");
                assert!(crate::schema::lookup("", op).is_some(), "{op} is not an ONNX op");
                let n = Node {
                    name: "n".into(),
                    op: op.into(),
                    domain: String::new(),
                    inputs: vec![],
                    outputs: vec!["y".into()],
                    attrs: Default::default(),
                };
                let g = Graph::default();
                // No input types: every rule answers (types unknown or an error), never panics.
                let _ = r(&g, &n, &[]);
            }
        }
    }

    #[test]
    fn symbolic_dims_flow_through() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[N,4]\n input %w: f32[4,8]\n %y = MatMul(%x, %w)  # mm\n %z = Relu(%y)  # r\n %s = Shape(%z)  # s\n output %z: f32[N,8]\n}\n",
        )
        .unwrap();
        infer_types(&mut g).unwrap();
        assert_eq!(ty(&g, "y"), "f32[N,8]");
        assert_eq!(ty(&g, "z"), "f32[N,8]");
        assert_eq!(ty(&g, "s"), "i64[2]");
    }

    #[test]
    fn conv_and_pool_shapes() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[1,3,224,224]\n input %w: f32[64,3,7,7]\n %y = Conv(%x, %w) {pads=[3, 3, 3, 3], strides=[2, 2]}  # c\n %p = MaxPool(%y) {kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]}  # p\n output %p: f32[*]\n}\n",
        )
        .unwrap();
        infer_types(&mut g).unwrap();
        assert_eq!(ty(&g, "y"), "f32[1,64,112,112]");
        assert_eq!(ty(&g, "p"), "f32[1,64,56,56]");
    }

    #[test]
    fn mismatches_are_errors_naming_the_node() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %a: f32[3]\n input %b: f32[4]\n %c = Add(%a, %b)  # the_add\n output %c: f32[*]\n}\n",
        )
        .unwrap();
        let e = infer_types(&mut g).unwrap_err();
        assert_eq!(e.node, "the_add");
        let mut g = parse_graph(
            "graph \"g\" {\n input %a: f32[3]\n input %b: i64[3]\n %c = Add(%a, %b)  # x\n output %c: f32[*]\n}\n",
        )
        .unwrap();
        assert!(infer_types(&mut g).is_err());
    }
}
