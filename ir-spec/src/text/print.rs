//! Printing the IR as text: one line per node, with output types and the source node name.
//!
//! ```text
//! graph "mlp" {
//!   input %x: f32[N,784]
//!   init %w: f32[784,512] <401408 values>
//!   %h: f32[N,512] = Gemm(%x, %w, %b) {transB=1}  # /fc1/Gemm
//!   output %h
//! }
//! ```

use super::quote_name;
use crate::{Attr, DType, Graph, Model, Node, Tensor, ValueType};
use half::{bf16, f16};
use std::cell::RefCell;
use std::fmt::Write;

/// How much of each constant tensor to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorDetail {
    /// Every value, so that the text parses back to the same graph.
    Full,
    /// Values of tensors with at most this many elements; larger ones print as
    /// `<N values>` (for people; such text does not parse back).
    Summary(usize),
}

/// Where constant tensors go as the printer meets them.
#[derive(Clone, Copy)]
enum Mode<'a> {
    /// Written out as literals, in full or summarised.
    Inline(TensorDetail),
    /// Tensors of more than [`INLINE_MAX`] elements added to a table and printed as
    /// `@index` references into it; smaller ones written out in full.
    Table(&'a RefCell<ConstantTable>),
}

/// The constants of one or more printed models, each distinct tensor once: a tensor equal
/// to one already in the table (same dtype, shape and bytes) is referenced by that one's
/// index. That is how the programs of a multi-target `.aim` file share the weights their
/// targets agree on, and how a model reading one weight twice stores it once.
#[derive(Default)]
pub struct ConstantTable {
    /// The tensors, in the order first printed.
    pub tensors: Vec<Tensor>,
    /// FNV-1a 64 of each tensor's bytes (see `aim_file::fnv1a64`), by index.
    pub checksums: Vec<u64>,
    /// Which of the printed models reference each tensor, by index: bit `i` for model `i`
    /// (models past the 64th share bit 63).
    pub users: Vec<u64>,
    /// The model being printed.
    current: usize,
    by_checksum: std::collections::HashMap<u64, Vec<usize>>,
}

impl ConstantTable {
    /// The index of `t` in the table, added if no equal tensor is there yet.
    pub fn index_of(&mut self, t: &Tensor) -> usize {
        let h = crate::aim_file::fnv1a64(t.bytes());
        let same = |u: &Tensor| u.dtype() == t.dtype() && u.shape() == t.shape() && u.bytes() == t.bytes();
        let slot = self.by_checksum.entry(h).or_default();
        let bit = 1u64 << self.current.min(63);
        if let Some(&k) = slot.iter().find(|&&k| same(&self.tensors[k])) {
            self.users[k] |= bit;
            return k;
        }
        slot.push(self.tensors.len());
        self.tensors.push(t.clone());
        self.checksums.push(h);
        self.users.push(bit);
        self.tensors.len() - 1
    }
}

/// The most elements a tensor printed with [`print_model_with_data`] has to be written out
/// in the text rather than referenced.
pub const INLINE_MAX: usize = 16;

/// Prints a model: its opset line, then its main graph.
pub fn print_model(m: &Model, detail: TensorDetail) -> String {
    print_model_mode(m, Mode::Inline(detail))
}

/// Prints a model with its larger constants (initializers and tensor attributes at every
/// depth, over [`INLINE_MAX`] elements) left out of the text: each prints as `@k`, the
/// `k`-th tensor of the returned table (equal tensors share one entry). How `.aim` files
/// keep a program's text apart from its weights; [`super::parse_model_with_data`] reads it.
pub fn print_model_with_data(m: &Model) -> (String, Vec<Tensor>) {
    let (mut texts, table) = print_models_with_data(&[m]);
    (texts.remove(0), table.tensors)
}

/// Prints several models against one constant table, as [`print_model_with_data`] prints
/// one: the texts in order, and the table every `@k` of them refers to.
pub fn print_models_with_data(ms: &[&Model]) -> (Vec<String>, ConstantTable) {
    let table = RefCell::new(ConstantTable::default());
    let texts = ms
        .iter()
        .enumerate()
        .map(|(i, m)| {
            table.borrow_mut().current = i;
            print_model_mode(m, Mode::Table(&table))
        })
        .collect();
    (texts, table.into_inner())
}

fn print_model_mode(m: &Model, mode: Mode<'_>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "opset {}", m.opset);
    if !m.producer.is_empty() {
        let _ = writeln!(s, "producer {}", quote_str(&m.producer));
    }
    if !m.doc.is_empty() {
        let _ = writeln!(s, "doc {}", quote_str(&m.doc));
    }
    for (k, v) in &m.metadata {
        let _ = writeln!(s, "meta {} = {}", quote_str(k), quote_str(v));
    }
    print_graph_into(&mut s, &m.graph, 0, mode);
    s
}

/// Prints a graph in the text format.
pub fn print_graph(g: &Graph, detail: TensorDetail) -> String {
    let mut s = String::new();
    print_graph_into(&mut s, g, 0, Mode::Inline(detail));
    s
}

fn indent(s: &mut String, level: usize) {
    for _ in 0..level {
        s.push_str("  ");
    }
}

fn print_graph_into(s: &mut String, g: &Graph, level: usize, mode: Mode<'_>) {
    let _ = writeln!(s, "graph {} {{", quote_str(&g.name));
    for v in &g.inputs {
        indent(s, level + 1);
        let _ = writeln!(s, "input {}: {}", quote_name(&v.name), v.ty);
    }
    for (name, t) in &g.initializers {
        indent(s, level + 1);
        let _ = writeln!(s, "init {} = {}", quote_name(name), tensor_text(t, mode));
    }
    for n in &g.nodes {
        indent(s, level + 1);
        print_node_into(s, g, n, level + 1, mode);
    }
    for v in &g.outputs {
        indent(s, level + 1);
        let _ = writeln!(s, "output {}: {}", quote_name(&v.name), v.ty);
    }
    indent(s, level);
    s.push_str("}\n");
}

/// Prints one node as its text line (with the trailing newline), typing outputs from `g`.
pub fn print_node(g: &Graph, n: &Node) -> String {
    let mut s = String::new();
    print_node_into(&mut s, g, n, 0, Mode::Inline(TensorDetail::Summary(8)));
    s
}

fn print_node_into(s: &mut String, g: &Graph, n: &Node, level: usize, mode: Mode<'_>) {
    for (i, o) in n.outputs.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        if o.is_empty() {
            s.push('_');
            continue;
        }
        s.push_str(&quote_name(o));
        if let Some(t) = g.value_types.get(o) {
            let _ = write!(s, ": {t}");
        }
    }
    s.push_str(" = ");
    if !n.domain.is_empty() {
        let _ = write!(s, "{}:", n.domain);
    }
    s.push_str(&n.op);
    s.push('(');
    for (i, inp) in n.inputs.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        if inp.is_empty() {
            s.push('_');
        } else {
            s.push_str(&quote_name(inp));
        }
    }
    s.push(')');
    if !n.attrs.is_empty() {
        s.push_str(" {");
        for (i, (k, a)) in n.attrs.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{k}=");
            print_attr(s, a, level, mode);
        }
        s.push('}');
    }
    let _ = writeln!(s, "  # {}", n.name);
}

fn print_attr(s: &mut String, a: &Attr, level: usize, mode: Mode<'_>) {
    match a {
        Attr::Int(v) => {
            let _ = write!(s, "{v}");
        }
        Attr::Float(v) => s.push_str(&float_str(*v as f64, true)),
        Attr::String(v) => s.push_str(&quote_str(v)),
        Attr::Tensor(t) => s.push_str(&tensor_text(t, mode)),
        Attr::Graph(g) => {
            print_graph_into(s, g, level, mode);
            s.pop(); // the graph's closing newline: the node line goes on after it
        }
        Attr::Ints(v) => list(s, "ints", v.iter().map(|x| x.to_string())),
        Attr::Floats(v) => list(s, "floats", v.iter().map(|x| float_str(*x as f64, true))),
        Attr::Strings(v) => list(s, "strings", v.iter().map(|x| quote_str(x))),
    }
}

fn list(s: &mut String, kind: &str, items: impl Iterator<Item = String>) {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        let _ = write!(s, "{kind}[]");
    } else {
        let _ = write!(s, "[{}]", items.join(", "));
    }
}

/// A float as text that parses back to the same value: shortest round-trip digits, always
/// with a `.` or exponent so it reads as a float (`1.0`, `NaN`, `inf`).
fn float_str(v: f64, single: bool) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let t = if single { format!("{:?}", v as f32) } else { format!("{v:?}") };
    if t.contains('.') || t.contains('e') {
        t
    } else {
        format!("{t}.0")
    }
}

/// A tensor as `mode` prints it: a literal, or `f32[64,3,7,7] @k` for the `k`-th tensor of
/// the table.
fn tensor_text(t: &Tensor, mode: Mode<'_>) -> String {
    match mode {
        Mode::Inline(detail) => tensor_literal(t, detail),
        Mode::Table(table) if t.len() > INLINE_MAX => {
            let k = table.borrow_mut().index_of(t);
            format!("{} @{k}", ValueType::known(t.dtype(), t.shape()))
        }
        Mode::Table(_) => tensor_literal(t, TensorDetail::Full),
    }
}

/// A tensor literal: `f32[2,2] [1.0, 2.0, 3.0, 4.0]`, or `f32[64,3,7,7] <9408 values>`.
pub fn tensor_literal(t: &Tensor, detail: TensorDetail) -> String {
    let ty = ValueType::known(t.dtype(), t.shape());
    if let TensorDetail::Summary(max) = detail {
        if t.len() > max {
            return format!("{ty} <{} values>", t.len());
        }
    }
    let vals: Vec<String> = match t.dtype() {
        DType::F32 => t.data::<f32>().iter().map(|&x| float_str(x as f64, true)).collect(),
        DType::F64 => t.data::<f64>().iter().map(|&x| float_str(x, false)).collect(),
        DType::F16 => t.data::<f16>().iter().map(|x| float_str(x.to_f64(), true)).collect(),
        DType::BF16 => t.data::<bf16>().iter().map(|x| float_str(x.to_f64(), true)).collect(),
        DType::Bool => t.data::<u8>().iter().map(|&x| if x != 0 { "true" } else { "false" }.to_string()).collect(),
        DType::U64 => t.data::<u64>().iter().map(|x| x.to_string()).collect(),
        _ => t.to_i64_vec().iter().map(|x| x.to_string()).collect(),
    };
    format!("{ty} [{}]", vals.join(", "))
}

/// A string literal with JSON-style escapes.
pub fn quote_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
