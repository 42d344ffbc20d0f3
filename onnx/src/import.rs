//! The importer proper: ModelProto → [`Model`], graph by graph.

use super::canon::canonicalize;
use super::proto::{self, attribute_proto::AttributeType, type_proto, ModelProto};
use super::tensor::{convert, ExternalFiles};
use super::ImportError;
use aim_ir::{Attr, DType, Dim, Graph, Model, Node, ValueInfo, ValueType};
use bytes::Bytes;
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// The default-domain opsets aim reads: 7 up to the newest that onnx 1.23 defines.
pub const OPSETS: std::ops::RangeInclusive<i64> = 7..=28;

/// Reads and imports an ONNX file; external data is looked up next to it.
///
/// The file is memory-mapped and decoded in place, so `raw_data` initializers borrow the
/// mapping instead of being copied (those not aligned for their type are copied once).
pub fn import_file(path: &Path) -> Result<Model, ImportError> {
    let io = |cause| ImportError::Io { path: path.to_path_buf(), cause };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let bytes = if len == 0 {
        Bytes::new()
    } else {
        // SAFETY: the map is read-only. As with any mmap, a file truncated by another
        // process while mapped is outside what the program can guard against.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Bytes::from_owner(aim_ir::mapped::Shared(aim_ir::mapped::register(map)))
    };
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p }.to_path_buf());
    import(bytes, &path.display().to_string(), ExternalFiles::new(base))
}

/// Imports an ONNX model from bytes (no external data can be resolved). `what` names the
/// source in errors.
pub fn import_bytes(bytes: &[u8], what: &str) -> Result<Model, ImportError> {
    import(Bytes::copy_from_slice(bytes), what, ExternalFiles::new(None))
}

fn import(bytes: Bytes, what: &str, mut ext: ExternalFiles) -> Result<Model, ImportError> {
    let m =
        ModelProto::decode(bytes).map_err(|e| ImportError::Decode { what: what.to_string(), reason: e.to_string() })?;
    let Some(g) = &m.graph else { return Err(ImportError::NoGraph { what: what.to_string() }) };
    let opset = m
        .opset_import
        .iter()
        .find(|o| matches!(o.domain(), "" | "ai.onnx"))
        .map(|o| o.version())
        // A model that imports only other domains uses no default-domain op.
        .unwrap_or(if m.opset_import.is_empty() { 1 } else { *OPSETS.end() });
    if !OPSETS.contains(&opset) {
        return Err(ImportError::Opset { opset });
    }
    let mut cx = Importer { opset, ext: &mut ext, used_names: HashSet::new() };
    let graph = cx.graph(g, true)?;
    let metadata = m.metadata_props.iter().map(|p| (p.key().to_string(), p.value().to_string())).collect();
    Ok(Model { graph, opset, producer: m.producer_name().to_string(), doc: m.doc_string().to_string(), metadata })
}

/// The name a node gets in the IR: its own, or `<op>_<index in its graph>` when it has none,
/// made unique across the model (subgraphs included) with a `_<k>` suffix. Callers allocate
/// names in import order: a node, then the nodes of its subgraphs.
pub(crate) fn unique_node_name(used: &mut HashSet<String>, n: &proto::NodeProto, index: usize) -> String {
    let base = if n.name().is_empty() { format!("{}_{index}", n.op_type()) } else { n.name().to_string() };
    let mut name = base.clone();
    let mut k = 1;
    while !used.insert(name.clone()) {
        name = format!("{base}_{k}");
        k += 1;
    }
    name
}

struct Importer<'a> {
    opset: i64,
    ext: &'a mut ExternalFiles,
    used_names: HashSet<String>,
}

/// The values of a graph that ONNX types as 4-bit integers (initializers, declared values,
/// Constant outputs), with their type code.
fn four_bit_values(g: &proto::GraphProto) -> HashMap<String, i32> {
    let code = |v: &proto::ValueInfoProto| match &v.r#type.as_ref()?.value {
        Some(type_proto::Value::TensorType(tt)) => Some(tt.elem_type()),
        _ => None,
    };
    let mut out = HashMap::new();
    let mut note = |name: &str, c: i32| {
        if super::tensor::four_bit(c).is_some() {
            out.insert(name.to_string(), c);
        }
    };
    for t in &g.initializer {
        note(t.name(), t.data_type());
    }
    for v in g.input.iter().chain(&g.output).chain(&g.value_info) {
        if let Some(c) = code(v) {
            note(v.name(), c);
        }
    }
    for n in g.node.iter().filter(|n| n.op_type() == "Constant") {
        if let (Some(t), Some(y)) = (n.attribute.iter().find_map(|a| a.t.as_ref()), n.output.first()) {
            note(y, t.data_type());
        }
    }
    out
}

fn value_type(v: &proto::ValueInfoProto) -> Result<ValueType, ImportError> {
    let Some(t) = &v.r#type else { return Ok(ValueType::unknown()) };
    match &t.value {
        Some(type_proto::Value::TensorType(tt)) => {
            let code = tt.elem_type();
            let dtype = match code {
                0 => None,
                c => {
                    Some(super::tensor::four_bit(c).or(DType::from_onnx_code(c)).ok_or_else(|| ImportError::DType {
                        what: format!("value '{}'", v.name()),
                        dtype: DType::onnx_code_name(c).to_string(),
                    })?)
                }
            };
            let shape = tt.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(proto::tensor_shape_proto::dimension::Value::DimValue(v)) if *v >= 0 => {
                            Dim::Known(*v as usize)
                        }
                        // A dim_param of no name ("?", as some exporters write) is unnamed:
                        // each is its own unknown dim, as in ONNX Runtime.
                        Some(proto::tensor_shape_proto::dimension::Value::DimParam(p))
                            if p.chars().any(|c| c.is_alphanumeric()) =>
                        {
                            Dim::Sym(sanitize_symbol(p))
                        }
                        _ => Dim::Unknown,
                    })
                    .collect()
            });
            Ok(ValueType { dtype, shape })
        }
        None => Ok(ValueType::unknown()),
        Some(other) => {
            let kind = match other {
                type_proto::Value::SequenceType(_) => "sequence",
                type_proto::Value::MapType(_) => "map",
                type_proto::Value::OptionalType(_) => "optional",
                type_proto::Value::SparseTensorType(_) => "sparse tensor",
                _ => "opaque",
            };
            Err(ImportError::NonTensorValue { name: v.name().to_string(), kind: kind.to_string() })
        }
    }
}

/// Symbolic dim names become identifiers of the text format (`batch size` → `batch_size`).
fn sanitize_symbol(p: &str) -> String {
    let mut s: String = p.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

impl Importer<'_> {
    fn graph(&mut self, g: &proto::GraphProto, main: bool) -> Result<Graph, ImportError> {
        let mut out = Graph { name: g.name().to_string(), ..Graph::default() };
        for t in &g.initializer {
            let what = format!("initializer '{}'", t.name());
            out.initializers.insert(t.name().to_string(), convert(t, &what, self.ext)?);
        }
        if !g.sparse_initializer.is_empty() {
            return Err(ImportError::DType { what: "sparse initializers".into(), dtype: "sparse".into() });
        }
        for v in &g.input {
            // Before IR version 4, initializers were listed as inputs too; they stay constants.
            if main && out.initializers.contains_key(v.name()) {
                continue;
            }
            out.inputs.push(ValueInfo { name: v.name().to_string(), ty: value_type(v)? });
        }
        for v in &g.output {
            out.outputs.push(ValueInfo { name: v.name().to_string(), ty: value_type(v)? });
        }
        for v in &g.value_info {
            if let Ok(ty) = value_type(v) {
                out.value_types.insert(v.name().to_string(), ty);
            }
        }
        let four_bit = four_bit_values(g);
        for (i, n) in g.node.iter().enumerate() {
            let mut node = self.node(n, i)?;
            // A QuantizeLinear to a 4-bit zero point writes 4-bit values (held one a byte):
            // said explicitly, so the kernel saturates to their range.
            // Casting to one would need the 4-bit wrap-around Cast defines: refused (Cast's
            // `to` of 21 or 22 is refused by the verifier).
            if node.op == "CastLike" {
                if let Some(&code) = node.input(1).and_then(|z| four_bit.get(z)) {
                    return Err(ImportError::DType {
                        what: format!("node '{}' (CastLike to '{}')", node.name, node.input(1).unwrap_or_default()),
                        dtype: DType::onnx_code_name(code).to_string(),
                    });
                }
            }
            if node.op == "QuantizeLinear" && !node.attrs.contains_key("output_dtype") {
                if let Some(&code) = node.input(2).and_then(|z| four_bit.get(z)) {
                    node.attrs.insert("output_dtype".into(), Attr::Int(code as i64));
                }
            }
            if node.op == "GatherBlockQuantized" && node.input(0).is_some_and(|d| four_bit.contains_key(d)) {
                node.attrs.insert(super::contrib_gather_q::FOUR_BIT_DATA.into(), Attr::Int(1));
            }
            if matches!(node.domain.as_str(), "" | "ai.onnx") {
                canonicalize(node, self.opset, &mut out)?;
            } else {
                out.nodes.push(node);
            }
        }
        super::contrib::expand(&mut out)?;
        Ok(out)
    }

    fn unique_name(&mut self, n: &proto::NodeProto, index: usize) -> String {
        unique_node_name(&mut self.used_names, n, index)
    }

    fn node(&mut self, n: &proto::NodeProto, index: usize) -> Result<Node, ImportError> {
        let name = self.unique_name(n, index);
        let mut attrs = BTreeMap::new();
        for a in &n.attribute {
            let what = format!("node '{name}' ({}) attribute '{}'", n.op_type(), a.name());
            if let Some(v) = self.attr(a, &what)? {
                attrs.insert(a.name().to_string(), v);
            }
        }
        let domain = if n.domain() == "ai.onnx" { String::new() } else { n.domain().to_string() };
        Ok(Node {
            name,
            op: n.op_type().to_string(),
            domain,
            inputs: n.input.clone(),
            outputs: n.output.clone(),
            attrs,
        })
    }

    fn attr(&mut self, a: &proto::AttributeProto, what: &str) -> Result<Option<Attr>, ImportError> {
        let ty = match a.r#type() {
            AttributeType::Undefined => {
                // Very old models leave the type out; tell it by the field that is set.
                if a.f.is_some() {
                    AttributeType::Float
                } else if a.i.is_some() {
                    AttributeType::Int
                } else if a.s.is_some() {
                    AttributeType::String
                } else if a.t.is_some() {
                    AttributeType::Tensor
                } else if a.g.is_some() {
                    AttributeType::Graph
                } else if !a.floats.is_empty() {
                    AttributeType::Floats
                } else if !a.ints.is_empty() {
                    AttributeType::Ints
                } else if !a.strings.is_empty() {
                    AttributeType::Strings
                } else {
                    // ORT refuses it too: nothing says what it is.
                    return Err(ImportError::BadTensor {
                        what: what.into(),
                        reason: "its type is UNDEFINED and it holds no value".into(),
                    });
                }
            }
            t => t,
        };
        let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok(Some(match ty {
            AttributeType::Float => Attr::Float(a.f()),
            AttributeType::Int => Attr::Int(a.i()),
            AttributeType::String => Attr::String(s(a.s.as_deref().unwrap_or_default())),
            AttributeType::Floats => Attr::Floats(a.floats.clone()),
            AttributeType::Ints => Attr::Ints(a.ints.clone()),
            AttributeType::Strings => Attr::Strings(a.strings.iter().map(|b| s(b)).collect()),
            AttributeType::Tensor => {
                let t =
                    a.t.as_ref()
                        .ok_or_else(|| ImportError::BadTensor { what: what.into(), reason: "missing tensor".into() })?;
                Attr::Tensor(convert(t, what, self.ext)?)
            }
            AttributeType::Graph => {
                let g =
                    a.g.as_ref()
                        .ok_or_else(|| ImportError::BadTensor { what: what.into(), reason: "missing graph".into() })?;
                Attr::Graph(Box::new(self.graph(g, false)?))
            }
            other => {
                return Err(ImportError::DType {
                    what: what.into(),
                    dtype: format!("attribute kind {}", other.as_str_name()),
                })
            }
        }))
    }
}
