//! Running on memory the caller owns: the C and Python APIs hand aim the host's buffers
//! (a C array, a NumPy array) without copying them into tensors first.

use aim_ir::{DType, Tensor};

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

/// Runs `run` on tensors over `inputs`' bytes: bytes aligned for their dtype are read in
/// place, others are copied first. The outputs `run` returns are made to own their bytes
/// (an output that is one of the inputs, or a view of one, is copied out), so nothing
/// returned refers to the borrowed memory. `bad` turns a view whose size does not fit its
/// shape into the caller's error.
pub fn run_on_views<E>(
    inputs: &[(&str, TensorView<'_>)],
    bad: impl Fn(String) -> E,
    run: impl FnOnce(Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, E>,
) -> Result<Vec<(String, Tensor)>, E> {
    let mut tensors = Vec::with_capacity(inputs.len());
    for (name, v) in inputs {
        let t = if (v.bytes.as_ptr() as usize).is_multiple_of(v.dtype.size().max(1)) {
            // SAFETY: the bytes are aligned for the dtype, and `v.bytes` is borrowed for
            // the whole call: every tensor made from it is dropped before this function
            // returns (the run consumes them; outputs over them are copied below).
            unsafe { Tensor::borrowed(v.dtype, v.shape, v.bytes.as_ptr(), v.bytes.len()) }
        } else {
            Tensor::from_bytes(v.dtype, v.shape, v.bytes)
        }
        .map_err(|e| bad(format!("input '{name}': {e}")))?;
        tensors.push((name.to_string(), t));
    }
    let outputs = run(tensors)?;
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
                let owned = Tensor::from_bytes(t.dtype(), t.shape(), t.bytes()).expect("a tensor's own bytes fit it");
                (name, owned)
            } else {
                (name, t)
            }
        })
        .collect())
}
