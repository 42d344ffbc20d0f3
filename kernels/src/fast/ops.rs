//! The fast kernels and their dispatch table.

#[cfg(target_arch = "x86_64")]
use crate::gemm::IsaKind;

use super::math;
use super::output::{OutSlot, Output};
use crate::gemm::{gemm_rows, Blocking, Epilogue, Isa, PackedB, Parallel, Sequential};
use crate::util::SharedMut;
use crate::util::{axis, broadcast_offsets, broadcast_shapes, strides, Result};
use aim_ir::{DType, Node, Tensor};

/// What a fast kernel runs with.
pub struct Ctx<'a> {
    /// The thread pool.
    pub par: &'a dyn Parallel,
    /// The microkernel family.
    pub isa: Isa,
    /// GEMM cache blocking.
    pub blocking: Blocking,
    /// Where to write the first output, if the executor offers a place.
    pub out: Option<OutSlot>,
}

/// A fast kernel: `None` when it does not handle this case.
pub type FastKernel = fn(&Node, &[Option<Tensor>], &Ctx) -> Option<Result<Vec<Tensor>>>;

/// The fast kernel of an op, if there is one.
pub fn kernel(op: &str) -> Option<FastKernel> {
    Some(match op {
        "Erf" | "Exp" | "Tanh" | "Sigmoid" | "Relu" | "Sqrt" | "Neg" | "Abs" | "Reciprocal" | "Gelu" | "Log"
        | "Softplus" | "Softsign" | "Mish" | "Elu" | "Selu" | "Celu" | "LeakyRelu" | "ThresholdedRelu"
        | "HardSigmoid" | "HardSwish" | "Floor" | "Ceil" | "Round" | "Clip" => unary,
        "Add" | "Sub" | "Mul" | "Div" | "Pow" => binary,
        "Softmax" | "LogSoftmax" => softmax,
        "LayerNormalization" => layer_norm,
        "Transpose" => transpose,
        "DequantizeLinear" => dequantize_linear,
        "MaxPool" | "AveragePool" => pool2d,
        "GlobalAveragePool" | "GlobalMaxPool" => global_pool,
        "MatMul" => matmul,
        "Resize" => super::resize::resize,
        "Concat" => super::data::concat,
        "Split" => super::data::split,
        "Slice" => super::data::slice,
        "Pad" => super::data::pad,
        "Gather" => super::data::gather,
        "LSTM" => super::recurrent::lstm,
        "GRU" => super::gru::gru,
        "RNN" => super::rnn::rnn,
        "Where" => super::logic::where_,
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" => super::logic::compare,
        "Not" => super::logic::not,
        "Cast" => super::logic::cast,
        "Expand" => super::logic::expand,
        "DynamicQuantizeLinear" => super::quant::dynamic_quantize_linear,
        "Range" => super::logic::range,
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceSumSquare" => super::reduce::reduce,
        _ => return None,
    })
}

/// Whether the fast kernel of `op` (if it has one) runs for inputs of `dtype` (`None`: not
/// known yet); for others the reference kernel runs.
pub fn covers(op: &str, dtype: Option<DType>) -> bool {
    let Some(d) = dtype else { return kernel(op).is_some() };
    kernel(op).is_some()
        && match op {
            "Concat" | "Split" | "Slice" | "Pad" | "Gather" | "Where" | "Equal" | "Less" | "Greater"
            | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" | "Not" | "Cast" | "Expand" | "Transpose" => true,
            "DequantizeLinear" => matches!(d, DType::U8 | DType::I8 | DType::U16 | DType::I16),
            "Add" | "Sub" | "Mul" | "Div" => matches!(d, DType::F32 | DType::I64 | DType::I32),
            "Range" => matches!(d, DType::F32 | DType::I64 | DType::I32),
            _ => d == DType::F32,
        }
}

fn f32_in(ins: &[Option<Tensor>], i: usize) -> Option<&Tensor> {
    ins.get(i)?.as_ref().filter(|t| t.dtype() == DType::F32)
}

const CHUNK: usize = 16 * 1024;

/// Runs `body(range)` over `0..n` in chunks on the pool, giving each chunk its slice of `dst`.
fn chunked(par: &dyn Parallel, n: usize, dst: &mut [f32], body: &(dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync)) {
    let chunks = n.div_ceil(CHUNK).max(1);
    let out = SharedMut(dst.as_mut_ptr());
    par.for_each(chunks, &|c| {
        let out = out;
        let r = c * CHUNK..((c + 1) * CHUNK).min(n);
        // SAFETY: chunk c owns dst[r].
        let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(r.start), r.len()) };
        body(r, d);
    });
}

macro_rules! versions {
    ($name:ident, $generic:ident, ($($arg:ident: $ty:ty),*)) => {
        fn $name<F: Fn(f32) -> f32 + Sync>(isa: Isa, $($arg: $ty,)* f: &F) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn v4<F: Fn(f32) -> f32>($($arg: $ty,)* f: &F) { $generic($($arg,)* f) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3<F: Fn(f32) -> f32>($($arg: $ty,)* f: &F) { $generic($($arg,)* f) }
                // SAFETY: the ISA was checked available when the program was built.
                match isa.kind() {
                    IsaKind::Avx512 => return unsafe { v4($($arg,)* f) },
                    IsaKind::Avx2 => return unsafe { v3($($arg,)* f) },
                    IsaKind::Portable | IsaKind::Neon => {}
                }
            }
            let _ = isa;
            $generic($($arg,)* f)
        }
    };
}

/// Like `versions!`, for functions without a closure argument.
macro_rules! plain_versions {
    ($vis:vis $name:ident, $generic:ident, ($($arg:ident: $ty:ty),*)) => {
        $vis fn $name(isa: $crate::gemm::Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn v4($($arg: $ty),*) { $generic($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3($($arg: $ty),*) { $generic($($arg),*) }
                // SAFETY: the ISA was checked available when the program was built.
                match isa.kind() {
                    $crate::gemm::IsaKind::Avx512 => return unsafe { v4($($arg),*) },
                    $crate::gemm::IsaKind::Avx2 => return unsafe { v3($($arg),*) },
                    $crate::gemm::IsaKind::Portable | $crate::gemm::IsaKind::Neon => {}
                }
            }
            let _ = isa;
            $generic($($arg),*)
        }
    };
}

/// Sixteen independent accumulators, so that reductions vectorise (a single running
/// value is a chain of dependent scalar operations).
const ACC: usize = 16;

/// Σ f(s[i]), in sixteen partial sums.
#[inline(always)]
fn lanes_sum(s: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; ACC];
    let chunks = s.chunks_exact(ACC);
    let rest: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for i in 0..ACC {
            acc[i] += f(c[i]);
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// Like `plain_versions!`, for a generic with a `const FMA: bool` parameter (the math
/// functions' polynomials, see `math::fma`): fused multiply-adds in the AVX2 and AVX-512
/// versions and on aarch64, a multiply and an add elsewhere.
macro_rules! fma_versions {
    ($vis:vis $name:ident, $generic:ident, ($($arg:ident: $ty:ty),*)) => {
        fma_versions!($vis $name, $generic, ($($arg: $ty),*) -> ());
    };
    ($vis:vis $name:ident, $generic:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $vis fn $name(isa: $crate::gemm::Isa, $($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn v4($($arg: $ty),*) -> $ret { $generic::<true>($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3($($arg: $ty),*) -> $ret { $generic::<true>($($arg),*) }
                // SAFETY: the ISA was checked available when the program was built.
                match isa.kind() {
                    $crate::gemm::IsaKind::Avx512 => return unsafe { v4($($arg),*) },
                    $crate::gemm::IsaKind::Avx2 => return unsafe { v3($($arg),*) },
                    $crate::gemm::IsaKind::Portable | $crate::gemm::IsaKind::Neon => {}
                }
            }
            let _ = isa;
            $generic::<{ cfg!(target_arch = "aarch64") }>($($arg),*)
        }
    };
}

/// `d = softmax(f(s, m))` over one row, where `f` maps each value of `s` with its
/// companion in `m` (the mask row, or `s` again when there is none): the largest mapped
/// value, then exp(x − max) stored and summed in one pass, then the division. The map is
/// evaluated twice rather than stored, so the row is read twice and written twice.
#[inline(always)]
fn softmax_mapped<const FMA: bool>(s: &[f32], m: &[f32], d: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    let k = 1.0 / exp_mapped::<FMA>(s, m, d, f);
    d.iter_mut().for_each(|v| *v *= k);
}

/// [`softmax_mapped`] without the division: `d = exp(f(s, m) − max)`, returning Σ d (a
/// caller that scales something smaller than the row, like attention's output row, divides
/// that instead).
#[inline(always)]
fn exp_mapped<const FMA: bool>(s: &[f32], m: &[f32], d: &mut [f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = s.len();
    let (m, d) = (&m[..n], &mut d[..n]);
    let whole = n / ACC * ACC;
    let mut acc = [f32::NEG_INFINITY; ACC];
    for (sc, mc) in s[..whole].chunks_exact(ACC).zip(m[..whole].chunks_exact(ACC)) {
        for l in 0..ACC {
            let x = f(sc[l], mc[l]);
            acc[l] = if x > acc[l] { x } else { acc[l] };
        }
    }
    let mut mx = f32::NEG_INFINITY;
    for i in whole..n {
        let x = f(s[i], m[i]);
        mx = if x > mx { x } else { mx };
    }
    for a in acc {
        mx = if a > mx { a } else { mx };
    }
    let mut sums = [0f32; ACC];
    for ((sc, mc), dc) in
        s[..whole].chunks_exact(ACC).zip(m[..whole].chunks_exact(ACC)).zip(d[..whole].chunks_exact_mut(ACC))
    {
        for l in 0..ACC {
            let e = math::exp_with::<FMA>(f(sc[l], mc[l]) - mx);
            dc[l] = e;
            sums[l] += e;
        }
    }
    let mut sum = 0f32;
    for i in whole..n {
        let e = math::exp_with::<FMA>(f(s[i], m[i]) - mx);
        d[i] = e;
        sum += e;
    }
    sums.iter().sum::<f32>() + sum
}

/// One softmax row: exp(x − max) / Σ.
#[inline(always)]
fn softmax_row_generic<const FMA: bool>(s: &[f32], d: &mut [f32]) {
    softmax_mapped::<FMA>(s, s, d, |v, _| v);
}
fma_versions!(softmax_row, softmax_row_generic, (s: &[f32], d: &mut [f32]));

/// `d = softmax(s · scale + m)` (`m` empty: no mask).
#[inline(always)]
fn scaled_softmax_row_generic<const FMA: bool>(s: &[f32], m: &[f32], scale: f32, d: &mut [f32]) {
    if m.is_empty() {
        softmax_mapped::<FMA>(s, s, d, |v, _| v * scale);
    } else {
        softmax_mapped::<FMA>(s, m, d, |v, k| math::madd::<FMA>(v, scale, k));
    }
}
fma_versions!(pub(super) scaled_softmax_row, scaled_softmax_row_generic, (s: &[f32], m: &[f32], scale: f32, d: &mut [f32]));

/// `d = exp(s · scale + m − max)` (`m` empty: no mask), returning Σ d: the softmax row
/// before its division.
#[inline(always)]
fn scaled_exp_row_generic<const FMA: bool>(s: &[f32], m: &[f32], scale: f32, d: &mut [f32]) -> f32 {
    if m.is_empty() {
        exp_mapped::<FMA>(s, s, d, |v, _| v * scale)
    } else {
        exp_mapped::<FMA>(s, m, d, |v, k| math::madd::<FMA>(v, scale, k))
    }
}
fma_versions!(pub(super) scaled_exp_row, scaled_exp_row_generic, (s: &[f32], m: &[f32], scale: f32, d: &mut [f32]) -> f32);

/// One layer-norm row: (x − mean) / √(var + eps) · scale + bias.
#[inline(always)]
fn layer_norm_row_generic(s: &[f32], d: &mut [f32], scale: &[f32], bias: Option<&[f32]>, eps: f32) {
    let n = s.len() as f32;
    let mean = lanes_sum(s, |v| v) / n;
    let var = lanes_sum(s, |v| (v - mean) * (v - mean)) / n;
    let inv = 1.0 / (var + eps).sqrt();
    match bias {
        Some(b) => {
            for (((o, &v), &g), &b) in d.iter_mut().zip(s).zip(scale).zip(b) {
                *o = (v - mean) * inv * g + b;
            }
        }
        None => {
            for ((o, &v), &g) in d.iter_mut().zip(s).zip(scale) {
                *o = (v - mean) * inv * g;
            }
        }
    }
}
plain_versions!(layer_norm_row, layer_norm_row_generic, (s: &[f32], d: &mut [f32], scale: &[f32], bias: Option<&[f32]>, eps: f32));

#[inline(always)]
fn map_generic<F: Fn(f32) -> f32>(s: &[f32], d: &mut [f32], f: &F) {
    for (o, &x) in d.iter_mut().zip(s) {
        *o = f(x);
    }
}
versions!(map, map_generic, (s: &[f32], d: &mut [f32]));

fn unary(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = f32_in(ins, 0)?;
    let mut y = match Output::new(cx.out, DType::F32, x.shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let xd = x.data::<f32>();
    let isa = cx.isa;
    macro_rules! go {
        ($f:expr) => {{
            let f = $f;
            chunked(cx.par, xd.len(), y.bits_mut(), &|r, d| map(isa, &xd[r], d, &f));
        }};
    }
    // `$f` with the constant `FMA` naming whether the ISA fuses multiply-adds (the math
    // functions' polynomials then take half the operations).
    macro_rules! go_fma {
        ($f:expr) => {{
            if math::fma(isa) {
                const FMA: bool = true;
                go!($f)
            } else {
                const FMA: bool = false;
                go!($f)
            }
        }};
    }
    match n.op.as_str() {
        "Erf" => go_fma!(math::erf_with::<FMA>),
        "Exp" => go_fma!(math::exp_with::<FMA>),
        "Tanh" => go_fma!(math::tanh_with::<FMA>),
        "Sigmoid" => go_fma!(math::sigmoid_with::<FMA>),
        "Relu" => go!(crate::gemm::relu),
        "Sqrt" => go!(f32::sqrt),
        "Neg" => go!(|v: f32| -v),
        "Abs" => go!(f32::abs),
        "Reciprocal" => go!(|v: f32| 1.0 / v),
        "Gelu" if n.string("approximate", "none") == "tanh" => {
            go_fma!(|v: f32| 0.5 * v * (1.0 + math::tanh_with::<FMA>(0.797_884_6 * (v + 0.044_715 * v * v * v))))
        }
        "Gelu" => go_fma!(|v: f32| 0.5 * v * (1.0 + math::erf_with::<FMA>(v * std::f32::consts::FRAC_1_SQRT_2))),
        "Log" => go!(f32::ln),
        "Floor" => go!(f32::floor),
        "Ceil" => go!(f32::ceil),
        // ONNX rounds halves to even (QuantizeLinear written out, as the fake-quantization
        // of a value whose shape is not known at compile time leaves it).
        "Round" => go!(f32::round_ties_even),
        "Softplus" => go!(softplus),
        "Softsign" => go!(|v: f32| v / (1.0 + v.abs())),
        "Mish" => go_fma!(|v: f32| v * math::tanh_with::<FMA>(softplus(v))),
        "LeakyRelu" => {
            let a = n.float_attr("alpha");
            go!(move |v: f32| if v < 0.0 { a * v } else { v })
        }
        "ThresholdedRelu" => {
            let a = n.float_attr("alpha");
            go!(move |v: f32| if v > a { v } else { 0.0 })
        }
        "HardSigmoid" | "HardSwish" => {
            let (a, b) =
                if n.op == "HardSwish" { (1.0 / 6.0, 0.5) } else { (n.float_attr("alpha"), n.float_attr("beta")) };
            let swish = n.op == "HardSwish";
            go!(move |v: f32| {
                let g = (a * v + b).clamp(0.0, 1.0);
                if swish {
                    v * g
                } else {
                    g
                }
            })
        }
        // alpha·(e^(x/theta) − 1)·gamma below zero, gamma·x above: Elu (gamma = theta = 1),
        // Selu (theta = 1), Celu (gamma = 1, theta = alpha).
        "Elu" | "Selu" | "Celu" => {
            let (a, gamma, theta) = match n.op.as_str() {
                "Elu" => (n.float_attr("alpha"), 1.0, 1.0),
                "Selu" => (n.float_attr("alpha"), n.float_attr("gamma"), 1.0),
                _ => (n.float_attr("alpha"), 1.0, n.float_attr("alpha")),
            };
            go!(move |v: f32| if v > 0.0 { gamma * v } else { gamma * a * (math::exp(v / theta) - 1.0) })
        }
        "Clip" => {
            let bound = |i: usize, d: f32| match ins.get(i).and_then(|t| t.as_ref()) {
                None => Some(d),
                Some(t) if t.dtype() == DType::F32 && t.len() == 1 => Some(t.data::<f32>()[0]),
                Some(_) => None,
            };
            let (Some(lo), Some(hi)) = (bound(1, f32::NEG_INFINITY), bound(2, f32::INFINITY)) else { return None };
            go!(move |v: f32| if v.is_nan() { v } else { v.max(lo).min(hi) })
        }
        _ => return None,
    }
    Some(Ok(vec![y.finish()]))
}

/// ln(1 + e^x), exact to f32 for large x (where it is x).
#[inline(always)]
fn softplus(v: f32) -> f32 {
    if v > 20.0 {
        v
    } else {
        math::exp(v).ln_1p()
    }
}

#[inline(always)]
fn zip_generic<F: Fn(f32) -> f32>(a: &[f32], b: &[f32], d: &mut [f32], op: u8, f: &F) {
    let _ = f;
    match op {
        0 => d.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (x, y))| *o = x + y),
        1 => d.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (x, y))| *o = x - y),
        2 => d.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (x, y))| *o = x * y),
        _ => d.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (x, y))| *o = x / y),
    }
}
versions!(zip, zip_generic, (a: &[f32], b: &[f32], d: &mut [f32], op: u8));

fn binary(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    if ins.first()?.as_ref()?.dtype().is_int() {
        return super::logic::int_arith(n, ins, cx);
    }
    let (a, b) = (f32_in(ins, 0)?, f32_in(ins, 1)?);
    let isa = cx.isa;
    if n.op == "Pow" {
        if b.len() != 1 {
            return None;
        }
        let e = b.data::<f32>()[0];
        let mut y = match Output::new(cx.out, DType::F32, a.shape()) {
            Ok(y) => y,
            Err(e) => return Some(Err(e)),
        };
        let ad = a.data::<f32>();
        match e {
            2.0 => chunked(cx.par, ad.len(), y.bits_mut(), &|r, d| map(isa, &ad[r], d, &|v: f32| v * v)),
            0.5 => chunked(cx.par, ad.len(), y.bits_mut(), &|r, d| map(isa, &ad[r], d, &f32::sqrt)),
            _ => return None,
        }
        return Some(Ok(vec![y.finish()]));
    }
    let op = match n.op.as_str() {
        "Add" => 0,
        "Sub" => 1,
        "Mul" => 2,
        _ => 3,
    };
    let shape = match broadcast_shapes(&[a.shape(), b.shape()]) {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let total: usize = shape.iter().product();
    let mut y = match Output::new(cx.out, DType::F32, &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let (ad, bd) = (a.data::<f32>(), b.data::<f32>());
    let ident = |v: f32| v;
    if a.shape() == b.shape() {
        chunked(cx.par, total, y.bits_mut(), &|r, d| zip(isa, &ad[r.clone()], &bd[r], d, op, &ident));
        return Some(Ok(vec![y.finish()]));
    }
    // One operand repeats along the leading dims: with its leading 1s dropped, its shape is
    // the big operand's trailing dims (a row of `inner` values, or a scalar).
    let row = |small: &Tensor, big: &Tensor| {
        let s: &[usize] = {
            let lead = small.shape().iter().take_while(|&&d| d == 1).count();
            &small.shape()[lead..]
        };
        big.shape() == shape.as_slice()
            && !small.is_empty()
            && s.len() <= shape.len()
            && shape[shape.len() - s.len()..] == *s
    };
    let yd = y.bits_mut();
    if row(b, a) || row(a, b) {
        let (big, small, swapped) = if row(b, a) { (ad, bd, false) } else { (bd, ad, true) };
        let inner = small.len();
        // Tile the small operand to a few hundred values (a whole number of its rows), then
        // zip each part of the output against the tile, tile by tile.
        let reps = 256usize.div_ceil(inner).min(total.div_ceil(inner)).max(1);
        let mut tiled = Vec::with_capacity(reps * inner);
        for _ in 0..reps {
            tiled.extend_from_slice(small);
        }
        let tile = reps * inner;
        let step = tile * (CHUNK / tile).max(1);
        let parts = total.div_ceil(step);
        let out = SharedMut(yd.as_mut_ptr());
        let part = |p: usize| {
            let out = out;
            let r = p * step..((p + 1) * step).min(total);
            // SAFETY: part p owns y[r].
            let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(r.start), r.len()) };
            for (k, d) in d.chunks_mut(tile).enumerate() {
                let at = r.start + k * tile;
                let (bg, t) = (&big[at..at + d.len()], &tiled[..d.len()]);
                if swapped {
                    zip(isa, t, bg, d, op, &ident);
                } else {
                    zip(isa, bg, t, d, op, &ident);
                }
            }
        };
        if parts == 1 {
            part(0);
        } else {
            cx.par.for_each(parts, &part);
        }
        return Some(Ok(vec![y.finish()]));
    }
    // One operand repeats along some dims of the other (a per-channel scale in NCHW or in
    // the blocked layout, an SE gate): rows of the big operand against rows (or single
    // values) of the small one, as vector loops.
    if strided_broadcast(a, b, &shape, yd, op, isa, cx.par).is_some() {
        return Some(Ok(vec![y.finish()]));
    }
    // Both operands broadcast (an outer product of a row and a column, as a LayerNorm
    // written out in full computes its scale): row by row, each operand a row or one value.
    let (ra, rb) = (super::logic::rows(a.shape(), &shape), super::logic::rows(b.shape(), &shape));
    let inner = shape.last().copied().unwrap_or(1).max(1);
    let per = (CHUNK / inner).max(1);
    let nrows = total / inner;
    let out = SharedMut(yd.as_mut_ptr());
    cx.par.for_each(nrows.div_ceil(per), &|t| {
        let out = out;
        for r in t * per..((t + 1) * per).min(nrows) {
            // SAFETY: row r is written by this task only.
            let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(r * inner), inner) };
            broadcast_row(isa, side(&ra, ad, r, inner), side(&rb, bd, r, inner), d, op);
        }
    });
    Some(Ok(vec![y.finish()]))
}

/// Operand `v` (read as `rs` says) for output row `r` of `inner` values.
fn side<'a>(rs: &super::logic::Rows, v: &'a [f32], r: usize, inner: usize) -> Side<'a> {
    match rs.step {
        0 => Side::Value(v[rs.base[r]]),
        _ => Side::Row(&v[rs.base[r]..rs.base[r] + inner]),
    }
}

/// One operand of an output row: a row of values, or one value repeated.
enum Side<'a> {
    Row(&'a [f32]),
    Value(f32),
}

/// `d = a op b` for one output row (op: 0 add, 1 sub, 2 mul, 3 div), the op chosen outside
/// the loops so that they vectorise.
fn broadcast_row(isa: Isa, a: Side, b: Side, d: &mut [f32], op: u8) {
    fn each(d: &mut [f32], x: &[f32], f: impl Fn(f32) -> f32) {
        for (o, &v) in d.iter_mut().zip(x) {
            *o = f(v);
        }
    }
    match (a, b) {
        (Side::Row(x), Side::Row(y)) => zip(isa, x, y, d, op, &|v: f32| v),
        (Side::Row(x), Side::Value(v)) => match op {
            0 => each(d, x, |u| u + v),
            1 => each(d, x, |u| u - v),
            2 => each(d, x, |u| u * v),
            _ => each(d, x, |u| u / v),
        },
        (Side::Value(v), Side::Row(x)) => match op {
            0 => each(d, x, |u| v + u),
            1 => each(d, x, |u| v - u),
            2 => each(d, x, |u| v * u),
            _ => each(d, x, |u| v / u),
        },
        (Side::Value(u), Side::Value(v)) => d.fill(match op {
            0 => u + v,
            1 => u - v,
            2 => u * v,
            _ => u / v,
        }),
    }
}

/// `y = a op b` where one operand has the output's shape and the other the same shape with
/// some dims 1 (right-aligned): the dims collapse into runs that are either repeated or not
/// for the small operand; the innermost run is a vector loop (a zip of two rows, or a row
/// against one value of the small operand), the outer runs an index walk. `None` where
/// neither operand has the output's shape.
fn strided_broadcast(
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    y: &mut [f32],
    op: u8,
    isa: Isa,
    par: &dyn Parallel,
) -> Option<()> {
    let (big, small, swapped) = if a.shape() == shape {
        (a, b, false)
    } else if b.shape() == shape {
        (b, a, true)
    } else {
        return None;
    };
    let r = shape.len();
    let sdims: Vec<usize> = std::iter::repeat_n(1, r - small.rank()).chain(small.shape().iter().copied()).collect();
    // Runs of (size, whether the small operand repeats along it).
    let mut runs: Vec<(usize, bool)> = Vec::new();
    for (&d, &s) in shape.iter().zip(&sdims) {
        if d == 1 {
            continue;
        }
        let rep = s == 1;
        match runs.last_mut() {
            Some((n, r)) if *r == rep => *n *= d,
            _ => runs.push((d, rep)),
        }
    }
    let &(inner, inner_rep) = runs.last()?;
    let mut outer: Vec<(usize, bool)> = runs[..runs.len() - 1].to_vec();
    // A short row of the small operand repeated along the dim before it (a blocked layout's
    // 16 channels over every pixel): rows of `reps` repeats, zipped against a tile of them,
    // instead of one short zip per repeat.
    let reps = match outer.last() {
        Some(&(n, true)) if !inner_rep && inner < 256 => {
            outer.pop();
            n
        }
        _ => 1,
    };
    let rows: usize = outer.iter().map(|r| r.0).product();
    let (bd, sd) = (big.data::<f32>(), small.data::<f32>());
    let out = SharedMut(y.as_mut_ptr());
    let ident = |v: f32| v;
    let tile_reps = reps.min(256usize.div_ceil(inner.max(1)));
    let row_len = reps * inner;
    let per = (CHUNK / row_len.max(1)).max(1);
    par.for_each(rows.div_ceil(per), &|t| {
        let out = out;
        let mut tile = Vec::new();
        for row in t * per..((t + 1) * per).min(rows) {
            // The small operand's offset of this row: walk the outer runs (last fastest).
            let (mut rest, mut soff, mut sstride) = (row, 0usize, if inner_rep { 1 } else { inner });
            for &(n, rep) in outer.iter().rev() {
                let i = rest % n;
                rest /= n;
                if !rep {
                    soff += i * sstride;
                    sstride *= n;
                }
            }
            if reps > 1 {
                let s = &sd[soff..soff + inner];
                tile.clear();
                for _ in 0..tile_reps {
                    tile.extend_from_slice(s);
                }
                let at = row * row_len;
                // SAFETY: row `row` owns y[row·row_len .. (row+1)·row_len].
                let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), row_len) };
                for (k, d) in d.chunks_mut(tile.len()).enumerate() {
                    let src = &bd[at + k * tile.len()..at + k * tile.len() + d.len()];
                    let t = &tile[..d.len()];
                    if swapped {
                        zip(isa, t, src, d, op, &ident);
                    } else {
                        zip(isa, src, t, d, op, &ident);
                    }
                }
                continue;
            }
            let src = &bd[row * inner..(row + 1) * inner];
            // SAFETY: row `row` owns y[row·inner .. (row+1)·inner].
            let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(row * inner), inner) };
            if inner_rep {
                let v = sd[soff];
                let f = |x: f32| match (op, swapped) {
                    (0, _) => x + v,
                    (1, false) => x - v,
                    (1, true) => v - x,
                    (2, _) => x * v,
                    (_, false) => x / v,
                    (_, true) => v / x,
                };
                map(isa, src, d, &f);
            } else {
                let s = &sd[soff..soff + inner];
                if swapped {
                    zip(isa, s, src, d, op, &ident);
                } else {
                    zip(isa, src, s, d, op, &ident);
                }
            }
        }
    });
    Some(())
}

/// A row function: `(row index, source row, destination row)`.
type RowFn<'a> = &'a (dyn Fn(usize, &[f32], &mut [f32]) + Sync);

/// Runs `row(i, src_row, dst_row)` for each row of `len` values, in parallel.
fn rows(par: &dyn Parallel, src: &[f32], dst: &mut [f32], len: usize, row: RowFn) {
    let nrows = src.len() / len.max(1);
    let per = (CHUNK / len.max(1)).max(1);
    let out = SharedMut(dst.as_mut_ptr());
    par.for_each(nrows.div_ceil(per), &|t| {
        let out = out;
        for i in t * per..((t + 1) * per).min(nrows) {
            // SAFETY: row i is written by this task only.
            let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * len), len) };
            row(i, &src[i * len..(i + 1) * len], d);
        }
    });
}

/// Softmax (or LogSoftmax) over the middle axis of `[outer, len, inner]` blocks `s`:
/// column-wise, with the `inner` values of a row contiguous (vector loops over rows).
#[inline(always)]
fn softmax_columns_generic(s: &[f32], d: &mut [f32], len: usize, inner: usize, log: bool) {
    let (first, rest) = (&s[..inner], &s[inner..]);
    let mut m: Vec<f32> = first.to_vec();
    for row in rest.chunks_exact(inner) {
        for (a, &v) in m.iter_mut().zip(row) {
            *a = if v > *a || v.is_nan() { v } else { *a };
        }
    }
    let mut sum = vec![0f32; inner];
    for (dr, sr) in d.chunks_exact_mut(inner).zip(s.chunks_exact(inner)).take(len) {
        for (((o, &v), &mx), t) in dr.iter_mut().zip(sr).zip(&m).zip(sum.iter_mut()) {
            let e = math::exp(v - mx);
            *o = if log { v - mx } else { e };
            *t += e;
        }
    }
    if log {
        let ls: Vec<f32> = sum.iter().map(|v| v.ln()).collect();
        for dr in d.chunks_exact_mut(inner).take(len) {
            dr.iter_mut().zip(&ls).for_each(|(o, l)| *o -= l);
        }
    } else {
        let k: Vec<f32> = sum.iter().map(|v| 1.0 / v).collect();
        for dr in d.chunks_exact_mut(inner).take(len) {
            dr.iter_mut().zip(&k).for_each(|(o, k)| *o *= k);
        }
    }
}
plain_versions!(softmax_columns, softmax_columns_generic, (s: &[f32], d: &mut [f32], len: usize, inner: usize, log: bool));

fn softmax(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = f32_in(ins, 0)?;
    if x.rank() == 0 {
        return None;
    }
    let ax = axis(n.int("axis", -1), x.rank()).ok()?;
    let log = n.op == "LogSoftmax";
    if ax != x.rank() - 1 || log {
        // Another axis (a detector's DFL head, a class axis in NCHW): column blocks.
        let len = x.shape()[ax];
        let inner: usize = x.shape()[ax + 1..].iter().product();
        let outer: usize = x.shape()[..ax].iter().product();
        let mut y = match Output::new(cx.out, DType::F32, x.shape()) {
            Ok(y) => y,
            Err(e) => return Some(Err(e)),
        };
        if len == 0 || inner == 0 {
            return Some(Ok(vec![y.finish()]));
        }
        let isa = cx.isa;
        let (src, block) = (x.data::<f32>(), len * inner);
        // Split the columns too when there are few blocks (one image, a long inner axis).
        let pieces = (inner / 256).clamp(1, 16);
        let out = SharedMut(y.bits_mut().as_mut_ptr());
        cx.par.for_each(outer * pieces, &|t| {
            let out = out;
            let (o, p) = (t / pieces, t % pieces);
            let cols = p * inner / pieces..(p + 1) * inner / pieces;
            let w = cols.len();
            // Gather this piece's columns into contiguous rows, then write them back.
            let mut sb = vec![0f32; len * w];
            for r in 0..len {
                sb[r * w..(r + 1) * w].copy_from_slice(&src[o * block + r * inner + cols.start..][..w]);
            }
            let mut db = vec![0f32; len * w];
            softmax_columns(isa, &sb, &mut db, len, w, log);
            for r in 0..len {
                // SAFETY: task t writes only its columns of its block.
                let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(o * block + r * inner + cols.start), w) };
                d.copy_from_slice(&db[r * w..(r + 1) * w]);
            }
        });
        return Some(Ok(vec![y.finish()]));
    }
    let len = x.shape()[x.rank() - 1];
    let mut y = match Output::new(cx.out, DType::F32, x.shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let isa = cx.isa;
    rows(cx.par, x.data::<f32>(), y.bits_mut(), len, &|_, s, d| softmax_row(isa, s, d));
    Some(Ok(vec![y.finish()]))
}

fn layer_norm(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = f32_in(ins, 0)?;
    if x.rank() == 0
        || n.outputs.iter().skip(1).any(|o| !o.is_empty())
        || axis(n.int("axis", -1), x.rank()).ok()? != x.rank() - 1
    {
        return None;
    }
    let len = x.shape()[x.rank() - 1];
    let scale = f32_in(ins, 1).filter(|t| t.len() == len)?.data::<f32>();
    let bias = match ins.get(2).and_then(|t| t.as_ref()) {
        Some(b) if b.dtype() == DType::F32 && b.len() == len => Some(b.data::<f32>()),
        Some(_) => return None,
        None => None,
    };
    let eps = n.float_attr("epsilon");
    let mut y = match Output::new(cx.out, DType::F32, x.shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let isa = cx.isa;
    rows(cx.par, x.data::<f32>(), y.bits_mut(), len, &|_, s, d| layer_norm_row(isa, s, d, scale, bias, eps));
    Some(Ok(vec![y.finish()]))
}

fn transpose(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = ins.first()?.as_ref()?;
    let r = x.rank();
    let perm: Vec<usize> = match n.ints("perm") {
        Some(p) => p.iter().map(|&v| axis(v, r)).collect::<Result<_>>().ok()?,
        None => (0..r).rev().collect(),
    };
    let mut sorted = perm.clone();
    sorted.sort();
    if sorted != (0..r).collect::<Vec<_>>() || r == 0 {
        return None;
    }
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let mut y = match Output::new(cx.out, x.dtype(), &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    // A transpose moves bits, whatever the type: by element size.
    let src = x.aligned_bytes(x.dtype().size().max(1));
    let dst = y.bytes_mut();
    match x.dtype().size() {
        1 => move_elements::<u8>(src, dst, x.shape(), &perm, cx)?,
        2 => move_elements::<u16>(src, dst, x.shape(), &perm, cx)?,
        4 => move_elements::<u32>(src, dst, x.shape(), &perm, cx)?,
        8 => move_elements::<u64>(src, dst, x.shape(), &perm, cx)?,
        _ => return None,
    }
    Some(Ok(vec![y.finish()]))
}

/// The transpose by `perm` of the elements of `src` (shape `xs`) into `dst`, as elements of
/// `T`: runs of the output's last dim, contiguous in the source when the last axis stays.
fn move_elements<T: bytemuck::Pod + Send + Sync>(
    src: &[u8],
    dst: &mut [u8],
    xs: &[usize],
    perm: &[usize],
    cx: &Ctx,
) -> Option<()> {
    let src: &[T] = bytemuck::try_cast_slice(src).ok()?;
    let dst: &mut [T] = bytemuck::try_cast_slice_mut(dst).ok()?;
    let r = perm.len();
    let shape: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let st = strides(xs);
    let inner = shape[r - 1];
    let inner_step = st[perm[r - 1]];
    let outer: usize = shape[..r - 1].iter().product();
    let ost: Vec<usize> = perm[..r - 1].iter().map(|&p| st[p]).collect();
    let oshape = &shape[..r - 1];
    let per = (CHUNK / inner.max(1)).max(1);
    let out = SharedMut(dst.as_mut_ptr());
    cx.par.for_each(outer.div_ceil(per), &|t| {
        let out = out;
        for o in t * per..((t + 1) * per).min(outer) {
            let mut rem = o;
            let mut base = 0;
            for d in (0..r - 1).rev() {
                base += (rem % oshape[d]) * ost[d];
                rem /= oshape[d];
            }
            // SAFETY: output row o is written by this task only.
            let row = unsafe { std::slice::from_raw_parts_mut(out.0.add(o * inner), inner) };
            if inner_step == 1 {
                row.copy_from_slice(&src[base..base + inner]);
            } else {
                for (k, v) in row.iter_mut().enumerate() {
                    *v = src[base + k * inner_step];
                }
            }
        }
    });
    Some(())
}

/// DequantizeLinear of 8- and 16-bit integers with an f32 scale, per tensor or per axis,
/// into f32 (the reference kernel's narrow path, whose arithmetic it is); None for other
/// forms (blocks, other output types).
fn dequantize_linear(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let (x, scale) = (ins.first()?.as_ref()?, ins.get(1)?.as_ref()?);
    let f32_out = n.opt_int("output_dtype").is_none_or(|c| c == 0 || c == DType::F32.onnx_code() as i64);
    if n.int("block_size", 0) != 0 || !f32_out {
        return None;
    }
    let zp = ins.get(2).and_then(|z| z.as_ref());
    if matches!(x.dtype(), DType::U8 | DType::I8) {
        return dequantize_bytes(x, scale, zp, n.int("axis", 1), cx);
    }
    let t = match crate::ops::quant::dequantize_narrow(x, scale, zp, n.int("axis", 1)) {
        Ok(Some(t)) => t,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    let mut y = match Output::new(cx.out, DType::F32, t.shape()) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    y.bits_mut().copy_from_slice(t.data::<f32>());
    Some(Ok(vec![y.finish()]))
}

/// DequantizeLinear of bytes (u8 or i8, a scale and zero point per tensor or per channel
/// along `axis`) straight into the output, in parallel chunks of vector code: `(q − z) · s`
/// in f32, one rounding, as the reference computes it. (A dynamically quantized layer
/// that stays f32 dequantizes its whole input every run: 2M values took 4 ms through
/// widened copies.)
fn dequantize_bytes(
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
    axis: i64,
    cx: &Ctx,
) -> Option<Result<Vec<Tensor>>> {
    let signed = x.dtype() == DType::I8;
    if scale.dtype() != DType::F32 || zp.is_some_and(|z| z.dtype() != x.dtype()) {
        return None;
    }
    let s = scale.data::<f32>();
    let z: Vec<i32> = match zp {
        Some(t) if signed => t.data::<i8>().iter().map(|&v| v as i32).collect(),
        Some(t) => t.data::<u8>().iter().map(|&v| v as i32).collect(),
        None => vec![0; s.len()],
    };
    if z.len() != s.len() || s.is_empty() {
        return None;
    }
    // Per tensor: one channel of every value; per axis: `len` channels of `inner` values.
    let shape = x.shape();
    let (len, inner) = if s.len() == 1 {
        (1, x.len().max(1))
    } else {
        let a = crate::util::axis(axis, shape.len()).ok()?;
        if scale.rank() != 1 || shape[a] != s.len() {
            return None;
        }
        (s.len(), shape[a + 1..].iter().product::<usize>().max(1))
    };
    let mut y = match Output::new(cx.out, DType::F32, shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let q = x.bytes();
    let isa = cx.isa;
    chunked(cx.par, q.len(), y.bits_mut(), &|r, d| {
        // The chunk in runs of one channel.
        let mut i = r.start;
        while i < r.end {
            let end = ((i / inner + 1) * inner).min(r.end);
            let c = (i / inner) % len;
            let (src, dst) = (&q[i..end], &mut d[i - r.start..end - r.start]);
            if signed {
                dequantize_i8(isa, src, z[c], s[c], dst)
            } else {
                dequantize_u8(isa, src, z[c], s[c], dst)
            }
            i = end;
        }
    });
    Some(Ok(vec![y.finish()]))
}

#[inline(always)]
fn dequantize_u8_generic(q: &[u8], z: i32, s: f32, d: &mut [f32]) {
    for (o, &v) in d.iter_mut().zip(q) {
        *o = (v as i32 - z) as f32 * s;
    }
}
plain_versions!(dequantize_u8, dequantize_u8_generic, (q: &[u8], z: i32, s: f32, d: &mut [f32]));

#[inline(always)]
fn dequantize_i8_generic(q: &[u8], z: i32, s: f32, d: &mut [f32]) {
    for (o, &v) in d.iter_mut().zip(q) {
        *o = (v as i8 as i32 - z) as f32 * s;
    }
}
plain_versions!(dequantize_i8, dequantize_i8_generic, (q: &[u8], z: i32, s: f32, d: &mut [f32]));

fn matmul(_n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let (a, b) = (f32_in(ins, 0)?, f32_in(ins, 1)?);
    if a.rank() < 2 || b.rank() < 2 {
        return None;
    }
    let (m, k) = (a.shape()[a.rank() - 2], a.shape()[a.rank() - 1]);
    let (k2, nn) = (b.shape()[b.rank() - 2], b.shape()[b.rank() - 1]);
    if k != k2 {
        return None;
    }
    let (ab, bb) = (&a.shape()[..a.rank() - 2], &b.shape()[..b.rank() - 2]);
    let batch = broadcast_shapes(&[ab, bb]).ok()?;
    let (oa, ob) = (broadcast_offsets(ab, &batch).ok()?, broadcast_offsets(bb, &batch).ok()?);
    let mut shape = batch.clone();
    shape.extend([m, nn]);
    let mut y = match Output::new(cx.out, DType::F32, &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let (ad, bd) = (a.data::<f32>(), b.data::<f32>());
    let (isa, blocking) = (cx.isa, cx.blocking);
    let out = SharedMut(y.bits_mut().as_mut_ptr());
    // Consecutive batch items that read one B (B broadcast over them, as grouped attention
    // heads share a key/value head) with consecutive A items are one product of more rows:
    // B is packed once for all of them.
    let groups = shared_b_runs(&oa, &ob);
    let nbatch = groups.len();
    let one = |g: usize, par: &dyn Parallel| {
        let out = out;
        let (i, count) = groups[g];
        let pb = PackedB::from_slice(isa, blocking, &bd[ob[i] * k * nn..(ob[i] + 1) * k * nn], k, nn, false);
        let rows = m * count;
        // SAFETY: batch items i..i + count own their m×n blocks of y, which are contiguous.
        let c = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * m * nn), rows * nn) };
        // A's rows are read in place where the kernels can (see `gemm_rows`).
        gemm_rows(
            &ad[oa[i] * m * k..(oa[i] + count) * m * k],
            rows,
            k,
            blocking,
            &pb,
            c,
            nn,
            &Epilogue::default(),
            par,
        );
    };
    if nbatch >= cx.par.threads() {
        cx.par.for_each(nbatch, &|i| one(i, &Sequential));
    } else {
        (0..nbatch).for_each(|i| one(i, cx.par));
    }
    Some(Ok(vec![y.finish()]))
}

/// The batch items of a broadcast MatMul as runs `(first, count)` of consecutive items that
/// read the same B item and consecutive A items.
pub(super) fn shared_b_runs(oa: &[usize], ob: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for i in 0..oa.len() {
        match runs.last_mut() {
            Some((first, count)) if ob[*first] == ob[i] && oa[*first] + *count == oa[i] => *count += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

fn pool2d(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = f32_in(ins, 0)?;
    let k = n.ints("kernel_shape")?;
    // 2-D, no dilation, one output; padding explicit or `auto_pad`, floor or ceil mode: the
    // geometry ONNX defines (crate::ops::window::resolve, the reference kernels' own), windows
    // clipped to the input (a ceil-mode window may start in the end padding).
    if x.rank() != 4 || k.len() != 2 || n.outputs.iter().skip(1).any(|o| !o.is_empty()) || k.iter().any(|&v| v < 1) {
        return None;
    }
    if n.ints("dilations").is_some_and(|d| d.iter().any(|&v| v != 1)) {
        return None;
    }
    let s: Vec<usize> =
        n.ints("strides").map_or(Some(vec![1, 1]), |v| v.iter().map(|&x| usize::try_from(x).ok()).collect())?;
    let pads: Vec<usize> =
        n.ints("pads").map_or(Some(vec![0; 4]), |v| v.iter().map(|&x| usize::try_from(x).ok()).collect())?;
    let kernel = [k[0] as usize, k[1] as usize];
    let (nb, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let ceil = n.int("ceil_mode", 0) != 0;
    let auto_pad = n.string("auto_pad", "NOTSET");
    let (o, begin, end) = crate::ops::window::resolve(&kernel, &s, &[1, 1], &pads, auto_pad, &[h, w], ceil).ok()?;
    let (kh, kw, sh, sw) = (kernel[0], kernel[1], s[0], s[1]);
    let (pt, pl) = (begin[0], begin[1]);
    let p = [begin[0], begin[1], end[0], end[1]];
    let (oh, ow) = (o[0], o[1]);
    let is_max = n.op == "MaxPool";
    let include_pad = n.int("count_include_pad", 0) != 0;
    let mut y = match Output::new(cx.out, DType::F32, &[nb, c, oh, ow]) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let xd = x.data::<f32>();
    let out = SharedMut(y.bits_mut().as_mut_ptr());
    // Separable: for each output row, reduce the window's input rows into one row (a
    // vectorisable pass over whole rows), then reduce each window's columns of that row.
    cx.par.for_each(nb * c, &|plane| {
        let out = out;
        let src = &xd[plane * h * w..(plane + 1) * h * w];
        // SAFETY: plane `plane` of y is written by this task only.
        let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(plane * oh * ow), oh * ow) };
        let mut acc_row = vec![0f32; w];
        for oy in 0..oh {
            let y0 = (oy * sh) as isize - pt as isize;
            let (ys, ye) = (y0.max(0) as usize, ((y0 + kh as isize).min(h as isize)).max(0) as usize);
            acc_row.fill(if is_max { f32::NEG_INFINITY } else { 0.0 });
            for yy in ys..ye {
                let r = &src[yy * w..(yy + 1) * w];
                if is_max {
                    acc_row.iter_mut().zip(r).for_each(|(a, &v)| *a = if v > *a || v.is_nan() { v } else { *a });
                } else {
                    acc_row.iter_mut().zip(r).for_each(|(a, &v)| *a += v);
                }
            }
            for ox in 0..ow {
                let x0 = (ox * sw) as isize - pl as isize;
                let (xs, xe) = (x0.max(0) as usize, ((x0 + kw as isize).min(w as isize)).max(0) as usize);
                let win = &acc_row[xs..xe.max(xs)];
                d[oy * ow + ox] = if is_max {
                    win.iter().copied().fold(f32::NEG_INFINITY, |m, v| if v > m || v.is_nan() { v } else { m })
                } else {
                    // count_include_pad counts the window clipped to the padded input.
                    let cnt = if include_pad {
                        let ye2 = (y0 + kh as isize).min((h + p[2]) as isize);
                        let xe2 = (x0 + kw as isize).min((w + p[3]) as isize);
                        ((ye2 - y0) * (xe2 - x0)) as f32
                    } else {
                        ((ye - ys) * (xe - xs)) as f32
                    };
                    win.iter().sum::<f32>() / cnt
                };
            }
        }
    });
    Some(Ok(vec![y.finish()]))
}

/// GlobalAveragePool / GlobalMaxPool over the spatial dims of any rank (NCW, NCHW, ...),
/// one plane per index.
fn global_pool(n: &Node, ins: &[Option<Tensor>], cx: &Ctx) -> Option<Result<Vec<Tensor>>> {
    let x = f32_in(ins, 0)?;
    if x.rank() < 3 {
        return None;
    }
    let max = n.op == "GlobalMaxPool";
    let planes = x.shape()[0] * x.shape()[1];
    let size: usize = x.shape()[2..].iter().product();
    let mut shape = x.shape().to_vec();
    shape[2..].iter_mut().for_each(|d| *d = 1);
    let mut y = match Output::new(cx.out, DType::F32, &shape) {
        Ok(y) => y,
        Err(e) => return Some(Err(e)),
    };
    let xd = x.data::<f32>();
    let out = SharedMut(y.bits_mut().as_mut_ptr());
    cx.par.for_each(planes, &|i| {
        let out = out;
        let plane = &xd[i * size..(i + 1) * size];
        let v = if max {
            plane.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        } else {
            plane.iter().sum::<f32>() / size as f32
        };
        // SAFETY: element i is written by task i only.
        unsafe { *out.0.add(i) = v };
    });
    Some(Ok(vec![y.finish()]))
}

/// For each row of scores shaped `xs`, where its row of `mask` (shaped `ms`: running along
/// the last axis, other dims 1 or the scores') starts.
pub(super) fn mask_row_offsets(mask: &[f32], ms: &[usize], xs: &[usize]) -> std::result::Result<Vec<usize>, String> {
    let (r, len) = (xs.len(), xs.last().copied().unwrap_or(0));
    let fits = !ms.is_empty()
        && ms.len() <= r
        && ms[ms.len() - 1] == len
        && ms[..ms.len() - 1].iter().zip(&xs[r - ms.len()..r - 1]).all(|(&a, &b)| a == 1 || a == b);
    if !fits || mask.len() != ms.iter().product::<usize>() {
        return Err(format!("mask {ms:?} does not run along the last axis of {xs:?}"));
    }
    let offs = broadcast_offsets(&ms[..ms.len() - 1], &xs[..r - 1]).map_err(|e| e.0)?;
    Ok(offs.into_iter().map(|o| o * len).collect())
}

/// `softmax(x · scale + mask)` over the last axis of `x` (shape `xs`), into `y`: the scaled,
/// masked softmax of attention in one pass per row instead of three. `mask` (with its
/// shape) broadcasts to `xs` and runs along the whole last axis (its last dim is that
/// axis's length; its other dims are 1 or `xs`'s).
#[allow(clippy::too_many_arguments)]
pub fn scaled_masked_softmax(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    xs: &[usize],
    scale: f32,
    mask: Option<(&[f32], &[usize])>,
    y: &mut [f32],
) -> std::result::Result<(), String> {
    let len = *xs.last().ok_or("softmax of a scalar")?;
    if x.len() != xs.iter().product::<usize>() || y.len() != x.len() {
        return Err(format!("buffer sizes {} / {} do not match {xs:?}", x.len(), y.len()));
    }
    // Per row of x, the offset of its mask row.
    let mask_rows = match mask {
        None => None,
        Some((m, ms)) => Some((m, mask_row_offsets(m, ms, xs)?)),
    };
    let nrows = x.len() / len.max(1);
    let per = (CHUNK / len.max(1)).max(1);
    let out = SharedMut(y.as_mut_ptr());
    par.for_each(nrows.div_ceil(per), &|t| {
        let out = out;
        for i in t * per..((t + 1) * per).min(nrows) {
            let s = &x[i * len..(i + 1) * len];
            let m: &[f32] = match &mask_rows {
                Some((m, offs)) => &m[offs[i]..offs[i] + len],
                None => &[],
            };
            // SAFETY: row i is written by this task only.
            let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * len), len) };
            scaled_softmax_row(isa, s, m, scale, d);
        }
    });
    Ok(())
}
