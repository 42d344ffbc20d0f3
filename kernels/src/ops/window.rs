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
    let pads = list(n, "pads", 2 * sp, 0)?;
    let auto_pad = n.string("auto_pad", "NOTSET");
    let (out, pad_begin, pad_end) = resolve(kernel, &strides, &dilations, &pads, auto_pad, in_sp, ceil_mode)?;
    Ok(Window { kernel: kernel.to_vec(), strides, dilations, pad_begin, pad_end, out })
}

/// The output size and the padding before and after each spatial dim, as ONNX defines
/// them, for every sliding-window op on both backends (one validation: positive strides
/// and dilations, lists of the right length, sizes that can be addressed).
pub fn resolve(
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
    pads: &[usize],
    auto_pad: &str,
    in_sp: &[usize],
    ceil_mode: bool,
) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let sp = in_sp.len();
    if kernel.len() != sp || strides.len() != sp || dilations.len() != sp || pads.len() != 2 * sp {
        return err(format!("kernel, strides, dilations and pads do not match {sp} spatial dims"));
    }
    if strides.contains(&0) || dilations.contains(&0) {
        return err("strides and dilations must be positive");
    }
    let too_big = || crate::KernelError("the window geometry is larger than can be addressed".into());
    let (mut out, mut begin, mut end) = (vec![0; sp], pads[..sp].to_vec(), pads[sp..].to_vec());
    for i in 0..sp {
        let ek = kernel[i].max(1).checked_sub(1).and_then(|k| k.checked_mul(dilations[i])).ok_or_else(too_big)? + 1;
        let s = strides[i];
        match auto_pad {
            "SAME_UPPER" | "SAME_LOWER" => {
                let o = in_sp[i].div_ceil(s);
                let need = o.saturating_sub(1).checked_mul(s).and_then(|v| v.checked_add(ek)).ok_or_else(too_big)?;
                let total = need.saturating_sub(in_sp[i]);
                let small = total / 2;
                (begin[i], end[i]) =
                    if auto_pad == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                out[i] = o;
            }
            "VALID" | "NOTSET" | "" => {
                if auto_pad == "VALID" {
                    (begin[i], end[i]) = (0, 0);
                }
                let total = in_sp[i].checked_add(begin[i]).and_then(|t| t.checked_add(end[i])).ok_or_else(too_big)?;
                if total < ek {
                    return err(format!("the kernel extent {ek} is larger than the padded input {total}"));
                }
                let span = total - ek;
                out[i] = if ceil_mode {
                    let mut o = span.div_ceil(s) + 1;
                    if (o - 1).checked_mul(s).is_none_or(|v| v >= in_sp[i] + begin[i]) {
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
    Ok((out, begin, end))
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
