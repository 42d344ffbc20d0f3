//! The graph IR: a model is a graph of nodes whose edges are named values, as in ONNX.
//!
//! Values are named by strings so that a subgraph (the body of `If`, `Loop`, `Scan`) can
//! refer to values of the graph around it by name, exactly as ONNX scoping works. Nodes are
//! kept in a topological order (the verifier checks it); an empty input name is an absent
//! optional input.

use crate::{Tensor, ValueType};
use std::collections::BTreeMap;

/// A node attribute, after import. Per-opset attributes that later became inputs are
/// already turned into inputs by the importer, so kernels see one form.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// A single integer.
    Int(i64),
    /// A single float.
    Float(f32),
    /// A string (ONNX bytes, decoded as UTF-8 with replacement).
    String(String),
    /// A constant tensor.
    Tensor(Tensor),
    /// A subgraph (the branches of `If`, the body of `Loop` and `Scan`).
    Graph(Box<Graph>),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A list of floats.
    Floats(Vec<f32>),
    /// A list of strings.
    Strings(Vec<String>),
}

/// One operation. `op` is the ONNX op type (in `domain`, empty for the default domain).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The node's name: the ONNX node name, or one made up at import (`Add_3`) when the
    /// model had none. Every later stage names this to say where its code came from.
    pub name: String,
    /// The op type, e.g. `Conv`.
    pub op: String,
    /// The op's domain: "" for the default ONNX domain.
    pub domain: String,
    /// Input value names; "" marks an absent optional input.
    pub inputs: Vec<String>,
    /// Output value names; "" marks an output that is not wanted.
    pub outputs: Vec<String>,
    /// Attributes, ordered by name so printing is deterministic.
    pub attrs: BTreeMap<String, Attr>,
}

/// A graph input or output, or any value whose type is recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    /// The value's name.
    pub name: String,
    /// Its static type, as declared or inferred.
    pub ty: ValueType,
}

/// A graph: its inputs, constant initializers, nodes in topological order and outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// The graph's name.
    pub name: String,
    /// Runtime inputs, in order. (Initializers are not listed here, even when an old ONNX
    /// model listed them as inputs too.)
    pub inputs: Vec<ValueInfo>,
    /// Outputs, in order.
    pub outputs: Vec<ValueInfo>,
    /// Constant tensors (weights), by value name.
    pub initializers: BTreeMap<String, Tensor>,
    /// Nodes, in topological order.
    pub nodes: Vec<Node>,
    /// Static types of intermediate values, as declared by the model or inferred.
    pub value_types: BTreeMap<String, ValueType>,
}

/// A whole model: the main graph and the opset it was written against.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    /// The main graph.
    pub graph: Graph,
    /// The default-domain opset version the model declared (after import, the IR is in
    /// aim's canonical form, but the version is kept for reporting).
    pub opset: i64,
    /// The producer named in the file, for `aim info`.
    pub producer: String,
    /// The model's doc string, kept for `aim info` and in compiled `.aim` files.
    pub doc: String,
    /// The model's `metadata_props` (key, value), in file order: what exporters record
    /// (versions, labels, preprocessing) and hosts read back.
    pub metadata: Vec<(String, String)>,
}

impl Node {
    /// An integer attribute, or `default` if absent.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        match self.attrs.get(name) {
            Some(Attr::Int(v)) => *v,
            _ => default,
        }
    }

    /// An integer attribute that may be absent.
    pub fn opt_int(&self, name: &str) -> Option<i64> {
        match self.attrs.get(name) {
            Some(Attr::Int(v)) => Some(*v),
            _ => None,
        }
    }

    /// Float attribute `name` as the node gives it, else the default its op's schema
    /// states (`crate::schema::default_of`: ONNX's own defaults, generated from the onnx
    /// package), so a default is written once. Only for attributes whose schema has a
    /// default: one neither given nor defaulted reads as NaN.
    pub fn float_attr(&self, name: &str) -> f32 {
        match self.attrs.get(name) {
            Some(Attr::Float(v)) => *v,
            Some(Attr::Int(v)) => *v as f32,
            // The table is searched only for an attribute the node leaves out.
            _ => match crate::schema::default_of(&self.domain, &self.op, name) {
                Some(crate::schema::AttrDefault::Float(v)) => v,
                _ => f32::NAN,
            },
        }
    }

    /// A float attribute, or `default` if absent.
    pub fn float(&self, name: &str, default: f32) -> f32 {
        match self.attrs.get(name) {
            Some(Attr::Float(v)) => *v,
            Some(Attr::Int(v)) => *v as f32,
            _ => default,
        }
    }

    /// A string attribute, or `default` if absent.
    pub fn string<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        match self.attrs.get(name) {
            Some(Attr::String(v)) => v,
            _ => default,
        }
    }

    /// An integer-list attribute, if present.
    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        match self.attrs.get(name) {
            Some(Attr::Ints(v)) => Some(v),
            _ => None,
        }
    }

    /// A float-list attribute, if present.
    pub fn floats(&self, name: &str) -> Option<&[f32]> {
        match self.attrs.get(name) {
            Some(Attr::Floats(v)) => Some(v),
            _ => None,
        }
    }

    /// A string-list attribute, if present.
    pub fn strings(&self, name: &str) -> Option<&[String]> {
        match self.attrs.get(name) {
            Some(Attr::Strings(v)) => Some(v),
            _ => None,
        }
    }

    /// A subgraph attribute, if present.
    pub fn graph(&self, name: &str) -> Option<&Graph> {
        match self.attrs.get(name) {
            Some(Attr::Graph(g)) => Some(g),
            _ => None,
        }
    }

    /// A tensor attribute, if present.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        match self.attrs.get(name) {
            Some(Attr::Tensor(t)) => Some(t),
            _ => None,
        }
    }

    /// The name of input `i`, if given and not empty.
    pub fn input(&self, i: usize) -> Option<&str> {
        self.inputs.get(i).map(|s| s.as_str()).filter(|s| !s.is_empty())
    }
}

impl Graph {
    /// The static type known for a value: a graph input, an initializer, or a typed
    /// intermediate.
    pub fn value_type(&self, name: &str) -> Option<ValueType> {
        if let Some(t) = self.initializers.get(name) {
            return Some(ValueType::known(t.dtype(), t.shape()));
        }
        let inferred = self.value_types.get(name);
        if let Some(v) = self.inputs.iter().chain(&self.outputs).find(|v| v.name == name) {
            // An output declared with symbolic dims that inference has made static (a graph
            // specialised to static input shapes) has the static type.
            if let Some(t) = inferred.filter(|t| v.ty.concrete_shape().is_none() && v.ty.is_made_static_by(t)) {
                return Some(t.clone());
            }
            // An output whose declared shape the computation contradicts (exporters write
            // stale ones, e.g. `[1, seqlen]` for a `[32, 1, 8210]` result; ONNX Runtime only
            // warns and returns the computed tensor, as aim does): the computed static type,
            // so that a specialised program is still planned instead of run node by node.
            let output = self.outputs.iter().any(|o| o.name == name);
            if let Some(t) = inferred.filter(|t| {
                output
                    && t.concrete_shape().is_some()
                    && t.dtype.is_some()
                    && v.ty.dtype.is_none_or(|d| t.dtype == Some(d))
            }) {
                return Some(t.clone());
            }
            if v.ty.dtype.is_some() || v.ty.shape.is_some() {
                return Some(v.ty.clone());
            }
        }
        inferred.cloned()
    }

    /// Every value name this graph reads — node inputs and graph outputs — including inside
    /// subgraphs (whose reads of enclosing values are what liveness must account for).
    pub fn names_read(&self, out: &mut Vec<String>) {
        for n in &self.nodes {
            out.extend(n.inputs.iter().filter(|s| !s.is_empty()).cloned());
            for a in n.attrs.values() {
                if let Attr::Graph(g) = a {
                    g.names_read(out);
                }
            }
        }
        out.extend(self.outputs.iter().map(|o| o.name.clone()));
    }

    /// The number of nodes, counting those inside subgraphs.
    pub fn node_count_deep(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| {
                1 + n
                    .attrs
                    .values()
                    .map(|a| if let Attr::Graph(g) = a { g.node_count_deep() } else { 0 })
                    .sum::<usize>()
            })
            .sum()
    }

    /// Every (domain, op) used, counting subgraphs, with the names of the nodes that use it.
    pub fn op_uses(&self) -> BTreeMap<(String, String), Vec<String>> {
        let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        self.collect_op_uses(&mut out);
        out
    }

    fn collect_op_uses(&self, out: &mut BTreeMap<(String, String), Vec<String>>) {
        for n in &self.nodes {
            out.entry((n.domain.clone(), n.op.clone())).or_default().push(n.name.clone());
            for a in n.attrs.values() {
                if let Attr::Graph(g) = a {
                    g.collect_op_uses(out);
                }
            }
        }
    }
}
