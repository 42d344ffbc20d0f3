//! `aim:QMatMul`: the product of two quantized activations (both sides computed at run
//! time: an attention head's Q·Kᵀ and P·V in a QDQ model) on the integer GEMM. A is
//! quantized once for every batch item, each B item is quantized and packed per run
//! (`K × N` bytes, small beside the `M × K × N` products), and the sums, exact, are
//! scaled by the two scales' product in the epilogue.

use super::ops::Ctx;
use super::output::Output;
use crate::qgemm::{qgemm, quantize_rows, PackedQB, QEpilogue, QuantizedA};
use crate::util::{broadcast_offsets, err, Result};
use aim_ir::{DType, Node, Tensor};

/// Runs an `aim:QMatMul` node: inputs A `[.., M, K]` and B `[.., K, N]` (f32; B's batch
/// dims equal to A's, or all 1), attributes `a_scale`, `a_zero`, `b_scale`, `b_zero` (zero
/// points in u8 terms, 0 to 255). `None` (not f32): the caller reports the node as
/// unsupported.
pub fn qmatmul(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let f32_in = |i: usize| ins.get(i)?.as_ref().filter(|t| t.dtype() == DType::F32);
    let (a, b) = (f32_in(0)?, f32_in(1)?);
    let side = |s: &str, z: &str| -> Result<(f32, i32)> {
        let (scale, zero) = (n.float(s, 0.0), n.int(z, -1));
        if !(scale > 0.0 && scale.is_finite() && (0..=255).contains(&zero)) {
            return err(format!("{s} must be positive and {z} from 0 to 255, not {scale} and {zero}"));
        }
        Ok((scale, zero as i32))
    };
    Some(side("a_scale", "a_zero").and_then(|qa| side("b_scale", "b_zero").and_then(|qb| run(a, b, qa, qb, cx))))
}

fn run(a: &Tensor, b: &Tensor, (sa, za): (f32, i32), (sb, zb): (f32, i32), cx: &Ctx) -> Result<Vec<Tensor>> {
    let (ash, bsh) = (a.shape(), b.shape());
    let (ra, rb) = (ash.len(), bsh.len());
    if ra < 2 || rb < 2 || ash[ra - 1] != bsh[rb - 2] {
        return err(format!("A {ash:?} and B {bsh:?} do not fit: [.., M, K] and [.., K, N] expected"));
    }
    let (m, k, n) = (ash[ra - 2], ash[ra - 1], bsh[rb - 1]);
    let batch = &ash[..ra - 2];
    let b_batch = &bsh[..rb - 2];
    if b_batch != batch && b_batch.iter().any(|&d| d != 1) {
        return err(format!("B {bsh:?} must have A {ash:?}'s batch dims, or only 1s there"));
    }
    let items: usize = batch.iter().product();
    let b_items: usize = b_batch.iter().product();
    let b_of = broadcast_offsets(b_batch, batch)?;
    let mut shape = batch.to_vec();
    shape.extend([m, n]);
    let mut y = Output::new(cx.out, DType::F32, &shape)?;
    if items * m * n == 0 {
        return Ok(vec![y.finish()]);
    }
    // A: every row quantized once, rows padded to groups of four bytes, with their sums
    // (B's zero point needs them).
    let stride = k.div_ceil(4) * 4;
    let rows = items * m;
    let mut qa = crate::scratch::take_bytes(rows * stride);
    let mut sums = vec![0i32; rows];
    quantize_rows(cx.isa, &a.data::<f32>()[..rows * k], k, &mut qa, stride, &mut sums, sa, za as f32, cx.par);
    // B: each item quantized (rows of N bytes) and packed once, then used by every A item
    // that reads it.
    let mut qb = vec![0u8; b_items * k * n];
    quantize_rows(cx.isa, &b.data::<f32>()[..b_items * k * n], n, &mut qb, n, &mut [], sb, zb as f32, cx.par);
    let packed: Vec<PackedQB> = (0..b_items)
        .map(|t| PackedQB::for_isa(cx.isa, &qb[t * k * n..(t + 1) * k * n], false, k, n, &[zb]))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| crate::KernelError(format!("packing B: {e}")))?;
    let scale = [sa * sb];
    let ep = QEpilogue { scale: &scale, bias: None, act: None };
    let out = y.bits_mut();
    for (t, &bo) in b_of.iter().enumerate() {
        let qa = QuantizedA {
            data: &qa[t * m * stride..(t + 1) * m * stride],
            m,
            stride,
            zero: za,
            row_sums: &sums[t * m..(t + 1) * m],
        };
        qgemm(cx.isa, &qa, &packed[bo], &ep, &mut out[t * m * n..(t + 1) * m * n], n, cx.par);
    }
    Ok(vec![y.finish()])
}
