//! Building small ONNX models in tests, with the prost types aim itself decodes.
#![allow(dead_code)]

use aim_onnx::proto::{
    self, attribute_proto::AttributeType, tensor_shape_proto::dimension, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

/// A node with integer-list / integer / string attributes.
pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

/// An integer attribute.
pub fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

/// A graph input/output: element type code and dims (an `Err` string is a symbolic dim).
pub fn value(name: &str, elem: i32, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| proto::tensor_shape_proto::Dimension {
            value: Some(match d {
                Ok(v) => dimension::Value::DimValue(*v),
                Err(s) => dimension::Value::DimParam(s.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An f32 tensor proto with raw data.
pub fn f32_tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        raw_data: Some(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

/// A serialized model of one graph, at `opset`.
pub fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
    opset: i64,
) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        producer_name: Some("aim-tests".into()),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            input: inputs,
            output: outputs,
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// y = relu(x · W + b) with x: f32[N, 2] (N symbolic), W = [[1, 2], [3, 4]], b = [0.5, -10].
pub fn tiny_mlp() -> Vec<u8> {
    model(
        vec![
            node("MatMul", "mm", &["x", "W"], &["h"], vec![]),
            node("Add", "bias", &["h", "b"], &["hb"], vec![]),
            node("Relu", "act", &["hb"], &["y"], vec![]),
        ],
        vec![value("x", 1, &[Err("N"), Ok(2)])],
        vec![value("y", 1, &[Err("N"), Ok(2)])],
        vec![f32_tensor("W", &[2, 2], &[1.0, 2.0, 3.0, 4.0]), f32_tensor("b", &[2], &[0.5, -10.0])],
        17,
    )
}

/// A fresh temporary directory for one test, removed with everything in it when the test
/// drops it (a suite of thousands of generated cases must not fill the disk).
pub struct TempDir(std::path::PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Makes the [`TempDir`] named after `tag` and this process, empty.
pub fn tempdir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("aim-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// A seeded generator (an LCG) for the random-case tests: the same cases on every run.
pub struct Rng(pub u64);

impl Rng {
    /// The next 31 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    /// One of `v`.
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.next() as usize % v.len()]
    }
    /// `n` values in [-1, 1], in steps of 0.001.
    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| (self.next() % 2001) as f32 / 1000.0 - 1.0).collect()
    }
}
