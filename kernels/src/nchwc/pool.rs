//! Pooling in the blocked layout, so that a network's pooling layers stay inside its
//! blocked region (no reorder before and after): every window step is one vector operation
//! over a block of channels.

#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;

use super::shared::{In, OutPtr};
use super::simd::Vf32;
use crate::gemm::{Isa, Parallel};

/// The widest input (in pixels) max pooling runs separably for: the column maxima of one
/// output row live on the stack (up to 16 lanes each).
const SEPARABLE_MAX_W: usize = 256;

/// A 2-D max or average pooling window (no dilation; output size floor((in + pads − k)/s) + 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Max (else average).
    pub max: bool,
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Padding: top, left, bottom, right.
    pub pads: [usize; 4],
    /// Average pooling: divide by the whole window clipped to the padded input (else by the
    /// part inside the input).
    pub include_pad: bool,
}

impl Pool {
    /// The output height and width for an input of `h × w`, or None if the window does not
    /// fit.
    pub fn output(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let (th, tw) = (h + self.pads[0] + self.pads[2], w + self.pads[1] + self.pads[3]);
        if th < self.kernel[0] || tw < self.kernel[1] || self.strides.contains(&0) {
            return None;
        }
        Some(((th - self.kernel[0]) / self.strides[0] + 1, (tw - self.kernel[1]) / self.strides[1] + 1))
    }

    /// Pools `x` (`[n][blocks][h][w][L]`) into `y` (`[n][blocks][oh][ow][L]`).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        isa: Isa,
        x: &[f32],
        n: usize,
        blocks: usize,
        h: usize,
        w: usize,
        y: &mut [f32],
        par: &dyn Parallel,
    ) -> Result<(), String> {
        let l = super::lanes(isa);
        let (oh, ow) =
            self.output(h, w).ok_or_else(|| format!("the {:?} window does not fit a {h}×{w} input", self.kernel))?;
        if x.len() != n * blocks * h * w * l || y.len() != n * blocks * oh * ow * l {
            return Err(format!("buffer sizes {} / {} do not match the pooling", x.len(), y.len()));
        }
        let (xp, yp) = (In(x.as_ptr()), OutPtr(y.as_mut_ptr()));
        par.for_each(n * blocks * oh, &|t| {
            let (xp, yp) = (xp, yp);
            // SAFETY: sizes checked above; task t writes output row t only.
            unsafe {
                match isa.kind() {
                    #[cfg(target_arch = "x86_64")]
                    IsaKind::Avx512 => self.row_avx512(t, xp.0, yp.0, h, w, oh, ow),
                    #[cfg(target_arch = "x86_64")]
                    IsaKind::Avx2 => self.row_avx2(t, xp.0, yp.0, h, w, oh, ow),
                    _ => self.row::<super::simd::Portable8>(t, xp.0, yp.0, h, w, oh, ow),
                }
            }
        });
        Ok(())
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_avx512(&self, t: usize, x: *const f32, y: *mut f32, h: usize, w: usize, oh: usize, ow: usize) {
        self.row::<super::simd::F32x16>(t, x, y, h, w, oh, ow)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_avx2(&self, t: usize, x: *const f32, y: *mut f32, h: usize, w: usize, oh: usize, ow: usize) {
        self.row::<super::simd::F32x8>(t, x, y, h, w, oh, ow)
    }

    /// Output row `t` = (image·blocks + block)·oh + oy.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row<V: Vf32>(&self, t: usize, x: *const f32, y: *mut f32, h: usize, w: usize, oh: usize, ow: usize) {
        let l = V::LANES;
        let (plane, oy) = (t / oh, t % oh);
        let xp = x.add(plane * h * w * l);
        let yrow = y.add(t * ow * l);
        let [kh, kw] = self.kernel;
        let y0 = (oy * self.strides[0]) as isize - self.pads[0] as isize;
        let (ys, ye) = (y0.max(0) as usize, (y0 + kh as isize).clamp(0, h as isize) as usize);
        if self.max && w <= SEPARABLE_MAX_W && ye > ys {
            // Separable: the maximum down each input column of the window's rows (short,
            // independent chains), then across each window's columns of those maxima.
            // Uninitialised: every column the windows read (0..w) is written first, and a
            // zeroed 16 KiB per output row cost more than the pooling of a narrow row.
            let mut col = std::mem::MaybeUninit::<[f32; SEPARABLE_MAX_W * 16]>::uninit();
            let cp = col.as_mut_ptr() as *mut f32;
            for ix in 0..w {
                let mut m = V::load(xp.add((ys * w + ix) * l));
                for iy in ys + 1..ye {
                    m = m.max_nan(V::load(xp.add((iy * w + ix) * l)));
                }
                m.store(cp.add(ix * l));
            }
            for ox in 0..ow {
                let x0 = (ox * self.strides[1]) as isize - self.pads[1] as isize;
                let (xs, xe) = (x0.max(0) as usize, (x0 + kw as isize).clamp(0, w as isize) as usize);
                let mut acc = V::splat(f32::NEG_INFINITY);
                for ix in xs..xe {
                    acc = acc.max_nan(V::load(cp.add(ix * l)));
                }
                acc.store(yrow.add(ox * l));
            }
            return;
        }
        for ox in 0..ow {
            let x0 = (ox * self.strides[1]) as isize - self.pads[1] as isize;
            let (xs, xe) = (x0.max(0) as usize, (x0 + kw as isize).clamp(0, w as isize) as usize);
            let mut acc = if self.max { V::splat(f32::NEG_INFINITY) } else { V::zero() };
            for iy in ys..ye {
                for ix in xs..xe {
                    let v = V::load(xp.add((iy * w + ix) * l));
                    acc = if self.max { acc.max_nan(v) } else { acc.add(v) };
                }
            }
            if !self.max {
                let cnt = if self.include_pad {
                    // The window clipped to the padded input.
                    let ye2 = (y0 + kh as isize).min((h + self.pads[2]) as isize);
                    let xe2 = (x0 + kw as isize).min((w + self.pads[3]) as isize);
                    ((ye2 - y0) * (xe2 - x0)) as f32
                } else {
                    ((ye - ys) * (xe - xs)) as f32
                };
                acc = acc.mul(V::splat(1.0 / cnt.max(1.0)));
            }
            acc.store(yrow.add(ox * l));
        }
    }
}

/// Global average pooling of `x` (`[n][ceil(c/L)][hw][L]`) into `y` (`[n][c]`, i.e. NCHW
/// `[n][c][1][1]`): the blocked region ends here.
pub fn global_average(
    isa: Isa,
    x: &[f32],
    n: usize,
    c: usize,
    hw: usize,
    y: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), String> {
    let l = super::lanes(isa);
    let blocks = c.div_ceil(l);
    if x.len() != n * blocks * hw * l || y.len() != n * c {
        return Err(format!("buffer sizes {} / {} do not match global pooling of {c} channels", x.len(), y.len()));
    }
    let (xp, yp) = (In(x.as_ptr()), OutPtr(y.as_mut_ptr()));
    par.for_each(n * blocks, &|t| {
        let (xp, yp) = (xp, yp);
        let mut sum = [0f64; 16];
        // SAFETY: sizes checked above; the plane of task t holds hw·l floats.
        unsafe {
            let plane = xp.0.add(t * hw * l);
            match isa.kind() {
                #[cfg(target_arch = "x86_64")]
                IsaKind::Avx512 => plane_sum_avx512(plane, hw, &mut sum),
                #[cfg(target_arch = "x86_64")]
                IsaKind::Avx2 => plane_sum_avx2(plane, hw, &mut sum),
                _ => plane_sum::<super::simd::Portable8>(plane, hw, &mut sum),
            }
        }
        let (img, blk) = (t / blocks, t % blocks);
        let chans = (c - blk * l).min(l);
        // SAFETY: task t writes its block's channels of image img only.
        let out = unsafe { std::slice::from_raw_parts_mut(yp.0.add(img * c + blk * l), chans) };
        for (o, s) in out.iter_mut().zip(&sum) {
            *o = (*s / hw as f64) as f32;
        }
    });
    Ok(())
}

/// Pixels summed in f32 before the partial sum joins the f64 total: short runs keep the
/// f32 rounding error small while the vector adds run four chains wide.
const GLOBAL_RUN: usize = 64;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn plane_sum_avx512(x: *const f32, hw: usize, sum: &mut [f64; 16]) {
    plane_sum::<super::simd::F32x16>(x, hw, sum)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane_sum_avx2(x: *const f32, hw: usize, sum: &mut [f64; 16]) {
    plane_sum::<super::simd::F32x8>(x, hw, sum)
}

/// Adds the `hw` pixels of one blocked plane (`[hw][L]`) into `sum[..L]`.
#[inline(always)]
unsafe fn plane_sum<V: Vf32>(x: *const f32, hw: usize, sum: &mut [f64; 16]) {
    let l = V::LANES;
    let mut part = [0f32; 16];
    let mut p = 0;
    while p < hw {
        let end = (p + GLOBAL_RUN).min(hw);
        let mut acc = [V::zero(); 4];
        while p + 4 <= end {
            for (i, a) in acc.iter_mut().enumerate() {
                *a = a.add(V::load(x.add((p + i) * l)));
            }
            p += 4;
        }
        while p < end {
            acc[0] = acc[0].add(V::load(x.add(p * l)));
            p += 1;
        }
        acc[0].add(acc[1]).add(acc[2].add(acc[3])).store(part.as_mut_ptr());
        for (s, &v) in sum.iter_mut().zip(&part[..l]) {
            *s += v as f64;
        }
    }
}
