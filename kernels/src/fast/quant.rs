//! DynamicQuantizeLinear on f32: the per-run quantisation of activations that
//! `quantize_dynamic` models put before every integer matrix product. One pass finds the
//! range, one quantises; the arithmetic is the reference kernel's, step for step (the range
//! subtracted in f64 and rounded to f32, f32 divisions, ties to even), so the results are
//! identical.

use super::ops::Ctx;
use super::output::Output;
use crate::util::Result;
use aim_ir::{DType, Node, Tensor};

pub(super) fn dynamic_quantize_linear(_n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref().filter(|t| t.dtype() == DType::F32)?;
    let v = x.data::<f32>();
    let (lo, hi) = v.iter().fold((0.0f32, 0.0f32), |(lo, hi), &a| (lo.min(a), hi.max(a)));
    let scale = ((hi as f64 - lo as f64) as f32) / 255.0;
    let zp = if scale == 0.0 { 0.0 } else { (0.0 - lo / scale).round_ties_even().clamp(0.0, 255.0) };
    let mut y = match Output::new(cx.out, DType::U8, x.shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let dst = y.bytes_mut();
    if scale == 0.0 {
        dst.fill(zp as u8);
    } else {
        for (d, &a) in dst.iter_mut().zip(v) {
            // `as` saturates and sends NaN to 0, as the reference's conversion does.
            *d = ((a / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8;
        }
    }
    Some(Ok(vec![y.finish(), Tensor::scalar(scale), Tensor::from_bytes(DType::U8, &[], &[zp as u8]).ok()?]))
}
