//! Blockwise sub-byte weight codes stored column by column, as ONNX Runtime's
//! `MatMulNBits` stores them: column `c` holds its `k` codes in blocks of `block`, each
//! block `block · bits / 8` bytes, low bits first. A tensor over such bytes
//! ([`crate::Tensor::from_column_codes`]) reads as the row-major `[k, n]` u8 matrix of the
//! codes, unpacked on first access; kernels that take the packed form
//! ([`crate::Tensor::column_codes`]) read the file's bytes directly and never unpack them.

/// How the codes of a `[k, n]` matrix are packed, column by column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnCodes {
    /// Bits per code (2 to 8).
    pub bits: usize,
    /// Codes per block along k.
    pub block: usize,
    /// Rows (the depth of the product).
    pub k: usize,
    /// Columns.
    pub n: usize,
}

impl ColumnCodes {
    /// Blocks per column.
    pub fn blocks(&self) -> usize {
        self.k.div_ceil(self.block)
    }

    /// Bytes per block.
    pub fn blob(&self) -> usize {
        self.block * self.bits / 8
    }

    /// Bytes the packed form takes, or `None` if the form is not one (bits outside 2..=8
    /// or blocks that are not whole bytes), or too large.
    pub fn packed_len(&self) -> Option<usize> {
        let whole = (2..=8).contains(&self.bits) && self.block > 0 && (self.block * self.bits).is_multiple_of(8);
        whole.then(|| self.n.checked_mul(self.blocks())?.checked_mul(self.blob()))?
    }

    /// The codes of `packed` as a row-major `[k, n]` u8 matrix, in tiles of 64 columns so
    /// that every row's bytes of a tile are written while in cache (a column at a time
    /// would touch a cache line per code). `packed` holds [`Self::packed_len`] bytes.
    pub fn unpack_rows(&self, packed: &[u8]) -> Vec<u8> {
        let (k, cols, bits, block, blob) = (self.k, self.n, self.bits, self.block, self.blob());
        let per_col = self.blocks() * blob;
        let mut out = vec![0u8; k * cols];
        for c0 in (0..cols).step_by(64) {
            for c in c0..cols.min(c0 + 64) {
                let col = &packed[c * per_col..(c + 1) * per_col];
                if bits == 4 {
                    // Two codes a byte, low nibble first; blocks are whole bytes.
                    for (i, &byte) in col.iter().enumerate().take(k.div_ceil(2)) {
                        out[2 * i * cols + c] = byte & 15;
                        if 2 * i + 1 < k {
                            out[(2 * i + 1) * cols + c] = byte >> 4;
                        }
                    }
                } else {
                    for kk in 0..k {
                        out[kk * cols + c] = field(&col[(kk / block) * blob..], kk % block, bits);
                    }
                }
            }
        }
        out
    }
}

/// The `bits`-bit value at position `i` of `packed` (low bits first).
pub fn field(packed: &[u8], i: usize, bits: usize) -> u8 {
    let bit = i * bits;
    let word = packed[bit / 8] as u32 | (packed.get(bit / 8 + 1).copied().unwrap_or(0) as u32) << 8;
    ((word >> (bit % 8)) & ((1 << bits) - 1)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    #[test]
    fn a_column_codes_tensor_reads_as_its_unpacked_rows() {
        // k = 5 in blocks of 4 (two blocks, the second ragged), 2 columns, 4 bits.
        let form = ColumnCodes { bits: 4, block: 4, k: 5, n: 2 };
        assert_eq!(form.packed_len(), Some(8));
        let packed = Tensor::from_vec(&[8], vec![0x21u8, 0x43, 0x05, 0x00, 0xBA, 0xDC, 0x0E, 0x00]);
        let t = Tensor::from_column_codes(packed.clone(), form).expect("sizes agree");
        assert_eq!(t.shape(), [5, 2]);
        assert_eq!(t.bytes(), [1, 10, 2, 11, 3, 12, 4, 13, 5, 14]);
        let (bytes, f) = t.column_codes().expect("the packed form is kept");
        assert_eq!((bytes, f), (packed.bytes(), form));
        // Any other form of the same codes unpacks the same way, one field at a time.
        let two = ColumnCodes { bits: 2, block: 4, k: 4, n: 1 };
        let t = Tensor::from_column_codes(Tensor::from_vec(&[1], vec![0b1110_0100u8]), two).unwrap();
        assert_eq!(t.bytes(), [0, 1, 2, 3]);
        assert!(Tensor::from_column_codes(packed, ColumnCodes { bits: 4, block: 4, k: 9, n: 2 }).is_err());
    }
}
