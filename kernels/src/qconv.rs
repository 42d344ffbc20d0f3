//! Quantized 2-D convolution: the f32 input quantized with the model's per-tensor scale and
//! zero point (QuantizeLinear exactly), gathered into the integer GEMM's panel layout
//! (im2col of bytes: groups of four taps × 32 output pixels, the padding filled with the
//! zero point, the quantized 0), and multiplied by the s8 weights (rows, broadcast) with
//! [`crate::qgemm`]'s microkernels. The sums are exact; the epilogue subtracts the input
//! zero point's term (`zx · Σ w` per output channel), scales by `sx · sw[c]`, adds the bias
//! and applies the activation, writing NCHW f32.
//!
//! Weights must be symmetric (zero point 0), as ONNX Runtime's quantizer writes s8 weights.

use crate::gemm::{Activation, Isa, Parallel};
use crate::qgemm::{tiles, Rows, NR};

/// The geometry of a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QConvShape {
    /// Input channels.
    pub c: usize,
    /// Output channels.
    pub m: usize,
    /// Groups.
    pub group: usize,
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Strides.
    pub stride: [usize; 2],
    /// Dilations.
    pub dilation: [usize; 2],
    /// Padding: top, left, bottom, right.
    pub pads: [usize; 4],
}

impl QConvShape {
    /// Output height and width for an `h × w` input (`None` when the kernel does not fit).
    pub fn output(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let span = |k: usize, d: usize| (k - 1) * d + 1;
        let (ph, pw) = (h + self.pads[0] + self.pads[2], w + self.pads[1] + self.pads[3]);
        let (eh, ew) = (span(self.kernel[0], self.dilation[0]), span(self.kernel[1], self.dilation[1]));
        if ph < eh || pw < ew || self.stride[0] == 0 || self.stride[1] == 0 {
            return None;
        }
        Some(((ph - eh) / self.stride[0] + 1, (pw - ew) / self.stride[1] + 1))
    }

    /// Taps per output value within a group: channels per group × kernel area.
    fn depth(&self) -> usize {
        self.c / self.group * self.kernel[0] * self.kernel[1]
    }
}

/// Weights `[M, C/group, kh, kw]` (s8) packed as rows of the product, each padded to a
/// multiple of four taps, with their sums.
#[derive(Clone, Debug)]
pub struct PackedQConv {
    shape: QConvShape,
    stride: usize,
    rows: Vec<u8>,
    sums: Vec<i32>,
}

impl PackedQConv {
    /// Packs s8 weights (as bytes) for `shape`.
    pub fn new(shape: QConvShape, w: &[u8]) -> Result<PackedQConv, String> {
        if shape.group == 0 || !shape.c.is_multiple_of(shape.group) || !shape.m.is_multiple_of(shape.group) {
            return Err(format!("{} input and {} output channels in {} groups", shape.c, shape.m, shape.group));
        }
        let k = shape.depth();
        if w.len() != shape.m * k {
            return Err(format!("{} weights for {} filters of {k} taps", w.len(), shape.m));
        }
        let stride = k.div_ceil(4) * 4;
        let mut rows = vec![0u8; shape.m * stride];
        let mut sums = vec![0i32; shape.m];
        for o in 0..shape.m {
            rows[o * stride..o * stride + k].copy_from_slice(&w[o * k..(o + 1) * k]);
            sums[o] = w[o * k..(o + 1) * k].iter().map(|&v| v as i8 as i32).sum();
        }
        Ok(PackedQConv { shape, stride, rows, sums })
    }

    /// The geometry.
    pub fn shape(&self) -> &QConvShape {
        &self.shape
    }
}

/// A convolution's input, NCHW.
#[derive(Clone, Copy)]
pub enum QSource<'a> {
    /// f32 values, which the kernel quantizes with the input's scale and zero point.
    F32(&'a [f32]),
    /// Values already quantized to u8 (ONNX `ConvInteger`'s input, which a
    /// `DynamicQuantizeLinear` made): the input's scale is not read.
    Bytes(&'a [u8]),
    /// As `Bytes`, each image's channels read twice (the shape's `c` is twice theirs):
    /// weights whose values leave s8 split into two s8 parts, one per copy.
    BytesTwice(&'a [u8]),
}

impl QSource<'_> {
    /// Values as the kernel reads them (channels twice for `BytesTwice`).
    fn len(&self) -> usize {
        match self {
            QSource::F32(x) => x.len(),
            QSource::Bytes(x) => x.len(),
            QSource::BytesTwice(x) => 2 * x.len(),
        }
    }
}

/// One call's operands besides the weights.
pub struct QConvInput<'a> {
    /// The input, NCHW.
    pub x: QSource<'a>,
    /// Batch, height and width of the input.
    pub n: usize,
    pub h: usize,
    pub w: usize,
    /// The input's quantization: scale and zero point in u8 terms (an s8 zero point plus
    /// 128: the u8 values are the s8 ones plus 128, so their differences are the same).
    pub scale: f32,
    pub zero: u8,
    /// Added to the sums (as f32) before the scale, one or `M` values: the quantized bias
    /// older `quantize_dynamic` computes per run and adds to ConvInteger's integers.
    pub offset: Option<&'a [f32]>,
    /// The product's scale per output channel (input scale × weight scale), one or `M`.
    pub out_scale: &'a [f32],
    /// One bias per output channel.
    pub bias: Option<&'a [f32]>,
    /// The activation.
    pub act: Option<Activation>,
    /// A quantize-dequantize of the result, computed as the f32 pair does.
    pub requant: Option<Requant>,
    /// A one-input elementwise program applied to each tile row after the epilogue (the
    /// program that followed the layer in the graph).
    pub post: Option<&'a crate::ewprog::wide::Wide>,
}

/// A quantize-dequantize applied to the result: `(clip(round(y / scale) + zero, lo, hi) −
/// zero) · scale`, the additions skipped for a zero point of 0 (as the f32 form of the pair
/// does).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Requant {
    /// Scale.
    pub scale: f32,
    /// Zero point.
    pub zero: f32,
    /// The integer range.
    pub lo: f32,
    pub hi: f32,
}

/// `y = act(conv(quantize(x), w) · scale + bias)`, NCHW, over `par`'s threads.
///
/// Panics when a buffer does not fit the shapes given.
pub fn qconv(isa: Isa, p: &PackedQConv, a: &QConvInput, y: &mut [f32], par: &dyn Parallel) {
    let s = p.shape;
    let (oh, ow) = s.output(a.h, a.w).expect("the kernel fits the input");
    let (plane, npx) = (a.h * a.w, oh * ow);
    assert!(a.x.len() >= a.n * s.c * plane, "the input is too small");
    assert!(y.len() >= a.n * s.m * npx, "the output is too small");
    assert!(a.out_scale.len() == 1 || a.out_scale.len() == s.m, "one scale or one per output channel");
    assert!(a.bias.is_none_or(|b| b.len() == s.m), "one bias per output channel");
    assert!(a.offset.is_none_or(|o| o.len() == 1 || o.len() == s.m), "one offset or one per output channel");
    let (cg, mg) = (s.c / s.group, s.m / s.group);
    let k = s.depth();
    let groups4 = k.div_ceil(4);
    let panels = npx.div_ceil(NR);
    // Every byte of both is written before it is read (but the NR bytes past the last
    // plane, which panels of a whole plane read for pixels never stored).
    let mut xq = crate::scratch::take_bytes(s.c * plane + NR);
    let mut packed = crate::scratch::take_bytes(panels * groups4 * NR * 4);
    let zx = a.zero as i32;
    for img in 0..a.n {
        let image = img * s.c * plane..(img + 1) * s.c * plane;
        match a.x {
            QSource::F32(x) => {
                quantize_planes(isa, &x[image], plane, &mut xq[..s.c * plane], a.scale, a.zero as f32, par)
            }
            // Copied: the packing reads NR bytes past the last plane.
            QSource::Bytes(x) => xq[..s.c * plane].copy_from_slice(&x[image]),
            QSource::BytesTwice(x) => {
                let half = s.c / 2 * plane;
                let src = &x[img * half..(img + 1) * half];
                xq[..half].copy_from_slice(src);
                xq[half..2 * half].copy_from_slice(src);
            }
        }
        for gi in 0..s.group {
            let xg = &xq[gi * cg * plane..];
            pack(&s, xg, a.h, a.w, (oh, ow), a.zero, groups4, &mut packed, par);
            let rows = Rows {
                data: &p.rows[gi * mg * p.stride..(gi + 1) * mg * p.stride],
                stride: p.stride,
                m: mg,
                signed: true,
            };
            let base = (img * s.m + gi * mg) * npx;
            let out = &mut y[base..base + mg * npx];
            tiles(
                isa,
                &rows,
                &packed,
                &crate::qgemm::Avx2Packing::Wide,
                Some(&p.sums[gi * mg..(gi + 1) * mg]),
                groups4,
                npx,
                out,
                npx,
                par,
                |r0, _j0, sums, mut tile| {
                    for (r, sums) in sums.iter().enumerate() {
                        let o = gi * mg + r0 + r;
                        let corr = zx.wrapping_mul(p.sums[o]);
                        let scale = a.out_scale[if a.out_scale.len() == 1 { 0 } else { o }];
                        let bias = a.bias.map_or(0.0, |b| b[o]);
                        let off = a.offset.map_or(0.0, |v| v[if v.len() == 1 { 0 } else { o }]);
                        let f = Finish { corr, offset: off, scale, bias, act: a.act, requant: a.requant };
                        let dst = tile.row(r);
                        epilogue(isa, sums, f, dst);
                        if let Some(p) = a.post {
                            // SAFETY: `dst` is this tile row's, written by this task only.
                            unsafe { p.apply(dst.as_mut_ptr(), dst.len()) };
                        }
                    }
                },
            );
        }
    }
}

/// Quantizes whole channel planes, in parallel chunks.
fn quantize_planes(isa: Isa, x: &[f32], plane: usize, dst: &mut [u8], scale: f32, zero: f32, par: &dyn Parallel) {
    let planes = x.len() / plane.max(1);
    let chunk = (planes.div_ceil(par.threads() * 2).max(1) * plane).max(1);
    let tasks = x.len().div_ceil(chunk);
    let d = crate::util::SharedMut(dst.as_mut_ptr());
    par.for_each(tasks, &|t| {
        let d = d;
        let (lo, hi) = (t * chunk, ((t + 1) * chunk).min(x.len()));
        // SAFETY: tasks write disjoint ranges of `dst`, which is as long as `x`.
        let out = unsafe { std::slice::from_raw_parts_mut(d.0.add(lo), hi - lo) };
        crate::fast::quant::quantize(isa, &x[lo..hi], out, scale, zero);
    });
}

/// Gathers the taps of one group's quantized input into panels: for panel `p`, group of
/// four taps `g`, pixel `j` and tap `t`, byte `((p·groups4 + g)·NR + j)·4 + t`.
#[allow(clippy::too_many_arguments)]
fn pack(
    s: &QConvShape,
    xg: &[u8],
    h: usize,
    w: usize,
    (oh, ow): (usize, usize),
    zero: u8,
    groups4: usize,
    packed: &mut [u8],
    par: &dyn Parallel,
) {
    let (kh, kw) = (s.kernel[0], s.kernel[1]);
    let k = s.depth();
    let npx = oh * ow;
    let panels = npx.div_ceil(NR);
    let out = crate::util::SharedMut(packed.as_mut_ptr());
    // A 1×1 tap with unit stride and no padding reads a whole plane as it is.
    let whole = kh == 1 && kw == 1 && s.stride == [1, 1] && s.pads == [0; 4] && (oh, ow) == (h, w);
    let zeros = [0u8; NR];
    par.for_each(groups4, &|g| {
        let out = out;
        // Taps past the depth read zeros (their weights are zero too); pixels past the
        // last are never stored, whatever they hold.
        let mut rows = crate::scratch::take_bytes(if whole { 0 } else { 4 * panels * NR });
        let mut src: [&[u8]; 4] = [&zeros; 4];
        if whole {
            for (t, r) in src.iter_mut().enumerate() {
                let tap = g * 4 + t;
                if tap < k {
                    // The plane and, past its end, the next one's bytes (or the NR spare ones).
                    *r = &xg[tap * h * w..tap * h * w + panels * NR];
                }
            }
        } else {
            for (t, row) in rows.chunks_exact_mut(panels * NR).enumerate() {
                let tap = g * 4 + t;
                if tap >= k {
                    row.fill(0);
                    continue;
                }
                let (ci, ky, kx) = (tap / (kh * kw), tap / kw % kh, tap % kw);
                gather(s, &xg[ci * h * w..(ci + 1) * h * w], h, w, (oh, ow), ky, kx, zero, &mut row[..npx]);
            }
            for (t, r) in src.iter_mut().enumerate() {
                *r = &rows[t * panels * NR..(t + 1) * panels * NR];
            }
        }
        for p in 0..panels {
            // SAFETY: each task writes the 4·NR bytes of its own tap group in every panel.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add((p * groups4 + g) * NR * 4), NR * 4) };
            interleave4(&src, p * NR, dst);
        }
    });
}

/// `dst[j·4 + t] = rows[t][at + j]` for 32 pixels `j` and four taps `t` (a row of NR
/// bytes is read from its start: the zero row).
fn interleave4(rows: &[&[u8]; 4], at: usize, dst: &mut [u8]) {
    let at_of = |t: usize| if rows[t].len() == NR { 0 } else { at };
    for (t, r) in rows.iter().enumerate() {
        assert!(r.len() >= at_of(t) + NR && dst.len() >= NR * 4, "interleave out of bounds");
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of x86-64; the four source ranges and `dst` hold 32 and 128
        // bytes (checked above).
        unsafe {
            use std::arch::x86_64::*;
            for half in 0..2 {
                let src = |t: usize| _mm_loadu_si128(rows[t].as_ptr().add(at_of(t) + half * 16) as *const __m128i);
                let (r0, r1, r2, r3) = (src(0), src(1), src(2), src(3));
                let (a, b) = (_mm_unpacklo_epi8(r0, r1), _mm_unpackhi_epi8(r0, r1));
                let (c, d) = (_mm_unpacklo_epi8(r2, r3), _mm_unpackhi_epi8(r2, r3));
                let o = dst.as_mut_ptr().add(half * 64) as *mut __m128i;
                _mm_storeu_si128(o, _mm_unpacklo_epi16(a, c));
                _mm_storeu_si128(o.add(1), _mm_unpackhi_epi16(a, c));
                _mm_storeu_si128(o.add(2), _mm_unpacklo_epi16(b, d));
                _mm_storeu_si128(o.add(3), _mm_unpackhi_epi16(b, d));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for j in 0..NR {
        for t in 0..4 {
            dst[j * 4 + t] = rows[t][at_of(t) + j];
        }
    }
}

/// The input bytes tap `(ky, kx)` of one channel reads for every output pixel, the
/// padding as `zero`.
#[allow(clippy::too_many_arguments)]
fn gather(
    s: &QConvShape,
    x: &[u8],
    h: usize,
    w: usize,
    (oh, ow): (usize, usize),
    ky: usize,
    kx: usize,
    zero: u8,
    row: &mut [u8],
) {
    let (sh, sw) = (s.stride[0], s.stride[1]);
    let (dy, dx) = (ky * s.dilation[0], kx * s.dilation[1]);
    // Output columns whose input column is inside: ox·sw + dx − pl ∈ [0, w).
    let first = s.pads[1].saturating_sub(dx).div_ceil(sw).min(ow);
    let end = if w + s.pads[1] > dx { ((w + s.pads[1] - dx - 1) / sw + 1).min(ow) } else { 0 }.max(first);
    for oy in 0..oh {
        let out = &mut row[oy * ow..(oy + 1) * ow];
        let iy = (oy * sh + dy) as isize - s.pads[0] as isize;
        if iy < 0 || iy >= h as isize {
            out.fill(zero);
            continue;
        }
        let src = &x[iy as usize * w..(iy as usize + 1) * w];
        out[..first].fill(zero);
        out[end..].fill(zero);
        let ix0 = first * sw + dx - s.pads[1];
        if sw == 1 {
            out[first..end].copy_from_slice(&src[ix0..ix0 + (end - first)]);
        } else {
            for (k, o) in out[first..end].iter_mut().enumerate() {
                *o = src[ix0 + k * sw];
            }
        }
    }
}

/// What turns one output channel's sums into its f32 values (see [`epilogue`]).
#[derive(Clone, Copy)]
pub(crate) struct Finish {
    /// Subtracted from each sum: the input zero point's term.
    pub(crate) corr: i32,
    /// Added to the sum as f32 before the scale.
    pub(crate) offset: f32,
    pub(crate) scale: f32,
    pub(crate) bias: f32,
    pub(crate) act: Option<Activation>,
    pub(crate) requant: Option<Requant>,
}

/// One row of sums to f32: `act(((sum − corr) + offset) · scale + bias)`, then the
/// requantization (also the 16-bit convolution's, [`crate::qconv16`], whose outputs are
/// then the same).
pub(crate) fn epilogue(isa: Isa, sums: &[i32], f: Finish, dst: &mut [f32]) {
    #[inline(always)]
    fn body(isa: Isa, sums: &[i32], f: Finish, dst: &mut [f32]) {
        use crate::gemm::clamp;
        for (d, &v) in dst.iter_mut().zip(sums) {
            // Adding 0 changes no sum (an integer is never −0).
            *d = (v.wrapping_sub(f.corr) as f32 + f.offset) * f.scale + f.bias;
        }
        if let Some(a) = f.act {
            match a.clamp_bounds() {
                Some((lo, hi)) => dst.iter_mut().for_each(|x| *x = clamp(*x, lo, hi)),
                // The vector loops of the f32 kernels (ONNX Runtime's bits on FMA CPUs).
                None => a.apply_all(isa, dst),
            }
        }
        match f.requant {
            Some(q) if q.zero == 0.0 => {
                dst.iter_mut().for_each(|x| *x = clamp((*x / q.scale).round_ties_even(), q.lo, q.hi) * q.scale)
            }
            Some(q) => dst
                .iter_mut()
                .for_each(|x| *x = (clamp((*x / q.scale).round_ties_even() + q.zero, q.lo, q.hi) - q.zero) * q.scale),
            None => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(isa: Isa, sums: &[i32], f: Finish, dst: &mut [f32]) {
            body(isa, sums, f, dst)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(isa: Isa, sums: &[i32], f: Finish, dst: &mut [f32]) {
            body(isa, sums, f, dst)
        }
        // SAFETY: an `Isa` exists only for features this CPU has.
        match isa.kind() {
            crate::gemm::IsaKind::Avx512 => return unsafe { v4(isa, sums, f, dst) },
            crate::gemm::IsaKind::Avx2 => return unsafe { v3(isa, sums, f, dst) },
            _ => {}
        }
    }
    body(isa, sums, f, dst)
}
