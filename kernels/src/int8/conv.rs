//! Quantized 2-D convolution, bytes NHWC in and out: an indirect GEMM whose rows are output
//! pixels, whose depth is taps × input channels and whose columns are output channels.
//!
//! A pixel's channels are contiguous in NHWC, so each tap of each row is a pointer into the
//! input (or into a row of the input's zero point, the quantized 0, where the window
//! leaves the image): nothing is gathered or packed per call. The s8 weights are packed
//! once into panels of [`NR`] output channels, per tap and per group of four input
//! channels (a tap's channels rounded up to a multiple of four with zero weights, so the
//! bytes read past a pixel's channels count for nothing). The sums are exact; the input's
//! zero point costs nothing per output (the sums start from `−zx · Σ w`), and the
//! epilogue ([`super::Out8`]) scales, adds the bias, applies the activation and an
//! optional residual, and quantizes.
//!
//! Weights must be symmetric (zero point 0), as ONNX Runtime's quantizer writes s8 weights.

use super::epilogue::Epilogue8;
use super::micro::{Avx2, Micro};
use super::winograd::Wino8;
use super::{Nhwc, Out8, SharedMut, Weights8, Window, Q8};
use crate::gemm::{Isa, Parallel};
use crate::qgemm::{MR, NR};

/// Taps × channels above which the i32 sums could overflow (255 · 128 per product).
const MAX_DEPTH: usize = 65_000;

/// Input channels below which a tap is a whole kernel row (see [`Conv8`]).
const WIDE_BELOW: usize = 16;

/// Weight bytes per task's chunk of panels: a chunk stays in L2 while its rows pass.
const CHUNK_BYTES: usize = 256 << 10;

/// Bytes of transformed patches per group of Winograd tiles (see `Conv8::run_winograd`):
/// what the panels of weights pass over, from L2 and L3.
const WINO_GROUP_BYTES: usize = 1 << 20;

/// A convolution prepared for [`Conv8::run`]: packed weights and every per-channel
/// quantity of the epilogue.
#[derive(Clone, Debug)]
pub struct Conv8 {
    c: usize,
    m: usize,
    window: Window,
    /// Whether a tap is a whole kernel row (`kw` pixels' channels, contiguous in NHWC: few
    /// input channels and no horizontal dilation) instead of one pixel.
    wide: bool,
    /// Taps per output pixel (kernel rows, or kernel positions).
    taps: usize,
    /// Groups of four bytes per tap.
    groups: usize,
    /// Per panel of NR output channels: per tap, per group, NR × 4 bytes (s8).
    panels: Vec<u8>,
    x_zero: u8,
    /// Per panel, what its sums start from: `−zx · Σ w` per output channel (the input's zero
    /// point taken out), 0 past the last channel.
    init: Vec<[i32; NR]>,
    /// The same for the AVX2 sign kernel ([`super::sign::start`]), when it takes the packed
    /// weights (no −128).
    sign_init: Option<Vec<[i32; NR]>>,
    /// The same for the NEON kernel ([`super::neon`]), from the packed weights' sums
    /// whatever they are (AArch64 only).
    dot_init: Option<Vec<[i32; NR]>>,
    /// Whether every pair of packed weights fits the AVX2 plain kernel ([`super::plain`]).
    plain: bool,
    /// Per panel, the packed weights that differ from the true ones: pairs shrunk for the
    /// plain kernel, or −128s packed as −127 for the sign kernel (a few, see
    /// [`super::fixes`]). Each tile's sums then gain the activation there times the
    /// difference (`(channel within the panel, tap, byte within the tap, true − packed)`).
    fixes: Vec<Vec<(u32, u32, u32, i32)>>,
    /// The epilogue, with each output channel's scale (input × weight) and bias.
    ep: Epilogue8,
    /// The weights transformed for Winograd F(2×2, 3×3) ([`super::winograd`]), when every
    /// run takes it (the byte panels are then not kept).
    wino: Option<Wino8>,
}

impl Conv8 {
    /// Packs the weights (`[m, c, kh, kw]`) of a convolution from `c` to `m` channels over
    /// `window`, whose input has quantization `x` and whose result becomes `out`, for every
    /// kernel: pairs shrunk for AVX2's plain kernel, or −128s moved for its sign kernel, each
    /// corrected per tile.
    pub fn new(c: usize, m: usize, window: Window, weights: Weights8, x: Q8, out: Out8) -> Result<Conv8, String> {
        Conv8::packed(c, m, window, weights, x, out, true)
    }

    /// [`new`](Self::new) for the kernel `isa` runs here. Where that is VNNI or the
    /// portable kernel (exact on any weights) the weights are packed as they are: no pairs
    /// shrunk and corrected per tile (on an int8 ResNet-50 the corrections took 6% of the
    /// run), no −128 moved. On an AVX2 CPU such a packing runs the portable kernel.
    pub fn for_isa(
        isa: crate::gemm::Isa,
        c: usize,
        m: usize,
        window: Window,
        weights: Weights8,
        x: Q8,
        out: Out8,
    ) -> Result<Conv8, String> {
        Conv8::packed(c, m, window, weights, x, out, crate::qgemm::packs_for_avx2(isa))
    }

    /// [`new`](Self::new), the AVX2 packings made only when `for_avx2`.
    fn packed(
        c: usize,
        m: usize,
        window: Window,
        weights: Weights8,
        x: Q8,
        out: Out8,
        for_avx2: bool,
    ) -> Result<Conv8, String> {
        let Weights8 { w, scale: w_scale, bias } = weights;
        let taps = window.taps();
        if c == 0 || m == 0 || taps == 0 {
            return Err(format!("a convolution from {c} to {m} channels over {taps} taps"));
        }
        if taps.saturating_mul(c) > MAX_DEPTH {
            return Err(format!("{taps} taps × {c} channels is deeper than the integer sums allow ({MAX_DEPTH})"));
        }
        if w.len() != m * c * taps {
            return Err(format!("{} weights for {m} filters of {c}×{taps}", w.len()));
        }
        if w_scale.len() != 1 && w_scale.len() != m {
            return Err(format!("{} weight scales for {m} output channels", w_scale.len()));
        }
        if bias.is_some_and(|b| b.len() != m) {
            return Err(format!("a bias of {} values for {m} output channels", bias.map_or(0, |b| b.len())));
        }
        let [kh, kw] = window.kernel;
        let wide = c < WIDE_BELOW && kw > 1 && window.dilation[1] == 1;
        // A tap's bytes: one pixel's channels, or a kernel row's pixels' channels.
        let (ntaps, tap_bytes) = if wide { (kh, kw * c) } else { (taps, c) };
        let groups = tap_bytes.div_ceil(4);
        let npanels = m.div_ceil(NR);
        let panel_bytes = ntaps * groups * NR * 4;
        let mut panels = vec![0u8; npanels * panel_bytes];
        let mut colsum = vec![0i32; m];
        let mut lowest: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); npanels];
        for (o, sum) in colsum.iter_mut().enumerate() {
            let (p, j) = (o / NR, o % NR);
            for ci in 0..c {
                for t in 0..taps {
                    let v = w[(o * c + ci) * taps + t];
                    *sum += v as i8 as i32;
                    let (tap, at) = if wide { (t / kw, (t % kw) * c + ci) } else { (t, ci) };
                    if v == 0x80 {
                        lowest[p].push((j as u32, tap as u32, at as u32));
                    }
                    let (g, i) = (at / 4, at % 4);
                    panels[p * panel_bytes + ((tap * groups + g) * NR + j) * 4 + i] = v;
                }
            }
        }
        let mut init = vec![[0i32; NR]; npanels];
        for (o, &s) in colsum.iter().enumerate() {
            init[o / NR][o % NR] = s.wrapping_mul(x.zero as i32).wrapping_neg();
        }
        let scale = (0..m).map(|o| x.scale * w_scale[if w_scale.len() == 1 { 0 } else { o }]).collect();
        let bias = bias.map_or_else(|| vec![0.0; m], |b| b.to_vec());
        let ep = Epilogue8::new(out, scale, bias);
        let x_zero = x.zero;
        let (fixes, sign_init, plain) = if !for_avx2 {
            (vec![Vec::new(); npanels], None, false)
        } else if let Some(pairs) = super::plain::split_pairs(&mut panels, ntaps * groups, m * c * taps, 256) {
            // The plain kernel when few pairs need shrinking (the depth of a panel runs over
            // its taps' groups).
            let fixes = pairs
                .iter()
                .map(|f| f.iter().map(|&(j, d, v)| (j, d / (groups as u32 * 4), d % (groups as u32 * 4), v)).collect())
                .collect();
            (fixes, None, true)
        } else {
            // Else a few −128s are packed as −127 and corrected per tile, so that the sign
            // kernel takes the convolution; the packed values' sums (one more per −128)
            // start it.
            let lowest = super::fixes::few(&lowest, m * c * taps, 8);
            let mut packed_sum = colsum.clone();
            let mut fixes = vec![Vec::new(); npanels];
            for (p, f) in lowest.iter().enumerate() {
                for &(j, tap, at) in f {
                    let (g, i) = (at as usize / 4, at as usize % 4);
                    panels[p * panel_bytes + ((tap as usize * groups + g) * NR + j as usize) * 4 + i] = (-127i8) as u8;
                    packed_sum[p * NR + j as usize] += 1;
                    fixes[p].push((j, tap, at, -1));
                }
            }
            let sign_init = super::sign::fits(&panels)
                .then(|| init.iter().enumerate().map(|(p, i)| super::sign::start(i, &packed_sum[p * NR..])).collect());
            (fixes, sign_init, false)
        };
        let (taps, wino) = (ntaps, None);
        let dot_init = cfg!(target_arch = "aarch64").then(|| {
            init.iter()
                .enumerate()
                .map(|(p, i)| {
                    let panel = &panels[p * panel_bytes..(p + 1) * panel_bytes];
                    let sums: Vec<i32> = (0..NR)
                        .map(|j| {
                            panel
                                .chunks_exact(NR * 4)
                                .map(|g| g[j * 4..j * 4 + 4].iter().map(|&v| v as i8 as i32).sum::<i32>())
                                .sum()
                        })
                        .collect();
                    super::sign::start(i, &sums)
                })
                .collect()
        });
        Ok(Conv8 {
            c,
            m,
            window,
            wide,
            taps,
            groups,
            panels,
            x_zero,
            init,
            sign_init,
            dot_init,
            plain,
            fixes,
            ep,
            wino,
        })
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.m
    }

    /// Input channels.
    pub fn in_channels(&self) -> usize {
        self.c
    }

    /// The window.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// Whether Winograd F(2×2, 3×3) ([`Conv8::into_winograd`]) pays on `isa` for `out` =
    /// (images, height, width) of output (`None`: not known before the run, when it is
    /// taken wherever it applies): on AVX2 without VNNI, where the direct kernel multiplies
    /// at `vpmaddwd`'s rate as Winograd does, for a 3×3 stride-1 window over 16 to 1,024
    /// channels, where [`Conv8::winograd_costs`] puts it below the direct kernel.
    /// `AIM_NO_WINOGRAD` (set to anything) turns it off, for comparisons, as for the f32
    /// convolutions.
    pub fn winograd_pays(&self, isa: Isa, out: Option<[usize; 3]>) -> bool {
        std::env::var_os("AIM_NO_WINOGRAD").is_none()
            && crate::qgemm::use_avx2(isa)
            && !crate::qgemm::use_vnni(isa)
            && Wino8::applies(self.c, &self.window)
            && out.is_none_or(|o| {
                let (wino, direct) = self.winograd_costs(o);
                wino < direct
            })
    }

    /// The estimated costs, in multiply-adds, of Winograd and of the direct kernel for an
    /// output of (images, height, width): their products, and the weights' bytes read.
    pub fn winograd_costs(&self, [n, oh, ow]: [usize; 3]) -> (u64, u64) {
        Wino8::costs(self.c, self.m, n, oh, ow)
    }

    /// The convolution with its weights `w` (the ones given to [`Conv8::new`]) transformed
    /// for Winograd F(2×2, 3×3), which every run then takes (exact: the same bytes as the
    /// direct kernel); the byte panels are dropped.
    pub fn into_winograd(mut self, w: &[u8]) -> Result<Conv8, String> {
        if !Wino8::applies(self.c, &self.window) {
            return Err(format!("Winograd F(2×2, 3×3) does not take {:?} over {} channels", self.window, self.c));
        }
        if w.len() != self.m * self.c * 9 {
            return Err(format!("{} weights for {} filters of {}×9", w.len(), self.m, self.c));
        }
        self.wino = Some(Wino8::new(self.c, self.m, w));
        (self.panels, self.fixes, self.sign_init, self.dot_init) = (Vec::new(), Vec::new(), None, None);
        Ok(self)
    }

    /// Whether every run takes Winograd F(2×2, 3×3) ([`Conv8::into_winograd`]).
    pub fn winograd(&self) -> bool {
        self.wino.is_some()
    }

    /// Bytes the packed weights take.
    pub fn weight_bytes(&self) -> usize {
        self.wino.as_ref().map_or(self.panels.len(), Wino8::bytes)
    }

    /// The microkernel [`Conv8::run`] takes on `isa` for an input of `pixels` pixels
    /// (images × height × width), by name (for schedule texts).
    pub fn micro_name(&self, isa: Isa, pixels: usize) -> &'static str {
        if self.wino.is_some() {
            return if crate::qgemm::use_avx2(isa) {
                "Winograd F(2×2, 3×3) in 16-bit integers, AVX2 vpmaddwd: exact"
            } else {
                "Winograd F(2×2, 3×3) in 16-bit integers, portable: exact"
            };
        }
        if self.widens(isa, self.staged_bytes(pixels, pixels * self.c)) {
            return "AVX2 vpmaddwd on the input widened to 16 bits: exact";
        }
        Micro::for_isa(isa, self.avx2()).name()
    }

    /// The bytes [`Conv8::run`] reads for an input of `pixels` pixels held in `given`
    /// bytes: every tap pointer is read for a whole group of four channels, past the last
    /// pixel's channels where a tap's bytes are not a multiple of four, so a shorter input
    /// is copied with room to spare.
    fn staged_bytes(&self, pixels: usize, given: usize) -> usize {
        let (c, kc, kw) = (self.c, self.groups * 4, self.window.kernel[1]);
        let need = if self.wide { (pixels - kw.min(pixels)) * c + kc } else { (pixels - 1) * c + kc };
        given.max(need)
    }

    /// Whether [`Conv8::run`] widens an input of `bytes` staged bytes to 16 bits on `isa`
    /// ([`super::widened`]): AVX2 without VNNI, for weights the plain kernel cannot take,
    /// where the widened copy stays within [`super::widened::WIDEN_MAX_BYTES`].
    fn widens(&self, isa: Isa, bytes: usize) -> bool {
        !self.plain
            && crate::qgemm::use_avx2(isa)
            && !crate::qgemm::use_vnni(isa)
            && bytes * 2 <= super::widened::WIDEN_MAX_BYTES
    }

    /// The AVX2 kernel the packed weights take.
    fn avx2(&self) -> Avx2 {
        match (self.plain, &self.sign_init) {
            (true, _) => Avx2::Plain,
            (false, Some(_)) => Avx2::Sign,
            (false, None) => Avx2::Neither,
        }
    }

    /// The epilogue.
    pub fn out(&self) -> &Out8 {
        self.ep.out()
    }

    /// `y` (bytes NHWC, `n × oh × ow × m`) from `x`; `res` is the residual (bytes of `y`'s
    /// shape) when the epilogue has one.
    ///
    /// Panics when a buffer does not fit the shapes given.
    pub fn run(&self, isa: Isa, x: &Nhwc, res: Option<&[u8]>, y: &mut [u8], par: &dyn Parallel) {
        let (oh, ow) = self.window.output(x.h, x.w).expect("the window fits the input");
        let (rows, m, c) = (x.n * oh * ow, self.m, self.c);
        assert!(x.fits() && x.c == c, "the input does not hold {c} channels NHWC");
        assert!(y.len() >= rows * m, "the output is too small");
        assert_eq!(res.is_some(), self.out().residual.is_some(), "a residual exactly when the epilogue adds one");
        if let Some(r) = res {
            assert!(r.len() >= rows * m, "the residual is too small");
        }
        if rows == 0 {
            return;
        }
        if let Some(wz) = &self.wino {
            return self.run_winograd(wz, isa, x, res, y, par);
        }
        let kc = self.groups * 4;
        let [kh, kw] = self.window.kernel;
        let need = self.staged_bytes(x.n * x.h * x.w, 0);
        let mut spare = crate::scratch::take_bytes(if x.data.len() < need { need } else { 0 });
        let data: &[u8] = if x.data.len() < need {
            spare[..x.data.len()].copy_from_slice(x.data);
            spare[x.data.len()..].fill(self.x_zero);
            &spare
        } else {
            x.data
        };
        let zrow = vec![self.x_zero; kc];
        let taps = self.taps;
        let npanels = m.div_ceil(NR);
        let panel_bytes = taps * self.groups * NR * 4;
        let per_chunk = (CHUNK_BYTES / panel_bytes).clamp(1, npanels);
        let chunks = npanels.div_ceil(per_chunk);
        let blocks = rows.div_ceil(MR);
        let splits = (par.threads() * 4).div_ceil(chunks).clamp(1, blocks);
        let per_split = blocks.div_ceil(splits);
        let micro = Micro::for_isa(isa, self.avx2());
        // The input widened to 16 bits once, for the widened kernel: the tiles' pointers
        // into it are those into the bytes, at twice the offset.
        let widened = self.widens(isa, data.len());
        let mut data16 = crate::scratch::take_bytes(if widened { data.len() * 2 } else { 0 });
        if widened {
            super::widened::widen(data, false, &mut data16);
        }
        let zrow16: Vec<u8> =
            if widened { zrow.iter().flat_map(|&z| (z as i16).to_ne_bytes()).collect() } else { vec![] };
        // Where the sums start: the sign kernel's values when it runs.
        let starts = match (&self.sign_init, &self.dot_init) {
            (_, Some(i)) if micro.flipped_start() => i.as_slice(),
            (Some(i), _) if micro.signed_start() && !widened => i.as_slice(),
            _ => self.init.as_slice(),
        };
        let fast = self.ep.fast(isa);
        let yp = SharedMut(y.as_mut_ptr());
        let pointwise = self.window.kernel == [1, 1] && self.window.stride == [1, 1] && self.window.pads == [0; 4];
        let geo = Geometry { h: x.h as isize, w: x.w as isize, c, oh, ow, kh, kw, window: self.window, pointwise };
        par.for_each(chunks * splits, &|t| {
            let yp = yp;
            let (chunk, split) = (t % chunks, t / chunks);
            let mut ind: Vec<*const u8> = vec![zrow.as_ptr(); taps * MR];
            // Kernel rows that cross the image's left or right edge, gathered with zero points.
            let mut edge = vec![self.x_zero; if self.wide { taps * MR * kc } else { 0 }];
            let mut acc = [[0i32; NR]; MR];
            let mut ind16: Vec<*const u8> = if widened { vec![zrow16.as_ptr(); taps * MR] } else { Vec::new() };
            let mut edge16 = vec![0u8; if widened { edge.len() * 2 } else { 0 }];
            for blk in split * per_split..((split + 1) * per_split).min(blocks) {
                let r0 = blk * MR;
                let nrows = (rows - r0).min(MR);
                if self.wide {
                    geo.rows(data, r0, nrows, &zrow, &mut edge, kc, &mut ind);
                } else {
                    geo.pixels(data, r0, nrows, &zrow, &mut ind);
                }
                if widened {
                    if self.wide {
                        super::widened::widen(&edge, false, &mut edge16);
                    }
                    let (d, e, z) = (data.as_ptr() as usize, edge.as_ptr() as usize, zrow.as_ptr() as usize);
                    for (q, &p) in ind16.iter_mut().zip(&ind) {
                        let a = p as usize;
                        *q = if a >= d && a < d + data.len() {
                            data16[2 * (a - d)..].as_ptr()
                        } else if a == z {
                            zrow16.as_ptr()
                        } else {
                            edge16[2 * (a - e)..].as_ptr()
                        };
                    }
                }
                let panels = chunk * per_chunk..((chunk + 1) * per_chunk).min(npanels);
                for (p, start) in starts.iter().enumerate().take(panels.end).skip(panels.start) {
                    let panel = &self.panels[p * panel_bytes..(p + 1) * panel_bytes];
                    // SAFETY: every pointer has `kc` readable bytes (the input holds `need`
                    // bytes; the zero row and the edge rows `kc`), and every widened one `kc`
                    // values (the widened copies are twice as long); the panel holds
                    // taps·groups·NR·4 bytes; `micro` is one this CPU runs, the widened
                    // kernel only with AVX2.
                    unsafe {
                        #[cfg(target_arch = "x86_64")]
                        if widened {
                            let (ind, out) = (ind16.as_ptr(), acc.as_mut_ptr());
                            super::widened::tile::<false>(ind, taps, self.groups, panel.as_ptr(), start, nrows, out);
                        } else {
                            micro.tile(&ind, taps, self.groups, panel.as_ptr(), start, nrows, &mut acc);
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        micro.tile(&ind, taps, self.groups, panel.as_ptr(), start, nrows, &mut acc);
                    }
                    for &(j, tap, at, d) in &self.fixes[p] {
                        for (r, sums) in acc.iter_mut().enumerate().take(nrows) {
                            // SAFETY: as for the tile: the pointer has `kc` bytes, `at < kc`.
                            let a = unsafe { *ind[tap as usize * MR + r].add(at as usize) };
                            sums[j as usize] = sums[j as usize].wrapping_add((a as i32).wrapping_mul(d));
                        }
                    }
                    let j0 = p * NR;
                    let cols = (m - j0).min(NR);
                    let at = r0 * m + j0;
                    let resp = res.map_or(std::ptr::null(), |r| r[at..].as_ptr());
                    // SAFETY: rows r0..r0+nrows, columns j0..j0+cols lie inside `y` (and the
                    // residual: rows·m bytes each, checked above); tasks write disjoint tiles.
                    unsafe { self.ep.tile(fast, isa, &acc, nrows, j0, cols, resp, yp.0.add(at), m) };
                }
            }
        });
    }
}

impl Conv8 {
    /// [`Conv8::run`] as Winograd F(2×2, 3×3) ([`super::winograd`]), over groups of tiles
    /// whose transformed patches fit [`WINO_GROUP_BYTES`]: the patches of a group's blocks
    /// of [`MR`] tiles transformed (in parallel), then per panel of output channels and
    /// range of blocks (in parallel) the 16 products, the output transform and the
    /// epilogue, each output row of a tile row in one call. A task's panel of transformed
    /// weights (16 · channels · 64 bytes) is read once per group rather than once per
    /// block, which matters where a few tiles meet many channels (ResNet's last stage).
    fn run_winograd(&self, wz: &Wino8, isa: Isa, x: &Nhwc, res: Option<&[u8]>, y: &mut [u8], par: &dyn Parallel) {
        use super::winograd::{output, patch, transform_inputs};
        let (oh, ow) = self.window.output(x.h, x.w).expect("the window fits the input");
        let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
        let tiles = x.n * th * tw;
        let blocks = tiles.div_ceil(MR);
        let (m, c, depth) = (self.m, self.c, wz.depth());
        let block_len = 16 * MR * depth;
        let per_group = (WINO_GROUP_BYTES / (2 * block_len)).clamp(1, blocks);
        let npanels = m.div_ceil(NR);
        let zrow = vec![self.x_zero; c];
        let avx2 = crate::qgemm::use_avx2(isa);
        let fast = self.ep.fast(isa);
        let yp = SharedMut(y.as_mut_ptr());
        let (pt, pl) = (self.window.pads[0] as isize, self.window.pads[1] as isize);
        // Block `blk`'s tiles: (image, tile row, tile column) each (the last repeated to
        // fill the block) and how many.
        let coords = |blk: usize| {
            let t0 = blk * MR;
            let nt = (tiles - t0).min(MR);
            let at: [(usize, usize, usize); MR] = std::array::from_fn(|r| {
                let t = t0 + r.min(nt - 1);
                (t / (th * tw), t / tw % th, t % tw)
            });
            (at, nt)
        };
        let mut scratch = crate::scratch::take((per_group * block_len).div_ceil(2));
        let v: &mut [i16] = bytemuck::cast_slice_mut(&mut scratch[..]);
        let vp = SharedMut(v.as_mut_ptr());
        for first in (0..blocks).step_by(per_group) {
            let group = (blocks - first).min(per_group);
            par.for_each(group, &|i| {
                let vp = vp;
                let (at, nt) = coords(first + i);
                let px: [[*const u8; 16]; MR] = std::array::from_fn(|r| {
                    let (img, ty, tx) = at[r];
                    patch(x, img, 2 * ty as isize - pt, 2 * tx as isize - pl, &zrow)
                });
                // SAFETY: block i's part of the group's buffer, written by this task only.
                let v = unsafe { std::slice::from_raw_parts_mut(vp.0.add(i * block_len), block_len) };
                transform_inputs(&px[..nt], c, depth, v);
            });
            let splits = (par.threads() * 4).div_ceil(npanels).clamp(1, group);
            let per_split = group.div_ceil(splits);
            par.for_each(npanels * splits, &|task| {
                let (vp, yp) = (vp, yp);
                let (p, split) = (task % npanels, task / npanels);
                let mut acc = Box::new([[[0i32; NR]; MR]; 16]);
                let mut four = Box::new([[[0i32; NR]; MR]; 4]);
                let (j0, init) = (p * NR, &self.init[p]);
                let cols = (m - j0).min(NR);
                for i in split * per_split..((split + 1) * per_split).min(group) {
                    let (at, nt) = coords(first + i);
                    // SAFETY: block i's transformed patches, written before this loop.
                    let v = unsafe { std::slice::from_raw_parts(vp.0.add(i * block_len), block_len) };
                    wz.products(avx2, v, nt, p, &mut acc);
                    // Runs of tiles in one tile row: each of their four output pixels'
                    // rows is one epilogue call (pixels two apart).
                    let mut r = 0;
                    while r < nt {
                        let (img, ty, tx0) = at[r];
                        let e = (r + 1..nt).find(|&e| at[e].0 != img || at[e].1 != ty).unwrap_or(nt);
                        for k in r..e {
                            output(&acc, k, init, &mut four, k - r);
                        }
                        for (q, sums) in four.iter().enumerate() {
                            let (oy, ox0) = (2 * ty + q / 2, 2 * tx0 + q % 2);
                            // The last tile of a row may hold only its left column.
                            let rows = (e - r).min((ow - ox0).div_ceil(2));
                            if oy >= oh || rows == 0 {
                                continue;
                            }
                            let off = ((img * oh + oy) * ow + ox0) * m + j0;
                            let resp = res.map_or(std::ptr::null(), |rr| rr[off..].as_ptr());
                            // SAFETY: pixels ox0, ox0 + 2, … of row oy (rows of them, all
                            // below ow), channels j0..j0 + cols, lie inside `y` and the
                            // residual (n·oh·ow·m bytes each, checked by `run`); tasks
                            // write disjoint tiles.
                            unsafe { self.ep.tile(fast, isa, sums, rows, j0, cols, resp, yp.0.add(off), 2 * m) };
                        }
                        r = e;
                    }
                }
            });
        }
    }
}

/// Where a convolution's taps are: the input's and output's sizes and the window.
struct Geometry {
    h: isize,
    w: isize,
    c: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    window: Window,
    /// 1×1, stride 1, no padding: output pixel `p` reads input pixel `p`.
    pointwise: bool,
}

impl Geometry {
    /// The image, input row and column (before the kernel offsets) of output rows
    /// `r0..r0 + nrows`, the last repeated to fill a tile: one division, then steps.
    #[inline(always)]
    fn origins(&self, r0: usize, nrows: usize) -> [(usize, isize, isize); MR] {
        let (mut img, mut oy, mut ox) = (r0 / (self.oh * self.ow), r0 / self.ow % self.oh, r0 % self.ow);
        let at = |img: usize, oy: usize, ox: usize| {
            let iy = (oy * self.window.stride[0]) as isize - self.window.pads[0] as isize;
            let ix = (ox * self.window.stride[1]) as isize - self.window.pads[1] as isize;
            (img, iy, ix)
        };
        let mut out = [(0, 0, 0); MR];
        for (r, o) in out.iter_mut().enumerate() {
            *o = at(img, oy, ox);
            if r + 1 < nrows {
                ox += 1;
                if ox == self.ow {
                    (ox, oy) = (0, oy + 1);
                    if oy == self.oh {
                        (oy, img) = (0, img + 1);
                    }
                }
            }
        }
        out
    }

    /// Pointers to each kernel position's pixel for rows `r0..r0 + nrows` (the last one
    /// repeated to fill the tile), the zero row where it is padding.
    fn pixels(&self, data: &[u8], r0: usize, nrows: usize, zrow: &[u8], ind: &mut [*const u8]) {
        if self.pointwise {
            // Output pixel = input pixel.
            for (r, p) in ind.iter_mut().take(MR).enumerate() {
                *p = data[(r0 + r.min(nrows - 1)) * self.c..].as_ptr();
            }
            return;
        }
        let [dh, dw] = [self.window.dilation[0] as isize, self.window.dilation[1] as isize];
        for (r, &(img, iy0, ix0)) in self.origins(r0, nrows).iter().enumerate() {
            let base = img * (self.h * self.w) as usize;
            for ky in 0..self.kh {
                let iy = iy0 + ky as isize * dh;
                for kx in 0..self.kw {
                    let ix = ix0 + kx as isize * dw;
                    let inside = iy >= 0 && iy < self.h && ix >= 0 && ix < self.w;
                    ind[(ky * self.kw + kx) * MR + r] = if inside {
                        data[(base + (iy * self.w + ix) as usize) * self.c..].as_ptr()
                    } else {
                        zrow.as_ptr()
                    };
                }
            }
        }
    }

    /// Pointers to each kernel row's first pixel for rows `r0..r0 + nrows`: in place where
    /// the row lies inside the image, else gathered into `edge` (`kc` bytes per row and
    /// tap) with zero points for the padding.
    #[allow(clippy::too_many_arguments)]
    fn rows(
        &self,
        data: &[u8],
        r0: usize,
        nrows: usize,
        zrow: &[u8],
        edge: &mut [u8],
        kc: usize,
        ind: &mut [*const u8],
    ) {
        let dh = self.window.dilation[0] as isize;
        let zero = zrow[0];
        for (r, &(img, iy0, ix0)) in self.origins(r0, nrows).iter().enumerate() {
            let base = img * (self.h * self.w) as usize;
            for ky in 0..self.kh {
                let iy = iy0 + ky as isize * dh;
                let slot = ky * MR + r;
                ind[slot] = if iy < 0 || iy >= self.h {
                    zrow.as_ptr()
                } else if ix0 >= 0 && ix0 + self.kw as isize <= self.w {
                    data[(base + (iy * self.w + ix0) as usize) * self.c..].as_ptr()
                } else {
                    let row = &mut edge[slot * kc..(slot + 1) * kc];
                    row.fill(zero);
                    for kx in 0..self.kw {
                        let ix = ix0 + kx as isize;
                        if ix >= 0 && ix < self.w {
                            let at = (base + (iy * self.w + ix) as usize) * self.c;
                            row[kx * self.c..(kx + 1) * self.c].copy_from_slice(&data[at..at + self.c]);
                        }
                    }
                    row.as_ptr()
                };
            }
        }
    }
}
