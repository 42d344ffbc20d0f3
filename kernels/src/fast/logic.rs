//! Fast kernels of any dtype for the masks, conversions and index tensors of real models
//! (attention masks, position ids, sample-rate switches): Where, the comparisons, the
//! boolean ops, Cast and Expand. Broadcasting runs row by row (each operand's offset
//! per row of the output's last dim, and its step along the row, 0 or 1) instead of the
//! reference kernels' offset per element, and large outputs are written in parallel.
//!
//! Each follows its reference kernel's semantics exactly (the conversions are the same
//! `Num` ones) and returns `None` for what it does not take, leaving errors to it.

use super::output::Output;
use super::Ctx;
use crate::dispatch;
use crate::num::Num;
use crate::util::SharedMut;
use crate::util::{broadcast_shapes, broadcast_strides, Result};
use aim_ir::{DType, Node, Tensor};

/// Below this many output elements a kernel runs on the calling thread.
const SERIAL: usize = 16 * 1024;

/// How an operand is read along the output: the offset of each output row's first element
/// and the step along a row (1, or 0 where the operand is broadcast along the last dim).
pub(super) struct Rows {
    pub(super) base: Vec<usize>,
    pub(super) step: usize,
}

/// The rows of `shape` broadcast to `out` (which `broadcast_shapes` made from it).
pub(super) fn rows(shape: &[usize], out: &[usize]) -> Rows {
    let r = out.len();
    let bst = broadcast_strides(shape, out);
    let (outer, step) = if r == 0 { (&[][..], 0) } else { (&out[..r - 1], bst[r - 1]) };
    let count: usize = outer.iter().product();
    let mut base = Vec::with_capacity(count);
    let mut idx = vec![0usize; outer.len()];
    for _ in 0..count {
        base.push(idx.iter().zip(&bst).map(|(i, s)| i * s).sum());
        for d in (0..outer.len()).rev() {
            idx[d] += 1;
            if idx[d] < outer[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Rows { base, step }
}

/// Runs `row(r, dst_row)` for every row `r` of an output of `total` elements in rows of
/// `inner`, in parallel when the output is large.
fn for_rows<D: bytemuck::Pod + Send>(cx: &Ctx, dst: &mut [D], inner: usize, row: &(dyn Fn(usize, &mut [D]) + Sync)) {
    if inner == 0 || dst.is_empty() {
        return;
    }
    let count = dst.len() / inner;
    if dst.len() < SERIAL {
        for (r, d) in dst.chunks_exact_mut(inner).enumerate() {
            row(r, d);
        }
        return;
    }
    let per = (SERIAL / inner).max(1);
    let out = SharedMut(dst.as_mut_ptr() as *mut u8);
    cx.par.for_each(count.div_ceil(per), &|t| {
        let out = out;
        for r in t * per..((t + 1) * per).min(count) {
            // SAFETY: task t owns rows t·per.., disjoint and in bounds of `dst`.
            let d = unsafe { std::slice::from_raw_parts_mut((out.0 as *mut D).add(r * inner), inner) };
            row(r, d);
        }
    });
}

/// The elements of `t` as `T`, when its bytes are aligned for it (memory-mapped weights
/// need not be).
fn elems<T: bytemuck::Pod>(t: &Tensor) -> Option<&[T]> {
    // A constant's bytes sliced out of the model file may be unaligned for T: viewed
    // through an aligned copy, made once.
    bytemuck::try_cast_slice(t.aligned_bytes(std::mem::align_of::<T>())).ok()
}

/// Where(cond, x, y) of any dtype, by element size.
pub(super) fn where_(_n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let (c, x, y) = (ins.first()?.as_ref()?, ins.get(1)?.as_ref()?, ins.get(2)?.as_ref()?);
    if c.dtype() != DType::Bool || x.dtype() != y.dtype() {
        return None;
    }
    let shape = broadcast_shapes(&[c.shape(), x.shape(), y.shape()]).ok()?;
    let mut out = match Output::new(cx.out, x.dtype(), &shape) {
        Ok(o) => o,
        Err(e) => return Some(Err(e)),
    };
    let done = match x.dtype().size() {
        1 => select::<u8>(c, x, y, &shape, out.bytes_mut(), cx),
        2 => select::<u16>(c, x, y, &shape, out.bytes_mut(), cx),
        4 => select::<u32>(c, x, y, &shape, out.bytes_mut(), cx),
        8 => select::<u64>(c, x, y, &shape, out.bytes_mut(), cx),
        _ => None,
    };
    done?;
    Some(Ok(vec![out.finish()]))
}

fn select<T: bytemuck::Pod + Send + Sync>(
    c: &Tensor,
    x: &Tensor,
    y: &Tensor,
    shape: &[usize],
    dst: &mut [u8],
    cx: &Ctx,
) -> Option<()> {
    let (cd, xd, yd) = (c.bytes(), elems::<T>(x)?, elems::<T>(y)?);
    let dst: &mut [T] = bytemuck::try_cast_slice_mut(dst).ok()?;
    let (rc, rx, ry) = (rows(c.shape(), shape), rows(x.shape(), shape), rows(y.shape(), shape));
    let inner = shape.last().copied().unwrap_or(1);
    for_rows(cx, dst, inner, &|r, d| {
        let (bc, bx, by) = (rc.base[r], rx.base[r], ry.base[r]);
        for (j, v) in d.iter_mut().enumerate() {
            *v = if cd[bc + j * rc.step] != 0 { xd[bx + j * rx.step] } else { yd[by + j * ry.step] };
        }
    });
    Some(())
}

/// Equal, Less, Greater, LessOrEqual, GreaterOrEqual (any dtype but bool, which only Equal
/// compares here) and And, Or, Xor of bools: a bool output, broadcast.
pub(super) fn compare(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let (a, b) = (ins.first()?.as_ref()?, ins.get(1)?.as_ref()?);
    if a.dtype() != b.dtype() {
        return None;
    }
    let shape = broadcast_shapes(&[a.shape(), b.shape()]).ok()?;
    let mut out = match Output::new(None, DType::Bool, &shape) {
        Ok(o) => o,
        Err(e) => return Some(Err(e)),
    };
    let op = n.op.as_str();
    let dst = out.bytes_mut();
    let logic = matches!(op, "And" | "Or" | "Xor");
    match a.dtype() {
        DType::Bool if logic => zip_to_bool::<u8, _>(a, b, &shape, dst, cx, &|x, y| {
            let (x, y) = (x != 0, y != 0);
            match op {
                "And" => x && y,
                "Or" => x || y,
                _ => x != y,
            }
        })?,
        _ if logic => return None,
        DType::Bool if op != "Equal" => return None,
        DType::F16 | DType::BF16 => return None,
        // One instance per comparison: the test inlines into the element loop.
        dt => dispatch!(dt, T => match op {
            "Equal" => zip_to_bool::<T, _>(a, b, &shape, dst, cx, &|x: T, y: T| x == y)?,
            "Less" => zip_to_bool::<T, _>(a, b, &shape, dst, cx, &|x: T, y: T| x < y)?,
            "Greater" => zip_to_bool::<T, _>(a, b, &shape, dst, cx, &|x: T, y: T| x > y)?,
            "LessOrEqual" => zip_to_bool::<T, _>(a, b, &shape, dst, cx, &|x: T, y: T| x <= y)?,
            _ => zip_to_bool::<T, _>(a, b, &shape, dst, cx, &|x: T, y: T| x >= y)?,
        }),
    }
    Some(Ok(vec![out.finish()]))
}

fn zip_to_bool<T: bytemuck::Pod + Sync, F: Fn(T, T) -> bool + Sync>(
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    dst: &mut [u8],
    cx: &Ctx,
    f: &F,
) -> Option<()> {
    let (ad, bd) = (elems::<T>(a)?, elems::<T>(b)?);
    let (ra, rb) = (rows(a.shape(), shape), rows(b.shape(), shape));
    let inner = shape.last().copied().unwrap_or(1);
    for_rows(cx, dst, inner, &|r, d| {
        let (ba, bb) = (ra.base[r], rb.base[r]);
        // The steps chosen outside the loops, which then vectorise.
        match (ra.step, rb.step) {
            (1, 1) => {
                for ((v, &x), &y) in d.iter_mut().zip(&ad[ba..ba + inner]).zip(&bd[bb..bb + inner]) {
                    *v = f(x, y) as u8;
                }
            }
            (1, _) => {
                let y = bd[bb];
                for (v, &x) in d.iter_mut().zip(&ad[ba..ba + inner]) {
                    *v = f(x, y) as u8;
                }
            }
            (_, 1) => {
                let x = ad[ba];
                for (v, &y) in d.iter_mut().zip(&bd[bb..bb + inner]) {
                    *v = f(x, y) as u8;
                }
            }
            _ => d.fill(f(ad[ba], bd[bb]) as u8),
        }
    });
    Some(())
}

/// Not of bools.
pub(super) fn not(_n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref().filter(|t| t.dtype() == DType::Bool)?;
    let mut out = match Output::new(None, DType::Bool, x.shape()) {
        Ok(o) => o,
        Err(e) => return Some(Err(e)),
    };
    let src = x.bytes();
    let inner = x.shape().last().copied().unwrap_or(1);
    for_rows(cx, out.bytes_mut(), inner, &|r, d| {
        for (j, v) in d.iter_mut().enumerate() {
            *v = (src[r * inner + j] == 0) as u8;
        }
    });
    Some(Ok(vec![out.finish()]))
}

/// How a Cast converts, decided once per tensor (the reference `cast`'s rules).
#[derive(Clone, Copy)]
enum Rule {
    /// Integer to integer, wrapping.
    Int,
    /// Anything to bool: nonzero.
    ToBool,
    /// Float to integer: toward zero, saturating, NaN to 0.
    Trunc,
    /// Through f64.
    Value,
}

/// Cast between any two dtypes.
pub(super) fn cast(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref()?;
    let to = DType::from_onnx_code(n.int("to", 0) as i32)?;
    if x.dtype() == to {
        return Some(Ok(vec![x.clone()]));
    }
    let rule = if x.dtype().is_int() && to.is_int() {
        Rule::Int
    } else if to == DType::Bool {
        Rule::ToBool
    } else if to.is_int() {
        Rule::Trunc
    } else {
        Rule::Value
    };
    let mut out = match Output::new(cx.out, to, x.shape()) {
        Ok(o) => o,
        Err(e) => return Some(Err(e)),
    };
    let dst = out.bytes_mut();
    dispatch!(x.dtype(), S => dispatch!(to, D => convert::<S, D>(x, dst, rule, cx)?));
    Some(Ok(vec![out.finish()]))
}

fn convert<S: Num + bytemuck::Pod + Sync, D: Num + bytemuck::Pod + Send>(
    x: &Tensor,
    dst: &mut [u8],
    rule: Rule,
    cx: &Ctx,
) -> Option<()> {
    let src = elems::<S>(x)?;
    let dst: &mut [D] = bytemuck::try_cast_slice_mut(dst).ok()?;
    let inner = x.shape().last().copied().unwrap_or(1);
    let f = |v: S| -> D {
        match rule {
            Rule::Int => D::from_i128(v.to_i128()),
            Rule::ToBool => D::from_f64(if v.to_f64() != 0.0 { 1.0 } else { 0.0 }),
            Rule::Trunc => D::from_f64(v.to_f64().trunc()),
            Rule::Value => D::from_f64(v.to_f64()),
        }
    };
    for_rows(cx, dst, inner, &|r, d| {
        for (o, &v) in d.iter_mut().zip(&src[r * inner..]) {
            *o = f(v);
        }
    });
    Some(())
}

/// Expand of any dtype: the input broadcast to the shape given, row by row.
pub(super) fn expand(_n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref()?;
    let target: Vec<usize> = ins.get(1)?.as_ref()?.to_i64_vec().iter().map(|&v| v.max(0) as usize).collect();
    let shape = broadcast_shapes(&[x.shape(), &target]).ok()?;
    if shape == x.shape() {
        return Some(Ok(vec![x.clone()]));
    }
    let mut out = match Output::new(cx.out, x.dtype(), &shape) {
        Ok(o) => o,
        Err(e) => return Some(Err(e)),
    };
    let dst = out.bytes_mut();
    let done = match x.dtype().size() {
        1 => broadcast::<u8>(x, &shape, dst, cx),
        2 => broadcast::<u16>(x, &shape, dst, cx),
        4 => broadcast::<u32>(x, &shape, dst, cx),
        8 => broadcast::<u64>(x, &shape, dst, cx),
        _ => None,
    };
    done?;
    Some(Ok(vec![out.finish()]))
}

fn broadcast<T: bytemuck::Pod + Send + Sync>(x: &Tensor, shape: &[usize], dst: &mut [u8], cx: &Ctx) -> Option<()> {
    let src = elems::<T>(x)?;
    let dst: &mut [T] = bytemuck::try_cast_slice_mut(dst).ok()?;
    let rx = rows(x.shape(), shape);
    let inner = shape.last().copied().unwrap_or(1);
    for_rows(cx, dst, inner, &|r, d| {
        let b = rx.base[r];
        if rx.step == 1 {
            d.copy_from_slice(&src[b..b + inner]);
        } else {
            d.fill(src[b]);
        }
    });
    Some(())
}

/// Range: integers as `start + i·delta` (what the reference's wrapping accumulation gives,
/// without the dependency chain), floats accumulated in their dtype as the reference does.
pub(super) fn range(_n: &Node, ins: &[Option<Tensor>], _cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let (s, l, d) = (ins.first()?.as_ref()?, ins.get(1)?.as_ref()?, ins.get(2)?.as_ref()?);
    if s.dtype() != l.dtype() || s.dtype() != d.dtype() || s.len() != 1 || l.len() != 1 || d.len() != 1 {
        return None;
    }
    let count = |start: f64, limit: f64, delta: f64| {
        let c = ((limit - start) / delta).ceil();
        // A zero step, NaN or a count too large: the reference reports it.
        (delta != 0.0 && !c.is_nan() && c < (1u64 << 40) as f64).then(|| c.max(0.0) as usize)
    };
    let t = match s.dtype() {
        DType::I64 | DType::I32 => {
            let (a, b, k) = (s.to_i64_vec()[0], l.to_i64_vec()[0], d.to_i64_vec()[0]);
            let c = count(a as f64, b as f64, k as f64)?;
            if let Err(e) = crate::util::check_out(s.dtype(), &[c]) {
                return Some(Err(e));
            }
            let v: Vec<i64> = (0..c as i64).map(|i| a.wrapping_add(i.wrapping_mul(k))).collect();
            match s.dtype() {
                DType::I64 => Tensor::from_vec(&[c], v),
                _ => Tensor::from_vec(&[c], v.iter().map(|&x| x as i32).collect::<Vec<i32>>()),
            }
        }
        DType::F32 => {
            let (a, b, k) = (s.data::<f32>()[0], l.data::<f32>()[0], d.data::<f32>()[0]);
            let c = count(a as f64, b as f64, k as f64)?;
            if let Err(e) = crate::util::check_out(s.dtype(), &[c]) {
                return Some(Err(e));
            }
            let mut acc = a;
            Tensor::from_vec(
                &[c],
                (0..c)
                    .map(|_| {
                        let v = acc;
                        acc += k;
                        v
                    })
                    .collect::<Vec<f32>>(),
            )
        }
        _ => return None,
    };
    Some(Ok(vec![t]))
}

/// Add, Sub, Mul and Div of i64 or i32 (the index arithmetic of shape computations and
/// position ids), broadcast, with the reference's wrapping semantics (division by zero
/// gives 0).
pub(super) fn int_arith(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let (a, b) = (ins.first()?.as_ref()?, ins.get(1)?.as_ref()?);
    if a.dtype() != b.dtype() {
        return None;
    }
    match a.dtype() {
        DType::I64 => arith::<i64>(n, a, b, cx),
        DType::I32 => arith::<i32>(n, a, b, cx),
        _ => None,
    }
}

fn arith<T: Num + bytemuck::Pod + Send + Sync>(
    n: &Node,
    a: &Tensor,
    b: &Tensor,
    cx: &Ctx,
) -> Option<Result<Vec<Tensor>>> {
    let f: fn(T, T) -> T = match n.op.as_str() {
        "Add" => T::add,
        "Sub" => T::sub,
        "Mul" => T::mul,
        "Div" => T::div,
        _ => return None,
    };
    let shape = broadcast_shapes(&[a.shape(), b.shape()]).ok()?;
    let mut out = match Output::new(None, a.dtype(), &shape) {
        Ok(o) => o,
        Err(e) => return Some(Err(e)),
    };
    let (ad, bd) = (elems::<T>(a)?, elems::<T>(b)?);
    let dst: &mut [T] = bytemuck::try_cast_slice_mut(out.bytes_mut()).ok()?;
    let (ra, rb) = (rows(a.shape(), &shape), rows(b.shape(), &shape));
    let inner = shape.last().copied().unwrap_or(1);
    for_rows(cx, dst, inner, &|r, d| {
        let (ba, bb) = (ra.base[r], rb.base[r]);
        for (j, v) in d.iter_mut().enumerate() {
            *v = f(ad[ba + j * ra.step], bd[bb + j * rb.step]);
        }
    });
    Some(Ok(vec![out.finish()]))
}
