//! Running on memory the caller owns: the C and Python APIs hand aim the host's buffers
//! (a C array, a NumPy array) without copying them into tensors first.

use crate::{Error, Model, Tensor};
use aim_ir::DType;

/// An input tensor over bytes the caller owns: its element type, its shape and its
/// little-endian bytes (exactly `shape`'s element count times the dtype's size).
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: &'a [usize],
    /// The elements, densely packed in row-major order.
    pub bytes: &'a [u8],
}

impl Model {
    /// Runs the model on inputs that borrow the caller's memory: bytes aligned for their
    /// dtype are read in place, others are copied first. Outputs are always owned by the
    /// returned tensors (an output that is one of the inputs, or a view of one, is copied
    /// out), so nothing returned refers to the borrowed memory.
    pub fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, Error> {
        let mut tensors = Vec::with_capacity(inputs.len());
        for (name, v) in inputs {
            let bad =
                |e: aim_ir::SizeMismatch| Error::BadOption { option: "inputs", reason: format!("input '{name}': {e}") };
            let t = if (v.bytes.as_ptr() as usize).is_multiple_of(v.dtype.size().max(1)) {
                // SAFETY: the bytes are aligned for the dtype, and `v.bytes` is borrowed for
                // the whole call: every tensor made from it is dropped before this function
                // returns (the run consumes them; outputs over them are copied below).
                unsafe { Tensor::borrowed(v.dtype, v.shape, v.bytes.as_ptr(), v.bytes.len()) }.map_err(bad)?
            } else {
                Tensor::from_bytes(v.dtype, v.shape, v.bytes).map_err(bad)?
            };
            tensors.push((name.to_string(), t));
        }
        let outputs = self.run(tensors)?;
        let lent = |t: &Tensor| {
            let (start, end) = (t.bytes().as_ptr() as usize, t.bytes().as_ptr() as usize + t.bytes().len());
            inputs.iter().any(|(_, v)| {
                let (s, e) = (v.bytes.as_ptr() as usize, v.bytes.as_ptr() as usize + v.bytes.len());
                start < e && s < end
            })
        };
        Ok(outputs
            .into_iter()
            .map(|(name, t)| {
                if t.is_borrowed() && !t.is_empty() && lent(&t) {
                    let owned =
                        Tensor::from_bytes(t.dtype(), t.shape(), t.bytes()).expect("a tensor's own bytes fit it");
                    (name, owned)
                } else {
                    (name, t)
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::TensorView;
    use aim_ir::DType;

    /// An output that is the input itself comes back as a copy, not a view of the
    /// caller's buffer; a misaligned buffer is copied in and still computes right.
    #[test]
    fn outputs_never_borrow_the_callers_memory() {
        let text = "opset 17\ngraph \"g\" {\n  input %x: f32[4]\n  %y = Relu(%x)  # relu\n  output %x: f32[4]\n  output %y: f32[4]\n}\n";
        let ir = aim_ir::text::parse_model(text).expect("parses");
        let dir = std::env::temp_dir();
        let m = crate::Model::from_ir(ir, &dir.join("views.onnx"), crate::Backend::Cpu).expect("loads");
        let data: Vec<f32> = vec![1.0, -2.0, 3.0, -4.0, 0.0];
        let bytes: &[u8] = bytemuck_bytes(&data);
        for offset in [0usize, 1] {
            let shifted: Vec<u8> = [&vec![0u8; offset][..], &bytes[..16]].concat();
            let v = TensorView { dtype: DType::F32, shape: &[4], bytes: &shifted[offset..] };
            let outs = m.run_views(&[("x", v)]).expect("runs");
            let range = shifted.as_ptr_range();
            for (_, t) in &outs {
                assert!(!range.contains(&t.bytes().as_ptr()), "an output points into the caller's buffer");
            }
            assert_eq!(outs[0].1.data::<f32>(), &[1.0, -2.0, 3.0, -4.0]);
            assert_eq!(outs[1].1.data::<f32>(), &[1.0, 0.0, 3.0, 0.0]);
        }
    }

    fn bytemuck_bytes(v: &[f32]) -> &[u8] {
        // SAFETY: f32 has no padding and any byte pattern of u8 is valid.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
    }
}
