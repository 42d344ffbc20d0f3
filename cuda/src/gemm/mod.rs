//! Dense layers (`aim:Dense`: `Y = act(A · W + B + R)`, A `[M, K]`, W `[K, N]`) as tiled
//! PTX GEMMs: 64×64 output tiles per block, 16-deep slices of A and W copied into shared
//! memory with `cp.async` (double-buffered: the next slice loads while this one is
//! multiplied; elements past the matrices' edges are zero-filled, so no read leaves
//! them), and the epilogue (bias, residual, activation) applied to the tile in registers
//! before its one store.
//!
//! Two inner products:
//! - f32 FFMA: 256 threads, each a 4×4 register tile fed by vector loads from shared
//!   memory (A is stored k-major there);
//! - TF32 tensor cores (when the target allows TF32): 4 warps, each a 32×32 warp tile of
//!   2×4 `mma.sync.m16n8k8` with f32 accumulators; operands rounded to TF32
//!   (`cvt.rna.tf32.f32`) as they leave shared memory, whose rows are padded so the
//!   fragment loads hit 32 distinct banks.

mod build;

use super::{GpuTarget, Half, Kernel};
use aim_compiler::ewprog::{Binary, Inst, Operand, Unary};
use aim_kernels::gemm::Activation;

/// Output tile rows and columns per block, and the depth of a shared slice.
const BM: u32 = 64;
const BN: u32 = 64;
const BK: u32 = 16;

/// How the kernel reads A (`[M, K]` per batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ALayout {
    /// Row-major, `batch_stride` elements between batches (0: shared by all).
    Rows {
        /// Elements between batches.
        batch_stride: u64,
    },
    /// The implicit im2col matrix of an NCHW convolution input: row `m` = (image, output
    /// pixel), column `k` = (input channel, kernel row, kernel column); taps in the padding
    /// read as zero (nothing is loaded for them).
    Im2col(ConvGeom),
}

/// How the kernel reads B (`[K, N]` per batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BLayout {
    /// Row-major `[K, N]`.
    Rows {
        /// Elements between batches (0: shared by all).
        batch_stride: u64,
    },
    /// Stored transposed, `[N, K]` row-major (a convolution's `[OC, IC·KH·KW]` weights).
    Cols {
        /// Elements between batches (0: shared by all).
        batch_stride: u64,
    },
    /// Constant weights in half precision, `[N, K']` row-major with K' = K rounded up to
    /// even and the padding zero ([`pack_half`]): multiplied on f16 / bf16 tensor cores.
    Half(Half),
}

/// Packs f32 weights for [`BLayout::Half`]: `w` is `[K, N]` (`cols`: false) or `[N, K]`
/// (true); the result is `[N, K']` in `half`, each weight rounded to nearest even.
pub fn pack_half(w: &[f32], k: usize, n: usize, cols: bool, half: Half) -> aim_ir::Tensor {
    let kp = k.next_multiple_of(2);
    let at = |kk: usize, nn: usize| if cols { w[nn * k + kk] } else { w[kk * n + nn] };
    fn packed<T: std::marker::Copy>(n: usize, k: usize, kp: usize, zero: T, at: impl Fn(usize, usize) -> T) -> Vec<T> {
        let mut v = vec![zero; n * kp];
        for nn in 0..n {
            for kk in 0..k {
                v[nn * kp + kk] = at(kk, nn);
            }
        }
        v
    }
    match half {
        Half::F16 => {
            let v = packed(n, k, kp, half::f16::ZERO, |kk, nn| half::f16::from_f32(at(kk, nn)));
            aim_ir::Tensor::from_vec(&[n, kp], v)
        }
        Half::Bf16 => {
            let v = packed(n, k, kp, half::bf16::ZERO, |kk, nn| half::bf16::from_f32(at(kk, nn)));
            aim_ir::Tensor::from_vec(&[n, kp], v)
        }
    }
}

/// Where the kernel writes Y (and reads the residual).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YLayout {
    /// Row-major `[M, N]` per batch.
    Rows {
        /// Elements between batches.
        batch_stride: u64,
    },
    /// NCHW: row `m` = image `m / hw`, pixel `m % hw`; column = channel.
    Nchw {
        /// Output pixels per image.
        hw: u32,
    },
}

/// A 2-D convolution's geometry (NCHW, one group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeom {
    /// Input channels.
    pub c: u32,
    /// Input height.
    pub h: u32,
    /// Input width.
    pub w: u32,
    /// Kernel height.
    pub kh: u32,
    /// Kernel width.
    pub kw: u32,
    /// Output height.
    pub oh: u32,
    /// Output width.
    pub ow: u32,
    /// Strides (height, width).
    pub stride: [u32; 2],
    /// Dilations (height, width).
    pub dilation: [u32; 2],
    /// Leading pads (top, left); the trailing ones follow from the output size.
    pub pad: [u32; 2],
}

/// A GEMM with its epilogue: `Y[b] = act(A[b] · B[b] + bias + R[b])` for `b < batch`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// Rows of A and Y.
    pub m: u32,
    /// Columns of B and Y.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// Independent products (the grid's z).
    pub batch: u32,
    /// How A is read.
    pub a: ALayout,
    /// How B is read.
    pub b: BLayout,
    /// How Y (and the residual) is laid out.
    pub y: YLayout,
    /// A bias per output column (`bias` parameter).
    pub bias: bool,
    /// A residual laid out as Y (`r` parameter).
    pub residual: bool,
    /// The activation applied last.
    pub activation: Activation,
}

/// The GEMM a dense layer computes: A `[M, K]`, W `[K, N]`, Y `[M, N]`, one batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dense {
    /// Rows of A and Y.
    pub m: u32,
    /// Columns of W and Y.
    pub n: u32,
    /// Columns of A, rows of W.
    pub k: u32,
    /// A bias per output column.
    pub bias: bool,
    /// A residual of Y's shape.
    pub residual: bool,
    /// The activation applied last.
    pub activation: Activation,
}

impl Dense {
    /// The general form.
    pub fn gemm(&self) -> Gemm {
        Gemm {
            m: self.m,
            n: self.n,
            k: self.k,
            batch: 1,
            a: ALayout::Rows { batch_stride: 0 },
            b: BLayout::Rows { batch_stride: 0 },
            y: YLayout::Rows { batch_stride: 0 },
            bias: self.bias,
            residual: self.residual,
            activation: self.activation,
        }
    }
}

/// The activation as an elementwise program over the pre-activation value.
pub fn activation_program(act: Activation) -> Vec<Inst> {
    use Operand::{Const as C, Ref as R};
    let x = Inst::Input(0);
    let un = |u, a| Inst::Unary(u, R(a));
    let bin = |b, a, c| Inst::Binary(b, a, c);
    match act {
        Activation::Identity => vec![x],
        Activation::Relu => vec![x, un(Unary::Relu, 0)],
        Activation::Clip(lo, hi) => vec![x, Inst::Clip(R(0), lo, hi)],
        Activation::LeakyRelu(a) => vec![x, Inst::LeakyRelu(R(0), a)],
        Activation::HardSigmoid(a, b) => {
            vec![x, bin(Binary::Mul, R(0), C(a)), bin(Binary::Add, R(1), C(b)), Inst::Clip(R(2), 0.0, 1.0)]
        }
        Activation::HardSwish => vec![
            x,
            bin(Binary::Mul, R(0), C(1.0 / 6.0)),
            bin(Binary::Add, R(1), C(0.5)),
            Inst::Clip(R(2), 0.0, 1.0),
            bin(Binary::Mul, R(0), R(3)),
        ],
        Activation::Sigmoid => vec![x, un(Unary::Sigmoid, 0)],
        Activation::Silu => vec![x, un(Unary::Sigmoid, 0), bin(Binary::Mul, R(0), R(1))],
        Activation::Tanh => vec![x, un(Unary::Tanh, 0)],
        Activation::Gelu => vec![
            x,
            bin(Binary::Mul, R(0), C(std::f32::consts::FRAC_1_SQRT_2)),
            un(Unary::Erf, 1),
            bin(Binary::Add, R(2), C(1.0)),
            bin(Binary::Mul, R(0), R(3)),
            bin(Binary::Mul, R(4), C(0.5)),
        ],
        Activation::GeluTanh => vec![
            x,
            bin(Binary::Mul, R(0), R(0)),
            bin(Binary::Mul, R(1), R(0)),
            bin(Binary::Mul, R(2), C(0.044_715)),
            bin(Binary::Add, R(0), R(3)),
            bin(Binary::Mul, R(4), C(0.797_884_6)),
            un(Unary::Tanh, 5),
            bin(Binary::Add, R(6), C(1.0)),
            bin(Binary::Mul, R(0), R(7)),
            bin(Binary::Mul, R(8), C(0.5)),
        ],
        // relu(x) + α·(e^min(x,0) − 1): x above 0, α(eˣ − 1) at or below.
        Activation::Elu(a) => vec![
            x,
            bin(Binary::Min, R(0), C(0.0)),
            un(Unary::Exp, 1),
            bin(Binary::Sub, R(2), C(1.0)),
            bin(Binary::Mul, R(3), C(a)),
            un(Unary::Relu, 0),
            bin(Binary::Add, R(5), R(4)),
        ],
    }
}

/// Which inner product a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inner {
    Ffma,
    Tf32,
    /// f16 / bf16 `mma.sync.m16n8k16`: A as for TF32, W as pairs of halves along k.
    Half(Half),
}

impl Inner {
    fn threads(self) -> u32 {
        match self {
            Inner::Ffma => 256,
            Inner::Tf32 | Inner::Half(_) => 128,
        }
    }

    /// Floats per row of the A slice in shared memory and what a row is: FFMA keeps A
    /// k-major (`[BK][BM]`), TF32 m-major with 4 floats of padding (`[BM][BK + 4]`).
    fn a_stride(self) -> u32 {
        match self {
            Inner::Ffma => BM,
            Inner::Tf32 | Inner::Half(_) => BK + 4,
        }
    }

    /// Floats per row of the W slice (`[BK][..]`); for halves, 32-bit words (two halves
    /// along k) per column of the `[BN][..]` slice, padded so that a fragment load's 32
    /// lanes hit 32 banks.
    fn b_stride(self) -> u32 {
        match self {
            Inner::Ffma => BN,
            Inner::Tf32 => BN + 8,
            Inner::Half(_) => BK / 2 + 4,
        }
    }

    fn a_bytes(self) -> u32 {
        4 * match self {
            Inner::Ffma => BK * BM,
            Inner::Tf32 | Inner::Half(_) => BM * (BK + 4),
        }
    }

    fn b_bytes(self) -> u32 {
        match self {
            Inner::Half(_) => 4 * BN * self.b_stride(),
            _ => 4 * BK * self.b_stride(),
        }
    }
}

/// Why a GEMM has no GPU kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge(pub String);

/// The kernel `name(a, w, y[, bias][, r])` for a dense layer.
pub fn kernel(name: &str, d: &Dense, target: &GpuTarget, sources: Vec<String>) -> Result<Kernel, TooLarge> {
    gemm_kernel(name, &d.gemm(), target, sources)
}

/// The highest element index (+ 1) each operand is read or written at.
fn extents(g: &Gemm) -> [u64; 3] {
    let (m, n, k, batch) = (u64::from(g.m), u64::from(g.n), u64::from(g.k), u64::from(g.batch));
    let a = match g.a {
        ALayout::Rows { batch_stride } => (batch - 1) * batch_stride + m * k,
        ALayout::Im2col(c) => {
            let images = m / (u64::from(c.oh) * u64::from(c.ow)).max(1);
            images * u64::from(c.c) * u64::from(c.h) * u64::from(c.w)
        }
    };
    let b = match g.b {
        BLayout::Rows { batch_stride } | BLayout::Cols { batch_stride } => (batch - 1) * batch_stride + k * n,
        BLayout::Half(_) => n * k.next_multiple_of(2),
    };
    let y = match g.y {
        YLayout::Rows { batch_stride } => (batch - 1) * batch_stride + m * n,
        YLayout::Nchw { .. } => m * n,
    };
    [a, b, y]
}

/// The kernel `name(a, w, y[, bias][, r])` for `g` on `target`.
pub fn gemm_kernel(name: &str, g: &Gemm, target: &GpuTarget, sources: Vec<String>) -> Result<Kernel, TooLarge> {
    if g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
        return Err(TooLarge(format!("empty GEMM {}×{}×{} (batch {})", g.m, g.n, g.k, g.batch)));
    }
    // Element indices are 32-bit: every operand must have fewer than 2^32 elements.
    if extents(g).iter().any(|&e| e >= 1 << 32) {
        return Err(TooLarge(format!("a {}×{}×{} GEMM has an operand of 2^32 elements or more", g.m, g.n, g.k)));
    }
    if let (ALayout::Im2col(c), YLayout::Nchw { hw }) = (g.a, g.y) {
        if c.oh * c.ow != hw || g.k != c.c * c.kh * c.kw || !g.m.is_multiple_of(hw) {
            return Err(TooLarge(format!("inconsistent convolution GEMM {g:?}")));
        }
    }
    let grid = [g.n.div_ceil(BN), g.m.div_ceil(BM), g.batch];
    if grid[1] > 65_535 || grid[2] > 65_535 {
        return Err(TooLarge(format!("{} rows × {} batches need more than 65535 tiles in y or z", g.m, g.batch)));
    }
    let inner = match g.b {
        BLayout::Half(h) => Inner::Half(h),
        _ if target.allow_tf32 => Inner::Tf32,
        _ => Inner::Ffma,
    };
    let b = build::build(name, g, inner);
    Ok(Kernel {
        name: name.to_string(),
        shared_bytes: b.shared_bytes(),
        ptx: b.finish(),
        grid,
        block: [inner.threads(), 1, 1],
        sources,
    })
}
