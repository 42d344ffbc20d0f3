//! Packing operands into the panel layouts the microkernels stream through.
//!
//! A is cut into k blocks of depth `kc`, each into panels of MR rows stored column by
//! column (`kc_len × MR`, rows past m zero); B likewise into panels of NR columns stored row
//! by row (`kc_len × NR`, columns past n zero).

use super::{Blocking, Isa};
use crate::util::SharedMut;

/// A (m×k) packed in MR-row panels.
#[derive(Clone, Debug)]
pub struct PackedA {
    pub(crate) isa: Isa,
    /// Rows.
    pub m: usize,
    /// Depth.
    pub k: usize,
    pub(crate) kc: usize,
    pub(crate) mc: usize,
    data: Vec<f32>,
}

/// B (k×n) packed in NR-column panels.
#[derive(Clone, Debug)]
pub struct PackedB {
    pub(crate) isa: Isa,
    /// Depth.
    pub k: usize,
    /// Columns.
    pub n: usize,
    pub(crate) kc: usize,
    data: crate::floats::Floats,
    /// The same panels stored as f16 (then `data` is empty): half the memory, each panel
    /// widened to f32 as the GEMM reads it (see [`PackedB::to_half`]).
    half: Option<Vec<half::f16>>,
    /// Or 4- or 8-bit codes (then `data` is empty), widened per panel (see [`PackedB::from_codes`]).
    coded: Option<Box<super::coded::Coded>>,
}

/// Offset of k block `kb` in a packed operand with `panels` panels of `width`.
/// (Every earlier block has the full depth `kc`.)
fn block_offset(kb: usize, kc: usize, panels: usize, width: usize) -> usize {
    kb * kc * panels * width
}

impl PackedA {
    /// Packs A, where element (i, p) is `get(i, p)`.
    pub fn pack(isa: Isa, blocking: Blocking, m: usize, k: usize, get: impl Fn(usize, usize) -> f32) -> PackedA {
        let mr = isa.mr();
        let kc = blocking.kc.max(1);
        let panels = m.div_ceil(mr);
        let mut data = vec![0f32; panels * mr * k.max(1)];
        for kb in 0..k.div_ceil(kc) {
            let kc_len = kc.min(k - kb * kc);
            let base = block_offset(kb, kc, panels, mr);
            for pi in 0..panels {
                let panel = &mut data[base + pi * kc_len * mr..base + (pi + 1) * kc_len * mr];
                for p in 0..kc_len {
                    for r in 0..mr {
                        let i = pi * mr + r;
                        if i < m {
                            panel[p * mr + r] = get(i, kb * kc + p);
                        }
                    }
                }
            }
        }
        PackedA { isa, m, k, kc, mc: blocking.mc, data }
    }

    /// Packs a row-major matrix (`trans`: A is stored transposed, k×m).
    pub fn from_slice(isa: Isa, blocking: Blocking, a: &[f32], m: usize, k: usize, trans: bool) -> PackedA {
        assert!(a.len() >= m * k, "A holds {} values, {m}×{k} needed", a.len());
        if trans {
            PackedA::pack(isa, blocking, m, k, |i, p| a[p * m + i])
        } else {
            PackedA::pack(isa, blocking, m, k, |i, p| a[i * k + p])
        }
    }

    /// Packs a row-major m×k matrix (activations, every call), a panel per task on `par`,
    /// reading each row sequentially.
    pub fn from_rows(
        isa: Isa,
        blocking: Blocking,
        a: &[f32],
        m: usize,
        k: usize,
        par: &dyn super::Parallel,
    ) -> PackedA {
        assert!(a.len() >= m * k, "A holds {} values, {m}×{k} needed", a.len());
        let mr = isa.mr();
        let kc = blocking.kc.max(1);
        let panels = m.div_ceil(mr);
        let mut data = vec![0f32; panels * mr * k.max(1)];
        let ptr = SharedMut(data.as_mut_ptr());
        let kblocks = k.div_ceil(kc);
        par.for_each(panels, &|pi| {
            let ptr = ptr;
            for kb in 0..kblocks {
                let kc_len = kc.min(k - kb * kc);
                let start = block_offset(kb, kc, panels, mr) + pi * kc_len * mr;
                // SAFETY: each task writes its own panel (kc_len×MR floats from `start`) of
                // every k block.
                let panel = unsafe { std::slice::from_raw_parts_mut(ptr.0.add(start), kc_len * mr) };
                for r in 0..mr.min(m - pi * mr) {
                    let row = &a[(pi * mr + r) * k + kb * kc..(pi * mr + r) * k + kb * kc + kc_len];
                    for (p, &v) in row.iter().enumerate() {
                        panel[p * mr + r] = v;
                    }
                }
            }
        });
        PackedA { isa, m, k, kc, mc: blocking.mc, data }
    }

    /// Element (i, p) of A, read back from its panels (to repack A's values another way).
    pub fn get(&self, i: usize, p: usize) -> f32 {
        assert!(i < self.m && p < self.k, "({i}, {p}) is outside A's {}×{}", self.m, self.k);
        let mr = self.isa.mr();
        let kb = p / self.kc;
        let kc_len = self.kc.min(self.k - kb * self.kc);
        let base = block_offset(kb, self.kc, self.m.div_ceil(mr), mr);
        self.data[base + (i / mr) * kc_len * mr + (p - kb * self.kc) * mr + i % mr]
    }

    pub(crate) fn panel(&self, kb: usize, i: usize) -> *const f32 {
        let mr = self.isa.mr();
        let kc_len = self.kc.min(self.k - (kb * self.kc).min(self.k));
        let base = block_offset(kb, self.kc, self.m.div_ceil(mr), mr);
        self.data[base + i * kc_len * mr..].as_ptr()
    }
}

impl PackedB {
    /// The instruction set the panels were packed for (their width is its `nr`): callers
    /// that split work the way the GEMM does read it.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Packs B, where element (p, j) is `get(p, j)`.
    pub fn pack(isa: Isa, blocking: Blocking, k: usize, n: usize, get: impl Fn(usize, usize) -> f32 + Sync) -> PackedB {
        PackedB::pack_rows(isa, blocking, k, n, &super::Sequential, |p, j0, dst| {
            for (c, d) in dst.iter_mut().enumerate() {
                *d = get(p, j0 + c);
            }
        })
    }

    /// Packs B a strip at a time: `fill(p, j0, dst)` writes elements (p, j0..j0 + dst.len())
    /// (at most NR of them). Panels are filled in parallel on `par`.
    pub fn pack_rows(
        isa: Isa,
        blocking: Blocking,
        k: usize,
        n: usize,
        par: &dyn super::Parallel,
        fill: impl Fn(usize, usize, &mut [f32]) + Sync,
    ) -> PackedB {
        let nr = isa.nr();
        let kc = blocking.kc.max(1);
        let panels = n.div_ceil(nr);
        let mut data = vec![0f32; panels * nr * k.max(1)];
        let ptr = SharedMut(data.as_mut_ptr());
        let kblocks = k.div_ceil(kc);
        par.for_each(panels * kblocks, &|t| {
            let ptr = ptr;
            let (kb, pj) = (t / panels, t % panels);
            let kc_len = kc.min(k - kb * kc);
            let cols = nr.min(n - pj * nr);
            let start = block_offset(kb, kc, panels, nr) + pj * kc_len * nr;
            // SAFETY: each task writes its own panel of block kb: kc_len×NR floats from `start`.
            let panel = unsafe { std::slice::from_raw_parts_mut(ptr.0.add(start), kc_len * nr) };
            for p in 0..kc_len {
                fill(kb * kc + p, pj * nr, &mut panel[p * nr..p * nr + cols]);
            }
        });
        PackedB { isa, k, n, kc, data: crate::floats::Floats::owned(data), half: None, coded: None }
    }

    /// Packs a row-major matrix (`trans`: B is stored transposed, n×k), copying rows of
    /// NR-wide strips directly when not transposed.
    pub fn from_slice(isa: Isa, blocking: Blocking, b: &[f32], k: usize, n: usize, trans: bool) -> PackedB {
        assert!(b.len() >= k * n, "B holds {} values, {k}×{n} needed", b.len());
        if trans {
            return PackedB::pack(isa, blocking, k, n, |p, j| b[j * k + p]);
        }
        let nr = isa.nr();
        let kc = blocking.kc.max(1);
        let panels = n.div_ceil(nr);
        let mut data = vec![0f32; panels * nr * k.max(1)];
        for kb in 0..k.div_ceil(kc) {
            let kc_len = kc.min(k - kb * kc);
            let base = block_offset(kb, kc, panels, nr);
            for pj in 0..panels {
                let cols = nr.min(n - pj * nr);
                for p in 0..kc_len {
                    let src = &b[(kb * kc + p) * n + pj * nr..(kb * kc + p) * n + pj * nr + cols];
                    let at = base + pj * kc_len * nr + p * nr;
                    data[at..at + cols].copy_from_slice(src);
                }
            }
        }
        PackedB { isa, k, n, kc, data: crate::floats::Floats::owned(data), half: None, coded: None }
    }

    /// Packs a row-major matrix given as little-endian f32 bytes at any alignment (`trans`:
    /// stored n×k). Weights read straight from a model file are rarely 4-byte aligned:
    /// packing them from their bytes saves the aligned copy a `&[f32]` view would need.
    pub fn from_bytes(isa: Isa, blocking: Blocking, b: &[u8], k: usize, n: usize, trans: bool) -> PackedB {
        assert!(b.len() >= 4 * k * n, "B holds {} bytes, {k}×{n} floats needed", b.len());
        let at = |i: usize| f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        if trans {
            return PackedB::pack(isa, blocking, k, n, |p, j| at(j * k + p));
        }
        PackedB::pack_rows(isa, blocking, k, n, &super::Sequential, |p, j0, dst| {
            let src = &b[4 * (p * n + j0)..4 * (p * n + j0 + dst.len())];
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        })
    }

    /// Floats a packed k×n B holds for `isa`.
    pub fn packed_len(isa: Isa, k: usize, n: usize) -> usize {
        n.div_ceil(isa.nr()) * isa.nr() * k.max(1)
    }

    /// The packed floats, in panel order (what a `.aim` file stores prepacked); widened
    /// from f16 when the weights are held as f16.
    pub fn packed(&self) -> std::borrow::Cow<'_, [f32]> {
        if self.coded.is_some() {
            let nr = self.isa.nr();
            let mut out = vec![0f32; PackedB::packed_len(self.isa, self.k, self.n)];
            let mut scratch = Vec::new();
            for kb in 0..self.k.div_ceil(self.kc) {
                for j in 0..self.n.div_ceil(nr) {
                    let len = self.kc.min(self.k - kb * self.kc) * nr;
                    let at = block_offset(kb, self.kc, self.n.div_ceil(nr), nr) + j * len;
                    let p = self.panel(kb, j, &mut scratch);
                    // SAFETY: a panel holds `len` floats.
                    out[at..at + len].copy_from_slice(unsafe { std::slice::from_raw_parts(p, len) });
                }
            }
            return std::borrow::Cow::Owned(out);
        }
        match &self.half {
            Some(h) => std::borrow::Cow::Owned(h.iter().map(|v| v.to_f32()).collect()),
            None => std::borrow::Cow::Borrowed(&self.data),
        }
    }

    /// The same weights stored as f16, half the memory: each panel is widened to f32 (F16C
    /// where the CPU has it) into a per-task buffer as the GEMM reads it. Every weight is
    /// rounded to the nearest f16 (relative error at most 2^-11, for magnitudes in f16's
    /// normal range, 6.1e-5 to 65504; smaller ones lose precision, larger ones become
    /// infinite).
    pub fn to_half(&self) -> PackedB {
        let half = self.packed().iter().map(|&v| half::f16::from_f32(v)).collect();
        let (isa, k, n, kc) = (self.isa, self.k, self.n, self.kc);
        PackedB { isa, k, n, kc, data: crate::floats::Floats::owned(Vec::new()), half: Some(half), coded: None }
    }

    /// A weight held as 4- or 8-bit codes in the layout of [`super::coded`], read in place:
    /// each panel is widened to f32 as the GEMM reads it, with the bits of the f32 weight.
    /// An error when the codes were laid out for another panel width than `isa`'s.
    pub fn from_codes(isa: Isa, blocking: Blocking, codes: super::coded::Coded) -> Result<PackedB, String> {
        let s = codes.shape;
        if !isa.nr().is_multiple_of(s.nr) {
            return Err(format!(
                "{}-bit weights laid out in panels of {} columns, the {isa:?} kernels read panels of {}",
                s.bits,
                s.nr,
                isa.nr()
            ));
        }
        let data = crate::floats::Floats::owned(Vec::new());
        Ok(PackedB { isa, k: s.k, n: s.n, kc: blocking.kc.max(1), data, half: None, coded: Some(Box::new(codes)) })
    }

    /// The depth of its k blocks, which the packed layout depends on.
    pub fn kc(&self) -> usize {
        self.kc
    }

    /// Whether the weights are held as 4- or 8-bit codes.
    pub fn is_coded(&self) -> bool {
        self.coded.is_some()
    }

    pub(crate) fn coded(&self) -> Option<&super::coded::Coded> {
        self.coded.as_deref()
    }

    /// How the weights are held, for `aim explore`: "packed at load time" (f32 panels), or
    /// the narrower form each panel is widened from as the GEMM reads it.
    pub fn held(&self) -> String {
        match (&self.coded, &self.half) {
            (Some(c), _) => {
                let s = c.shape;
                format!(
                    "held as {}-bit codes in blocks of {} rows, widened per panel; ≤4 rows: products on the codes",
                    s.bits, s.block
                )
            }
            (None, Some(_)) => "held as f16, widened per panel".into(),
            _ => "packed at load time".into(),
        }
    }

    /// Bytes of the packed floats or codes that lie in a memory-mapped file (a `.aim` file's
    /// prepacked or coded weights), which [`PackedB::release_pages`] can hand back.
    pub fn mapped_bytes(&self) -> usize {
        self.data.mapped_bytes() + self.coded.as_ref().map_or(0, |c| c.mapped_bytes())
    }

    /// Hands the resident pages of packed floats or codes viewed in a mapped file back to
    /// the kernel (read again from the file on the next use); other storage stays.
    pub fn release_pages(&self) {
        self.data.release_pages();
        if let Some(c) = &self.coded {
            c.release_pages();
        }
    }

    /// Whether the weights are held as f16.
    pub fn is_half(&self) -> bool {
        self.half.is_some()
    }

    /// Bytes the packed weights take.
    pub fn bytes(&self) -> usize {
        if let Some(q) = &self.coded {
            return q.bytes();
        }
        self.half.as_ref().map_or(self.data.len() * 4, |h| h.len() * 2)
    }

    /// A packed B over floats packed before for the same `isa` and `blocking` (read in
    /// place); an error when their count does not fit k×n.
    pub fn with_packed(
        isa: Isa,
        blocking: Blocking,
        k: usize,
        n: usize,
        data: crate::floats::Floats,
    ) -> Result<PackedB, String> {
        let want = PackedB::packed_len(isa, k, n);
        if data.len() != want {
            return Err(format!("a packed {k}×{n} weight holds {want} floats, not {}", data.len()));
        }
        Ok(PackedB { isa, k, n, kc: blocking.kc.max(1), data, half: None, coded: None })
    }

    /// Panel `j` of k block `kb` (`kc_len × NR` floats): in place, or widened from f16 into
    /// `scratch` (the caller's, reused from panel to panel).
    /// Panel `j` of k block `kb` as the f32 bytes it is stored as, where it is stored as
    /// f32 (not as f16 or codes, which are widened into a buffer): what a product
    /// prefetches while it works on the panel before.
    pub(crate) fn stored_panel(&self, kb: usize, j: usize) -> Option<&[f32]> {
        if self.coded.is_some() || self.half.is_some() || j >= self.n.div_ceil(self.isa.nr()) {
            return None;
        }
        self.data.get(self.panel_span(kb, j))
    }

    /// Where panel `j` of k block `kb` lies in the stored panels (`data` or `half`).
    fn panel_span(&self, kb: usize, j: usize) -> std::ops::Range<usize> {
        let nr = self.isa.nr();
        let kc_len = self.kc.min(self.k - (kb * self.kc).min(self.k));
        let at = block_offset(kb, self.kc, self.n.div_ceil(nr), nr) + j * kc_len * nr;
        at..at + kc_len * nr
    }

    pub(crate) fn panel(&self, kb: usize, j: usize, scratch: &mut Vec<f32>) -> *const f32 {
        use half::slice::HalfFloatSliceExt;
        let nr = self.isa.nr();
        let kc_len = self.kc.min(self.k - (kb * self.kc).min(self.k));
        if let Some(q) = &self.coded {
            // The GEMM's panel j: the coded layout's panels j·ratio.. side by side.
            let (w, panels) = (q.shape.nr, q.shape.n.div_ceil(q.shape.nr));
            scratch.resize(kc_len * nr, 0.0);
            for h in 0..nr / w {
                let jj = j * (nr / w) + h;
                if jj < panels {
                    q.widen(jj, kb * self.kc, kc_len, &mut scratch[h * w..], nr, self.isa.kind());
                } else {
                    (0..kc_len).for_each(|r| scratch[r * nr + h * w..r * nr + (h + 1) * w].fill(0.0));
                }
            }
            return scratch.as_ptr();
        }
        let span = self.panel_span(kb, j);
        match &self.half {
            None => self.data[span.start..].as_ptr(),
            Some(h) => {
                let len = span.len();
                scratch.resize(len, 0.0);
                h[span].convert_to_f32_slice(&mut scratch[..len]);
                scratch.as_ptr()
            }
        }
    }
}
