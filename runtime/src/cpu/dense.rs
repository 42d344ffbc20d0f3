//! `aim:Dense` (MatMul/Gemm with a constant weight) as a packed GEMM.

use super::{activation, const_f32, prep_err, In, Out, Prepared, Residual};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{Graph, Node};
use aim_kernels::gemm::{gemm_rows, Activation, Blocking, Coded, CodedShape, Epilogue, Isa, PackedB};
use std::sync::Arc;

pub(super) struct DensePrep {
    /// Shared with the model's other programs packing the same weight.
    pub(super) weight: std::sync::Arc<PackedB>,
    pub(super) bias: Option<Vec<f32>>,
    pub(super) act: Option<Activation>,
    /// The program applied after the activation (`post`), tile by tile.
    pub(super) post: Option<std::sync::Arc<aim_kernels::ewprog::wide::Wide>>,
    pub(super) k: usize,
    pub(super) n: usize,
    /// Whether each run hands the pages of weights read from a mapped file back after it
    /// (a memory budget's choice, [`super::CpuProgram::release_after_use`]).
    pub(super) release: std::sync::atomic::AtomicBool,
}

pub(super) fn prepare_dense(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<Prepared, RunError> {
    let (weight, k, nn) = if matches!(n.attrs.get("weights"), Some(aim_ir::Attr::String(s)) if s == "q4") {
        coded_weight(g, n, isa, blocking)?
    } else {
        f32_weight(g, n, isa, blocking)?
    };
    let bias = match n.input(2) {
        Some(b) => Some(
            const_f32(g, Some(b))
                .filter(|t| t.len() == nn)
                .ok_or_else(|| prep_err(n, "bias must be constant f32 with one value per output"))?
                .data::<f32>()
                .to_vec(),
        ),
        None => None,
    };
    let post = super::post_program(n, isa)?;
    Ok(Prepared::Dense(Box::new(DensePrep {
        weight,
        bias,
        act: activation(n),
        post,
        k,
        n: nn,
        release: Default::default(),
    })))
}

/// The packed weight (f32, or f16 with `weights = "f16"`), its depth and its outputs.
fn f32_weight(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<(Arc<PackedB>, usize, usize), RunError> {
    let (w, dims, prepacked) = super::prepacked::weight(g, n, 2)?;
    // `trans_b = 1`: the weight is stored `[N, K]` and packed from those bytes as they are
    // (packed weights are always stored with their logical `[K, N]` dims).
    let trans = prepacked.is_none() && n.int("trans_b", 0) != 0;
    let (k, nn) = if trans { (dims[1], dims[0]) } else { (dims[0], dims[1]) };
    // `weights = "f16"` (the `half-weights` pass): held as f16, widened per panel.
    let half = match n.attrs.get("weights") {
        None => false,
        Some(aim_ir::Attr::String(s)) if s == "f16" => true,
        Some(aim_ir::Attr::String(s)) if s == "f32" => false,
        Some(other) => return Err(prep_err(n, format!("weights must be \"f32\" or \"f16\", not {other:?}"))),
    };
    let weight = match prepacked {
        Some("dense") => {
            let floats = aim_kernels::floats::Floats::view(w, 0, w.len())
                .ok_or_else(|| prep_err(n, "prepacked weights are not f32"))?;
            // Packed with the depth blocking recorded beside them (files written before it was
            // recorded: the one this target's caches give, as then).
            let kc = match n.opt_int("packed_kc") {
                None => blocking.kc,
                Some(kc) if (1..=1 << 20).contains(&kc) => kc as usize,
                Some(kc) => return Err(prep_err(n, format!("prepacked weights: packed_kc {kc} is not a depth"))),
            };
            let packed = PackedB::with_packed(isa, Blocking { kc, ..blocking }, k, nn, floats)
                .map_err(|e| prep_err(n, format!("prepacked weights: {e}")))?;
            std::sync::Arc::new(if half { packed.to_half() } else { packed })
        }
        Some(other) => {
            return Err(prep_err(n, format!("prepacked weights: '{other}' weights are not a dense layer's")))
        }
        None => super::shared::packed_b(w, isa, blocking, (k, nn), trans, half),
    };
    Ok((weight, k, nn))
}

/// A dense layer whose weight input holds 4- or 8-bit codes, scales and zero points in the
/// GEMM's panel layout (`aim_kernels::gemm::coded`; the compiler's `coded-weights` pass),
/// its shape in `q4_shape` = `[k, n, block, nr, zeros, bits]`: read in place, checked
/// against the shape and this CPU's panel width.
fn coded_weight(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<(Arc<PackedB>, usize, usize), RunError> {
    let recorded = n.ints("q4_shape");
    let shape = recorded.and_then(CodedShape::from_ints).ok_or_else(|| {
        prep_err(n, format!("coded weights need q4_shape = [k, n, block, nr, 0|1, 4|8], not {recorded:?}"))
    })?;
    let w = n
        .input(1)
        .and_then(|w| g.initializers.get(w))
        .ok_or_else(|| prep_err(n, "coded weights must be a constant u8 tensor"))?;
    // ONNX Runtime's accuracy level 4: rows may be quantized to int8 per block.
    let codes =
        Coded::new(shape, w.clone()).map_err(|e| prep_err(n, e))?.with_int8_rows(n.int("accuracy_level", 0) == 4);
    let weight = Arc::new(PackedB::from_codes(isa, blocking, codes).map_err(|e| prep_err(n, e))?);
    Ok((weight, shape.k, shape.n))
}

pub(super) fn run_dense(
    d: &DensePrep,
    x: In,
    residual: Residual,
    y: &mut Out,
    blocking: Blocking,
    pool: &ThreadPool,
) -> Result<(), String> {
    let xs = x.shape;
    if xs.is_empty() || xs[xs.len() - 1] != d.k {
        return Err(format!("input {xs:?} does not end in {} features", d.k));
    }
    let m: usize = xs[..xs.len() - 1].iter().product();
    let mut shape = xs.to_vec();
    *shape.last_mut().unwrap() = d.n;
    if xs.len() == 1 {
        shape = vec![d.n];
    }
    let (res, residual_in_c) = residual.check(&shape, y)?;
    let y = y.take(&shape)?;
    let ep = Epilogue {
        row_bias: None,
        col_bias: d.bias.as_deref(),
        residual: res,
        residual_in_c,
        act: d.act,
        post: d.post.as_deref(),
    };
    gemm_rows(x.data, m, d.k, blocking, &d.weight, y, d.n, &ep, pool);
    Ok(())
}
