//! Indexing ops: Gather, GatherElements, GatherND, ScatterElements, ScatterND, OneHot,
//! NonZero, Compress, TopK.

use crate::util::{axis, err, gather_elems, ints_of, req, strides, Result};
use crate::KernelError;
use aim_ir::{Node, Tensor};

fn index(i: i64, dim: usize, what: &str) -> Result<usize> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if j < 0 || j >= d {
        return err(format!("{what} index {i} is out of range for a dimension of {dim}"));
    }
    Ok(j as usize)
}

fn gather(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, idx) = (req(ins, 0)?, req(ins, 1)?);
    let ax = axis(n.int("axis", 0), x.rank())?;
    let ids = ints_of(idx)?;
    let (outer, dim, inner) = super::norm::lanes(x.shape(), ax);
    let mut shape = x.shape()[..ax].to_vec();
    shape.extend(idx.shape());
    shape.extend(&x.shape()[ax + 1..]);
    crate::util::check_out(x.dtype(), &shape)?;
    crate::util::check_count(crate::util::elements(&shape)?, std::mem::size_of::<usize>())?;
    let ids: Vec<usize> = ids.iter().map(|&i| index(i, dim, "Gather")).collect::<Result<_>>()?;
    let mut offs = Vec::with_capacity(outer * ids.len() * inner);
    for o in 0..outer {
        for &i in &ids {
            let base = (o * dim + i) * inner;
            offs.extend(base..base + inner);
        }
    }
    Ok(vec![gather_elems(x, &shape, &offs)?])
}

/// For GatherElements/ScatterElements: the data offset each index element addresses (its
/// own coordinates, with the one along `ax` replaced by the index value).
fn element_offsets(x: &Tensor, idx: &Tensor, ax: usize, op: &str) -> Result<Vec<usize>> {
    if idx.rank() != x.rank() {
        return err(format!("{op} needs indices of the data's rank"));
    }
    if (0..x.rank()).any(|d| d != ax && idx.shape()[d] > x.shape()[d]) {
        return err(format!("indices {:?} exceed the data {:?} off the axis", idx.shape(), x.shape()));
    }
    let ids = ints_of(idx)?;
    let xs = strides(x.shape());
    let mut offs = Vec::with_capacity(ids.len());
    let mut k = 0;
    let mut failed = None;
    super::window::for_each_index(idx.shape(), |p| {
        let mut off = 0;
        for d in 0..p.len() {
            let i = if d == ax {
                index(ids[k], x.shape()[ax], op).unwrap_or_else(|e| {
                    failed = Some(e);
                    0
                })
            } else {
                p[d]
            };
            off += i * xs[d];
        }
        offs.push(off);
        k += 1;
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(offs),
    }
}

fn gather_elements(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, idx) = (req(ins, 0)?, req(ins, 1)?);
    let ax = axis(n.int("axis", 0), x.rank())?;
    let offs = element_offsets(x, idx, ax, "GatherElements")?;
    Ok(vec![gather_elems(x, idx.shape(), &offs)?])
}

fn scatter_elements(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, idx, upd) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    if upd.dtype() != x.dtype() || upd.shape() != idx.shape() {
        return err("ScatterElements updates must match the indices' shape and the data's dtype");
    }
    let ax = axis(n.int("axis", 0), x.rank())?;
    let targets = element_offsets(x, idx, ax, "ScatterElements")?;
    Ok(vec![scatter(x, upd, &targets, 1, n.string("reduction", "none"))?])
}

/// Writes `chunk`-element slices of `upd` to element offsets `targets` of a copy of `x`,
/// combining with `reduction` (none, add, mul, max, min).
fn scatter(x: &Tensor, upd: &Tensor, targets: &[usize], chunk: usize, reduction: &str) -> Result<Tensor> {
    if reduction == "none" {
        let sz = x.dtype().size() * chunk;
        let mut out = x.clone();
        let dst = out.bytes_mut();
        for (k, &t) in targets.iter().enumerate() {
            let t = t * x.dtype().size();
            dst[t..t + sz].copy_from_slice(&upd.bytes()[k * sz..(k + 1) * sz]);
        }
        return Ok(out);
    }
    let mut v = x.to_f64_vec();
    let u = upd.to_f64_vec();
    for (k, &t) in targets.iter().enumerate() {
        for j in 0..chunk {
            let (a, b) = (v[t + j], u[k * chunk + j]);
            v[t + j] = match reduction {
                "add" => a + b,
                "mul" => a * b,
                "max" => a.max(b),
                "min" => a.min(b),
                r => return err(format!("unknown reduction '{r}'")),
            };
        }
    }
    Ok(Tensor::from_f64(x.dtype(), x.shape(), &v))
}

/// For GatherND/ScatterND: the element offsets that index tuples of length `k` address, and
/// the number of elements each addresses.
fn nd_offsets(x: &Tensor, idx: &Tensor, batch: usize) -> Result<(Vec<usize>, usize, Vec<usize>)> {
    let ir = idx.rank();
    if ir == 0 {
        return err("indices must have rank ≥ 1");
    }
    let k = idx.shape()[ir - 1];
    if batch + k > x.rank() {
        return err(format!("index tuples of {k} plus {batch} batch dims exceed the data's rank {}", x.rank()));
    }
    let ids = ints_of(idx)?;
    let xs = strides(x.shape());
    let chunk: usize = x.shape()[batch + k..].iter().product();
    let tuples: usize = idx.shape()[..ir - 1].iter().product();
    let batch_size: usize = x.shape()[..batch].iter().product();
    let batch_stride: usize = x.shape()[batch..].iter().product();
    let per_batch = tuples / batch_size.max(1);
    let mut offs = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let mut off = (t / per_batch.max(1)) * batch_stride;
        for j in 0..k {
            let d = batch + j;
            off += index(ids[t * k + j], x.shape()[d], "GatherND/ScatterND")? * xs[d];
        }
        offs.push(off);
    }
    let mut out_shape = idx.shape()[..ir - 1].to_vec();
    out_shape.extend(&x.shape()[batch + k..]);
    Ok((offs, chunk, out_shape))
}

fn gather_nd(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, idx) = (req(ins, 0)?, req(ins, 1)?);
    let (offs, chunk, shape) = nd_offsets(x, idx, n.int("batch_dims", 0).max(0) as usize)?;
    crate::util::check_out(x.dtype(), &shape)?;
    crate::util::check_count(crate::util::elements(&shape)?, std::mem::size_of::<usize>())?;
    let all: Vec<usize> = offs.iter().flat_map(|&o| o..o + chunk).collect();
    Ok(vec![gather_elems(x, &shape, &all)?])
}

fn scatter_nd(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, idx, upd) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    let (offs, chunk, _) = nd_offsets(x, idx, 0)?;
    if upd.dtype() != x.dtype() {
        return err(format!("updates are {}, the data {}", upd.dtype(), x.dtype()));
    }
    if upd.len() != offs.len() * chunk {
        return err("ScatterND updates do not match the indices");
    }
    Ok(vec![scatter(x, upd, &offs, chunk, n.string("reduction", "none"))?])
}

fn one_hot(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (idx, depth, values) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    let depth = depth.to_f64_vec().first().copied().unwrap_or(0.0) as i64;
    if depth <= 0 || values.len() != 2 {
        return err("OneHot needs a positive depth and two values (off, on)");
    }
    let r = idx.rank() + 1;
    let ax = axis(n.int("axis", -1), r)?;
    let ids = idx.to_f64_vec();
    let (outer, inner) = (idx.shape()[..ax].iter().product::<usize>(), idx.shape()[ax..].iter().product::<usize>());
    let mut shape = idx.shape()[..ax].to_vec();
    shape.push(usize::try_from(depth).map_err(|_| KernelError(format!("depth {depth} is too large")))?);
    shape.extend(&idx.shape()[ax..]);
    crate::util::check_out(values.dtype(), &shape)?;
    crate::util::check_count(crate::util::elements(&shape)?, std::mem::size_of::<usize>())?;
    let mut offs = vec![0usize; outer * depth as usize * inner];
    for o in 0..outer {
        for i in 0..inner {
            let mut v = ids[o * inner + i] as i64;
            if v < 0 {
                v += depth;
            }
            if (0..depth).contains(&v) {
                offs[(o * depth as usize + v as usize) * inner + i] = 1;
            }
        }
    }
    Ok(vec![gather_elems(values, &shape, &offs)?])
}

fn nonzero(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let v = x.to_f64_vec();
    let r = x.rank();
    let mut coords: Vec<Vec<i64>> = vec![Vec::new(); r];
    let mut k = 0;
    let mut count = 0;
    super::window::for_each_index(x.shape(), |p| {
        if v[k] != 0.0 {
            for d in 0..r {
                coords[d].push(p[d] as i64);
            }
            count += 1;
        }
        k += 1;
    });
    if r == 0 {
        let c = if v.first().is_some_and(|&x| x != 0.0) { 1 } else { 0 };
        return Ok(vec![Tensor::from_i64(&[0, c], vec![])]);
    }
    Ok(vec![Tensor::from_i64(&[r, count], coords.concat())])
}

fn compress(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, cond) = (req(ins, 0)?, req(ins, 1)?);
    let keep: Vec<bool> = cond.to_f64_vec().iter().map(|&c| c != 0.0).collect();
    let (x, ax) = match n.opt_int("axis") {
        Some(a) => (x.clone(), axis(a, x.rank())?),
        None => (x.reshaped(&[x.len()]), 0),
    };
    let (outer, dim, inner) = super::norm::lanes(x.shape(), ax);
    let sel: Vec<usize> = (0..dim.min(keep.len())).filter(|&i| keep[i]).collect();
    let mut offs = Vec::new();
    for o in 0..outer {
        for &i in &sel {
            offs.extend((o * dim + i) * inner..(o * dim + i + 1) * inner);
        }
    }
    let mut shape = x.shape().to_vec();
    shape[ax] = sel.len();
    Ok(vec![gather_elems(&x, &shape, &offs)?])
}

fn top_k(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let k = ints_of(req(ins, 1)?)?.first().copied().unwrap_or(0);
    let ax = axis(n.int("axis", -1), x.rank())?;
    let (largest, sorted) = (n.int("largest", 1) != 0, n.int("sorted", 1) != 0);
    let (outer, dim, inner) = super::norm::lanes(x.shape(), ax);
    if k < 0 || k as usize > dim {
        return err(format!("k={k} is out of range for an axis of {dim}"));
    }
    let k = k as usize;
    let v = x.to_f64_vec();
    let mut offs = Vec::with_capacity(outer * k * inner);
    let mut idx = vec![0i64; outer * k * inner];
    for o in 0..outer {
        for i in 0..inner {
            let mut order: Vec<usize> = (0..dim).collect();
            let val = |j: usize| v[(o * dim + j) * inner + i];
            order.sort_by(|&a, &b| {
                let c = val(a).partial_cmp(&val(b)).unwrap_or(std::cmp::Ordering::Equal);
                let c = if largest { c.reverse() } else { c };
                c.then(a.cmp(&b))
            });
            let mut chosen = order[..k].to_vec();
            if !sorted {
                chosen.sort();
            }
            for (j, &c) in chosen.iter().enumerate() {
                idx[(o * k + j) * inner + i] = c as i64;
            }
        }
    }
    for o in 0..outer {
        for j in 0..k {
            for i in 0..inner {
                offs.push((o * dim + idx[(o * k + j) * inner + i] as usize) * inner + i);
            }
        }
    }
    let mut shape = x.shape().to_vec();
    shape[ax] = k;
    Ok(vec![gather_elems(x, &shape, &offs)?, Tensor::from_i64(&shape, idx)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("Gather", gather),
    ("GatherElements", gather_elements),
    ("GatherND", gather_nd),
    ("ScatterElements", scatter_elements),
    ("ScatterND", scatter_nd),
    ("OneHot", one_hot),
    ("NonZero", nonzero),
    ("Compress", compress),
    ("TopK", top_k),
];
