//! The few vector operations the blocked-layout kernels need, over one channel block: a
//! zmm register (16 lanes, AVX-512), a ymm register (8 lanes, AVX2 + FMA), or eight plain
//! floats (portable; the compiler vectorises what it can). The kernels are written once,
//! generic over [`Vf32`], and instantiated inside functions compiled for each ISA.

/// A vector of `LANES` floats: one channel block of the blocked layout.
pub(crate) trait Vf32: Copy {
    /// Floats per vector (the channel block).
    const LANES: usize;
    /// All zeros.
    unsafe fn zero() -> Self;
    /// `v` in every lane.
    unsafe fn splat(v: f32) -> Self;
    /// Loads `LANES` floats at `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// Stores `LANES` floats at `p` (unaligned).
    unsafe fn store(self, p: *mut f32);
    /// `self · b + c`.
    unsafe fn fma(self, b: Self, c: Self) -> Self;
    /// `self + b`.
    unsafe fn add(self, b: Self) -> Self;
    /// `self - b`.
    unsafe fn sub(self, b: Self) -> Self;
    /// `self · b`.
    unsafe fn mul(self, b: Self) -> Self;
    /// Clamps to `[lo, hi]`; a NaN lane stays NaN (ONNX Relu/Clip semantics).
    unsafe fn clamp(self, lo: Self, hi: Self) -> Self;
    /// The larger of `self` and `v`, NaN if either is (max pooling).
    unsafe fn max_nan(self, v: Self) -> Self;
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{F32x16, F32x8};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Vf32;
    use std::arch::x86_64::*;

    /// A zmm register. Its methods must only run inside functions compiled with avx512f.
    #[derive(Clone, Copy)]
    pub(crate) struct F32x16(__m512);

    impl Vf32 for F32x16 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            F32x16(_mm512_setzero_ps())
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            F32x16(_mm512_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            F32x16(_mm512_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm512_storeu_ps(p, self.0)
        }
        #[inline(always)]
        unsafe fn fma(self, b: Self, c: Self) -> Self {
            F32x16(_mm512_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            F32x16(_mm512_add_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            F32x16(_mm512_sub_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            F32x16(_mm512_mul_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn clamp(self, lo: Self, hi: Self) -> Self {
            // max/min return their second operand when either is NaN: x stays NaN.
            F32x16(_mm512_min_ps(hi.0, _mm512_max_ps(lo.0, self.0)))
        }
        #[inline(always)]
        unsafe fn max_nan(self, v: Self) -> Self {
            // max(v, acc) returns acc when either is NaN; then take v where v is NaN.
            let m = _mm512_max_ps(v.0, self.0);
            F32x16(_mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v.0, v.0), v.0))
        }
    }

    /// A ymm register. Its methods must only run inside functions compiled with avx2 and fma.
    #[derive(Clone, Copy)]
    pub(crate) struct F32x8(__m256);

    impl Vf32 for F32x8 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            F32x8(_mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            F32x8(_mm256_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            F32x8(_mm256_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0)
        }
        #[inline(always)]
        unsafe fn fma(self, b: Self, c: Self) -> Self {
            F32x8(_mm256_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            F32x8(_mm256_add_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            F32x8(_mm256_sub_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            F32x8(_mm256_mul_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn clamp(self, lo: Self, hi: Self) -> Self {
            F32x8(_mm256_min_ps(hi.0, _mm256_max_ps(lo.0, self.0)))
        }
        #[inline(always)]
        unsafe fn max_nan(self, v: Self) -> Self {
            let m = _mm256_max_ps(v.0, self.0);
            F32x8(_mm256_blendv_ps(m, v.0, _mm256_cmp_ps::<_CMP_UNORD_Q>(v.0, v.0)))
        }
    }
}

/// Eight floats in plain Rust.
#[derive(Clone, Copy)]
pub(crate) struct Portable8([f32; 8]);

impl Vf32 for Portable8 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Portable8([0.0; 8])
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Portable8([v; 8])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Portable8(std::ptr::read_unaligned(p as *const [f32; 8]))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::ptr::write_unaligned(p as *mut [f32; 8], self.0)
    }
    #[inline(always)]
    unsafe fn fma(self, b: Self, c: Self) -> Self {
        Portable8(std::array::from_fn(|i| self.0[i] * b.0[i] + c.0[i]))
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        Portable8(std::array::from_fn(|i| self.0[i] + b.0[i]))
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        Portable8(std::array::from_fn(|i| self.0[i] - b.0[i]))
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        Portable8(std::array::from_fn(|i| self.0[i] * b.0[i]))
    }
    #[inline(always)]
    unsafe fn clamp(self, lo: Self, hi: Self) -> Self {
        Portable8(std::array::from_fn(|i| crate::gemm::clamp(self.0[i], lo.0[i], hi.0[i])))
    }
    #[inline(always)]
    unsafe fn max_nan(self, v: Self) -> Self {
        Portable8(std::array::from_fn(|i| if v.0[i] > self.0[i] || v.0[i].is_nan() { v.0[i] } else { self.0[i] }))
    }
}
