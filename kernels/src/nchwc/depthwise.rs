//! Depthwise convolution in the blocked layout: one vector holds the same pixel of `L`
//! channels, so every tap is one vector load and one FMA against that tap's weights for
//! those channels. Pixels run [`GROUP`] at a time (as many accumulator chains, each tap's
//! weights loaded once). Two ways to handle the borders, picked by how much they copy:
//! - by output row: windows inside the input read it in place; a group of pixels whose
//!   windows cross the left or right edge reads a small zero-padded strip of the columns
//!   it needs; rows near the top or bottom skip whole kernel rows;
//! - by plane, where most groups cross an edge (small images, large kernels): the plane is
//!   copied once into a zero-padded buffer and every group reads that.

#[cfg(target_arch = "x86_64")]
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
    /// The program applied after the activation, if any.
    post: super::shared::Post,
}

impl Depthwise {
    /// The convolution with `post` (a program of one input) applied to its output after
    /// the activation, on each row just written.
    pub fn with_post(mut self, post: super::shared::Post) -> Depthwise {
        self.post = post;
        self
    }

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
        Depthwise { isa, lanes, channels, geo, weights: w, bias: b, act, post: None }
    }

    /// The loop nest [`Depthwise::run`] runs for this input and output size, as lines of
    /// text.
    #[allow(clippy::too_many_arguments)]
    pub fn schedule(
        &self,
        batch: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
        pads: [usize; 4],
        residual: bool,
    ) -> Vec<String> {
        let l = self.lanes;
        let blocks = self.channels.div_ceil(l);
        let [kh, kw] = self.geo.kernel;
        let job = self.job(h, w, oh, ow, pads, batch * blocks);
        let mut lines = match job.padded {
            Some((hp, wp)) => vec![
                format!("parallel for (image, block) in 0..{}: copy the plane into a zero-padded {hp}×{wp} buffer, then", batch * blocks),
                format!("  for every row, {ow} pixels in groups of {GROUP}: acc[{GROUP} px][{l} ch] += x[tap] · w[tap] over {kh}×{kw} taps ({:?})", self.isa),
            ],
            None => vec![
                format!("parallel for (image, block, output row) in 0..{}", batch * blocks * oh),
                format!("  {ow} pixels per row in groups of {GROUP}: acc[{GROUP} px][{l} ch] += x[tap] · w[tap] over {kh}×{kw} taps ({:?})", self.isa),
                "  windows inside the input read it in place; groups at the left/right edge read a zero-padded strip".to_string(),
            ],
        };
        lines.push(format!(
            "  + bias{}, {}",
            if residual { ", + residual" } else { "" },
            super::shared::epilogue_text(self.act, self.post.as_deref())
        ));
        lines
    }

    /// The job for one input/output size: by plane (with the padded buffer's size) where
    /// padding whole planes copies less than the edge strips would, and there are enough
    /// planes to share out.
    fn job(&self, h: usize, w: usize, oh: usize, ow: usize, pads: [usize; 4], planes: usize) -> Job<'_> {
        let [kh, kw] = self.geo.kernel;
        let [sh, sw] = self.geo.strides;
        let [dh, dw] = self.geo.dilations;
        let (pt, pl) = (pads[0], pads[1]);
        let (lo, hi) = super::shared::bounds(self.act);
        let mut job = Job { d: self, h, w, oh, ow, pt, pl, lo, hi, ox_lo: 0, ox_hi: 0, padded: None };
        // Output columns whose whole window lies inside the row: [ox_lo, ox_hi).
        job.ox_lo = pl.div_ceil(sw).min(ow);
        let span = (kw - 1) * dw;
        job.ox_hi = if w + pl > span { ((w + pl - span - 1) / sw + 1).min(ow).max(job.ox_lo) } else { job.ox_lo };
        let groups = ow.div_ceil(GROUP);
        let edge_groups = (0..groups).filter(|&g| GROUP * g < job.ox_lo || GROUP * (g + 1) > job.ox_hi).count();
        let strip_copies = oh * edge_groups * kh * ((GROUP - 1) * sw + span + 1);
        // The padded plane: what the last row and the last (whole) group read.
        let (hp, wp) = ((oh - 1) * sh + (kh - 1) * dh + 1, (GROUP * groups - 1) * sw + span + 1);
        if planes >= 4 && hp * wp < strip_copies {
            job.padded = Some((hp, wp));
        }
        job
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
        if io.oh == 0 || io.ow == 0 {
            return Ok(());
        }
        let planes = io.batch * blocks;
        let job = self.job(io.h, io.w, io.oh, io.ow, io.pads, planes);
        let (x, y, res) =
            (In(io.x.as_ptr()), OutPtr(io.y.as_mut_ptr()), In(io.residual.map_or(std::ptr::null(), |r| r.as_ptr())));
        let tasks = if job.padded.is_some() { planes } else { planes * io.oh };
        par.for_each(tasks, &|t| {
            let (x, y, res) = (x, y, res);
            // SAFETY: sizes checked above; task t writes output plane t (by plane) or
            // output row t of all blocks' rows (by row).
            unsafe { job.task(t, x.0, y.0, res.0) }
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
    /// Output columns whose whole window lies inside the input row.
    ox_lo: usize,
    ox_hi: usize,
    /// By plane: the zero-padded buffer's height and width (else by row).
    padded: Option<(usize, usize)>,
}

impl Job<'_> {
    unsafe fn task(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        match self.d.isa.kind() {
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512 => self.task_avx512(t, x, y, res),
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => self.task_avx2(t, x, y, res),
            _ => self.task_generic::<super::simd::Portable8>(t, x, y, res),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn task_avx512(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        self.task_generic::<super::simd::F32x16>(t, x, y, res)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn task_avx2(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        self.task_generic::<super::simd::F32x8>(t, x, y, res)
    }

    #[inline(always)]
    unsafe fn task_generic<V: Vf32>(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        match self.padded {
            Some((hp, wp)) => self.plane::<V>(t, hp, wp, x, y, res),
            None => self.row::<V>(t, x, y, res),
        }
    }

    /// Output plane `t` = image·blocks + block, from a zero-padded copy of its input plane.
    #[inline(always)]
    unsafe fn plane<V: Vf32>(&self, t: usize, hp: usize, wp: usize, x: *const f32, y: *mut f32, res: *const f32) {
        let l = V::LANES;
        let [kh, kw] = self.d.geo.kernel;
        let [sh, sw] = self.d.geo.strides;
        let [dh, dw] = self.d.geo.dilations;
        let blk = t % self.d.channels.div_ceil(l);
        let xp = x.add(t * self.h * self.w * l);
        let buf = scratch_ptr(hp * wp * l);
        for py in 0..hp {
            let dst = buf.add(py * wp * l);
            let iy = py as isize - self.pt as isize;
            let src = (iy >= 0 && (iy as usize) < self.h).then(|| xp.add(iy as usize * self.w * l));
            for px in 0..wp {
                let ix = px as isize - self.pl as isize;
                let v = match src {
                    Some(s) if ix >= 0 && (ix as usize) < self.w => V::load(s.add(ix as usize * l)),
                    _ => V::zero(),
                };
                v.store(dst.add(px * l));
            }
        }
        let wts = self.d.weights.as_ptr().add(blk * kh * kw * l);
        let bias = V::load(self.d.bias.as_ptr().add(blk * l));
        for oy in 0..self.oh {
            let r = self.out_row::<V>(t * self.oh + oy, y, res);
            let mut ox = 0;
            while ox < self.ow {
                let n = (self.ow - ox).min(GROUP);
                let p = buf.add((oy * sh * wp + ox * sw) * l);
                let acc =
                    Taps { p, row_step: dh * wp * l, px_step: sw * l, tap_step: dw * l, rows: kh, kw }.run(wts, bias);
                r.finish(acc, ox, n);
                ox += n;
            }
            super::shared::finish(self.d.act, self.d.post.as_deref(), self.d.isa, r.yrow, self.ow * l);
        }
    }

    /// The output (and residual) row `t` of all blocks' rows, with the clamp bounds.
    #[inline(always)]
    unsafe fn out_row<V: Vf32>(&self, t: usize, y: *mut f32, res: *const f32) -> OutRow<V> {
        let l = V::LANES;
        OutRow {
            yrow: y.add(t * self.ow * l),
            rrow: if res.is_null() { res } else { res.add(t * self.ow * l) },
            lo: V::splat(self.lo),
            hi: V::splat(self.hi),
        }
    }

    /// Output row `t` = (image·blocks + block)·oh + oy, reading the input in place.
    #[inline(always)]
    unsafe fn row<V: Vf32>(&self, t: usize, x: *const f32, y: *mut f32, res: *const f32) {
        let l = V::LANES;
        let [kh, kw] = self.d.geo.kernel;
        let sh = self.d.geo.strides[0];
        let (dh, dw, sw) = (self.d.geo.dilations[0], self.d.geo.dilations[1], self.d.geo.strides[1]);
        let (plane, oy) = (t / self.oh, t % self.oh);
        let blk = plane % self.d.channels.div_ceil(l);
        let xp = x.add(plane * self.h * self.w * l);
        let r = self.out_row::<V>(t, y, res);
        let bias = V::load(self.d.bias.as_ptr().add(blk * l));
        // Kernel rows inside the input for this output row: [ky_lo, ky_hi).
        let iy0 = (oy * sh) as isize - self.pt as isize;
        let ky_lo = if iy0 >= 0 { 0 } else { ((-iy0) as usize).div_ceil(dh) };
        let ky_hi = if iy0 >= self.h as isize { 0 } else { ((self.h as isize - iy0) as usize).div_ceil(dh).min(kh) };
        let rows = ky_hi.saturating_sub(ky_lo);
        let wts = self.d.weights.as_ptr().add((blk * kh + ky_lo) * kw * l);
        // The input row of the first kernel row read (only dereferenced when rows > 0).
        let row0 = xp.wrapping_add(((iy0 + (ky_lo * dh) as isize).max(0) as usize) * self.w * l);
        let span = (GROUP - 1) * sw + (kw - 1) * dw + 1;
        let mut ox = 0;
        while ox < self.ow {
            let n = (self.ow - ox).min(GROUP);
            let acc = if n == GROUP && ox >= self.ox_lo && ox + GROUP <= self.ox_hi {
                // The group's windows lie inside the input: read it in place.
                let p = row0.wrapping_add((ox * sw - self.pl) * l);
                Taps { p, row_step: dh * self.w * l, px_step: sw * l, tap_step: dw * l, rows, kw }.run(wts, bias)
            } else {
                // Some windows cross the left or right edge: the input columns the
                // group's pixels read, zero-padded, into a strip that the same tap loop reads.
                let strip = scratch_ptr(rows * span * l);
                let ix0 = (ox * sw) as isize - self.pl as isize;
                for j in 0..rows {
                    let src = row0.add(j * dh * self.w * l);
                    for c in 0..span {
                        let ix = ix0 + c as isize;
                        let v = if ix >= 0 && (ix as usize) < self.w {
                            V::load(src.add(ix as usize * l))
                        } else {
                            V::zero()
                        };
                        v.store(strip.add((j * span + c) * l));
                    }
                }
                Taps { p: strip, row_step: span * l, px_step: sw * l, tap_step: dw * l, rows, kw }.run(wts, bias)
            };
            r.finish(acc, ox, n);
            ox += n;
        }
        // Activations other than a clamp run over the row just written.
        super::shared::finish(self.d.act, self.d.post.as_deref(), self.d.isa, r.yrow, self.ow * l);
    }
}

/// Output pixels computed together: eight accumulator chains hide the FMA latency on
/// cores with two FMA pipes, and fit the 16 vector registers of AVX2 with the weights.
const GROUP: usize = 8;

/// One output row (and its residual row, or null) with the clamp bounds.
struct OutRow<V> {
    yrow: *mut f32,
    rrow: *const f32,
    lo: V,
    hi: V,
}

impl<V: Vf32> OutRow<V> {
    /// Adds the residual, clamps and stores the first `n` pixels of a group from `ox`.
    #[inline(always)]
    unsafe fn finish(&self, acc: [V; GROUP], ox: usize, n: usize) {
        let l = V::LANES;
        for (i, v) in acc.into_iter().enumerate().take(n) {
            let at = (ox + i) * l;
            let v = if self.rrow.is_null() { v } else { v.add(V::load(self.rrow.add(at))) };
            v.clamp(self.lo, self.hi).store(self.yrow.add(at));
        }
    }
}

/// The taps of [`GROUP`] neighbouring output pixels: `p` points at the first tap of the first
/// pixel; pixels lie `px_step` floats apart, taps of a kernel row `tap_step`, kernel rows
/// `row_step`. Independent accumulator chains, every tap's weights loaded once.
struct Taps {
    p: *const f32,
    row_step: usize,
    px_step: usize,
    tap_step: usize,
    rows: usize,
    kw: usize,
}

impl Taps {
    /// The pixels' sums, starting from `bias`, with weights from `w` (`[rows][kw][L]`).
    #[inline(always)]
    unsafe fn run<V: Vf32>(&self, mut w: *const f32, bias: V) -> [V; GROUP] {
        let l = V::LANES;
        let mut acc = [bias; GROUP];
        let s = self.px_step;
        let mut row = self.p;
        for _ in 0..self.rows {
            let mut q = row;
            for _ in 0..self.kw {
                let wv = V::load(w);
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = V::load(q.add(i * s)).fma(wv, *a);
                }
                q = q.add(self.tap_step);
                w = w.add(l);
            }
            row = row.add(self.row_step);
        }
        acc
    }
}

thread_local! {
    /// This thread's copy buffer: an edge strip or a padded plane (grown, never shrunk).
    static COPY: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// This thread's copy buffer, at least `len` floats. The pointer leaves the closure because
/// code inside a closure does not get the caller's target features (the copies would not
/// inline); nothing else uses the buffer while one task's copy is read (one task at a time
/// per thread, and no task takes it twice).
fn scratch_ptr(len: usize) -> *mut f32 {
    COPY.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < len {
            b.resize(len, 0.0);
        }
        b.as_mut_ptr()
    })
}
