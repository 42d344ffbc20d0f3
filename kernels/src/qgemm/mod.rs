//! Integer GEMM for quantized dense layers: u8 activations × s8 weights, exact 32-bit
//! sums, and an epilogue that takes the sums back to f32 (zero points subtracted, scaled,
//! bias added, clamped) while each tile is in registers.
//!
//! The weights are packed once, at load time, into panels of [`NR`] columns whose rows go
//! in groups of four: the 64 bytes AVX-512 VNNI's `vpdpbusd` multiplies with one broadcast
//! group of four activations, accumulating 16 sums at once (four times the products per
//! instruction of f32 FMAs). Weights stored as u8 are moved to s8 by subtracting 128 (and
//! their zero point with them), so every form runs on the one instruction. Where the CPU
//! has no VNNI the same packed layout runs an AVX2 kernel chosen at packing by what the
//! weights allow (`vpmaddubsw` as ONNX Runtime runs it with a few sums corrected,
//! `int8::plain`; else 16-bit products through `vpmaddwd`, on rows widened once per call
//! — a single row, a recurrent step, takes `int8::sign`, the activations' signs moved
//! onto the weights), or a portable kernel, with the same results.
//!
//! With `a` and `b` the stored integers and `za`, `zb` their zero points, the product of
//! the dequantized operands is
//! `Σk (a − za)(b − zb) = Σk a·b − za·Σk b − zb·Σk a + K·za·zb`: the kernel sums `a·b`, the
//! column sums of the weights are computed at packing and the row sums of the activations
//! while they are quantized, so the zero points cost one subtraction per output.

#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;
use crate::gemm::{Activation, Isa, Parallel};
use epilogue::{epilogue, Zeros};

mod epilogue;

/// Columns of a packed weight panel (two 16-lane vectors of sums).
pub const NR: usize = 32;
/// Rows of activations per microkernel tile.
pub const MR: usize = 12;

/// Weights `[K, N]` packed for [`qgemm`]: panels of [`NR`] columns, depth padded to a
/// multiple of four with zeros.
#[derive(Clone, Debug)]
pub struct PackedQB {
    k: usize,
    n: usize,
    /// Per panel, per group of four rows, `NR` columns × 4 bytes (s8).
    data: Vec<u8>,
    /// Σk b per column, of the s8 values.
    colsum: Vec<i32>,
    /// The zero point per column, in the s8 values' terms.
    zero: Vec<i32>,
    /// The AVX2 microkernel the packing was made for.
    avx2: Avx2Packing,
    /// Per panel, the packed weights that differ from the true ones, as `(column within
    /// the panel, depth, true − packed)`: each sum is then the kernel's plus the activation
    /// at that depth times the difference. Pairs that `vpmaddubsw` could saturate, shrunk
    /// for the plain kernel ([`crate::int8::plain::split_pairs`]); or, for the sign kernel,
    /// weights of −128 in s8 terms (a u8 weight of 0, the bottom of an asymmetric range,
    /// typically one per matrix) packed as −127, when few (`crate::int8::fixes`).
    fixes: Vec<Vec<crate::int8::plain::Fix>>,
}

/// Which AVX2 microkernel a packing takes (VNNI and the portable kernel take any, the
/// corrections being applied whatever the kernel).
#[derive(Clone, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Avx2Packing {
    /// Every pair of neighbouring depths fits `vpmaddubsw` ([`crate::int8::plain`]).
    Plain,
    /// No weight is −128: the sign kernel ([`crate::int8::sign`]) for a single row, each
    /// panel's sums starting from `128 · Σb` of the packed values; more rows are widened
    /// to 16 bits (`crate::int8::widened`).
    Sign(Vec<[i32; NR]>),
    /// Neither: exact 16-bit products (`vpmaddwd`).
    Wide,
}

/// Why weights could not be packed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct PackError(pub String);

impl PackedQB {
    /// Packs the `k × n` row-major weights `b` (s8 when `signed`, else u8) with a zero point
    /// of one value or one per column.
    pub fn new(b: &[u8], signed: bool, k: usize, n: usize, zero: &[i32]) -> Result<PackedQB, PackError> {
        let (data, colsum, zero, lowest) = Self::panels(b, signed, k, n, zero)?;
        Ok(Self::for_avx2(k, n, data, colsum, zero, lowest))
    }

    /// [`new`](Self::new) for the kernel `isa` runs here. Where that is VNNI or the
    /// portable kernel (exact on any weights) the weights are packed as they are: no pairs
    /// shrunk for AVX2's `vpmaddubsw` and corrected per row of every product (on a
    /// transformer of such weights the corrections took 6% of the run), no −128 moved.
    /// On an AVX2 CPU such a packing (a program moved there) runs the exact widened kernel.
    pub fn for_isa(isa: Isa, b: &[u8], signed: bool, k: usize, n: usize, zero: &[i32]) -> Result<PackedQB, PackError> {
        let (data, colsum, zero, lowest) = Self::panels(b, signed, k, n, zero)?;
        if packs_for_avx2(isa) {
            return Ok(Self::for_avx2(k, n, data, colsum, zero, lowest));
        }
        let fixes = vec![Vec::new(); lowest.len()];
        Ok(PackedQB { k, n, data, colsum, zero, avx2: Avx2Packing::Wide, fixes })
    }

    /// The panels of [`new`]: the s8 values, their column sums, the zero points in s8
    /// terms, and per panel where the weights are −128.
    #[allow(clippy::type_complexity)]
    fn panels(
        b: &[u8],
        signed: bool,
        k: usize,
        n: usize,
        zero: &[i32],
    ) -> Result<(Vec<u8>, Vec<i32>, Vec<i32>, Vec<Vec<(u32, u32)>>), PackError> {
        if b.len() != k * n {
            return Err(PackError(format!("{} weights for a {k}×{n} matrix", b.len())));
        }
        if zero.len() != 1 && zero.len() != n {
            return Err(PackError(format!("{} zero points for {n} columns (one, or one per column)", zero.len())));
        }
        // u8 weights become s8 by subtracting 128: (b − zb) = (b − 128) − (zb − 128),
        // which flips the top bit.
        let shift = if signed { 0 } else { 128 };
        let flip = if signed { 0 } else { 0x80u8 };
        let groups = k.div_ceil(4);
        let panels = n.div_ceil(NR);
        let mut data = vec![0u8; panels * groups * NR * 4];
        let mut colsum = vec![0i32; n];
        let mut lowest = vec![Vec::new(); panels];
        // Row by row (each read once, in order), each panel's columns scattered 4 bytes
        // apart: the loop a run-time packing (`aim:QMatMul`'s B) spends its time in.
        for kk in 0..k {
            let (g, t) = (kk / 4, kk % 4);
            let row = &b[kk * n..(kk + 1) * n];
            for p in 0..panels {
                let cols = &row[p * NR..((p + 1) * NR).min(n)];
                let dst = &mut data[(p * groups + g) * NR * 4..][..NR * 4];
                let sums = &mut colsum[p * NR..p * NR + cols.len()];
                for ((jj, &v), sum) in cols.iter().enumerate().zip(sums) {
                    let v = v ^ flip;
                    dst[jj * 4 + t] = v;
                    *sum += v as i8 as i32;
                }
                if cols.iter().any(|&v| v ^ flip == 0x80) {
                    for (jj, _) in cols.iter().enumerate().filter(|(_, &v)| v ^ flip == 0x80) {
                        lowest[p].push((jj as u32, kk as u32));
                    }
                }
            }
        }
        let zero = (0..n).map(|j| zero[if zero.len() == 1 { 0 } else { j }] - shift).collect();
        Ok((data, colsum, zero, lowest))
    }

    /// The packing for AVX2's kernels, from the panels: the plain kernel's pairs shrunk
    /// where few need it, else the sign kernel's start sums, else the exact widened kernel.
    fn for_avx2(
        k: usize,
        n: usize,
        mut data: Vec<u8>,
        colsum: Vec<i32>,
        zero: Vec<i32>,
        lowest: Vec<Vec<(u32, u32)>>,
    ) -> PackedQB {
        let (groups, panels) = (k.div_ceil(4), n.div_ceil(NR));
        // The plain kernel when few pairs need shrinking (one in 256 weights: weights
        // quantized per tensor, or with headroom, have about none).
        if let Some(fixes) = crate::int8::plain::split_pairs(&mut data, groups, k * n, 256) {
            return PackedQB { k, n, data, colsum, zero, avx2: Avx2Packing::Plain, fixes };
        }
        // Else a few −128s are packed as −127 and corrected per row
        // (`crate::int8::fixes`); the packed values' sums (one more per −128) start the
        // sign kernel.
        let lowest = crate::int8::fixes::few(&lowest, k * n, 256);
        let mut packed_sum = colsum.clone();
        let mut fixes = vec![Vec::new(); panels];
        for (p, f) in lowest.iter().enumerate() {
            for &(jj, kk) in f {
                let (g, t) = (kk as usize / 4, kk as usize % 4);
                data[((p * groups + g) * NR + jj as usize) * 4 + t] = (-127i8) as u8;
                packed_sum[p * NR + jj as usize] += 1;
                fixes[p].push((jj, kk, -1));
            }
        }
        let avx2 = if crate::int8::sign::fits(&data) {
            Avx2Packing::Sign((0..panels).map(|p| crate::int8::sign::start(&[0; NR], &packed_sum[p * NR..])).collect())
        } else {
            Avx2Packing::Wide
        };
        PackedQB { k, n, data, colsum, zero, avx2, fixes }
    }

    /// Depth (rows of the unpacked weights).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The microkernel these weights run on with `isa`, for schedule texts.
    pub fn micro_name(&self, isa: Isa) -> &'static str {
        if use_vnni(isa) || !use_avx2(isa) {
            return micro_name(isa);
        }
        match self.avx2 {
            Avx2Packing::Plain => "AVX2 vpmaddubsw (every pair of weights fits 16 bits)",
            Avx2Packing::Sign(_) => {
                "AVX2 vpmaddwd on rows widened to 16 bits (a single row: vpmaddubsw, signs moved onto the weights)"
            }
            Avx2Packing::Wide => "AVX2 vpmaddwd (exact 16-bit products)",
        }
    }

    /// How many packed weights differ from the true ones (each corrected per row).
    pub fn corrections(&self) -> usize {
        self.fixes.iter().map(Vec::len).sum()
    }

    /// Whether any column has a nonzero zero point (then the activations' row sums are
    /// needed).
    pub fn needs_row_sums(&self) -> bool {
        self.zero.iter().any(|&z| z != 0)
    }
}

/// The activation side of one [`qgemm`]: `m` rows of u8, `stride` bytes apart (a multiple
/// of four, at least K, the padding bytes being anything), their zero point and, when the
/// weights need them, their row sums.
pub struct QuantizedA<'a> {
    /// The rows.
    pub data: &'a [u8],
    /// Rows.
    pub m: usize,
    /// Bytes from one row to the next.
    pub stride: usize,
    /// The zero point of every value.
    pub zero: i32,
    /// Σk a per row (empty when the weights' zero points are all zero).
    pub row_sums: &'a [i32],
}

/// DynamicQuantizeLinear of the `m × k` rows of `x` into `dst` (rows `stride` bytes apart,
/// the padding zeroed), with each row's sum in `row_sums` when it is not empty: the same
/// scale, zero point and values as the op's kernel gives (min and max combine the same in
/// any order), in one parallel pass over `x` for the range and one that quantizes while
/// it sums. Returns the scale and the zero point.
pub fn quantize_dynamic(
    isa: Isa,
    x: &[f32],
    k: usize,
    dst: &mut [u8],
    stride: usize,
    row_sums: &mut [i32],
    par: &dyn Parallel,
) -> (f32, i32) {
    use crate::fast::quant::{params_of_range, range};
    let m = x.len().checked_div(k).unwrap_or(0);
    assert!(stride >= k && dst.len() >= m * stride, "the quantized rows do not fit");
    let per = rows_per_chunk(m, k, par);
    let chunks = m.div_ceil(per);
    let ranges: Vec<std::sync::Mutex<(f32, f32)>> = (0..chunks).map(|_| std::sync::Mutex::new((0.0, 0.0))).collect();
    par.for_each(chunks, &|c| {
        let r = range(isa, &x[c * per * k..((c + 1) * per).min(m) * k]);
        *ranges[c].lock().unwrap_or_else(|e| e.into_inner()) = r;
    });
    let (lo, hi) = ranges
        .iter()
        .map(|r| *r.lock().unwrap_or_else(|e| e.into_inner()))
        .fold((0.0f32, 0.0f32), |(a, b), (l, h)| (a.min(l), b.max(h)));
    let (scale, zp) = params_of_range(lo, hi);
    quantize_rows(isa, x, k, dst, stride, row_sums, scale, zp, par);
    (scale, zp as i32)
}

/// QuantizeLinear of the `m × k` rows of `x` to u8 with a known `scale` and zero point `zp`
/// (a statically quantized layer's input) into `dst` as [`quantize_dynamic`] lays them out,
/// with the row sums when `row_sums` is not empty.
#[allow(clippy::too_many_arguments)]
pub fn quantize_rows(
    isa: Isa,
    x: &[f32],
    k: usize,
    dst: &mut [u8],
    stride: usize,
    row_sums: &mut [i32],
    scale: f32,
    zp: f32,
    par: &dyn Parallel,
) {
    use crate::fast::quant::quantize;
    let m = x.len().checked_div(k).unwrap_or(0);
    assert!(stride >= k && dst.len() >= m * stride, "the quantized rows do not fit");
    let per = rows_per_chunk(m, k, par);
    let chunks = m.div_ceil(per);
    let out = crate::util::SharedMut(dst.as_mut_ptr());
    let sums = SumPtr(row_sums.as_mut_ptr(), row_sums.len());
    par.for_each(chunks, &|c| {
        let (out, sums) = (out, sums);
        for i in c * per..((c + 1) * per).min(m) {
            // SAFETY: chunks write disjoint rows of `dst` (m·stride bytes, checked above)
            // and of `row_sums`.
            let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * stride), stride) };
            if scale == 0.0 {
                d[..k].fill(zp as u8);
            } else {
                quantize(isa, &x[i * k..(i + 1) * k], &mut d[..k], scale, zp);
            }
            d[k..].fill(0);
            if i < sums.1 {
                // SAFETY: i < row_sums.len(); one writer per row.
                unsafe { *sums.0.add(i) = d[..k].iter().map(|&v| v as i32).sum() };
            }
        }
    });
}

/// Rows per task of the quantizing passes over `m` rows of `k`: at least 16 K values, a
/// few tasks per thread.
fn rows_per_chunk(m: usize, k: usize, par: &dyn Parallel) -> usize {
    (16384 / k.max(1)).max(1).max(m.div_ceil(par.threads() * 4))
}

/// The row sums, likewise (pointer and length).
#[derive(Clone, Copy)]
struct SumPtr(*mut i32, usize);
// SAFETY: every task writes its own rows' sums.
unsafe impl Send for SumPtr {}
unsafe impl Sync for SumPtr {}

/// What the sums become: `y = act((sum − zero terms) · scale[j] + bias[j])`.
pub struct QEpilogue<'a> {
    /// One scale, or one per column.
    pub scale: &'a [f32],
    /// One bias per column.
    pub bias: Option<&'a [f32]>,
    /// The activation.
    pub act: Option<Activation>,
}

/// `y[m×n] (row stride ldy) = epilogue(A · B)`, over `par`'s threads.
///
/// Panics when a buffer is too small for the sizes given (the kernels read and write
/// through raw pointers).
pub fn qgemm(isa: Isa, a: &QuantizedA, b: &PackedQB, ep: &QEpilogue, y: &mut [f32], ldy: usize, par: &dyn Parallel) {
    let (m, n, k) = (a.m, b.n, b.k);
    assert!(a.stride >= k && a.stride.is_multiple_of(4), "activation rows of {} bytes for depth {k}", a.stride);
    assert!(m == 0 || a.data.len() >= (m - 1) * a.stride + k.div_ceil(4) * 4, "activations are too small");
    assert!(ldy >= n && (m == 0 || y.len() >= (m - 1) * ldy + n), "the output is too small");
    assert!(ep.scale.len() == 1 || ep.scale.len() == n, "{} scales for {n} columns", ep.scale.len());
    assert!(ep.bias.is_none_or(|v| v.len() == n), "one bias per column");
    assert!(!b.needs_row_sums() || a.row_sums.len() >= m, "the weights' zero points need row sums");
    let store = |r0: usize, j0: usize, sums: &[[i32; NR]], mut out: TileOut| {
        // Where a packed weight differs from the true one, the sum differs by the
        // activation there times the difference.
        let fixes = &b.fixes[j0 / NR];
        let mut fixed;
        let sums = if fixes.is_empty() {
            sums
        } else {
            fixed = [[0i32; NR]; MR];
            let fixed = &mut fixed[..sums.len()];
            fixed.copy_from_slice(sums);
            for (r, f) in fixed.iter_mut().enumerate() {
                let x = &a.data[(r0 + r) * a.stride..];
                fixes.iter().for_each(|&(jj, kk, d)| {
                    f[jj as usize] = f[jj as usize].wrapping_add((x[kk as usize] as i32).wrapping_mul(d))
                });
            }
            &*fixed
        };
        // Σ(a − za)(b − zb) = Σab − za·Σb − zb·(Σa − k·za).
        let mut rows = [0i32; MR];
        for (r, v) in rows[..sums.len()].iter_mut().enumerate() {
            *v = a.row_sums.get(r0 + r).copied().unwrap_or(0).wrapping_sub((k as i32).wrapping_mul(a.zero));
        }
        let cols = out.cols();
        let zeros =
            Zeros { a: a.zero, colsum: &b.colsum[j0..j0 + cols], b: &b.zero[j0..j0 + cols], rows: &rows[..sums.len()] };
        epilogue(isa, sums, &zeros, ep, j0, &mut out);
    };
    if n < NARROW {
        return narrow(isa, a, b, y, ldy, par, store);
    }
    let rows = Rows { data: a.data, stride: a.stride, m, signed: false };
    // The NEON kernel starts each column from its weights' sum, which is the packed one
    // where no weight was packed as another.
    let dot_sums = b.fixes.iter().all(Vec::is_empty).then_some(&b.colsum[..]);
    tiles(isa, &rows, &b.data, &b.avx2, dot_sums, k.div_ceil(4), n, y, ldy, par, store);
}

/// Below this many columns a product runs as dot products of rows and columns
/// ([`narrow`]): a panel of [`NR`] columns would compute `NR / n` times the sums needed
/// (32× for the one column of an attention score), and four lanes of `vpdpbusd` per lane
/// of a widened product are not worth that.
const NARROW: usize = 8;

/// [`qgemm`] for fewer than [`NARROW`] columns: each row's dot product with each column of
/// B (unpacked once per call, as i32), summed exactly in i32 vectors, then `store`d as the
/// tiled kernel's sums are.
fn narrow<F>(isa: Isa, a: &QuantizedA, b: &PackedQB, y: &mut [f32], ldy: usize, par: &dyn Parallel, store: F)
where
    F: Fn(usize, usize, &[[i32; NR]], TileOut) + Sync,
{
    let (m, n, k) = (a.m, b.n, b.k);
    let groups = k.div_ceil(4);
    // Column j of the packed panel: group g's four values at ((g·NR) + j)·4.
    let cols: Vec<Vec<i32>> =
        (0..n).map(|j| (0..k).map(|kk| b.data[((kk / 4) * NR + j) * 4 + kk % 4] as i8 as i32).collect()).collect();
    debug_assert!(b.data.len() >= groups * NR * 4);
    let out = OutPtr(y.as_mut_ptr());
    let per = (16384 / k.max(1)).max(1);
    par.for_each(m.div_ceil(per), &|c| {
        let out = out;
        for row in c * per..((c + 1) * per).min(m) {
            let data = &a.data[row * a.stride..row * a.stride + k];
            let mut sums = [0i32; NR];
            for (s, col) in sums.iter_mut().zip(&cols) {
                *s = dot(isa, data, col);
            }
            // SAFETY: row < m, n ≤ ldy: inside `y` (checked by the caller); chunks write
            // disjoint rows.
            let tile = unsafe { TileOut::new(out.0.add(row * ldy), ldy, 1, n) };
            store(row, 0, std::slice::from_ref(&sums), tile);
        }
    });
}

/// Σ row·col (u8 by i32, wrapping as the tiled kernel's i32 sums do).
#[inline(always)]
fn dot_generic(row: &[u8], col: &[i32]) -> i32 {
    row.iter().zip(col).fold(0i32, |s, (&x, &w)| s.wrapping_add((x as i32).wrapping_mul(w)))
}

/// [`dot_generic`] compiled for the ISA, so that the products are vector code.
fn dot(isa: Isa, row: &[u8], col: &[i32]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx2")]
        unsafe fn v4(row: &[u8], col: &[i32]) -> i32 {
            dot_generic(row, col)
        }
        #[target_feature(enable = "avx2")]
        unsafe fn v3(row: &[u8], col: &[i32]) -> i32 {
            dot_generic(row, col)
        }
        // SAFETY: the ISA was checked available when the program was built.
        match isa.kind() {
            IsaKind::Avx512 => return unsafe { v4(row, col) },
            IsaKind::Avx2 => return unsafe { v3(row, col) },
            _ => {}
        }
    }
    let _ = isa;
    dot_generic(row, col)
}

/// The broadcast side of a tiled product: `m` rows `stride` bytes apart, u8 or s8 (the
/// panels then hold the other kind).
pub(crate) struct Rows<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) stride: usize,
    pub(crate) m: usize,
    pub(crate) signed: bool,
}

/// Runs every MR×NR tile of `rows · panels` (`groups` groups of four deep, `n` columns in
/// panels of NR) over `par`'s threads and hands each tile's sums (one array per row) to
/// `store` with its first row, first column and destination in `y` (`ldy` apart). `avx2` is the AVX2 kernel the
/// panels were packed for (the plain and sign kernels take u8 rows only). `dot_sums` are
/// the s8 side's sums along the depth — per column of the panels for u8 rows, per row for
/// s8 rows — which the NEON kernel (it flips the u8 side to signed bytes) starts from;
/// without them it does not run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tiles<F>(
    isa: Isa,
    a: &Rows,
    panels_data: &[u8],
    avx2: &Avx2Packing,
    dot_sums: Option<&[i32]>,
    groups: usize,
    n: usize,
    y: &mut [f32],
    ldy: usize,
    par: &dyn Parallel,
    store: F,
) where
    F: Fn(usize, usize, &[[i32; NR]], TileOut) + Sync,
{
    let m = a.m;
    if m == 0 || n == 0 {
        return;
    }
    let panels = n.div_ceil(NR);
    assert!(panels_data.len() >= panels * groups * NR * 4, "the panels are too small");
    assert!(a.data.len() >= (m - 1) * a.stride + groups * 4, "the rows are too small");
    assert!(ldy >= n && y.len() >= (m - 1) * ldy + n, "the output is too small");
    let blocks = m.div_ceil(MR);
    // Split rows too when there are few panels, so that every thread has work.
    let splits = (par.threads() * 4).div_ceil(panels).clamp(1, blocks);
    let per = blocks.div_ceil(splits);
    let out = OutPtr(y.as_mut_ptr());
    let vnni = use_vnni(isa);
    #[cfg(target_arch = "x86_64")]
    let (avx2, plain, sign_init) = {
        let on = !vnni && use_avx2(isa) && !a.signed;
        let sign = match avx2 {
            Avx2Packing::Sign(i) if on && i.len() >= panels => Some(i.as_slice()),
            _ => None,
        };
        (!vnni && use_avx2(isa), on && matches!(avx2, Avx2Packing::Plain), sign)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let sign_init = {
        let _ = avx2;
        None::<&[[i32; NR]]>
    };
    #[cfg(target_arch = "aarch64")]
    let neon = dot_sums.filter(|s| use_neon_dot(isa) && s.len() >= if a.signed { m } else { n });
    #[cfg(not(target_arch = "aarch64"))]
    let _ = dot_sums;
    // Without VNNI and with weights the plain kernel cannot take, the rows are widened to
    // 16 bits once per call (a pass over M·K bytes, next to M·K·N products) for
    // `int8::widened`: on AMD Zen 3 it ran 1.2–1.5× the sign kernel on a
    // transformer's layers (`qgemm_bench 400 384 1536`, alternating runs). A single row
    // (a recurrent step) keeps the byte kernels, as do rows past `int8::widened::WIDEN_MAX_BYTES`.
    #[cfg(target_arch = "x86_64")]
    let widened = (avx2 && !plain && m > 1 && m * groups * 8 <= crate::int8::widened::WIDEN_MAX_BYTES)
        .then(|| widen_rows(a, groups));
    #[cfg(target_arch = "x86_64")]
    let wide_base = widened.as_ref().map_or(0usize, |w| w.as_ptr() as usize);
    par.for_each(panels * splits, &|t| {
        let out = out;
        let (p, s) = (t / splits, t % splits);
        let panel = &panels_data[p * groups * NR * 4..(p + 1) * groups * NR * 4];
        let cols = (n - p * NR).min(NR);
        for blk in s * per..((s + 1) * per).min(blocks) {
            let r0 = blk * MR;
            let rows = (m - r0).min(MR);
            // The microkernel writes at least the tile's `rows` rows (no zeroing: for
            // shallow products that memset cost as much as the sums); a partial tile runs
            // a kernel of fewer rows (a GEMV's single row is not computed twelve times).
            let mut acc = std::mem::MaybeUninit::<[[i32; NR]; MR]>::uninit();
            let ptrs: [*const u8; MR] = std::array::from_fn(|r| a.data[(r0 + r.min(rows - 1)) * a.stride..].as_ptr());
            // SAFETY: every row pointer has `groups·4` readable bytes (checked above), the
            // panel `groups·NR·4`; VNNI only when this CPU has it.
            unsafe {
                let out = acc.as_mut_ptr();
                match (vnni, a.signed, sign_init) {
                    #[cfg(target_arch = "x86_64")]
                    _ if wide_base != 0 => {
                        // The tile's rows in the widened copy (the last repeated to fill it).
                        let base = wide_base as *const i16;
                        let w: [*const u8; MR] =
                            std::array::from_fn(|r| base.add((r0 + r.min(rows - 1)) * groups * 4) as *const u8);
                        let (p, out) = (panel.as_ptr(), out as *mut [i32; NR]);
                        if a.signed {
                            crate::int8::widened::tile::<true>(w.as_ptr(), 1, groups, p, &[0; NR], rows, out);
                        } else {
                            crate::int8::widened::tile::<false>(w.as_ptr(), 1, groups, p, &[0; NR], rows, out);
                        }
                    }
                    #[cfg(target_arch = "x86_64")]
                    (false, false, None) if plain => {
                        let out = out as *mut [i32; NR];
                        crate::int8::micro::by_two_rows::<crate::int8::plain::Plain>(
                            ptrs.as_ptr(),
                            1,
                            groups,
                            panel.as_ptr(),
                            &[0; NR],
                            rows,
                            out,
                        );
                    }
                    #[cfg(target_arch = "x86_64")]
                    (true, false, _) => match rows {
                        1 => micro_vnni::<false, 1>(&ptrs, panel.as_ptr(), groups, out),
                        2..=4 => micro_vnni::<false, 4>(&ptrs, panel.as_ptr(), groups, out),
                        _ => micro_vnni::<false, MR>(&ptrs, panel.as_ptr(), groups, out),
                    },
                    #[cfg(target_arch = "x86_64")]
                    (true, true, _) => match rows {
                        1 => micro_vnni::<true, 1>(&ptrs, panel.as_ptr(), groups, out),
                        2..=4 => micro_vnni::<true, 4>(&ptrs, panel.as_ptr(), groups, out),
                        _ => micro_vnni::<true, MR>(&ptrs, panel.as_ptr(), groups, out),
                    },
                    #[cfg(target_arch = "x86_64")]
                    (_, _, Some(starts)) => {
                        let (start, out) = (&starts[p], out as *mut [i32; NR]);
                        crate::int8::micro::by_two_rows::<crate::int8::sign::Sign>(
                            ptrs.as_ptr(),
                            1,
                            groups,
                            panel.as_ptr(),
                            start,
                            rows,
                            out,
                        );
                    }
                    #[cfg(target_arch = "x86_64")]
                    _ if avx2 => {
                        // Six rows at a time: 12 accumulators and 3 operands in 16 ymm.
                        let p = panel.as_ptr();
                        let out = out as *mut [i32; NR];
                        // `ptrs` repeats the last row up to MR, so every call below has
                        // the R pointers it reads.
                        for r0 in (0..rows).step_by(6) {
                            let (at, dst) = (&ptrs[r0..], out.add(r0));
                            match (a.signed, rows - r0) {
                                (false, 1) => micro_avx2::<false, 1>(at, p, groups, dst),
                                (false, 2..=3) => micro_avx2::<false, 3>(at, p, groups, dst),
                                (false, _) => micro_avx2::<false, 6>(at, p, groups, dst),
                                (true, 1) => micro_avx2::<true, 1>(at, p, groups, dst),
                                (true, 2..=3) => micro_avx2::<true, 3>(at, p, groups, dst),
                                (true, _) => micro_avx2::<true, 6>(at, p, groups, dst),
                            }
                        }
                    }
                    #[cfg(target_arch = "aarch64")]
                    _ if neon.is_some() => {
                        let sums = neon.unwrap_or_default();
                        let out = out as *mut [i32; NR];
                        if a.signed {
                            // Σ a·(b − 128) + 128·Σa: each row's sum added after.
                            crate::int8::neon::gemm_tile(&ptrs[..rows], true, groups, panel.as_ptr(), &[0; NR], out);
                            for r in 0..rows {
                                let add = sums[r0 + r].wrapping_mul(128);
                                (*out.add(r)).iter_mut().for_each(|v| *v = v.wrapping_add(add));
                            }
                        } else {
                            let start = crate::int8::sign::start(&[0; NR], &sums[p * NR..]);
                            crate::int8::neon::gemm_tile(&ptrs[..rows], false, groups, panel.as_ptr(), &start, out);
                        }
                    }
                    (_, false, _) => micro_portable::<false>(&ptrs, panel, groups, out),
                    (_, true, _) => micro_portable::<true>(&ptrs, panel, groups, out),
                }
            }
            // SAFETY: the microkernel stored rows 0..rows (it runs at least `rows`).
            let sums = unsafe { std::slice::from_raw_parts(acc.as_ptr() as *const [i32; NR], rows) };
            // SAFETY: rows r0..r0 + rows < m and columns p·NR + cols ≤ n ≤ ldy: inside `y`
            // (checked above); tasks write disjoint tiles.
            let tile = unsafe { TileOut::new(out.0.add(r0 * ldy + p * NR), ldy, rows, cols) };
            store(r0, p * NR, sums, tile);
        }
    });
}

/// The rows of `a` widened to 16 bits (`groups·4` values per row, u8 with zeros, s8 with
/// their sign), for [`crate::int8::widened`].
#[cfg(target_arch = "x86_64")]
fn widen_rows(a: &Rows, groups: usize) -> crate::scratch::ScratchBytes {
    let k4 = groups * 4;
    let mut w = crate::scratch::take_bytes(a.m * k4 * 2);
    for (row, dst) in w.chunks_exact_mut(k4 * 2).enumerate() {
        crate::int8::widened::widen(&a.data[row * a.stride..row * a.stride + k4], a.signed, dst);
    }
    w
}

/// A raw pointer to the output that tasks writing disjoint tiles may share.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes its own tiles.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// One tile's place in the output: `rows` rows of `cols` values, `ld` apart, that no other
/// task writes meanwhile; handed to a GEMM's `store` so that it finishes a tile in one call.
pub(crate) struct TileOut<'a> {
    ptr: *mut f32,
    ld: usize,
    rows: usize,
    cols: usize,
    _rows: std::marker::PhantomData<&'a mut [f32]>,
}

impl TileOut<'_> {
    /// # Safety
    /// `ptr` starts `rows` rows of `cols` writable values, `ld` apart, that nothing else
    /// reads or writes while the tile lives.
    pub(crate) unsafe fn new(ptr: *mut f32, ld: usize, rows: usize, cols: usize) -> Self {
        TileOut { ptr, ld, rows, cols, _rows: std::marker::PhantomData }
    }

    /// The tile's columns.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` of the tile. Panics past the tile's rows.
    pub(crate) fn row(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows, "row {r} of a tile of {}", self.rows);
        // SAFETY: inside the tile (`new`'s contract), borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.ld), self.cols) }
    }
}

/// Whether the integer products `isa` runs here are AVX2's `vpmaddubsw` ones, whose 16-bit
/// pair sums need weights packed for them (pairs shrunk, −128 moved, each corrected per
/// product); VNNI and the portable kernel are exact on weights as they are.
pub fn packs_for_avx2(isa: Isa) -> bool {
    use_avx2(isa) && !use_vnni(isa)
}

/// Whether `isa` runs the VNNI kernel here: AVX-512 chosen and VNNI present.
pub fn use_vnni(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa.kind() == IsaKind::Avx512 && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Whether `isa` runs the AVX2 integer kernels here (the plain and sign kernels of
/// `int8::plain` and `int8::sign`, exact 16-bit products through
/// `vpmaddwd`, the AVX2 byte
/// epilogues): AVX2 or AVX-512 chosen (an [`Isa`] of either kind has AVX2 and FMA).
pub fn use_avx2(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(isa.kind(), IsaKind::Avx2 | IsaKind::Avx512) && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Whether `isa` runs the NEON dot-product kernel here ([`crate::int8::neon`]): NEON
/// chosen and FEAT_DotProd present.
pub fn use_neon_dot(isa: Isa) -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        isa.kind() == crate::gemm::IsaKind::Neon && crate::int8::neon::available()
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = isa;
        false
    }
}

/// Whether `isa` has an integer microkernel here that beats f32 arithmetic (VNNI, AVX2's
/// 16-bit products, NEON's `sdot`): where it has not, quantized layers run as f32 kernels.
pub fn integer_kernels(isa: Isa) -> bool {
    use_vnni(isa) || use_avx2(isa) || use_neon_dot(isa)
}

/// The microkernel's name, for schedule texts.
pub fn micro_name(isa: Isa) -> &'static str {
    if use_vnni(isa) {
        "AVX-512 VNNI vpdpbusd"
    } else if use_neon_dot(isa) {
        "NEON sdot (the u8 side flipped to signed bytes, exact)"
    } else if use_avx2(isa) {
        "AVX2 vpmaddwd (exact 16-bit products)"
    } else {
        "portable i32"
    }
}

/// `acc[r][j] = Σ a[r]·b` over `groups` groups of four, with `vpdpbusd`: per group, two
/// 64-byte loads of the panel and one broadcast of four bytes per row. The instruction
/// multiplies unsigned bytes by signed ones: with `SIGNED_ROWS` the rows are the s8 side
/// and the panel the u8 one.
///
/// Only the first `R` rows (at most [`MR`]) are summed and written.
///
/// # Safety
/// The CPU has AVX-512F and VNNI; each row pointer has `groups·4` readable bytes,
/// `panel` `groups·NR·4`, and `acc` is writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn micro_vnni<const SIGNED_ROWS: bool, const R: usize>(
    a: &[*const u8; MR],
    panel: *const u8,
    groups: usize,
    acc: *mut [[i32; NR]; MR],
) {
    use std::arch::x86_64::*;
    let mut c = [[_mm512_setzero_si512(); 2]; R];
    for g in 0..groups {
        let b0 = _mm512_loadu_si512(panel.add(g * NR * 4) as *const _);
        let b1 = _mm512_loadu_si512(panel.add(g * NR * 4 + 64) as *const _);
        for r in 0..R {
            let av = _mm512_set1_epi32((a[r].add(g * 4) as *const i32).read_unaligned());
            if SIGNED_ROWS {
                c[r][0] = _mm512_dpbusd_epi32(c[r][0], b0, av);
                c[r][1] = _mm512_dpbusd_epi32(c[r][1], b1, av);
            } else {
                c[r][0] = _mm512_dpbusd_epi32(c[r][0], av, b0);
                c[r][1] = _mm512_dpbusd_epi32(c[r][1], av, b1);
            }
        }
    }
    let acc = acc as *mut i32;
    for (r, c) in c.iter().enumerate() {
        _mm512_storeu_si512(acc.add(r * NR) as *mut _, c[0]);
        _mm512_storeu_si512(acc.add(r * NR + 16) as *mut _, c[1]);
    }
}

/// [`micro_vnni`]'s sums on AVX2, exactly: both sides widened to 16 bits (the u8 side with
/// zeros, the s8 side with its sign) and multiplied in pairs by `vpmaddwd`, whose 32-bit
/// sums of two products cannot overflow. (`vpmaddubsw` would multiply the bytes directly
/// at twice the rate, but saturates its 16-bit pair sums when weights use the whole s8
/// range: ONNX Runtime's AVX2 kernel gives wrong sums there.) Per group of four rows of
/// the panel and eight of its columns: two loads widened, then per row one broadcast of
/// its four values and two `vpmaddwd`, whose lanes hold each column's two pair sums; the
/// pairs are added once, at the end.
///
/// `rows` holds at least `R` row pointers (the caller repeats the last row to fill a
/// partial tile); rows `0..R` of `acc` are written.
///
/// # Safety
/// The CPU has AVX2; each row pointer has `groups·4` readable bytes, `panel` `groups·NR·4`,
/// and `acc` has `R` writable rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn micro_avx2<const SIGNED_ROWS: bool, const R: usize>(
    rows: &[*const u8],
    panel: *const u8,
    groups: usize,
    acc: *mut [i32; NR],
) {
    use std::arch::x86_64::*;
    let row = |r: usize| rows[r];
    let widen_rows = |p: *const u8| -> __m256i {
        let v = _mm_cvtsi32_si128((p as *const i32).read_unaligned());
        let w = if SIGNED_ROWS { _mm_cvtepi8_epi16(v) } else { _mm_cvtepu8_epi16(v) };
        _mm256_broadcastq_epi64(w)
    };
    let widen_panel = |p: *const u8| -> __m256i {
        let v = _mm_loadu_si128(p as *const __m128i);
        if SIGNED_ROWS {
            _mm256_cvtepu8_epi16(v)
        } else {
            _mm256_cvtepi8_epi16(v)
        }
    };
    if R == 1 {
        // One row (a recurrent step's GEMV): its broadcast made once per group, all 32
        // columns' 8 accumulators in registers.
        let mut c = [_mm256_setzero_si256(); 8];
        for g in 0..groups {
            let av = widen_rows(row(0).add(g * 4));
            let at = panel.add(g * NR * 4);
            for (h, c) in c.iter_mut().enumerate() {
                *c = _mm256_add_epi32(*c, _mm256_madd_epi16(widen_panel(at.add(h * 16)), av));
            }
        }
        for chunk in 0..NR / 8 {
            let s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(c[2 * chunk], c[2 * chunk + 1]), 0b11_01_10_00);
            _mm256_storeu_si256((acc as *mut i32).add(chunk * 8) as *mut __m256i, s);
        }
        return;
    }
    // Four chunks of eight columns; the rows' broadcasts are rebuilt per chunk (cheap next
    // to the products) so that 2·R accumulators stay in registers.
    for chunk in 0..NR / 8 {
        let mut lo = [_mm256_setzero_si256(); R];
        let mut hi = [_mm256_setzero_si256(); R];
        for g in 0..groups {
            let at = panel.add(g * NR * 4 + chunk * 32);
            let (w0, w1) = (widen_panel(at), widen_panel(at.add(16)));
            for r in 0..R {
                let av = widen_rows(row(r).add(g * 4));
                lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(w0, av));
                hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(w1, av));
            }
        }
        for r in 0..R {
            // lo: columns 0–3 as pair sums (c0a, c0b, c1a, c1b, ...), hi: columns 4–7.
            // hadd gives (c0, c1, c4, c5, c2, c3, c6, c7); the permute puts them in order.
            let s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0b11_01_10_00);
            _mm256_storeu_si256((acc.add(r) as *mut i32).add(chunk * 8) as *mut __m256i, s);
        }
    }
}

/// The same sums in plain Rust (any CPU; the results are exact, so they equal VNNI's).
///
/// # Safety
/// Each row pointer has `groups·4` readable bytes and `out` is writable.
unsafe fn micro_portable<const SIGNED_ROWS: bool>(
    a: &[*const u8; MR],
    panel: &[u8],
    groups: usize,
    out: *mut [[i32; NR]; MR],
) {
    let mut acc = [[0i32; NR]; MR];
    type Widen = fn(u8) -> i32;
    let (ra, pa): (Widen, Widen) =
        if SIGNED_ROWS { (|v| v as i8 as i32, |v| v as i32) } else { (|v| v as i32, |v| v as i8 as i32) };
    for g in 0..groups {
        let bg = &panel[g * NR * 4..(g + 1) * NR * 4];
        for r in 0..MR {
            let av = std::slice::from_raw_parts(a[r].add(g * 4), 4);
            for j in 0..NR {
                let mut s = 0i32;
                for t in 0..4 {
                    s += ra(av[t]) * pa(bg[j * 4 + t]);
                }
                acc[r][j] += s;
            }
        }
    }
    out.write(acc);
}
