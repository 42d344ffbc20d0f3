//! `aim:QDense`: a dynamically quantized dense layer (what `quantize_dynamic` writes as
//! DynamicQuantizeLinear → MatMulInteger → Cast → Mul, and ONNX Runtime's
//! DynamicQuantizeMatMul) as one kernel: the f32 input quantized to u8 in one pass, the
//! integer GEMM against the weights packed at load time, and the scale and bias applied in
//! its epilogue.
//!
//! Inputs: `x` (f32, `[..., K]`), the weights (s8 or u8 `[K, N]`, constant), their zero
//! point (one or one per column, constant, optional), their scale (f32, one or one per
//! column, constant) and a bias (f32 `[N]`, constant, optional).

use super::{activation, const_f32, prep_err, In, Out, Prepared};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{Attr, DType, Graph, Node};
use aim_kernels::gemm::{Activation, Isa};
use aim_kernels::qgemm::{qgemm, quantize_dynamic, quantize_rows, PackedQB, QEpilogue, QuantizedA};

pub(super) struct QDensePrep {
    pub(super) weight: PackedQB,
    /// The weights' scale: one, or one per column.
    pub(super) scale: Vec<f32>,
    pub(super) bias: Option<Vec<f32>>,
    pub(super) act: Option<Activation>,
    /// A statically quantized input's scale and zero point (in u8 terms: an s8 zero point
    /// plus 128), from `x_scale` / `x_zero`; without them the input is quantized per run
    /// (DynamicQuantizeLinear).
    pub(super) fixed: Option<(f32, u8)>,
}

pub(super) fn prepare(g: &Graph, n: &Node, isa: Isa) -> Result<Prepared, RunError> {
    let w = n
        .input(1)
        .and_then(|w| g.initializers.get(w))
        .filter(|t| matches!(t.dtype(), DType::I8 | DType::U8) && t.shape().len() == 2)
        .ok_or_else(|| prep_err(n, "the weights must be a constant 8-bit [K, N] matrix"))?;
    let (k, cols) = (w.shape()[0], w.shape()[1]);
    let zero: Vec<i32> = match n.input(2) {
        None => vec![0],
        Some(z) => {
            let t = g
                .initializers
                .get(z)
                .filter(|t| t.dtype() == w.dtype() && (t.len() == 1 || t.len() == cols))
                .ok_or_else(|| {
                    prep_err(n, "the weights' zero point must be constant, of their type, one or one per column")
                })?;
            match t.dtype() {
                DType::I8 => t.data::<i8>().iter().map(|&v| v as i32).collect(),
                _ => t.data::<u8>().iter().map(|&v| v as i32).collect(),
            }
        }
    };
    let scale = const_f32(g, n.input(3))
        .filter(|t| t.len() == 1 || t.len() == cols)
        .ok_or_else(|| prep_err(n, "the weights' scale must be constant f32, one or one per column"))?
        .data::<f32>()
        .to_vec();
    let bias = match n.input(4) {
        Some(b) => Some(
            const_f32(g, Some(b))
                .filter(|t| t.len() == cols)
                .ok_or_else(|| prep_err(n, "the bias must be constant f32 with one value per column"))?
                .data::<f32>()
                .to_vec(),
        ),
        None => None,
    };
    let weight = PackedQB::for_isa(isa, w.bytes(), w.dtype() == DType::I8, k, cols, &zero)
        .map_err(|e| prep_err(n, format!("packing the weights: {e}")))?;
    let fixed = match (n.attrs.get("x_scale"), n.attrs.get("x_zero")) {
        (None, None) => None,
        (Some(Attr::Float(s)), Some(Attr::Int(z))) if *s > 0.0 && s.is_finite() && (0..=255).contains(z) => {
            Some((*s, *z as u8))
        }
        _ => return Err(prep_err(n, "x_scale and x_zero must be a positive scale and a zero point from 0 to 255")),
    };
    Ok(Prepared::QDense(Box::new(QDensePrep { weight, scale, bias, act: activation(n), fixed })))
}

pub(super) fn run(d: &QDensePrep, isa: Isa, x: In, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let (k, cols) = (d.weight.k(), d.weight.n());
    let xs = x.shape;
    if xs.is_empty() || xs[xs.len() - 1] != k {
        return Err(format!("input {xs:?} does not end in {k} features"));
    }
    let m: usize = xs[..xs.len() - 1].iter().product();
    if x.data.len() < m * k {
        return Err(format!("input {xs:?} holds {} values", x.data.len()));
    }
    let mut shape = xs.to_vec();
    *shape.last_mut().expect("checked not empty") = cols;
    let stride = k.div_ceil(4) * 4;
    let mut q = aim_kernels::scratch::take_bytes(m * stride);
    let mut sums = vec![0i32; if d.weight.needs_row_sums() { m } else { 0 }];
    let (xscale, zero) = match d.fixed {
        Some((s, z)) => {
            quantize_rows(isa, &x.data[..m * k], k, &mut q, stride, &mut sums, s, z as f32, pool);
            (s, z as i32)
        }
        None => quantize_dynamic(isa, &x.data[..m * k], k, &mut q, stride, &mut sums, pool),
    };
    // The scale of the product, as the graph computes it: the input's times the weights'.
    let scale: Vec<f32> = d.scale.iter().map(|s| xscale * s).collect();
    let out = y.take(&shape)?;
    let a = QuantizedA { data: &q, m, stride, zero, row_sums: &sums };
    let ep = QEpilogue { scale: &scale, bias: d.bias.as_deref(), act: d.act };
    qgemm(isa, &a, &d.weight, &ep, out, cols, pool);
    Ok(())
}

/// How it runs, for `aim explore --stage scheduled`, with `m` rows of input.
pub(super) fn schedule(d: &QDensePrep, isa: Isa, m: usize, threads: usize) -> Vec<String> {
    use aim_kernels::qgemm::{MR, NR};
    let (k, n) = (d.weight.k(), d.weight.n());
    let micro = d.weight.micro_name(isa);
    let panels = n.div_ceil(NR);
    let blocks = m.div_ceil(MR);
    let splits = (threads * 4).div_ceil(panels).clamp(1, blocks.max(1));
    vec![
        match d.fixed {
            Some((s, z)) => {
                format!("quantize A[{m}×{k}] to u8 (QuantizeLinear, scale {s} zero {z}: one pass with row sums)")
            }
            None => format!("quantize A[{m}×{k}] to u8 (DynamicQuantizeLinear: range, then one pass with row sums)"),
        },
        format!("C[{m}×{n}] = A·W in i32 (W s8, packed at load time in panels of {NR} columns × groups of 4 rows)"),
        format!("  parallel for column panel × row split in 0..{} ({panels} panels, {splits} splits)", panels * splits),
        format!(
            "    for row tile ({blocks} tiles of {MR}): microkernel {micro} {MR}×{NR} over {} groups of 4{}",
            k.div_ceil(4),
            match d.weight.corrections() {
                0 => String::new(),
                c => format!(", {c} packed weights corrected per row"),
            }
        ),
        format!(
            "    epilogue on the tile in registers: − zero-point terms, × scale ({}), {}, {}",
            if d.scale.len() == 1 { "per tensor" } else { "per column" },
            if d.bias.is_some() { "+ bias" } else { "no bias" },
            d.act.map_or("no activation".to_string(), |a| a.text())
        ),
    ]
}
