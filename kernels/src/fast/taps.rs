//! Rows of transposed convolutions whose kernel equals their stride (each output pixel one
//! tap): `out[i·kw + k] = bias + Σ_c taps[k·C + c] · x[c·stride + i]`, the `kw` taps of a
//! row interleaved as the output holds them. Sixteen pixels at a time with the sums in
//! registers across the input channels, vectorised for the CPU's ISA: a GEMM over so few
//! input channels would spend its time storing and re-reading columns.

use crate::gemm::Isa;
#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;

const L: usize = 16;

/// The most taps per row this kernel takes (`kw`).
pub const MAX_TAPS: usize = 4;

#[inline(always)]
fn rows_kw<const KW: usize>(x: &[f32], stride: usize, taps: &[f32], bias: f32, out: &mut [f32]) {
    let c = taps.len() / KW;
    let w = out.len() / KW;
    let full = w / L * L;
    for i0 in (0..full).step_by(L) {
        let mut a = [[bias; L]; KW];
        for ci in 0..c {
            let xr: &[f32; L] = x[ci * stride + i0..ci * stride + i0 + L].try_into().expect("16 values");
            for (k, ak) in a.iter_mut().enumerate() {
                let tv = taps[k * c + ci];
                for l in 0..L {
                    ak[l] += tv * xr[l];
                }
            }
        }
        // In the output's order: pixel by pixel, its taps side by side.
        for (l, o) in out[i0 * KW..(i0 + L) * KW].chunks_exact_mut(KW).enumerate() {
            let o: &mut [f32; KW] = o.try_into().expect("one pixel's taps");
            for k in 0..KW {
                o[k] = a[k][l];
            }
        }
    }
    for i in full..w {
        for k in 0..KW {
            let t = &taps[k * c..(k + 1) * c];
            out[i * KW + k] = bias + t.iter().enumerate().map(|(ci, &tv)| tv * x[ci * stride + i]).sum::<f32>();
        }
    }
}

#[inline(always)]
fn rows_generic(x: &[f32], stride: usize, taps: &[f32], kw: usize, bias: f32, out: &mut [f32]) {
    match kw {
        1 => rows_kw::<1>(x, stride, taps, bias, out),
        2 => rows_kw::<2>(x, stride, taps, bias, out),
        3 => rows_kw::<3>(x, stride, taps, bias, out),
        _ => rows_kw::<4>(x, stride, taps, bias, out),
    }
}

/// `out[i·kw + k] = bias + Σ_c taps[k·C + c] · x[c·stride + i]` for every pixel `i` of the
/// row (`out.len() / kw` of them) and tap `k`, where `C = taps.len() / kw`.
///
/// Panics unless `kw ≤ MAX_TAPS` and `x` holds `(C - 1)·stride + out.len() / kw` values.
pub fn tap_rows(isa: Isa, x: &[f32], stride: usize, taps: &[f32], kw: usize, bias: f32, out: &mut [f32]) {
    let (c, w) = (taps.len() / kw.max(1), out.len() / kw.max(1));
    assert!(kw > 0 && kw <= MAX_TAPS && c > 0 && x.len() >= (c - 1) * stride + w, "tap rows in bounds");
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(x: &[f32], stride: usize, taps: &[f32], kw: usize, bias: f32, out: &mut [f32]) {
            rows_generic(x, stride, taps, kw, bias, out)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(x: &[f32], stride: usize, taps: &[f32], kw: usize, bias: f32, out: &mut [f32]) {
            rows_generic(x, stride, taps, kw, bias, out)
        }
        // SAFETY: the ISA was checked available when the program was built.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(x, stride, taps, kw, bias, out) },
            IsaKind::Avx2 => return unsafe { v3(x, stride, taps, kw, bias, out) },
            IsaKind::Portable | IsaKind::Neon => {}
        }
    }
    let _ = isa;
    rows_generic(x, stride, taps, kw, bias, out)
}
