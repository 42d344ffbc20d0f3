//! Inference rules of the elementwise ops: unary ops keep their input's type, binary and
//! variadic ones broadcast, comparisons give bools; Where, Cast, CastLike, IsNaN / IsInf.

use super::{broadcast_all, dtype_of, one, same_as, same_dtype, shape_of, Ins};
use crate::{DType, Graph, Node, ValueType};

/// Ops whose one output has their first input's type.
pub(super) const UNARY_SAME: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "BatchNormalization",
    "Ceil",
    "Celu",
    "Clip",
    "Cos",
    "Cosh",
    "CumSum",
    "Dropout",
    "Elu",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "InstanceNormalization",
    "LRN",
    "LayerNormalization",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "LpNormalization",
    "MeanVarianceNormalization",
    "Mish",
    "Neg",
    "Not",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softmax",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "Trilu",
    "BitwiseNot",
    "GroupNormalization",
    "RMSNormalization",
];
/// Ops whose inputs broadcast to one output of their common type.
pub(super) const BINARY_SAME: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Mod",
    "Min",
    "Max",
    "Sum",
    "Mean",
    "BitShift",
    "And",
    "Or",
    "Xor",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "PRelu",
];
/// Comparisons: inputs of one type broadcast to a bool output.
pub(super) const COMPARE: &[&str] = &["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"];

/// The unary ops of [`UNARY_SAME`]: their input's type (every output).
pub(super) fn unary(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let mut outs = vec![same_as(ins, 0)];
    outs.resize(n.outputs.len(), ValueType::unknown());
    Ok(outs)
}

/// The ops of [`BINARY_SAME`] and Pow: the inputs broadcast, of one type (Pow and PRelu: the
/// first input's).
pub(super) fn binary(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let idx: Vec<usize> = (0..ins.len()).collect();
    let dt = if n.op == "Pow" || n.op == "PRelu" { dtype_of(ins, 0) } else { same_dtype(ins, &idx)? };
    one(dt, broadcast_all(ins, &idx)?)
}

/// The comparisons of [`COMPARE`]: bools of the broadcast shape.
pub(super) fn compare(_g: &Graph, _n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    same_dtype(ins, &[0, 1])?;
    one(Some(DType::Bool), broadcast_all(ins, &[0, 1])?)
}

/// IsNaN, IsInf: a bool per element.
pub(super) fn is_special(_g: &Graph, _n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    one(Some(DType::Bool), shape_of(ins, 0))
}

/// Where: the branches' type, the three inputs broadcast.
pub(super) fn where_(_g: &Graph, _n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    same_dtype(ins, &[1, 2])?;
    one(dtype_of(ins, 1).or(dtype_of(ins, 2)), broadcast_all(ins, &[0, 1, 2])?)
}

/// Cast: the `to` type, the same shape.
pub(super) fn cast(_g: &Graph, n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    let to = n.int("to", 0) as i32;
    one(DType::from_onnx_code(to), shape_of(ins, 0))
}

/// CastLike: the second input's type, the first's shape.
pub(super) fn cast_like(_g: &Graph, _n: &Node, ins: Ins) -> Result<Vec<ValueType>, String> {
    one(dtype_of(ins, 1), shape_of(ins, 0))
}
