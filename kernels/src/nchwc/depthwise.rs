//! Depthwise convolution in the blocked layout: one vector holds the same pixel of `L`
//! channels, so every tap is one vector load and one FMA against that tap's weights for
//! those channels. Interior pixels run four at a time (each tap's weights loaded once);
//! pixels whose window crosses the left or right edge skip the taps outside, and rows near
//! the top or bottom skip whole kernel rows: no padded copy.

use crate::gemm::IsaKind;

use super::conv::ConvIo;
use super::shared::{In, OutPtr};
use super::simd::Vf32;
use super::Geometry;
use crate::gemm::{Activation, Isa, Parallel};

/// A depthwise convolution (`group == channels`, one filter per channel), packed by block.
pub struct Depthwise {
    isa: Isa,
    lanes: usize,
    channels: usize,
    geo: Geometry,
    /// `[block][kh·kw][L]`.
    weights: Vec<f32>,
    /// `[block][L]`.
    bias: Vec<f32>,
    act: Activation,
}

impl Depthwise {
    /// Packs `weights` (`[c][1][kh][kw]`) and `bias` by channel block.
    pub fn new(
        isa: Isa,
        weights: &[f32],
        bias: Option<&[f32]>,
        channels: usize,
        geo: Geometry,
        act: Activation,
    ) -> Depthwise {
        let lanes = super::lanes(isa);
        let taps = geo.kernel[0] * geo.kernel[1];
        assert_eq!(weights.len(), channels * taps, "weights do not match the shape");
        let blocks = channels.div_ceil(lanes);
        let mut w = vec![0f32; blocks * taps * lanes];
        let mut b = vec![0f32; blocks * lanes];
        for c in 0..channels {
            for t in 0..taps {
                w[((c / lanes) * taps + t) * lanes + c % lanes] = weights[c * taps + t];
            }
            b[c] = bias.map_or(0.0, |b| b[c]);
        }
        Depthwise { isa, lanes, channels, geo, weights: w, bias: b, act }
    }

    /// The loop nest [`Depthwise::run`] runs for this output size, as lines of text.
    pub fn schedule(&self, batch: usize, oh: usize, ow: usize, residual: bool) -> Vec<String> {
        let l = self.lanes;
        let blocks = self.channels.div_ceil(l);
        let [kh, kw] = self.geo.kernel;
        vec![
            format!("parallel for (image, block, output row) in 0..{}: {} tasks", batch * blocks * oh, batch * blocks * oh),
            format!("  for interior pixels, 4 at a time ({ow} per row): acc[4 px][{l} ch] += x[tap] · w[tap] over {kh}×{kw} taps ({:?})", self.isa),
            "  edge pixels one at a time, taps outside the input skipped (no padded copy)".to_string(),
            format!("  + bias{}, {}", if residual { ", + residual" } else { "" }, super::conv::act_text(self.act)),
        ]
    }

    /// Runs the convolution on blocked input (`io.x`), into blocked output; the padding
    /// after is implied by the output size. Errors name what does not fit.
    pub fn run(&self, io: ConvIo, par: &dyn Parallel) -> Result<(), String> {
        if io.residual_in_y {
            return Err("this kernel takes its residual as a separate tensor".into());
        }
        let l = self.lanes;
        let blocks = self.channels.div_ceil(l);
        let (in_len, out_len) = (io.batch * blocks * io.h * io.w * l, io.batch * blocks * io.oh * io.ow * l);
        if io.x.len() != in_len || io.y.len() != out_len || io.residual.is_some_and(|r| r.len() != out_len) {
            return Err(format!("buffer sizes {} / {} do not match {in_len} / {out_len}", io.x.len(), io.y.len()));
        }
        let (lo, hi) = super::shared::bounds(self.act);
        let job = Job { d: self, h: io.h, w: io.w, oh: io.oh, ow: io.ow, pt: io.pads[0], pl: io.pads[1], lo, hi };
        let (x, y, res) =
            (In(io.x.as_ptr()), OutPtr(io.y.as_mut_ptr()), In(io.residual.map_or(std::ptr::null(), |r| r.as_ptr())));
        let rows = io.batch * blocks * io.oh;
        par.for_each(rows, &|t| {
            let (x, y, res) = (x, y, res);
            // SAFETY: sizes checked above; task t writes output row t (of all blocks' rows).
            unsafe { job.row(t, x.0, y.0, res.0) }
        });
        Ok(())
    }
}

struct Job<'a> {
    d: &'a Depthwise,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    pt: usize,
    pl: usize,
    lo: f32,
    hi: f32,
}

impl Job<'_> {
    unsafe fn row(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        match self.d.isa.kind() {
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512 => self.row_avx512(t, x, y, res),
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => self.row_avx2(t, x, y, res),
            _ => self.row_generic::<super::simd::Portable8>(t, x, y, res),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn row_avx512(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        self.row_generic::<super::simd::F32x16>(t, x, y, res)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_avx2(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        self.row_generic::<super::simd::F32x8>(t, x, y, res)
    }

    /// Output row `t` = (image·blocks + block)·oh + oy.
    #[inline(always)]
    unsafe fn row_generic<V: Vf32>(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        let l = V::LANES;
        let [kh, kw] = self.d.geo.kernel;
        let [sh, sw] = self.d.geo.strides;
        let [dh, dw] = self.d.geo.dilations;
        let (plane, oy) = (t / self.oh, t % self.oh);
        let blk = plane % self.d.channels.div_ceil(l);
        let xp = x.add(plane * self.h * self.w * l);
        let yrow = y.add(t * self.ow * l);
        let rrow = if res.is_null() { res } else { res.add(t * self.ow * l) };
        let wts = self.d.weights.as_ptr().add(blk * kh * kw * l);
        let bias = V::load(self.d.bias.as_ptr().add(blk * l));
        let (lo, hi) = (V::splat(self.lo), V::splat(self.hi));
        // Kernel rows inside the input for this output row.
        let iy0 = (oy * sh) as isize - self.pt as isize;
        let ky_lo = if iy0 >= 0 { 0 } else { ((-iy0) as usize).div_ceil(dh) };
        let ky_hi = if iy0 >= self.h as isize { 0 } else { ((self.h as isize - iy0) as usize).div_ceil(dh).min(kh) };
        // Output columns whose whole window lies inside the row: [ox_lo, ox_hi).
        let ox_lo = self.pl.div_ceil(sw).min(self.ow);
        let span = (kw - 1) * dw;
        let ox_hi = if self.w + self.pl > span {
            ((self.w + self.pl - span - 1) / sw + 1).min(self.ow).max(ox_lo)
        } else {
            ox_lo
        };
        let r = Row { xp, yrow, rrow, wts, bias, lo, hi, iy0, ky_lo, ky_hi };
        for ox in 0..ox_lo {
            self.edge(&r, ox);
        }
        let mut ox = ox_lo;
        while ox + 4 <= ox_hi {
            let ix0 = ox * sw - self.pl;
            let mut acc = [bias; 4];
            for ky in ky_lo..ky_hi {
                let rowp = xp.add(((iy0 + (ky * dh) as isize) as usize * self.w + ix0) * l);
                for kx in 0..kw {
                    let wv = V::load(wts.add((ky * kw + kx) * l));
                    for (r, a) in acc.iter_mut().enumerate() {
                        *a = V::load(rowp.add((r * sw + kx * dw) * l)).fma(wv, *a);
                    }
                }
            }
            for (i, a) in acc.into_iter().enumerate() {
                r.finish(a, ox + i, l);
            }
            ox += 4;
        }
        for ox in ox..self.ow {
            self.edge(&r, ox);
        }
        // Activations other than a clamp run over the row just written.
        super::shared::finish(self.d.act, self.d.isa, yrow, self.ow * l);
    }
}

/// One output row's operands.
struct Row<V> {
    xp: *const f32,
    yrow: *mut f32,
    rrow: *const f32,
    wts: *const f32,
    bias: V,
    lo: V,
    hi: V,
    iy0: isize,
    ky_lo: usize,
    ky_hi: usize,
}

impl<V: Vf32> Row<V> {
    /// Adds the residual, clamps and stores pixel `ox`.
    #[inline(always)]
    unsafe fn finish(&self, v: V, ox: usize, l: usize) {
        let v = if self.rrow.is_null() { v } else { v.add(V::load(self.rrow.add(ox * l))) };
        v.clamp(self.lo, self.hi).store(self.yrow.add(ox * l));
    }
}

impl Job<'_> {
    /// One pixel whose window may cross the left or right edge: taps outside are skipped.
    #[inline(always)]
    unsafe fn edge<V: Vf32>(&self, r: &Row<V>, ox: usize) {
        let l = V::LANES;
        let kw = self.d.geo.kernel[1];
        let (dh, dw) = (self.d.geo.dilations[0], self.d.geo.dilations[1]);
        let ix0 = (ox * self.d.geo.strides[1]) as isize - self.pl as isize;
        let mut acc = r.bias;
        for ky in r.ky_lo..r.ky_hi {
            let iy = (r.iy0 + (ky * dh) as isize) as usize;
            for kx in 0..kw {
                let ix = ix0 + (kx * dw) as isize;
                if ix >= 0 && (ix as usize) < self.w {
                    let xv = V::load(r.xp.add((iy * self.w + ix as usize) * l));
                    acc = xv.fma(V::load(r.wts.add((ky * kw + kx) * l)), acc);
                }
            }
        }
        r.finish(acc, ox, l);
    }
}
