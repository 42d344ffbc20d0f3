//! Copies of short runs of floats (a 7-wide image row, a 32-wide GEMM panel strip) without a
//! call into libc's `memcpy`, whose call and dispatch overhead is larger than the copy itself
//! for such runs; convolution packing does millions of them per inference.

/// Copies `src` into `dst` (equal lengths). Runs of 8 or more move in 8-float blocks, the last
/// block overlapping the one before it; shorter runs in 4-float blocks the same way, and runs
/// under 4 one float at a time. Long runs are left to `copy_from_slice`.
#[inline(always)]
pub fn copy_short(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    assert_eq!(n, src.len(), "copy_short: lengths differ");
    if n > 256 {
        dst.copy_from_slice(src);
    } else if n >= 8 {
        let mut i = 0;
        while i + 8 <= n {
            block::<8>(dst, src, i);
            i += 8;
        }
        if i < n {
            block::<8>(dst, src, n - 8);
        }
    } else if n >= 4 {
        block::<4>(dst, src, 0);
        block::<4>(dst, src, n - 4);
    } else {
        // One case per length: a loop here is what LLVM turns back into the memcpy call this
        // function avoids.
        match n {
            3 => {
                dst[2] = src[2];
                dst[1] = src[1];
                dst[0] = src[0];
            }
            2 => {
                dst[1] = src[1];
                dst[0] = src[0];
            }
            1 => dst[0] = src[0],
            _ => {}
        }
    }
}

/// Zeros `dst` the way [`copy_short`] copies: short runs (the padded edge of a convolution
/// window) without a call into libc's `memset`.
#[inline(always)]
pub fn zero_short(dst: &mut [f32]) {
    const ZEROS: [f32; 256] = [0.0; 256];
    if dst.len() > ZEROS.len() {
        dst.fill(0.0);
    } else {
        copy_short(dst, &ZEROS[..dst.len()]);
    }
}

/// Copies the `B` floats at `at` as one fixed-size value (a vector move).
#[inline(always)]
fn block<const B: usize>(dst: &mut [f32], src: &[f32], at: usize) {
    let s: [f32; B] = src[at..at + B].try_into().expect("in bounds");
    dst[at..at + B].copy_from_slice(&s);
}

/// Copies `src` into `dst` (equal lengths, any element type as bytes) without a call into
/// libc for short runs, as [`copy_short`] does for floats: the rows of a slice or a
/// concatenation of small tensors are often a few elements long.
#[inline(always)]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    let n = dst.len();
    assert_eq!(n, src.len(), "copy_bytes: lengths differ");
    match n {
        0 => {}
        1..=3 => {
            // Ends first and last: overlapping for 1 and 2, exact for 3.
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        4..=7 => bytes_pair::<4>(dst, src),
        8..=15 => bytes_pair::<8>(dst, src),
        16..=31 => bytes_pair::<16>(dst, src),
        32..=512 => {
            let mut i = 0;
            while i + 32 <= n {
                bytes_block::<32>(dst, src, i);
                i += 32;
            }
            if i < n {
                bytes_block::<32>(dst, src, n - 32);
            }
        }
        _ => dst.copy_from_slice(src),
    }
}

/// The first and the last `B` bytes (`B ≤ len < 2B`): the whole run, overlapping in the middle.
#[inline(always)]
fn bytes_pair<const B: usize>(dst: &mut [u8], src: &[u8]) {
    bytes_block::<B>(dst, src, 0);
    bytes_block::<B>(dst, src, dst.len() - B);
}

/// Copies the `B` bytes at `at` as one fixed-size value.
#[inline(always)]
fn bytes_block<const B: usize>(dst: &mut [u8], src: &[u8], at: usize) {
    let s: [u8; B] = src[at..at + B].try_into().expect("in bounds");
    dst[at..at + B].copy_from_slice(&s);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length up to past the libc cutoff, at every offset of a few: each copy writes
    /// exactly its run (neighbours untouched) with the source's values.
    #[test]
    fn short_copies_write_exactly_their_run() {
        for n in 0..600usize {
            for at in 0..3usize {
                let src: Vec<u8> = (0..n).map(|i| (i * 7 + 1) as u8).collect();
                let mut dst = vec![0xAAu8; n + 6];
                copy_bytes(&mut dst[at..at + n], &src);
                assert_eq!(&dst[at..at + n], &src[..], "bytes n={n} at={at}");
                assert!(dst[..at].iter().chain(&dst[at + n..]).all(|&b| b == 0xAA), "n={n} at={at}");
                let fsrc: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
                let mut fdst = vec![-1f32; n + 6];
                copy_short(&mut fdst[at..at + n], &fsrc);
                assert_eq!(&fdst[at..at + n], &fsrc[..], "floats n={n} at={at}");
                assert!(fdst[..at].iter().chain(&fdst[at + n..]).all(|&v| v == -1.0), "n={n} at={at}");
                zero_short(&mut fdst[at..at + n]);
                assert!(fdst[at..at + n].iter().all(|&v| v == 0.0), "zeros n={n} at={at}");
                assert!(fdst[..at].iter().chain(&fdst[at + n..]).all(|&v| v == -1.0), "zeros n={n} at={at}");
            }
        }
    }
}
