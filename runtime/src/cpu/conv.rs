//! Convolutions as packed GEMMs: 2-D ones over padded stride phases of the input, pointwise
//! ones straight from the input, the other ranks over im2col strips.

use super::depthwise::DepthwisePrep;
use super::phases::phase_row;
use super::{activation, check_residual, const_f32, prep_err, In, Out, OutPtr, Prepared};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{Graph, Node};
use aim_kernels::fast::{copy_short, zero_short};
use aim_kernels::gemm::{gemm_lazy_b, gemm_rows, Activation, Blocking, Epilogue, Isa, PackedA, PackedB, Parallel};

pub(super) struct Geometry {
    pub(super) kernel: Vec<usize>,
    pub(super) strides: Vec<usize>,
    pub(super) dilations: Vec<usize>,
    pub(super) pads: Vec<i64>,
    pub(super) auto_pad: String,
}

pub(super) struct ConvPrep {
    /// One packed weight matrix (Mg × Cg·k) per group (none under [`BY_POSITION`]).
    pub(super) weights: Vec<PackedA>,
    /// Under [`BY_POSITION`]: the weights packed as the B of a GEMM whose rows are output
    /// positions (K × M, from the M × K bytes read transposed), and the blocking of A.
    pub(super) by_position: Option<(std::sync::Arc<PackedB>, Blocking)>,
    /// Where the compiler chose `gemm` without knowing the output's shape: the kernel is
    /// chosen per run by [`nchw_conv_kernel`], and the weights packed as B (from A's
    /// panels) the first time a run takes `gemm_by_position`.
    pub(super) adaptive: Option<Box<Adaptive>>,
    pub(super) bias: Option<Vec<f32>>,
    pub(super) act: Option<Activation>,
    /// The program applied after the activation (`post`), over the whole output.
    pub(super) post: Option<std::sync::Arc<aim_kernels::ewprog::wide::Wide>>,
    pub(super) group: usize,
    pub(super) m: usize,
    pub(super) cin: usize,
    pub(super) geo: Geometry,
}

/// What choosing the kernel per run needs (see [`ConvPrep::adaptive`]).
pub(super) struct Adaptive {
    weight_shape: Vec<usize>,
    isa: Isa,
    blocking: Blocking,
    by_position: std::sync::OnceLock<std::sync::Arc<PackedB>>,
}

pub(super) fn geometry(n: &Node, kernel: &[usize]) -> Geometry {
    let sp = kernel.len();
    // Invalid values (zero, negative) are kept as 0 for `resolve` to refuse, not mended.
    let list = |name: &str| n.ints(name).map(|v| v.iter().map(|&x| x.max(0) as usize).collect()).unwrap_or(vec![1; sp]);
    Geometry {
        kernel: kernel.to_vec(),
        strides: list("strides"),
        dilations: list("dilations"),
        pads: n.ints("pads").map(|v| v.to_vec()).unwrap_or(vec![0; 2 * sp]),
        auto_pad: n.string("auto_pad", "NOTSET").to_string(),
    }
}

/// Output size and padding-before per spatial dim, as ONNX defines them (the reference
/// kernels' rule, `aim_kernels::ops::window::resolve`).
pub(super) fn resolve(geo: &Geometry, in_sp: &[usize]) -> Result<(Vec<usize>, Vec<usize>), String> {
    let pads: Vec<usize> = geo.pads.iter().map(|&p| usize::try_from(p).unwrap_or(usize::MAX)).collect();
    let (out, before, _) = aim_kernels::ops::window::resolve(
        &geo.kernel,
        &geo.strides,
        &geo.dilations,
        &pads,
        &geo.auto_pad,
        in_sp,
        false,
    )
    .map_err(|e| e.0)?;
    Ok((out, before))
}

/// The NCHW depthwise kernel's name (`kernel` on an unblocked `aim:Conv`).
const DEPTHWISE: &str = "depthwise";

/// The NCHW kernel whose GEMM rows are output positions (see [`nchw_conv_kernel`]).
const BY_POSITION: &str = "gemm_by_position";

/// The kernel that runs an unblocked (NCHW) `aim:Conv` with weights of shape `weight` in
/// `group` groups and `strides` / `dilations` per spatial dim, over `output` = (images,
/// output positions per image) when the shapes are static, on GEMM microkernels of
/// `mr × nr` tiles:
/// - `depthwise`: one 1-D or 2-D filter per channel, run directly over the planes;
/// - `gemm`: each group's weights packed as A (rows: output channels), the input gathered
///   per tap as B (columns: output positions);
/// - `gemm_by_position` (one group): the transpose, output positions as the rows of a GEMM
///   against the weights packed as B, the input gathered window by window. Considered where
///   its gathered input (positions × Cin·k) stays within [`BY_POSITION_FLOATS`], and chosen
///   when [`gemm_estimates`] says it is the cheaper (a 1-D convolution over one short frame,
///   as speech models run them, has a handful of positions: as columns they leave most of a
///   tile empty; a strided STFT's columns are gathered value by value), or for a batch of
///   images with few positions each, whose columns `gemm` would gather image by image
///   (measured on silero-vad's batch of 32 frames: 4× faster for 1–2 positions an image).
///
/// The compiler's `select-kernels` pass records it on the node; preparing the node checks
/// that the recorded kernel can run it.
pub fn nchw_conv_kernel(
    weight: &[usize],
    group: usize,
    output: Option<(usize, usize)>,
    tile: (usize, usize),
    strides: &[usize],
    dilations: &[usize],
) -> &'static str {
    if is_depthwise(weight, group) {
        return DEPTHWISE;
    }
    let (m, k) = (weight[0], weight[1..].iter().product::<usize>());
    match output {
        Some((images, positions)) if group == 1 && images * positions * k <= BY_POSITION_FLOATS => {
            let c = images * positions;
            if c == 0 || m == 0 {
                return "gemm";
            }
            if images > 1 && positions < SMALL_OUTPUT {
                return BY_POSITION;
            }
            let cost = gemm_estimates(weight, c, tile, strides, dilations);
            if cost.by_position < cost.by_channel {
                BY_POSITION
            } else {
                "gemm"
            }
        }
        _ => "gemm",
    }
}

/// [`nchw_conv_kernel`] for the unblocked `aim:Conv` node `n` with weights of shape
/// `weight`, its strides and dilations read from the node (for the compiler's
/// `select-kernels` pass).
pub fn nchw_conv_kernel_of(
    n: &Node,
    weight: &[usize],
    output: Option<(usize, usize)>,
    tile: (usize, usize),
) -> &'static str {
    let geo = geometry(n, weight.get(2..).unwrap_or_default());
    nchw_conv_kernel(weight, n.int("group", 1).max(1) as usize, output, tile, &geo.strides, &geo.dilations)
}

/// Estimated cycles of one image's convolution on each GEMM kernel (see
/// [`gemm_estimates`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GemmEstimates {
    /// `gemm`: weights as A, output positions as B's columns.
    pub(super) by_channel: f64,
    /// `gemm_by_position`: output positions as A's rows, weights as B.
    pub(super) by_position: f64,
}

/// The two GEMM kernels' cost for `c` output positions of a one-group convolution with
/// weights `weight`: the multiply-adds over the share of the microkernel tiles (`mr × nr`)
/// that compute outputs, at `nr` multiply-adds a cycle (two FMA ports of `nr / 2` lanes),
/// plus gathering the input — an eighth of a cycle a value where it moves in runs (`gemm`'s
/// 1-D columns at stride 1 and its 2-D padded rows; `gemm_by_position`'s channels-last 1-D
/// windows), one cycle where it moves value by value (`gemm`'s strided 1-D columns,
/// `gemm_by_position`'s 2-D windows) — and `gemm_by_position`'s scatter of its transposed
/// result (half a cycle a value).
pub(super) fn gemm_estimates(
    weight: &[usize],
    c: usize,
    (mr, nr): (usize, usize),
    strides: &[usize],
    dilations: &[usize],
) -> GemmEstimates {
    let (m, k) = (weight[0], weight[1..].iter().product::<usize>());
    // The share of the microkernel tiles' cells that compute outputs.
    let used = |x: usize, tile: usize| x as f64 / (x.div_ceil(tile) * tile).max(1) as f64;
    let macs = (m * c * k) as f64 / nr.max(1) as f64;
    let gathered = (c * k) as f64;
    let one_d = weight.len() == 3;
    let runs = 0.125;
    let channel_gather = if one_d && strides.first().is_some_and(|&s| s != 1) { 1.0 } else { runs };
    let position_gather = if one_d && dilations.first().is_none_or(|&d| d == 1) { runs } else { 1.0 };
    GemmEstimates {
        by_channel: macs / (used(m, mr) * used(c, nr)) + gathered * channel_gather,
        by_position: macs / (used(c, mr) * used(m, nr)) + gathered * position_gather + 0.5 * (c * m) as f64,
    }
}

/// The most floats `gemm_by_position` gathers for one run (4 MiB): beyond, the input is
/// better packed strip by strip as `gemm` does.
const BY_POSITION_FLOATS: usize = 1 << 20;

/// Whether weights of shape `weight` in `group` groups are one 1-D or 2-D filter per
/// channel.
fn is_depthwise(weight: &[usize], group: usize) -> bool {
    matches!(weight, [m, 1, _] | [m, 1, _, _] if group == *m)
}

/// The kernel named `kernel` if it can run a convolution with `weight` in `group` groups
/// (a `.aim` file may record another valid choice than the one the rule makes today).
fn recorded_kernel(kernel: &str, weight: &[usize], group: usize) -> Option<&'static str> {
    match kernel {
        DEPTHWISE if is_depthwise(weight, group) => Some(DEPTHWISE),
        BY_POSITION if group == 1 => Some(BY_POSITION),
        "gemm" => Some("gemm"),
        _ => None,
    }
}

/// The images and output positions per image of `n`'s output when its shape is static.
pub fn static_output(g: &Graph, n: &Node) -> Option<(usize, usize)> {
    let s = g.value_types.get(n.outputs.first()?)?.concrete_shape()?;
    (s.len() >= 3).then(|| (s[0], s[2..].iter().product::<usize>()))
}

pub(super) fn prepare_conv(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<Prepared, RunError> {
    let w = const_f32(g, n.input(1)).ok_or_else(|| prep_err(n, "weights must be constant f32"))?;
    if w.rank() < 3 {
        return Err(prep_err(n, "weights must be at least 3-D"));
    }
    let (m, cg) = (w.shape()[0], w.shape()[1]);
    let group = n.int("group", 1).max(1) as usize;
    if m % group != 0 {
        return Err(prep_err(n, format!("{m} output channels do not split into {group} groups")));
    }
    let kernel: Vec<usize> = w.shape()[2..].to_vec();
    let bias = match n.input(2) {
        Some(b) => Some(
            const_f32(g, Some(b))
                .filter(|t| t.len() == m)
                .ok_or_else(|| prep_err(n, "bias must be constant f32 with one value per output channel"))?
                .data::<f32>()
                .to_vec(),
        ),
        None => None,
    };
    let geo = geometry(n, &kernel);
    let act = activation(n);
    let post = super::post_program(n, isa)?;
    // The compiler's choice (`select-kernels`), checked; the same rule where it made none.
    let output = static_output(g, n);
    let rule = nchw_conv_kernel(w.shape(), group, output, (isa.mr(), isa.nr()), &geo.strides, &geo.dilations);
    let choice = match n.attrs.get("kernel") {
        Some(aim_ir::Attr::String(k)) => recorded_kernel(k, w.shape(), group).ok_or_else(|| {
            prep_err(n, format!("kernel '{k}' cannot run this convolution (weights {:?}, group {group})", w.shape()))
        })?,
        Some(_) => return Err(prep_err(n, "the kernel attribute must be a string")),
        None => rule,
    };
    if choice == DEPTHWISE {
        return Ok(Prepared::Depthwise(Box::new(DepthwisePrep {
            weights: w.data::<f32>().to_vec(),
            bias,
            act,
            post,
            channels: m,
            geo,
        })));
    }
    let mg = m / group;
    let k: usize = cg * kernel.iter().product::<usize>();
    if choice == BY_POSITION {
        let wt = if channels_last(&geo) {
            let bytes = w.bytes();
            let at = |i: usize| f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
            let kw = kernel[0];
            std::sync::Arc::new(PackedB::pack(isa, blocking, k, m, |p, j| at(j * k + weights_row(p, cg, kw))))
        } else {
            super::shared::packed_b(w, isa, blocking, (k, m), true, false)
        };
        let by_position = Some((wt, blocking));
        return Ok(Prepared::Conv(Box::new(ConvPrep {
            weights: Vec::new(),
            by_position,
            adaptive: None,
            bias,
            act,
            post,
            group,
            m,
            cin: cg,
            geo,
        })));
    }
    let wd = w.data::<f32>();
    let weights = (0..group)
        .map(|gi| PackedA::from_slice(isa, blocking, &wd[gi * mg * k..(gi + 1) * mg * k], mg, k, false))
        .collect();
    // A one-group convolution whose output shape the compiler did not know chooses its
    // kernel per run.
    let adaptive = (group == 1 && choice == "gemm" && output.is_none()).then(|| {
        Box::new(Adaptive { weight_shape: w.shape().to_vec(), isa, blocking, by_position: std::sync::OnceLock::new() })
    });
    Ok(Prepared::Conv(Box::new(ConvPrep {
        weights,
        by_position: None,
        adaptive,
        bias,
        act,
        post,
        group,
        m,
        cin: cg * group,
        geo,
    })))
}

pub(super) fn run_conv(
    c: &ConvPrep,
    x: In,
    residual: Option<In>,
    y: &mut Out,
    pool: &ThreadPool,
) -> Result<(), String> {
    let xs = x.shape;
    let sp = c.geo.kernel.len();
    if xs.len() != sp + 2 || xs[1] != c.cin {
        return Err(format!("input {xs:?} does not fit {} input channels and a {sp}-D kernel", c.cin));
    }
    let in_sp = &xs[2..];
    let (out_sp, before) = resolve(&c.geo, in_sp)?;
    let (nb, osize, isize) = (xs[0], out_sp.iter().product::<usize>(), in_sp.iter().product::<usize>());
    let mut shape = vec![nb, c.m];
    shape.extend(&out_sp);
    let res = check_residual(residual, &shape)?;
    let (cg, mg) = (c.cin / c.group, c.m / c.group);
    let ksize: usize = c.geo.kernel.iter().product();
    let xd = x.data;
    let pointwise =
        ksize == 1 && c.geo.strides.iter().all(|&s| s == 1) && before.iter().all(|&p| p == 0) && out_sp == in_sp;
    let yd = y.take(&shape)?;
    let batch = Batch { xd, nb, in_sp, out_sp: &out_sp, before: &before, res };
    if let Some((wt, blocking)) = &c.by_position {
        conv_by_position(c, wt, *blocking, &batch, yd, pool);
        return Ok(());
    }
    if let Some(ad) = &c.adaptive {
        let tile = (ad.isa.mr(), ad.isa.nr());
        if nchw_conv_kernel(&ad.weight_shape, 1, Some((nb, osize)), tile, &c.geo.strides, &c.geo.dilations)
            == BY_POSITION
        {
            let wt = ad.by_position.get_or_init(|| {
                let a = &c.weights[0];
                let row = |p: usize| if channels_last(&c.geo) { weights_row(p, c.cin, c.geo.kernel[0]) } else { p };
                std::sync::Arc::new(PackedB::pack(ad.isa, ad.blocking, a.k, a.m, |p, j| a.get(j, row(p))))
            });
            conv_by_position(c, wt, ad.blocking, &batch, yd, pool);
            return Ok(());
        }
    }
    if nb > 1 && osize < SMALL_OUTPUT {
        for gi in 0..c.group {
            conv_batched(c, gi, &batch, yd, pool);
        }
        return Ok(());
    }
    // Every other 2-D convolution goes through padded stride phases of the input (see
    // `conv_padded_rows`); im2col remains for the other ranks.
    let padded_rows = sp == 2 && !pointwise;
    for b in 0..nb {
        for gi in 0..c.group {
            let xg = &xd[(b * c.cin + gi * cg) * isize..(b * c.cin + (gi + 1) * cg) * isize];
            let off = (b * c.m + gi * mg) * osize;
            if padded_rows {
                let dstg = &mut yd[off..off + mg * osize];
                let resg = res.map(|r| &r[off..off + mg * osize]);
                conv_padded_rows(c, gi, xg, cg, in_sp, &out_sp, &before, dstg, resg, pool);
                continue;
            }
            let fill: Fill = if pointwise {
                Box::new(move |p: usize, j0: usize, dst: &mut [f32]| {
                    copy_short(dst, &xg[p * isize + j0..p * isize + j0 + dst.len()])
                })
            } else {
                im2col(xg, in_sp, &out_sp, &before, &c.geo)
            };
            let ep = Epilogue {
                row_bias: c.bias.as_ref().map(|v| &v[gi * mg..(gi + 1) * mg]),
                col_bias: None,
                residual: res.map(|r| &r[off..off + mg * osize]),
                act: c.act,
                ..Epilogue::default()
            };
            gemm_lazy_b(&c.weights[gi], osize, &*fill, &mut yd[off..off + mg * osize], osize, &ep, pool);
        }
    }
    Ok(())
}

/// A 2-D convolution of one group without im2col. The zero-padded input is split into its
/// `sh × sw` stride phases (phase (a, b) holds padded rows a, a+sh, ... and columns b, b+sw,
/// ...), each with rows `wp = ow + ((kw-1)·dw)/sw` wide. For every kernel offset the values
/// under the window, over all output positions, are then one contiguous run of one phase
/// (output rows carry a few extra columns, computed and dropped): B panels are plain copies.
/// The GEMM writes rows of that wider layout, which are compacted into the output with the
/// residual and activation applied.
#[allow(clippy::too_many_arguments)]
fn conv_padded_rows(
    c: &ConvPrep,
    gi: usize,
    xg: &[f32],
    cg: usize,
    in_sp: &[usize],
    out_sp: &[usize],
    before: &[usize],
    dst: &mut [f32],
    res: Option<&[f32]>,
    pool: &ThreadPool,
) {
    let (h, w) = (in_sp[0], in_sp[1]);
    let (oh, ow) = (out_sp[0], out_sp[1]);
    let (kh, kw) = (c.geo.kernel[0], c.geo.kernel[1]);
    let (sh, sw) = (c.geo.strides[0], c.geo.strides[1]);
    let (dh, dw) = (c.geo.dilations[0], c.geo.dilations[1]);
    let wp = ow + (kw - 1) * dw / sw;
    let hp = oh + (kh - 1) * dh / sh + 1;
    let plane = hp * wp;
    let phases = sh * sw;
    // Zeroed scratch reused from call to call (rows outside the input stay zero).
    let mut padded = aim_kernels::scratch::take(phases * cg * plane);
    padded.fill(0.0);
    let (pt, pl) = (before[0] as isize, before[1]);
    // Phases some kernel offset reads (a 1×1 stride-2 kernel reads one of four), built
    // channel by channel in parallel.
    let used: Vec<(usize, usize)> = (0..sh)
        .flat_map(|a| (0..sw).map(move |b| (a, b)))
        .filter(|&(a, b)| (0..kh).any(|ky| (ky * dh) % sh == a) && (0..kw).any(|kx| (kx * dw) % sw == b))
        .collect();
    let pp = OutPtr(padded.as_mut_ptr());
    pool.for_each(cg, &|ci| {
        let pp = pp;
        let src = &xg[ci * h * w..(ci + 1) * h * w];
        for &(a, bph) in &used {
            let base = ((a * sw + bph) * cg + ci) * plane;
            // SAFETY: channel ci's plane of each phase is written by this task only.
            let dplane = unsafe { std::slice::from_raw_parts_mut(pp.0.add(base), plane) };
            for y in 0..hp {
                let iy = (y * sh + a) as isize - pt;
                if iy < 0 || iy >= h as isize {
                    continue;
                }
                let srow = &src[iy as usize * w..(iy as usize + 1) * w];
                phase_row(srow, sw, bph, pl, &mut dplane[y * wp..(y + 1) * wp]);
            }
        }
    });
    let n_wide = oh * wp;
    let ks = kh * kw;
    let fill = |p: usize, j0: usize, out: &mut [f32]| {
        let (ci, k) = (p / ks, p % ks);
        let (ry, rx) = ((k / kw) * dh, (k % kw) * dw);
        let phase = (ry % sh) * sw + rx % sw;
        let start = (phase * cg + ci) * plane + (ry / sh) * wp + rx / sw + j0;
        copy_short(out, &padded[start..start + out.len()]);
    };
    let mg = c.m / c.group;
    // Every element is written by the GEMM.
    let mut wide = aim_kernels::scratch::take(mg * n_wide);
    let bias = c.bias.as_ref().map(|v| &v[gi * mg..(gi + 1) * mg]);
    // Without a residual the activation can run in the GEMM's epilogue; with one it must
    // wait until the residual is added, in the compaction.
    let ep = Epilogue {
        row_bias: bias,
        col_bias: None,
        residual: None,
        act: if res.is_none() { c.act } else { None },
        ..Epilogue::default()
    };
    gemm_lazy_b(&c.weights[gi], n_wide, &fill, &mut wide, n_wide, &ep, pool);
    let act = c.act.unwrap_or(Activation::Identity);
    let dp = OutPtr(dst.as_mut_ptr());
    let wide = &wide;
    pool.for_each(mg, &|m| {
        let dp = dp;
        // SAFETY: output channel m is written by this task only.
        let plane_out = unsafe { std::slice::from_raw_parts_mut(dp.0.add(m * oh * ow), oh * ow) };
        for oy in 0..oh {
            let src = &wide[m * n_wide + oy * wp..m * n_wide + oy * wp + ow];
            let row = &mut plane_out[oy * ow..(oy + 1) * ow];
            match res {
                Some(r) => {
                    let r = &r[(m * oh + oy) * ow..(m * oh + oy + 1) * ow];
                    for ((o, &v), &x) in row.iter_mut().zip(src).zip(r) {
                        *o = act.apply(v + x);
                    }
                }
                None => copy_short(row, src),
            }
        }
    });
}

/// Output positions per image below which a batch runs as one GEMM (columns: image, then
/// position) rather than one per image: a handful of columns leaves the GEMM's tiles empty.
const SMALL_OUTPUT: usize = 64;

/// What the whole-batch convolution paths ([`conv_batched`], [`conv_by_position`]) read:
/// the input of `nb` images, their spatial sizes in and out, the padding before each
/// spatial dim and the residual, if one is fused.
#[derive(Clone, Copy)]
struct Batch<'a> {
    xd: &'a [f32],
    nb: usize,
    in_sp: &'a [usize],
    out_sp: &'a [usize],
    before: &'a [usize],
    res: Option<&'a [f32]>,
}

/// One group of a convolution over a batch of images with small outputs (a 1-D
/// convolution over a batch of short frames, as speech models run them) as one GEMM whose
/// columns are (image, output position): im2col over the batch into a wide result, then
/// scattered to `[n][m][positions]` with the residual and activation.
fn conv_batched(c: &ConvPrep, gi: usize, batch: &Batch, yd: &mut [f32], pool: &ThreadPool) {
    let Batch { xd, nb, in_sp, out_sp, before, res } = *batch;
    let (cg, mg) = (c.cin / c.group, c.m / c.group);
    let osize: usize = out_sp.iter().product();
    let isize: usize = in_sp.iter().product();
    let n_wide = nb * osize;
    // Each image's im2col; a strip of columns is split where it crosses images.
    let images: Vec<Fill> = (0..nb)
        .map(|b| im2col(&xd[(b * c.cin + gi * cg) * isize..][..cg * isize], in_sp, out_sp, before, &c.geo))
        .collect();
    let fill = |p: usize, j0: usize, dst: &mut [f32]| {
        let (mut j, mut rest) = (j0, dst);
        while !rest.is_empty() {
            let (b, q) = (j / osize, j % osize);
            let (part, tail) = rest.split_at_mut((osize - q).min(rest.len()));
            images[b](p, q, part);
            (j, rest) = (j + part.len(), tail);
        }
    };
    let mut wide = aim_kernels::scratch::take(mg * n_wide);
    let ep = Epilogue {
        row_bias: c.bias.as_ref().map(|v| &v[gi * mg..(gi + 1) * mg]),
        col_bias: None,
        residual: None,
        act: if res.is_none() { c.act } else { None },
        ..Epilogue::default()
    };
    gemm_lazy_b(&c.weights[gi], n_wide, &fill, &mut wide, n_wide, &ep, pool);
    for b in 0..nb {
        for m in 0..mg {
            let at = (b * c.m + gi * mg + m) * osize;
            let src = &wide[m * n_wide + b * osize..][..osize];
            match res {
                Some(r) => write_row(&mut yd[at..at + osize], |q| src[q], &r[at..at + osize], c.act),
                None => copy_short(&mut yd[at..at + osize], src),
            }
        }
    }
}

/// An output row whose GEMM result (`value(q)`, bias in, activation not) still needs the
/// residual: `row[q] = act(value(q) + residual[q])`.
fn write_row(row: &mut [f32], value: impl Fn(usize) -> f32, residual: &[f32], act: Option<Activation>) {
    let act = act.unwrap_or(Activation::Identity);
    for (q, (o, &x)) in row.iter_mut().zip(residual).enumerate() {
        *o = act.apply(value(q) + x);
    }
}

/// A one-group convolution as one GEMM whose rows are the output positions of the batch
/// (image, then position): the transposed im2col matrix (positions × Cin·k, made here) times
/// the weights packed as B, then scattered to `[n][m][positions]` with the residual and
/// activation. For outputs of a few positions, which would leave a weights-as-A GEMM's
/// columns empty.
fn conv_by_position(c: &ConvPrep, wt: &PackedB, blocking: Blocking, batch: &Batch, yd: &mut [f32], pool: &ThreadPool) {
    let Batch { xd, nb, in_sp, out_sp, before, res } = *batch;
    let osize: usize = out_sp.iter().product();
    let isize: usize = in_sp.iter().product();
    let (k, rows, m) = (wt.k, nb * osize, c.m);
    let threads = pool.threads().max(1);
    let mut scratch = aim_kernels::scratch::take(rows * k);
    let a: &mut [f32] = &mut scratch;
    // The windows, images split among the threads.
    let at = OutPtr(a.as_mut_ptr());
    let tasks = nb.min(threads);
    let gather = |t: usize| {
        let at = at;
        let (b0, b1) = (t * nb / tasks, (t + 1) * nb / tasks);
        // SAFETY: `a` holds nb·osize·k floats; images b0..b1 are this task's only.
        let part = unsafe { std::slice::from_raw_parts_mut(at.0.add(b0 * osize * k), (b1 - b0) * osize * k) };
        if channels_last(&c.geo) {
            let images = Batch { xd: &xd[b0 * c.cin * isize..b1 * c.cin * isize], nb: b1 - b0, ..*batch };
            windows_channels_last(c, &images, osize, part);
            return;
        }
        for (i, image) in part.chunks_exact_mut(osize * k).enumerate() {
            let x = &xd[(b0 + i) * c.cin * isize..][..c.cin * isize];
            for (q, row) in image.chunks_exact_mut(k).enumerate() {
                window_row(x, c.cin, in_sp, out_sp, before, &c.geo, q, row);
            }
        }
    };
    if rows * k < SERIAL_FLOATS {
        (0..tasks).for_each(gather);
    } else {
        pool.for_each(tasks, &gather);
    }
    let a: &[f32] = a;
    let mut out = aim_kernels::scratch::take(rows * m);
    let ep =
        Epilogue { col_bias: c.bias.as_deref(), act: if res.is_none() { c.act } else { None }, ..Epilogue::default() };
    gemm_rows(a, rows, k, blocking, wt, &mut out, m, &ep, pool);
    // Scattered to [n][m][positions] by ranges of channels: the column panels each thread
    // computed in the GEMM (its split of `nr`-wide panels, mirrored), so that each reads the
    // results in its own cache.
    let out: &[f32] = &out;
    let nr = wt.isa().nr();
    let panels = m.div_ceil(nr);
    let tasks = panels.min(threads).max(1);
    let yp = OutPtr(yd.as_mut_ptr());
    let scatter = |t: usize| {
        let yp = yp;
        let (m0, m1) = ((t * panels / tasks * nr).min(m), ((t + 1) * panels / tasks * nr).min(m));
        for (b, image) in out.chunks_exact(osize * m).enumerate() {
            for ch in m0..m1 {
                let at = (b * m + ch) * osize;
                // SAFETY: y holds nb·m·osize floats; channels m0..m1 are this task's only.
                let row = unsafe { std::slice::from_raw_parts_mut(yp.0.add(at), osize) };
                // Column `ch` of the result, down this image's positions.
                let col = |q: usize| image[q * m + ch];
                match res {
                    Some(r) => write_row(row, col, &r[at..at + osize], c.act),
                    None => row.iter_mut().enumerate().for_each(|(q, o)| *o = col(q)),
                }
            }
        }
    };
    if rows * m < SERIAL_FLOATS {
        (0..tasks).for_each(scatter);
    } else {
        pool.for_each(tasks, &scatter);
    }
}

/// Below this many floats, gathering or scattering runs on the calling thread: waking the
/// pool costs more.
const SERIAL_FLOATS: usize = 8 * 1024;

/// Whether [`conv_by_position`] reads its windows from a channels-last copy of each image
/// (1-D, undilated): a window is then one contiguous run of `kernel · cin` values, in the
/// order (kernel offset, channel), and the weights are packed in that order. Gathered
/// channel by channel instead, a window of a 3-wide kernel over 129 channels is 129 copies
/// of 3 values (silero-vad's encoder: 2/3 of the convolution's time).
fn channels_last(geo: &Geometry) -> bool {
    geo.kernel.len() == 1 && geo.dilations[0] == 1
}

/// The weights' row (channel-major: `ci · kw + kk`) of row `p` of a channels-last window
/// (`kk · cin + ci`).
fn weights_row(p: usize, cin: usize, kw: usize) -> usize {
    (p % cin) * kw + p / cin
}

/// The rows of [`conv_by_position`]'s A for a 1-D undilated convolution: each image
/// transposed to (position, channel) with zero rows for the padding, then every output
/// position's window copied as one run.
fn windows_channels_last(c: &ConvPrep, batch: &Batch, osize: usize, a: &mut [f32]) {
    let (cin, kw, s) = (c.cin, c.geo.kernel[0], c.geo.strides[0]);
    let (in_w, before) = (batch.in_sp[0], batch.before[0]);
    let k = cin * kw;
    // Padded length: every window, and the input after the leading padding, fit.
    let len = (before + in_w).max(osize.saturating_sub(1) * s + kw);
    let mut padded = aim_kernels::scratch::take(len * cin);
    let xp: &mut [f32] = &mut padded;
    zero_short(&mut xp[..before * cin]);
    zero_short(&mut xp[(before + in_w) * cin..]);
    for (image, rows) in batch.xd.chunks_exact(cin * in_w).zip(a.chunks_exact_mut(osize * k)).take(batch.nb) {
        let body = &mut xp[before * cin..(before + in_w) * cin];
        for (ci, plane) in image.chunks_exact(in_w).enumerate() {
            for (w, &v) in plane.iter().enumerate() {
                body[w * cin + ci] = v;
            }
        }
        for (q, row) in rows.chunks_exact_mut(k).enumerate() {
            row.copy_from_slice(&xp[q * s * cin..q * s * cin + k]);
        }
    }
}

/// The values under the window of output position `q` (row-major over `out_sp`), in the
/// weights' order (input channel, then kernel offset, innermost dim last), zero outside
/// the input: one row of the transposed im2col matrix.
#[allow(clippy::too_many_arguments)]
fn window_row(
    x: &[f32],
    cin: usize,
    in_sp: &[usize],
    out_sp: &[usize],
    before: &[usize],
    geo: &Geometry,
    q: usize,
    row: &mut [f32],
) {
    let sp = in_sp.len();
    let last = sp - 1;
    let isize: usize = in_sp.iter().product();
    let (kw, in_w) = (geo.kernel[last], in_sp[last]);
    let outer: usize = geo.kernel[..last].iter().product();
    // The position's coordinates; the first input column its window reads (may be < 0).
    let mut pos = [0usize; 8];
    let mut rest = q;
    for d in (0..sp).rev() {
        pos[d] = rest % out_sp[d];
        rest /= out_sp[d];
    }
    let start = (pos[last] * geo.strides[last]) as isize - before[last] as isize;
    let dil = geo.dilations[last] as isize;
    // The kernel columns whose input column exists, `lo..hi`: the same for every line.
    let lo = (0..kw).find(|&kk| start + kk as isize * dil >= 0).unwrap_or(kw);
    let hi = (lo..kw).find(|&kk| start + kk as isize * dil >= in_w as isize).unwrap_or(kw);
    let mut idx = 0;
    for ci in 0..cin {
        let plane = &x[ci * isize..(ci + 1) * isize];
        for ko in 0..outer {
            // The offset of the outer kernel dims, and whether that row of the input exists.
            let (mut kf, mut line, mut inside) = (ko, 0usize, true);
            let mut koff = [0usize; 8];
            for d in (0..last).rev() {
                koff[d] = kf % geo.kernel[d];
                kf /= geo.kernel[d];
            }
            for d in 0..last {
                let i = (pos[d] * geo.strides[d] + koff[d] * geo.dilations[d]) as isize - before[d] as isize;
                inside &= i >= 0 && i < in_sp[d] as isize;
                line = line * in_sp[d] + i.max(0) as usize;
            }
            let dst = &mut row[idx..idx + kw];
            if inside {
                let src = &plane[line * in_w..(line + 1) * in_w];
                zero_short(&mut dst[..lo]);
                zero_short(&mut dst[hi..]);
                if lo < hi {
                    let i0 = (start + lo as isize * dil) as usize;
                    if dil == 1 {
                        copy_short(&mut dst[lo..hi], &src[i0..i0 + hi - lo]);
                    } else {
                        for (t, v) in dst[lo..hi].iter_mut().enumerate() {
                            *v = src[i0 + t * dil as usize];
                        }
                    }
                }
            } else {
                zero_short(dst);
            }
            idx += kw;
        }
    }
}

/// Fills a strip of B for [`gemm_lazy_b`]: `(row, first column, destination)`.
type Fill<'a> = Box<dyn Fn(usize, usize, &mut [f32]) + Sync + 'a>;

/// The im2col matrix of one group — row (ci, kernel offset), column output position — as a
/// function filling a strip of consecutive columns of one row, for [`gemm_lazy_b`].
fn im2col<'a>(
    xg: &'a [f32],
    in_sp: &'a [usize],
    out_sp: &'a [usize],
    before: &'a [usize],
    geo: &'a Geometry,
) -> Fill<'a> {
    let ksize: usize = geo.kernel.iter().product();
    let isize: usize = in_sp.iter().product();
    let sp = in_sp.len();
    if sp == 1 {
        // 1-D: row p of a strip reads input positions q·s + k·d − before, one strided run
        // (a plain copy at stride 1), bounds checked per element only at the edges.
        let (s, len) = (geo.strides[0], in_sp[0] as isize);
        return Box::new(move |p, j0, dst| {
            let (ci, kk) = (p / ksize, p % ksize);
            let plane = &xg[ci * isize..(ci + 1) * isize];
            let first = (j0 * s + kk * geo.dilations[0]) as isize - before[0] as isize;
            let last = first + (dst.len().max(1) - 1) as isize * s as isize;
            if first >= 0 && last < len {
                let first = first as usize;
                if s == 1 {
                    dst.copy_from_slice(&plane[first..first + dst.len()]);
                } else {
                    for (t, v) in dst.iter_mut().enumerate() {
                        *v = plane[first + t * s];
                    }
                }
            } else {
                for (t, v) in dst.iter_mut().enumerate() {
                    let i = first + (t * s) as isize;
                    *v = if i >= 0 && i < len { plane[i as usize] } else { 0.0 };
                }
            }
        });
    }
    Box::new(move |p, j0, dst| {
        let (ci, mut kflat) = (p / ksize, p % ksize);
        // Kernel offsets of row p, innermost dim last.
        let mut koff = [0usize; 8];
        for d in (0..sp).rev() {
            koff[d] = kflat % geo.kernel[d];
            kflat /= geo.kernel[d];
        }
        let plane = &xg[ci * isize..(ci + 1) * isize];
        // The output position of column j0, then walk forward.
        let mut pos = [0usize; 8];
        let mut jf = j0;
        for d in (0..sp).rev() {
            pos[d] = jf % out_sp[d];
            jf /= out_sp[d];
        }
        for v in dst.iter_mut() {
            let mut off = 0usize;
            let mut inside = true;
            for d in 0..sp {
                let i = (pos[d] * geo.strides[d] + koff[d] * geo.dilations[d]) as isize - before[d] as isize;
                if i < 0 || i >= in_sp[d] as isize {
                    inside = false;
                    break;
                }
                off = off * in_sp[d] + i as usize;
            }
            *v = if inside { plane[off] } else { 0.0 };
            for d in (0..sp).rev() {
                pos[d] += 1;
                if pos[d] < out_sp[d] {
                    break;
                }
                pos[d] = 0;
            }
        }
    })
}
