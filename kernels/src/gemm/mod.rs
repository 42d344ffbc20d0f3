//! Single-precision GEMM for the compiled CPU backend: operands packed into panels once
//! (weights at load time), a register-blocked microkernel per ISA (AVX-512F, AVX2+FMA, and
//! a portable one), cache blocking whose sizes the caller derives from the target, an
//! epilogue (bias, activation, residual) applied while each tile is still in cache, and
//! work split over a [`Parallel`] executor.
//!
//! Cranelift lowers only 128-bit vectors on x86-64, so these inner loops are written with
//! `std::arch`; everything around them is planned by the compiler.

pub mod coded;
#[cfg(target_arch = "x86_64")]
mod coded_vnni;
mod micro;
mod pack;

pub use coded::{Coded, CodedShape};
/// The microkernel of an ISA over packed panels, for kernels that pack their own operands
/// (fused attention).
pub(crate) use micro::run as microkernel;
/// [`microkernel`] with A's rows read in place (x86-64's AVX-512 and AVX2 kernels).
#[cfg(target_arch = "x86_64")]
pub(crate) use micro::run_plain as microkernel_plain;
pub use micro::{install_portable, portable_is_generated, MicroFn};
pub use pack::{PackedA, PackedB};

/// A microkernel family, as a name: what the target description and the schedule talk
/// about. Code runs with an [`Isa`], which can only be had for a family this CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IsaKind {
    /// AVX-512F: 12×32 tiles of zmm accumulators.
    Avx512,
    /// AVX2 + FMA: 6×16 tiles of ymm accumulators.
    Avx2,
    /// Plain Rust (the compiler vectorises what it can): 4×16 tiles.
    Portable,
    /// AArch64 NEON (Advanced SIMD, in every AArch64 CPU): 8×12 tiles of q-register
    /// accumulators, fused multiply-adds by vector lane.
    Neon,
}

impl IsaKind {
    /// Columns of its microkernel tile (what [`Isa::nr`] gives once the CPU has it): the
    /// width of the panels a compiler lays weights out in for this kind of CPU.
    pub fn nr(self) -> usize {
        match self {
            IsaKind::Avx512 => 32,
            IsaKind::Avx2 => 16,
            IsaKind::Portable => 16,
            IsaKind::Neon => 12,
        }
    }

    /// Whether this CPU can run it.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
            IsaKind::Portable => true,
            #[cfg(target_arch = "aarch64")]
            IsaKind::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// The microkernel family code runs with: a proof that this CPU has it. The `std::arch`
/// kernels behind it are `#[target_feature]` functions, which are undefined behaviour on a
/// CPU without those features, so safe code can only get an `Isa` from [`Isa::new`] (which
/// checks the CPU) or [`Isa::PORTABLE`] (which needs nothing).
///
/// ```compile_fail
/// // The field is private: an `Isa` cannot be made for a CPU that lacks it.
/// let isa = aim_kernels::gemm::Isa(aim_kernels::gemm::IsaKind::Avx512);
/// ```
///
/// ```
/// use aim_kernels::gemm::{Isa, IsaKind};
/// // Only what this CPU has: on x86-64 there is no NEON, on AArch64 no AVX.
/// #[cfg(target_arch = "x86_64")]
/// assert!(Isa::new(IsaKind::Neon).is_none());
/// #[cfg(target_arch = "aarch64")]
/// assert!(Isa::new(IsaKind::Avx2).is_none());
/// assert_eq!(Isa::new(IsaKind::Portable), Some(Isa::PORTABLE));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Isa(IsaKind);

impl std::fmt::Debug for Isa {
    /// As its family (`Avx2`): how schedules and logs name it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Isa {
    /// The portable kernels, which run anywhere.
    pub const PORTABLE: Isa = Isa(IsaKind::Portable);

    /// The family `kind`, if this CPU has it.
    pub fn new(kind: IsaKind) -> Option<Isa> {
        kind.available().then_some(Isa(kind))
    }

    /// The best family this CPU has.
    pub fn best() -> Isa {
        [IsaKind::Avx512, IsaKind::Avx2, IsaKind::Neon].into_iter().find_map(Isa::new).unwrap_or(Isa::PORTABLE)
    }

    /// Every family this CPU has, best first.
    pub fn all_available() -> Vec<Isa> {
        [IsaKind::Avx512, IsaKind::Avx2, IsaKind::Neon, IsaKind::Portable].into_iter().filter_map(Isa::new).collect()
    }

    /// Which family it is.
    pub fn kind(self) -> IsaKind {
        self.0
    }

    /// Rows of a microkernel tile.
    pub fn mr(self) -> usize {
        match self.0 {
            IsaKind::Avx512 => 12,
            IsaKind::Avx2 => 6,
            IsaKind::Portable => 4,
            IsaKind::Neon => 8,
        }
    }

    /// Columns of a microkernel tile.
    pub fn nr(self) -> usize {
        self.0.nr()
    }
}

/// Cache blocking: the depth of a packed panel (`kc`, so a B panel stays in L1) and the rows
/// of A processed against it (`mc`, so the A block stays in L2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Depth of one k block.
    pub kc: usize,
    /// Rows of one m block.
    pub mc: usize,
}

impl Blocking {
    /// Blocking for caches of `l1` and `l2` bytes: a kc×NR panel of B fills up to L1, at
    /// most 256 deep (half as many round trips of the C tile through memory as half of L1
    /// gave on AVX-512: measured 2–4% on dense layers; deeper panels on AVX2 measured
    /// slower), half of L2 an mc×kc block of A.
    pub fn for_caches(isa: Isa, l1: usize, l2: usize) -> Blocking {
        let kc = (l1 / (isa.nr() * 4)).clamp(64, 256) & !7;
        let mc = ((l2 / 2) / (kc * 4)).max(isa.mr());
        Blocking { kc, mc: mc - mc % isa.mr() }
    }
}

/// An elementwise activation fused into a kernel's epilogue (GEMM, the blocked and
/// depthwise convolutions, Winograd): applied while the output tile is in registers or L1,
/// instead of as a separate pass over memory. The one table of fused activations: the
/// fusion pass, the schedule text and every kernel go through [`Activation::parse`],
/// [`Activation::name`] and [`Activation::apply`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// None.
    Identity,
    /// max(x, 0).
    Relu,
    /// clamp(x, lo, hi) (Clip, Relu6).
    Clip(f32, f32),
    /// x if x ≥ 0, else alpha·x.
    LeakyRelu(f32),
    /// clamp(alpha·x + beta, 0, 1).
    HardSigmoid(f32, f32),
    /// x · clamp(x/6 + 1/2, 0, 1).
    HardSwish,
    /// 1 / (1 + e^−x).
    Sigmoid,
    /// x · sigmoid(x) (SiLU, Swish).
    Silu,
    /// tanh(x).
    Tanh,
    /// x/2 · (1 + erf(x/√2)).
    Gelu,
    /// x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³))).
    GeluTanh,
    /// x if x > 0, else alpha·(e^x − 1).
    Elu(f32),
}

impl Activation {
    /// Applies the activation to one value (written to vectorise: selects, no branches
    /// but loop-invariant ones; the transcendental functions are `fast::math`'s, with
    /// separate multiplies and adds: for scalar code compiled without FMA).
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        self.apply_with::<false>(x)
    }

    /// [`Activation::apply`] with the transcendental functions' multiply-adds fused where
    /// `FMA` (for loops compiled with the FMA feature: the bits ONNX Runtime's MLAS gives on
    /// such CPUs, see `fast::math`).
    #[inline(always)]
    pub fn apply_with<const FMA: bool>(self, x: f32) -> f32 {
        use crate::fast::math;
        match self {
            Activation::Identity => x,
            Activation::Relu => relu(x),
            Activation::Clip(lo, hi) => clamp(x, lo, hi),
            Activation::LeakyRelu(a) => {
                if x < 0.0 {
                    a * x
                } else {
                    x
                }
            }
            Activation::HardSigmoid(a, b) => clamp(a * x + b, 0.0, 1.0),
            Activation::HardSwish => x * clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0),
            Activation::Sigmoid => math::sigmoid_with::<FMA>(x),
            Activation::Silu => x * math::sigmoid_with::<FMA>(x),
            Activation::Tanh => math::tanh_with::<FMA>(x),
            Activation::Gelu => 0.5 * x * (1.0 + math::erf_with::<FMA>(x * std::f32::consts::FRAC_1_SQRT_2)),
            Activation::GeluTanh => 0.5 * x * (1.0 + math::tanh_with::<FMA>(0.797_884_6 * (x + 0.044_715 * x * x * x))),
            Activation::Elu(a) => {
                if x > 0.0 {
                    x
                } else {
                    a * (math::exp_with::<FMA>(x) - 1.0)
                }
            }
        }
    }

    /// Applies the activation to every value of `v`, with the vector width of `isa` (one
    /// loop per kind of activation, compiled for that ISA, so that each vectorises).
    pub fn apply_all(self, isa: Isa, v: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn v4(a: Activation, v: &mut [f32]) {
                a.apply_body::<true>(v)
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3(a: Activation, v: &mut [f32]) {
                a.apply_body::<true>(v)
            }
            // SAFETY: an `Isa` exists only for features this CPU has.
            match isa.kind() {
                IsaKind::Avx512 => return unsafe { v4(self, v) },
                IsaKind::Avx2 => return unsafe { v3(self, v) },
                _ => {}
            }
        }
        let _ = isa;
        self.apply_body::<{ cfg!(target_arch = "aarch64") }>(v)
    }

    /// The loops of `apply_all`: one per kind, its parameters hoisted (multiply-adds fused
    /// where `FMA`).
    #[inline(always)]
    fn apply_body<const FMA: bool>(self, v: &mut [f32]) {
        macro_rules! each {
            ($f:expr) => {
                for x in v.iter_mut() {
                    *x = $f(*x);
                }
            };
        }
        match self {
            Activation::Identity => {}
            Activation::Relu => each!(relu),
            Activation::Clip(lo, hi) => each!(|x: f32| clamp(x, lo, hi)),
            Activation::LeakyRelu(a) => each!(|x: f32| if x < 0.0 { a * x } else { x }),
            Activation::HardSigmoid(a, b) => each!(|x: f32| clamp(a * x + b, 0.0, 1.0)),
            Activation::HardSwish => each!(|x: f32| x * clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)),
            // Each arm names its variant, so the match inside `apply_with` folds away.
            Activation::Sigmoid => each!(|x: f32| Activation::Sigmoid.apply_with::<FMA>(x)),
            Activation::Silu => each!(|x: f32| Activation::Silu.apply_with::<FMA>(x)),
            Activation::Tanh => each!(|x: f32| Activation::Tanh.apply_with::<FMA>(x)),
            Activation::Gelu => each!(|x: f32| Activation::Gelu.apply_with::<FMA>(x)),
            Activation::GeluTanh => each!(|x: f32| Activation::GeluTanh.apply_with::<FMA>(x)),
            Activation::Elu(a) => each!(|x: f32| Activation::Elu(a).apply_with::<FMA>(x)),
        }
    }

    /// The `[lo, hi]` of an activation that is a clamp (kernels apply those in registers);
    /// `None` for the others, which kernels apply to the tile they just stored.
    pub fn clamp_bounds(self) -> Option<(f32, f32)> {
        match self {
            Activation::Identity => Some((f32::NEG_INFINITY, f32::INFINITY)),
            Activation::Relu => Some((0.0, f32::INFINITY)),
            Activation::Clip(lo, hi) => Some((lo, hi)),
            _ => None,
        }
    }

    /// The activation an `activation` attribute names, with its `alpha` / `beta`
    /// (`clip_min` / `clip_max` for clip); `None` for a name not in the table.
    pub fn parse(name: &str, alpha: Option<f32>, beta: Option<f32>) -> Option<Activation> {
        Some(match name {
            "relu" => Activation::Relu,
            "clip" => Activation::Clip(alpha.unwrap_or(f32::NEG_INFINITY), beta.unwrap_or(f32::INFINITY)),
            "leakyrelu" => Activation::LeakyRelu(alpha.unwrap_or(0.01)),
            "hardsigmoid" => Activation::HardSigmoid(alpha.unwrap_or(0.2), beta.unwrap_or(0.5)),
            "hardswish" => Activation::HardSwish,
            "sigmoid" => Activation::Sigmoid,
            "silu" => Activation::Silu,
            "tanh" => Activation::Tanh,
            "gelu" => Activation::Gelu,
            "gelu_tanh" => Activation::GeluTanh,
            "elu" => Activation::Elu(alpha.unwrap_or(1.0)),
            _ => return None,
        })
    }

    /// The attribute name and parameters of the activation (the inverse of `parse`).
    pub fn name(self) -> (&'static str, Option<f32>, Option<f32>) {
        match self {
            Activation::Identity => ("none", None, None),
            Activation::Relu => ("relu", None, None),
            Activation::Clip(lo, hi) => ("clip", Some(lo), Some(hi)),
            Activation::LeakyRelu(a) => ("leakyrelu", Some(a), None),
            Activation::HardSigmoid(a, b) => ("hardsigmoid", Some(a), Some(b)),
            Activation::HardSwish => ("hardswish", None, None),
            Activation::Sigmoid => ("sigmoid", None, None),
            Activation::Silu => ("silu", None, None),
            Activation::Tanh => ("tanh", None, None),
            Activation::Gelu => ("gelu", None, None),
            Activation::GeluTanh => ("gelu_tanh", None, None),
            Activation::Elu(a) => ("elu", Some(a), None),
        }
    }

    /// How the schedule text names it.
    pub fn text(self) -> String {
        match self.name() {
            ("none", ..) => "no activation".to_string(),
            ("clip", Some(lo), Some(hi)) => format!("clamp({lo}, {hi})"),
            (n, Some(a), Some(b)) => format!("{n}({a}, {b})"),
            (n, Some(a), None) => format!("{n}({a})"),
            (n, ..) => n.to_string(),
        }
    }
}

/// `max(x, 0)` as ONNX Relu defines it: NaN stays NaN (`f32::max` would return 0). Written
/// as a comparison, it compiles to one `maxps`.
#[inline(always)]
pub fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// `clamp(x, lo, hi)` as ONNX Clip defines it: NaN stays NaN; two compare-selects.
#[inline(always)]
pub fn clamp(x: f32, lo: f32, hi: f32) -> f32 {
    let x = if x < lo { lo } else { x };
    if x > hi {
        hi
    } else {
        x
    }
}

/// What happens to each output tile once its sum is complete:
/// `c = act(c + bias + residual)`, with the residual added before the activation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// One bias per row of C (a conv's output channel).
    pub row_bias: Option<&'a [f32]>,
    /// One bias per column of C (a dense layer's output feature).
    pub col_bias: Option<&'a [f32]>,
    /// A tensor of C's shape (and `ldc`) to add.
    pub residual: Option<&'a [f32]>,
    /// C already holds the residual (the result overwrites it in place): the product is
    /// added to it.
    pub residual_in_c: bool,
    /// The activation.
    pub act: Option<Activation>,
    /// A program of one input applied after the activation (the elementwise ops that
    /// followed the layer: a scale and shift, a clamp, a fake quantization).
    pub post: Option<&'a crate::ewprog::wide::Wide>,
}

/// Runs `f(0..n)` in parallel (or not): implemented by the runtime's thread pool.
pub trait Parallel: Sync {
    /// Calls `f(i)` for every `i` in `0..n`, possibly on several threads, and returns when
    /// all calls have returned.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync));
    /// How many threads `for_each` may use.
    fn threads(&self) -> usize;
}

/// Runs everything on the calling thread.
pub struct Sequential;

impl Parallel for Sequential {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).for_each(f)
    }
    fn threads(&self) -> usize {
        1
    }
}

/// Panics unless C (m×n, leading dimension `ldc`) and the epilogue's operands are large
/// enough: the microkernels write through raw pointers.
fn check_c(m: usize, n: usize, c: &[f32], ldc: usize, ep: &Epilogue) {
    assert!(ldc >= n && (m == 0 || c.len() >= (m - 1) * ldc + n), "C is too small");
    if let Some(r) = ep.residual {
        assert!(m == 0 || r.len() >= (m - 1) * ldc + n, "residual is too small");
    }
    assert!(ep.row_bias.is_none_or(|bb| bb.len() >= m) && ep.col_bias.is_none_or(|bb| bb.len() >= n), "bias too short");
}

/// C[m×n] (row-major, leading dimension `ldc`) = A·B, then the epilogue. A and B must have
/// been packed for the same ISA and k blocking. Work is split by column panels of B.
pub fn gemm(a: &PackedA, b: &PackedB, c: &mut [f32], ldc: usize, ep: &Epilogue, par: &dyn Parallel) {
    assert_eq!(a.isa, b.isa, "A and B packed for different ISAs");
    assert_eq!((a.k, a.kc), (b.k, b.kc), "A and B packed with different k or kc");
    let (m, n) = (a.m, b.n);
    check_c(m, n, c, ldc, ep);
    if m == 0 || n == 0 {
        return;
    }
    if m <= SMALL_M {
        small_m(ARows::Packed(a), b, cp_of(c), ldc, ep, par);
        return;
    }
    tiled(ASrc::Packed(a), m, a.mc, b, c, ldc, ep, par);
}

/// Where a tiled product reads A.
#[derive(Clone, Copy)]
enum ASrc<'a> {
    /// Packed panels.
    Packed(&'a PackedA),
    /// Row-major rows of `k` values read in place (AVX-512 and AVX2 kernels only).
    Plain(&'a [f32]),
}

/// Column-panel tasks per thread of the tiled products ([`tiled`], [`gemm_lazy_b`]): with
/// one task per thread, a thread the OS preempts (a busy machine) holds up the whole
/// product while the others wait; with a few each, the others take its share.
const TASKS_PER_THREAD: usize = 4;

/// How the tiled products split `np` column panels over `threads` threads: `(tasks, per)`,
/// tasks of `per` panels each (the last one fewer), at least [`TASKS_PER_THREAD`] per
/// thread where there are panels enough. Tasks of equal size, because threads claim them
/// in turn: 12 panels as 8 tasks of one or two panels left one thread a two-panel task at
/// the end, 17% longer than 12 tasks of one on a 384-wide layer with 2 threads.
fn panel_tasks(np: usize, threads: usize) -> (usize, usize) {
    let per = (np / (threads.max(1) * TASKS_PER_THREAD)).max(1);
    (np.div_ceil(per).max(1), per)
}

/// The tiled product C = A·B (m rows, B's k and n), then the epilogue: column panels split
/// over the threads; per k block and m block of `mc` rows, each B panel against every row
/// panel of A.
#[allow(clippy::too_many_arguments)]
fn tiled(a: ASrc, m: usize, mc: usize, b: &PackedB, c: &mut [f32], ldc: usize, ep: &Epilogue, par: &dyn Parallel) {
    let (n, k, kc, isa) = (b.n, b.k, b.kc, b.isa);
    let (mr, nr) = (isa.mr(), isa.nr());
    let (mp, np) = (m.div_ceil(mr), n.div_ceil(nr));
    let kblocks = k.div_ceil(kc).max(1);
    // Tasks: groups of column panels, enough for every thread to have a few.
    let (tasks, per) = panel_tasks(np, par.threads());
    let cp = crate::util::SharedMut(c.as_mut_ptr());
    let mc_panels = (mc / mr).max(1);
    let prefetch = kc * nr * 4 <= PREFETCH_PANEL_BYTES;
    par.for_each(tasks, &|t| {
        let cp = cp;
        let (j0, j1) = (t * per, ((t + 1) * per).min(np));
        let mut buf = vec![0f32; mr * nr];
        let mut widened = Vec::new();
        for kb in 0..kblocks {
            let kc_len = if k == 0 { 0 } else { kc.min(k - kb * kc) };
            for i0 in (0..mp).step_by(mc_panels) {
                for j in j0..j1 {
                    let bp = b.panel(kb, j, &mut widened);
                    let rows_here = (i0 + mc_panels).min(mp) - i0;
                    let next = if j + 1 < j1 && prefetch { b.stored_panel(kb, j + 1) } else { None };
                    for i in i0..(i0 + mc_panels).min(mp) {
                        let pf = next.map_or(&[][..], |next| share(next, i - i0, rows_here));
                        let (rows, cols) = ((m - i * mr).min(mr), (n - j * nr).min(nr));
                        // SAFETY: tile (i, j) lies inside C (checked by the callers) and
                        // belongs to this task's panels only; the panels hold kc_len×MR /
                        // kc_len×NR, plain A rows i·MR.. hold k values each.
                        unsafe {
                            let dst = cp.0.add(i * mr * ldc + j * nr);
                            match a {
                                ASrc::Packed(pa) => {
                                    prefetch_now(pf);
                                    tile(
                                        isa,
                                        kc_len,
                                        pa.panel(kb, i),
                                        bp,
                                        dst,
                                        ldc,
                                        rows,
                                        cols,
                                        kb > 0 || ep.residual_in_c,
                                        &mut buf,
                                    )
                                }
                                ASrc::Plain(x) => tile_plain(
                                    isa,
                                    kc_len,
                                    x.as_ptr().add(i * mr * k + kb * kc),
                                    k,
                                    bp,
                                    dst,
                                    ldc,
                                    rows,
                                    cols,
                                    kb > 0 || ep.residual_in_c,
                                    &mut buf,
                                    pf,
                                ),
                            }
                            if kb + 1 == kblocks {
                                epilogue(isa, dst, ldc, i * mr, j * nr, rows, cols, ep);
                            }
                        }
                    }
                }
            }
        }
    });
}

/// The largest B panel [`tiled`] prefetches while it works on the one before: half the
/// smallest L1 data cache of the x86-64 cores aim runs on (32 KiB), so that the two fit
/// together. (AMD cores bring every prefetch into L1: an AVX-512 panel of 256×32 floats,
/// the whole L1 of a Zen 4, evicted the panel in use and measured 2.7% slower with the
/// prefetch than without; an AVX2 panel of 256×16 measured 5% faster with it.)
const PREFETCH_PANEL_BYTES: usize = 16 << 10;

/// Share `t` of `of` of `next` (the B panel a product uses after the current one): the
/// lines to prefetch while row panel `t` of `of` runs against the current panel. A
/// panel's first pass otherwise streams it from memory while the microkernel waits;
/// spread over the row panels, the next one arrives ahead of use (measured on dense
/// layers whose weights are out of cache: AVX2 93 → 104 GFLOP/s).
fn share(next: &[f32], t: usize, of: usize) -> &[f32] {
    const LINE: usize = micro::LINE_FLOATS;
    let lines = next.len().div_ceil(LINE);
    let (l0, l1) = (t * lines / of, ((t + 1) * lines / of).min(lines));
    &next[(l0 * LINE).min(next.len())..(l1 * LINE).min(next.len())]
}

/// Prefetches `v` into L1 before a microkernel that does not spread prefetches itself.
#[inline]
fn prefetch_now(v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    micro::prefetch_lines(v);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

/// The loop nest [`gemm`] / [`gemm_lazy_b`] run for C[m×n] = A[m×k]·B[k×n], as lines of
/// text (for `aim explore`): tiles, cache blocks, parallel tasks for `threads` threads.
/// `b` is the packed B (its form decides how panels are read), or `None` for a B packed
/// on the fly ([`gemm_lazy_b`]).
pub fn schedule(
    isa: Isa,
    blocking: Blocking,
    m: usize,
    n: usize,
    k: usize,
    b: Option<&PackedB>,
    threads: usize,
) -> Vec<String> {
    let (mr, nr) = (isa.mr(), isa.nr());
    let np = n.div_ceil(nr);
    let kblocks = k.div_ceil(blocking.kc).max(1);
    let coded = b.and_then(PackedB::coded);
    if let (Some(q), true) = (coded, m <= SMALL_M) {
        let s = q.shape;
        return vec![format!(
            "parallel for column-panel group in 0..{}: for row in 0..{m}: per block of {} rows, the {}-bit codes × the row ({}), scaled per block",
            np.min(threads).max(1),
            s.block,
            s.bits,
            q.rows_kernel(isa.kind())
        )];
    }
    if m <= SMALL_M && b.is_some() {
        return vec![
            format!("for row in 0..{m}: vector × matrix over {np} packed column panels of {nr}"),
            format!("  for k-block in 0..{kblocks} (≤{}): row += a[k] · B[k, panel]", blocking.kc),
        ];
    }
    let (tasks, per) = panel_tasks(np, threads);
    let b = match b {
        None => format!("B panel packed on the fly (kc×{nr}, stays in L1)"),
        Some(p) if p.coded().is_some() => "B panel widened from its codes into a per-task buffer".to_string(),
        Some(p) if p.is_half() => "B panel widened from f16 into a per-task buffer".to_string(),
        Some(_) => "B panels packed at load time".to_string(),
    };
    vec![
        format!("parallel for column-panel group in 0..{tasks} (≤{per} of {np} panels of {nr} columns)"),
        format!("  for k-block in 0..{kblocks} (kc ≤ {}), m-block of ≤{} rows, panel j: {b}", blocking.kc, blocking.mc),
        format!("    for row panel in m-block ({} panels of {mr}): microkernel {isa:?} {mr}×{nr}: C[{mr}×{nr}] += A[{mr}×kc] · B[kc×{nr}]", m.div_ceil(mr)),
        "    last k-block: epilogue on the tile while it is in cache".to_string(),
    ]
}

/// Where the rows of A come from in a small-M product.
#[derive(Clone, Copy)]
enum ARows<'a> {
    /// Packed panels.
    Packed(&'a PackedA),
    /// Row-major `m × k` values, read in place.
    Plain(&'a [f32], usize, usize),
}

/// C[m×n] = A·B for A given as plain rows, then the epilogue. Up to a few rows (a batch-1 or
/// batch-4 dense layer) A is read in place, as vector-matrix products; more rows are packed
/// for the tiled product.
#[allow(clippy::too_many_arguments)]
pub fn gemm_rows(
    a: &[f32],
    m: usize,
    k: usize,
    blocking: Blocking,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    ep: &Epilogue,
    par: &dyn Parallel,
) {
    assert!(a.len() >= m * k && k == b.k, "A is {m}×{k} (holds {}), B is {}×{}", a.len(), b.k, b.n);
    let n = b.n;
    check_c(m, n, c, ldc, ep);
    if m == 0 || n == 0 {
        return;
    }
    if m <= SMALL_M {
        small_m(ARows::Plain(a, m, k), b, cp_of(c), ldc, ep, par);
    } else if cfg!(target_arch = "x86_64") && matches!(b.isa.kind(), IsaKind::Avx512 | IsaKind::Avx2) {
        // Read in place: packing A (one pass over it, element by element) cost as much as
        // 7% of a 64-row dense layer, and the kernels read 12 (6) row streams as fast.
        tiled(ASrc::Plain(a), m, blocking.mc, b, c, ldc, ep, par);
    } else {
        // A packed with B's depth blocking (B's may differ from `blocking`: weights packed
        // ahead of time keep theirs).
        let pa = PackedA::from_rows(b.isa, Blocking { kc: b.kc, ..blocking }, a, m, k, par);
        gemm(&pa, b, c, ldc, ep, par);
    }
}

/// Up to this many rows, a product runs as a matrix-vector product per row instead of on
/// MR-row tiles (a batch-1 dense layer would otherwise compute MR rows to keep one).
const SMALL_M: usize = 4;

fn cp_of(c: &mut [f32]) -> crate::util::SharedMut<f32> {
    crate::util::SharedMut(c.as_mut_ptr())
}

/// C rows (m ≤ [`SMALL_M`]) as vector-matrix products over the packed B panels, reading A's
/// rows straight from its packed panel.
fn small_m(a: ARows, b: &PackedB, cp: crate::util::SharedMut<f32>, ldc: usize, ep: &Epilogue, par: &dyn Parallel) {
    let (m, n, isa, k, kc) = match a {
        ARows::Packed(p) => (p.m, b.n, p.isa, p.k, p.kc),
        ARows::Plain(_, m, k) => (m, b.n, b.isa, k, b.kc),
    };
    let (mr, nr) = (isa.mr(), isa.nr());
    let np = n.div_ceil(nr);
    let kblocks = k.div_ceil(kc).max(1);
    // One task per thread: each reads its own slice of B, which then stays in that core's
    // cache from one call to the next more often than with finer tasks.
    let tasks = np.min(par.threads()).max(1);
    par.for_each(tasks, &|t| {
        let cp = cp;
        let (j0, j1) = (t * np / tasks, (t + 1) * np / tasks);
        // Accumulators for this task's columns of every row; B is then read block by block
        // in memory order, one sequential stream.
        let width = (j1 - j0) * nr;
        let mut acc = vec![0f32; m * width];
        let mut widened = Vec::new();
        // Coded weights and rows read in place: products on the codes, nothing widened.
        if let (Some(q), ARows::Plain(rows, _, _)) = (b.coded(), a) {
            // This task's columns in the coded layout's (possibly narrower) panels.
            let (w, panels) = (q.shape.nr, q.shape.n.div_ceil(q.shape.nr));
            let span = ((j0 * nr / w).min(panels), (j1 * nr / w).min(panels));
            q.rows_product(rows, m, span, &mut acc, width, isa.kind());
        }
        for kb in (0..kblocks).filter(|_| b.coded().is_none() || matches!(a, ARows::Packed(_))) {
            let kc_len = if k == 0 { 0 } else { kc.min(k - kb * kc) };
            for j in j0..j1 {
                // SAFETY: the panels hold kc_len×NR (B) floats.
                let bp = unsafe { std::slice::from_raw_parts(b.panel(kb, j, &mut widened), kc_len * nr) };
                for i in 0..m {
                    let at = i * width + (j - j0) * nr;
                    match a {
                        ARows::Packed(p) => {
                            // SAFETY: the panels hold kc_len×MR (A) floats.
                            let ap = unsafe { std::slice::from_raw_parts(p.panel(kb, 0), kc_len * mr) };
                            axpy_rows(isa, ap, i, mr, bp, &mut acc[at..at + nr]);
                        }
                        // Row i's k block read in place: element p at stride 1.
                        ARows::Plain(rows, _, _) => axpy_rows(
                            isa,
                            &rows[i * k + kb * kc..i * k + kb * kc + kc_len],
                            0,
                            1,
                            bp,
                            &mut acc[at..at + nr],
                        ),
                    }
                }
            }
        }
        for j in j0..j1 {
            let cols = nr.min(n - j * nr);
            for i in 0..m {
                let at = i * width + (j - j0) * nr;
                // SAFETY: row i, columns j*NR.. of C belong to this task.
                unsafe {
                    let dst = cp.0.add(i * ldc + j * nr);
                    if ep.residual_in_c {
                        for c in 0..cols {
                            *dst.add(c) += acc[at + c];
                        }
                    } else {
                        std::ptr::copy_nonoverlapping(acc[at..].as_ptr(), dst, cols);
                    }
                    epilogue(isa, dst, ldc, i, j * nr, 1, cols, ep);
                }
            }
        }
    });
}

/// acc[0..NR] += Σ_p a[p·mr + i] · b[p·NR ..]: the accumulators stay in vector registers
/// for the whole panel, four sets of them over alternate `p` so that the adds do not wait on
/// each other (one set is bound by the FMA's latency: a batch-1 LSTM step's recurrent
/// product ran at a quarter of the rate its loads allow).
fn axpy_rows(isa: Isa, a: &[f32], i: usize, mr: usize, b: &[f32], acc: &mut [f32]) {
    let nr = acc.len();
    let kc = b.len() / nr;
    assert!(a.len() >= kc * mr && i < mr && nr == isa.nr(), "axpy_rows: operands do not fit");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        unsafe fn v4(kc: usize, a: *const f32, mr: usize, b: *const f32, acc: *mut f32) {
            let z = _mm512_setzero_ps();
            let (mut c0, mut c1) = (_mm512_loadu_ps(acc), _mm512_loadu_ps(acc.add(16)));
            let (mut d0, mut d1, mut e0, mut e1, mut f0, mut f1) = (z, z, z, z, z, z);
            let mut p = 0;
            while p + 4 <= kc {
                let (a0, a1) = (_mm512_set1_ps(*a.add(p * mr)), _mm512_set1_ps(*a.add((p + 1) * mr)));
                let (a2, a3) = (_mm512_set1_ps(*a.add((p + 2) * mr)), _mm512_set1_ps(*a.add((p + 3) * mr)));
                let r = b.add(p * 32);
                c0 = _mm512_fmadd_ps(a0, _mm512_loadu_ps(r), c0);
                c1 = _mm512_fmadd_ps(a0, _mm512_loadu_ps(r.add(16)), c1);
                d0 = _mm512_fmadd_ps(a1, _mm512_loadu_ps(r.add(32)), d0);
                d1 = _mm512_fmadd_ps(a1, _mm512_loadu_ps(r.add(48)), d1);
                e0 = _mm512_fmadd_ps(a2, _mm512_loadu_ps(r.add(64)), e0);
                e1 = _mm512_fmadd_ps(a2, _mm512_loadu_ps(r.add(80)), e1);
                f0 = _mm512_fmadd_ps(a3, _mm512_loadu_ps(r.add(96)), f0);
                f1 = _mm512_fmadd_ps(a3, _mm512_loadu_ps(r.add(112)), f1);
                p += 4;
            }
            while p < kc {
                let av = _mm512_set1_ps(*a.add(p * mr));
                c0 = _mm512_fmadd_ps(av, _mm512_loadu_ps(b.add(p * 32)), c0);
                c1 = _mm512_fmadd_ps(av, _mm512_loadu_ps(b.add(p * 32 + 16)), c1);
                p += 1;
            }
            c0 = _mm512_add_ps(_mm512_add_ps(c0, d0), _mm512_add_ps(e0, f0));
            c1 = _mm512_add_ps(_mm512_add_ps(c1, d1), _mm512_add_ps(e1, f1));
            _mm512_storeu_ps(acc, c0);
            _mm512_storeu_ps(acc.add(16), c1);
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(kc: usize, a: *const f32, mr: usize, b: *const f32, acc: *mut f32) {
            let z = _mm256_setzero_ps();
            let (mut c0, mut c1) = (_mm256_loadu_ps(acc), _mm256_loadu_ps(acc.add(8)));
            let (mut d0, mut d1, mut e0, mut e1, mut f0, mut f1) = (z, z, z, z, z, z);
            let mut p = 0;
            while p + 4 <= kc {
                let (a0, a1) = (_mm256_set1_ps(*a.add(p * mr)), _mm256_set1_ps(*a.add((p + 1) * mr)));
                let (a2, a3) = (_mm256_set1_ps(*a.add((p + 2) * mr)), _mm256_set1_ps(*a.add((p + 3) * mr)));
                let r = b.add(p * 16);
                c0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(r), c0);
                c1 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(r.add(8)), c1);
                d0 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(r.add(16)), d0);
                d1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(r.add(24)), d1);
                e0 = _mm256_fmadd_ps(a2, _mm256_loadu_ps(r.add(32)), e0);
                e1 = _mm256_fmadd_ps(a2, _mm256_loadu_ps(r.add(40)), e1);
                f0 = _mm256_fmadd_ps(a3, _mm256_loadu_ps(r.add(48)), f0);
                f1 = _mm256_fmadd_ps(a3, _mm256_loadu_ps(r.add(56)), f1);
                p += 4;
            }
            while p < kc {
                let av = _mm256_set1_ps(*a.add(p * mr));
                c0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b.add(p * 16)), c0);
                c1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b.add(p * 16 + 8)), c1);
                p += 1;
            }
            c0 = _mm256_add_ps(_mm256_add_ps(c0, d0), _mm256_add_ps(e0, f0));
            c1 = _mm256_add_ps(_mm256_add_ps(c1, d1), _mm256_add_ps(e1, f1));
            _mm256_storeu_ps(acc, c0);
            _mm256_storeu_ps(acc.add(8), c1);
        }
        // SAFETY: lengths checked above (NR = 32 for AVX-512, 16 for AVX2); the ISA was
        // checked available when the operands were packed for it.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(kc, a.as_ptr().add(i), mr, b.as_ptr(), acc.as_mut_ptr()) },
            IsaKind::Avx2 => return unsafe { v3(kc, a.as_ptr().add(i), mr, b.as_ptr(), acc.as_mut_ptr()) },
            IsaKind::Portable | IsaKind::Neon => {}
        }
    }
    for (p, brow) in b.chunks_exact(nr).enumerate() {
        let av = a[p * mr + i];
        for (x, &y) in acc.iter_mut().zip(brow) {
            *x += av * y;
        }
    }
}

/// One microkernel tile: full tiles straight into C, edge tiles through `buf`.
///
/// # Safety
/// As for [`micro::run`], with `dst` pointing at a rows×cols region of C.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    isa: Isa,
    kc_len: usize,
    ap: *const f32,
    bp: *const f32,
    dst: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    acc: bool,
    buf: &mut [f32],
) {
    let (mr, nr) = (isa.mr(), isa.nr());
    if rows == mr && cols == nr {
        micro::run(isa, kc_len, ap, bp, dst, ldc, acc);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.kind() == IsaKind::Avx512 && rows < mr && cols == nr {
        micro::avx512_rows(rows, kc_len, ap, bp, dst, ldc, acc);
        return;
    }
    if acc {
        for r in 0..rows {
            std::ptr::copy_nonoverlapping(dst.add(r * ldc), buf.as_mut_ptr().add(r * nr), cols);
        }
    }
    micro::run(isa, kc_len, ap, bp, buf.as_mut_ptr(), nr, acc);
    for r in 0..rows {
        std::ptr::copy_nonoverlapping(buf.as_ptr().add(r * nr), dst.add(r * ldc), cols);
    }
}

/// [`tile`] for A rows read in place (row-major, leading dimension `lda`).
///
/// # Safety
/// As for [`micro::run_plain`], with `dst` pointing at a rows×cols region of C.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_plain(
    isa: Isa,
    kc_len: usize,
    ap: *const f32,
    lda: usize,
    bp: *const f32,
    dst: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    acc: bool,
    buf: &mut [f32],
    pf: &[f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let nr = isa.nr();
        if cols == nr {
            micro::run_plain(isa, rows, false, kc_len, ap, lda, bp, dst, ldc, acc, pf);
            return;
        }
        if acc {
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(dst.add(r * ldc), buf.as_mut_ptr().add(r * nr), cols);
            }
        }
        // An edge panel of at most half a tile computes only that half.
        let narrow = cols <= nr / 2;
        micro::run_plain(isa, rows, narrow, kc_len, ap, lda, bp, buf.as_mut_ptr(), nr, acc, pf);
        for r in 0..rows {
            std::ptr::copy_nonoverlapping(buf.as_ptr().add(r * nr), dst.add(r * ldc), cols);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, kc_len, ap, lda, bp, dst, ldc, rows, cols, acc, buf, pf);
        unreachable!("A is read in place only on x86-64");
    }
}

/// Like [`gemm`], but B (k×n) is never materialised: each task packs one kc×NR panel at a
/// time with `fill(p, j0, dst)` (elements (p, j0..j0 + dst.len())) into a buffer that stays
/// in L1, and runs every row panel of A against it. For convolutions this is im2col without
/// the im2col matrix.
pub fn gemm_lazy_b(
    a: &PackedA,
    n: usize,
    fill: &(dyn Fn(usize, usize, &mut [f32]) + Sync),
    c: &mut [f32],
    ldc: usize,
    ep: &Epilogue,
    par: &dyn Parallel,
) {
    let (m, k, kc, isa) = (a.m, a.k, a.kc, a.isa);
    check_c(m, n, c, ldc, ep);
    if m == 0 || n == 0 {
        return;
    }
    let (mr, nr) = (isa.mr(), isa.nr());
    let (mp, np) = (m.div_ceil(mr), n.div_ceil(nr));
    let kblocks = k.div_ceil(kc).max(1);
    let (tasks, per) = panel_tasks(np, par.threads());
    let cp = crate::util::SharedMut(c.as_mut_ptr());
    par.for_each(tasks, &|t| {
        let cp = cp;
        let (j0, j1) = (t * per, ((t + 1) * per).min(np));
        let mut buf = vec![0f32; mr * nr];
        let mut panel = vec![0f32; kc.max(1) * nr];
        let mut step = |kb: usize, j: usize| {
            let cols = nr.min(n - j * nr);
            let kc_len = if k == 0 { 0 } else { kc.min(k - kb * kc) };
            for p in 0..kc_len {
                let row = &mut panel[p * nr..(p + 1) * nr];
                fill(kb * kc + p, j * nr, &mut row[..cols]);
                row[cols..].fill(0.0);
            }
            for i in 0..mp {
                let rows = mr.min(m - i * mr);
                // SAFETY: as in `gemm`; the panel holds kc_len×NR floats.
                unsafe {
                    let dst = cp.0.add(i * mr * ldc + j * nr);
                    tile(
                        isa,
                        kc_len,
                        a.panel(kb, i),
                        panel.as_ptr(),
                        dst,
                        ldc,
                        rows,
                        cols,
                        kb > 0 || ep.residual_in_c,
                        &mut buf,
                    );
                    if kb + 1 == kblocks {
                        epilogue(isa, dst, ldc, i * mr, j * nr, rows, cols, ep);
                    }
                }
            }
        };
        // Few column panels (a 7×7 feature map): A, often megabytes of weights, is the big
        // operand; walking k blocks outermost reads each block of it once, from L2, for all
        // panels. Many panels: keep each C column strip in cache across the k blocks instead.
        if j1 - j0 <= 4 {
            for kb in 0..kblocks {
                for j in j0..j1 {
                    step(kb, j);
                }
            }
        } else {
            for j in j0..j1 {
                for kb in 0..kblocks {
                    step(kb, j);
                }
            }
        }
    });
}

/// Applies the epilogue to a rows×cols tile at (r0, c0).
///
/// # Safety
/// `dst` points at element (r0, c0) of C with leading dimension `ldc`, and the tile is in
/// bounds and not touched by other threads.
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue(isa: Isa, dst: *mut f32, ldc: usize, r0: usize, c0: usize, rows: usize, cols: usize, ep: &Epilogue) {
    if ep.row_bias.is_none() && ep.col_bias.is_none() && ep.residual.is_none() && ep.act.is_none() {
        if let Some(post) = ep.post {
            // SAFETY: as for the function: the tile's rows are in bounds and ours.
            unsafe { post.apply_rows(dst, rows, cols, ldc) };
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(dst: *mut f32, ldc: usize, r0: usize, c0: usize, rows: usize, cols: usize, ep: &Epilogue) {
            epilogue_body::<true>(dst, ldc, r0, c0, rows, cols, ep)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(dst: *mut f32, ldc: usize, r0: usize, c0: usize, rows: usize, cols: usize, ep: &Epilogue) {
            epilogue_body::<true>(dst, ldc, r0, c0, rows, cols, ep)
        }
        match isa.kind() {
            IsaKind::Avx512 => return v4(dst, ldc, r0, c0, rows, cols, ep),
            IsaKind::Avx2 => return v3(dst, ldc, r0, c0, rows, cols, ep),
            IsaKind::Portable | IsaKind::Neon => {}
        }
    }
    let _ = isa;
    epilogue_body::<{ cfg!(target_arch = "aarch64") }>(dst, ldc, r0, c0, rows, cols, ep)
}

/// The epilogue's loops, one branch-free loop per combination so that each vectorises
/// (the activations' multiply-adds fused where `FMA`).
#[inline(always)]
unsafe fn epilogue_body<const FMA: bool>(
    dst: *mut f32,
    ldc: usize,
    r0: usize,
    c0: usize,
    rows: usize,
    cols: usize,
    ep: &Epilogue,
) {
    let act = ep.act.unwrap_or(Activation::Identity);
    for r in 0..rows {
        let row = std::slice::from_raw_parts_mut(dst.add(r * ldc), cols);
        let rb = ep.row_bias.map_or(0.0, |b| b[r0 + r]);
        let res = ep.residual.map(|x| &x[(r0 + r) * ldc + c0..(r0 + r) * ldc + c0 + cols]);
        let cb = ep.col_bias.map(|b| &b[c0..c0 + cols]);
        macro_rules! apply {
            ($f:expr) => {
                match (cb, res) {
                    (None, None) => row.iter_mut().for_each(|v| *v = $f(*v + rb)),
                    (Some(cb), None) => row.iter_mut().zip(cb).for_each(|(v, &b)| *v = $f(*v + rb + b)),
                    (None, Some(res)) => row.iter_mut().zip(res).for_each(|(v, &x)| *v = $f(*v + rb + x)),
                    (Some(cb), Some(res)) => {
                        row.iter_mut().zip(cb).zip(res).for_each(|((v, &b), &x)| *v = $f(*v + rb + b + x))
                    }
                }
            };
        }
        // One loop per kind of activation, each vectorised.
        match act {
            Activation::Identity => apply!(|x: f32| x),
            Activation::Relu => apply!(relu),
            Activation::Clip(lo, hi) => apply!(|x: f32| clamp(x, lo, hi)),
            Activation::LeakyRelu(a) => apply!(|x: f32| if x < 0.0 { a * x } else { x }),
            Activation::HardSigmoid(a, b) => apply!(|x: f32| clamp(a * x + b, 0.0, 1.0)),
            Activation::HardSwish => apply!(|x: f32| Activation::HardSwish.apply(x)),
            // Each arm names its variant, so the match inside `apply_with` folds away (one
            // arm for the six would leave a six-way branch in the loop).
            Activation::Sigmoid => apply!(|x: f32| Activation::Sigmoid.apply_with::<FMA>(x)),
            Activation::Silu => apply!(|x: f32| Activation::Silu.apply_with::<FMA>(x)),
            Activation::Tanh => apply!(|x: f32| Activation::Tanh.apply_with::<FMA>(x)),
            Activation::Gelu => apply!(|x: f32| Activation::Gelu.apply_with::<FMA>(x)),
            Activation::GeluTanh => apply!(|x: f32| Activation::GeluTanh.apply_with::<FMA>(x)),
            Activation::Elu(a) => apply!(|x: f32| Activation::Elu(a).apply_with::<FMA>(x)),
        }
    }
    if let Some(post) = ep.post {
        post.apply_rows(dst, rows, cols, ldc);
    }
}
