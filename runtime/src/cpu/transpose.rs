//! `aim:Transpose`: the copy loop the compiler generated for the node's rank, run over
//! chunks of output rows on the pool (the blocked-layout reorders run it too).

use super::elementwise::CHUNK;
use super::{prep_err, In, Out, OutPtr, Prepared, TransposeFn};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::Node;
use aim_kernels::gemm::Parallel;

/// A prepared transpose: its generated loop and permutation.
pub(super) struct Transpose {
    f: TransposeFn,
    pub(super) perm: Vec<usize>,
}

/// Prepares an `aim:Transpose` node with the loop generated for it.
pub(super) fn prepare(n: &Node, f: Option<TransposeFn>) -> Result<Prepared, RunError> {
    let f = f.ok_or_else(|| prep_err(n, "no code was generated for this node"))?;
    let perm = n.ints("perm").ok_or_else(|| prep_err(n, "aim:Transpose needs its perm"))?;
    let r = perm.len();
    let mut seen = vec![false; r];
    for &p in perm {
        if p < 0 || p as usize >= r || std::mem::replace(&mut seen[p as usize], true) {
            return Err(prep_err(n, format!("perm {perm:?} is not a permutation")));
        }
    }
    Ok(Prepared::Transpose(Transpose { f, perm: perm.iter().map(|&p| p as usize).collect() }))
}

/// Output rows per parallel task for rows of `inner` elements.
pub(super) fn rows_per_task(inner: usize) -> usize {
    (CHUNK / inner.max(1)).max(1)
}

/// Runs a transpose of `x`.
pub(super) fn run(t: &Transpose, x: In, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let (xs, r) = (x.shape, t.perm.len());
    if xs.len() != r {
        return Err(format!("input {xs:?} does not have the {r} dims of perm {:?}", t.perm));
    }
    let shape: Vec<usize> = t.perm.iter().map(|&p| xs[p]).collect();
    copy(t.f, x.data, xs, &t.perm, y.take(&shape)?, pool);
    Ok(())
}

/// Writes into `dst` the transpose by `perm` of `x` (shape `xs`) with the generated loop `f`
/// (compiled for `perm`'s rank and for whether its last axis stays last).
pub(super) fn copy(f: TransposeFn, x: &[f32], xs: &[usize], perm: &[usize], dst: &mut [f32], pool: &ThreadPool) {
    let r = perm.len();
    let shape: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    assert!(
        xs.len() == r && x.len() == xs.iter().product::<usize>() && dst.len() == x.len(),
        "transpose operands do not fit"
    );
    let mut strides = vec![1usize; r];
    for d in (0..r - 1).rev() {
        strides[d] = strides[d + 1] * xs[d + 1];
    }
    // The descriptor the generated loop reads: outer output dims, their source strides, the
    // row length and its source stride.
    let mut desc: Vec<usize> = shape[..r - 1].to_vec();
    desc.extend(perm[..r - 1].iter().map(|&p| strides[p]));
    desc.push(shape[r - 1]);
    desc.push(strides[perm[r - 1]]);
    let rows: usize = shape[..r - 1].iter().product();
    let inner = shape[r - 1];
    if dst.is_empty() {
        return;
    }
    let per = rows_per_task(inner);
    let (xp, yp, dp) = (x.as_ptr() as usize, OutPtr(dst.as_mut_ptr()), desc.as_ptr() as usize);
    pool.for_each(rows.div_ceil(per), &|k| {
        let yp = yp;
        let (r0, r1) = (k * per, ((k + 1) * per).min(rows));
        // SAFETY: x holds the input (its shape and strides are what desc says), y the
        // output; rows [r0, r1) of y are written by this task only, and they read only
        // elements of x.
        unsafe { f(xp as *const f32, yp.0, dp as *const usize, r0, r1) };
    });
}
