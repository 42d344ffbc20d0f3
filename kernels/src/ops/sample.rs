//! Detection and sampling ops: NonMaxSuppression, RoiAlign and GridSample.

use super::window::for_each_index;
use crate::util::{err, need_float, opt, req, strides, Result};
use aim_ir::{Node, Tensor};

fn iou(a: &[f64], b: &[f64], center: bool) -> f64 {
    let corners = |v: &[f64]| -> (f64, f64, f64, f64) {
        if center {
            (v[1] - v[3] / 2.0, v[0] - v[2] / 2.0, v[1] + v[3] / 2.0, v[0] + v[2] / 2.0)
        } else {
            (v[0].min(v[2]), v[1].min(v[3]), v[0].max(v[2]), v[1].max(v[3]))
        }
    };
    let (ay1, ax1, ay2, ax2) = corners(a);
    let (by1, bx1, by2, bx2) = corners(b);
    let area_a = (ay2 - ay1) * (ax2 - ax1);
    let area_b = (by2 - by1) * (bx2 - bx1);
    if area_a <= 0.0 || area_b <= 0.0 {
        return 0.0;
    }
    let ih = (ay2.min(by2) - ay1.max(by1)).max(0.0);
    let iw = (ax2.min(bx2) - ax1.max(bx1)).max(0.0);
    let inter = ih * iw;
    inter / (area_a + area_b - inter)
}

fn nms(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (boxes, scores) = (req(ins, 0)?, req(ins, 1)?);
    if boxes.rank() != 3
        || boxes.shape()[2] != 4
        || scores.rank() != 3
        || scores.shape()[0] != boxes.shape()[0]
        || scores.shape()[2] != boxes.shape()[1]
    {
        return err(format!(
            "boxes {:?} and scores {:?} must be [B, N, 4] and [B, C, N]",
            boxes.shape(),
            scores.shape()
        ));
    }
    let first = |i: usize| opt(ins, i).and_then(|t| t.to_f64_vec().first().copied());
    let max_out = first(2).unwrap_or(0.0).max(0.0) as usize;
    let iou_th = first(3).unwrap_or(0.0);
    let score_th = first(4);
    let center = n.int("center_point_box", 0) != 0;
    let (bv, sv) = (boxes.to_f64_vec(), scores.to_f64_vec());
    let (nb, nc, nbox) = (scores.shape()[0], scores.shape()[1], scores.shape()[2]);
    let mut out = Vec::new();
    for b in 0..nb {
        for c in 0..nc {
            let s = &sv[(b * nc + c) * nbox..(b * nc + c + 1) * nbox];
            let mut cand: Vec<usize> = (0..nbox).filter(|&i| score_th.is_none_or(|t| s[i] > t)).collect();
            cand.sort_by(|&x, &y| s[y].partial_cmp(&s[x]).unwrap_or(std::cmp::Ordering::Equal).then(x.cmp(&y)));
            let mut kept: Vec<usize> = Vec::new();
            for i in cand {
                if kept.len() >= max_out {
                    break;
                }
                let bi = &bv[(b * nbox + i) * 4..(b * nbox + i + 1) * 4];
                if kept.iter().all(|&k| iou(bi, &bv[(b * nbox + k) * 4..(b * nbox + k + 1) * 4], center) <= iou_th) {
                    kept.push(i);
                }
            }
            out.extend(kept.iter().flat_map(|&k| [b as i64, c as i64, k as i64]));
        }
    }
    Ok(vec![Tensor::from_i64(&[out.len() / 3, 3], out)])
}

fn roi_align(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, rois, idx) = (req(ins, 0)?, req(ins, 1)?, req(ins, 2)?);
    need_float(x, "X")?;
    if x.rank() != 4 || rois.rank() != 2 || rois.shape()[1] != 4 || idx.len() != rois.shape()[0] {
        return err("RoiAlign needs X [N,C,H,W], rois [R,4] and batch_indices [R]");
    }
    let (c, h, w) = (x.shape()[1], x.shape()[2], x.shape()[3]);
    let (oh, ow) = (n.int("output_height", 1).max(1) as usize, n.int("output_width", 1).max(1) as usize);
    let sr = n.int("sampling_ratio", 0);
    let scale = n.float("spatial_scale", 1.0) as f64;
    let half = n.string("coordinate_transformation_mode", "half_pixel") == "half_pixel";
    let max_mode = n.string("mode", "avg") == "max";
    let offset = if half { 0.5 } else { 0.0 };
    let (xv, rv, iv) = (x.to_f64_vec(), rois.to_f64_vec(), idx.to_i64_vec());
    let nr = rois.shape()[0];
    crate::util::check_out(x.dtype(), &[nr, c, oh, ow])?;
    crate::util::check_count(crate::util::elements(&[nr, c, oh, ow])?, 8)?;
    let mut y = vec![0.0; nr * c * oh * ow];
    for r in 0..nr {
        let bi = iv[r];
        if bi < 0 || bi as usize >= x.shape()[0] {
            return err(format!("batch index {bi} is out of range"));
        }
        let roi = &rv[r * 4..r * 4 + 4];
        let (sw, sh) = (roi[0] * scale - offset, roi[1] * scale - offset);
        let (mut rw, mut rh) = (roi[2] * scale - offset - sw, roi[3] * scale - offset - sh);
        if !half {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / oh as f64, rw / ow as f64);
        let gh = if sr > 0 { sr as usize } else { (rh / oh as f64).ceil() as usize };
        let gw = if sr > 0 { sr as usize } else { (rw / ow as f64).ceil() as usize };
        let count = (gh * gw).max(1) as f64;
        for ch in 0..c {
            let plane = &xv[(bi as usize * c + ch) * h * w..(bi as usize * c + ch + 1) * h * w];
            for ph in 0..oh {
                for pw in 0..ow {
                    let mut acc = if max_mode { f64::NEG_INFINITY } else { 0.0 };
                    let mut any = false;
                    for iy in 0..gh {
                        let yy = sh + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                        for ix in 0..gw {
                            let xx = sw + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                            any = true;
                            if yy < -1.0 || yy > h as f64 || xx < -1.0 || xx > w as f64 {
                                if max_mode {
                                    acc = acc.max(0.0);
                                }
                                continue;
                            }
                            let (mut yy, mut xx) = (yy.max(0.0), xx.max(0.0));
                            let (mut y0, mut x0) = (yy as usize, xx as usize);
                            let (y1, x1);
                            if y0 >= h - 1 {
                                y0 = h - 1;
                                y1 = h - 1;
                                yy = y0 as f64;
                            } else {
                                y1 = y0 + 1;
                            }
                            if x0 >= w - 1 {
                                x0 = w - 1;
                                x1 = w - 1;
                                xx = x0 as f64;
                            } else {
                                x1 = x0 + 1;
                            }
                            let (ly, lx) = (yy - y0 as f64, xx - x0 as f64);
                            let (hy, hx) = (1.0 - ly, 1.0 - lx);
                            let t = [
                                hy * hx * plane[y0 * w + x0],
                                hy * lx * plane[y0 * w + x1],
                                ly * hx * plane[y1 * w + x0],
                                ly * lx * plane[y1 * w + x1],
                            ];
                            if max_mode {
                                acc = t.iter().copied().fold(acc, f64::max);
                            } else {
                                acc += t.iter().sum::<f64>();
                            }
                        }
                    }
                    y[((r * c + ch) * oh + ph) * ow + pw] = if max_mode {
                        if any {
                            acc
                        } else {
                            0.0
                        }
                    } else {
                        acc / count
                    };
                }
            }
        }
    }
    Ok(vec![Tensor::from_f64(x.dtype(), &[nr, c, oh, ow], &y)])
}

fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if x < lo {
        let dx = lo - x;
        let k = (dx / rng) as i64;
        let r = dx - k as f64 * rng;
        if k % 2 == 0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let k = (dx / rng) as i64;
        let r = dx - k as f64 * rng;
        if k % 2 == 0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

fn cubic(x: f64) -> [f64; 4] {
    let a = -0.75;
    let x = x.abs();
    [
        ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((a * (2.0 - x) - 5.0 * a) * (2.0 - x) + 8.0 * a) * (2.0 - x) - 4.0 * a,
    ]
}

fn grid_sample(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let (x, grid) = (req(ins, 0)?, req(ins, 1)?);
    need_float(x, "X")?;
    let sp = x.rank().saturating_sub(2);
    if sp == 0 || grid.rank() != sp + 2 || grid.shape()[0] != x.shape()[0] || grid.shape()[sp + 1] != sp {
        return err(format!(
            "X {:?} and grid {:?} do not fit (N, C, D...) and (N, D_out..., {sp})",
            x.shape(),
            grid.shape()
        ));
    }
    let mode = match n.string("mode", "linear") {
        "bilinear" | "linear" => "linear",
        "bicubic" | "cubic" => "cubic",
        "nearest" => "nearest",
        m => return err(format!("unknown mode '{m}'")),
    };
    let pad = n.string("padding_mode", "zeros").to_string();
    let align = n.int("align_corners", 0) != 0;
    let dims: Vec<usize> = x.shape()[2..].to_vec();
    let out_sp: Vec<usize> = grid.shape()[1..=sp].to_vec();
    let (nb, c) = (x.shape()[0], x.shape()[1]);
    let (xv, gv) = (x.to_f64_vec(), grid.to_f64_vec());
    let xst = strides(&dims);
    let in_size: usize = dims.iter().product();
    let out_size: usize = out_sp.iter().product();
    let lo: Vec<f64> = dims.iter().map(|_| if align { 0.0 } else { -0.5 }).collect();
    let hi: Vec<f64> = dims.iter().map(|&d| if align { d as f64 - 1.0 } else { d as f64 - 0.5 }).collect();
    // Index of tap `i` along dim `d`, or None when it reads padding zeros.
    let fetch = |i: i64, d: usize| -> Option<usize> {
        let len = dims[d] as i64;
        match pad.as_str() {
            "border" => Some(i.clamp(0, len - 1) as usize),
            "reflection" => Some((reflect(i as f64, lo[d], hi[d]) as i64).clamp(0, len - 1) as usize),
            _ => (0..len).contains(&i).then_some(i as usize),
        }
    };
    let mut y = vec![0.0; nb * c * out_size];
    for b in 0..nb {
        let mut o = 0;
        let mut failed = None;
        for_each_index(&out_sp, |_| {
            let g = &gv[(b * out_size + o) * sp..(b * out_size + o + 1) * sp];
            // The grid lists coordinates innermost dim first (x, y, ...).
            let mut coord: Vec<f64> = (0..sp)
                .map(|d| {
                    let v = g[sp - 1 - d];
                    let len = dims[d] as f64;
                    if align {
                        (v + 1.0) / 2.0 * (len - 1.0)
                    } else {
                        ((v + 1.0) * len - 1.0) / 2.0
                    }
                })
                .collect();
            if mode == "nearest" {
                coord.iter_mut().for_each(|v| *v = v.round_ties_even());
            }
            for d in 0..sp {
                let v = coord[d];
                if v < lo[d] || v > hi[d] {
                    match pad.as_str() {
                        "border" => coord[d] = v.clamp(0.0, dims[d] as f64 - 1.0),
                        "reflection" => coord[d] = reflect(v, lo[d], hi[d]),
                        _ => {}
                    }
                }
            }
            let taps: Vec<Vec<(i64, f64)>> = coord
                .iter()
                .map(|&v| match mode {
                    "nearest" => vec![(v as i64, 1.0)],
                    "linear" => {
                        let f = v.floor();
                        vec![(f as i64, 1.0 - (v - f)), (f as i64 + 1, v - f)]
                    }
                    _ => {
                        let f = v.floor();
                        let w = cubic(v - f);
                        (0..4).map(|k| (f as i64 - 1 + k as i64, w[k])).collect()
                    }
                })
                .collect();
            let counts: Vec<usize> = taps.iter().map(|t| t.len()).collect();
            for ch in 0..c {
                let plane = &xv[(b * c + ch) * in_size..(b * c + ch + 1) * in_size];
                let mut acc = 0.0;
                for_each_index(&counts, |k| {
                    let mut wgt = 1.0;
                    let mut off = Some(0usize);
                    for d in 0..sp {
                        let (i, wd) = taps[d][k[d]];
                        wgt *= wd;
                        off = match (off, fetch(i, d)) {
                            (Some(o), Some(j)) => Some(o + j * xst[d]),
                            _ => None,
                        };
                    }
                    if let Some(off) = off {
                        acc += wgt * plane[off];
                    }
                });
                y[(b * c + ch) * out_size + o] = acc;
            }
            if !acc_ok(&coord) {
                failed = Some("grid holds a non-finite coordinate");
            }
            o += 1;
        });
        if let Some(f) = failed {
            return err(f);
        }
    }
    let mut shape = vec![nb, c];
    shape.extend(&out_sp);
    Ok(vec![Tensor::from_f64(x.dtype(), &shape, &y)])
}

fn acc_ok(c: &[f64]) -> bool {
    c.iter().all(|v| v.is_finite())
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] =
    &[("NonMaxSuppression", nms), ("RoiAlign", roi_align), ("GridSample", grid_sample)];
