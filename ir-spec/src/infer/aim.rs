//! Rules for the `aim` domain's dense layers. The passes that make `aim` nodes type their
//! outputs when they make them, but a layer made while its input's shape was still unknown
//! (a Reshape whose target a later folding resolved) kept an unknown output, and every
//! value after it did too: a specialised program then had no static plan and ran node by
//! node. Re-inference through these rules gives such outputs their shapes.

use super::{dtype_of, shape_of, Ins};
use crate::{DType, Dim, Graph, Node, ValueType};

/// The output types of `aim:Dense` (f32 or f16 weights as `[K, N]`, or `[N, K]` with
/// `trans_b`) and `aim:QDense` (byte weights as `[K, N]`): the input's dims with the last,
/// `K`, replaced by `N`. Unknown for other `aim` ops, for weights in other forms (4-bit
/// codes) and where the input's last dim is not the weight's `K`.
pub(super) fn infer(g: &Graph, n: &Node, ins: Ins) -> Vec<ValueType> {
    let unknown = || vec![ValueType::unknown(); n.outputs.len()];
    let Some(w) = n.input(1).and_then(|w| g.initializers.get(w)) else { return unknown() };
    let [a, b] = w.shape()[..] else { return unknown() };
    let (k, cols) = match (n.op.as_str(), w.dtype()) {
        ("Dense", DType::F32 | DType::F16) if !n.attrs.contains_key("weights") => match n.int("trans_b", 0) {
            0 => (a, b),
            _ => (b, a),
        },
        ("QDense", DType::U8 | DType::I8) => (a, b),
        _ => return unknown(),
    };
    let Some(mut shape) = shape_of(ins, 0) else { return unknown() };
    if dtype_of(ins, 0) != Some(DType::F32) || shape.last() != Some(&Dim::Known(k)) || n.outputs.len() != 1 {
        return unknown();
    }
    *shape.last_mut().expect("a last dim") = Dim::Known(cols);
    vec![ValueType { dtype: Some(DType::F32), shape: Some(shape) }]
}

#[cfg(test)]
mod tests {
    use crate::text::parse_graph;

    /// A dense layer whose output was left untyped gets the input's dims with the
    /// weight's features last; a transposed weight reads its rows as the features.
    #[test]
    fn dense_layers_take_the_weights_features() {
        let zeros = |n: usize, z: &str| vec![z; n].join(", ");
        let text = format!(
            "graph \"g\" {{\n  input %x: f32[2,3,4]\n  init %w = f32[4,5] [{}]\n  init %t = f32[6,4] [{}]\n  init %q = u8[4,7] [{}]\n  init %s = f32[] [0.5]\n  %a = aim:Dense(%x, %w, _)  # a\n  %b = aim:Dense(%x, %t, _) {{trans_b=1}}  # b\n  %c = aim:QDense(%x, %q, _, %s, _) {{x_scale=0.5, x_zero=0}}  # c\n  %d = aim:Dense(%x, %t, _)  # d\n  output %a: f32[*]\n  output %b: f32[*]\n  output %c: f32[*]\n  output %d: f32[*]\n}}\n",
            zeros(20, "0.0"),
            zeros(24, "0.0"),
            zeros(28, "0"),
        );
        let mut g = parse_graph(&text).unwrap();
        crate::infer::infer_types(&mut g).unwrap();
        let shape = |v: &str| g.value_types.get(v).and_then(|t| t.concrete_shape());
        assert_eq!(shape("a"), Some(vec![2, 3, 5]));
        assert_eq!(shape("b"), Some(vec![2, 3, 6]));
        assert_eq!(shape("c"), Some(vec![2, 3, 7]));
        // K does not match the input's last dim: left unknown, not guessed.
        assert_eq!(shape("d"), None);
    }
}
