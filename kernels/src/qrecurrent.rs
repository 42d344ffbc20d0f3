//! The 8-bit weights of an LSTM marked `dynamic_quantize=1`: what the importer makes of
//! ONNX Runtime's `com.microsoft:DynamicQuantizeLSTM`. W `[D, 4H, input]` and R
//! `[D, 4H, H]` stay i8 or u8 (in LSTM's layout), with attributes `w_scale` / `r_scale`
//! (one per direction, or one per direction and gate row) and `w_zero_point` /
//! `r_zero_point` (as many, or absent for zero).
//!
//! Such an LSTM rounds X (the whole sequence, one range) and each step's hidden state (one
//! range per step, over the batch) to u8 as DynamicQuantizeLinear does, and multiplies the
//! integers exactly, as ORT's kernel does: its outputs then agree with ORT's to f32
//! rounding. Without the exact products they do not: the recurrence amplifies a rounding
//! difference of 1e-6 into another choice of quantum for some later hidden value, and the
//! outputs part by 1e-2. Both LSTM kernels read the weights' quantization through
//! [`row_quant`].

use crate::util::{err, Result};
use aim_ir::{DType, Node, Tensor};

/// Whether `n` is an LSTM whose X, hidden states and weights are 8-bit (see the module
/// doc).
pub fn dynamic_quantize(n: &Node) -> bool {
    n.int("dynamic_quantize", 0) != 0
}

/// The quantization of 8-bit weights: a scale and a zero point per direction and gate row.
pub struct RowQuant {
    /// The scale of each row (`D · rows` values).
    pub scale: Vec<f32>,
    /// The zero point of each row, likewise.
    pub zero: Vec<i32>,
}

impl RowQuant {
    /// The 8-bit weights `t` this quantization is of, less their zero points: whole
    /// numbers from -255 to 255 as f32, `t`'s shape.
    pub fn centered(&self, t: &Tensor) -> Tensor {
        let cols = t.shape().last().copied().unwrap_or(1).max(1);
        let q: Vec<f32> = match t.dtype() {
            DType::I8 => t.data::<i8>().iter().map(|&v| v as f32).collect(),
            _ => t.data::<u8>().iter().map(|&v| v as f32).collect(),
        };
        let values = q.chunks(cols).zip(&self.zero).flat_map(|(row, &z)| row.iter().map(move |&v| v - z as f32));
        Tensor::from_vec(t.shape(), values.collect())
    }
}

/// The quantization of the weights `t` (input `which`: "w" for W, "r" for R) of the LSTM
/// `n`, from `{which}_scale` and `{which}_zero_point`, checked: `t` 8-bit and 3-D, one
/// value per direction or per direction and gate row, positive scales.
pub fn row_quant(n: &Node, t: &Tensor, which: &str) -> Result<RowQuant> {
    if !matches!(t.dtype(), DType::I8 | DType::U8) {
        return err(format!("{} is {}: dynamic_quantize needs 8-bit weights", which.to_uppercase(), t.dtype()));
    }
    if t.rank() != 3 {
        return err(format!(
            "{} has shape {:?}: [directions, rows, columns] expected",
            which.to_uppercase(),
            t.shape()
        ));
    }
    let (dirs, rows) = (t.shape()[0], t.shape()[1]);
    let per_row = |name: &str, values: Vec<f64>| -> Result<Vec<f64>> {
        match values.len() {
            l if l == dirs => Ok(values.iter().flat_map(|&v| std::iter::repeat_n(v, rows)).collect()),
            l if l == dirs * rows => Ok(values),
            l => err(format!("attribute '{name}' has {l} values: {dirs} or {} expected", dirs * rows)),
        }
    };
    let scale_name = format!("{which}_scale");
    let Some(scales) = n.floats(&scale_name) else {
        return err(format!("attribute '{scale_name}' is required with dynamic_quantize"));
    };
    let scale = per_row(&scale_name, scales.iter().map(|&s| s as f64).collect())?;
    if let Some(bad) = scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return err(format!("attribute '{scale_name}' holds {bad}: scales must be positive"));
    }
    let zero_name = format!("{which}_zero_point");
    let zero = match n.ints(&zero_name) {
        None => vec![0.0; dirs * rows],
        Some(z) => per_row(&zero_name, z.iter().map(|&v| v as f64).collect())?,
    };
    Ok(RowQuant { scale: scale.iter().map(|&s| s as f32).collect(), zero: zero.iter().map(|&z| z as i32).collect() })
}
