//! [`aim_ir::Model`] → ONNX protobuf: the inverse of import for graphs in the default
//! domain. It lets a model written in the IR text format be saved as an `.onnx` file that
//! aim (and ONNX Runtime) read back — how the test suites build malformed and edge-case
//! models without a Python step. Tensors are written as raw little-endian bytes.

use super::proto::{
    self, attribute_proto::AttributeType, tensor_shape_proto::dimension, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use aim_ir::{Attr, Dim, Graph, Model, Node, Tensor, ValueInfo, ValueType};
use prost::Message;

/// The model as ONNX protobuf bytes.
pub fn export_bytes(m: &Model) -> Vec<u8> {
    export(m).encode_to_vec()
}

/// The model as an ONNX `ModelProto` (IR version 8, the model's opset).
pub fn export(m: &Model) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        producer_name: (!m.producer.is_empty()).then(|| m.producer.clone()),
        doc_string: (!m.doc.is_empty()).then(|| m.doc.clone()),
        metadata_props: m
            .metadata
            .iter()
            .map(|(k, v)| proto::StringStringEntryProto { key: Some(k.clone()), value: Some(v.clone()) })
            .collect(),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(m.opset) }],
        graph: Some(graph(&m.graph)),
        ..Default::default()
    }
}

fn graph(g: &Graph) -> GraphProto {
    GraphProto {
        name: Some(g.name.clone()),
        node: g.nodes.iter().map(node_proto).collect(),
        input: g.inputs.iter().map(value_info_proto).collect(),
        output: g.outputs.iter().map(value_info_proto).collect(),
        initializer: g.initializers.iter().map(|(k, t)| tensor_proto(k, t)).collect(),
        value_info: g
            .value_types
            .iter()
            .map(|(k, t)| value_info_proto(&ValueInfo { name: k.clone(), ty: t.clone() }))
            .collect(),
        ..Default::default()
    }
}

/// One node as a `NodeProto` (for tools that edit a model's protobuf directly, such as
/// `aim quantize`).
pub fn node_proto(n: &Node) -> NodeProto {
    NodeProto {
        name: Some(n.name.clone()),
        op_type: Some(n.op.clone()),
        domain: (!n.domain.is_empty()).then(|| n.domain.clone()),
        input: n.inputs.clone(),
        output: n.outputs.clone(),
        attribute: n.attrs.iter().map(|(k, v)| attr(k, v)).collect(),
        ..Default::default()
    }
}

fn attr(name: &str, v: &Attr) -> AttributeProto {
    let mut a = AttributeProto { name: Some(name.to_string()), ..Default::default() };
    let ty = match v {
        Attr::Int(i) => {
            a.i = Some(*i);
            AttributeType::Int
        }
        Attr::Float(f) => {
            a.f = Some(*f);
            AttributeType::Float
        }
        Attr::String(s) => {
            a.s = Some(s.as_bytes().to_vec().into());
            AttributeType::String
        }
        Attr::Tensor(t) => {
            a.t = Some(tensor_proto("", t));
            AttributeType::Tensor
        }
        Attr::Graph(g) => {
            a.g = Some(graph(g));
            AttributeType::Graph
        }
        Attr::Ints(v) => {
            a.ints = v.clone();
            AttributeType::Ints
        }
        Attr::Floats(v) => {
            a.floats = v.clone();
            AttributeType::Floats
        }
        Attr::Strings(v) => {
            a.strings = v.iter().map(|s| s.as_bytes().to_vec().into()).collect();
            AttributeType::Strings
        }
    };
    a.r#type = Some(ty as i32);
    a
}

/// A tensor as a `TensorProto` with its bytes inline.
pub fn tensor_proto(name: &str, t: &Tensor) -> TensorProto {
    TensorProto {
        name: (!name.is_empty()).then(|| name.to_string()),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(t.dtype().onnx_code()),
        raw_data: Some(t.bytes().to_vec().into()),
        ..Default::default()
    }
}

/// A value's name and type as a `ValueInfoProto`.
pub fn value_info_proto(v: &ValueInfo) -> ValueInfoProto {
    ValueInfoProto { name: Some(v.name.clone()), r#type: value_type(&v.ty), ..Default::default() }
}

/// A type: dtype and dims where known; a value of unknown dtype gets no type at all.
fn value_type(t: &ValueType) -> Option<TypeProto> {
    let dtype = t.dtype?;
    let shape = t.shape.as_ref().map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| proto::tensor_shape_proto::Dimension {
                value: match d {
                    Dim::Known(k) => Some(dimension::Value::DimValue(*k as i64)),
                    Dim::Sym(s) => Some(dimension::Value::DimParam(s.clone())),
                    Dim::Unknown => None,
                },
                ..Default::default()
            })
            .collect(),
    });
    Some(TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(dtype.onnx_code()), shape })),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_model_round_trips_through_onnx() {
        let text = "opset 17\ngraph \"g\" {\n  input %x: f32[N,2]\n  init %w = f32[2,2] [1.0, 2.0, 3.0, 4.0]\n  %y = MatMul(%x, %w)  # mm\n  %z = If(%c) {else_branch=graph \"e\" {\n    output %y: f32[N,2]\n  }, then_branch=graph \"t\" {\n    %n = Neg(%y)  # neg\n    output %n: f32[N,2]\n  }}  # if\n  input %c: bool[]\n  output %z: f32[N,2]\n}\n";
        let m = aim_ir::text::parse_model(text).unwrap();
        let back = super::super::import_bytes(&super::export_bytes(&m), "round trip").unwrap();
        let full = aim_ir::text::TensorDetail::Full;
        assert_eq!(aim_ir::text::print_model(&back, full), aim_ir::text::print_model(&m, full));
    }
}
