//! Broadcasting binary and variadic ops: arithmetic, comparison, logic, bit ops, Where.

use crate::dispatch;
use crate::num::Num;
use crate::util::{broadcast_offsets, broadcast_shapes, err, req, same_dtype, Result};
use aim_ir::{DType, Elem, Node, Tensor};

/// Applies `f` to the broadcast pairs of `a` and `b`, returning values and the output shape.
pub fn zip_broadcast<T: Elem + Copy, U>(a: &Tensor, b: &Tensor, f: impl Fn(T, T) -> U) -> Result<(Vec<U>, Vec<usize>)> {
    let (da, db) = (a.data::<T>(), b.data::<T>());
    if a.shape() == b.shape() {
        return Ok((da.iter().zip(db).map(|(&x, &y)| f(x, y)).collect(), a.shape().to_vec()));
    }
    let shape = broadcast_shapes(&[a.shape(), b.shape()])?;
    crate::util::check_count(crate::util::elements(&shape)?, std::mem::size_of::<U>().max(1))?;
    if b.len() == 1 && shape == a.shape() {
        let y = db[0];
        return Ok((da.iter().map(|&x| f(x, y)).collect(), shape));
    }
    if a.len() == 1 && shape == b.shape() {
        let x = da[0];
        return Ok((db.iter().map(|&y| f(x, y)).collect(), shape));
    }
    let (oa, ob) = (broadcast_offsets(a.shape(), &shape)?, broadcast_offsets(b.shape(), &shape)?);
    Ok((oa.iter().zip(&ob).map(|(&i, &j)| f(da[i], db[j])).collect(), shape))
}

fn arith(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    let dt = same_dtype(&[a, b])?;
    let op = n.op.as_str();
    let fmod = n.int("fmod", 0) != 0;
    dispatch!(dt, T => {
        let f = |x: T, y: T| -> T {
            match op {
                "Add" => x.add(y),
                "Sub" => x.sub(y),
                "Mul" => x.mul(y),
                "Div" => x.div(y),
                _ if T::FLOAT => {
                    let (p, q) = (x.to_f64(), y.to_f64());
                    let r = p % q;
                    // fmod keeps the dividend's sign; Mod (fmod=0) the divisor's, like Python.
                    if fmod || r == 0.0 || (r < 0.0) == (q < 0.0) { T::from_f64(r) } else { T::from_f64(r + q) }
                }
                _ => {
                    let (p, q) = (x.to_i128(), y.to_i128());
                    if q == 0 { return T::zero(); }
                    let r = p % q;
                    if fmod || r == 0 || (r < 0) == (q < 0) { T::from_i128(r) } else { T::from_i128(r + q) }
                }
            }
        };
        let (v, shape) = zip_broadcast::<T, T>(a, b, f)?;
        Ok(vec![Tensor::from_vec(&shape, v)])
    }, bool => err(format!("{op} is not defined for bool")))
}

fn pow(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    let bf = Tensor::from_f64(DType::F64, b.shape(), &b.to_f64_vec());
    let af = Tensor::from_f64(DType::F64, a.shape(), &a.to_f64_vec());
    let int = a.dtype().is_int();
    let (v, shape) = zip_broadcast::<f64, f64>(&af, &bf, |x, y| {
        let r = x.powf(y);
        if int {
            r.trunc()
        } else {
            r
        }
    })?;
    Ok(vec![Tensor::from_f64(a.dtype(), &shape, &v)])
}

fn compare(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    let dt = same_dtype(&[a, b])?;
    let op = n.op.as_str();
    dispatch!(dt, T => {
        let (v, shape) = zip_broadcast::<T, bool>(a, b, |x, y| match op {
            "Equal" => x == y,
            "Less" => x < y,
            "Greater" => x > y,
            "LessOrEqual" => x <= y,
            _ => x >= y,
        })?;
        Ok(vec![Tensor::from_bools(&shape, &v)])
    })
}

fn logic(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    if a.dtype() != DType::Bool || b.dtype() != DType::Bool {
        return err(format!("{} needs bool inputs, got {} and {}", n.op, a.dtype(), b.dtype()));
    }
    let op = n.op.as_str();
    let (v, shape) = zip_broadcast::<u8, bool>(a, b, |x, y| {
        let (x, y) = (x != 0, y != 0);
        match op {
            "And" => x && y,
            "Or" => x || y,
            _ => x != y,
        }
    })?;
    Ok(vec![Tensor::from_bools(&shape, &v)])
}

fn bits(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    let dt = same_dtype(&[a, b])?;
    if !dt.is_int() {
        return err(format!("{} needs integer inputs, got {dt}", n.op));
    }
    let op = n.op.as_str();
    let left = n.string("direction", "") == "LEFT";
    let bits = dt.size() as i128 * 8;
    dispatch!(dt, T => {
        let (v, shape) = zip_broadcast::<T, T>(a, b, |x, y| {
            let (p, q) = (x.to_i128(), y.to_i128());
            T::from_i128(match op {
                "BitwiseAnd" => p & q,
                "BitwiseOr" => p | q,
                "BitwiseXor" => p ^ q,
                // Shifts by the type's width or more (or by a negative amount) fill with
                // zeros, or with the sign for a right shift of a negative value.
                _ if !(0..bits).contains(&q) => if !left && p < 0 { -1 } else { 0 },
                _ if left => p << q,
                _ => p >> q,
            })
        })?;
        Ok(vec![Tensor::from_vec(&shape, v)])
    })
}

fn prelu(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(ins, 0)?, req(ins, 1)?);
    let dt = same_dtype(&[a, b])?;
    dispatch!(dt, T => {
        let (v, shape) = zip_broadcast::<T, T>(a, b, |x, s| if x < T::zero() { x.mul(s) } else { x })?;
        Ok(vec![Tensor::from_vec(&shape, v)])
    }, bool => err("PRelu is not defined for bool"))
}

fn variadic(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let ts: Vec<&Tensor> = ins.iter().flatten().collect();
    if ts.is_empty() {
        return err(format!("{} needs at least one input", n.op));
    }
    let dt = same_dtype(&ts)?;
    let op = n.op.as_str();
    dispatch!(dt, T => {
        let mut acc = ts[0].clone();
        for t in &ts[1..] {
            let (v, shape) = zip_broadcast::<T, T>(&acc, t, |x, y| match op {
                "Max" => if x.is_nan() || y.is_nan() { T::from_f64(f64::NAN) } else if y > x { y } else { x },
                "Min" => if x.is_nan() || y.is_nan() { T::from_f64(f64::NAN) } else if y < x { y } else { x },
                _ => x.add(y),
            })?;
            acc = Tensor::from_vec(&shape, v);
        }
        if op == "Mean" {
            let k = T::from_f64(ts.len() as f64);
            let v: Vec<T> = acc.data::<T>().iter().map(|&x| x.div(k)).collect();
            acc = Tensor::from_vec(acc.shape(), v);
        } else if ts.len() == 1 {
            acc = ts[0].clone();
        }
        Ok(vec![acc])
    }, bool => err(format!("{op} is not defined for bool")))
}

fn where_(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (c, x, y) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    if c.dtype() != DType::Bool {
        return err(format!("Where's condition must be bool, got {}", c.dtype()));
    }
    same_dtype(&[x, y])?;
    let shape = broadcast_shapes(&[c.shape(), x.shape(), y.shape()])?;
    crate::util::check_out(x.dtype(), &shape)?;
    let (oc, ox, oy) = (
        broadcast_offsets(c.shape(), &shape)?,
        broadcast_offsets(x.shape(), &shape)?,
        broadcast_offsets(y.shape(), &shape)?,
    );
    let cd = c.data::<u8>();
    let sz = x.dtype().size();
    let (bx, by) = (x.bytes(), y.bytes());
    let mut out = Tensor::zeros(x.dtype(), &shape);
    let dst = out.bytes_mut();
    for i in 0..oc.len() {
        let (src, o) = if cd[oc[i]] != 0 { (bx, ox[i]) } else { (by, oy[i]) };
        dst[i * sz..(i + 1) * sz].copy_from_slice(&src[o * sz..(o + 1) * sz]);
    }
    Ok(vec![out])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("Add", arith),
    ("Sub", arith),
    ("Mul", arith),
    ("Div", arith),
    ("Mod", arith),
    ("Pow", pow),
    ("Equal", compare),
    ("Less", compare),
    ("Greater", compare),
    ("LessOrEqual", compare),
    ("GreaterOrEqual", compare),
    ("And", logic),
    ("Or", logic),
    ("Xor", logic),
    ("BitwiseAnd", bits),
    ("BitwiseOr", bits),
    ("BitwiseXor", bits),
    ("BitShift", bits),
    ("PRelu", prelu),
    ("Max", variadic),
    ("Min", variadic),
    ("Sum", variadic),
    ("Mean", variadic),
    ("Where", where_),
];
