//! 2-D transposed convolutions (`aim:ConvTranspose`) as a GEMM and an overlap-add: per
//! group, `cols = Wᵀ · X` — the weights packed once as A (`Cout_g·kh·kw × Cin_g`), the
//! input's rows read as B in place — gives every input pixel's contribution to a
//! `kh × kw` window of every output channel; adding each into its place in the output
//! (col2im) finishes it. Bias, residual and activation are applied once the sums are done.

use super::{activation, check_residual, const_f32, prep_err, In, Out, OutPtr, Prepared};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{Graph, Node};
use aim_kernels::gemm::{gemm_lazy_b, Activation, Blocking, Epilogue, Isa, PackedA, Parallel};

pub(super) struct DeconvPrep {
    /// One packed `Wᵀ` per group.
    weights: Vec<PackedA>,
    bias: Option<Vec<f32>>,
    act: Option<Activation>,
    isa: Isa,
    group: usize,
    cin: usize,
    /// Output channels per group.
    mg: usize,
    kernel: [usize; 2],
    /// Where the kernel equals the stride: the weights as `[group][co][ky][kx][ci]`, the
    /// taps of each output pixel over the group's input channels.
    taps: Option<Vec<f32>>,
    /// The node, for the geometry (`aim_kernels::ops::conv::transpose_geometry`).
    node: Node,
}

/// Packs the weights of a 2-D `aim:ConvTranspose` (W `[Cin, Cout/group, kh, kw]`).
pub(super) fn prepare(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<Prepared, RunError> {
    let w = const_f32(g, n.input(1)).ok_or_else(|| prep_err(n, "weights must be constant f32"))?;
    if w.rank() != 4 {
        return Err(prep_err(n, "weights must be 4-D"));
    }
    let (cin, mg, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let group = n.int("group", 1).max(1) as usize;
    if cin % group != 0 {
        return Err(prep_err(n, format!("{cin} input channels do not split into {group} groups")));
    }
    let cg = cin / group;
    let m = mg * kh * kw;
    let wd = w.data::<f32>();
    // A_g[(co·kh + ky)·kw + kx][ci] = W[g·cg + ci][co][ky][kx]: W's rows for the group,
    // transposed.
    let weights = (0..group)
        .map(|gi| PackedA::from_slice(isa, blocking, &wd[gi * cg * m..(gi + 1) * cg * m], m, cg, true))
        .collect();
    let bias = match n.input(2) {
        Some(b) => Some(
            const_f32(g, Some(b))
                .filter(|t| t.len() == mg * group)
                .ok_or_else(|| prep_err(n, "bias must be constant f32 with one value per output channel"))?
                .data::<f32>()
                .to_vec(),
        ),
        None => None,
    };
    let one_tap = kw <= aim_kernels::fast::MAX_TAPS
        && n.ints("strides").is_some_and(|s| s == [kh as i64, kw as i64])
        && n.ints("pads").is_none_or(|p| p.iter().all(|&v| v == 0))
        && n.ints("dilations").is_none_or(|d| d.iter().all(|&v| v == 1))
        && n.ints("output_padding").is_none_or(|p| p.iter().all(|&v| v == 0))
        && n.ints("output_shape").is_none()
        && matches!(n.string("auto_pad", "NOTSET"), "NOTSET" | "VALID");
    let taps = one_tap.then(|| {
        let mut t = Vec::with_capacity(wd.len());
        for gi in 0..group {
            for co in 0..mg {
                for k in 0..kh * kw {
                    t.extend((0..cg).map(|ci| wd[((gi * cg + ci) * mg + co) * kh * kw + k]));
                }
            }
        }
        t
    });
    Ok(Prepared::Deconv(Box::new(DeconvPrep {
        weights,
        taps,
        bias,
        act: activation(n),
        isa,
        group,
        cin,
        mg,
        kernel: [kh, kw],
        node: n.clone(),
    })))
}

/// Runs the transposed convolution on `x` `[N, Cin, H, W]`.
pub(super) fn run(d: &DeconvPrep, x: In, residual: Option<In>, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let xs = x.shape;
    if xs.len() != 4 || xs[1] != d.cin {
        return Err(format!("input {xs:?} does not fit a 2-D transposed convolution over {} channels", d.cin));
    }
    let geo = aim_kernels::ops::conv::transpose_geometry(&d.node, &xs[2..], &d.kernel).map_err(|e| e.0)?;
    let (nb, h, w) = (xs[0], xs[2], xs[3]);
    let (oh, ow) = (geo.out[0], geo.out[1]);
    let m = d.mg * d.group;
    let shape = [nb, m, oh, ow];
    let res = check_residual(residual, &shape)?;
    let [kh, kw] = d.kernel;
    let (cg, rows, hw) = (d.cin / d.group, d.mg * kh * kw, h * w);
    let (osize, isize) = (oh * ow, hw);
    let yd = y.take(&shape)?;
    // Kernel equal to stride without padding or dilation (the 2×2/2 upsampling of segmentation
    // heads): every output pixel comes from one tap, computed as a weighted sum of input
    // rows straight into place, with bias, residual and activation per output row.
    let direct = geo.strides == [kh, kw]
        && geo.dilations == [1, 1]
        && geo.pads.iter().all(|&p| p == 0)
        && (oh, ow) == (h * kh, w * kw);
    if let (true, Some(taps)) = (direct, &d.taps) {
        let yp = OutPtr(yd.as_mut_ptr());
        let per = (64 * 1024 / (cg * w).max(1)).clamp(1, oh);
        for b in 0..nb {
            for gi in 0..d.group {
                let xg = &x.data[(b * d.cin + gi * cg) * isize..(b * d.cin + (gi + 1) * cg) * isize];
                let tasks = oh.div_ceil(per);
                pool.for_each(d.mg * tasks, &|t| {
                    let yp = yp;
                    let (co, part) = (t / tasks, t % tasks);
                    let oc = gi * d.mg + co;
                    let off = (b * m + oc) * osize;
                    let bias = d.bias.as_ref().map_or(0.0, |v| v[oc]);
                    for oy in part * per..((part + 1) * per).min(oh) {
                        let (iy, ky) = (oy / kh, oy % kh);
                        // SAFETY: task t writes rows part·per.. of output channel `oc` alone.
                        let orow = unsafe { std::slice::from_raw_parts_mut(yp.0.add(off + oy * ow), ow) };
                        let wt = &taps[((gi * d.mg + co) * kh + ky) * kw * cg..][..kw * cg];
                        aim_kernels::fast::tap_rows(d.isa, &xg[iy * w..], hw, wt, kw, bias, orow);
                        if let Some(r) = res {
                            orow.iter_mut().zip(&r[off + oy * ow..off + (oy + 1) * ow]).for_each(|(v, &x)| *v += x);
                        }
                        if let Some(a) = d.act {
                            a.apply_all(d.isa, orow);
                        }
                    }
                });
            }
        }
        return Ok(());
    }
    // GEMM writes every element of the columns: a reused buffer, not a zeroed one per run.
    let mut cols = aim_kernels::scratch::take(rows * hw);
    for b in 0..nb {
        for gi in 0..d.group {
            let xg = &x.data[(b * d.cin + gi * cg) * isize..(b * d.cin + (gi + 1) * cg) * isize];
            let fill =
                |p: usize, j0: usize, dst: &mut [f32]| dst.copy_from_slice(&xg[p * hw + j0..p * hw + j0 + dst.len()]);
            gemm_lazy_b(&d.weights[gi], hw, &fill, &mut cols, hw, &Epilogue::default(), pool);
            // Overlap-add into each output channel of the group, in parallel over channels.
            let yp = OutPtr(yd.as_mut_ptr());
            let cols = &cols;
            pool.for_each(d.mg, &|co| {
                let yp = yp;
                let oc = gi * d.mg + co;
                let off = (b * m + oc) * osize;
                // SAFETY: task co writes output channel `oc` of image `b` alone.
                let plane = unsafe { std::slice::from_raw_parts_mut(yp.0.add(off), osize) };
                let bias = d.bias.as_ref().map_or(0.0, |v| v[oc]);
                plane.fill(bias);
                for ky in 0..kh {
                    for kx in 0..kw {
                        let src = &cols[((co * kh + ky) * kw + kx) * hw..][..hw];
                        for iy in 0..h {
                            let oy = (iy * geo.strides[0] + ky * geo.dilations[0]) as isize - geo.pads[0] as isize;
                            if oy < 0 || oy >= oh as isize {
                                continue;
                            }
                            let orow = &mut plane[oy as usize * ow..(oy as usize + 1) * ow];
                            let srow = &src[iy * w..(iy + 1) * w];
                            let x0 = kx as isize * geo.dilations[1] as isize - geo.pads[1] as isize;
                            let sw = geo.strides[1];
                            for (ix, &v) in srow.iter().enumerate() {
                                let ox = ix as isize * sw as isize + x0;
                                if ox >= 0 && (ox as usize) < ow {
                                    orow[ox as usize] += v;
                                }
                            }
                        }
                    }
                }
                if let Some(r) = res {
                    plane.iter_mut().zip(&r[off..off + osize]).for_each(|(v, &x)| *v += x);
                }
                if let Some(a) = d.act {
                    a.apply_all(d.isa, plane);
                }
            });
        }
    }
    let _ = Parallel::threads(pool);
    Ok(())
}
