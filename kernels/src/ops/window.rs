//! The sliding-window geometry shared by Conv, ConvTranspose and the pools: kernel extent,
//! strides, dilations and padding (explicit or `auto_pad`), and the output size.

use crate::util::{err, Result};
use aim_ir::Node;

/// The resolved geometry of one windowed op over `in_sp` spatial dims.
#[derive(Debug, Clone)]
pub struct Window {
    /// Kernel size per spatial dim.
    pub kernel: Vec<usize>,
    /// Strides.
    pub strides: Vec<usize>,
    /// Dilations.
    pub dilations: Vec<usize>,
    /// Padding before each dim.
    pub pad_begin: Vec<usize>,
    /// Padding after each dim.
    pub pad_end: Vec<usize>,
    /// Output size per spatial dim.
    pub out: Vec<usize>,
}

fn list(n: &Node, name: &str, len: usize, default: usize) -> Result<Vec<usize>> {
    match n.ints(name) {
        None => Ok(vec![default; len]),
        Some(v) if v.len() == len && v.iter().all(|&x| x >= 0) => Ok(v.iter().map(|&x| x as usize).collect()),
        Some(v) => err(format!("attribute {name}={v:?} must hold {len} non-negative values")),
    }
}

/// Resolves the geometry for input spatial sizes `in_sp` and kernel `kernel`.
pub fn window(n: &Node, in_sp: &[usize], kernel: &[usize], ceil_mode: bool) -> Result<Window> {
    let sp = in_sp.len();
    if kernel.len() != sp {
        return err(format!("kernel has {} dims but the input has {sp} spatial dims", kernel.len()));
    }
    let strides = list(n, "strides", sp, 1)?;
    let dilations = list(n, "dilations", sp, 1)?;
    if strides.contains(&0) || dilations.contains(&0) {
        return err("strides and dilations must be positive");
    }
    let pads = list(n, "pads", 2 * sp, 0)?;
    let auto_pad = n.string("auto_pad", "NOTSET");
    let mut w = Window {
        kernel: kernel.to_vec(),
        strides,
        dilations,
        pad_begin: pads[..sp].to_vec(),
        pad_end: pads[sp..].to_vec(),
        out: vec![0; sp],
    };
    for i in 0..sp {
        let ek = (kernel[i].max(1) - 1) * w.dilations[i] + 1;
        let s = w.strides[i];
        match auto_pad {
            "SAME_UPPER" | "SAME_LOWER" => {
                let out = in_sp[i].div_ceil(s);
                let total = ((out - 1) * s + ek).saturating_sub(in_sp[i]);
                let small = total / 2;
                let (b, e) = if auto_pad == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                w.pad_begin[i] = b;
                w.pad_end[i] = e;
                w.out[i] = out;
            }
            "VALID" | "NOTSET" | "" => {
                if auto_pad == "VALID" {
                    w.pad_begin[i] = 0;
                    w.pad_end[i] = 0;
                }
                let total = in_sp[i] + w.pad_begin[i] + w.pad_end[i];
                if total < ek {
                    return err(format!("the kernel extent {ek} is larger than the padded input {total}"));
                }
                let span = total - ek;
                w.out[i] = if ceil_mode {
                    let mut o = span.div_ceil(s) + 1;
                    if (o - 1) * s >= in_sp[i] + w.pad_begin[i] {
                        o -= 1;
                    }
                    o
                } else {
                    span / s + 1
                };
            }
            other => return err(format!("unknown auto_pad '{other}'")),
        }
    }
    Ok(w)
}

/// Iterates every index of a multi-dimensional box, row-major.
pub fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    let total: usize = dims.iter().product();
    let mut idx = vec![0usize; dims.len()];
    for _ in 0..total {
        f(&idx);
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
