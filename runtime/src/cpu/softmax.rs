//! `aim:Softmax`: attention's scaled, masked softmax over the last axis, one pass per row.

use super::{In, Out};
use crate::pool::ThreadPool;
use aim_kernels::gemm::Isa;

/// Runs `softmax(x · scale + mask)` over the last axis of `x`.
pub(super) fn run(scale: f32, isa: Isa, x: In, mask: Option<In>, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let dst = y.take(x.shape)?;
    aim_kernels::fast::scaled_masked_softmax(isa, pool, x.data, x.shape, scale, mask.map(|m| (m.data, m.shape)), dst)
}

/// Rows per parallel task for rows of `len` elements (the kernel's chunking), for explore.
pub(super) fn schedule(scale: f32, shape: &[usize], masked: bool) -> Vec<String> {
    let len = shape.last().copied().unwrap_or(1).max(1);
    let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
    let per = (16 * 1024 / len).max(1);
    vec![format!(
        "parallel for row chunk in 0..{} of ≤{per} rows: {rows} rows of {len}: y = softmax(x·{scale}{}) (vectorised max, exp, sum)",
        rows.div_ceil(per),
        if masked { " + mask row" } else { "" }
    )]
}
