//! The op schema table: for every default-domain ONNX op, its inputs and outputs (which
//! are required, optional or variadic) and its attributes (type, required), plus the value
//! rules aim adds (strides are positive, `auto_pad` is one of four words, ...).
//!
//! It is the one place that knows an op's signature: the verifier checks every node
//! against it before any pass or backend sees the graph, so both backends refuse the same
//! malformed nodes with the same message, and kernels and passes can rely on arity and
//! attribute types. The ONNX part is generated from the pinned onnx package
//! (`tools/gen_op_schema.py`, at the newest opset, the form the importer normalises every
//! model to); adding an op to aim needs no change here unless it has value rules.

mod aim;
mod onnx;
mod rules;

pub use aim::{aim_op, retain_known_attrs, AimOp, Kernel, Quantized};

use crate::{Attr as Value, Node};

/// One formal input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// Required.
    One(&'static str),
    /// Optional: may be absent (an empty name, or left off the end).
    Opt(&'static str),
    /// Variadic, with at least this many values: always the last parameter.
    Var(&'static str, usize),
}

/// The type an attribute must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrKind {
    /// One integer.
    Int,
    /// One float.
    Float,
    /// A string.
    String,
    /// A tensor.
    Tensor,
    /// A subgraph.
    Graph,
    /// A list of integers.
    Ints,
    /// A list of floats.
    Floats,
    /// A list of strings.
    Strings,
    /// A kind aim does not represent (type protos, lists of graphs or tensors).
    Other,
}

/// The value an attribute has when a node leaves it out, as the op's schema states it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AttrDefault {
    /// One integer.
    Int(i64),
    /// One float.
    Float(f32),
    /// A string.
    String(&'static str),
    /// A list of integers.
    Ints(&'static [i64]),
    /// A list of floats.
    Floats(&'static [f32]),
    /// A list of strings.
    Strings(&'static [&'static str]),
}

/// One attribute an op takes.
#[derive(Clone, Copy, Debug)]
pub struct Attr {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: AttrKind,
    /// Whether a node must give it.
    pub required: bool,
    /// Its value when left out, where the schema states one.
    pub default: Option<AttrDefault>,
}

/// An op's signature.
#[derive(Clone, Copy, Debug)]
pub struct OpSchema {
    /// The op type.
    pub op: &'static str,
    /// The opset version this signature is from.
    pub since: i64,
    /// Formal inputs, in order.
    pub inputs: &'static [Param],
    /// Formal outputs, in order.
    pub outputs: &'static [Param],
    /// Attributes, sorted by name.
    pub attrs: &'static [Attr],
}

/// The schema of `op` in `domain` (the default domain or `aim`), if aim knows one.
pub fn lookup(domain: &str, op: &str) -> Option<&'static OpSchema> {
    match domain {
        "" | "ai.onnx" => onnx::ONNX_OPS.binary_search_by(|s| s.op.cmp(op)).ok().map(|i| &onnx::ONNX_OPS[i]),
        "aim" => aim_op(op).map(|o| &o.schema),
        _ => None,
    }
}

/// The default the schema of `op` in `domain` states for its attribute `name`: what a
/// kernel or pass reads when a node leaves the attribute out, so that ONNX's defaults are
/// written once (generated from the onnx package) rather than at every use.
pub fn default_of(domain: &str, op: &str, name: &str) -> Option<AttrDefault> {
    let s = lookup(domain, op)?;
    s.attrs.binary_search_by(|a| a.name.cmp(name)).ok().and_then(|i| s.attrs[i].default)
}

/// Checks a node against its op's schema (arity, required operands, attribute types and
/// required attributes) and aim's value rules. Other domains' ops and default-domain ops
/// without a schema pass (the supported-op check reports them), and attributes an ONNX
/// op's schema does not name are left alone; an `aim` node must be an op of
/// [`aim_op`]'s table and carry only the attributes its row names.
pub fn check(n: &Node) -> Result<(), String> {
    let Some(s) = lookup(&n.domain, &n.op) else {
        if n.domain == "aim" {
            return Err(format!("'{}' is not an op of the aim domain (which only aim's compiler writes)", n.op));
        }
        return Ok(());
    };
    check_params("input", &n.inputs, s.inputs)?;
    check_params("output", &n.outputs, s.outputs)?;
    for a in s.attrs {
        match n.attrs.get(a.name) {
            None if a.required => return Err(format!("attribute '{}' is required", a.name)),
            None => {}
            Some(v) if a.kind != AttrKind::Other && kind_of(v) != a.kind => {
                return Err(format!(
                    "attribute '{}' must be {}, got {}",
                    a.name,
                    describe(a.kind),
                    describe(kind_of(v))
                ))
            }
            Some(_) => {}
        }
    }
    if n.domain == "aim" {
        aim::check(n, s)?;
    }
    rules::check(n)
}

/// The kind of an attribute value.
fn kind_of(v: &Value) -> AttrKind {
    match v {
        Value::Int(_) => AttrKind::Int,
        Value::Float(_) => AttrKind::Float,
        Value::String(_) => AttrKind::String,
        Value::Tensor(_) => AttrKind::Tensor,
        Value::Graph(_) => AttrKind::Graph,
        Value::Ints(_) => AttrKind::Ints,
        Value::Floats(_) => AttrKind::Floats,
        Value::Strings(_) => AttrKind::Strings,
    }
}

fn describe(k: AttrKind) -> &'static str {
    match k {
        AttrKind::Int => "an integer (INT)",
        AttrKind::Float => "a float (FLOAT)",
        AttrKind::String => "a string (STRING)",
        AttrKind::Tensor => "a tensor (TENSOR)",
        AttrKind::Graph => "a graph (GRAPH)",
        AttrKind::Ints => "a list of integers (INTS)",
        AttrKind::Floats => "a list of floats (FLOATS)",
        AttrKind::Strings => "a list of strings (STRINGS)",
        AttrKind::Other => "another kind",
    }
}

/// Checks the operands `given` (names; "" = absent) against the formal `params`.
fn check_params(what: &str, given: &[String], params: &[Param]) -> Result<(), String> {
    let variadic = params.last().and_then(|p| match p {
        Param::Var(_, min) => Some(*min),
        _ => None,
    });
    let fixed = params.len() - variadic.is_some() as usize;
    match variadic {
        None if given.len() > fixed => {
            return Err(format!("takes at most {fixed} {what}s, got {}", given.len()));
        }
        Some(min) if given.len() < fixed + min => {
            let name = match params[fixed] {
                Param::Var(n, _) => n,
                _ => unreachable!("the last parameter is variadic"),
            };
            return Err(format!(
                "needs at least {min} value(s) of variadic {what} '{name}', got {}",
                given.len() - fixed.min(given.len())
            ));
        }
        _ => {}
    }
    for (i, p) in params.iter().take(fixed).enumerate() {
        if let Param::One(name) = p {
            if given.get(i).is_none_or(|s| s.is_empty()) && what == "input" {
                return Err(format!("{what} {i} ('{name}') is required"));
            }
            if i >= given.len() {
                return Err(format!("{what} {i} ('{name}') is required"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(op: &str, ins: &[&str], outs: &[&str], attrs: &[(&str, Value)]) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            domain: String::new(),
            inputs: ins.iter().map(|s| s.to_string()).collect(),
            outputs: outs.iter().map(|s| s.to_string()).collect(),
            attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn the_table_is_sorted_and_knows_the_common_ops() {
        assert!(onnx::ONNX_OPS.windows(2).all(|w| w[0].op < w[1].op));
        for op in ["Conv", "MatMul", "Concat", "If", "Loop", "Scan", "Resize", "BatchNormalization"] {
            assert!(lookup("", op).is_some(), "{op}");
        }
    }

    #[test]
    fn arity_and_attribute_types_are_checked() {
        assert!(check(&node("Relu", &["x"], &["y"], &[])).is_ok());
        assert!(check(&node("Conv", &[], &["y"], &[])).unwrap_err().contains("'X') is required"));
        assert!(check(&node("BatchNormalization", &["x"], &["y"], &[])).is_err());
        assert!(check(&node("Relu", &["x", "z"], &["y"], &[])).unwrap_err().contains("at most 1 input"));
        let floats = Value::Floats(vec![1.0, 1.0]);
        assert!(check(&node("Conv", &["x", "w"], &["y"], &[("strides", floats)])).unwrap_err().contains("INTS"));
        assert!(check(&node("Conv", &["x", "w"], &["y"], &[("group", Value::Ints(vec![1]))])).is_err());
        assert!(check(&node("Transpose", &["x"], &["y"], &[("perm", Value::String("0".into()))])).is_err());
        assert!(check(&node("Concat", &["a", "b"], &["y"], &[])).unwrap_err().contains("'axis' is required"));
        assert!(check(&node("Concat", &[], &["y"], &[("axis", Value::Int(0))])).is_err());
        assert!(check(&node("Loop", &["", "", "v"], &["w"], &[("body", Value::Graph(Box::default()))])).is_ok());
    }

    #[test]
    fn defaults_come_from_the_table() {
        for op in ["BatchNormalization", "GroupNormalization", "InstanceNormalization", "LayerNormalization"] {
            assert_eq!(default_of("", op, "epsilon"), Some(AttrDefault::Float(1e-5)), "{op}");
            assert_eq!(node(op, &["x"], &["y"], &[]).float_attr("epsilon"), 1e-5, "{op}");
        }
        assert_eq!(
            node("LayerNormalization", &["x"], &["y"], &[("epsilon", Value::Float(1e-3))]).float_attr("epsilon"),
            1e-3
        );
        assert_eq!(default_of("", "Resize", "mode"), Some(AttrDefault::String("nearest")));
        assert_eq!(default_of("", "Conv", "strides"), None);
        assert!(node("Conv", &["x"], &["y"], &[]).float_attr("alpha").is_nan());
    }

    fn aim(op: &str, ins: &[&str], attrs: &[(&str, Value)]) -> Node {
        Node { domain: "aim".into(), ..node(op, ins, &["y"], attrs) }
    }

    #[test]
    fn aim_nodes_are_checked_against_their_rows() {
        let sources = ("sources", Value::Strings(vec!["conv".into()]));
        assert!(check(&aim("Conv", &["x", "w", "", "r"], std::slice::from_ref(&sources))).is_ok());
        assert!(check(&aim("Conv", &["x"], &[])).unwrap_err().contains("'W') is required"));
        assert!(check(&aim("Conv", &["x", "w"], &[("kernal", Value::Int(1))]))
            .unwrap_err()
            .contains("'kernal' is not one"));
        assert!(check(&aim("Transpose", &["x"], &[])).unwrap_err().contains("'perm' is required"));
        assert!(check(&aim("Reduce", &["x"], &[("axis", Value::Int(1)), ("mode", Value::String("prod".into()))]))
            .unwrap_err()
            .contains("'mode' is 'prod'"));
        assert!(check(&aim("ToBlocked", &["x"], &[("block", Value::Int(0))])).unwrap_err().contains("positive"));
        assert!(check(&aim("Quantize8", &["x"], &[("scale", Value::Float(0.1)), ("zero", Value::Float(3.0))]))
            .unwrap_err()
            .contains("INT"));
        assert!(check(&aim("Elementwise", &[], &[("program", Value::Strings(vec!["in 0".into()]))])).is_err());
        assert!(check(&aim("Sum8", &["x"], &[])).unwrap_err().contains("not an op of the aim domain"));
        // Other domains stay the supported-op check's business.
        assert!(check(&Node { domain: "com.example".into(), ..node("Anything", &[], &[], &[]) }).is_ok());
    }
}
