//! `aim:QConv`: a statically quantized 2-D convolution (what ONNX Runtime's QDQ and
//! QOperator quantizers write around Conv) on the integer kernel: the f32 input quantized
//! with the model's scale and zero point, s8 weights packed at load time, exact i32 sums
//! and the dequantization, bias and activation in the epilogue (`aim_kernels::qconv`).
//!
//! Inputs: `x` (f32 NCHW), the weights (s8 `[M, C/group, kh, kw]`, constant, zero point
//! 0), the input's scale and zero point (constant, one each; u8 or s8), the weights' scale
//! (f32, one or one per output channel) and a bias (f32 `[M]`, constant, optional).

use super::{activation, const_f32, prep_err, In, Out, Prepared};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{DType, Graph, Node};
use aim_kernels::gemm::{Activation, Isa};
use aim_kernels::qconv::{qconv, PackedQConv, QConvInput, QConvShape, QSource, Requant};

pub(super) struct QConvPrep {
    pub(super) weight: PackedQConv,
    pub(super) x_scale: f32,
    /// In u8 terms (an s8 zero point plus 128).
    pub(super) x_zero: u8,
    /// Input scale × weight scale: one, or one per output channel.
    pub(super) out_scale: Vec<f32>,
    pub(super) bias: Option<Vec<f32>>,
    pub(super) act: Option<Activation>,
    /// The quantize-dequantize pair fused after it (`requant_scale`, `requant_zero`,
    /// `requant_min`, `requant_max`).
    pub(super) requant: Option<Requant>,
}

/// The weights of a quantized convolution node (a constant s8 `[M, C/group, kh, kw]`),
/// the convolution's shape, and its bias (input `bias`, constant f32, one per output
/// channel): checked, not yet packed, so the caller packs only the layout its kernel reads.
pub(super) fn weights<'g>(
    g: &'g Graph,
    n: &Node,
    bias: usize,
) -> Result<(&'g aim_ir::Tensor, QConvShape, Option<Vec<f32>>), RunError> {
    let w = n
        .input(1)
        .and_then(|w| g.initializers.get(w))
        .filter(|t| t.dtype() == DType::I8 && t.shape().len() == 4)
        .ok_or_else(|| prep_err(n, "the weights must be a constant s8 [M, C/group, kh, kw] tensor"))?;
    let ws = w.shape();
    let bias = match n.input(bias) {
        Some(b) => Some(
            const_f32(g, Some(b))
                .filter(|t| t.len() == ws[0])
                .ok_or_else(|| prep_err(n, "the bias must be constant f32 with one value per output channel"))?
                .data::<f32>()
                .to_vec(),
        ),
        None => None,
    };
    let win = super::int8::window(n, [ws[2], ws[3]])?;
    let group = usize::try_from(n.int("group", 1))
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| prep_err(n, "group must be positive"))?;
    let shape = QConvShape {
        c: ws[1] * group,
        m: ws[0],
        group,
        kernel: win.kernel,
        stride: win.stride,
        dilation: win.dilation,
        pads: win.pads,
    };
    Ok((w, shape, bias))
}

/// [`weights`] packed for the byte kernel with the node's window and groups, and the bias.
fn packed_weights(g: &Graph, n: &Node, bias: usize) -> Result<(PackedQConv, Option<Vec<f32>>), RunError> {
    let (w, shape, bias) = weights(g, n, bias)?;
    let weight = PackedQConv::new(shape, w.bytes()).map_err(|e| prep_err(n, format!("packing the weights: {e}")))?;
    Ok((weight, bias))
}

pub(super) fn prepare(g: &Graph, n: &Node) -> Result<Prepared, RunError> {
    let (weight, bias) = packed_weights(g, n, 5)?;
    let m = weight.shape().m;
    let x_scale = const_f32(g, n.input(2))
        .filter(|t| t.len() == 1)
        .map(|t| t.data::<f32>()[0])
        .ok_or_else(|| prep_err(n, "the input's scale must be one constant f32"))?;
    let x_zero = match n.input(3).and_then(|z| g.initializers.get(z)).filter(|t| t.len() == 1) {
        Some(t) if t.dtype() == DType::U8 => t.data::<u8>()[0],
        Some(t) if t.dtype() == DType::I8 => (t.data::<i8>()[0] as i16 + 128) as u8,
        _ => return Err(prep_err(n, "the input's zero point must be one constant u8 or s8")),
    };
    let w_scale = const_f32(g, n.input(4))
        .filter(|t| t.len() == 1 || t.len() == m)
        .ok_or_else(|| prep_err(n, "the weights' scale must be constant f32, one or one per output channel"))?;
    let out_scale = w_scale.data::<f32>().iter().map(|s| x_scale * s).collect();
    let requant = n.attrs.contains_key("requant_scale").then(|| Requant {
        scale: n.float("requant_scale", 1.0),
        zero: n.float("requant_zero", 0.0),
        lo: n.float("requant_min", 0.0),
        hi: n.float("requant_max", 255.0),
    });
    if requant.is_some_and(|q| !(q.scale.is_finite() && q.scale != 0.0 && q.lo <= q.hi)) {
        return Err(prep_err(n, "the requantization needs a finite nonzero scale and an ordered range"));
    }
    Ok(Prepared::QConv(Box::new(QConvPrep { weight, x_scale, x_zero, out_scale, bias, act: activation(n), requant })))
}

pub(super) fn run(q: &QConvPrep, isa: Isa, x: In, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let s = *q.weight.shape();
    let xs = x.shape;
    if xs.len() != 4 || xs[1] != s.c {
        return Err(format!("input {xs:?} is not NCHW with {} channels", s.c));
    }
    let (n, h, w) = (xs[0], xs[2], xs[3]);
    let (oh, ow) = s.output(h, w).ok_or_else(|| format!("the {:?} kernel does not fit the {h}×{w} input", s.kernel))?;
    if x.data.len() < n * s.c * h * w {
        return Err(format!("input {xs:?} holds {} values", x.data.len()));
    }
    let out = y.take(&[n, s.m, oh, ow])?;
    let input = QConvInput {
        x: QSource::F32(x.data),
        n,
        h,
        w,
        scale: q.x_scale,
        zero: q.x_zero,
        offset: None,
        out_scale: &q.out_scale,
        bias: q.bias.as_deref(),
        act: q.act,
        requant: q.requant,
        post: None,
    };
    qconv(isa, &q.weight, &input, out, pool);
    Ok(())
}

/// How it runs, for `aim explore --stage scheduled`, for an `h × w` input.
pub(super) fn schedule(q: &QConvPrep, isa: Isa, n: usize, h: usize, w: usize) -> Vec<String> {
    use aim_kernels::qgemm::{MR, NR};
    let s = q.weight.shape();
    let Some((oh, ow)) = s.output(h, w) else { return vec!["the kernel does not fit the input".into()] };
    let taps = s.c / s.group * s.kernel[0] * s.kernel[1];
    let micro = aim_kernels::qgemm::micro_name(isa);
    let rq = q
        .requant
        .map_or(String::new(), |r| format!(", then quantize-dequantize (scale {}, zero point {})", r.scale, r.zero));
    vec![
        format!("for image in 0..{n}: quantize x[{}×{h}×{w}] to u8 (scale {}, zero point {})", s.c, q.x_scale, q.x_zero),
        format!(
            "  for group in 0..{}: gather {taps} taps × {} pixels into panels of {NR} pixels × groups of 4 taps (padding = zero point)",
            s.group,
            oh * ow
        ),
        format!(
            "    C[{} ch × {} px] = W[{}×{taps}] (s8, load time) · taps in i32: microkernel {micro} {MR}×{NR}",
            s.m / s.group,
            oh * ow,
            s.m / s.group
        ),
        format!(
            "    epilogue: − zero point × Σw, × scale ({}), {}, {}{rq}",
            if q.out_scale.len() == 1 { "per tensor" } else { "per channel" },
            if q.bias.is_some() { "+ bias" } else { "no bias" },
            q.act.map_or("no activation".to_string(), |a| a.text())
        ),
    ]
}
