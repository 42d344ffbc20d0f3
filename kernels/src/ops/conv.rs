//! Conv (any spatial rank, groups, dilations, padding) via im2col and GEMM, and
//! ConvTranspose as the scatter it is defined as.

use super::matmul::{gemm_acc, narrow, widen};
use super::window::{for_each_index, window};
use crate::num::Num;
use crate::util::{err, opt, req, Result};
use aim_ir::{DType, Node, Tensor};

fn conv_t<T: Num>(node: &Node, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return err(format!("Conv needs X of rank ≥ 3 and W of the same rank, got {xs:?} and {ws:?}"));
    }
    let (nb, c) = (xs[0], xs[1]);
    let m = ws[0];
    let group = node.int("group", 1).max(1) as usize;
    if c % group != 0 || m % group != 0 || ws[1] * group != c {
        return err(format!("channels do not fit group={group}: X has {c}, W is {ws:?}"));
    }
    let in_sp = &xs[2..];
    let kernel: Vec<usize> = match node.ints("kernel_shape") {
        Some(k) => k.iter().map(|&v| v as usize).collect(),
        None => ws[2..].to_vec(),
    };
    if kernel != ws[2..] {
        return err(format!("kernel_shape {kernel:?} does not match W {ws:?}"));
    }
    let g = window(node, in_sp, &kernel, false)?;
    let (cg, mg) = (c / group, m / group);
    let ksize: usize = kernel.iter().product();
    let osize = crate::util::elements(&g.out)?;
    let isize: usize = in_sp.iter().product();
    let (xd, wd) = (x.data::<T>(), w.data::<T>());
    let bias: Option<&[T]> = b.map(|b| b.data::<T>());
    if let Some(bd) = bias {
        if bd.len() != m {
            return err(format!("bias has {} values for {m} output channels", bd.len()));
        }
    }
    let rows = cg * ksize;
    crate::util::check_out(x.dtype(), &[nb, m, osize])?;
    crate::util::check_count(crate::util::elements(&[rows, osize])?, std::mem::size_of::<T>())?;
    let pointwise =
        ksize == 1 && g.strides.iter().all(|&s| s == 1) && g.pad_begin.iter().chain(&g.pad_end).all(|&p| p == 0);
    let mut col = vec![T::zero(); if pointwise { 0 } else { rows * osize }];
    let mut y = vec![T::zero(); nb * m * osize];
    for n in 0..nb {
        for gi in 0..group {
            let xg = &xd[(n * c + gi * cg) * isize..(n * c + (gi + 1) * cg) * isize];
            let src: &[T] = if pointwise {
                xg
            } else {
                // im2col: row (ci, kpos), column = output position.
                let sp = in_sp.len();
                let mut r = 0;
                for ci in 0..cg {
                    for_each_index(&kernel, |kp| {
                        let row = &mut col[r * osize..(r + 1) * osize];
                        let mut o = 0;
                        for_each_index(&g.out, |op| {
                            let mut off = 0usize;
                            let mut inside = true;
                            for d in 0..sp {
                                let pos =
                                    (op[d] * g.strides[d] + kp[d] * g.dilations[d]) as isize - g.pad_begin[d] as isize;
                                if pos < 0 || pos >= in_sp[d] as isize {
                                    inside = false;
                                    break;
                                }
                                off = off * in_sp[d] + pos as usize;
                            }
                            row[o] = if inside { xg[ci * isize + off] } else { T::zero() };
                            o += 1;
                        });
                        r += 1;
                    });
                }
                &col
            };
            let wg = &wd[gi * mg * rows..(gi + 1) * mg * rows];
            let yg = &mut y[(n * m + gi * mg) * osize..(n * m + (gi + 1) * mg) * osize];
            gemm_acc(wg, src, yg, mg, rows, osize);
            if let Some(bd) = bias {
                for (oc, chunk) in yg.chunks_mut(osize).enumerate() {
                    let bv = bd[gi * mg + oc];
                    chunk.iter_mut().for_each(|v| *v = v.add(bv));
                }
            }
        }
    }
    let mut shape = vec![nb, m];
    shape.extend(&g.out);
    Ok(Tensor::from_vec(&shape, y))
}

fn float_inputs(ins: &[Option<Tensor>], op: &str) -> Result<(DType, Tensor, Tensor, Option<Tensor>)> {
    let (x, w) = (req(ins, 0)?, req(ins, 1)?);
    if !x.dtype().is_float() || w.dtype() != x.dtype() {
        return err(format!("{op} needs float X and W of one type, got {} and {}", x.dtype(), w.dtype()));
    }
    let b = opt(ins, 2).map(widen);
    Ok((x.dtype(), widen(x), widen(w), b))
}

fn conv(node: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (dt, x, w, b) = float_inputs(ins, "Conv")?;
    let y = if x.dtype() == DType::F64 {
        conv_t::<f64>(node, &x, &w, b.as_ref())?
    } else {
        conv_t::<f32>(node, &x, &w, b.as_ref())?
    };
    Ok(vec![narrow(y, dt)])
}

/// Where a ConvTranspose writes: the output's spatial size, the padding cropped before
/// (`pads[..sp]`) and after each dim, strides and dilations. One rule for both backends.
#[derive(Debug, Clone, PartialEq)]
pub struct TransposeGeometry {
    /// Output spatial dims.
    pub out: Vec<usize>,
    /// Padding cropped before (the first `sp`) and after (the last `sp`) each dim.
    pub pads: Vec<usize>,
    /// Strides.
    pub strides: Vec<usize>,
    /// Dilations.
    pub dilations: Vec<usize>,
}

/// The geometry of a ConvTranspose node over input spatial dims `in_sp` with a kernel of
/// `kernel`: explicit pads, `output_shape` or `auto_pad`, and `output_padding`.
pub fn transpose_geometry(node: &Node, in_sp: &[usize], kernel: &[usize]) -> Result<TransposeGeometry> {
    let sp = in_sp.len();
    let attr = |name: &str, d: usize| -> Vec<usize> {
        node.ints(name).map(|v| v.iter().map(|&x| x.max(0) as usize).collect()).unwrap_or(vec![d; sp])
    };
    let strides = attr("strides", 1);
    let dil = attr("dilations", 1);
    let out_pad = attr("output_padding", 0);
    let mut pads = node.ints("pads").map(|v| v.iter().map(|&x| x.max(0) as usize).collect()).unwrap_or(vec![0; 2 * sp]);
    if kernel.len() != sp || strides.len() != sp || dil.len() != sp || out_pad.len() != sp || pads.len() != 2 * sp {
        return err("strides, dilations, output_padding and pads must match the spatial rank");
    }
    let auto_pad = node.string("auto_pad", "NOTSET");
    let mut out = vec![0usize; sp];
    let output_shape = node.ints("output_shape").map(|v| v.to_vec());
    if strides.contains(&0) || dil.contains(&0) {
        return err("strides and dilations must be positive");
    }
    for i in 0..sp {
        let too_big = || crate::KernelError("the output geometry is larger than can be addressed".into());
        let ek = kernel[i].max(1).checked_sub(1).and_then(|k| k.checked_mul(dil[i])).ok_or_else(too_big)? + 1;
        let full = strides[i]
            .checked_mul(in_sp[i].saturating_sub(1))
            .and_then(|v| v.checked_add(out_pad[i]))
            .and_then(|v| v.checked_add(ek))
            .ok_or_else(too_big)?;
        let target = match &output_shape {
            Some(os) if os.len() >= sp => Some(usize::try_from(os[os.len() - sp + i]).unwrap_or(usize::MAX)),
            Some(os) => return err(format!("output_shape {os:?} has fewer than {sp} spatial dims")),
            None if auto_pad.starts_with("SAME") => Some(in_sp[i] * strides[i]),
            None => None,
        };
        if let Some(t) = target {
            let total = full.saturating_sub(t);
            let (b, e) =
                if auto_pad == "SAME_UPPER" { (total / 2, total - total / 2) } else { (total - total / 2, total / 2) };
            pads[i] = b;
            pads[sp + i] = e;
            out[i] = t;
        } else {
            out[i] = pads[i]
                .checked_add(pads[sp + i])
                .and_then(|p| full.checked_sub(p))
                .ok_or_else(|| crate::KernelError("padding exceeds the output".into()))?;
        }
    }
    Ok(TransposeGeometry { out, pads, strides, dilations: dil })
}

fn conv_transpose_t<T: Num>(node: &Node, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return err(format!("ConvTranspose needs X of rank ≥ 3 and W of the same rank, got {xs:?} and {ws:?}"));
    }
    let sp = xs.len() - 2;
    let (nb, c) = (xs[0], xs[1]);
    let group = node.int("group", 1).max(1) as usize;
    if ws[0] != c || c % group != 0 {
        return err(format!("W {ws:?} does not fit {c} input channels and group={group}"));
    }
    let mg = ws[1];
    let m = mg * group;
    let cg = c / group;
    let kernel: Vec<usize> = ws[2..].to_vec();
    let in_sp = &xs[2..];
    let TransposeGeometry { out, pads, strides, dilations: dil } = transpose_geometry(node, in_sp, &kernel)?;
    let (xd, wd) = (x.data::<T>(), w.data::<T>());
    let osize = crate::util::elements(&out)?;
    let isize: usize = in_sp.iter().product();
    let ksize: usize = kernel.iter().product();
    crate::util::check_out(x.dtype(), &[nb, m, osize])?;
    let mut y = vec![T::zero(); nb * m * osize];
    for n in 0..nb {
        for gi in 0..group {
            for ci in 0..cg {
                let cin = gi * cg + ci;
                let xrow = &xd[(n * c + cin) * isize..(n * c + cin + 1) * isize];
                let mut ii = 0;
                for_each_index(in_sp, |ip| {
                    let xv = xrow[ii];
                    ii += 1;
                    let mut kk = 0;
                    for_each_index(&kernel, |kp| {
                        let k_idx = kk;
                        kk += 1;
                        let mut off = 0usize;
                        for d in 0..sp {
                            let pos = (ip[d] * strides[d] + kp[d] * dil[d]) as isize - pads[d] as isize;
                            if pos < 0 || pos >= out[d] as isize {
                                return;
                            }
                            off = off * out[d] + pos as usize;
                        }
                        for mo in 0..mg {
                            let wv = wd[(cin * mg + mo) * ksize + k_idx];
                            let yi = (n * m + gi * mg + mo) * osize + off;
                            y[yi] = y[yi].add(xv.mul(wv));
                        }
                    });
                });
            }
        }
    }
    if let Some(b) = b {
        let bd = b.data::<T>();
        for n in 0..nb {
            for mo in 0..m {
                y[(n * m + mo) * osize..(n * m + mo + 1) * osize].iter_mut().for_each(|v| *v = v.add(bd[mo]));
            }
        }
    }
    let mut shape = vec![nb, m];
    shape.extend(&out);
    Ok(Tensor::from_vec(&shape, y))
}

fn conv_transpose(node: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (dt, x, w, b) = float_inputs(ins, "ConvTranspose")?;
    let y = if x.dtype() == DType::F64 {
        conv_transpose_t::<f64>(node, &x, &w, b.as_ref())?
    } else {
        conv_transpose_t::<f32>(node, &x, &w, b.as_ref())?
    };
    Ok(vec![narrow(y, dt)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[("Conv", conv), ("ConvTranspose", conv_transpose)];
