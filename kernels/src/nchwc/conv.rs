//! Direct convolution whose output is in the blocked layout: each microkernel tile holds
//! `R` output pixels of one row × two or three channel blocks in vector registers (three
//! where the layer has an odd number of blocks, so that no block runs alone at half the
//! kernel's rate: 24 or 72 channels in blocks of 8) and sums over
//! `k = (ky, kx, ci)`, broadcasting one input value per pixel and loading two weight
//! vectors per step. The input is read where it lies — blocked, or plain NCHW for a first
//! layer with few channels — through a table of per-`k` offsets, so 1×1, k×k, strided and
//! dilated convolutions share one kernel. Padding is a zero-padded copy of the input.

#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;

use super::shared::OutPtr;
use super::simd::Vf32;
use super::{Geometry, Layout};
use crate::gemm::{Activation, Isa, Parallel};
use crate::scratch::{self, Scratch};

/// A convolution (one group) with its weights packed for the blocked kernel.
pub struct Conv {
    isa: Isa,
    lanes: usize,
    cin: usize,
    cout: usize,
    input: Layout,
    geo: Geometry,
    /// Input channels as the kernel sees them: `cin`, rounded up to a block when blocked.
    cin_eff: usize,
    /// Output blocks per panel of packed weights (2 or 3, see [`panel_blocks`]).
    g: usize,
    /// `[panel of g output blocks][k][g · lanes]`, zero where a channel is padding.
    weights: crate::floats::Floats,
    /// `[panel][g · lanes]`.
    bias: Vec<f32>,
    act: Activation,
    /// The program applied after the activation, if any.
    post: super::shared::Post,
    /// Depth of one k block: a block of weights (`kc × 2L` floats) stays in L1 while the
    /// tiles of a task run over it.
    kc: usize,
}

/// Output pixels one task computes (a segment of an output row), in tiles of the ISA.
const SEGMENT_TILES: usize = 8;

/// Bytes of packed weights a group of panels may hold to stay in L2 while the row segments
/// pass over them (half of the smallest L2 of the CPUs measured, 512 KiB).
const WEIGHTS_IN_L2: usize = 256 * 1024;

/// One call's tensors and sizes.
pub struct ConvIo<'a> {
    /// The input: `[n][cin][h][w]` (NCHW) or `[n][ceil(cin/L)][h][w][L]` (blocked).
    pub x: &'a [f32],
    /// Batch size.
    pub batch: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Zero padding: top, left, bottom, right.
    pub pads: [usize; 4],
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// A tensor of the output's blocked shape added before the activation.
    pub residual: Option<&'a [f32]>,
    /// The output already holds the residual (the result overwrites it in place): the sums
    /// start from it. Only the direct convolution ([`Conv`]) supports this.
    pub residual_in_y: bool,
    /// The output, `[n][ceil(cout/L)][oh][ow][L]`.
    pub y: &'a mut [f32],
}

/// Output blocks per panel of packed weights for `cout` output channels on `isa`: three
/// when there is an odd number of blocks (at least three) on x86-64, whose tiles of three
/// blocks keep as many accumulators as tiles of two (4 × 3 and 6 × 2 on AVX2), else two.
/// A pair with one real block would run at half the rate.
pub fn panel_blocks(isa: Isa, cout: usize) -> usize {
    let blocks = cout.div_ceil(super::lanes(isa));
    let wide = matches!(isa.kind(), crate::gemm::IsaKind::Avx2 | crate::gemm::IsaKind::Avx512);
    if wide && blocks >= 3 && blocks % 2 == 1 {
        3
    } else {
        2
    }
}

/// Output pixels in one tile of `nb` blocks. Three blocks: half the pixels (3 × 3
/// accumulators on AVX2's 16 registers, with the three weight vectors and a broadcast:
/// at 4 × 3 the compiler spills one accumulator, which costs a third of the speed).
fn tile_pixels(isa: Isa, nb: usize) -> usize {
    let r = super::tile_rows(isa);
    if nb == 3 {
        r / 2
    } else {
        r
    }
}

/// Input channels as the kernel sees them: `cin`, rounded up to a block of `lanes` when the
/// input is blocked.
fn cin_eff(input: Layout, cin: usize, lanes: usize) -> usize {
    match input {
        Layout::Nchw => cin,
        Layout::Blocked => cin.div_ceil(lanes) * lanes,
    }
}

impl Conv {
    /// Bytes of the packed weights that lie in a memory-mapped file, which
    /// [`Conv::release_pages`] can hand back.
    pub fn mapped_bytes(&self) -> usize {
        self.weights.mapped_bytes()
    }

    /// Hands the resident pages of weights viewed in a mapped file back to the kernel.
    pub fn release_pages(&self) {
        self.weights.release_pages()
    }

    /// Packs `weights` (`[cout][cin][kh][kw]`) and `bias` for `isa`'s channel block, in
    /// panels of [`panel_blocks`] output blocks; `kc` is the k block (see
    /// [`crate::gemm::Blocking`]: its `kc` is sized for the same tile).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        isa: Isa,
        weights: &[f32],
        bias: Option<&[f32]>,
        cout: usize,
        cin: usize,
        geo: Geometry,
        input: Layout,
        act: Activation,
        kc: usize,
    ) -> Conv {
        let g = panel_blocks(isa, cout);
        Conv::new_in_panels(isa, weights, bias, cout, cin, geo, input, act, kc, g)
    }

    /// [`Conv::new`] in panels of `g` (2 or 3) output blocks.
    #[allow(clippy::too_many_arguments)]
    pub fn new_in_panels(
        isa: Isa,
        weights: &[f32],
        bias: Option<&[f32]>,
        cout: usize,
        cin: usize,
        geo: Geometry,
        input: Layout,
        act: Activation,
        kc: usize,
        g: usize,
    ) -> Conv {
        let lanes = super::lanes(isa);
        let [kh, kw] = geo.kernel;
        assert_eq!(weights.len(), cout * cin * kh * kw, "weights do not match the shape");
        assert!(g == 2 || g == 3, "panels of two or three blocks");
        let cin_eff = cin_eff(input, cin, lanes);
        let k = kh * kw * cin_eff;
        let gl = g * lanes;
        let mut packed = vec![0f32; cout.div_ceil(gl) * k * gl];
        // Where each weight of one output channel goes, relative to that channel's column:
        // source (ci, ky, kx) → row (ky, kx, ci) of the panel's k × gL floats.
        let taps = kh * kw;
        let dst: Vec<usize> = (0..cin * taps).map(|i| ((i % taps) * cin_eff + i / taps) * gl).collect();
        for (co, src) in weights.chunks_exact(cin * taps).enumerate() {
            let (p, col) = (co / gl, co % gl);
            let panel = &mut packed[p * k * gl + col..];
            for (&v, &d) in src.iter().zip(&dst) {
                panel[d] = v;
            }
        }
        Conv::assemble(isa, crate::floats::Floats::owned(packed), bias, cout, cin, geo, input, act, kc, g)
    }

    /// Floats of the packed weights of a convolution of this shape for `isa`, in panels of
    /// `g` output blocks.
    pub fn packed_len(isa: Isa, cout: usize, cin: usize, geo: Geometry, input: Layout, g: usize) -> usize {
        let lanes = super::lanes(isa);
        let cin_eff = cin_eff(input, cin, lanes);
        cout.div_ceil(g * lanes) * geo.kernel[0] * geo.kernel[1] * cin_eff * g * lanes
    }

    /// Output blocks per panel of the packed weights (what [`Conv::with_packed`] takes
    /// back with them).
    pub fn panel(&self) -> usize {
        self.g
    }

    /// The packed weights, as [`Conv::with_packed`] takes them back.
    pub fn packed_weights(&self) -> &[f32] {
        &self.weights
    }

    /// A convolution over weights packed before by [`Conv::new`] for the same `isa` and
    /// shape in panels of `g` blocks (read in place); an error when their count does not
    /// fit.
    #[allow(clippy::too_many_arguments)]
    pub fn with_packed(
        isa: Isa,
        packed: crate::floats::Floats,
        bias: Option<&[f32]>,
        cout: usize,
        cin: usize,
        geo: Geometry,
        input: Layout,
        act: Activation,
        kc: usize,
        g: usize,
    ) -> Result<Conv, String> {
        if g != 2 && g != 3 {
            return Err(format!("panels of {g} output blocks (two or three)"));
        }
        let want = Conv::packed_len(isa, cout, cin, geo, input, g);
        if packed.len() != want {
            return Err(format!(
                "packed weights of {cout}×{cin}×{:?} hold {want} floats, not {}",
                geo.kernel,
                packed.len()
            ));
        }
        Ok(Conv::assemble(isa, packed, bias, cout, cin, geo, input, act, kc, g))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        isa: Isa,
        weights: crate::floats::Floats,
        bias: Option<&[f32]>,
        cout: usize,
        cin: usize,
        geo: Geometry,
        input: Layout,
        act: Activation,
        kc: usize,
        g: usize,
    ) -> Conv {
        let lanes = super::lanes(isa);
        let cin_eff = cin_eff(input, cin, lanes);
        let mut b = vec![0f32; cout.div_ceil(g * lanes) * g * lanes];
        if let Some(bias) = bias {
            b[..cout].copy_from_slice(&bias[..cout]);
        }
        Conv { isa, lanes, cin, cout, input, geo, cin_eff, g, weights, bias: b, act, post: None, kc: kc.max(1) }
    }

    /// The channel block (floats per pixel of a block).
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// The convolution with `post` (a program of one input) applied to its output after
    /// the activation, on each segment just written.
    pub fn with_post(mut self, post: super::shared::Post) -> Conv {
        self.post = post;
        self
    }

    /// The loop nest [`Conv::run`] runs for this output size, as lines of text (for `aim
    /// explore`), from the same constants the loops use.
    pub fn schedule(&self, batch: usize, oh: usize, ow: usize, padded: bool, residual: bool) -> Vec<String> {
        let l = self.lanes;
        let [kh, kw] = self.geo.kernel;
        let pointwise = self.geo.kernel == [1, 1] && self.geo.strides == [1, 1] && !padded;
        let (rows, row_len) = if pointwise { (batch, oh * ow) } else { (batch * oh, ow) };
        let segment = SEGMENT_TILES * super::tile_rows(self.isa);
        let segs = row_len.div_ceil(segment);
        let g = self.g;
        let panels = self.cout.div_ceil(g * l);
        let k = kh * kw * self.cin_eff;
        let mut v = Vec::new();
        if padded {
            v.push("zero-padded copy of the input (parallel over channel planes)".to_string());
        }
        let input = match self.input {
            Layout::Nchw => "NCHW input read directly",
            Layout::Blocked => "blocked input",
        };
        v.push(format!(
            "parallel for (panel of {g} output blocks in 0..{panels}, row in 0..{rows}{}, segment in 0..{segs} of ≤{segment} px): {} tasks",
            if pointwise { " (1×1: each image one row)" } else { "" },
            panels * rows * segs
        ));
        v.push(format!(
            "  for k-block in 0..{} (≤{} of k = {kh}·{kw}·{} = {k}; weights {}×{} floats stay in L1)",
            k.div_ceil(self.kc),
            self.kc,
            self.cin_eff,
            self.kc.min(k),
            g * l
        ));
        let last = self.cout.div_ceil(l) - (panels - 1) * g;
        v.push(format!(
            "    for tile in segment (≤{} px): acc[px][{} of {l} ch] += broadcast x[px·{}+koff[k]] · w[k] ({input}, {:?})",
            tile_pixels(self.isa, g),
            match (panels, last) {
                (1, b) => format!("{b} block{}", if b == 1 { "" } else { "s" }),
                (_, b) if b == g => format!("{g} blocks"),
                (_, b) => format!("{g} blocks ({b} in the last panel, ≤{} px)", tile_pixels(self.isa, b)),
            },
            self.geo.strides[1],
            self.isa
        ));
        v.push(format!(
            "    last k-block: + bias{}, {}",
            if residual { ", + residual" } else { "" },
            super::shared::epilogue_text(self.act, self.post.as_deref())
        ));
        v
    }

    /// Runs the convolution. Errors name what does not fit.
    pub fn run(&self, io: ConvIo, par: &dyn Parallel) -> Result<(), String> {
        if io.batch == 0 && io.x.is_empty() && io.y.is_empty() {
            return Ok(()); // an empty batch: nothing to compute
        }
        let job = self.plan(io, par)?;
        par.for_each(job.tasks(), &|t| job.task(t));
        Ok(())
    }

    /// Checks `io` and prepares its tasks (padding the input, on `par`, where needed):
    /// [`Conv::run`] in two halves, so that callers can run the tasks of several
    /// convolutions in one parallel loop.
    pub(super) fn plan<'a>(&'a self, io: ConvIo<'a>, par: &dyn Parallel) -> Result<Job<'a>, String> {
        let l = self.lanes;
        // A 1×1 stride-1 unpadded convolution maps pixel p to pixel p: one image is one long
        // row, so tiles run across row ends (no short tiles at the end of each row).
        let pointwise = self.geo.kernel == [1, 1]
            && self.geo.strides == [1, 1]
            && io.pads == [0; 4]
            && io.oh == io.h
            && io.ow == io.w;
        let io = if pointwise { ConvIo { h: 1, w: io.h * io.w, oh: 1, ow: io.oh * io.ow, ..io } } else { io };
        // A k×1 convolution over a one-column image (a 1-D convolution exported as 2-D, as
        // tf2onnx writes them) is a 1×k one over the row those bytes also are: tiles of
        // output pixels along the column instead of one pixel per tile. The packed weights
        // (k = (ky, kx, ci)) are the same for both.
        let column = !pointwise
            && self.geo.kernel[1] == 1
            && self.geo.strides[1] == 1
            && io.w == 1
            && io.ow == 1
            && io.pads[1] == 0
            && io.pads[3] == 0
            && io.h > 1;
        let (geo, io) = if column {
            let [pt, _, pb, _] = io.pads;
            let g = self.geo;
            let swapped =
                Geometry { kernel: [1, g.kernel[0]], strides: [1, g.strides[0]], dilations: [1, g.dilations[0]] };
            (swapped, ConvIo { h: 1, w: io.h, oh: 1, ow: io.oh, pads: [0, pt, 0, pb], ..io })
        } else {
            (self.geo, io)
        };
        let [kh, kw] = geo.kernel;
        let [sh, sw] = geo.strides;
        let [dh, dw] = geo.dilations;
        let [pt, pl, pb, pr] = io.pads;
        let (hp, wp) = (io.h + pt + pb, io.w + pl + pr);
        if io.oh == 0 || io.ow == 0 || (io.oh - 1) * sh + (kh - 1) * dh >= hp || (io.ow - 1) * sw + (kw - 1) * dw >= wp
        {
            return Err(format!("output {}×{} does not fit the padded input {hp}×{wp}", io.oh, io.ow));
        }
        let (planes, pix) = match self.input {
            Layout::Nchw => (self.cin, 1),
            Layout::Blocked => (self.cin_eff / l, l),
        };
        let in_len = io.batch * planes * io.h * io.w * pix;
        let cb_out = self.cout.div_ceil(l);
        let out_len = io.batch * cb_out * io.oh * io.ow * l;
        if io.x.len() != in_len || io.y.len() != out_len || io.residual.is_some_and(|r| r.len() != out_len) {
            return Err(format!("buffer sizes {} / {} do not match {in_len} / {out_len}", io.x.len(), io.y.len()));
        }
        let padded = (io.pads != [0; 4]).then(|| pad_planes(io.x, io.batch * planes, io.h, io.w, pix, io.pads, par));
        let plane = hp * wp * pix;
        let koff: Vec<usize> = (0..kh * kw)
            .flat_map(|t| (0..self.cin_eff).map(move |ci| (t, ci)))
            .map(|(t, ci)| {
                let at = ((t / kw) * dh * wp + (t % kw) * dw) * pix;
                match self.input {
                    Layout::Nchw => ci * plane + at,
                    Layout::Blocked => (ci / l) * plane + at + ci % l,
                }
            })
            .collect();
        let panels = self.cout.div_ceil(self.g * l);
        let rows = io.batch * io.oh;
        let k = koff.len();
        // Re-stream the smaller of the weights and the input: output rows innermost when
        // the weights are the larger (they stay in cache for one panel at a time).
        let weights_bytes = self.weights.len() * 4;
        let pair_outer = weights_bytes > planes * plane * 4;
        // Panels by groups whose weights stay in L2 while every row segment passes over
        // them: with both the weights and the input larger than L2 (a 1×1 layer of 384 to
        // 768 channels over 240 pixels), one panel at a time re-read the whole input from
        // L3 once per panel.
        let panel_bytes = (k * self.g * l * 4).max(1);
        let group = (WEIGHTS_IN_L2 / panel_bytes).clamp(1, panels);
        let x = padded.as_ref().map_or(io.x.as_ptr(), |p| p.as_ptr());
        let ptrs = Ptrs { x, y: io.y.as_mut_ptr(), res: io.residual.map_or(std::ptr::null(), |r| r.as_ptr()) };
        let (lo, hi) = super::shared::bounds(self.act);
        let segment = SEGMENT_TILES * super::tile_rows(self.isa);
        let mut segs = io.ow.div_ceil(segment);
        // Small layers (a 7×7 image, a few output blocks) have few tasks: split rows into
        // shorter segments (down to one tile) until every thread has several.
        let want = 4 * par.threads();
        if panels * rows * segs < want {
            segs = want.div_ceil(panels * rows).min(io.ow.div_ceil(super::tile_rows(self.isa))).max(segs);
        }
        Ok(Job {
            conv: self,
            koff,
            k,
            ow: io.ow,
            oh: io.oh,
            cb_out,
            xps: sw * pix,
            xrow: sh * wp * pix,
            image: planes * plane,
            lo,
            hi,
            ptrs,
            panels,
            units: rows * segs,
            segs,
            pair_outer,
            group,
            acc_first: io.residual_in_y,
            _padded: padded,
            _buffers: std::marker::PhantomData,
        })
    }
}

/// An activation as explore prints it.
pub(super) fn act_text(a: Activation) -> String {
    a.text()
}

/// Raw buffer pointers shared by the row tasks.
#[derive(Clone, Copy)]
struct Ptrs {
    x: *const f32,
    y: *mut f32,
    res: *const f32,
}
// SAFETY: x and res are only read; each task writes a disjoint part of y.
unsafe impl Send for Ptrs {}
unsafe impl Sync for Ptrs {}

/// One call's tasks: what every task shares, and the buffers they read and write.
pub(super) struct Job<'a> {
    conv: &'a Conv,
    koff: Vec<usize>,
    k: usize,
    ow: usize,
    oh: usize,
    cb_out: usize,
    /// Input floats between horizontally adjacent output pixels.
    xps: usize,
    /// Input floats between vertically adjacent output rows.
    xrow: usize,
    /// Input floats per image.
    image: usize,
    lo: f32,
    hi: f32,
    ptrs: Ptrs,
    /// Panels of output blocks.
    panels: usize,
    /// Row segments: rows × segments per row.
    units: usize,
    segs: usize,
    pair_outer: bool,
    /// Panels per group when the panels are outer (see `plan`).
    group: usize,
    /// Whether the first k block starts from the output (which holds the residual).
    acc_first: bool,
    /// The zero-padded input the pointers may point into.
    _padded: Option<Scratch>,
    /// The caller's input, residual and output, borrowed for as long as the job lives.
    _buffers: std::marker::PhantomData<&'a mut [f32]>,
}

impl Job<'_> {
    /// How many tasks [`Job::task`] takes.
    pub(super) fn tasks(&self) -> usize {
        self.panels * self.units
    }

    /// Runs task `t` (`t < tasks()`): one segment of one output row of one panel's output
    /// blocks.
    pub(super) fn task(&self, t: usize) {
        let (pair, unit) = if self.pair_outer {
            // Groups of panels one after the other; in a group, each row segment for
            // every panel of the group.
            let g = t / (self.group * self.units);
            let size = self.group.min(self.panels - g * self.group);
            let rest = t - g * self.group * self.units;
            (g * self.group + rest % size, rest / size)
        } else {
            (t % self.panels, t / self.panels)
        };
        let (row, seg) = (unit / self.segs, unit % self.segs);
        // Segments (and the tiles in them) of near-equal length, not a short one at the end.
        let cols = seg * self.ow / self.segs..(seg + 1) * self.ow / self.segs;
        assert!(t < self.tasks() && pair < self.panels && unit < self.units, "task {t} of {}", self.tasks());
        // SAFETY: `plan` checked the buffer sizes against the geometry; task t writes only
        // its segment of its row of its panel's output blocks.
        unsafe { self.segment(pair, row, cols, self.ptrs) }
    }

    /// Output pixels `cols` of row `row` (image-major) of the blocks of panel `pair`.
    unsafe fn segment(&self, pair: usize, row: usize, cols: std::ops::Range<usize>, p: Ptrs) {
        match self.conv.isa.kind() {
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512 => self.segment_avx512(pair, row, cols, p),
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => self.segment_avx2(pair, row, cols, p),
            _ => self.segment_generic::<super::simd::Portable8, 4, 2>(pair, row, cols, p),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn segment_avx512(&self, pair: usize, row: usize, cols: std::ops::Range<usize>, p: Ptrs) {
        self.segment_generic::<super::simd::F32x16, 12, 6>(pair, row, cols, p)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn segment_avx2(&self, pair: usize, row: usize, cols: std::ops::Range<usize>, p: Ptrs) {
        self.segment_generic::<super::simd::F32x8, 6, 3>(pair, row, cols, p)
    }

    /// The segment's tiles, k block by k block: a block of weights is loaded into L1 once
    /// and used by every tile; partial sums wait in the output. Tiles of two blocks (or
    /// one) hold `RMAX` pixels, of three `RMAX3` (see [`tile_pixels`]).
    #[inline(always)]
    unsafe fn segment_generic<V: Vf32, const RMAX: usize, const RMAX3: usize>(
        &self,
        pair: usize,
        row: usize,
        cols: std::ops::Range<usize>,
        p: Ptrs,
    ) {
        let l = V::LANES;
        let (n, oy) = (row / self.oh, row % self.oh);
        let g = self.conv.g;
        let gl = g * l;
        let nb = (self.cb_out - g * pair).min(g);
        let yblk = self.oh * self.ow * l;
        let yoff = (n * self.cb_out + g * pair) * yblk + oy * self.ow * l;
        let x = p.x.add(n * self.image + oy * self.xrow);
        let kc = self.conv.kc;
        let mut k0 = 0;
        while k0 < self.k {
            let k1 = (k0 + kc).min(self.k);
            let t = Tile {
                k0,
                k1,
                first: k0 == 0 && !self.acc_first,
                last: k1 == self.k,
                koff: self.koff.as_ptr(),
                xps: self.xps,
                gl,
                w: self.conv.weights.as_ptr().add(pair * self.k * gl),
                bias: self.conv.bias.as_ptr().add(pair * gl),
                lo: self.lo,
                hi: self.hi,
                leak: leak(self.conv.act),
            };
            let tiles = cols.len().div_ceil(if nb == 3 { RMAX3 } else { RMAX });
            let mut ox = cols.start;
            for i in 0..tiles {
                let r = cols.start + (i + 1) * cols.len() / tiles - ox;
                let y0 = p.y.add(yoff + ox * l);
                let r0 = if p.res.is_null() { p.res } else { p.res.add(yoff + ox * l) };
                // Blocks past the panel's real ones have no output (never touched).
                let y: [*mut f32; 3] =
                    std::array::from_fn(|b| if b < nb { y0.add(b * yblk) } else { std::ptr::null_mut() });
                let res: [*const f32; 3] =
                    std::array::from_fn(|b| if b < nb && !r0.is_null() { r0.add(b * yblk) } else { std::ptr::null() });
                let x = x.add(ox * self.xps);
                // The input stride between pixels as a constant where it is one or two
                // vectors (blocked input, stride 1 or 2) or one or two floats (NCHW input):
                // addresses then fold into displacements. Codes: see `Tile::run`. A panel
                // with fewer real blocks computes those only.
                macro_rules! go {
                    ($xs:literal) => {
                        match (r, nb) {
                            (1, 3) => t.run::<V, 1, $xs, 3>(x, y, res),
                            (2, 3) => t.run::<V, 2, $xs, 3>(x, y, res),
                            (3, 3) => t.run::<V, 3, $xs, 3>(x, y, res),
                            (4, 3) => t.run::<V, 4, $xs, 3>(x, y, res),
                            (5, 3) => t.run::<V, 5, $xs, 3>(x, y, res),
                            (6, 3) => t.run::<V, 6, $xs, 3>(x, y, res),
                            (_, 3) => unreachable!("tiles of three blocks are 1..=6 pixels"),
                            (r, 2) => go!(@rows $xs 2 r),
                            (r, _) => go!(@rows $xs 1 r),
                        }
                    };
                    (@rows $xs:literal $nb:literal $r:ident) => {
                        match $r {
                            1 => t.run::<V, 1, $xs, $nb>(x, y, res),
                            2 => t.run::<V, 2, $xs, $nb>(x, y, res),
                            3 => t.run::<V, 3, $xs, $nb>(x, y, res),
                            4 => t.run::<V, 4, $xs, $nb>(x, y, res),
                            5 => t.run::<V, 5, $xs, $nb>(x, y, res),
                            6 => t.run::<V, 6, $xs, $nb>(x, y, res),
                            7 => t.run::<V, 7, $xs, $nb>(x, y, res),
                            8 => t.run::<V, 8, $xs, $nb>(x, y, res),
                            9 => t.run::<V, 9, $xs, $nb>(x, y, res),
                            10 => t.run::<V, 10, $xs, $nb>(x, y, res),
                            11 => t.run::<V, 11, $xs, $nb>(x, y, res),
                            12 => t.run::<V, 12, $xs, $nb>(x, y, res),
                            _ => unreachable!("tile rows are 1..=12"),
                        }
                    };
                }
                match self.xps {
                    s if s == l => go!(1),
                    s if s == 2 * l => go!(2),
                    1 => go!(3),
                    2 => go!(4),
                    _ => go!(0),
                }
                ox += r;
            }
            k0 = k1;
        }
        // Activations other than a clamp run over the segment just written (in L1).
        for b in 0..nb {
            super::shared::finish(
                if leak(self.conv.act).is_some() { Activation::Identity } else { self.conv.act },
                self.conv.post.as_deref(),
                self.conv.isa,
                p.y.add(yoff + b * yblk + cols.start * l),
                cols.len() * l,
            );
        }
    }
}

/// One microkernel call's constant operands.
struct Tile {
    /// The k block: `k0..k1`.
    k0: usize,
    k1: usize,
    /// Whether this is the first k block (start from zero, not from the output) and the
    /// last (apply bias, residual and activation).
    first: bool,
    last: bool,
    koff: *const usize,
    xps: usize,
    /// Floats of weights per k step (the panel's blocks × lanes).
    gl: usize,
    w: *const f32,
    bias: *const f32,
    lo: f32,
    hi: f32,
    /// A LeakyRelu's slope, applied in registers (see [`leak`]).
    leak: Option<f32>,
}

/// The slope of a LeakyRelu that the tiles apply in registers as `max(x, α·x)`: the same
/// values as the activation (−0 and NaN included) for `0 ≤ α ≤ 1`, which is every slope
/// seen in practice; other activations run over the segment after the store.
fn leak(act: Activation) -> Option<f32> {
    match act {
        Activation::LeakyRelu(a) if (0.0..=1.0).contains(&a) => Some(a),
        _ => None,
    }
}

impl Tile {
    /// `R` pixels × `NB` (one to three) blocks: `y = act(bias + Σ_k x[koff[k] + r·xps] ·
    /// w[k] (+ res))`, with the input stride between pixels `xps` given by `XS`: 1 and 2
    /// are one and two vectors, 3 and 4 one and two floats, 0 the runtime `self.xps`. The
    /// weights hold the panel's blocks per k step either way (those past the layer's last
    /// block are zero padding).
    #[inline(always)]
    unsafe fn run<V: Vf32, const R: usize, const XS: usize, const NB: usize>(
        &self,
        x: *const f32,
        y: [*mut f32; 3],
        res: [*const f32; 3],
    ) {
        let l = V::LANES;
        let xps = match XS {
            1 => l,
            2 => 2 * l,
            3 => 1,
            4 => 2,
            _ => self.xps,
        };
        let mut acc = [[V::zero(); NB]; R];
        if !self.first {
            for (r, a) in acc.iter_mut().enumerate() {
                for (j, v) in a.iter_mut().enumerate() {
                    *v = V::load(y[j].add(r * l));
                }
            }
        }
        // The k loop works on two halves of at most six pixels each, copied out of `acc`
        // and back: loops of a constant six steps unroll before LLVM splits the arrays
        // into registers, where one loop of twelve (AVX-512's tile) did not, and `acc`
        // stayed in memory — each k step stored all 24 accumulators back to the stack (20
        // 64-byte stores per 24 FMAs: half the speed where, as on AMD Zen 4, a core stores
        // one 64-byte vector every two cycles).
        const HALF: usize = 6;
        let mut lo = [[V::zero(); NB]; HALF];
        let mut hi = [[V::zero(); NB]; HALF];
        for r in 0..HALF {
            if r < R {
                lo[r] = acc[r];
            }
            if HALF + r < R {
                hi[r] = acc[HALF + r];
            }
        }
        for kk in self.k0..self.k1 {
            let xk = x.add(*self.koff.add(kk));
            let wk = self.w.add(kk * self.gl);
            let w: [V; NB] = std::array::from_fn(|j| V::load(wk.add(j * l)));
            for (r, a) in lo.iter_mut().enumerate() {
                if r < R {
                    let xv = V::splat(*xk.add(r * xps));
                    for j in 0..NB {
                        a[j] = xv.fma(w[j], a[j]);
                    }
                }
            }
            for (r, a) in hi.iter_mut().enumerate() {
                if HALF + r < R {
                    let xv = V::splat(*xk.add((HALF + r) * xps));
                    for j in 0..NB {
                        a[j] = xv.fma(w[j], a[j]);
                    }
                }
            }
        }
        for r in 0..HALF {
            if r < R {
                acc[r] = lo[r];
            }
            if HALF + r < R {
                acc[HALF + r] = hi[r];
            }
        }
        if !self.last {
            for (r, a) in acc.iter().enumerate() {
                for (j, v) in a.iter().enumerate() {
                    v.store(y[j].add(r * l));
                }
            }
            return;
        }
        let (lo, hi) = (V::splat(self.lo), V::splat(self.hi));
        for j in 0..NB {
            let b = V::load(self.bias.add(j * l));
            for (r, a) in acc.iter().enumerate() {
                let mut v = a[j].add(b);
                if !res[j].is_null() {
                    v = v.add(V::load(res[j].add(r * l)));
                }
                v = v.clamp(lo, hi);
                if let Some(a) = self.leak {
                    v = v.mul(V::splat(a)).max_nan(v);
                }
                v.store(y[j].add(r * l));
            }
        }
    }
}

/// Zero-padded copies of `planes` planes of `h × w` pixels of `pix` floats, in a scratch
/// buffer (every element written: the borders zeroed, the interior copied).
fn pad_planes(
    x: &[f32],
    planes: usize,
    h: usize,
    w: usize,
    pix: usize,
    pads: [usize; 4],
    par: &dyn Parallel,
) -> Scratch {
    let [pt, pl, pb, pr] = pads;
    let (hp, wp) = (h + pt + pb, w + pl + pr);
    let mut out = scratch::take(planes * hp * wp * pix);
    let op = OutPtr(out.as_mut_ptr());
    par.for_each(planes, &|i| {
        let op = op;
        // SAFETY: task i writes plane i only.
        let dst = unsafe { std::slice::from_raw_parts_mut(op.0.add(i * hp * wp * pix), hp * wp * pix) };
        let src = &x[i * h * w * pix..(i + 1) * h * w * pix];
        dst[..pt * wp * pix].fill(0.0);
        dst[(pt + h) * wp * pix..].fill(0.0);
        for y in 0..h {
            let row = &mut dst[(y + pt) * wp * pix..(y + pt + 1) * wp * pix];
            row[..pl * pix].fill(0.0);
            row[(pl + w) * pix..].fill(0.0);
            crate::fast::copy_short(&mut row[pl * pix..(pl + w) * pix], &src[y * w * pix..(y + 1) * w * pix]);
        }
    });
    out
}
