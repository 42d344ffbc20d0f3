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
        // Not `copy_from_slice`: that is the memcpy call this function avoids.
        #[allow(clippy::manual_memcpy)]
        for i in 0..n {
            dst[i] = src[i];
        }
    }
}

/// Copies the `B` floats at `at` as one fixed-size value (a vector move).
#[inline(always)]
fn block<const B: usize>(dst: &mut [f32], src: &[f32], at: usize) {
    let s: [f32; B] = src[at..at + B].try_into().expect("in bounds");
    dst[at..at + B].copy_from_slice(&s);
}
