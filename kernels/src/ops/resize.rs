//! Resize (and so Upsample, which import rewrites into it): nearest, linear and cubic
//! modes, every coordinate transformation mode, antialiasing, axes and aspect-ratio
//! policies. Interpolation is separable, so it runs one axis at a time.

use crate::util::{axis, err, ints_of, opt, req, Result};
use aim_ir::{DType, Node, Tensor};

/// One output position along an axis: (source index, weight) taps, or `None` when the
/// position falls outside the crop box (tf_crop_and_resize extrapolation).
pub type Taps = Option<Vec<(usize, f64)>>;

struct Axis<'a> {
    node: &'a Node,
    len_in: usize,
    /// The output length as the coordinate transform sees it: `len_in * scale` (not
    /// rounded) when scales were given, the requested size when sizes were.
    len_out: f64,
    scale: f64,
    roi: (f64, f64),
}

fn cubic_weight(t: f64, a: f64) -> f64 {
    let t = t.abs();
    if t <= 1.0 {
        ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0
    } else if t < 2.0 {
        ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a
    } else {
        0.0
    }
}

impl Axis<'_> {
    fn source_coord(&self, x: usize) -> f64 {
        let (xo, s) = (x as f64, self.scale);
        let (li, lo) = (self.len_in as f64, self.len_out);
        match self.node.string("coordinate_transformation_mode", "half_pixel") {
            "asymmetric" => xo / s,
            "align_corners" => {
                if lo == 1.0 {
                    0.0
                } else {
                    xo * (li - 1.0) / (lo - 1.0)
                }
            }
            "pytorch_half_pixel" => {
                if lo > 1.0 {
                    (xo + 0.5) / s - 0.5
                } else {
                    0.0
                }
            }
            "tf_crop_and_resize" => {
                let (a, b) = self.roi;
                if lo > 1.0 {
                    a * (li - 1.0) + xo * (b - a) * (li - 1.0) / (lo - 1.0)
                } else {
                    0.5 * (a + b) * (li - 1.0)
                }
            }
            "half_pixel_symmetric" => {
                let adjustment = lo.floor() / lo;
                let center = li / 2.0;
                let offset = center * (1.0 - adjustment);
                offset + (xo + 0.5) / s - 0.5
            }
            _ => (xo + 0.5) / s - 0.5,
        }
    }

    /// The taps of output position `x`, following ONNX's reference interpolation: the
    /// window is placed from floor(coordinate) (one lower when the coordinate is whole),
    /// out-of-range taps read the edge value unless `exclude_outside` drops them.
    fn taps(&self, x: usize) -> Result<Taps> {
        let c = self.source_coord(x);
        let n = self.len_in as i64;
        let crop = self.node.string("coordinate_transformation_mode", "") == "tf_crop_and_resize";
        if crop && (c < 0.0 || c > (n - 1) as f64) {
            return Ok(None);
        }
        let mut base = c.floor() as i64;
        let mut ratio = c - base as f64;
        if ratio == 0.0 {
            ratio = 1.0;
            base -= 1;
        }
        let mode = self.node.string("mode", "nearest");
        let a = self.node.float("cubic_coeff_a", -0.75) as f64;
        let antialias = self.node.int("antialias", 0) != 0;
        let s = self.scale.min(1.0);
        let coeffs: Vec<(i64, f64)> = match mode {
            "nearest" => {
                let up = if ratio == 1.0 {
                    true
                } else {
                    match self.node.string("nearest_mode", "round_prefer_floor") {
                        "floor" => false,
                        "ceil" => true,
                        "round_prefer_ceil" => ratio >= 0.5,
                        _ => ratio > 0.5,
                    }
                };
                vec![(if up { 1 } else { 0 }, 1.0)]
            }
            "linear" if antialias => {
                let start = (-1.0 / s).floor() as i64 + 1;
                (start..2 - start).map(|i| (i, (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))).collect()
            }
            "linear" => vec![(0, 1.0 - ratio), (1, ratio)],
            "cubic" if antialias => {
                let start = (-2.0 / s).floor() as i64 + 1;
                (start..2 - start).map(|i| (i, cubic_weight(s * (i as f64 - ratio), a))).collect()
            }
            "cubic" => (-1..=2).map(|i| (i, cubic_weight(i as f64 - ratio, a))).collect(),
            m => return err(format!("unknown Resize mode '{m}'")),
        };
        let exclude = self.node.int("exclude_outside", 0) != 0;
        let mut taps: Vec<(i64, f64)> = coeffs.into_iter().map(|(i, w)| (base + i, w)).collect();
        if exclude {
            taps.iter_mut().filter(|(p, _)| !(0..n).contains(p)).for_each(|t| t.1 = 0.0);
        }
        if antialias || exclude {
            let total: f64 = taps.iter().map(|t| t.1).sum();
            if total != 0.0 {
                taps.iter_mut().for_each(|t| t.1 /= total);
            }
        }
        Ok(Some(taps.into_iter().map(|(p, w)| (p.clamp(0, n - 1) as usize, w)).collect()))
    }
}

/// What a Resize node does to its input: the output shape, and for each axis that changes,
/// the taps of every output position (computed from the input's shape: each axis's taps
/// depend on that axis alone). Shared by the reference kernel and the fast one.
pub struct Plan {
    /// The output shape.
    pub out: Vec<usize>,
    /// `(axis, taps per output position)` for the axes that change, in order.
    pub axes: Vec<(usize, Vec<Taps>)>,
    /// The value of positions outside the crop box (tf_crop_and_resize).
    pub extrapolation: f64,
}

/// The plan of a Resize node on its inputs.
pub fn plan(node: &Node, ins: &[Option<Tensor>]) -> Result<Plan> {
    let x = req(ins, 0)?;
    plan_for(node, x.dtype(), x.shape(), ins)
}

/// As [`plan`] for an input of `dtype` and `shape` (input 0 of `ins` is not read): what a
/// compiler needs, which has the shapes but not the data.
pub fn plan_for(node: &Node, dtype: DType, shape: &[usize], ins: &[Option<Tensor>]) -> Result<Plan> {
    let r = shape.len();
    let axes: Vec<usize> = match node.ints("axes") {
        Some(a) => a.iter().map(|&v| axis(v, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let scales_in = opt(ins, 2).filter(|t| !t.is_empty()).map(|t| t.to_f64_vec());
    let sizes_in = opt(ins, 3).filter(|t| !t.is_empty()).map(ints_of).transpose()?;
    let mut scales = vec![1.0f64; r];
    let mut out: Vec<usize> = shape.to_vec();
    let mut out_f: Vec<f64> = shape.iter().map(|&d| d as f64).collect();
    match (scales_in, sizes_in) {
        (Some(s), None) => {
            if s.len() != axes.len() {
                return err(format!("scales has {} values for {} axes", s.len(), axes.len()));
            }
            for (k, &a) in axes.iter().enumerate() {
                if !(s[k] > 0.0 && s[k].is_finite()) {
                    return err(format!("scale {} must be positive and finite", s[k]));
                }
                scales[a] = s[k];
                out_f[a] = shape[a] as f64 * s[k];
                out[a] = out_f[a].floor() as usize;
            }
        }
        (None, Some(z)) => {
            if z.len() != axes.len() {
                return err(format!("sizes has {} values for {} axes", z.len(), axes.len()));
            }
            let policy = node.string("keep_aspect_ratio_policy", "stretch");
            let ratios: Vec<f64> = axes.iter().zip(&z).map(|(&a, &s)| s as f64 / shape[a] as f64).collect();
            let pick = match policy {
                "not_larger" => Some(ratios.iter().copied().fold(f64::INFINITY, f64::min)),
                "not_smaller" => Some(ratios.iter().copied().fold(0.0, f64::max)),
                _ => None,
            };
            for (k, &a) in axes.iter().enumerate() {
                match pick {
                    Some(p) => {
                        scales[a] = p;
                        out[a] = (shape[a] as f64 * p).round() as usize;
                    }
                    None => {
                        scales[a] = ratios[k];
                        out[a] = z[k].max(0) as usize;
                    }
                }
                out_f[a] = out[a] as f64;
                {}
            }
        }
        _ => return err("Resize needs exactly one of scales and sizes"),
    }
    if out_f.iter().any(|v| !v.is_finite() || *v >= usize::MAX as f64) {
        return err(format!("output sizes {out_f:?}: more elements than can be addressed"));
    }
    crate::util::check_out(dtype, &out)?;
    // The reference computes in f64, with a flag per element.
    crate::util::check_count(crate::util::elements(&out)?, 9)?;
    let roi = opt(ins, 1).map(|t| t.to_f64_vec()).unwrap_or_default();
    let extrapolation = node.float("extrapolation_value", 0.0) as f64;
    let mut changed = Vec::new();
    for d in 0..r {
        if out[d] == shape[d] && scales[d] == 1.0 {
            continue;
        }
        let k = axes.iter().position(|&a| a == d);
        let roi_d = match k {
            Some(k) if roi.len() == 2 * axes.len() => (roi[k], roi[k + axes.len()]),
            _ => (0.0, 1.0),
        };
        let ax = Axis { node, len_in: shape[d], len_out: out_f[d], scale: scales[d], roi: roi_d };
        let taps: Vec<Taps> = (0..out[d]).map(|i| ax.taps(i)).collect::<Result<_>>()?;
        changed.push((d, taps));
    }
    Ok(Plan { out, axes: changed, extrapolation })
}

fn resize(node: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let Plan { out, axes: changed, extrapolation } = plan(node, ins)?;
    let mut data = x.to_f64_vec();
    let mut outside = vec![false; data.len()];
    let mut shape = x.shape().to_vec();
    for (d, taps) in changed {
        let (outer, inner) = (shape[..d].iter().product::<usize>(), shape[d + 1..].iter().product::<usize>());
        crate::util::check_count(crate::util::elements(&[outer, out[d], inner])?, 9)?;
        let mut nd = vec![0.0; outer * out[d] * inner];
        let mut no = vec![false; nd.len()];
        for o in 0..outer {
            for (j, t) in taps.iter().enumerate() {
                for i in 0..inner {
                    let at = (o * out[d] + j) * inner + i;
                    match t {
                        None => no[at] = true,
                        Some(t) => {
                            let mut acc = 0.0;
                            let mut out_any = false;
                            for &(s, w) in t {
                                let src = (o * shape[d] + s) * inner + i;
                                acc += w * data[src];
                                out_any |= outside[src];
                            }
                            nd[at] = acc;
                            no[at] = out_any;
                        }
                    }
                }
            }
        }
        data = nd;
        outside = no;
        shape[d] = out[d];
    }
    for (v, &o) in data.iter_mut().zip(&outside) {
        if o {
            *v = extrapolation;
        }
    }
    let rounded: Vec<f64> = if x.dtype().is_float() { data } else { data.iter().map(|v| v.round()).collect() };
    Ok(vec![Tensor::from_f64(x.dtype(), &shape, &rounded)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[("Resize", resize)];
