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

use super::elementwise::program;
use super::ptx::{Class, Kernel as Builder, Reg};
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
    let b = build(name, g, inner);
    Ok(Kernel {
        name: name.to_string(),
        shared_bytes: b.shared_bytes(),
        ptx: b.finish(),
        grid,
        block: [inner.threads(), 1, 1],
        sources,
    })
}

/// One element of a slice copy.
enum Copy {
    /// Contiguous along k: the thread's source address before the slice offset, whether
    /// its row (A) or column (W) is inside the matrix, its k within the slice, its shared
    /// destination before the buffer offset, and the slice's byte step per unit of k0.
    Linear { src: Reg, inside: Reg, k: Reg, dst: Reg, step: u32 },
    /// An im2col element: whether its row is inside, its image's first input element, the
    /// top-left input row and column of its window, its k within the slice, its
    /// destination.
    Im2col { inside: Reg, base: Reg, ih0: Reg, iw0: Reg, k: Reg, dst: Reg },
}

fn build(name: &str, g: &Gemm, inner: Inner) -> Builder {
    let mut k = Builder::new(name);
    let a = k.ptr_param("a");
    let w = k.ptr_param("w");
    let y = k.ptr_param("y");
    let bias = g.bias.then(|| k.ptr_param("bias"));
    let res = g.residual.then(|| k.ptr_param("r"));
    let buf_bytes = inner.a_bytes() + inner.b_bytes();
    let smem = k.shared("tiles", 2 * buf_bytes as usize);
    let b_smem = k.op2(Class::B32, "add.u32", smem, inner.a_bytes());
    let tid = k.op1(Class::B32, "mov.u32", "%tid.x");
    let bx = k.op1(Class::B32, "mov.u32", "%ctaid.x");
    let by = k.op1(Class::B32, "mov.u32", "%ctaid.y");
    let bz = k.op1(Class::B32, "mov.u32", "%ctaid.z");
    let bm = k.op2(Class::B32, "mul.lo.u32", by, BM);
    let bn = k.op2(Class::B32, "mul.lo.u32", bx, BN);
    let threads = inner.threads();
    // This batch's operands.
    let offset = |k: &mut Builder, base: Reg, stride: u64| -> Reg {
        if stride == 0 {
            return base;
        }
        let e = k.op2(Class::B32, "mul.lo.u32", bz, stride as u32);
        let bytes = k.op2(Class::B64, "mul.wide.u32", e, 4);
        k.op2(Class::B64, "add.s64", base, bytes)
    };
    let a = match g.a {
        ALayout::Rows { batch_stride } => offset(&mut k, a, batch_stride),
        ALayout::Im2col(_) => a,
    };
    let w = match g.b {
        BLayout::Rows { batch_stride } | BLayout::Cols { batch_stride } => offset(&mut k, w, batch_stride),
        BLayout::Half(_) => w,
    };
    let (y, res) = match g.y {
        YLayout::Rows { batch_stride } => {
            (offset(&mut k, y, batch_stride), res.map(|r| offset(&mut k, r, batch_stride)))
        }
        YLayout::Nchw { .. } => (y, res),
    };

    // Slice copies: A's BM×BK and B's BK×BN elements spread over the threads.
    k.comment("slice copies: each thread's elements of A and B");
    let mut copies_a = Vec::new();
    for j in 0..(BM * BK) / threads {
        let e = k.op2(Class::B32, "add.u32", tid, j * threads);
        let ml = k.op2(Class::B32, "shr.u32", e, BK.trailing_zeros());
        let kl = k.op2(Class::B32, "and.b32", e, BK - 1);
        let row = k.op2(Class::B32, "add.u32", bm, ml);
        let inside = k.op2(Class::Pred, "setp.lt.u32", row, g.m);
        let sidx = match inner {
            Inner::Ffma => k.op3(Class::B32, "mad.lo.u32", kl, inner.a_stride(), ml),
            Inner::Tf32 | Inner::Half(_) => k.op3(Class::B32, "mad.lo.u32", ml, inner.a_stride(), kl),
        };
        let dst = k.op3(Class::B32, "mad.lo.u32", sidx, 4, smem);
        copies_a.push(match g.a {
            ALayout::Rows { .. } => {
                let idx = k.op3(Class::B32, "mad.lo.u32", row, g.k, kl);
                let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
                let src = k.op2(Class::B64, "add.s64", a, off);
                Copy::Linear { src, inside, k: kl, dst, step: 4 }
            }
            ALayout::Im2col(c) => {
                let hw = c.oh * c.ow;
                let img = k.op2(Class::B32, "div.u32", row, hw);
                let p = k.op2(Class::B32, "rem.u32", row, hw);
                let oh = k.op2(Class::B32, "div.u32", p, c.ow);
                let ow = k.op2(Class::B32, "rem.u32", p, c.ow);
                let ih = k.op2(Class::B32, "mul.lo.s32", oh, c.stride[0]);
                let ih0 = k.op2(Class::B32, "sub.s32", ih, c.pad[0]);
                let iw = k.op2(Class::B32, "mul.lo.s32", ow, c.stride[1]);
                let iw0 = k.op2(Class::B32, "sub.s32", iw, c.pad[1]);
                let base = k.op2(Class::B32, "mul.lo.u32", img, c.c * c.h * c.w);
                Copy::Im2col { inside, base, ih0, iw0, k: kl, dst }
            }
        });
    }
    let mut copies_b = Vec::new();
    if let BLayout::Half(_) = g.b {
        // Words of two halves along k: BN columns × BK/2 words, from [N][K'] halves.
        let kp = g.k.next_multiple_of(2);
        for j in 0..(BK / 2 * BN) / threads {
            let e = k.op2(Class::B32, "add.u32", tid, j * threads);
            let nl = k.op2(Class::B32, "shr.u32", e, (BK / 2).trailing_zeros());
            let kw = k.op2(Class::B32, "and.b32", e, BK / 2 - 1);
            let kl = k.op2(Class::B32, "shl.b32", kw, 1);
            let col = k.op2(Class::B32, "add.u32", bn, nl);
            let inside = k.op2(Class::Pred, "setp.lt.u32", col, g.n);
            let idx = k.op3(Class::B32, "mad.lo.u32", col, kp, kl);
            let off = k.op2(Class::B64, "mul.wide.u32", idx, 2);
            let src = k.op2(Class::B64, "add.s64", w, off);
            let sidx = k.op3(Class::B32, "mad.lo.u32", nl, inner.b_stride(), kw);
            let dst = k.op3(Class::B32, "mad.lo.u32", sidx, 4, b_smem);
            copies_b.push(Copy::Linear { src, inside, k: kl, dst, step: 2 });
        }
    }
    for j in 0..if matches!(g.b, BLayout::Half(_)) { 0 } else { (BK * BN) / threads } {
        let e = k.op2(Class::B32, "add.u32", tid, j * threads);
        let kl = k.op2(Class::B32, "shr.u32", e, BN.trailing_zeros());
        let nl = k.op2(Class::B32, "and.b32", e, BN - 1);
        let col = k.op2(Class::B32, "add.u32", bn, nl);
        let inside = k.op2(Class::Pred, "setp.lt.u32", col, g.n);
        let (idx, step) = match g.b {
            BLayout::Rows { .. } => (k.op3(Class::B32, "mad.lo.u32", kl, g.n, col), 4 * g.n),
            BLayout::Cols { .. } | BLayout::Half(_) => (k.op3(Class::B32, "mad.lo.u32", col, g.k, kl), 4),
        };
        let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
        let src = k.op2(Class::B64, "add.s64", w, off);
        let sidx = k.op3(Class::B32, "mad.lo.u32", kl, inner.b_stride(), nl);
        let dst = k.op3(Class::B32, "mad.lo.u32", sidx, 4, b_smem);
        copies_b.push(Copy::Linear { src, inside, k: kl, dst, step });
    }
    // Issues the copies of the slice starting at k0 into the buffer at byte offset `buf`.
    let issue = |k: &mut Builder, k0: Reg, buf: Reg| {
        for (copies, base) in [(&copies_a, a), (&copies_b, w)] {
            for c in copies {
                let (ok, src, dst) = match *c {
                    Copy::Linear { src, inside, k: kl, dst, step } => {
                        let kk = k.op2(Class::B32, "add.u32", k0, kl);
                        let in_k = k.op2(Class::Pred, "setp.lt.u32", kk, g.k);
                        let ok = k.op2(Class::Pred, "and.pred", in_k, inside);
                        let delta = k.op2(Class::B64, "mul.wide.u32", k0, step);
                        (ok, k.op2(Class::B64, "add.s64", src, delta), dst)
                    }
                    Copy::Im2col { inside, base: img_base, ih0, iw0, k: kl, dst } => {
                        let ALayout::Im2col(cg) = g.a else { unreachable!("im2col copies come from im2col layouts") };
                        let taps = cg.kh * cg.kw;
                        let kk = k.op2(Class::B32, "add.u32", k0, kl);
                        let in_k = k.op2(Class::Pred, "setp.lt.u32", kk, g.k);
                        let ok = k.op2(Class::Pred, "and.pred", in_k, inside);
                        let ic = k.op2(Class::B32, "div.u32", kk, taps);
                        let t = k.op2(Class::B32, "rem.u32", kk, taps);
                        let kh = k.op2(Class::B32, "div.u32", t, cg.kw);
                        let kw = k.op2(Class::B32, "rem.u32", t, cg.kw);
                        let ih = k.op3(Class::B32, "mad.lo.s32", kh, cg.dilation[0], ih0);
                        let iw = k.op3(Class::B32, "mad.lo.s32", kw, cg.dilation[1], iw0);
                        // Negative rows and columns compare as large unsigned values.
                        let in_h = k.op2(Class::Pred, "setp.lt.u32", ih, cg.h);
                        let in_w = k.op2(Class::Pred, "setp.lt.u32", iw, cg.w);
                        let ok = k.op2(Class::Pred, "and.pred", ok, in_h);
                        let ok = k.op2(Class::Pred, "and.pred", ok, in_w);
                        let row = k.op3(Class::B32, "mad.lo.u32", ic, cg.h, ih);
                        let idx = k.op3(Class::B32, "mad.lo.u32", row, cg.w, iw);
                        let idx = k.op2(Class::B32, "add.u32", idx, img_base);
                        let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
                        (ok, k.op2(Class::B64, "add.s64", a, off), dst)
                    }
                };
                // Outside the matrix nothing is read (size 0) from an address inside it.
                let src = k.op3(Class::B64, "selp.b64", src, base, ok);
                let size = k.op3(Class::B32, "selp.b32", 4, 0, ok);
                let dst = k.op2(Class::B32, "add.u32", dst, buf);
                k.ins(format!("cp.async.ca.shared.global [{dst}], [{src}], 4, {size};"));
            }
        }
        k.ins("cp.async.commit_group;");
    };
    // Accumulators and the thread's place in the tile.
    let (accs, places, frag) = match inner {
        Inner::Ffma => {
            let ty = k.op2(Class::B32, "shr.u32", tid, 4);
            let tx = k.op2(Class::B32, "and.b32", tid, 15);
            let row0 = k.op2(Class::B32, "shl.b32", ty, 2);
            let col0 = k.op2(Class::B32, "shl.b32", tx, 2);
            let a_rd = k.op3(Class::B32, "mad.lo.u32", row0, 4, smem);
            let b_rd = k.op3(Class::B32, "mad.lo.u32", col0, 4, b_smem);
            let accs: Vec<Reg> = (0..16).map(|_| k.fconst(0.0)).collect();
            let places: Vec<(u32, u32)> = (0..16).map(|e| (e / 4, e % 4)).collect();
            (accs, places, (row0, col0, a_rd, b_rd))
        }
        Inner::Tf32 | Inner::Half(_) => {
            let half = matches!(inner, Inner::Half(_));
            let warp = k.op2(Class::B32, "shr.u32", tid, 5);
            let lane = k.op2(Class::B32, "and.b32", tid, 31);
            let g = k.op2(Class::B32, "shr.u32", lane, 2);
            let q = k.op2(Class::B32, "and.b32", lane, 3);
            let wm = k.op2(Class::B32, "shr.u32", warp, 1);
            let wm = k.op2(Class::B32, "shl.b32", wm, 5);
            let wn = k.op2(Class::B32, "and.b32", warp, 1);
            let wn = k.op2(Class::B32, "shl.b32", wn, 5);
            let row0 = k.op2(Class::B32, "add.u32", wm, g);
            let q2 = k.op2(Class::B32, "shl.b32", q, 1);
            let col0 = k.op2(Class::B32, "add.u32", wn, q2);
            // Fragment bases: A[row0][q], W[q][wn + g] (halves: A[row0][2q], the word of
            // W's column wn + g holding k = 2q, 2q + 1).
            let ak = if half { q2 } else { q };
            let ai = k.op3(Class::B32, "mad.lo.u32", row0, inner.a_stride(), ak);
            let a_rd = k.op3(Class::B32, "mad.lo.u32", ai, 4, smem);
            let bcol = k.op2(Class::B32, "add.u32", wn, g);
            let bi = if half {
                k.op3(Class::B32, "mad.lo.u32", bcol, inner.b_stride(), q)
            } else {
                k.op3(Class::B32, "mad.lo.u32", q, inner.b_stride(), bcol)
            };
            let b_rd = k.op3(Class::B32, "mad.lo.u32", bi, 4, b_smem);
            let accs: Vec<Reg> = (0..32).map(|_| k.fconst(0.0)).collect();
            // Tile (i, j), register r: row i·16 + 8·(r/2), column j·8 + r%2.
            let places: Vec<(u32, u32)> =
                (0..32).map(|e| ((e / 16) * 16 + 8 * ((e % 4) / 2), ((e / 4) % 4) * 8 + e % 2)).collect();
            (accs, places, (row0, col0, a_rd, b_rd))
        }
    };
    let (row0, col0, a_rd, b_rd) = frag;

    // The k loop over slices, double-buffered.
    let tiles = g.k.div_ceil(BK);
    let t = k.op1(Class::B32, "mov.u32", 0);
    let zero = k.op1(Class::B32, "mov.u32", 0);
    issue(&mut k, zero, zero);
    let (head, last, sync) = (k.label("slice"), k.label("last_slice"), k.label("slice_ready"));
    k.place(&head);
    let t1 = k.op2(Class::B32, "add.u32", t, 1);
    let cur_sel = k.op2(Class::B32, "and.b32", t, 1);
    let cur = k.op2(Class::B32, "mul.lo.u32", cur_sel, buf_bytes);
    let more = k.op2(Class::Pred, "setp.lt.u32", t1, tiles);
    k.ins(format!("@!{more} bra {last};"));
    let nxt_sel = k.op2(Class::B32, "and.b32", t1, 1);
    let nxt = k.op2(Class::B32, "mul.lo.u32", nxt_sel, buf_bytes);
    let k0 = k.op2(Class::B32, "mul.lo.u32", t1, BK);
    issue(&mut k, k0, nxt);
    k.ins("cp.async.wait_group 1;");
    k.ins(format!("bra.uni {sync};"));
    k.place(&last);
    k.ins("cp.async.wait_group 0;");
    k.place(&sync);
    k.ins("bar.sync 0;");
    let a_cur = k.op2(Class::B32, "add.u32", a_rd, cur);
    let b_cur = k.op2(Class::B32, "add.u32", b_rd, cur);
    match inner {
        Inner::Ffma => {
            for kk in 0..BK {
                let av: Vec<Reg> = (0..4).map(|_| k.reg(Class::F32)).collect();
                let bv: Vec<Reg> = (0..4).map(|_| k.reg(Class::F32)).collect();
                let list = |v: &[Reg]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
                k.ins(format!("ld.shared.v4.f32 {{{}}}, [{a_cur}+{}];", list(&av), 4 * kk * BM));
                k.ins(format!("ld.shared.v4.f32 {{{}}}, [{b_cur}+{}];", list(&bv), 4 * kk * BN));
                for i in 0..4 {
                    for j in 0..4 {
                        let c = accs[i * 4 + j];
                        k.ins(format!("fma.rn.f32 {c}, {}, {}, {c};", av[i], bv[j]));
                    }
                }
            }
        }
        Inner::Half(_) => {}
        Inner::Tf32 => {
            let (sa, sb) = (inner.a_stride(), inner.b_stride());
            for kk in (0..BK).step_by(8) {
                let mut afr = Vec::new();
                for i in 0..2 {
                    let base = 4 * (i * 16 * sa + kk);
                    let offs = [base, base + 4 * 8 * sa, base + 16, base + 4 * 8 * sa + 16];
                    let regs: Vec<Reg> = offs
                        .iter()
                        .map(|o| {
                            let f = k.reg(Class::F32);
                            k.ins(format!("ld.shared.f32 {f}, [{a_cur}+{o}];"));
                            k.op1(Class::B32, "cvt.rna.tf32.f32", f)
                        })
                        .collect();
                    afr.push(regs);
                }
                let mut bfr = Vec::new();
                for j in 0..4 {
                    let base = 4 * (kk * sb + j * 8);
                    let regs: Vec<Reg> = [base, base + 4 * 4 * sb]
                        .iter()
                        .map(|o| {
                            let f = k.reg(Class::F32);
                            k.ins(format!("ld.shared.f32 {f}, [{b_cur}+{o}];"));
                            k.op1(Class::B32, "cvt.rna.tf32.f32", f)
                        })
                        .collect();
                    bfr.push(regs);
                }
                let list = |v: &[Reg]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
                for i in 0..2 {
                    for j in 0..4 {
                        let c = &accs[(i * 4 + j) * 4..(i * 4 + j) * 4 + 4];
                        k.ins(format!(
                            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{}}}, {{{}}}, {{{}}}, {{{}}};",
                            list(c),
                            list(&afr[i]),
                            list(&bfr[j]),
                            list(c)
                        ));
                    }
                }
            }
        }
    }
    if let Inner::Half(h) = inner {
        let (sa, sb) = (inner.a_stride(), inner.b_stride());
        let list = |v: &[Reg]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
        let mut afr = Vec::new();
        for i in 0..2 {
            let base = 4 * (i * 16 * sa);
            // a0a1 (row g, k 2q..), a2a3 (row g + 8), a4a5 (k + 8), a6a7 (both).
            let offs = [base, base + 4 * 8 * sa, base + 32, base + 4 * 8 * sa + 32];
            let regs: Vec<Reg> = offs
                .iter()
                .map(|o| {
                    let (x0, x1) = (k.reg(Class::F32), k.reg(Class::F32));
                    k.ins(format!("ld.shared.v2.f32 {{{x0}, {x1}}}, [{a_cur}+{o}];"));
                    k.op2(Class::B32, &format!("cvt.rn.{}x2.f32", h.ptx()), x1, x0)
                })
                .collect();
            afr.push(regs);
        }
        let mut bfr = Vec::new();
        for j in 0..4 {
            let base = 4 * (j * 8 * sb);
            let regs: Vec<Reg> = [base, base + 16]
                .iter()
                .map(|o| {
                    let r = k.reg(Class::B32);
                    k.ins(format!("ld.shared.b32 {r}, [{b_cur}+{o}];"));
                    r
                })
                .collect();
            bfr.push(regs);
        }
        for i in 0..2 {
            for j in 0..4 {
                let c = &accs[(i * 4 + j) * 4..(i * 4 + j) * 4 + 4];
                k.ins(format!(
                    "mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{}}}, {{{}}}, {{{}}}, {{{}}};",
                    list(c),
                    list(&afr[i]),
                    list(&bfr[j]),
                    list(c),
                    t = h.ptx()
                ));
            }
        }
    }
    k.ins("bar.sync 0;");
    k.ins(format!("mov.u32 {t}, {t1};"));
    let again = k.op2(Class::Pred, "setp.lt.u32", t, tiles);
    k.ins(format!("@{again} bra {head};"));

    // Epilogue: bias, residual, activation, one store per element inside Y.
    k.comment("epilogue");
    let row_base = k.op2(Class::B32, "add.u32", bm, row0);
    let col_base = k.op2(Class::B32, "add.u32", bn, col0);
    let act = activation_program(g.activation);
    for (acc, &(dr, dc)) in accs.iter().zip(&places) {
        let skip = k.label("skip");
        let row = k.op2(Class::B32, "add.u32", row_base, dr);
        let col = k.op2(Class::B32, "add.u32", col_base, dc);
        let out_r = k.op2(Class::Pred, "setp.ge.u32", row, g.m);
        k.ins(format!("@{out_r} bra {skip};"));
        let out_c = k.op2(Class::Pred, "setp.ge.u32", col, g.n);
        k.ins(format!("@{out_c} bra {skip};"));
        let mut v = *acc;
        if let Some(bp) = bias {
            let off = k.op2(Class::B64, "mul.wide.u32", col, 4);
            let addr = k.op2(Class::B64, "add.s64", bp, off);
            let bv = k.reg(Class::F32);
            k.ins(format!("ld.global.nc.f32 {bv}, [{addr}];"));
            v = k.op2(Class::F32, "add.rn.f32", v, bv);
        }
        let idx = match g.y {
            YLayout::Rows { .. } => k.op3(Class::B32, "mad.lo.u32", row, g.n, col),
            YLayout::Nchw { hw } => {
                let img = k.op2(Class::B32, "div.u32", row, hw);
                let p = k.op2(Class::B32, "rem.u32", row, hw);
                let ch = k.op3(Class::B32, "mad.lo.u32", img, g.n, col);
                k.op3(Class::B32, "mad.lo.u32", ch, hw, p)
            }
        };
        let off = k.op2(Class::B64, "mul.wide.u32", idx, 4);
        if let Some(rp) = res {
            let addr = k.op2(Class::B64, "add.s64", rp, off);
            let rv = k.reg(Class::F32);
            k.ins(format!("ld.global.f32 {rv}, [{addr}];"));
            v = k.op2(Class::F32, "add.rn.f32", v, rv);
        }
        let v = program(&mut k, &act, &[v]);
        let addr = k.op2(Class::B64, "add.s64", y, off);
        k.ins(format!("st.global.f32 [{addr}], {v};"));
        k.place(&skip);
    }
    k.ins("ret;");
    k
}
