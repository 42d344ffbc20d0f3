//! Dense-layer weights held as 4- or 8-bit codes (LLM weights quantized blockwise along K,
//! as ONNX Runtime's `MatMulNBits` and blocked `DequantizeLinear` write them; per-channel
//! int8, one block the whole depth, as `--weights int8` makes them): weight (k, j) is
//! `(code − zero) · scale` of its block of `block` rows. They stay in their bits in memory —
//! an eighth (a quarter) of f32's bytes — and the GEMM reads them two ways:
//! - tiles (many rows of A): each B panel is widened to f32 into a per-task buffer, giving
//!   exactly the f32 weights' bits (`code − zero` is a small integer, so the one rounding is
//!   the product's, as in a dequantization to f32);
//! - a few rows (a decode step): products on the codes in registers, each block's sum scaled
//!   once; or, for 4-bit codes where the layer allows it (ONNX Runtime's `accuracy_level`
//!   4), with the rows quantized per block to int8 and exact integer sums of code ×
//!   activation (AVX2 `vpmaddubsw`: a code is at most 15, so the pair sums cannot saturate;
//!   8-bit codes could, and take the f32 path).
//!
//! The codes are stored in the layout the GEMM reads, fixed by the ISA's panel width NR and
//! independent of the cache blocking (so a compiler can write it ahead of time):
//! - codes: for each panel of NR columns, 4-bit: its ⌈K/2⌉ pairs of rows, NR bytes each;
//!   byte c of pair r holds column c of row 2r in its low nibble and of row 2r + 1 in its
//!   high nibble; 8-bit: its K rows, NR bytes each, byte c of row r column c's code;
//! - scales: for each panel, its ⌈K/block⌉ blocks of NR f32 (little-endian);
//! - zero points (optional; 0 without them): for each panel, its blocks of NR bytes.
//!
//! Columns past N and (4-bit) the row past an odd K hold code 0 and scale 0.

use aim_ir::Tensor;

/// The shape of a coded weight: what its bytes must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodedShape {
    /// Depth (rows of the logical K×N weight).
    pub k: usize,
    /// Columns.
    pub n: usize,
    /// Rows per quantization block.
    pub block: usize,
    /// The panel width the codes were laid out for.
    pub nr: usize,
    /// Whether zero points follow the scales.
    pub zeros: bool,
    /// Bits per code: 4 or 8.
    pub bits: usize,
}

impl CodedShape {
    fn panels(&self) -> usize {
        self.n.div_ceil(self.nr)
    }

    fn blocks(&self) -> usize {
        self.k.div_ceil(self.block)
    }

    /// Rows of NR bytes a panel's codes take: pairs of rows at 4 bits, rows at 8.
    fn code_rows(&self) -> usize {
        if self.bits == 4 {
            self.k.div_ceil(2)
        } else {
            self.k
        }
    }

    fn codes_len(&self) -> usize {
        self.panels() * self.code_rows() * self.nr
    }

    fn params(&self) -> usize {
        self.panels() * self.blocks() * self.nr
    }

    /// Bytes of the whole layout: codes, scales, zero points.
    pub fn bytes(&self) -> usize {
        self.codes_len() + 4 * self.params() + if self.zeros { self.params() } else { 0 }
    }

    /// The shape as a node attribute records it: `[k, n, block, nr, zeros (0 or 1), bits]`.
    pub fn to_ints(&self) -> Vec<i64> {
        [self.k, self.n, self.block, self.nr, self.zeros as usize, self.bits].map(|v| v as i64).to_vec()
    }

    /// The shape [`CodedShape::to_ints`] wrote (five values, without the bits, are a 4-bit
    /// shape, as files written before 8-bit codes record them), or None for a list that is
    /// not one.
    pub fn from_ints(v: &[i64]) -> Option<CodedShape> {
        let (head, bits) = match v {
            [head @ .., bits] if v.len() == 6 => (head, *bits),
            _ => (v, 4),
        };
        match *head {
            [k, n, block, nr, zeros] if [k, n, block, nr].iter().all(|&d| d > 0) && (0..=1).contains(&zeros) => {
                Some(CodedShape {
                    k: k as usize,
                    n: n as usize,
                    block: block as usize,
                    nr: nr as usize,
                    zeros: zeros == 1,
                    bits: usize::try_from(bits).ok()?,
                })
            }
            _ => None,
        }
    }

    /// Checks the shape is one the GEMM can read: 4 or 8 bits, positive dims, a block (even
    /// at 4 bits), a panel of at most 32 columns.
    pub fn check(&self) -> Result<(), String> {
        let ok = self.k > 0
            && self.n > 0
            && self.block > 0
            && matches!(self.bits, 4 | 8)
            && (self.bits == 8 || self.block.is_multiple_of(2))
            && (1..=MAX_NR).contains(&self.nr);
        if !ok {
            return Err(format!(
                "coded weight {self:?}: 4 or 8 bits, k, n positive, a block (even at 4 bits), 1 to {MAX_NR} columns a panel"
            ));
        }
        Ok(())
    }

    /// Lays out a K×N weight given as codes (`code(p, j)`, its `bits` kept), scales
    /// (`scale(b, j)` of block b of column j) and zero points (`zero(b, j)`, when
    /// `self.zeros`).
    pub fn pack(
        &self,
        code: impl Fn(usize, usize) -> u8,
        scale: impl Fn(usize, usize) -> f32,
        zero: impl Fn(usize, usize) -> u8,
    ) -> Vec<u8> {
        if self.bits == 8 {
            return self.pack_rows(code, scale, zero);
        }
        let pair = |r: usize, j: usize| {
            let hi = if 2 * r + 1 < self.k { code(2 * r + 1, j) & 15 } else { 0 };
            (code(2 * r, j) & 15) | (hi << 4)
        };
        self.pack_rows(pair, scale, zero)
    }

    /// [`CodedShape::pack`] from the byte of code row `r` of column `j`: at 4 bits the byte
    /// that holds rows `2r` (low nibble) and `2r + 1` (high nibble, zero past k) — as
    /// `MatMulNBits` stores each column's codes, so that its weights are laid out without
    /// unpacking them; at 8 bits row r's code.
    pub fn pack_rows(
        &self,
        pair: impl Fn(usize, usize) -> u8,
        scale: impl Fn(usize, usize) -> f32,
        zero: impl Fn(usize, usize) -> u8,
    ) -> Vec<u8> {
        let (nr, blocks) = (self.nr, self.blocks());
        let mut out = vec![0u8; self.bytes()];
        let (codes, rest) = out.split_at_mut(self.codes_len());
        let (scales, zeros) = rest.split_at_mut(4 * self.params());
        for pj in 0..self.panels() {
            let cols = nr.min(self.n - pj * nr);
            for r in 0..self.code_rows() {
                let bytes = &mut codes[(pj * self.code_rows() + r) * nr..][..nr];
                for (c, byte) in bytes.iter_mut().enumerate().take(cols) {
                    *byte = pair(r, pj * nr + c);
                }
            }
            for b in 0..blocks {
                for c in 0..cols {
                    let at = (pj * blocks + b) * nr + c;
                    scales[4 * at..4 * at + 4].copy_from_slice(&scale(b, pj * nr + c).to_le_bytes());
                    if self.zeros {
                        zeros[at] = zero(b, pj * nr + c);
                    }
                }
            }
        }
        out
    }
}

/// A coded weight in the GEMM's layout, read in place from a tensor's bytes.
#[derive(Clone, Debug)]
pub struct Coded {
    pub(crate) shape: CodedShape,
    bytes: Tensor,
    /// Few-row products may quantize the rows to int8 per block (ORT's accuracy level 4;
    /// 4-bit codes only).
    int8_rows: bool,
}

/// The widest panel any ISA uses (AVX-512's 32 columns).
const MAX_NR: usize = 32;

/// A block's scales and zero points (as f32) for one panel.
struct Params {
    scale: [f32; MAX_NR],
    zero: [f32; MAX_NR],
}

impl Coded {
    /// The layout `shape` over `bytes` (a u8 tensor), or why it does not fit.
    pub fn new(shape: CodedShape, bytes: Tensor) -> Result<Coded, String> {
        shape.check()?;
        if bytes.dtype() != aim_ir::DType::U8 || bytes.len() != shape.bytes() {
            return Err(format!(
                "a {}-bit {}×{} weight (block {}, panels of {}{}) takes {} bytes, not {} {}",
                shape.bits,
                shape.k,
                shape.n,
                shape.block,
                shape.nr,
                if shape.zeros { ", zero points" } else { "" },
                shape.bytes(),
                bytes.len(),
                bytes.dtype()
            ));
        }
        Ok(Coded { shape, bytes, int8_rows: false })
    }

    /// Lets few-row products quantize each block of a row to int8 (symmetric, scale
    /// max|a|/127) and sum code × activation exactly in integers, as ONNX Runtime does for
    /// `MatMulNBits` at accuracy level 4: the activations' rounding (at most half a step of
    /// their block's scale) is the error added. 8-bit codes keep f32 rows (their pair sums
    /// could saturate `vpmaddubsw`'s 16 bits).
    pub fn with_int8_rows(mut self, yes: bool) -> Coded {
        self.int8_rows = yes && self.shape.bits == 4;
        self
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.shape.bytes()
    }

    /// Bytes of the codes that lie in a memory-mapped file (a `.aim` file's), which
    /// [`Coded::release_pages`] can hand back.
    pub fn mapped_bytes(&self) -> usize {
        if aim_ir::mapped::in_map(self.bytes.bytes()) {
            self.bytes.bytes().len()
        } else {
            0
        }
    }

    /// Hands the resident pages of codes viewed in a mapped file back to the kernel (read
    /// again from the file on the next use); codes in memory stay.
    pub fn release_pages(&self) {
        aim_ir::mapped::release_range(self.bytes.bytes())
    }

    /// How few-row products multiply on an ISA of `kind` here, for `aim explore`.
    pub(crate) fn rows_kernel(&self, kind: super::IsaKind) -> &'static str {
        #[cfg(target_arch = "x86_64")]
        if self.int8_rows && avx2(kind, self.shape.nr) {
            return if kind == super::IsaKind::Avx512 && super::coded_vnni::available() {
                "rows quantized per block to int8, AVX-512 VNNI vpdpbusd"
            } else {
                "rows quantized per block to int8, AVX2 vpmaddubsw"
            };
        }
        let _ = kind;
        "f32 rows, products on the codes in registers"
    }

    fn params(&self, pj: usize, b: usize) -> Params {
        let s = self.shape;
        let all = self.bytes.bytes();
        let at = (pj * s.blocks() + b) * s.nr;
        let (scales, zeros) = (&all[s.codes_len()..], &all[s.codes_len() + 4 * s.params()..]);
        let mut p = Params { scale: [0.0; MAX_NR], zero: [0.0; MAX_NR] };
        for (d, x) in p.scale[..s.nr].iter_mut().zip(scales[4 * at..4 * (at + s.nr)].chunks_exact(4)) {
            *d = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        }
        if s.zeros {
            for (d, &z) in p.zero[..s.nr].iter_mut().zip(&zeros[at..at + s.nr]) {
                *d = z as f32;
            }
        }
        p
    }

    /// Code rows `r0..r1` of panel `pj` (pairs of weight rows at 4 bits).
    fn code_rows(&self, pj: usize, r0: usize, r1: usize) -> &[u8] {
        let s = self.shape;
        &self.bytes.bytes()[(pj * s.code_rows() + r0) * s.nr..(pj * s.code_rows() + r1) * s.nr]
    }

    /// The code rows that hold weight rows `p0..p1` of panel `pj`, and where row p0 is in
    /// them (0, or 1 for a 4-bit odd p0: the high nibbles of the first pair).
    fn rows_of(&self, pj: usize, p0: usize, p1: usize) -> (&[u8], usize) {
        if self.shape.bits == 4 {
            (self.code_rows(pj, p0 / 2, p1.div_ceil(2)), p0 % 2)
        } else {
            (self.code_rows(pj, p0, p1), 0)
        }
    }

    /// Rows `p0..p0 + rows` of panel `pj`, widened to f32 into `out`: row r's NR floats at
    /// `r · stride` (the GEMM's panel may hold several of these side by side).
    pub(crate) fn widen(
        &self,
        pj: usize,
        p0: usize,
        rows: usize,
        out: &mut [f32],
        stride: usize,
        kind: super::IsaKind,
    ) {
        let s = self.shape;
        let nr = s.nr;
        assert!(p0 + rows <= s.k && stride >= nr, "widening outside the weight");
        assert!(rows == 0 || out.len() >= (rows - 1) * stride + nr, "widening outside the panel");
        let mut p = p0;
        while p < p0 + rows {
            let b = p / s.block;
            let end = (p0 + rows).min((b + 1) * s.block);
            let prm = self.params(pj, b);
            let (codes, first) = self.rows_of(pj, p, end);
            let out = &mut out[(p - p0) * stride..];
            #[cfg(target_arch = "x86_64")]
            {
                if avx2(kind, nr) {
                    // SAFETY: AVX2 and AVX-512 panels are only made where the CPU has AVX2 and
                    // FMA (`Isa::new`); `codes` holds the code rows of rows p..end, `out`
                    // their 16 floats each, `stride` apart.
                    // An AVX-512 CPU (`Isa::new` checked) widens a row in one 16-lane vector.
                    unsafe {
                        match (s.bits, kind) {
                            (4, super::IsaKind::Avx512) => {
                                x86::widen16_512::<4>(codes, first, end - p, &prm, out, stride)
                            }
                            (_, super::IsaKind::Avx512) => {
                                x86::widen16_512::<8>(codes, first, end - p, &prm, out, stride)
                            }
                            (4, _) => x86::widen16::<4>(codes, first, end - p, &prm, out, stride),
                            _ => x86::widen16::<8>(codes, first, end - p, &prm, out, stride),
                        }
                    };
                    p = end;
                    continue;
                }
            }
            let _ = kind;
            widen_portable(codes, nr, s.bits, first, end - p, &prm, out, stride);
            p = end;
        }
    }

    /// `acc[i·width + (j − j0)·NR + c] += Σ_p a[i·k + p] · w(p, j·NR + c)` for rows
    /// `i < m ≤ 4` of row-major `a` (m × k) and this layout's panels `j0..j1`: the few-row
    /// product (a decode step) without widening panels to memory.
    pub(crate) fn rows_product(
        &self,
        a: &[f32],
        m: usize,
        (j0, j1): (usize, usize),
        acc: &mut [f32],
        width: usize,
        kind: super::IsaKind,
    ) {
        let s = self.shape;
        let (k, nr, blocks) = (s.k, s.nr, s.blocks());
        assert!(m <= 4 && a.len() >= m * k && j1 <= s.panels(), "a coded product outside its operands");
        assert!(m == 0 || acc.len() >= (m - 1) * width + (j1 - j0) * nr, "accumulators too short");
        #[cfg(target_arch = "x86_64")]
        let int8 = self.int8_rows && avx2(kind, nr);
        // Rows quantized per block: codes (i8, K rounded up to pairs), a scale and the sum of
        // the codes per row and block.
        #[cfg(target_arch = "x86_64")]
        let quant = if int8 { quantize_rows(a, m, k, s.block) } else { Vec::new() };
        // With AVX-512 VNNI the codes multiply the quantized rows in `vpdpbusd`.
        #[cfg(target_arch = "x86_64")]
        let vnni = int8 && kind == super::IsaKind::Avx512 && super::coded_vnni::available();
        let mut sums = [[0f32; MAX_NR]; 4];
        for j in j0..j1 {
            #[cfg(target_arch = "x86_64")]
            if int8 {
                let all = self.bytes.bytes();
                let codes = self.code_rows(j, 0, s.code_rows());
                let params = &all[s.codes_len() + 4 * (j * blocks * nr)..s.codes_len() + 4 * ((j + 1) * blocks * nr)];
                let zeros = s.zeros.then(|| &all[s.codes_len() + 4 * s.params() + j * blocks * nr..][..blocks * nr]);
                let mut rows = [std::ptr::null_mut::<f32>(); 4];
                for (i, r) in rows.iter_mut().enumerate().take(m) {
                    *r = acc[i * width + (j - j0) * nr..][..nr].as_mut_ptr();
                }
                // SAFETY: AVX2 panels are only made where the CPU has it (the VNNI kernel runs
                // where `available` found it); `codes` holds the panel's pairs, `params` and
                // `zeros` its blocks' 16 scales and zero points, `quant` every row's codes;
                // each row pointer has 16 floats of `acc`.
                unsafe { x86::panel_int8(vnni, codes, params, zeros, &quant, m, k, s.block, &rows) };
                continue;
            }
            for b in 0..blocks {
                let (p0, p1) = (b * s.block, k.min((b + 1) * s.block));
                let prm = self.params(j, b);
                let (codes, _) = self.rows_of(j, p0, p1);
                #[cfg(target_arch = "x86_64")]
                {
                    if avx2(kind, nr) {
                        // SAFETY: as above; `a` holds m rows of k values.
                        unsafe { x86::block_f32(codes, s.bits, a, k, m, (p0, p1), &prm, &mut sums) };
                    } else {
                        block_portable(codes, nr, s.bits, a, k, m, (p0, p1), &prm, &mut sums);
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                block_portable(codes, nr, s.bits, a, k, m, (p0, p1), &prm, &mut sums);
                let _ = kind;
                for (i, row) in sums.iter().enumerate().take(m) {
                    let o = &mut acc[i * width + (j - j0) * nr..][..nr];
                    for c in 0..nr {
                        o[c] += row[c] * prm.scale[c];
                    }
                }
            }
        }
    }
}

/// Whether panels of `nr` columns for an ISA of `kind` run the AVX2 kernels (AVX-512 CPUs
/// have AVX2 and FMA too).
#[cfg(target_arch = "x86_64")]
fn avx2(kind: super::IsaKind, nr: usize) -> bool {
    nr == 16 && matches!(kind, super::IsaKind::Avx2 | super::IsaKind::Avx512)
}

/// The panel width a compiler lays coded weights out in for an ISA of `kind`: 16 columns on
/// x86 with AVX2 (an AVX-512 panel of 32 reads two of them side by side, so that both use
/// the same kernels), else the ISA's own panel width.
pub fn panel_width(kind: super::IsaKind) -> usize {
    match kind {
        super::IsaKind::Avx2 | super::IsaKind::Avx512 => 16,
        k => k.nr(),
    }
}

/// Row-major `a` (m × k) quantized per block of `block` values to int8: per row, its codes
/// (k rounded up to pairs, the extra one 0), then per block a scale (f32 bits) and the sum of
/// its codes, both as i32 words after the codes of all rows.
/// Used by the AVX2 kernels, elsewhere only by the tests.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn quantize_rows(a: &[f32], m: usize, k: usize, block: usize) -> Vec<i32> {
    let (kp, blocks) = (k.div_ceil(2) * 2, k.div_ceil(block));
    let words = kp.div_ceil(4);
    let mut out = vec![0i32; m * words + 2 * m * blocks];
    for i in 0..m {
        let mut codes = vec![0i8; words * 4];
        for b in 0..blocks {
            let (p0, p1) = (b * block, k.min((b + 1) * block));
            let row = &a[i * k + p0..i * k + p1];
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = max / 127.0;
            let mut sum = 0i32;
            if scale > 0.0 && scale.is_finite() {
                for (p, v) in row.iter().enumerate() {
                    // Rounded to nearest even by the 1.5·2²³ shift (exact below 2²²; no libm call
                    // where the baseline has no rounding instruction).
                    let x = (v / scale).clamp(-127.0, 127.0);
                    let q = ((x + 12_582_912.0) - 12_582_912.0) as i8;
                    codes[p0 + p] = q;
                    sum += q as i32;
                }
            }
            let at = m * words + 2 * (i * blocks + b);
            out[at] = scale.to_bits() as i32;
            out[at + 1] = sum;
        }
        for (w, c) in out[i * words..(i + 1) * words].iter_mut().zip(codes.chunks_exact(4)) {
            *w = i32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]);
        }
    }
    out
}

/// The code of column `c` in row `r` of code rows `codes` (NR bytes each) of `bits`.
fn code_at(codes: &[u8], nr: usize, bits: usize, r: usize, c: usize) -> u8 {
    if bits == 4 {
        (codes[r / 2 * nr + c] >> (4 * (r % 2))) & 15
    } else {
        codes[r * nr + c]
    }
}

/// `rows` rows from `first` (at 4 bits, 1: the high nibble of the first pair) of one block
/// of a panel.
#[allow(clippy::too_many_arguments)]
fn widen_portable(
    codes: &[u8],
    nr: usize,
    bits: usize,
    first: usize,
    rows: usize,
    prm: &Params,
    out: &mut [f32],
    stride: usize,
) {
    for r in 0..rows {
        for c in 0..nr {
            let q = code_at(codes, nr, bits, first + r, c);
            out[r * stride + c] = (q as f32 - prm.zero[c]) * prm.scale[c];
        }
    }
}

/// `sums[i][c] = Σ_p a[i·k + p] · (code(p, c) − zero[c])` over one block's rows `p0..p1`.
#[allow(clippy::too_many_arguments)]
fn block_portable(
    codes: &[u8],
    nr: usize,
    bits: usize,
    a: &[f32],
    k: usize,
    m: usize,
    (p0, p1): (usize, usize),
    prm: &Params,
    sums: &mut [[f32; MAX_NR]; 4],
) {
    sums.iter_mut().for_each(|s| s.fill(0.0));
    for p in p0..p1 {
        for (i, sum) in sums.iter_mut().enumerate().take(m) {
            let x = a[i * k + p];
            for (c, (s, z)) in sum.iter_mut().zip(&prm.zero).enumerate().take(nr) {
                *s += x * (code_at(codes, nr, bits, p - p0, c) as f32 - z);
            }
        }
    }
}

/// A decode step streams every weight once: asks for the 4-bit codes and the scales of
/// block `b + 8` of a panel whose blocks have `block` rows (past the panel's end they are
/// the next panel's, which follows in memory; a prefetch past the buffer is only a hint).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_ahead(codes: &[u8], params: &[u8], block: usize, b: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    /// How many blocks ahead of the one it sums the decode kernel asks for weights.
    const PREFETCH_BLOCKS: usize = 8;
    let code_bytes = 8 * block;
    let next = codes.as_ptr().wrapping_add(code_bytes * (b + PREFETCH_BLOCKS));
    // SAFETY: prefetches are hints (SSE, in every x86-64 CPU): they never fault.
    unsafe {
        for line in (0..code_bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line) as *const i8);
        }
        _mm_prefetch::<_MM_HINT_T0>(params.as_ptr().wrapping_add(64 * (b + PREFETCH_BLOCKS)) as *const i8);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Params, MAX_NR};
    use std::arch::x86_64::*;

    /// Bytes of code rows that hold `rows` weight rows from `first` at `BITS`.
    fn code_bytes<const BITS: usize>(first: usize, rows: usize) -> usize {
        if BITS == 4 {
            (first + rows).div_ceil(2) * 16
        } else {
            (first + rows) * 16
        }
    }

    /// The 16 codes of weight row `r` of code rows `codes` (at 4 bits its pair's low or high
    /// nibbles), a byte each.
    #[inline(always)]
    unsafe fn row_bytes<const BITS: usize>(codes: *const u8, r: usize) -> __m128i {
        // SAFETY: the caller's pointer holds the row's 16 bytes.
        unsafe {
            if BITS == 4 {
                let b = _mm_loadu_si128(codes.add(r / 2 * 16) as *const __m128i);
                let q = if r.is_multiple_of(2) { b } else { _mm_srli_epi16(b, 4) };
                _mm_and_si128(q, _mm_set1_epi8(15))
            } else {
                _mm_loadu_si128(codes.add(r * 16) as *const __m128i)
            }
        }
    }

    /// Asserts what the widening kernels read and write lies inside `codes` and `out`.
    fn check_widen<const BITS: usize>(codes: &[u8], first: usize, rows: usize, out: &[f32], stride: usize) {
        assert!(codes.len() >= code_bytes::<BITS>(first, rows) && stride >= 16);
        assert!(rows == 0 || out.len() >= (rows - 1) * stride + 16);
    }

    /// [`widen16`] on AVX-512: a row in one vector.
    ///
    /// # Safety
    /// As for [`widen16`], on a CPU with AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen16_512<const BITS: usize>(
        codes: &[u8],
        first: usize,
        rows: usize,
        prm: &Params,
        out: &mut [f32],
        stride: usize,
    ) {
        check_widen::<BITS>(codes, first, rows, out, stride);
        // SAFETY: reads of 16 bytes per code row and writes of 16 floats per row, inside the
        // slices.
        unsafe {
            let (s, z) = (_mm512_loadu_ps(prm.scale.as_ptr()), _mm512_loadu_ps(prm.zero.as_ptr()));
            for r in 0..rows {
                let q = row_bytes::<BITS>(codes.as_ptr(), first + r);
                let w = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), z);
                _mm512_storeu_ps(out.as_mut_ptr().add(stride * r), _mm512_mul_ps(w, s));
            }
        }
    }

    /// The 16 codes of weight row `r` of code rows `codes` as f32 minus the zeros.
    #[inline(always)]
    unsafe fn codes16<const BITS: usize>(codes: *const u8, r: usize, z0: __m256, z1: __m256) -> (__m256, __m256) {
        // SAFETY: the caller's pointer holds the row's 16 bytes.
        unsafe {
            let q = row_bytes::<BITS>(codes, r);
            let f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
            let f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
            (_mm256_sub_ps(f0, z0), _mm256_sub_ps(f1, z1))
        }
    }

    /// [`super::widen_portable`] for AVX2 panels of 16.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `codes` holds the code rows of rows `first..first + rows`,
    /// 16 bytes each, and `out` 16 floats per row, `stride` apart.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn widen16<const BITS: usize>(
        codes: &[u8],
        first: usize,
        rows: usize,
        prm: &Params,
        out: &mut [f32],
        stride: usize,
    ) {
        check_widen::<BITS>(codes, first, rows, out, stride);
        // SAFETY: reads of 16 bytes per code row and writes of 16 floats per row, inside the
        // slices.
        unsafe {
            let (s0, s1) = (_mm256_loadu_ps(prm.scale.as_ptr()), _mm256_loadu_ps(prm.scale.as_ptr().add(8)));
            let (z0, z1) = (_mm256_loadu_ps(prm.zero.as_ptr()), _mm256_loadu_ps(prm.zero.as_ptr().add(8)));
            for r in 0..rows {
                let p = first + r;
                let (w0, w1) = codes16::<BITS>(codes.as_ptr(), p, z0, z1);
                let o = out.as_mut_ptr().add(stride * r);
                _mm256_storeu_ps(o, _mm256_mul_ps(w0, s0));
                _mm256_storeu_ps(o.add(8), _mm256_mul_ps(w1, s1));
            }
        }
    }

    /// [`super::block_portable`] for AVX2 panels of 16, the sums of up to four rows in
    /// registers, two sets over alternate rows.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `codes` holds the code rows of rows `p0..p1` (p0 even at 4
    /// bits), 16 bytes each; `a` holds m ≤ 4 rows of k ≥ p1 values.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn block_f32(
        codes: &[u8],
        bits: usize,
        a: &[f32],
        k: usize,
        m: usize,
        rows: (usize, usize),
        prm: &Params,
        sums: &mut [[f32; MAX_NR]; 4],
    ) {
        // SAFETY: as the caller promised; a constant row count keeps the sums in registers.
        unsafe {
            match (m, bits) {
                (1, 4) => block_f32_m::<1, 4>(codes, a, k, rows, prm, sums),
                (2, 4) => block_f32_m::<2, 4>(codes, a, k, rows, prm, sums),
                (3, 4) => block_f32_m::<3, 4>(codes, a, k, rows, prm, sums),
                (4, 4) => block_f32_m::<4, 4>(codes, a, k, rows, prm, sums),
                (1, _) => block_f32_m::<1, 8>(codes, a, k, rows, prm, sums),
                (2, _) => block_f32_m::<2, 8>(codes, a, k, rows, prm, sums),
                (3, _) => block_f32_m::<3, 8>(codes, a, k, rows, prm, sums),
                (4, _) => block_f32_m::<4, 8>(codes, a, k, rows, prm, sums),
                _ => {}
            }
        }
    }

    /// [`block_f32`] for `M` rows of codes of `BITS`.
    ///
    /// # Safety
    /// As for [`block_f32`] with m = `M`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_f32_m<const M: usize, const BITS: usize>(
        codes: &[u8],
        a: &[f32],
        k: usize,
        (p0, p1): (usize, usize),
        prm: &Params,
        sums: &mut [[f32; MAX_NR]; 4],
    ) {
        let m = M;
        assert!(m <= 4 && p1 <= k && (m == 0 || a.len() >= (m - 1) * k + p1));
        assert!(codes.len() >= code_bytes::<BITS>(0, p1 - p0));
        // SAFETY: reads of 16 code bytes per code row and of a[i·k + p], inside the slices.
        unsafe {
            let (z0, z1) = (_mm256_loadu_ps(prm.zero.as_ptr()), _mm256_loadu_ps(prm.zero.as_ptr().add(8)));
            let zero = _mm256_setzero_ps();
            let mut s = [[zero; 4]; M];
            for p in p0..p1 {
                let (w0, w1) = codes16::<BITS>(codes.as_ptr(), p - p0, z0, z1);
                let odd = 2 * ((p - p0) % 2);
                for (i, si) in s.iter_mut().enumerate() {
                    let x = _mm256_set1_ps(*a.as_ptr().add(i * k + p));
                    si[odd] = _mm256_fmadd_ps(x, w0, si[odd]);
                    si[odd + 1] = _mm256_fmadd_ps(x, w1, si[odd + 1]);
                }
            }
            for i in 0..m {
                _mm256_storeu_ps(sums[i].as_mut_ptr(), _mm256_add_ps(s[i][0], s[i][2]));
                _mm256_storeu_ps(sums[i].as_mut_ptr().add(8), _mm256_add_ps(s[i][1], s[i][3]));
            }
        }
    }

    /// A whole panel's product with the rows quantized to int8 (`quant`, from
    /// [`super::quantize_rows`]), added to `rows` (16 floats each). Per block, two pairs of
    /// rows a step: their 32 bytes of codes become, per 128-bit lane (one pair each), the 16
    /// columns' (row 2r, row 2r + 1) code pairs, which `vpmaddubsw` multiplies by the row's
    /// two activation codes (u8 code at most 15 times i8: exact, at most 3,810) and sums, in
    /// 16 bits over up to 8 pairs a lane, then in 32; then per block
    /// `row += scale · act_scale · (Σ code·q − zero · Σ q)`, exact in f32 until the products.
    ///
    /// With `vnni`, the AVX-512 VNNI kernel (`coded_vnni::panel`) computes the same sums.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA (and, with `vnni`, what `coded_vnni::available` checks);
    /// `codes` holds the panel's ⌈k/2⌉ pairs of 16 bytes; `params` its ⌈k/block⌉ blocks
    /// of 16 f32 scales (bytes, little-endian) and `zeros` as many of 16 bytes; `quant` is
    /// `quantize_rows(a, m, k, block)`; each of the m ≤ 4 row pointers is valid for 16
    /// floats.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn panel_int8(
        vnni: bool,
        codes: &[u8],
        params: &[u8],
        zeros: Option<&[u8]>,
        quant: &[i32],
        m: usize,
        k: usize,
        block: usize,
        rows: &[*mut f32],
    ) {
        use super::super::coded_vnni::panel as vnni_m;
        // SAFETY: as the caller promised. The row count is a constant inside, so that every
        // row's sums stay in registers (a loop over a variable count kept them on the stack:
        // a store-to-load round trip per step).
        macro_rules! rows {
            ($kernel:ident) => {
                match m {
                    1 => $kernel::<1>(codes, params, zeros, quant, k, block, rows),
                    2 => $kernel::<2>(codes, params, zeros, quant, k, block, rows),
                    3 => $kernel::<3>(codes, params, zeros, quant, k, block, rows),
                    4 => $kernel::<4>(codes, params, zeros, quant, k, block, rows),
                    _ => {}
                }
            };
        }
        unsafe {
            if vnni {
                rows!(vnni_m)
            } else {
                rows!(panel_int8_m)
            }
        }
    }

    /// [`panel_int8`] for `M` rows.
    ///
    /// # Safety
    /// As for [`panel_int8`] with m = `M`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn panel_int8_m<const M: usize>(
        codes: &[u8],
        params: &[u8],
        zeros: Option<&[u8]>,
        quant: &[i32],
        k: usize,
        block: usize,
        rows: &[*mut f32],
    ) {
        let m = M;
        let (words, blocks) = ((k.div_ceil(2) * 2).div_ceil(4), k.div_ceil(block));
        assert!(m <= 4 && rows.len() >= m && block.is_multiple_of(2));
        assert!(codes.len() >= k.div_ceil(2) * 16 && params.len() >= blocks * 64);
        assert!(zeros.is_none_or(|z| z.len() >= blocks * 16) && quant.len() >= m * words + 2 * m * blocks);
        // SAFETY: every read is inside the slices as asserted (a step of two pairs reads the
        // activation codes of rows p..p + 4 < 2·⌈k/2⌉, inside the row's `words`); the row
        // pointers are the caller's.
        unsafe {
            let mask = _mm256_set1_epi8(15);
            let acts = quant.as_ptr() as *const u8;
            // Per lane: lane 0 the first pair's two codes, lane 1 the second's.
            let spread = _mm256_setr_epi8(
                0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
            );
            let z = _mm256_setzero_si256();
            let mut out = [[_mm256_setzero_ps(); 2]; M];
            for (i, o) in out.iter_mut().enumerate() {
                *o = [_mm256_loadu_ps(rows[i]), _mm256_loadu_ps(rows[i].add(8))];
            }
            for b in 0..blocks {
                let (p0, p1) = (b * block, k.min((b + 1) * block));
                let (r0, r1) = (p0 / 2, p1.div_ceil(2));
                super::prefetch_ahead(codes, params, block, b);
                // Sums over the block: columns 0..8 and 8..16, per lane, in 32 bits.
                let (mut c0, mut c1) = ([z; M], [z; M]);
                let mut r = r0;
                while r < r1 {
                    let end = r1.min(r + 16);
                    let (mut s0, mut s1) = ([z; M], [z; M]);
                    // Two pairs of rows (32 bytes of codes) per step, two steps per turn.
                    macro_rules! step {
                        ($r:expr) => {{
                            let r = $r;
                            let q = _mm256_loadu_si256(codes.as_ptr().add(16 * r) as *const __m256i);
                            let (lo, hi) = (_mm256_and_si256(q, mask), _mm256_and_si256(_mm256_srli_epi16(q, 4), mask));
                            let (x0, x1) = (_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi));
                            for i in 0..m {
                                let four = (acts.add(4 * i * words + 2 * r) as *const i32).read_unaligned();
                                let a = _mm256_shuffle_epi8(_mm256_set1_epi32(four), spread);
                                s0[i] = _mm256_add_epi16(s0[i], _mm256_maddubs_epi16(x0, a));
                                s1[i] = _mm256_add_epi16(s1[i], _mm256_maddubs_epi16(x1, a));
                            }
                        }};
                    }
                    while r + 4 <= end {
                        step!(r);
                        step!(r + 2);
                        r += 4;
                    }
                    if r + 2 <= end {
                        step!(r);
                        r += 2;
                    }
                    if r < end {
                        // One pair left: lane 1 reads the next pair's bytes with zero codes.
                        let q = _mm256_zextsi128_si256(_mm_loadu_si128(codes.as_ptr().add(16 * r) as *const __m128i));
                        let (lo, hi) = (_mm256_and_si256(q, mask), _mm256_and_si256(_mm256_srli_epi16(q, 4), mask));
                        let (x0, x1) = (_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi));
                        for i in 0..m {
                            let at = acts.add(4 * i * words + 2 * r);
                            let two = i16::from_le_bytes([*at, *at.add(1)]) as u16 as i32;
                            let a = _mm256_shuffle_epi8(_mm256_set1_epi32(two), spread);
                            s0[i] = _mm256_add_epi16(s0[i], _mm256_maddubs_epi16(x0, a));
                            s1[i] = _mm256_add_epi16(s1[i], _mm256_maddubs_epi16(x1, a));
                        }
                        r += 1;
                    }
                    for i in 0..m {
                        let w = |v: __m256i| {
                            _mm256_add_epi32(
                                _mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)),
                                _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)),
                            )
                        };
                        c0[i] = _mm256_add_epi32(c0[i], w(s0[i]));
                        c1[i] = _mm256_add_epi32(c1[i], w(s1[i]));
                    }
                }
                let sc = params.as_ptr().add(64 * b) as *const f32;
                let (sc0, sc1) = (_mm256_loadu_ps(sc), _mm256_loadu_ps(sc.add(8)));
                let (z0, z1) = match zeros {
                    Some(zs) => {
                        let zb = _mm_loadu_si128(zs.as_ptr().add(16 * b) as *const __m128i);
                        let z0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(zb));
                        (z0, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(zb, 8))))
                    }
                    None => (_mm256_setzero_ps(), _mm256_setzero_ps()),
                };
                for i in 0..m {
                    let at = m * words + 2 * (i * blocks + b);
                    let act = _mm256_set1_ps(f32::from_bits(*quant.get_unchecked(at) as u32));
                    let sum = _mm256_set1_ps(*quant.get_unchecked(at + 1) as f32);
                    let t0 = _mm256_mul_ps(_mm256_fnmadd_ps(z0, sum, _mm256_cvtepi32_ps(c0[i])), act);
                    let t1 = _mm256_mul_ps(_mm256_fnmadd_ps(z1, sum, _mm256_cvtepi32_ps(c1[i])), act);
                    out[i][0] = _mm256_fmadd_ps(t0, sc0, out[i][0]);
                    out[i][1] = _mm256_fmadd_ps(t1, sc1, out[i][1]);
                }
            }
            for (i, o) in out.iter().enumerate() {
                _mm256_storeu_ps(rows[i], o[0]);
                _mm256_storeu_ps(rows[i].add(8), o[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{gemm_rows, Blocking, Epilogue, Isa, PackedB, Sequential};
    use super::*;

    /// A 4- or 8-bit weight gives the same tiled products, bit for bit, as its f32
    /// dequantization packed as usual, and few-row products (computed on the codes) within
    /// f32 rounding of exact ones: on every ISA, with and without zero points, with K not a
    /// multiple of the block nor the block of the depth blocking, N not a multiple of the
    /// panel; 8-bit codes also in one block of the whole depth (per channel, odd).
    #[test]
    fn coded_weights_multiply_as_their_f32_dequantization() {
        let (k, n) = (101, 37);
        // The ISA's panel width, and half of it (two coded panels side by side in one of the
        // GEMM's, as AVX-512 reads the AVX2 layout).
        let cases = Isa::all_available().into_iter().flat_map(|i| [(i, i.nr()), (i, i.nr() / 2)]);
        let forms = [(4, 32), (8, 32), (8, k)];
        for ((isa, width), (bits, block)) in cases.flat_map(|c| forms.map(|f| (c, f))) {
            let top = 1usize << bits;
            let code = |p: usize, j: usize| ((p * 7 + j * 13 + p * j * 5) % top) as u8;
            let scale = |b: usize, j: usize| 0.01 + (b * 5 + j) as f32 * 0.003;
            let zero = |b: usize, j: usize| ((b * 37 + j * 11) % top) as u8;
            for zeros in [false, true] {
                let shape = CodedShape { k, n, block, nr: width, zeros, bits };
                let bytes = shape.pack(code, scale, zero);
                let t = Tensor::from_vec(&[bytes.len()], bytes);
                let blocking = Blocking { kc: 48, mc: 24 };
                let q = PackedB::from_codes(isa, blocking, Coded::new(shape, t).unwrap()).unwrap();
                let w: Vec<f32> = (0..k * n)
                    .map(|i| {
                        let (p, j) = (i / n, i % n);
                        let z = if zeros { zero(p / block, j) as f32 } else { 0.0 };
                        (code(p, j) as f32 - z) * scale(p / block, j)
                    })
                    .collect();
                let f = PackedB::from_slice(isa, blocking, &w, k, n, false);
                let ratio = if bits == 4 { 5 } else { 3 };
                assert!(q.bytes() * ratio < f.bytes(), "{} bytes held against f32's {}", q.bytes(), f.bytes());
                assert_eq!(q.packed().to_vec(), f.packed().to_vec(), "{isa:?}: widened panels");
                for m in [1, 3, 9, 20] {
                    let a: Vec<f32> = (0..m * k).map(|i| ((i * 31 % 17) as f32 - 8.0) / 4.0).collect();
                    let (mut y1, mut y2) = (vec![0f32; m * n], vec![0f32; m * n]);
                    let ep = Epilogue::default();
                    gemm_rows(&a, m, k, blocking, &q, &mut y1, n, &ep, &Sequential);
                    gemm_rows(&a, m, k, blocking, &f, &mut y2, n, &ep, &Sequential);
                    if m > 4 {
                        // Tiles: widened panels, the f32 weights' bits.
                        let same = y1.iter().zip(&y2).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{isa:?} width {width} {bits} bits zeros {zeros} m {m}");
                        continue;
                    }
                    // A few rows: products on the codes, scaled per block; against f64.
                    for i in 0..m {
                        for j in 0..n {
                            let terms = (0..k).map(|p| a[i * k + p] as f64 * w[p * n + j] as f64);
                            let (want, mag) = terms.fold((0f64, 0f64), |(s, g), t| (s + t, g + t.abs()));
                            let got = y1[i * n + j] as f64;
                            assert!(
                                (got - want).abs() <= 1e-6 * mag,
                                "{isa:?} width {width} {bits} bits zeros {zeros} m {m} ({i}, {j}): {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Few-row products with the rows quantized to int8 per block (accuracy level 4): exact
    /// integer sums of the quantized rows, so within f32 rounding of an exact product of
    /// those rows (where the ISA has the integer path; elsewhere the f32 one).
    #[test]
    fn int8_rows_are_exact_sums_of_the_quantized_rows() {
        // Depths and blocks with every tail of a step of four pairs (blocks of 12, 4, 6 and
        // 10 rows end inside a step, the last two on an odd pair).
        for (k, block) in [(70, 32), (64, 32), (13, 16), (101, 16), (7, 8), (50, 12), (9, 4), (50, 6), (45, 10)] {
            int8_rows_case(k, block);
        }
    }

    fn int8_rows_case(k: usize, block: usize) {
        let n = 21;
        let code = |p: usize, j: usize| ((p * 11 + j * 5 + p * j) % 16) as u8;
        let scale = |b: usize, j: usize| 0.02 + (b * 3 + j) as f32 * 0.001;
        let zero = |b: usize, j: usize| ((2 * b + j) % 16) as u8;
        let cases = Isa::all_available().into_iter().flat_map(|i| [(i, i.nr()), (i, i.nr() / 2)]);
        for (isa, width) in cases {
            let x86 = matches!(isa.kind(), super::super::IsaKind::Avx2 | super::super::IsaKind::Avx512);
            let int8 = cfg!(target_arch = "x86_64") && x86 && width == 16;
            let shape = CodedShape { k, n, block, nr: width, zeros: true, bits: 4 };
            let bytes = shape.pack(code, scale, zero);
            let q = Coded::new(shape, Tensor::from_vec(&[bytes.len()], bytes)).unwrap().with_int8_rows(true);
            let blocking = Blocking { kc: 64, mc: 24 };
            let q = PackedB::from_codes(isa, blocking, q).unwrap();
            for m in 1..=4 {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 29) as f32 - 14.0) / 3.0).collect();
                let mut y = vec![0f32; m * n];
                gemm_rows(&a, m, k, blocking, &q, &mut y, n, &Epilogue::default(), &Sequential);
                let quant = quantize_rows(&a, m, k, block);
                let words = (k.div_ceil(2) * 2).div_ceil(4);
                let act = |i: usize, p: usize| -> f64 {
                    if !int8 {
                        return a[i * k + p] as f64;
                    }
                    let code = quant[i * words + p / 4].to_le_bytes()[p % 4] as i8 as f64;
                    let sc = f32::from_bits(quant[m * words + 2 * (i * k.div_ceil(block) + p / block)] as u32);
                    code * sc as f64
                };
                for i in 0..m {
                    for j in 0..n {
                        let w = |p: usize| (code(p, j) as f64 - zero(p / block, j) as f64) * scale(p / block, j) as f64;
                        let terms = (0..k).map(|p| act(i, p) * w(p));
                        let (want, mag) = terms.fold((0f64, 0f64), |(s, g), t| (s + t, g + t.abs()));
                        let got = y[i * n + j] as f64;
                        let at = format!("{isa:?} width {width} k {k} block {block} m {m} ({i}, {j})");
                        assert!((got - want).abs() <= 1e-6 * mag, "{at}: {got} vs {want}");
                    }
                }
            }
        }
    }

    /// `aim explore`'s loop nest says how coded weights are read: products on the codes for
    /// a few rows (int8 rows where the layer allows it and the ISA has the kernel), panels
    /// widened per task for many.
    #[test]
    fn schedules_name_how_codes_are_read() {
        let shape = CodedShape { k: 64, n: 40, block: 32, nr: 16, zeros: false, bits: 4 };
        let bytes = shape.pack(|p, j| ((p + j) % 16) as u8, |_, _| 0.5, |_, _| 0);
        for isa in Isa::all_available() {
            for int8 in [false, true] {
                let q =
                    Coded::new(shape, Tensor::from_vec(&[bytes.len()], bytes.clone())).unwrap().with_int8_rows(int8);
                let blocking = Blocking { kc: 64, mc: 24 };
                let Ok(b) = PackedB::from_codes(isa, blocking, q) else { continue };
                let few = super::super::schedule(isa, blocking, 1, 40, 64, Some(&b), 2).join("\n");
                assert!(few.contains("4-bit codes × the row"), "{isa:?}: {few}");
                let x86 = cfg!(target_arch = "x86_64")
                    && matches!(isa.kind(), super::super::IsaKind::Avx2 | super::super::IsaKind::Avx512);
                assert_eq!(few.contains("int8"), int8 && x86, "{isa:?} int8 {int8}: {few}");
                let many = super::super::schedule(isa, blocking, 64, 40, 64, Some(&b), 2).join("\n");
                assert!(many.contains("widened from its codes"), "{isa:?}: {many}");
            }
        }
    }

    /// Bytes that do not fit the shape, and panels of another ISA's width, are errors.
    #[test]
    fn mismatched_layouts_are_refused() {
        let shape = CodedShape { k: 64, n: 16, block: 32, nr: 16, zeros: true, bits: 4 };
        assert!(CodedShape { block: 3, ..shape }.check().is_err());
        assert!(CodedShape { block: 3, bits: 8, ..shape }.check().is_ok());
        assert!(CodedShape { bits: 6, ..shape }.check().is_err());
        // A shape recorded before 8-bit codes (five values) is a 4-bit one.
        assert_eq!(CodedShape::from_ints(&shape.to_ints()[..5]), Some(shape));
        let eight = CodedShape { bits: 8, ..shape };
        assert_eq!(CodedShape::from_ints(&eight.to_ints()), Some(eight));
        let short = Tensor::from_vec(&[shape.bytes() - 1], vec![0u8; shape.bytes() - 1]);
        assert!(Coded::new(shape, short).unwrap_err().contains("takes"));
        assert!(Coded::new(CodedShape { nr: 3, ..shape }, Tensor::from_vec(&[1], vec![0u8])).is_err());
        // A width that does not divide the ISA's panel.
        let other = [12, 32].into_iter().find(|&w| !Isa::best().nr().is_multiple_of(w)).unwrap();
        let s = CodedShape { nr: other, ..shape };
        let q = Coded::new(s, Tensor::from_vec(&[s.bytes()], vec![0u8; s.bytes()])).unwrap();
        assert!(PackedB::from_codes(Isa::best(), Blocking { kc: 64, mc: 8 }, q).is_err());
    }
}
