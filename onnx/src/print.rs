//! The ONNX graph as the file holds it, one line per node, for `aim explore --stage onnx`:
//! every node line names the node the way the importer does (so later stages' `from:`
//! names match), constants are summarised, subgraphs are indented under their node.

use super::import::unique_node_name;
use super::proto::{self, attribute_proto::AttributeType, ModelProto};
use super::ImportError;
use prost::Message;
use std::collections::HashSet;
use std::fmt::Write;

/// One printed line: its text and, for a node line, the node's (IR) name.
pub type OnnxLine = (String, Option<String>);

/// Prints the ONNX model in `bytes` (`what` names it in errors).
pub fn print_onnx(bytes: &[u8], what: &str) -> Result<Vec<OnnxLine>, ImportError> {
    let m =
        ModelProto::decode(bytes).map_err(|e| ImportError::Decode { what: what.to_string(), reason: e.to_string() })?;
    let Some(g) = &m.graph else { return Err(ImportError::NoGraph { what: what.to_string() }) };
    let mut out = Vec::new();
    let opsets: Vec<String> = m
        .opset_import
        .iter()
        .map(|o| format!("{}:{}", if o.domain().is_empty() { "ai.onnx" } else { o.domain() }, o.version()))
        .collect();
    out.push((
        format!(
            "model ir_version={} opset_import=[{}] producer={:?}",
            m.ir_version(),
            opsets.join(", "),
            m.producer_name()
        ),
        None,
    ));
    graph(g, 0, &mut HashSet::new(), &mut out);
    Ok(out)
}

fn type_text(t: Option<&proto::TypeProto>) -> String {
    use proto::type_proto::Value;
    match t.and_then(|t| t.value.as_ref()) {
        Some(Value::TensorType(tt)) => {
            let dt = proto::tensor_proto::DataType::try_from(tt.elem_type())
                .map(|d| d.as_str_name().to_lowercase())
                .unwrap_or_else(|_| "?".into());
            match &tt.shape {
                Some(s) => {
                    let dims: Vec<String> = s
                        .dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(proto::tensor_shape_proto::dimension::Value::DimValue(v)) => v.to_string(),
                            Some(proto::tensor_shape_proto::dimension::Value::DimParam(p)) => p.clone(),
                            None => "?".into(),
                        })
                        .collect();
                    format!("{dt}[{}]", dims.join(","))
                }
                None => dt,
            }
        }
        Some(_) => "non-tensor".into(),
        None => "?".into(),
    }
}

fn graph(g: &proto::GraphProto, level: usize, used: &mut HashSet<String>, out: &mut Vec<OnnxLine>) {
    let pad = "  ".repeat(level);
    out.push((format!("{pad}graph {:?} {{", g.name()), None));
    let inits: HashSet<&str> = g.initializer.iter().map(|t| t.name()).collect();
    for v in g.input.iter().filter(|v| !inits.contains(v.name())) {
        out.push((format!("{pad}  input %{}: {}", v.name(), type_text(v.r#type.as_ref())), None));
    }
    if !g.initializer.is_empty() {
        let values: u64 = g.initializer.iter().map(|t| t.dims.iter().product::<i64>().max(0) as u64).sum();
        out.push((format!("{pad}  initializers: {} tensors, {values} values", g.initializer.len()), None));
    }
    for (i, n) in g.node.iter().enumerate() {
        let name = unique_node_name(used, n, i);
        let mut line = format!("{pad}  ");
        let outs: Vec<String> =
            n.output.iter().map(|o| if o.is_empty() { "_".into() } else { format!("%{o}") }).collect();
        let ins: Vec<String> =
            n.input.iter().map(|o| if o.is_empty() { "_".into() } else { format!("%{o}") }).collect();
        let domain = if n.domain().is_empty() { String::new() } else { format!("{}:", n.domain()) };
        let _ = write!(line, "{} = {domain}{}({})", outs.join(", "), n.op_type(), ins.join(", "));
        let attrs: Vec<String> =
            n.attribute.iter().filter(|a| a.g.is_none() && a.graphs.is_empty()).map(attr_text).collect();
        if !attrs.is_empty() {
            let _ = write!(line, " {{{}}}", attrs.join(", "));
        }
        out.push((line, Some(name.clone())));
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                out.push((format!("{pad}    {}:", a.name()), Some(name.clone())));
                let first = out.len();
                graph(sub, level + 2, used, out);
                // The subgraph's own structure lines belong to its node.
                for l in &mut out[first..] {
                    if l.1.is_none() {
                        l.1 = Some(name.clone());
                    }
                }
            }
        }
    }
    for v in &g.output {
        out.push((format!("{pad}  output %{}: {}", v.name(), type_text(v.r#type.as_ref())), None));
    }
    out.push((format!("{pad}}}"), None));
}

fn attr_text(a: &proto::AttributeProto) -> String {
    let s = |b: &[u8]| format!("{:?}", String::from_utf8_lossy(b));
    let v = match a.r#type() {
        AttributeType::Float => a.f().to_string(),
        AttributeType::Int => a.i().to_string(),
        AttributeType::String => s(a.s.as_deref().unwrap_or_default()),
        AttributeType::Tensor => a.t.as_ref().map_or("<tensor>".into(), |t| format!("<tensor {:?}>", t.dims)),
        AttributeType::Floats => format!("{:?}", a.floats),
        AttributeType::Ints => format!("{:?}", a.ints),
        AttributeType::Strings => format!("[{}]", a.strings.iter().map(|b| s(b)).collect::<Vec<_>>().join(", ")),
        _ => {
            if a.f.is_some() {
                a.f().to_string()
            } else if a.i.is_some() {
                a.i().to_string()
            } else if !a.ints.is_empty() {
                format!("{:?}", a.ints)
            } else if !a.floats.is_empty() {
                format!("{:?}", a.floats)
            } else {
                "…".into()
            }
        }
    };
    format!("{}={v}", a.name())
}
