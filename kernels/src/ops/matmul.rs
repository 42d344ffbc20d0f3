//! MatMul (numpy batching and broadcasting) and Gemm.

use crate::dispatch;
use crate::num::Num;
use crate::util::{broadcast_offsets, broadcast_shapes, err, opt, req, same_dtype, Result};
use aim_ir::{DType, Node, Tensor};

/// C[m×n] += A[m×k] · B[k×n], row-major, in the element type (i-k-j order, which the
/// compiler vectorises; this is the oracle, the fast paths live in the compiled backend).
pub fn gemm_acc<T: Num>(a: &[T], b: &[T], c: &mut [T], m: usize, k: usize, n: usize) {
    for i in 0..m {
        let crow = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let av = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for (cv, &bv) in crow.iter_mut().zip(brow) {
                *cv = cv.add(av.mul(bv));
            }
        }
    }
}

/// Half-precision tensors are computed in f32 and rounded once at the end.
pub fn widen(t: &Tensor) -> Tensor {
    match t.dtype() {
        DType::F16 | DType::BF16 => Tensor::from_f64(DType::F32, t.shape(), &t.to_f64_vec()),
        _ => t.clone(),
    }
}

/// The inverse of [`widen`].
pub fn narrow(t: Tensor, dt: DType) -> Tensor {
    if t.dtype() == dt {
        t
    } else {
        Tensor::from_f64(dt, t.shape(), &t.to_f64_vec())
    }
}

fn matmul(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a0, b0) = (req(ins, 0)?, req(ins, 1)?);
    let dt = same_dtype(&[a0, b0])?;
    if dt == DType::Bool {
        return err("MatMul is not defined for bool");
    }
    if a0.rank() == 0 || b0.rank() == 0 {
        return err("MatMul inputs must have rank at least 1");
    }
    let (a, b) = (widen(a0), widen(b0));
    let a_shape: Vec<usize> = if a.rank() == 1 { vec![1, a.shape()[0]] } else { a.shape().to_vec() };
    let b_shape: Vec<usize> = if b.rank() == 1 { vec![b.shape()[0], 1] } else { b.shape().to_vec() };
    let (m, k) = (a_shape[a_shape.len() - 2], a_shape[a_shape.len() - 1]);
    let (k2, n) = (b_shape[b_shape.len() - 2], b_shape[b_shape.len() - 1]);
    if k != k2 {
        return err(format!("MatMul inner dimensions differ: {:?} × {:?}", a0.shape(), b0.shape()));
    }
    let (ab, bb) = (&a_shape[..a_shape.len() - 2], &b_shape[..b_shape.len() - 2]);
    let batch = broadcast_shapes(&[ab, bb])?;
    let (oa, ob) = (broadcast_offsets(ab, &batch)?, broadcast_offsets(bb, &batch)?);
    let mut out_shape = batch.clone();
    if a0.rank() > 1 {
        out_shape.push(m);
    }
    if b0.rank() > 1 {
        out_shape.push(n);
    }
    // Computed in the widened type (f64 or i64 at most: 8 bytes).
    crate::util::check_out(a.dtype(), &out_shape)?;
    crate::util::check_count(crate::util::elements(&[oa.len(), m, n])?, 8)?;
    let out = dispatch!(a.dtype(), T => {
        let (ad, bd) = (a.data::<T>(), b.data::<T>());
        let mut c = vec![T::zero(); oa.len() * m * n];
        for (bi, (&ia, &ib)) in oa.iter().zip(&ob).enumerate() {
            gemm_acc(&ad[ia * m * k..(ia + 1) * m * k], &bd[ib * k * n..(ib + 1) * k * n], &mut c[bi * m * n..(bi + 1) * m * n], m, k, n);
        }
        Tensor::from_vec(&out_shape, c)
    }, bool => unreachable!());
    Ok(vec![narrow(out, dt)])
}

fn gemm(node: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a0, b0) = (req(ins, 0)?, req(ins, 1)?);
    let dt = same_dtype(&[a0, b0])?;
    if a0.rank() != 2 || b0.rank() != 2 {
        return err(format!("Gemm needs 2-D A and B, got {:?} and {:?}", a0.shape(), b0.shape()));
    }
    let a = if node.int("transA", 0) != 0 { crate::util::transpose(a0, &[1, 0])? } else { a0.clone() };
    let b = if node.int("transB", 0) != 0 { crate::util::transpose(b0, &[1, 0])? } else { b0.clone() };
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    if b.shape()[0] != k {
        return err(format!("Gemm inner dimensions differ: A is {m}×{k}, B is {}×{n}", b.shape()[0]));
    }
    crate::util::check_out(dt, &[m, n])?;
    crate::util::check_count(crate::util::elements(&[m, n])?, 8)?;
    let (alpha, beta) = (node.float_attr("alpha") as f64, node.float_attr("beta") as f64);
    let (a, b) = (widen(&a), widen(&b));
    let c_in = opt(ins, 2).map(|c| {
        broadcast_shapes(&[c.shape(), &[m, n]]).and_then(|s| {
            if s != [m, n] {
                err(format!("Gemm's C of shape {:?} does not broadcast to {m}×{n}", c.shape()))
            } else {
                Ok(widen(&crate::util::expand_to(c, &[m, n])?))
            }
        })
    });
    let c_in = c_in.transpose()?;
    let out = dispatch!(a.dtype(), T => {
        let mut c = vec![T::zero(); m * n];
        gemm_acc(a.data::<T>(), b.data::<T>(), &mut c, m, k, n);
        if alpha != 1.0 {
            let al = T::from_f64(alpha);
            c.iter_mut().for_each(|v| *v = v.mul(al));
        }
        if let Some(ct) = &c_in {
            let be = T::from_f64(beta);
            for (v, &x) in c.iter_mut().zip(ct.data::<T>()) {
                *v = v.add(if beta == 1.0 { x } else { be.mul(x) });
            }
        }
        Tensor::from_vec(&[m, n], c)
    }, bool => return err("Gemm is not defined for bool"));
    Ok(vec![narrow(out, dt)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[("MatMul", matmul), ("Gemm", gemm)];
