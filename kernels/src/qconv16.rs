//! Exact 16-bit direct convolution for x86-64 CPUs without VNNI: ONNX `ConvInteger` on
//! AVX2 at the integer multiply's full rate.
//!
//! Why not [`crate::qconv`] there: its im2col feeds the u8 × s8 GEMM, which AVX2 runs
//! through `vpmaddubsw`; that saturates at 16 bits, and weights that leave s8 once their
//! zero point is taken away (u8 weights, as older `quantize_dynamic` writes them) need two
//! s8 parts each — twice the products. Here the input less its zero point and the weights
//! less theirs are both i16 (they span −255..=255), and `vpmaddwd` multiplies pairs of
//! them and adds each pair into i32 exactly: sixteen products per instruction, which on
//! the CPUs measured issue faster than f32 FMAs' eight (AMD Zen 3: 1.6 `vpmaddwd` per
//! cycle beside the additions, 82 against 51 G products/s).
//!
//! Layout: per image, the input is copied once into blocks of (up to) eight channel pairs,
//! `[pairs/8][Hp][Wp][8][2]` of i16 (the padding is 0, which is the zero point), so that
//! one 32-bit broadcast carries a pair of channels of one pixel and a tile's pixels share
//! cache lines across eight steps of k (a plane per pair touched 24 bytes of a line per
//! step, and the tiles ran at two thirds of the rate). The weights are packed at load in panels of two or three
//! blocks of eight output channels, `[panel][k = (ky, kx, pair)][outputs][2]`. A tile keeps
//! `R` output pixels × the panel's blocks in registers (6 × 2 or 4 × 3 accumulators, as the
//! f32 direct convolution of [`crate::nchwc`]); a row segment's sums go through a
//! transpose to the NCHW output, where the epilogue (scale, bias, activation, the program
//! after the layer) runs on each channel's row, as [`crate::qconv`]'s does.
// The kernel is AVX2's: off x86-64 the module keeps its types and refuses to run
// (`available` is false), so what only the AVX2 tiles read is unused there.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_mut))]

use crate::gemm::{Isa, IsaKind, Parallel};
use crate::qconv::{QConvInput, QConvShape, QSource};

/// Output channels per block (one AVX2 vector of i32 sums).
const BLOCK: usize = 8;

/// Output pixels of one row segment (one task): whole tiles of 6 and of 4 pixels.
const SEGMENT: usize = 48;

/// Bytes of weights a k block spans, so that they stay in L1 while the segment's tiles pass
/// over them.
const WEIGHTS_IN_L1: usize = 16 * 1024;

/// A convolution's weights packed for [`conv16`]: whole numbers less their zero point.
#[derive(Clone, Debug)]
pub struct PackedConv16 {
    shape: QConvShape,
    /// Input channel pairs (the input's channels rounded up to even, halved).
    pairs: usize,
    /// Output blocks per panel: 2, or 3 where the layer has an odd number (at least three)
    /// of blocks, so that no block runs alone at half the rate.
    g: usize,
    /// Steps of one sum: kernel taps × pairs.
    k: usize,
    /// `[panel][k][g · BLOCK outputs][2]`, zero where a channel is padding.
    w: Vec<i16>,
}

impl PackedConv16 {
    /// Packs `w`, `[M][C][kh][kw]` whole numbers (the weights less their zero point), for a
    /// convolution of one group.
    pub fn new(shape: QConvShape, w: &[i16]) -> Result<PackedConv16, String> {
        if shape.group != 1 {
            return Err(format!("the 16-bit convolution has one group, not {}", shape.group));
        }
        let [kh, kw] = shape.kernel;
        let taps = kh * kw;
        if w.len() != shape.m * shape.c * taps {
            return Err(format!("{} weights for {} filters of {}×{kh}×{kw}", w.len(), shape.m, shape.c));
        }
        if shape.stride.contains(&0) || shape.dilation.contains(&0) || taps == 0 {
            return Err(format!(
                "kernel {:?}, strides {:?}, dilations {:?}",
                shape.kernel, shape.stride, shape.dilation
            ));
        }
        let blocks = shape.m.div_ceil(BLOCK);
        let g = if blocks >= 3 && blocks % 2 == 1 { 3 } else { 2 };
        let pairs = shape.c.div_ceil(2);
        let k = taps * pairs;
        let gl = g * BLOCK;
        let mut packed = vec![0i16; blocks.div_ceil(g) * k * gl * 2];
        for (o, filter) in w.chunks_exact(shape.c * taps).enumerate() {
            let (panel, col) = (o / gl, o % gl);
            for (i, &v) in filter.iter().enumerate() {
                let (ci, t) = (i / taps, i % taps);
                let step = t * pairs + ci / 2;
                packed[((panel * k + step) * gl + col) * 2 + ci % 2] = v;
            }
        }
        Ok(PackedConv16 { shape, pairs, g, k, w: packed })
    }

    /// The geometry.
    pub fn shape(&self) -> &QConvShape {
        &self.shape
    }

    /// The loop nest [`conv16`] runs, as lines of text (for `aim explore`).
    pub fn schedule(&self, n: usize, oh: usize, ow: usize) -> Vec<String> {
        let s = &self.shape;
        let panels = s.m.div_ceil(self.g * BLOCK);
        vec![
            format!(
                "for image in 0..{n}: input − zero point as i16 channel pairs in blocks [{}][h+pads][w+pads][{} pairs][2] (parallel over rows)",
                self.pairs.div_ceil(self.pairs.min(8)),
                self.pairs.min(8)
            ),
            format!(
                "  parallel for (panel of {} output blocks of {BLOCK} in 0..{panels}, row in 0..{oh}, segment of ≤{SEGMENT} px in 0..{}): for k-block of ≤{} of k = {}·{}·{} = {}",
                self.g,
                ow.div_ceil(SEGMENT),
                self.kc(),
                s.kernel[0],
                s.kernel[1],
                self.pairs,
                self.k
            ),
            format!(
                "    for tile in segment (≤{} px): acc[px][{} blocks] += vpmaddwd(broadcast x pair, w pairs), exact i32 sums (AVX2)",
                tile_pixels(self.g),
                self.g
            ),
            "    segment: sums transposed to NCHW rows".to_string(),
        ]
    }

    /// Steps of one k block (see [`WEIGHTS_IN_L1`]).
    fn kc(&self) -> usize {
        (WEIGHTS_IN_L1 / (self.g * BLOCK * 4)).max(1)
    }
}

/// Output pixels in a tile of `nb` blocks: 6 × 2 or 4 × 3 accumulators (12 of AVX2's 16
/// registers, beside the weights and the broadcast).
fn tile_pixels(nb: usize) -> usize {
    if nb == 3 {
        4
    } else {
        6
    }
}

/// Whether [`conv16`] runs on `isa` here (its kernel is AVX2's).
pub fn available(isa: Isa) -> bool {
    matches!(isa.kind(), IsaKind::Avx2 | IsaKind::Avx512)
}

/// `y = act(conv(x − zero, w) · scale + bias)`, then the requantization and the program
/// after the layer, NCHW, over `par`'s threads. `a.x` must be bytes
/// ([`QSource::Bytes`]). Errors name what does not fit.
pub fn conv16(isa: Isa, p: &PackedConv16, a: &QConvInput, y: &mut [f32], par: &dyn Parallel) -> Result<(), String> {
    if !available(isa) {
        return Err(format!("the 16-bit convolution needs AVX2, not {isa:?}"));
    }
    let QSource::Bytes(x) = a.x else { return Err("the 16-bit convolution reads bytes".into()) };
    let s = p.shape;
    let (oh, ow) =
        s.output(a.h, a.w).ok_or_else(|| format!("the {:?} kernel does not fit {}×{}", s.kernel, a.h, a.w))?;
    let (plane_in, npx) = (a.h * a.w, oh * ow);
    if x.len() != a.n * s.c * plane_in || y.len() != a.n * s.m * npx {
        return Err(format!(
            "buffer sizes {} / {} do not match {} / {}",
            x.len(),
            y.len(),
            a.n * s.c * plane_in,
            a.n * s.m * npx
        ));
    }
    if a.out_scale.len() != 1 && a.out_scale.len() != s.m {
        return Err(format!("{} scales for {} output channels", a.out_scale.len(), s.m));
    }
    if a.bias.is_some_and(|b| b.len() != s.m) {
        return Err(format!("the bias does not hold {} values", s.m));
    }
    if a.offset.is_some_and(|o| o.len() != 1 && o.len() != s.m) {
        return Err(format!("{} offsets for {} output channels", a.offset.map_or(0, |o| o.len()), s.m));
    }
    let [pt, pl, pb, pr] = s.pads;
    let (hp, wp) = (a.h + pt + pb, a.w + pl + pr);
    // Pairs per pixel of a block of the input copy, and i16 per pixel.
    let per = p.pairs.min(8);
    let px = 2 * per;
    let plane = hp * wp * px;
    let [kh, kw] = s.kernel;
    let koff: Vec<usize> = (0..kh * kw)
        .flat_map(|t| (0..p.pairs).map(move |c| (t, c)))
        .map(|(t, c)| (c / per) * plane + ((t / kw) * s.dilation[0] * wp + (t % kw) * s.dilation[1]) * px + c % per * 2)
        .collect();
    let copy = p.pairs.div_ceil(per) * plane;
    let panels = s.m.div_ceil(p.g * BLOCK);
    let mut segs = ow.div_ceil(SEGMENT);
    let want = 4 * par.threads();
    if panels * oh * segs < want {
        segs = want.div_ceil(panels * oh).min(ow.div_ceil(tile_pixels(p.g))).max(segs);
    }
    let mut xp = crate::scratch::take_bytes(copy * 2);
    for img in 0..a.n {
        // SAFETY: the scratch buffer holds `copy` i16 (its storage is f32s, so aligned for
        // them).
        let xs = unsafe { std::slice::from_raw_parts_mut(xp.as_mut_ptr() as *mut i16, copy) };
        let image = &x[img * s.c * plane_in..(img + 1) * s.c * plane_in];
        blocked_pairs(image, s.c, a.h, a.w, s.pads, a.zero, per, xs, par);
        let job = Job {
            isa,
            p,
            a,
            koff: &koff,
            x: xs.as_ptr(),
            xrow: s.stride[0] * wp * px,
            xps: s.stride[1] * px,
            y: crate::util::SharedMut(y[img * s.m * npx..(img + 1) * s.m * npx].as_mut_ptr()),
            oh,
            ow,
            panels,
            segs,
        };
        par.for_each(panels * oh * segs, &|t| {
            // SAFETY: `available` checked AVX2; task t writes its own segment of its own
            // row of its panel's channels, and reads the input copy, the weights and
            // `koff`, whose offsets lie in the copy (the output fits the padded input).
            unsafe { job.task_avx2(t) }
        });
    }
    Ok(())
}

/// The image's channels less the zero point as i16 pairs in blocks of `pb` pairs per
/// pixel, `[pairs / pb][Hp][Wp][pb][2]`: zero in the padding and in the channels past the
/// last (an odd last pair's second, a last block's missing pairs).
#[allow(clippy::too_many_arguments)]
fn blocked_pairs(
    x: &[u8],
    c: usize,
    h: usize,
    w: usize,
    pads: [usize; 4],
    zero: u8,
    pb: usize,
    dst: &mut [i16],
    par: &dyn Parallel,
) {
    let [pt, pl, pb_, pr] = pads;
    let (hp, wp) = (h + pt + pb_, w + pl + pr);
    let px = pb * 2;
    let plane = hp * wp * px;
    let blocks = c.div_ceil(2).div_ceil(pb);
    let out = crate::util::SharedMut(dst.as_mut_ptr());
    let z = zero as i16;
    par.for_each(blocks * h, &|t| {
        let out = out;
        let (b, iy) = (t / h, t % h);
        // SAFETY: task t writes row iy of block b (and, for the first and last rows, the
        // padding rows above and below them) only.
        let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(b * plane), plane) };
        if iy == 0 {
            d[..pt * wp * px].fill(0);
        }
        if iy + 1 == h {
            d[(pt + h) * wp * px..].fill(0);
        }
        let row = &mut d[(iy + pt) * wp * px..(iy + pt + 1) * wp * px];
        row[..pl * px].fill(0);
        row[(pl + w) * px..].fill(0);
        let inner = &mut row[pl * px..(pl + w) * px];
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if px == 16 && w >= 16 && crate::gemm::IsaKind::Avx2.available() {
            let src: [Option<&[u8]>; 16] =
                std::array::from_fn(|j| (b * 16 + j < c).then(|| &x[((b * 16 + j) * h + iy) * w..][..w]));
            // SAFETY: AVX2 is present (checked); the rows hold `w` bytes and `inner` 16 per pixel.
            done = unsafe { transpose16(&src, z, inner) };
        }
        // The pixels left (all of them without AVX2 or with fewer than 8 pairs per block).
        let inner = &mut inner[done * px..];
        for j in (0..px).filter(|_| done < w) {
            let ch = b * px + j;
            match ch < c {
                true => {
                    let src = &x[(ch * h + iy) * w + done..(ch * h + iy + 1) * w];
                    for (o, &v) in inner[j..].iter_mut().step_by(px).zip(src) {
                        *o = v as i16 - z;
                    }
                }
                false => inner[j..].iter_mut().step_by(px).for_each(|o| *o = 0),
            }
        }
    });
}

/// Pixels of 16 channel rows (`None`: past the last channel, written as 0) less `z`, as
/// i16 pixel-major into `dst` (16 per pixel), 16 pixels at a time through a byte
/// transpose; returns the pixels done (the rows' length rounded down to 16).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose16(src: &[Option<&[u8]>; 16], z: i16, dst: &mut [i16]) -> usize {
    use std::arch::x86_64::*;
    let n = src.iter().flatten().map(|r| r.len()).min().unwrap_or(0) / 16 * 16;
    assert!(dst.len() >= n * 16, "the destination holds 16 values per pixel");
    let zv = _mm256_set1_epi16(z);
    // Lanes of channels that exist: the others are written as 0.
    let mask: [i16; 16] = std::array::from_fn(|j| -(src[j].is_some() as i16));
    let live = _mm256_loadu_si256(mask.as_ptr() as *const __m256i);
    let mut ix = 0;
    while ix < n {
        let r: [__m128i; 16] = std::array::from_fn(|j| match src[j] {
            Some(row) => _mm_loadu_si128(row.as_ptr().add(ix) as *const __m128i),
            None => _mm_setzero_si128(),
        });
        // Channels 2k, 2k+1 interleaved: pixels 0..8 and 8..16.
        let s1: [[__m128i; 2]; 8] = std::array::from_fn(|k| {
            [_mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]), _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1])]
        });
        // Channels 4k..4k+4, pixels 4q..4q+4.
        let s2: [[__m128i; 4]; 4] = std::array::from_fn(|k| {
            std::array::from_fn(|q| {
                let (a, b) = (s1[2 * k][q / 2], s1[2 * k + 1][q / 2]);
                if q % 2 == 0 {
                    _mm_unpacklo_epi16(a, b)
                } else {
                    _mm_unpackhi_epi16(a, b)
                }
            })
        });
        // Channels 8k..8k+8, pixels 2o, 2o+1.
        let s3: [[__m128i; 8]; 2] = std::array::from_fn(|k| {
            std::array::from_fn(|o| {
                let (a, b) = (s2[2 * k][o / 2], s2[2 * k + 1][o / 2]);
                if o % 2 == 0 {
                    _mm_unpacklo_epi32(a, b)
                } else {
                    _mm_unpackhi_epi32(a, b)
                }
            })
        });
        for p in 0..16 {
            let (a, b) = (s3[0][p / 2], s3[1][p / 2]);
            let v = if p % 2 == 0 { _mm_unpacklo_epi64(a, b) } else { _mm_unpackhi_epi64(a, b) };
            let wide = _mm256_and_si256(_mm256_sub_epi16(_mm256_cvtepu8_epi16(v), zv), live);
            _mm256_storeu_si256(dst.as_mut_ptr().add((ix + p) * 16) as *mut __m256i, wide);
        }
        ix += 16;
    }
    n
}

/// One image's tasks.
struct Job<'a> {
    isa: Isa,
    p: &'a PackedConv16,
    a: &'a QConvInput<'a>,
    koff: &'a [usize],
    /// The input copy (i16 pairs).
    x: *const i16,
    /// i16 between vertically adjacent output rows, and horizontally adjacent pixels.
    xrow: usize,
    xps: usize,
    /// The image's output, `[M][oh][ow]`.
    y: crate::util::SharedMut<f32>,
    oh: usize,
    ow: usize,
    panels: usize,
    segs: usize,
}

// SAFETY: the pointers are read (x) or written in disjoint parts (y) by the tasks.
unsafe impl Sync for Job<'_> {}

impl Job<'_> {
    /// Task `t`: one segment of one output row of one panel.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn task_avx2(&self, t: usize) {
        use std::arch::x86_64::*;
        let p = self.p;
        let (panel, unit) = (t % self.panels, t / self.panels);
        let (oy, seg) = (unit / self.segs, unit % self.segs);
        assert!(oy < self.oh, "task {t} past the last row");
        let cols = seg * self.ow / self.segs..(seg + 1) * self.ow / self.segs;
        let len = cols.len();
        let g = p.g;
        let gl = g * BLOCK;
        let nb = (p.shape.m.div_ceil(BLOCK) - panel * g).min(g);
        // Sums of the segment, pixel-major, `[SEGMENT][24]` (three blocks at most): every
        // row below `len` is written by the first k block's tiles, and the rows from `len`
        // to the next multiple of 8, which the transposes read, are zeroed here (a zeroed
        // array cost 3% of a model's time in memset).
        let mut sums = std::mem::MaybeUninit::<[[i32; 3 * BLOCK]; SEGMENT]>::uninit();
        let sums = sums.as_mut_ptr() as *mut [i32; 3 * BLOCK];
        for r in len..len.div_ceil(8) * 8 {
            sums.add(r).write([0; 3 * BLOCK]);
        }
        let x = self.x.add(oy * self.xrow + cols.start * self.xps);
        let w = p.w.as_ptr().add(panel * p.k * gl * 2);
        let kc = p.kc();
        let rmax = tile_pixels(nb);
        let tiles = len.div_ceil(rmax);
        let mut k0 = 0;
        while k0 < p.k {
            let k1 = (k0 + kc).min(p.k);
            let t = Tile { k0, k1, first: k0 == 0, koff: self.koff.as_ptr(), gl, w, xps: self.xps };
            let mut at = 0;
            for i in 0..tiles {
                let r = (i + 1) * len / tiles - at;
                let xs = x.add(at * self.xps);
                let out = sums.add(at) as *mut i32;
                macro_rules! go {
                    ($nb:literal: $($r:literal)*) => {
                        match r {
                            $($r => t.run::<$r, $nb>(xs, out),)*
                            _ => unreachable!("tiles of 1..={} pixels", tile_pixels($nb)),
                        }
                    };
                }
                match nb {
                    3 => go!(3: 1 2 3 4),
                    2 => go!(2: 1 2 3 4 5 6),
                    _ => go!(1: 1 2 3 4 5 6),
                }
                at += r;
            }
            k0 = k1;
        }
        // Transposed into channel rows, `rows[ch][px]`: the first `len` of each of the
        // panel's channels written, and only those read.
        let mut rows = std::mem::MaybeUninit::<[[i32; SEGMENT]; 3 * BLOCK]>::uninit();
        let rows = rows.as_mut_ptr() as *mut [i32; SEGMENT];
        for b in 0..nb {
            for p8 in 0..len.div_ceil(8) {
                let src = (sums.add(p8 * 8) as *const i32).add(b * BLOCK);
                let dst = (rows.add(b * BLOCK) as *mut i32).add(p8 * 8);
                let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * 3 * BLOCK) as *const f32));
                for (j, v) in transpose8(r).into_iter().enumerate() {
                    _mm256_storeu_ps(dst.add(j * SEGMENT) as *mut f32, v);
                }
            }
        }
        let a = self.a;
        let npx = self.oh * self.ow;
        for ch in 0..nb * BLOCK {
            let o = panel * gl + ch;
            if o >= p.shape.m {
                break;
            }
            let row = std::slice::from_raw_parts(rows.add(ch) as *const i32, len);
            let scale = a.out_scale[if a.out_scale.len() == 1 { 0 } else { o }];
            let bias = a.bias.map_or(0.0, |b| b[o]);
            let off = a.offset.map_or(0.0, |v| v[if v.len() == 1 { 0 } else { o }]);
            let dst = std::slice::from_raw_parts_mut(self.y.0.add(o * npx + oy * self.ow + cols.start), len);
            let f = crate::qconv::Finish { corr: 0, offset: off, scale, bias, act: a.act, requant: a.requant };
            crate::qconv::epilogue(self.isa, row, f, dst);
            if let Some(post) = a.post {
                post.apply(dst.as_mut_ptr(), len);
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn task_avx2(&self, _t: usize) {
        unreachable!("`available` is false off x86-64")
    }
}

/// One tile call's operands.
struct Tile {
    k0: usize,
    k1: usize,
    /// The first k block: start from zero, not from the sums.
    first: bool,
    koff: *const usize,
    /// Outputs per k step of the packed weights (the panel's blocks × 8).
    gl: usize,
    w: *const i16,
    xps: usize,
}

impl Tile {
    /// `R` pixels × `NB` blocks: `sums[r][j·8..] (+)= Σ_k x[koff[k] + r·xps] pair ·
    /// w[k][j] pairs`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn run<const R: usize, const NB: usize>(&self, x: *const i16, sums: *mut i32) {
        use std::arch::x86_64::*;
        const ROW: usize = 3 * BLOCK;
        let mut acc = [[_mm256_setzero_si256(); NB]; R];
        if !self.first {
            for (r, a) in acc.iter_mut().enumerate() {
                for (j, v) in a.iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(sums.add(r * ROW + j * BLOCK) as *const __m256i);
                }
            }
        }
        for kk in self.k0..self.k1 {
            let xk = x.add(*self.koff.add(kk));
            let wk = self.w.add(kk * self.gl * 2);
            let wv: [__m256i; NB] =
                std::array::from_fn(|j| _mm256_loadu_si256(wk.add(j * 2 * BLOCK) as *const __m256i));
            for (r, a) in acc.iter_mut().enumerate() {
                let b = _mm256_set1_epi32((xk.add(r * self.xps) as *const i32).read_unaligned());
                for j in 0..NB {
                    a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(b, wv[j]));
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (j, v) in a.iter().enumerate() {
                _mm256_storeu_si256(sums.add(r * ROW + j * BLOCK) as *mut __m256i, *v);
            }
        }
    }
}

/// `out[j][i] = r[i][j]` for an 8 × 8 tile of 32-bit lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // t0 = lo(r0,r1), t1 = hi(r0,r1), t2 = lo(r2,r3), ...
    let u = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    [
        _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
        _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
    ]
}
