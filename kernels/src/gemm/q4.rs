//! Dense-layer weights held as 4-bit codes (LLM weights quantized blockwise along K, as ONNX
//! Runtime's `MatMulNBits` and blocked `DequantizeLinear` write them): weight (k, j) is
//! `(code − zero) · scale` of its block of `block` rows. They stay 4-bit in memory — an
//! eighth of f32's bytes — and each B panel the GEMM reads is widened to f32 into a per-task
//! buffer, giving exactly the f32 weights' bits: `code − zero` is a small integer, so the one
//! rounding is the product's, as in a dequantization to f32.
//!
//! The codes are stored in the layout the GEMM reads, fixed by the ISA's panel width NR and
//! independent of the cache blocking (so a compiler can write it ahead of time):
//! - codes: for each panel of NR columns, its K rows of NR/2 bytes; byte c of a row holds
//!   column c of the panel in its low nibble and column NR/2 + c in its high nibble;
//! - scales: for each panel, its ⌈K/block⌉ blocks of NR f32 (little-endian);
//! - zero points (optional; 0 without them): for each panel, its blocks of NR bytes.
//!
//! Columns past N hold code 0 and scale 0.

use aim_ir::Tensor;

/// The shape of a 4-bit weight: what its bytes must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4Shape {
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
}

impl Q4Shape {
    fn panels(&self) -> usize {
        self.n.div_ceil(self.nr)
    }

    fn blocks(&self) -> usize {
        self.k.div_ceil(self.block)
    }

    fn codes_len(&self) -> usize {
        self.panels() * self.k * self.nr / 2
    }

    fn params(&self) -> usize {
        self.panels() * self.blocks() * self.nr
    }

    /// Bytes of the whole layout: codes, scales, zero points.
    pub fn bytes(&self) -> usize {
        self.codes_len() + 4 * self.params() + if self.zeros { self.params() } else { 0 }
    }

    /// Checks the shape is one the GEMM can read.
    pub fn check(&self) -> Result<(), String> {
        if self.k == 0 || self.n == 0 || self.block == 0 || self.nr == 0 || self.nr % 2 != 0 {
            return Err(format!("4-bit weight {self:?}: k, n, block and an even nr must be positive"));
        }
        Ok(())
    }

    /// Lays out a K×N weight given as codes (`code(p, j)` < 16), scales (`scale(b, j)` of
    /// block b of column j) and zero points (`zero(b, j)` < 16, when `self.zeros`).
    pub fn pack(
        &self,
        code: impl Fn(usize, usize) -> u8,
        scale: impl Fn(usize, usize) -> f32,
        zero: impl Fn(usize, usize) -> u8,
    ) -> Vec<u8> {
        let (nr, half, blocks) = (self.nr, self.nr / 2, self.blocks());
        let mut out = vec![0u8; self.bytes()];
        let (codes, rest) = out.split_at_mut(self.codes_len());
        let (scales, zeros) = rest.split_at_mut(4 * self.params());
        for pj in 0..self.panels() {
            for p in 0..self.k {
                let row = &mut codes[(pj * self.k + p) * half..][..half];
                for (c, byte) in row.iter_mut().enumerate() {
                    let (lo, hi) = (pj * nr + c, pj * nr + half + c);
                    let get = |j: usize| if j < self.n { code(p, j) & 15 } else { 0 };
                    *byte = get(lo) | (get(hi) << 4);
                }
            }
            for b in 0..blocks {
                for c in 0..nr.min(self.n - pj * nr) {
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

/// A 4-bit weight in the GEMM's layout, read in place from a tensor's bytes.
#[derive(Clone, Debug)]
pub struct Q4 {
    pub(crate) shape: Q4Shape,
    bytes: Tensor,
}

impl Q4 {
    /// The layout `shape` over `bytes` (a u8 tensor), or why it does not fit.
    pub fn new(shape: Q4Shape, bytes: Tensor) -> Result<Q4, String> {
        shape.check()?;
        if bytes.dtype() != aim_ir::DType::U8 || bytes.len() != shape.bytes() {
            return Err(format!(
                "a 4-bit {}×{} weight (block {}, panels of {}{}) takes {} bytes, not {} {}",
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
        Ok(Q4 { shape, bytes })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.shape.bytes()
    }

    /// Rows `p0..p0 + rows` of panel `pj`, widened to f32 into `out` (rows × NR).
    pub(crate) fn widen(&self, pj: usize, p0: usize, rows: usize, out: &mut [f32], kind: super::IsaKind) {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3(q: &Q4, pj: usize, p0: usize, rows: usize, out: &mut [f32]) {
                widen(q, pj, p0, rows, out)
            }
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
            unsafe fn v4(q: &Q4, pj: usize, p0: usize, rows: usize, out: &mut [f32]) {
                widen(q, pj, p0, rows, out)
            }
            // SAFETY: panels of an ISA are only made where the CPU has it (`Isa::new`).
            match kind {
                super::IsaKind::Avx512 => return unsafe { v4(self, pj, p0, rows, out) },
                super::IsaKind::Avx2 => return unsafe { v3(self, pj, p0, rows, out) },
                _ => {}
            }
        }
        widen(self, pj, p0, rows, out)
    }
}

/// The widest panel any ISA uses (AVX-512's 32 columns).
const MAX_NR: usize = 32;

#[inline(always)]
fn widen(q: &Q4, pj: usize, p0: usize, rows: usize, out: &mut [f32]) {
    let s = q.shape;
    let (nr, half, blocks) = (s.nr, s.nr / 2, s.blocks());
    assert!(nr <= MAX_NR && p0 + rows <= s.k && out.len() >= rows * nr, "widening outside the weight");
    let all = q.bytes.bytes();
    let codes = &all[(pj * s.k + p0) * half..(pj * s.k + p0 + rows) * half];
    let scales = &all[s.codes_len()..s.codes_len() + 4 * s.params()];
    let zeros = &all[s.codes_len() + 4 * s.params()..];
    let (mut sc, mut zf) = ([0f32; MAX_NR], [0f32; MAX_NR]);
    let mut p = 0;
    while p < rows {
        let b = (p0 + p) / s.block;
        let end = rows.min((b + 1) * s.block - p0);
        let at = (pj * blocks + b) * nr;
        for c in 0..nr {
            let x = &scales[4 * (at + c)..4 * (at + c) + 4];
            sc[c] = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
            zf[c] = if s.zeros { zeros[at + c] as f32 } else { 0.0 };
        }
        for r in p..end {
            let row = &codes[r * half..(r + 1) * half];
            let (lo, hi) = out[r * nr..(r + 1) * nr].split_at_mut(half);
            for c in 0..half {
                lo[c] = ((row[c] & 15) as f32 - zf[c]) * sc[c];
            }
            for c in 0..half {
                hi[c] = ((row[c] >> 4) as f32 - zf[half + c]) * sc[half + c];
            }
        }
        p = end;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{gemm_rows, Blocking, Epilogue, Isa, PackedB, Sequential};
    use super::*;

    /// A 4-bit weight gives the same products, bit for bit, as its f32 dequantization
    /// packed as usual: on every ISA, with and without zero points, with K not a multiple of
    /// the block nor the block of the depth blocking, N not a multiple of the panel, for a
    /// row (the vector-matrix path) and for tiles.
    #[test]
    fn four_bit_weights_multiply_as_their_f32_dequantization() {
        let (k, n, block) = (100, 37, 32);
        let code = |p: usize, j: usize| ((p * 7 + j * 13 + p * j) % 16) as u8;
        let scale = |b: usize, j: usize| 0.01 + (b * 5 + j) as f32 * 0.003;
        let zero = |b: usize, j: usize| ((b + j) % 16) as u8;
        for isa in Isa::all_available() {
            for zeros in [false, true] {
                let shape = Q4Shape { k, n, block, nr: isa.nr(), zeros };
                let bytes = shape.pack(code, scale, zero);
                let t = Tensor::from_vec(&[bytes.len()], bytes);
                let blocking = Blocking { kc: 48, mc: 24 };
                let q = PackedB::from_q4(isa, blocking, Q4::new(shape, t).unwrap()).unwrap();
                let w: Vec<f32> = (0..k * n)
                    .map(|i| {
                        let (p, j) = (i / n, i % n);
                        let z = if zeros { zero(p / block, j) as f32 } else { 0.0 };
                        (code(p, j) as f32 - z) * scale(p / block, j)
                    })
                    .collect();
                let f = PackedB::from_slice(isa, blocking, &w, k, n, false);
                assert!(q.bytes() * 5 < f.bytes(), "{} bytes held against f32's {}", q.bytes(), f.bytes());
                assert_eq!(q.packed().to_vec(), f.packed().to_vec(), "{isa:?}: widened panels");
                for m in [1, 3, 9, 20] {
                    let a: Vec<f32> = (0..m * k).map(|i| ((i * 31 % 17) as f32 - 8.0) / 4.0).collect();
                    let (mut y1, mut y2) = (vec![0f32; m * n], vec![0f32; m * n]);
                    let ep = Epilogue::default();
                    gemm_rows(&a, m, k, blocking, &q, &mut y1, n, &ep, &Sequential);
                    gemm_rows(&a, m, k, blocking, &f, &mut y2, n, &ep, &Sequential);
                    assert!(y1.iter().zip(&y2).all(|(x, y)| x.to_bits() == y.to_bits()), "{isa:?} zeros {zeros} m {m}");
                }
            }
        }
    }

    /// Bytes that do not fit the shape, and panels of another ISA's width, are errors.
    #[test]
    fn mismatched_layouts_are_refused() {
        let shape = Q4Shape { k: 64, n: 16, block: 32, nr: 16, zeros: true };
        let short = Tensor::from_vec(&[shape.bytes() - 1], vec![0u8; shape.bytes() - 1]);
        assert!(Q4::new(shape, short).unwrap_err().contains("takes"));
        assert!(Q4::new(Q4Shape { nr: 3, ..shape }, Tensor::from_vec(&[1], vec![0u8])).is_err());
        let other = if Isa::best().nr() == 16 { 32 } else { 16 };
        let s = Q4Shape { nr: other, ..shape };
        let q = Q4::new(s, Tensor::from_vec(&[s.bytes()], vec![0u8; s.bytes()])).unwrap();
        assert!(PackedB::from_q4(Isa::best(), Blocking { kc: 64, mc: 8 }, q).is_err());
    }
}
