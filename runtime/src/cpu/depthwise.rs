//! Direct depthwise convolution, one channel plane per task.

use super::conv::{resolve, Geometry};
use super::phases::phase_row;
use super::{check_residual, In, Out, OutPtr};
use crate::pool::ThreadPool;
use aim_kernels::fast::copy_short;
#[cfg(target_arch = "x86_64")]
use aim_kernels::gemm::IsaKind;
use aim_kernels::gemm::{clamp, relu, Activation, Isa, Parallel};

pub(super) struct DepthwisePrep {
    pub(super) weights: Vec<f32>,
    pub(super) bias: Option<Vec<f32>>,
    pub(super) act: Option<Activation>,
    /// The program applied after the activation (`post`), over the whole output.
    pub(super) post: Option<std::sync::Arc<aim_kernels::ewprog::wide::Wide>>,
    pub(super) channels: usize,
    pub(super) geo: Geometry,
}

pub(super) fn run_depthwise(
    d: &DepthwisePrep,
    x: In,
    residual: Option<In>,
    y: &mut Out,
    isa: Isa,
    pool: &ThreadPool,
) -> Result<(), String> {
    let xs = x.shape;
    // A 1-D convolution runs as a 2-D one over planes of one row.
    let sp = d.geo.kernel.len();
    if xs.len() != sp + 2 || !(1..=2).contains(&sp) || xs[1] != d.channels {
        return Err(format!("input {xs:?} does not fit a {sp}-D depthwise conv over {} channels", d.channels));
    }
    let (out, before) = resolve(&d.geo, &xs[2..])?;
    // (rows, columns) of a 1-D or 2-D quantity.
    let two = |v: &[usize]| if sp == 1 { (1, v[0]) } else { (v[0], v[1]) };
    let (nb, c) = (xs[0], xs[1]);
    let ((h, w), (oh, ow), (kh, kw)) = (two(&xs[2..]), two(&out), two(&d.geo.kernel));
    let ((sh, sw), (dh, dw)) = (two(&d.geo.strides), two(&d.geo.dilations));
    let (pt, pl) = if sp == 1 { (0, before[0]) } else { (before[0], before[1]) };
    let mut shape = vec![nb, c];
    shape.extend(&out);
    let res = check_residual(residual, &shape)?;
    let xd = x.data;
    let yp = OutPtr(y.take(&shape)?.as_mut_ptr());
    let geo = PlaneGeo { h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl };
    let planes = nb * c;
    let tasks = planes.min(pool.size() * 8).max(1);
    pool.for_each(tasks, &|t| {
        let yp = yp;
        // Scratch rows, allocated once per task: a gather buffer and a row of zeros.
        // Scratch: a gather row, or for 3×3 kernels the padded stride phases of the plane
        // and the filtered rows.
        let mut scratch = vec![0f32; ow.max(dw3_scratch(&geo))];
        for plane in t * planes / tasks..(t + 1) * planes / tasks {
            let ch = plane % c;
            let src = &xd[plane * h * w..(plane + 1) * h * w];
            // SAFETY: plane `plane` of y is written by this task alone.
            let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(plane * oh * ow), oh * ow) };
            let wts = &d.weights[ch * kh * kw..(ch + 1) * kh * kw];
            let bias = d.bias.as_ref().map_or(0.0, |b| b[ch]);
            let act = d.act.unwrap_or(Activation::Identity);
            let res = res.map(|r| &r[plane * oh * ow..(plane + 1) * oh * ow]);
            depthwise_plane(isa, src, dst, wts, &geo, bias, act, res, &mut scratch);
        }
    });
    Ok(())
}

/// The sizes of one depthwise plane.
#[derive(Clone, Copy)]
struct PlaneGeo {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
}

/// One channel of a depthwise convolution, compiled for the ISA at hand.
#[allow(clippy::too_many_arguments)]
fn depthwise_plane(
    isa: Isa,
    src: &[f32],
    dst: &mut [f32],
    wts: &[f32],
    g: &PlaneGeo,
    bias: f32,
    act: Activation,
    res: Option<&[f32]>,
    scratch: &mut [f32],
) {
    // Clamps run inside the filter loops; the other activations over the plane afterwards.
    let inner = if act.clamp_bounds().is_some() { act } else { Activation::Identity };
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(
            src: &[f32],
            dst: &mut [f32],
            wts: &[f32],
            g: &PlaneGeo,
            bias: f32,
            act: Activation,
            res: Option<&[f32]>,
            scratch: &mut [f32],
        ) {
            depthwise_body::<true>(src, dst, wts, g, bias, act, res, scratch)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(
            src: &[f32],
            dst: &mut [f32],
            wts: &[f32],
            g: &PlaneGeo,
            bias: f32,
            act: Activation,
            res: Option<&[f32]>,
            scratch: &mut [f32],
        ) {
            depthwise_body::<true>(src, dst, wts, g, bias, act, res, scratch)
        }
        // SAFETY: the ISA was checked available.
        match isa.kind() {
            IsaKind::Avx512 => unsafe { v4(src, dst, wts, g, bias, inner, res, scratch) },
            IsaKind::Avx2 => unsafe { v3(src, dst, wts, g, bias, inner, res, scratch) },
            IsaKind::Portable | IsaKind::Neon => depthwise_body::<false>(src, dst, wts, g, bias, inner, res, scratch),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    depthwise_body::<false>(src, dst, wts, g, bias, inner, res, scratch);
    if inner != act {
        act.apply_all(isa, dst);
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn depthwise_body<const FMA: bool>(
    src: &[f32],
    dst: &mut [f32],
    wts: &[f32],
    g: &PlaneGeo,
    bias: f32,
    act: Activation,
    res: Option<&[f32]>,
    scratch: &mut [f32],
) {
    let PlaneGeo { h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl } = *g;
    if kh == 3 && kw == 3 && dh == 1 && dw == 1 {
        return depthwise_3x3::<FMA>(src, dst, wts, g, bias, act, res, scratch);
    }
    let tmp = &mut scratch[..ow];
    for oy in 0..oh {
        let row = &mut dst[oy * ow..(oy + 1) * ow];
        row.fill(bias);
        for ky in 0..kh {
            let iy = (oy * sh + ky * dh) as isize - pt as isize;
            if iy < 0 || iy >= h as isize {
                continue;
            }
            let srow = &src[iy as usize * w..(iy as usize + 1) * w];
            for kx in 0..kw {
                let wv = wts[ky * kw + kx];
                // tmp[ox] = input column ox·sw + kx·dw − pl, or zero in the padding.
                tmp.fill(0.0);
                phase_row(srow, sw, kx * dw, pl, tmp);
                for (o, &v) in row.iter_mut().zip(tmp.iter()) {
                    *o = fma::<FMA>(wv, v, *o);
                }
            }
        }
        match res {
            Some(r) => {
                for (v, &x) in row.iter_mut().zip(&r[oy * ow..(oy + 1) * ow]) {
                    *v = act.apply(*v + x);
                }
            }
            None => row.iter_mut().for_each(|v| *v = act.apply(*v)),
        }
    }
}

/// Scratch floats [`depthwise_3x3`] needs for a plane of this geometry.
fn dw3_scratch(g: &PlaneGeo) -> usize {
    let (wp, hp) = (g.ow + 2 / g.sw, g.oh + 2 / g.sh + 1);
    g.sh * g.sw * (hp * wp + 16) + g.oh * wp
}

/// A 3×3 depthwise plane (any stride) as one long 9-tap filter: the zero-padded plane is
/// split into its stride phases (phase (a, b) holds padded rows a, a+sh, ... and columns b,
/// b+sw, ...), each with rows `wp = ow + 2/sw` wide, so that every tap reads one contiguous
/// run of one phase for all output positions at once. The filter runs over all rows in one
/// loop (the extra columns per row are computed and dropped): no per-row edge cases, no
/// short vector tails, no gathers for stride 2.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn depthwise_3x3<const FMA: bool>(
    src: &[f32],
    dst: &mut [f32],
    wts: &[f32],
    g: &PlaneGeo,
    bias: f32,
    act: Activation,
    res: Option<&[f32]>,
    scratch: &mut [f32],
) {
    let PlaneGeo { h, w, oh, ow, sh, sw, pt, pl, .. } = *g;
    let (wp, hp) = (ow + 2 / sw, oh + 2 / sh + 1);
    let stride = hp * wp + 16;
    let (phases, rest) = scratch.split_at_mut(sh * sw * stride);
    let q = &mut rest[..oh * wp];
    for a in 0..sh {
        for b in 0..sw {
            let ph = &mut phases[(a * sw + b) * stride..(a * sw + b + 1) * stride];
            for y in 0..hp {
                let iy = (y * sh + a) as isize - pt as isize;
                // Every plane of the task writes the same positions: the padding, never
                // written, stays zero from the scratch's allocation.
                if iy >= 0 && iy < h as isize {
                    phase_row(&src[iy as usize * w..(iy as usize + 1) * w], sw, b, pl, &mut ph[y * wp..(y + 1) * wp]);
                }
            }
        }
    }
    let n = oh * wp;
    let tap = |t: usize| -> &[f32] {
        let (ky, kx) = (t / 3, t % 3);
        let base = ((ky % sh) * sw + kx % sw) * stride + (ky / sh) * wp + kx / sw;
        &phases[base..base + n]
    };
    let (s0, s1, s2, s3, s4, s5, s6, s7, s8) = (tap(0), tap(1), tap(2), tap(3), tap(4), tap(5), tap(6), tap(7), tap(8));
    let k: [f32; 9] = std::array::from_fn(|i| wts[i]);
    // Without a residual the activation runs in the filter loop; with one it waits for the
    // residual, added while the rows are compacted.
    let taps = [s0, s1, s2, s3, s4, s5, s6, s7, s8];
    // The activation (a clamp: the others run after the plane, see `depthwise_plane`) runs
    // in the filter loop when there is no residual to add first.
    match if res.is_none() { act } else { Activation::Identity } {
        Activation::Relu => filter9::<FMA>(q, &taps, &k, bias, relu),
        Activation::Clip(lo, hi) => filter9::<FMA>(q, &taps, &k, bias, |v| clamp(v, lo, hi)),
        _ => filter9::<FMA>(q, &taps, &k, bias, |v| v),
    }
    for oy in 0..oh {
        let (row, qrow) = (&mut dst[oy * ow..(oy + 1) * ow], &q[oy * wp..oy * wp + ow]);
        match res {
            Some(r) => {
                for ((o, &v), &x) in row.iter_mut().zip(qrow).zip(&r[oy * ow..(oy + 1) * ow]) {
                    *o = act.apply(v + x);
                }
            }
            None => copy_short(row, qrow),
        }
    }
}

/// `a·b + c`: fused where the ISA has FMA (`FMA` is set only inside functions compiled with
/// it; elsewhere `mul_add` would be a slow library call).
#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `q[i] = f(bias + Σ k[t]·taps[t][i])`, the activation `f` monomorphised into the loop.
#[inline(always)]
fn filter9<const FMA: bool>(q: &mut [f32], taps: &[&[f32]; 9], k: &[f32; 9], bias: f32, f: impl Fn(f32) -> f32) {
    let n = q.len();
    let [s0, s1, s2, s3, s4, s5, s6, s7, s8] = taps.map(|s| &s[..n]);
    for i in 0..n {
        let mut acc = fma::<FMA>(k[0], s0[i], bias);
        acc = fma::<FMA>(k[1], s1[i], acc);
        acc = fma::<FMA>(k[2], s2[i], acc);
        acc = fma::<FMA>(k[3], s3[i], acc);
        acc = fma::<FMA>(k[4], s4[i], acc);
        acc = fma::<FMA>(k[5], s5[i], acc);
        acc = fma::<FMA>(k[6], s6[i], acc);
        acc = fma::<FMA>(k[7], s7[i], acc);
        acc = fma::<FMA>(k[8], s8[i], acc);
        q[i] = f(acc);
    }
}
