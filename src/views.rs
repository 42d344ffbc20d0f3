//! Running on memory the caller owns (see `aim_runtime::views`): the C and Python APIs
//! hand aim the host's buffers without copying them into tensors first.

use crate::{Error, Model, Tensor};
pub use aim_runtime::views::TensorView;

impl Model {
    /// Runs the model on inputs that borrow the caller's memory: bytes aligned for their
    /// dtype are read in place, others are copied first. Outputs are always owned by the
    /// returned tensors (an output that is one of the inputs, or a view of one, is copied
    /// out), so nothing returned refers to the borrowed memory.
    pub fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, Error> {
        aim_runtime::views::run_on_views(
            inputs,
            |reason| Error::BadOption { option: "inputs", reason },
            |tensors| self.run(tensors),
        )
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
