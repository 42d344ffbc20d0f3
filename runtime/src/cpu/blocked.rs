//! Nodes in the blocked channel layout (NCHWc), placed by the compiler's layout pass:
//! `aim:Conv` with `layout = "NCHWc"` (plain or depthwise) and the `aim:ToBlocked` /
//! `aim:FromBlocked` reorders at the edges of a blocked region.

use super::conv::{geometry, resolve, Geometry};
use super::{activation, const_f32, prep_err, In, Out, Prepared, Residual};
use crate::exec::RunError;
use crate::pool::ThreadPool;
use aim_ir::{Graph, Node};
use aim_kernels::gemm::{Activation, Blocking, Isa};
use aim_kernels::nchwc::{self, ConvIo, Layout};

/// A blocked convolution, packed at load time.
pub(super) struct BlockedConv {
    kernel: Kernel,
    pub(super) geo: Geometry,
    cin: usize,
    cout: usize,
    input: Layout,
    lanes: usize,
    /// Whether each run hands the pages of weights read from a mapped file back after it
    /// (a memory budget's choice, [`super::CpuProgram::release_after_use`]).
    pub(super) release: std::sync::atomic::AtomicBool,
}

enum Kernel {
    Conv(nchwc::Conv),
    Depthwise(nchwc::Depthwise),
    Winograd(nchwc::Winograd),
}

/// Bytes of `c`'s weights that lie in a memory-mapped file (prepacked in a `.aim` file).
pub(super) fn mapped_bytes(c: &BlockedConv) -> usize {
    match &c.kernel {
        Kernel::Conv(k) => k.mapped_bytes(),
        Kernel::Winograd(w) => w.mapped_bytes(),
        Kernel::Depthwise(_) => 0,
    }
}

/// Hands the resident pages of `c`'s weights in a mapped file back to the kernel.
pub(super) fn release_pages(c: &BlockedConv) {
    match &c.kernel {
        Kernel::Conv(k) => k.release_pages(),
        Kernel::Winograd(w) => w.release_pages(),
        Kernel::Depthwise(_) => {}
    }
}

/// The graph's channel block for `n` and the kernels that run it in a program of `isa`'s
/// (its own block, or AVX2's 8 on an AVX-512 CPU), or why the program cannot.
fn block_of(n: &Node, isa: Isa) -> Result<(usize, Isa), RunError> {
    let b = n.int("block", 0);
    match usize::try_from(b).ok().and_then(|b| nchwc::isa_for_block(isa, b).map(|k| (b, k))) {
        Some(found) => Ok(found),
        None => Err(prep_err(
            n,
            format!("compiled for channel blocks of {b}, but this program's ISA uses {}", nchwc::lanes(isa)),
        )),
    }
}

/// Packs a blocked `aim:Conv`.
pub(super) fn prepare(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<Prepared, RunError> {
    let (lanes, isa) = block_of(n, isa)?;
    let (w, dims, prepacked) = super::prepacked::weight(g, n, 4)?;
    let (cout, cg, kh, kw) = (dims[0], dims[1], dims[2], dims[3]);
    let group = n.int("group", 1).max(1) as usize;
    let bias = match n.input(2) {
        Some(b) => Some(
            const_f32(g, Some(b))
                .filter(|t| t.len() == cout)
                .ok_or_else(|| prep_err(n, "bias must be constant f32 with one value per output channel"))?
                .data::<f32>(),
        ),
        None => None,
    };
    let geo = geometry(n, &[kh, kw]);
    let kgeo = nchwc::Geometry {
        kernel: [kh, kw],
        strides: [geo.strides[0], geo.strides[1]],
        dilations: [geo.dilations[0], geo.dilations[1]],
    };
    let act = activation(n).unwrap_or(Activation::Identity);
    let input = match n.string("in_layout", "NCHWc") {
        "NCHW" => Layout::Nchw,
        "NCHWc" => Layout::Blocked,
        other => return Err(prep_err(n, format!("unknown input layout '{other}'"))),
    };
    let shape = nchwc::ConvShape {
        kernel: [kh, kw],
        strides: kgeo.strides,
        dilations: kgeo.dilations,
        group,
        blocked_input: input == Layout::Blocked,
        cin: cg,
        cout,
        lanes,
        exact: n.int(nchwc::EXACT_SUMS, 0) != 0,
    };
    // The compiler's choice (`select-kernels`), checked; the same rule where it made none.
    let choice = match n.attrs.get("kernel") {
        Some(aim_ir::Attr::String(k)) => match nchwc::BlockedKernel::parse(k) {
            Some(c) if shape.fits(c) => c,
            _ => return Err(prep_err(n, format!("kernel '{k}' cannot run this convolution"))),
        },
        Some(_) => return Err(prep_err(n, "the kernel attribute must be a string")),
        None => shape.choose().ok_or_else(|| prep_err(n, "blocked convolutions are plain (group 1) or depthwise"))?,
    };
    let bad = |e: String| prep_err(n, format!("prepacked weights: {e}"));
    // The direct kernel's weights come in panels of two output blocks ("direct", also what
    // files written before panels of three existed hold) or three ("direct3").
    let (prepacked, panel) = match prepacked {
        Some("direct3") => (Some("direct"), 3),
        other => (other, 2),
    };
    if let Some(kind) = prepacked.filter(|&k| k != choice.name()) {
        return Err(bad(format!("packed for the {kind} kernel, but the node runs the {} one", choice.name())));
    }
    let packed = |w: &aim_ir::Tensor| {
        aim_kernels::floats::Floats::view(w, 0, w.len()).ok_or_else(|| bad("the weights are not f32".into()))
    };
    let (kernel, cin) = match (choice, prepacked.is_some()) {
        (nchwc::BlockedKernel::Winograd, true) => {
            (Kernel::Winograd(nchwc::Winograd::with_packed(isa, w, bias, cout, cg, act, blocking.kc).map_err(bad)?), cg)
        }
        (nchwc::BlockedKernel::Winograd, false) => {
            (Kernel::Winograd(nchwc::Winograd::new(isa, w.data::<f32>(), bias, cout, cg, act, blocking.kc)), cg)
        }
        (nchwc::BlockedKernel::Direct, true) => {
            let conv = nchwc::Conv::with_packed(isa, packed(w)?, bias, cout, cg, kgeo, input, act, blocking.kc, panel);
            (Kernel::Conv(conv.map_err(bad)?), cg)
        }
        (nchwc::BlockedKernel::Direct, false) => {
            (Kernel::Conv(nchwc::Conv::new(isa, w.data::<f32>(), bias, cout, cg, kgeo, input, act, blocking.kc)), cg)
        }
        (nchwc::BlockedKernel::Depthwise, true) => return Err(bad("depthwise weights are not stored packed".into())),
        (nchwc::BlockedKernel::Depthwise, false) => {
            (Kernel::Depthwise(nchwc::Depthwise::new(isa, w.data::<f32>(), bias, cout, kgeo, act)), cout)
        }
    };
    let post = super::post_program(n, isa)?;
    let kernel = match kernel {
        Kernel::Conv(c) => Kernel::Conv(c.with_post(post)),
        Kernel::Depthwise(d) => Kernel::Depthwise(d.with_post(post)),
        Kernel::Winograd(w) => Kernel::Winograd(w.with_post(post)),
    };
    Ok(Prepared::Blocked(Box::new(BlockedConv { kernel, geo, cin, cout, input, lanes, release: Default::default() })))
}

/// The weights of a blocked convolution in the packed form its kernel reads (`None` for
/// kernels that are quick to prepare), with the kind `prepare` takes back.
pub(super) fn packed(c: &BlockedConv) -> Option<(&'static str, Vec<f32>)> {
    match &c.kernel {
        Kernel::Winograd(w) => Some(("winograd", w.packed_weights())),
        Kernel::Conv(k) => Some((if k.panel() == 3 { "direct3" } else { "direct" }, k.packed_weights().to_vec())),
        Kernel::Depthwise(_) => None,
    }
}

/// Whether the convolution can overwrite its residual in place (the direct kernel starts
/// its sums from the output; the depthwise and Winograd ones take the residual apart).
pub(super) fn takes_residual_in_place(c: &BlockedConv) -> bool {
    matches!(c.kernel, Kernel::Conv(_))
}

/// Runs a blocked convolution on `x` (blocked, or NCHW for `in_layout = "NCHW"`).
pub(super) fn run(c: &BlockedConv, x: In, residual: Residual, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let l = c.lanes;
    let xs = x.shape;
    let ok = match c.input {
        Layout::Nchw => xs.len() == 4 && xs[1] == c.cin,
        Layout::Blocked => xs.len() == 5 && xs[1] == c.cin.div_ceil(l) && xs[4] == l,
    };
    if !ok {
        return Err(format!("input {xs:?} does not fit {} input channels in the {:?} layout", c.cin, c.input));
    }
    let (n, h, w) = (xs[0], xs[2], xs[3]);
    let (oh, ow, pads) = output_geometry(c, h, w)?;
    let shape = [n, c.cout.div_ceil(l), oh, ow, l];
    let (res, residual_in_y) = residual.check(&shape, y)?;
    let io = ConvIo { x: x.data, batch: n, h, w, pads, oh, ow, residual: res, residual_in_y, y: y.take(&shape)? };
    match &c.kernel {
        Kernel::Conv(k) => k.run(io, pool)?,
        Kernel::Depthwise(k) => k.run(io, pool)?,
        Kernel::Winograd(k) => k.run(io, pool)?,
    }
    Ok(())
}

/// A reorder between NCHW and the blocked layout.
pub(super) struct Reorder {
    to_blocked: bool,
    isa: Isa,
    lanes: usize,
    channels: usize,
}

/// Prepares `aim:ToBlocked` / `aim:FromBlocked`.
pub(super) fn prepare_reorder(n: &Node, isa: Isa) -> Result<Prepared, RunError> {
    let (lanes, isa) = block_of(n, isa)?;
    let to_blocked = n.op == "ToBlocked";
    let channels = n.int("channels", 0).max(0) as usize;
    if !to_blocked && channels == 0 {
        return Err(prep_err(n, "FromBlocked needs its channel count"));
    }
    Ok(Prepared::Reorder(Reorder { to_blocked, isa, lanes, channels }))
}

/// Runs a reorder.
pub(super) fn run_reorder(r: &Reorder, x: In, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let (xs, l) = (x.shape, r.lanes);
    if r.to_blocked {
        if xs.len() != 4 {
            return Err(format!("expected an NCHW input, got {xs:?}"));
        }
        let y = y.take(&[xs[0], xs[1].div_ceil(l), xs[2], xs[3], l])?;
        nchwc::to_blocked(r.isa, x.data, xs[0], xs[1], xs[2] * xs[3], y, pool);
    } else {
        if xs.len() != 5 || xs[4] != l || xs[1] != r.channels.div_ceil(l) {
            return Err(format!("expected a blocked input of {} channels, got {xs:?}", r.channels));
        }
        let y = y.take(&[xs[0], r.channels, xs[2], xs[3]])?;
        nchwc::from_blocked(r.isa, x.data, xs[0], r.channels, xs[2] * xs[3], y, pool);
    }
    Ok(())
}

/// The output height and width of a blocked convolution for an `h × w` input, and its
/// padding (top, left, bottom, right; the padding after is what the last window needs
/// beyond the input, if anything).
fn output_geometry(c: &BlockedConv, h: usize, w: usize) -> Result<(usize, usize, [usize; 4]), String> {
    let (out, before) = resolve(&c.geo, &[h, w])?;
    let (oh, ow) = (out[0], out[1]);
    let need = |o: usize, d: usize| (o - 1) * c.geo.strides[d] + (c.geo.kernel[d] - 1) * c.geo.dilations[d] + 1;
    let after = |o: usize, d: usize, size: usize| if o == 0 { 0 } else { need(o, d).saturating_sub(size + before[d]) };
    Ok((oh, ow, [before[0], before[1], after(oh, 0, h), after(ow, 1, w)]))
}

/// The loop nest of a blocked convolution whose input and output have `input` and `shape`,
/// for explore.
pub(super) fn schedule(c: &BlockedConv, input: &[usize], shape: &[usize], residual: bool) -> Vec<String> {
    let (batch, oh, ow) = (shape[0], shape[2], shape[3]);
    match &c.kernel {
        Kernel::Conv(k) => {
            let padded =
                c.geo.pads.iter().any(|&p| p > 0) || !matches!(c.geo.auto_pad.as_str(), "NOTSET" | "VALID" | "");
            k.schedule(batch, oh, ow, padded, residual)
        }
        Kernel::Depthwise(k) => match (input.len(), output_geometry(c, input[2], input[3])) {
            (5, Ok((_, _, pads))) => k.schedule(batch, input[2], input[3], oh, ow, pads, residual),
            _ => vec![format!("input {input:?}: not a blocked input this convolution takes")],
        },
        Kernel::Winograd(k) => k.schedule(batch, oh, ow, residual),
    }
}

/// The loops of a reorder whose input has `shape`, for explore.
pub(super) fn reorder_schedule(r: &Reorder, shape: &[usize]) -> Vec<String> {
    let hw: usize = shape[2..4].iter().product();
    let (channels, what) = if r.to_blocked {
        (shape[1], format!("{} channels × {hw} px into {hw} px × {}", r.lanes, r.lanes))
    } else {
        (r.channels, format!("{hw} px × {} into {} channels × {hw} px", r.lanes, r.lanes))
    };
    vec![format!(
        "parallel for (image, block, pixel range) over {} blocks: transpose {what}, 8×8 tiles in registers",
        shape[0] * channels.div_ceil(r.lanes)
    )]
}

/// Blocked pooling, prepared: the window or global average, and the kernels of its block.
pub(super) struct BlockedPool {
    what: PoolKind,
    isa: Isa,
}

/// What a blocked pooling node computes.
enum PoolKind {
    Window(nchwc::Pool, usize),
    GlobalAverage { channels: usize, lanes: usize },
}

/// Prepares `aim:MaxPool`, `aim:AveragePool` (blocked in and out) and
/// `aim:GlobalAveragePool` (blocked in, NCHW out).
pub(super) fn prepare_pool(n: &Node, isa: Isa) -> Result<Prepared, RunError> {
    let (lanes, isa) = block_of(n, isa)?;
    if n.op == "GlobalAveragePool" {
        let channels = n.int("channels", 0).max(0) as usize;
        if channels == 0 {
            return Err(prep_err(n, "GlobalAveragePool needs its channel count"));
        }
        return Ok(Prepared::Pool(BlockedPool { what: PoolKind::GlobalAverage { channels, lanes }, isa }));
    }
    let two = |name: &str, default: usize| -> Result<[usize; 2], RunError> {
        match n.ints(name) {
            None => Ok([default; 2]),
            Some(&[a, b]) if a >= 1 && b >= 1 => Ok([a as usize, b as usize]),
            Some(v) => Err(prep_err(n, format!("{name} {v:?} is not two positive sizes"))),
        }
    };
    let kernel = two("kernel_shape", 0)?;
    if kernel.contains(&0) {
        return Err(prep_err(n, "kernel_shape is missing"));
    }
    let pads = match (n.string("auto_pad", "NOTSET"), n.ints("pads")) {
        ("VALID", _) | (_, None) => [0; 4],
        (_, Some(&[a, b, c, d])) if [a, b, c, d].iter().all(|&v| v >= 0) => {
            [a as usize, b as usize, c as usize, d as usize]
        }
        (_, Some(p)) => return Err(prep_err(n, format!("pads {p:?} are not four sizes"))),
    };
    let pool = nchwc::Pool {
        max: n.op == "MaxPool",
        kernel,
        strides: two("strides", 1)?,
        pads,
        include_pad: n.int("count_include_pad", 0) != 0,
    };
    Ok(Prepared::Pool(BlockedPool { what: PoolKind::Window(pool, lanes), isa }))
}

/// Runs blocked pooling on `x`.
pub(super) fn run_pool(p: &BlockedPool, x: In, y: &mut Out, pool: &ThreadPool) -> Result<(), String> {
    let (xs, isa) = (x.shape, p.isa);
    let (l, expect) = match &p.what {
        PoolKind::Window(_, l) => (*l, None),
        PoolKind::GlobalAverage { channels, lanes } => (*lanes, Some(channels.div_ceil(*lanes))),
    };
    if xs.len() != 5 || xs[4] != l || expect.is_some_and(|b| xs[1] != b) {
        return Err(format!("expected a blocked input, got {xs:?}"));
    }
    let (n, blocks, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    match &p.what {
        PoolKind::Window(win, _) => {
            let (oh, ow) =
                win.output(h, w).ok_or_else(|| format!("the {:?} window does not fit a {h}×{w} input", win.kernel))?;
            let y = y.take(&[n, blocks, oh, ow, l])?;
            win.run(isa, x.data, n, blocks, h, w, y, pool)?;
            Ok(())
        }
        PoolKind::GlobalAverage { channels, .. } => {
            let y = y.take(&[n, *channels, 1, 1])?;
            nchwc::global_average(isa, x.data, n, *channels, h * w, y, pool)?;
            Ok(())
        }
    }
}

/// The loops of blocked pooling over an input of `shape`, for explore.
pub(super) fn pool_schedule(p: &BlockedPool, shape: &[usize]) -> Vec<String> {
    match &p.what {
        PoolKind::Window(win, l) => {
            let (oh, _) = win.output(shape[2], shape[3]).unwrap_or((0, 0));
            vec![format!(
                "parallel for (image, block, output row) in 0..{}: {} over {}×{} windows, {l} channels per vector",
                shape[0] * shape[1] * oh,
                if win.max { "max" } else { "average" },
                win.kernel[0],
                win.kernel[1]
            )]
        }
        PoolKind::GlobalAverage { channels, lanes } => {
            vec![format!("parallel for (image, block) in 0..{}: sum {} pixels of {lanes} channels, write the {channels} true channels as NCHW", shape[0] * shape[1], shape[2] * shape[3])]
        }
    }
}
