//! The byte ops of quantized regions (the compiler's `int8` pass; kernels in
//! `aim_kernels::int8`): values as bytes NHWC between `aim:Quantize8` and `aim:Dequantize8`.
//!
//! - `aim:Quantize8(x)` — f32 NCHW to bytes NHWC: `scale`, `zero` (in u8 terms).
//! - `aim:Dequantize8(x)` — bytes NHWC to f32 NCHW: `scale`, `zero`; with `ncw = 1` the
//!   f32 side is 1-D, `[N, C, W]`, of bytes `[N, 1, W, C]` (a 1-D convolution's values;
//!   `aim:Quantize8` takes such an f32 `[N, C, W]` by its rank).
//! - `aim:Conv8(x, W, w_scale, B?, R?)` — a convolution: `x_scale` / `x_zero` the input's
//!   quantization, W s8 `[M, C, kh, kw]` (`[C, 1, kh, kw]` with `depthwise = 1`), its
//!   scale (one or per output channel), an f32 bias, `activation` (and its parameters),
//!   and the output's `y_scale` / `y_zero`; with a residual R (bytes of the output's
//!   shape), the result first takes `mid_scale` / `mid_zero`, then R (`res_scale`,
//!   `res_zero`) is added and `res_activation` applied.
//! - `aim:Add8(a, b)` — `a_*`, `b_*`, `y_*` quantizations, `activation`.
//! - `aim:MaxPool8(x)` — MaxPool's attributes; the output keeps the input's quantization.
//! - `aim:GlobalAveragePool8(x)` — the f32 NCHW means of bytes NHWC (`scale`, `zero`).

use super::{activation_with, const_f32, prep_err, Prepared};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{DType, Graph, Node};
use aim_kernels::gemm::{Activation, Isa};
use aim_kernels::int8::conv::Conv8;
use aim_kernels::int8::depthwise::Depthwise8;
use aim_kernels::int8::{Nhwc, Out8, Residual8, Weights8, Window, Q8};

/// A prepared byte op.
pub(super) enum Int8Prep {
    Quantize(Q8),
    /// With whether the f32 side is `[N, C, W]` (`ncw`).
    Dequantize(Q8, bool),
    GlobalMean(Q8),
    Conv(Box<Conv8>),
    Depthwise(Box<Depthwise8>),
    Add {
        a: Q8,
        b: Q8,
        act: Option<Activation>,
        y: Q8,
    },
    MaxPool {
        window: Window,
        ceil: bool,
    },
    /// `y = table[x]` per byte (`aim:Lut8`: an elementwise function of one byte tensor).
    Table(Box<[u8; 256]>),
    /// `aim:ConvInteger`: ONNX ConvInteger on u8 NCHW bytes and constant s8 weights (zero
    /// point 0), its exact i32 sums written as f32 (the Cast that reads it), the input's
    /// zero point read at run time (a DynamicQuantizeLinear's); then, where the compiler
    /// fused them, × the scale (input 3, read at run time: one or one per channel), + the
    /// constant bias (input 4) and the activation.
    ConvInteger(Box<ConvIntegerPrep>),
}

/// The quantization `{prefix}_scale`, `{prefix}_zero` (or `scale`, `zero` for an empty
/// prefix) of `n`.
fn q8(n: &Node, prefix: &str) -> Result<Q8, RunError> {
    let key = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}_{k}") };
    let scale = match n.attrs.get(&key("scale")) {
        Some(aim_ir::Attr::Float(s)) if *s > 0.0 && s.is_finite() => *s,
        _ => return Err(prep_err(n, format!("{} must be a positive finite float", key("scale")))),
    };
    let zero = match n.attrs.get(&key("zero")) {
        Some(aim_ir::Attr::Int(z)) if (0..=255).contains(z) => *z as u8,
        _ => return Err(prep_err(n, format!("{} must be an integer from 0 to 255", key("zero")))),
    };
    Ok(Q8 { scale, zero })
}

/// A 2-D window from `kernel` and the node's strides, dilations and pads (checked: two
/// positive strides and dilations, four non-negative pads).
pub(super) fn window(n: &Node, kernel: [usize; 2]) -> Result<Window, RunError> {
    let pair = |name: &str| -> Result<[usize; 2], RunError> {
        match n.ints(name) {
            None => Ok([1, 1]),
            Some([a, b]) if *a > 0 && *b > 0 => Ok([*a as usize, *b as usize]),
            Some(v) => Err(prep_err(n, format!("{name} {v:?}: two positive values expected"))),
        }
    };
    let pads = match n.ints("pads") {
        None => [0; 4],
        Some(p) if p.len() == 4 && p.iter().all(|&v| v >= 0) => {
            [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
        }
        Some(p) => return Err(prep_err(n, format!("pads {p:?}: four non-negative values expected"))),
    };
    Ok(Window { kernel, stride: pair("strides")?, dilation: pair("dilations")?, pads })
}

/// Prepares a byte op.
pub(super) fn prepare(g: &Graph, n: &Node, isa: Isa) -> Result<Prepared, RunError> {
    let p = match n.op.as_str() {
        "Quantize8" => Int8Prep::Quantize(q8(n, "")?),
        "Dequantize8" => Int8Prep::Dequantize(q8(n, "")?, n.int("ncw", 0) != 0),
        "GlobalAveragePool8" => Int8Prep::GlobalMean(q8(n, "")?),
        "Add8" => Int8Prep::Add { a: q8(n, "a")?, b: q8(n, "b")?, act: activation_with(n, ""), y: q8(n, "y")? },
        "MaxPool8" => {
            let k = match n.ints("kernel_shape") {
                Some([a, b]) if *a > 0 && *b > 0 => [*a as usize, *b as usize],
                _ => return Err(prep_err(n, "kernel_shape must hold two positive values")),
            };
            Int8Prep::MaxPool { window: window(n, k)?, ceil: n.int("ceil_mode", 0) != 0 }
        }
        "Conv8" => prepare_conv(g, n, isa)?,
        "ConvInteger" => prepare_conv_integer(g, n, isa)?,
        "Lut8" => {
            let t = n.ints("table").unwrap_or(&[]);
            if t.len() != 256 || t.iter().any(|v| !(0..=255).contains(v)) {
                return Err(prep_err(n, "table must hold 256 values from 0 to 255"));
            }
            Int8Prep::Table(Box::new(std::array::from_fn(|i| t[i] as u8)))
        }
        _ => return Err(prep_err(n, "unknown byte op")),
    };
    Ok(Prepared::Int8(Box::new(p)))
}

fn prepare_conv(g: &Graph, n: &Node, isa: Isa) -> Result<Int8Prep, RunError> {
    let w = n
        .input(1)
        .and_then(|w| g.initializers.get(w))
        .filter(|t| t.dtype() == DType::I8 && t.rank() == 4)
        .ok_or_else(|| prep_err(n, "the weights must be a constant s8 [M, C, kh, kw] tensor"))?;
    let ws = w.shape();
    let depthwise = n.int("depthwise", 0) != 0;
    let m = ws[0];
    if depthwise && ws[1] != 1 {
        return Err(prep_err(n, "depthwise weights must be [C, 1, kh, kw]"));
    }
    let w_scale = const_f32(g, n.input(2))
        .filter(|t| t.len() == 1 || t.len() == m)
        .ok_or_else(|| prep_err(n, "the weights' scale must be constant f32, one or one per output channel"))?;
    let bias = match n.input(3) {
        Some(b) => Some(
            const_f32(g, Some(b))
                .filter(|t| t.len() == m)
                .ok_or_else(|| prep_err(n, "the bias must be constant f32 with one value per output channel"))?
                .data::<f32>(),
        ),
        None => None,
    };
    let residual = match n.input(4) {
        Some(_) => Some(Residual8 { mid: q8(n, "mid")?, res: q8(n, "res")?, act: activation_with(n, "res_") }),
        None => None,
    };
    let out = Out8 { act: activation_with(n, ""), residual, q: q8(n, "y")? };
    let window = window(n, [ws[2], ws[3]])?;
    let (x, bytes) = (q8(n, "x")?, w.bytes());
    let ws_f = w_scale.data::<f32>();
    let weights = Weights8 { w: bytes, scale: ws_f, bias };
    let made = if depthwise {
        Depthwise8::new(m, window, weights, x, out).map(|k| Int8Prep::Depthwise(Box::new(k)))
    } else {
        if n.int("group", 1) != 1 {
            return Err(prep_err(n, "byte convolutions have one group, or are depthwise"));
        }
        // Winograd where it costs less on this CPU, for the output (images, height, width) the
        // graph gives (every run takes it: its weights replace the byte panels).
        let out_dims = n.outputs.first().and_then(|o| g.value_type(o)?.concrete_shape());
        let out_dims = out_dims.filter(|s| s.len() == 4).map(|s| [s[0], s[1], s[2]]);
        Conv8::for_isa(isa, ws[1], m, window, weights, x, out).and_then(|k| {
            let k = if k.winograd_pays(isa, out_dims) { k.into_winograd(bytes)? } else { k };
            Ok(Int8Prep::Conv(Box::new(k)))
        })
    };
    made.map_err(|e| prep_err(n, e))
}

/// A prepared `aim:ConvInteger`.
pub(super) struct ConvIntegerPrep {
    weight: ConvIntegerWeights,
    bias: Option<Vec<f32>>,
    act: Option<Activation>,
    /// Whether a scale is read (input 3).
    scaled: bool,
    /// Whether an offset is read (input 5: added to the sums before the scale).
    offset: bool,
    /// Whether the weights' channels are the input's twice (`doubled`: values that leave
    /// s8, split in two parts).
    doubled: bool,
    /// The program after the layer (`post`), applied to each tile row as it is written.
    post: Option<std::sync::Arc<aim_kernels::ewprog::wide::Wide>>,
}

/// The weights of an `aim:ConvInteger`, packed for the kernel that runs it here.
enum ConvIntegerWeights {
    /// s8 bytes for the integer GEMM (`aim_kernels::qconv`): VNNI, or where the 16-bit
    /// kernel does not run (groups; no AVX2).
    Bytes(aim_kernels::qconv::PackedQConv),
    /// Whole numbers for the exact 16-bit kernel (`aim_kernels::qconv16`): AVX2 without
    /// VNNI, where the byte kernel's `vpmaddubsw` needs two s8 parts for weights that leave
    /// s8 and multiplies no faster than f32.
    Wide(aim_kernels::qconv16::PackedConv16),
}

impl ConvIntegerWeights {
    /// The geometry the kernel runs (the byte kernel's `c` counts doubled channels twice).
    fn shape(&self) -> &aim_kernels::qconv::QConvShape {
        match self {
            ConvIntegerWeights::Bytes(w) => w.shape(),
            ConvIntegerWeights::Wide(w) => w.shape(),
        }
    }
}

/// `aim:ConvInteger(x, W, x_zero, scale, bias, offset)`: the weights packed for the integer
/// convolution, the bias and activation.
fn prepare_conv_integer(g: &Graph, n: &Node, isa: Isa) -> Result<Int8Prep, RunError> {
    let (w, s, bias) = super::qconv::weights(g, n, 4)?;
    let doubled = n.int("doubled", 0) != 0;
    if doubled && (s.group != 1 || !s.c.is_multiple_of(2)) {
        return Err(prep_err(n, "doubled weights need one group and an even channel count"));
    }
    let weight = if s.group == 1 && !aim_kernels::qgemm::use_vnni(isa) && aim_kernels::qconv16::available(isa) {
        // The weights less their zero point, whole again where they were split in two s8
        // parts (each filter's values, then its second parts).
        let w = w.data::<i8>();
        let per = s.c * s.kernel[0] * s.kernel[1];
        let whole: Vec<i16> = match doubled {
            true => w
                .chunks_exact(per)
                .flat_map(|row| {
                    let (a, b) = row.split_at(per / 2);
                    a.iter().zip(b).map(|(&a, &b)| a as i16 + b as i16)
                })
                .collect(),
            false => w.iter().map(|&v| v as i16).collect(),
        };
        let shape = aim_kernels::qconv::QConvShape { c: if doubled { s.c / 2 } else { s.c }, ..s };
        let packed = aim_kernels::qconv16::PackedConv16::new(shape, &whole)
            .map_err(|e| prep_err(n, format!("packing the weights: {e}")))?;
        ConvIntegerWeights::Wide(packed)
    } else {
        let bytes = aim_kernels::qconv::PackedQConv::new(s, w.bytes())
            .map_err(|e| prep_err(n, format!("packing the weights: {e}")))?;
        ConvIntegerWeights::Bytes(bytes)
    };
    Ok(Int8Prep::ConvInteger(Box::new(ConvIntegerPrep {
        weight,
        bias,
        act: activation_with(n, ""),
        scaled: n.input(3).is_some(),
        offset: n.input(5).is_some(),
        doubled,
        post: super::post_program(n, isa)?,
    })))
}

/// One operand of a byte op: its bytes, shape and type.
pub(super) struct Operand<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) shape: &'a [usize],
    pub(super) dtype: DType,
}

/// The type and shape of the op's output for these operands (checked against what the
/// kernel needs).
pub(super) fn output(p: &Int8Prep, ins: &[Option<Operand>]) -> Result<(DType, Vec<usize>), String> {
    let x = ins.first().and_then(|x| x.as_ref()).ok_or("input 0 is missing")?;
    let want = |dtype: DType| -> Result<[usize; 4], String> {
        match (x.dtype == dtype, x.shape) {
            (true, &[a, b, c, d]) => Ok([a, b, c, d]),
            _ => Err(format!("the input must be 4-D {dtype}, got {} {:?}", x.dtype, x.shape)),
        }
    };
    match p {
        Int8Prep::Quantize(_) => {
            let [n, c, h, w] = match (x.dtype, x.shape) {
                (DType::F32, &[n, c, w]) => [n, c, 1, w],
                _ => want(DType::F32)?,
            };
            Ok((DType::U8, vec![n, h, w, c]))
        }
        Int8Prep::Table(_) if x.dtype == DType::U8 => Ok((DType::U8, x.shape.to_vec())),
        Int8Prep::Table(_) => Err(format!("the input must be u8, got {}", x.dtype)),
        Int8Prep::Dequantize(_, ncw) => match (want(DType::U8)?, ncw) {
            ([n, 1, w, c], true) => Ok((DType::F32, vec![n, c, w])),
            (s, true) => Err(format!("ncw needs bytes [N, 1, W, C], got {s:?}")),
            ([n, h, w, c], false) => Ok((DType::F32, vec![n, c, h, w])),
        },
        Int8Prep::GlobalMean(_) => {
            let [n, _, _, c] = want(DType::U8)?;
            Ok((DType::F32, vec![n, c, 1, 1]))
        }
        Int8Prep::Conv(k) => {
            let [n, h, w, c] = want(DType::U8)?;
            conv_output(k.window(), k.in_channels(), k.out_channels(), [n, h, w, c])
        }
        Int8Prep::ConvInteger(k) => {
            let [n, c, h, w] = want(DType::U8)?;
            let s = k.weight.shape();
            let twice = k.doubled && matches!(k.weight, ConvIntegerWeights::Bytes(_));
            if c * (1 + usize::from(twice)) != s.c {
                return Err(format!("the input has {c} channels, the weights {}", s.c));
            }
            let (oh, ow) =
                s.output(h, w).ok_or_else(|| format!("the {:?} kernel does not fit a {h}×{w} input", s.kernel))?;
            Ok((DType::F32, vec![n, s.m, oh, ow]))
        }
        Int8Prep::Depthwise(k) => {
            let [n, h, w, c] = want(DType::U8)?;
            conv_output(k.window(), k.channels(), k.channels(), [n, h, w, c])
        }
        Int8Prep::Add { .. } => {
            want(DType::U8)?;
            let b = ins.get(1).and_then(|b| b.as_ref()).ok_or("input 1 is missing")?;
            if b.dtype != DType::U8 || b.shape != x.shape {
                return Err(format!("the operands differ: {:?} and {} {:?}", x.shape, b.dtype, b.shape));
            }
            Ok((DType::U8, x.shape.to_vec()))
        }
        Int8Prep::MaxPool { window, ceil } => {
            let [n, h, w, c] = want(DType::U8)?;
            let (out, _, _) = aim_kernels::ops::window::resolve(
                &window.kernel,
                &window.stride,
                &window.dilation,
                &window.pads,
                "NOTSET",
                &[h, w],
                *ceil,
            )
            .map_err(|e| e.0)?;
            Ok((DType::U8, vec![n, out[0], out[1], c]))
        }
    }
}

fn conv_output(window: &Window, c: usize, m: usize, [n, h, w, xc]: [usize; 4]) -> Result<(DType, Vec<usize>), String> {
    if xc != c {
        return Err(format!("the input has {xc} channels, the weights {c}"));
    }
    let (oh, ow) = window.output(h, w).ok_or_else(|| format!("the window {window:?} does not fit a {h}×{w} input"))?;
    Ok((DType::U8, vec![n, oh, ow, m]))
}

/// Runs the op into `y` (the output's bytes, of the type and shape [`output`] gave, 64-byte
/// aligned).
pub(super) fn run(
    p: &Int8Prep,
    isa: Isa,
    ins: &[Option<Operand>],
    y: &mut [u8],
    pool: &ThreadPool,
) -> Result<(), String> {
    let x = ins.first().and_then(|x| x.as_ref()).ok_or("input 0 is missing")?;
    let residual = || -> Result<Option<&[u8]>, String> {
        match ins.get(4).and_then(|r| r.as_ref()) {
            None => Ok(None),
            Some(r) if r.dtype == DType::U8 && r.bytes.len() == y.len() => Ok(Some(r.bytes)),
            Some(r) => Err(format!("the residual {} {:?} does not match the output", r.dtype, r.shape)),
        }
    };
    match p {
        Int8Prep::Quantize(q) => {
            let [n, c, h, w] = match *x.shape {
                [n, c, w] => [n, c, 1, w],
                [n, c, h, w] => [n, c, h, w],
                _ => return Err("a 3-D or 4-D input expected".into()),
            };
            aim_kernels::int8::convert::quantize_nchw(isa, floats(x.bytes)?, n, c, h * w, *q, y, pool);
        }
        Int8Prep::Dequantize(q, _) => {
            let [n, h, w, c] = *x.shape else { return Err("a 4-D input expected".into()) };
            aim_kernels::int8::convert::dequantize_nhwc(x.bytes, n, c, h * w, *q, floats_mut(y)?, pool);
        }
        Int8Prep::GlobalMean(q) => {
            let [n, h, w, c] = *x.shape else { return Err("a 4-D input expected".into()) };
            aim_kernels::int8::pool::global_mean(x.bytes, n, h * w, c, *q, floats_mut(y)?, pool);
        }
        Int8Prep::Conv(k) => {
            let r = residual()?;
            k.run(isa, &nhwc(x)?, r, y, pool)
        }
        Int8Prep::Depthwise(k) => {
            let r = residual()?;
            k.run(isa, &nhwc(x)?, r, y, pool)
        }
        Int8Prep::ConvInteger(k) => {
            let [n, _, h, w] = *x.shape else { return Err("a 4-D input expected".into()) };
            let zero = match ins.get(2).and_then(|z| z.as_ref()) {
                None => 0,
                Some(z) if z.dtype == DType::U8 && z.bytes.len() == 1 => z.bytes[0],
                Some(z) => return Err(format!("the input's zero point must be one u8, got {} {:?}", z.dtype, z.shape)),
            };
            let m = k.weight.shape().m;
            let scale = match ins.get(3).and_then(|s| s.as_ref()) {
                None => &[1.0][..],
                Some(s) if s.dtype == DType::F32 => {
                    let v = floats(s.bytes)?;
                    if v.len() != 1 && v.len() != m {
                        return Err(format!("the scale holds {} values: one or {m} expected", v.len()));
                    }
                    v
                }
                Some(s) => return Err(format!("the scale must be f32, got {}", s.dtype)),
            };
            let offset = match ins.get(5).and_then(|s| s.as_ref()) {
                None => None,
                Some(s) if s.dtype == DType::F32 => {
                    let v = floats(s.bytes)?;
                    if v.len() != 1 && v.len() != m {
                        return Err(format!("the offset holds {} values: one or {m} expected", v.len()));
                    }
                    Some(v)
                }
                Some(s) => return Err(format!("the offset must be f32, got {}", s.dtype)),
            };
            let input = aim_kernels::qconv::QConvInput {
                x: match (k.doubled, &k.weight) {
                    (true, ConvIntegerWeights::Bytes(_)) => aim_kernels::qconv::QSource::BytesTwice(x.bytes),
                    _ => aim_kernels::qconv::QSource::Bytes(x.bytes),
                },
                n,
                h,
                w,
                scale: 1.0,
                zero,
                offset,
                out_scale: scale,
                bias: k.bias.as_deref(),
                act: k.act,
                requant: None,
                post: k.post.as_deref(),
            };
            match &k.weight {
                ConvIntegerWeights::Bytes(w) => aim_kernels::qconv::qconv(isa, w, &input, floats_mut(y)?, pool),
                ConvIntegerWeights::Wide(w) => aim_kernels::qconv16::conv16(isa, w, &input, floats_mut(y)?, pool)?,
            }
        }
        Int8Prep::Add { a, b, act, y: qy } => {
            let bv = ins.get(1).and_then(|b| b.as_ref()).ok_or("input 1 is missing")?;
            aim_kernels::int8::add::add(isa, x.bytes, *a, bv.bytes, *b, *act, *qy, y, pool)
        }
        Int8Prep::Table(t) => aim_kernels::int8::convert::lookup(isa, x.bytes, t, y, pool),
        Int8Prep::MaxPool { window, .. } => {
            let xn = nhwc(x)?;
            let (_, shape) = output(p, ins)?;
            aim_kernels::int8::pool::max_pool(window, &xn, (shape[1], shape[2]), y, pool)
        }
    }
    Ok(())
}

/// A 4-D byte operand as NHWC.
fn nhwc<'a>(o: &Operand<'a>) -> Result<Nhwc<'a>, String> {
    match *o.shape {
        [n, h, w, c] => Ok(Nhwc { data: o.bytes, n, h, w, c }),
        _ => Err(format!("a 4-D input expected, got {:?}", o.shape)),
    }
}

/// What runs for the op, as `aim explore --stage scheduled` prints it (`input` and `out`
/// are the shapes when static).
pub(super) fn schedule(p: &Int8Prep, isa: Isa, input: Option<&[usize]>, out: Option<&[usize]>) -> Vec<String> {
    let q = |q: &Q8| format!("scale {} zero {}", q.scale, q.zero);
    let ep = |o: &Out8| {
        let mut s = String::from("epilogue: (Σ − zx·Σw)·sx·sw + bias");
        if let Some(a) = o.act {
            s += &format!(", {a:?}");
        }
        if let Some(r) = o.residual {
            s += &format!(", quantized ({}), + residual bytes ({})", q(&r.mid), q(&r.res));
            if let Some(a) = r.act {
                s += &format!(", {a:?}");
            }
        }
        s + &format!(", quantized to bytes ({})", q(&o.q))
    };
    match (p, input, out) {
        (Int8Prep::Quantize(qq), Some(&[n, c, w]), _) => vec![format!(
            "quantize f32 NCW [{n},{c},{w}] into bytes NHWC [{n},1,{w},{c}] ({}): parallel for image × 64-pixel tile, 64×64 transposes",
            q(qq)
        )],
        (Int8Prep::Quantize(qq), Some(&[n, c, h, w]), _) => vec![format!(
            "quantize f32 NCHW [{n},{c},{h},{w}] into bytes NHWC ({}): parallel for image × 64-pixel tile, 64×64 transposes",
            q(qq)
        )],
        (Int8Prep::GlobalMean(qq), Some(&[n, h, w, c]), _) => vec![format!(
            "global average of bytes NHWC [{n},{h},{w},{c}] ({}): exact integer sums per channel, dequantized into f32 [N, C, 1, 1]",
            q(qq)
        )],
        (Int8Prep::Dequantize(qq, ncw), Some(&[n, h, w, c]), _) => vec![format!(
            "dequantize bytes NHWC [{n},{h},{w},{c}] into f32 {} ({}): parallel for image × 64-channel tile, 64×64 transposes",
            if *ncw { "NCW" } else { "NCHW" },
            q(qq)
        )],
        (Int8Prep::Conv(k), Some(&[xn, xh, xw, c]), Some(&[n, oh, ow, m])) if k.winograd() => {
            let tiles = n * oh.div_ceil(2) * ow.div_ceil(2);
            let cp = c.div_ceil(4) * 4;
            let (wino, direct) = k.winograd_costs([n, oh, ow]);
            vec![
                format!(
                    "Winograd F(2×2, 3×3): {tiles} tiles of 2×2 px, 16 GEMMs Y[{tiles} tiles × {m} ch] = V[tiles × {cp} ch] · U[{cp}×{m}] (16-bit transformed weights, {} KiB, packed at load in panels of {} channels); estimated cost {wino} multiply-adds against {direct} direct (products, and 11 per weight byte read)",
                    k.weight_bytes() >> 10,
                    aim_kernels::qgemm::NR,
                ),
                format!(
                    "  per block of {} tiles: 4×4 input patches of the NHWC input [{xn},{xh},{xw},{c}] transformed (Bᵀ d B), microkernel {}×{} ({}), output transform (Aᵀ M A / 4), exact i32 sums; parallel for tile blocks",
                    aim_kernels::qgemm::MR,
                    aim_kernels::qgemm::MR,
                    aim_kernels::qgemm::NR,
                    k.micro_name(isa, xn * xh * xw)
                ),
                format!("  {}", ep(k.out())),
            ]
        }
        (Int8Prep::Conv(k), Some(&[xn, xh, xw, c]), Some(&[n, oh, ow, m])) => {
            let micro = k.micro_name(isa, xn * xh * xw);
            let taps = k.window().taps();
            vec![
                format!(
                    "indirect GEMM: Y[{} px × {m} ch] = X[px × {taps} taps·{} ch] · W[{}×{m}] (s8, packed at load in panels of {} channels), each tile row reading its taps through pointers into the NHWC input or a zero-point row",
                    n * oh * ow, c.div_ceil(4) * 4, taps * c.div_ceil(4) * 4, aim_kernels::qgemm::NR
                ),
                format!("  microkernel {}×{} ({micro}), exact i32 sums; parallel for (pixel rows × weight chunks of ≤256 KiB)", aim_kernels::qgemm::MR, aim_kernels::qgemm::NR),
                format!("  {}", ep(k.out())),
            ]
        }
        (Int8Prep::Depthwise(k), _, Some(&[n, oh, _, c])) => vec![
            format!(
                "depthwise over bytes NHWC: parallel for output row in 0..{}, per pixel {} taps × {c} channels, (x − zx)·w summed exactly in f32 vectors",
                n * oh, k.window().taps()
            ),
            format!("  {}", ep(k.out())),
        ],
        (Int8Prep::Add { a, b, y, act }, _, Some(s)) => vec![format!(
            "bytes + bytes ({} + {}, {act:?}) quantized ({}), exactly as the QDQ graph: parallel chunks of {} values",
            q(a),
            q(b),
            q(y),
            s.iter().product::<usize>()
        )],
        (Int8Prep::MaxPool { window, .. }, _, Some(&[n, oh, ..])) => vec![format!(
            "max pool {:?} over bytes NHWC (the input's quantization): parallel for output row in 0..{}, byte max across each pixel's channels",
            window.kernel,
            n * oh
        )],
        (Int8Prep::Table(_), _, Some(s)) => vec![format!(
            "table lookup per byte (256 entries: the elementwise function and its quantization, evaluated at compile time): parallel chunks of {} bytes",
            s.iter().product::<usize>()
        )],
        (Int8Prep::ConvInteger(k), _, Some(&[n, m, oh, ow])) => {
            let s = k.weight.shape();
            let mut v = match &k.weight {
                ConvIntegerWeights::Wide(w) => w.schedule(n, oh, ow),
                ConvIntegerWeights::Bytes(_) => vec![format!(
                    "for image in 0..{n}, group in 0..{}: C[{} ch × {} px] = W[s8, packed at load] · im2col(u8 input{}, packed per run) on the integer GEMM (microkernel {}×{}), exact i32 sums",
                    s.group,
                    m / s.group,
                    oh * ow,
                    if k.doubled { ", its channels twice" } else { "" },
                    aim_kernels::qgemm::MR,
                    aim_kernels::qgemm::NR
                )],
            };
            v.push(format!(
                "  epilogue: {}as f32{}{}{}{}",
                match k.weight {
                    ConvIntegerWeights::Bytes(_) => "− zero point (read at run time) × Σw, ",
                    ConvIntegerWeights::Wide(_) => "",
                },
                if k.offset { ", + the offset (read at run time)" } else { "" },
                if k.scaled { ", × the scale (read at run time)" } else { "" },
                if k.bias.is_some() { ", + bias" } else { "" },
                k.act.map_or(String::new(), |a| format!(", {a:?}"))
            ));
            if let Some(p) = &k.post {
                v.push(format!("  each tile row, after its activation: the program after the layer ({} steps)", p.steps()));
            }
            v
        }
        _ => vec!["byte op: shapes known only at run time".to_string()],
    }
}

/// Bytes of f32 values as floats (aligned: arena slots and tensors are).
fn floats(b: &[u8]) -> Result<&[f32], String> {
    if !(b.as_ptr() as usize).is_multiple_of(4) || !b.len().is_multiple_of(4) {
        return Err("the f32 input is not aligned".into());
    }
    // SAFETY: aligned and whole (checked), any bits are a valid f32.
    Ok(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len() / 4) })
}

fn floats_mut(b: &mut [u8]) -> Result<&mut [f32], String> {
    if !(b.as_ptr() as usize).is_multiple_of(4) || !b.len().is_multiple_of(4) {
        return Err("the f32 output is not aligned".into());
    }
    // SAFETY: as for `floats`; borrowed mutably through `b`.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut f32, b.len() / 4) })
}
