//! Quantized activations kept as bytes between integer kernels: the u8 NHWC path of
//! statically quantized CNNs.
//!
//! A QDQ model quantizes every activation; where one integer kernel's result is the next
//! one's input, nothing needs it in f32. Here such a value is stored as it is quantized —
//! one byte per value, channels last (NHWC), so that a pixel's channels are the contiguous
//! depth of the integer GEMM and a convolution's operand needs no packing at all — and each
//! kernel requantizes its result to bytes in its epilogue:
//!
//! - [`conv`]: convolutions as an indirect GEMM (pixels × taps·channels × output channels)
//!   on the `vpdpbusd` microkernel: each row of a tile reads its taps through pointers into
//!   the input (or into a row of zero points where the window leaves the image), the s8
//!   weights packed once; the epilogue scales, adds the bias, applies the activation and
//!   optionally a residual add (`Add` of two quantized values, fused) and quantizes;
//! - [`depthwise`]: depthwise convolutions, exact integer sums computed in f32;
//! - [`pool`]: max pooling (bytes compare as their values do: scales are positive);
//! - [`add`]: the sum of two quantized values, quantized;
//! - [`convert`]: the region's edges: f32 NCHW quantized into bytes NHWC, and back.
//!
//! Values are stored in "u8 terms": an s8 value `v` as the byte `v + 128`, its zero point
//! moved with it, so one set of kernels serves both (their differences, which is all the
//! arithmetic sees, are the same).

pub mod add;
pub mod conv;
pub mod convert;
pub mod depthwise;
pub(crate) mod epilogue;
#[cfg(target_arch = "x86_64")]
mod epilogue_avx2;
pub(crate) mod fixes;
pub(crate) mod micro;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod plain;
pub mod pool;
pub(crate) mod sign;
pub(crate) mod widened;
pub(crate) mod winograd;

pub use epilogue::{Out8, Residual8};

/// The quantization of a byte tensor, in u8 terms: value = (byte − zero) · scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q8 {
    /// The scale (positive and finite where a kernel quantizes to it).
    pub scale: f32,
    /// The zero point, in u8 terms (an s8 zero point plus 128).
    pub zero: u8,
}

impl Q8 {
    /// QuantizeLinear to this quantization, exactly: `clamp(round(x / scale) + zero, 0, 255)`
    /// with ties to even (NaN gives 0, as the saturating conversion does).
    #[inline(always)]
    pub fn quantize(self, x: f32) -> u8 {
        byte_range((x / self.scale).round_ties_even() + self.zero as f32) as u8
    }

    /// DequantizeLinear: `(q − zero) · scale`.
    #[inline(always)]
    pub fn dequantize(self, q: u8) -> f32 {
        (q as i32 - self.zero as i32) as f32 * self.scale
    }
}

/// `x` clamped to [0, 255], NaN to 0 (`max` first: `f32::clamp` would keep the NaN), so
/// that the conversion to a byte is exact.
#[inline(always)]
#[allow(clippy::manual_clamp)]
pub(crate) fn byte_range(x: f32) -> f32 {
    x.max(0.0).min(255.0)
}

/// A layer's s8 weights (as bytes), their scale (one, or one per output channel) and an
/// f32 bias (one per output channel).
#[derive(Clone, Copy, Debug)]
pub struct Weights8<'a> {
    /// The weights, `[m, c, kh, kw]` (`[c, 1, kh, kw]` for a depthwise convolution).
    pub w: &'a [u8],
    /// Their scale.
    pub scale: &'a [f32],
    /// The bias.
    pub bias: Option<&'a [f32]>,
}

/// A byte tensor in NHWC order.
#[derive(Clone, Copy, Debug)]
pub struct Nhwc<'a> {
    /// `n·h·w·c` bytes.
    pub data: &'a [u8],
    /// Images.
    pub n: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
    /// Channels.
    pub c: usize,
}

impl Nhwc<'_> {
    /// Whether the bytes hold the shape.
    pub fn fits(&self) -> bool {
        self.n.checked_mul(self.h).and_then(|v| v.checked_mul(self.w)).and_then(|v| v.checked_mul(self.c))
            == Some(self.data.len())
    }
}

/// A 2-D window: kernel, strides, dilations and padding (top, left, bottom, right).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Strides.
    pub stride: [usize; 2],
    /// Dilations.
    pub dilation: [usize; 2],
    /// Padding: top, left, bottom, right.
    pub pads: [usize; 4],
}

impl Window {
    /// Output height and width for an `h × w` input, partial windows dropped (`None` when
    /// the window does not fit or a stride or dilation is zero). Pooling with `ceil_mode`
    /// takes its size from the shared geometry (`ops::window::resolve`) instead.
    pub fn output(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let dim = |x: usize, k: usize, d: usize, s: usize, p0: usize, p1: usize| -> Option<usize> {
            if s == 0 || d == 0 || k == 0 {
                return None;
            }
            let span = (k - 1).checked_mul(d)? + 1;
            let padded = x.checked_add(p0)?.checked_add(p1)?;
            (padded >= span).then(|| (padded - span) / s + 1)
        };
        Some((
            dim(h, self.kernel[0], self.dilation[0], self.stride[0], self.pads[0], self.pads[2])?,
            dim(w, self.kernel[1], self.dilation[1], self.stride[1], self.pads[1], self.pads[3])?,
        ))
    }

    /// Taps per window.
    pub fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }

    /// The input row and column tap `(ky, kx)` of output `(oy, ox)` reads, if inside an
    /// `h × w` input.
    #[inline(always)]
    pub fn source(&self, oy: usize, ox: usize, ky: usize, kx: usize, h: usize, w: usize) -> Option<(usize, usize)> {
        let iy = (oy * self.stride[0] + ky * self.dilation[0]).checked_sub(self.pads[0])?;
        let ix = (ox * self.stride[1] + kx * self.dilation[1]).checked_sub(self.pads[1])?;
        (iy < h && ix < w).then_some((iy, ix))
    }
}

pub(crate) use crate::util::SharedMut;
