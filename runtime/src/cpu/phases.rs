//! Rows of the stride phases of a zero-padded plane, shared by the GEMM convolutions and the
//! depthwise ones: phase column `x` of phase `b` holds padded column `x·sw + b`, i.e. input
//! column `x·sw + b − pl`.

use aim_kernels::fast::copy_short;

/// Writes into `drow[x]` input column `x·sw + b − pl` of `srow`, for every `x < drow.len()`
/// whose column lies inside the row, and leaves the other entries (the padding) as they
/// are. Stride 1 is a copy; stride 2 reads pairs of columns so that the compiler vectorises
/// the de-interleave; other strides gather.
#[inline(always)]
pub(super) fn phase_row(srow: &[f32], sw: usize, b: usize, pl: usize, drow: &mut [f32]) {
    let w = srow.len();
    // Phase columns [first, last) read inside the row.
    let first = if b >= pl { 0 } else { (pl - b).div_ceil(sw) };
    let last = if w + pl <= b { 0 } else { (w + pl - b).div_ceil(sw).min(drow.len()) };
    if last <= first {
        return;
    }
    let s0 = first * sw + b - pl;
    let dst = &mut drow[first..last];
    match sw {
        1 => copy_short(dst, &srow[s0..s0 + dst.len()]),
        2 => {
            // Whole pairs first (the last column may have no partner inside the row).
            let pairs = srow[s0..].chunks_exact(2);
            let whole = pairs.len().min(dst.len());
            for (d, p) in dst[..whole].iter_mut().zip(pairs) {
                *d = p[0];
            }
            for (i, d) in dst.iter_mut().enumerate().skip(whole) {
                *d = srow[s0 + 2 * i];
            }
        }
        _ => {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = srow[s0 + sw * i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::phase_row;

    /// Every stride, phase and left padding against the definition.
    #[test]
    fn matches_the_definition() {
        for w in 1..12 {
            let srow: Vec<f32> = (0..w).map(|i| i as f32 + 1.0).collect();
            for sw in 1..4 {
                for pl in 0..4 {
                    for b in 0..sw {
                        for len in 0..10 {
                            let mut got = vec![-1.0; len];
                            phase_row(&srow, sw, b, pl, &mut got);
                            let want: Vec<f32> = (0..len)
                                .map(|x| {
                                    let c = (x * sw + b) as isize - pl as isize;
                                    if c >= 0 && (c as usize) < w {
                                        srow[c as usize]
                                    } else {
                                        -1.0
                                    }
                                })
                                .collect();
                            assert_eq!(got, want, "w {w} sw {sw} b {b} pl {pl} len {len}");
                        }
                    }
                }
            }
        }
    }
}
