//! Winograd F(4×4, 3×3) for 3×3 stride-1 convolutions in the blocked layout (Lavin & Gray,
//! points 0, ±1, ±2). Each 4×4 block of outputs comes from a 6×6 block of input: the input
//! tile is transformed (`Bᵀ d B`), multiplied elementwise by the transformed filter
//! (`G g Gᵀ`, at load time), and transformed back (`Aᵀ m A`). The elementwise products,
//! summed over input channels, are 36 independent matrix products — (tiles × cin) ·
//! (cin × cout) — which run on the blocked 1×1 convolution kernel with the tiles as pixels:
//! 36 multiply-adds per 16 outputs instead of 144. All transforms are vector operations
//! across a block of channels.
//!
//! Rounding: the transforms scale values by up to 8² before the products and divide by up to
//! 24² in the filter, so results differ from a direct convolution by a few units in the
//! 5th–6th significant digit (tested: within 1e-5 of the output's scale on random data).

#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;

use super::conv::{Conv, ConvIo};
use super::shared::{In, OutPtr};
use super::simd::Vf32;
use super::{Geometry, Layout};
use crate::gemm::{Activation, Isa, Parallel};

/// Output tile side.
const M: usize = 4;
/// Input tile side: M + 3 − 1.
const T: usize = 6;

/// A 3×3 stride-1 convolution (group 1, blocked input and output) prepared for Winograd.
pub struct Winograd {
    isa: Isa,
    lanes: usize,
    cin: usize,
    cout: usize,
    /// The 36 products: 1×1 convolutions with the transformed filter at one tile position.
    products: Vec<Conv>,
    /// `[ceil(cout/L)·L]`.
    bias: Vec<f32>,
    act: Activation,
    /// The program applied after the activation, if any.
    post: super::shared::Post,
}

/// The geometry of each of the 36 products: a 1×1 convolution.
const ONE: Geometry = Geometry { kernel: [1, 1], strides: [1, 1], dilations: [1, 1] };

/// G (6×3): the filter transform.
const G: [[f64; 3]; T] = [
    [0.25, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

impl Winograd {
    /// Bytes of the transformed weights that lie in a memory-mapped file, which
    /// [`Winograd::release_pages`] can hand back.
    pub fn mapped_bytes(&self) -> usize {
        self.products.iter().map(Conv::mapped_bytes).sum()
    }

    /// Hands the resident pages of weights viewed in a mapped file back to the kernel.
    pub fn release_pages(&self) {
        self.products.iter().for_each(Conv::release_pages)
    }

    /// The convolution with `post` (a program of one input) applied to its output after
    /// the activation, on each row just written.
    pub fn with_post(mut self, post: super::shared::Post) -> Winograd {
        self.post = post;
        self
    }

    /// Transforms and packs `weights` (`[cout][cin][3][3]`); `kc` as for [`Conv::new`].
    pub fn new(
        isa: Isa,
        weights: &[f32],
        bias: Option<&[f32]>,
        cout: usize,
        cin: usize,
        act: Activation,
        kc: usize,
    ) -> Winograd {
        assert_eq!(weights.len(), cout * cin * 9, "weights do not match the shape");
        let lanes = super::lanes(isa);
        // U[ξν][co][ci] = (G g Gᵀ)[ξ][ν], in f64, one row ξ at a time (the six products of
        // that row packed from one buffer, so the whole transform is never held at once).
        let one = ONE;
        let mut products = Vec::with_capacity(T * T);
        let mut u = vec![0f32; T * cout * cin];
        for gx in &G {
            for (pair, g) in weights.chunks_exact(9).enumerate() {
                // Row ξ of G·g, then its products with the rows of G.
                let r: [f64; 3] = std::array::from_fn(|j| (0..3).map(|k| gx[k] * g[k * 3 + j] as f64).sum());
                for (nu, gn) in G.iter().enumerate() {
                    u[nu * cout * cin + pair] = (r[0] * gn[0] + r[1] * gn[1] + r[2] * gn[2]) as f32;
                }
            }
            for w in u.chunks_exact(cout * cin) {
                // Panels of two blocks, whatever the channel count: the layout that
                // `.aim` files store for these products.
                let id = Activation::Identity;
                products.push(Conv::new_in_panels(isa, w, None, cout, cin, one, Layout::Blocked, id, kc, 2));
            }
        }
        let mut b = vec![0f32; cout.div_ceil(lanes) * lanes];
        if let Some(bias) = bias {
            b[..cout].copy_from_slice(&bias[..cout]);
        }
        Winograd { isa, lanes, cin, cout, products, bias: b, act, post: None }
    }

    /// Floats of the transformed, packed weights of a `cout × cin` 3×3 convolution.
    pub fn packed_len(isa: Isa, cout: usize, cin: usize) -> usize {
        T * T * Conv::packed_len(isa, cout, cin, ONE, Layout::Blocked, 2)
    }

    /// The transformed, packed weights (the 36 products' in order), as
    /// [`Winograd::with_packed`] takes them back.
    pub fn packed_weights(&self) -> Vec<f32> {
        self.products.iter().flat_map(|p| p.packed_weights().iter().copied()).collect()
    }

    /// A Winograd convolution over weights transformed and packed before for the same `isa`
    /// and shape: `packed` (an f32 tensor of [`Winograd::packed_len`] floats) is read in
    /// place.
    #[allow(clippy::too_many_arguments)]
    pub fn with_packed(
        isa: Isa,
        packed: &aim_ir::Tensor,
        bias: Option<&[f32]>,
        cout: usize,
        cin: usize,
        act: Activation,
        kc: usize,
    ) -> Result<Winograd, String> {
        let per = Conv::packed_len(isa, cout, cin, ONE, Layout::Blocked, 2);
        if packed.dtype() != aim_ir::DType::F32 || packed.len() != T * T * per {
            return Err(format!(
                "Winograd weights of {cout}×{cin} hold {} f32 values, not {} {}",
                T * T * per,
                packed.len(),
                packed.dtype()
            ));
        }
        let products = (0..T * T)
            .map(|i| {
                let view = crate::floats::Floats::view(packed, i * per, per).expect("checked above");
                Conv::with_packed(isa, view, None, cout, cin, ONE, Layout::Blocked, Activation::Identity, kc, 2)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let lanes = super::lanes(isa);
        let mut b = vec![0f32; cout.div_ceil(lanes) * lanes];
        if let Some(bias) = bias {
            b[..cout].copy_from_slice(&bias[..cout]);
        }
        Ok(Winograd { isa, lanes, cin, cout, products, bias: b, act, post: None })
    }

    /// The loop nest [`Winograd::run`] runs, as lines of text (for `aim explore`).
    pub fn schedule(&self, batch: usize, oh: usize, ow: usize, residual: bool) -> Vec<String> {
        let l = self.lanes;
        let (th, tw) = (oh.div_ceil(M), ow.div_ceil(M));
        let p = batch * th * tw;
        let (cbi, cbo) = (self.cin.div_ceil(l), self.cout.div_ceil(l));
        vec![
            format!("Winograd F(4×4, 3×3): {p} tiles of 4×4 outputs ({th}×{tw} per image)"),
            format!("  parallel for (image, input block, tile row) in 0..{}: V[36][tile] = Bᵀ·d·B on 6×6 input tiles, {l} channels per vector", batch * cbi * th),
            format!("  parallel for (tile position in 0..36) × blocked 1×1 tasks: M[ξν][tile × {} ch] = V[ξν][tile × {} ch] · U[ξν] ({:?})", self.cout, self.cin, self.isa),
            format!("  parallel for (image, output block, tile row) in 0..{}: Y = Aᵀ·M·A, + bias{}, {}", batch * cbo * th, if residual { ", + residual" } else { "" }, super::shared::epilogue_text(self.act, self.post.as_deref())),
        ]
    }

    /// Runs the convolution: `io` as for [`Conv::run`], blocked input, stride 1.
    pub fn run(&self, io: ConvIo, par: &dyn Parallel) -> Result<(), String> {
        if io.residual_in_y {
            return Err("this kernel takes its residual as a separate tensor".into());
        }
        let l = self.lanes;
        let (cbi, cbo) = (self.cin.div_ceil(l), self.cout.div_ceil(l));
        let [pt, pl, pb, pr] = io.pads;
        if io.oh == 0 || io.ow == 0 || io.oh + 2 > io.h + pt + pb || io.ow + 2 > io.w + pl + pr {
            return Err(format!(
                "output {}×{} does not fit the padded input {}×{}",
                io.oh,
                io.ow,
                io.h + pt + pb,
                io.w + pl + pr
            ));
        }
        let (in_len, out_len) = (io.batch * cbi * io.h * io.w * l, io.batch * cbo * io.oh * io.ow * l);
        if io.x.len() != in_len || io.y.len() != out_len || io.residual.is_some_and(|r| r.len() != out_len) {
            return Err(format!("buffer sizes {} / {} do not match {in_len} / {out_len}", io.x.len(), io.y.len()));
        }
        let (th, tw) = (io.oh.div_ceil(M), io.ow.div_ceil(M));
        let p = io.batch * th * tw;
        let g = Grid { h: io.h, w: io.w, oh: io.oh, ow: io.ow, pt, pl, th, tw, p };
        // V: [36][cbi][p][L]; M: [36][cbo][p][L].
        // Scratch (every element written below), reused from call to call.
        let mut v = crate::scratch::take(T * T * cbi * p * l);
        let vp = OutPtr(v.as_mut_ptr());
        let x = In(io.x.as_ptr());
        par.for_each(io.batch * cbi * th, &|t| {
            let (vp, x) = (vp, x);
            // SAFETY: sizes checked above; task t writes the V entries of its tile row only.
            unsafe { self.dispatch(Step::Input, t, &g, cbi, x.0, vp.0) }
        });
        let mut m = crate::scratch::take(T * T * cbo * p * l);
        let jobs: Vec<super::conv::Job> = m
            .chunks_mut(cbo * p * l)
            .zip(v.chunks(cbi * p * l))
            .zip(&self.products)
            .map(|((mm, vv), c)| {
                c.plan(
                    ConvIo {
                        x: vv,
                        batch: 1,
                        h: 1,
                        w: p,
                        pads: [0; 4],
                        oh: 1,
                        ow: p,
                        residual: None,
                        residual_in_y: false,
                        y: mm,
                    },
                    par,
                )
            })
            .collect::<Result<_, _>>()?;
        let per = jobs[0].tasks();
        par.for_each(T * T * per, &|t| jobs[t / per].task(t % per));
        drop(jobs);
        let out = OutPtr(io.y.as_mut_ptr());
        let res = In(io.residual.map_or(std::ptr::null(), |r| r.as_ptr()));
        let mp = In(m.as_ptr());
        par.for_each(io.batch * cbo * th, &|t| {
            let (out, res, mp) = (out, res, mp);
            // SAFETY: sizes checked above; task t writes the outputs of its tile row only.
            unsafe { self.dispatch(Step::Output { res: res.0 }, t, &g, cbo, mp.0, out.0) }
        });
        Ok(())
    }

    unsafe fn dispatch(&self, step: Step, t: usize, g: &Grid, blocks: usize, src: *const f32, dst: *mut f32) {
        match self.isa.kind() {
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512 => self.step_avx512(step, t, g, blocks, src, dst),
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => self.step_avx2(step, t, g, blocks, src, dst),
            _ => self.step::<super::simd::Portable8>(step, t, g, blocks, src, dst),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn step_avx512(&self, step: Step, t: usize, g: &Grid, blocks: usize, src: *const f32, dst: *mut f32) {
        self.step::<super::simd::F32x16>(step, t, g, blocks, src, dst)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn step_avx2(&self, step: Step, t: usize, g: &Grid, blocks: usize, src: *const f32, dst: *mut f32) {
        self.step::<super::simd::F32x8>(step, t, g, blocks, src, dst)
    }

    /// Task `t` = (image, block, tile row) of the input or the output transform.
    #[inline(always)]
    unsafe fn step<V: Vf32>(&self, step: Step, t: usize, g: &Grid, blocks: usize, src: *const f32, dst: *mut f32) {
        let l = V::LANES;
        let (plane, ty) = (t / g.th, t % g.th);
        let (n, blk) = (plane / blocks, plane % blocks);
        // The index of this row's first tile among all tiles.
        let p0 = (n * g.th + ty) * g.tw;
        // Tile-position stride in V / M: one [blocks][p][L] slab per position.
        let slab = blocks * g.p * l;
        match step {
            Step::Input => {
                let xp = src.add(plane * g.h * g.w * l);
                let zero = V::zero();
                for tx in 0..g.tw {
                    let mut d = [[zero; T]; T];
                    for (r, row) in d.iter_mut().enumerate() {
                        let iy = (ty * M + r) as isize - g.pt as isize;
                        if iy < 0 || iy >= g.h as isize {
                            continue;
                        }
                        for (c, e) in row.iter_mut().enumerate() {
                            let ix = (tx * M + c) as isize - g.pl as isize;
                            if ix >= 0 && (ix as usize) < g.w {
                                *e = V::load(xp.add((iy as usize * g.w + ix as usize) * l));
                            }
                        }
                    }
                    // Bᵀ·d (columns), then ·B (rows).
                    let mut tmp = [[zero; T]; T];
                    for c in 0..T {
                        let col = bt([d[0][c], d[1][c], d[2][c], d[3][c], d[4][c], d[5][c]]);
                        for r in 0..T {
                            tmp[r][c] = col[r];
                        }
                    }
                    let at = dst.add((blk * g.p + p0 + tx) * l);
                    for (r, row) in tmp.iter().enumerate() {
                        for (c, v) in bt(*row).into_iter().enumerate() {
                            v.store(at.add((r * T + c) * slab));
                        }
                    }
                }
            }
            Step::Output { res } => {
                let bias = V::load(self.bias.as_ptr().add(blk * l));
                let (lo, hi) = super::shared::bounds(self.act);
                let (lo, hi) = (V::splat(lo), V::splat(hi));
                let yp = dst.add(plane * g.oh * g.ow * l);
                let rp = if res.is_null() { res } else { res.add(plane * g.oh * g.ow * l) };
                for tx in 0..g.tw {
                    let at = src.add((blk * g.p + p0 + tx) * l);
                    let mut mm = [[V::zero(); T]; T];
                    for (r, row) in mm.iter_mut().enumerate() {
                        for (c, e) in row.iter_mut().enumerate() {
                            *e = V::load(at.add((r * T + c) * slab));
                        }
                    }
                    // Aᵀ·m (columns), then ·A (rows).
                    let mut tmp = [[V::zero(); T]; M];
                    for c in 0..T {
                        let col = at4([mm[0][c], mm[1][c], mm[2][c], mm[3][c], mm[4][c], mm[5][c]]);
                        for r in 0..M {
                            tmp[r][c] = col[r];
                        }
                    }
                    for (r, row) in tmp.iter().enumerate() {
                        let oy = ty * M + r;
                        if oy >= g.oh {
                            break;
                        }
                        for (c, v) in at4(*row).into_iter().enumerate() {
                            let ox = tx * M + c;
                            if ox >= g.ow {
                                break;
                            }
                            let off = (oy * g.ow + ox) * l;
                            let mut v = v.add(bias);
                            if !rp.is_null() {
                                v = v.add(V::load(rp.add(off)));
                            }
                            v.clamp(lo, hi).store(yp.add(off));
                        }
                    }
                }
                // Activations other than a clamp run over the tile rows just written.
                for oy in ty * M..(ty * M + M).min(g.oh) {
                    super::shared::finish(self.act, self.post.as_deref(), self.isa, yp.add(oy * g.ow * l), g.ow * l);
                }
            }
        }
    }
}

/// Which transform a task runs.
#[derive(Clone, Copy)]
enum Step {
    Input,
    Output { res: *const f32 },
}

/// Sizes shared by the transform tasks.
struct Grid {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    pt: usize,
    pl: usize,
    th: usize,
    tw: usize,
    /// Tiles in all: batch · th · tw.
    p: usize,
}

/// `Bᵀ · d` for one column of six vectors.
#[inline(always)]
unsafe fn bt<V: Vf32>(d: [V; T]) -> [V; T] {
    let (c4, c5, c2) = (V::splat(4.0), V::splat(5.0), V::splat(2.0));
    let d4_d2 = d[4].sub(d[2]);
    let d3_d1 = d[3].sub(d[1]);
    [
        // 4·d0 − 5·d2 + d4
        c4.fma(d[0], d[4]).sub(c5.mul(d[2])),
        // −4·(d1 + d2) + d3 + d4
        d[3].add(d[4]).sub(c4.mul(d[1].add(d[2]))),
        // 4·(d1 − d2) − d3 + d4
        c4.fma(d[1].sub(d[2]), d[4].sub(d[3])),
        // 2·(d3 − d1) + d4 − d2
        c2.fma(d3_d1, d4_d2),
        // −2·(d3 − d1) + d4 − d2
        d4_d2.sub(c2.mul(d3_d1)),
        // 4·d1 − 5·d3 + d5
        c4.fma(d[1], d[5]).sub(c5.mul(d[3])),
    ]
}

/// `Aᵀ · m` for one column of six vectors.
#[inline(always)]
unsafe fn at4<V: Vf32>(m: [V; T]) -> [V; M] {
    let (c2, c4, c8) = (V::splat(2.0), V::splat(4.0), V::splat(8.0));
    let (s12, d12) = (m[1].add(m[2]), m[1].sub(m[2]));
    let (s34, d34) = (m[3].add(m[4]), m[3].sub(m[4]));
    [m[0].add(s12).add(s34), c2.fma(d34, d12), c4.fma(s34, s12), c8.fma(d34, d12).add(m[5])]
}
