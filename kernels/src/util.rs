//! Helpers shared by the kernels: input access, axis normalisation, broadcasting, strides.

use crate::KernelError;
use aim_ir::{DType, Tensor};

/// Kernel result type.
pub type Result<T> = std::result::Result<T, KernelError>;

/// Builds an error from a message.
pub fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(KernelError(msg.into()))
}

/// Input `i`, which the op requires.
pub fn req(ins: &[Option<Tensor>], i: usize) -> Result<&Tensor> {
    match ins.get(i) {
        Some(Some(t)) => Ok(t),
        _ => err(format!("input {i} is required")),
    }
}

/// Input `i` if given.
pub fn opt(ins: &[Option<Tensor>], i: usize) -> Option<&Tensor> {
    ins.get(i).and_then(|t| t.as_ref())
}

/// Normalises a possibly negative axis against `rank` (`-1` is the last axis).
pub fn axis(a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if x < 0 || x >= r {
        return err(format!("axis {a} is out of range for a tensor of rank {rank}"));
    }
    Ok(x as usize)
}

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Checks that a `dtype` output of `shape` can be allocated (its size is computable and
/// within the tensor limit: `aim_ir::limits`), returning its element count. Every kernel
/// whose output shape comes from data or attributes calls this before allocating it.
pub fn check_out(dtype: DType, shape: &[usize]) -> Result<usize> {
    aim_ir::limits::check(dtype, shape).map_err(|e| KernelError(format!("output: {e}")))
}

/// Checks that `n` elements of `elem_bytes` each may be allocated (scratch and index
/// buffers sized by an output).
pub fn check_count(n: usize, elem_bytes: usize) -> Result<()> {
    aim_ir::limits::check_count(n, elem_bytes).map_err(|e| KernelError(format!("a buffer of {n} elements: {e}")))
}

/// A shape's element count, or an error if the product of its dims overflows.
pub fn elements(shape: &[usize]) -> Result<usize> {
    aim_ir::limits::elements(shape).map_err(|e| KernelError(e.to_string()))
}

/// The numpy-style broadcast of several shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let r = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; r];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[r - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return err(format!("shapes {:?} cannot be broadcast together", shapes));
            }
        }
    }
    elements(&out)?;
    Ok(out)
}

/// For each element of a tensor of shape `out` (row-major), the offset `sum(idx[d] *
/// steps[d])`: the walk that broadcasting and transposition both are.
pub fn strided_offsets(out: &[usize], steps: &[usize]) -> Result<Vec<usize>> {
    let n = elements(out)?;
    check_count(n, std::mem::size_of::<usize>())?;
    let r = out.len();
    let mut offs = Vec::with_capacity(n);
    let mut idx = vec![0usize; r];
    let mut off = 0usize;
    for _ in 0..n {
        offs.push(off);
        for d in (0..r).rev() {
            idx[d] += 1;
            off += steps[d];
            if idx[d] < out[d] {
                break;
            }
            off -= steps[d] * idx[d];
            idx[d] = 0;
        }
    }
    Ok(offs)
}

/// For each element of `out` (row-major), the offset of the element of a tensor of shape
/// `shape` that broadcasting maps to it.
pub fn broadcast_offsets(shape: &[usize], out: &[usize]) -> Result<Vec<usize>> {
    strided_offsets(out, &broadcast_strides(shape, out))
}

/// The strides of `shape` read as `out` (which it broadcasts to): its own strides, right
/// aligned, and 0 along the dims it repeats.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let r = out.len();
    let st = strides(shape);
    let mut bst = vec![0usize; r];
    for i in 0..shape.len() {
        if shape[i] != 1 {
            bst[r - shape.len() + i] = st[i];
        }
    }
    bst
}

/// A tensor broadcast (materialised) to `out`.
pub fn expand_to(t: &Tensor, out: &[usize]) -> Result<Tensor> {
    if t.shape() == out {
        return Ok(t.clone());
    }
    check_out(t.dtype(), out)?;
    let offs = broadcast_offsets(t.shape(), out)?;
    gather_elems(t, out, &offs)
}

/// A new tensor of shape `shape` whose element i is `t`'s element `offs[i]`.
pub fn gather_elems(t: &Tensor, shape: &[usize], offs: &[usize]) -> Result<Tensor> {
    let sz = t.dtype().size();
    let src = t.bytes();
    let mut out = Tensor::try_zeros(t.dtype(), shape).map_err(|e| KernelError(format!("output: {e}")))?;
    if offs.len() != out.len() || offs.iter().any(|&o| o >= t.len()) {
        return err("internal: gather offsets do not fit the tensors");
    }
    let dst = out.bytes_mut();
    for (i, &o) in offs.iter().enumerate() {
        dst[i * sz..(i + 1) * sz].copy_from_slice(&src[o * sz..(o + 1) * sz]);
    }
    Ok(out)
}

/// An integer input read as i64 values (shapes, axes, indices).
pub fn ints_of(t: &Tensor) -> Result<Vec<i64>> {
    if !t.dtype().is_int() {
        return err(format!("expected an integer tensor, got {}", t.dtype()));
    }
    Ok(t.to_i64_vec())
}

/// Checks that all the given tensors share one dtype.
pub fn same_dtype(ts: &[&Tensor]) -> Result<DType> {
    let d = ts[0].dtype();
    for t in ts {
        if t.dtype() != d {
            return err(format!("inputs must share one element type, found {} and {}", d, t.dtype()));
        }
    }
    Ok(d)
}

/// A row-major transpose of `t` by `perm`.
pub fn transpose(t: &Tensor, perm: &[usize]) -> Result<Tensor> {
    if perm == [1, 0] {
        if let Some(y) = transpose_2d(t) {
            return Ok(y);
        }
    }
    let shape = t.shape();
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let st = strides(shape);
    let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let offs = strided_offsets(&out_shape, &pst)?;
    gather_elems(t, &out_shape, &offs)
}

/// A matrix transposed in 32×32 tiles by element size (weights of `Gemm(transB=1)` made
/// `[K, N]` at compile time: megabytes, where offsets per element would cost as much again);
/// None where the output may not be allocated (the general path reports it).
fn transpose_2d(t: &Tensor) -> Option<Tensor> {
    fn tiles<T: bytemuck::Pod>(src: &[T], dst: &mut [T], rows: usize, cols: usize) {
        const B: usize = 32;
        for r0 in (0..rows).step_by(B) {
            for c0 in (0..cols).step_by(B) {
                for r in r0..(r0 + B).min(rows) {
                    for c in c0..(c0 + B).min(cols) {
                        dst[c * rows + r] = src[r * cols + c];
                    }
                }
            }
        }
    }
    let (rows, cols) = (t.shape()[0], t.shape()[1]);
    check_out(t.dtype(), &[cols, rows]).ok()?;
    let mut y = Tensor::zeros(t.dtype(), &[cols, rows]);
    let (src, dst) = (t.bytes(), y.bytes_mut());
    // Elements as byte arrays: no alignment needed (weights may sit anywhere in the file).
    match t.dtype().size() {
        1 => tiles::<u8>(src, dst, rows, cols),
        2 => tiles::<[u8; 2]>(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst), rows, cols),
        4 => tiles::<[u8; 4]>(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst), rows, cols),
        8 => tiles::<[u8; 8]>(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst), rows, cols),
        _ => return None,
    }
    Some(y)
}

/// Requires a floating-point input.
pub fn need_float(t: &Tensor, what: &str) -> Result<()> {
    if !t.dtype().is_float() {
        return err(format!("{what} must be a floating-point tensor, got {}", t.dtype()));
    }
    Ok(())
}

/// A raw pointer to a buffer that the tasks of one parallel loop share, each writing a part
/// no other task writes (every use says which), so that the loop's closure is `Sync`.
#[derive(Debug)]
pub(crate) struct SharedMut<T>(pub(crate) *mut T);

impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}
// SAFETY: every user hands each task a disjoint part of the buffer, which outlives the loop.
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}
