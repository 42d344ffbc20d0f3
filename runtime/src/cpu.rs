//! The CPU program: an optimised graph whose `aim:Conv` and `aim:Dense` nodes run as packed
//! GEMMs (weights packed once, here) or direct depthwise loops with fused epilogues, on a
//! persistent thread pool; every other node runs its reference kernel.

use crate::exec::{run_node, run_with, RunError, Runner, Scope};
use crate::pool::ThreadPool;
use aim_ir::{DType, Graph, Node, Tensor};
use aim_kernels::gemm::{gemm, gemm_lazy_b, Activation, Blocking, Epilogue, Isa, PackedA, PackedB, Parallel};
use std::collections::HashMap;

/// A generated elementwise loop: `out[i] = f(inputs[0][i], ...)` for `start <= i < end`.
pub type ElementwiseFn = unsafe extern "C" fn(inputs: *const *const f32, out: *mut f32, start: usize, end: usize);

/// Machine code generated for a program's nodes, by node index, and what keeps it alive.
#[derive(Default)]
pub struct Generated {
    /// The loops of `aim:Elementwise` nodes.
    pub elementwise: HashMap<usize, ElementwiseFn>,
    /// The owner of the code (a JIT module): held as long as the program lives.
    pub owner: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

/// Per-node work prepared at load time.
enum Prepared {
    Conv(Box<ConvPrep>),
    Depthwise(Box<DepthwisePrep>),
    Dense(Box<DensePrep>),
    Elementwise(ElementwiseFn),
}

struct Geometry {
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pads: Vec<i64>,
    auto_pad: String,
}

struct ConvPrep {
    /// One packed weight matrix (Mg × Cg·k) per group.
    weights: Vec<PackedA>,
    bias: Option<Vec<f32>>,
    act: Option<Activation>,
    group: usize,
    m: usize,
    cin: usize,
    geo: Geometry,
}

struct DepthwisePrep {
    weights: Vec<f32>,
    bias: Option<Vec<f32>>,
    act: Option<Activation>,
    channels: usize,
    geo: Geometry,
}

struct DensePrep {
    weight: PackedB,
    bias: Option<Vec<f32>>,
    act: Option<Activation>,
    k: usize,
    n: usize,
}

/// Why a node could not be prepared.
fn prep_err(n: &Node, msg: impl Into<String>) -> RunError {
    RunError::Node { node: n.name.clone(), op: format!("{}:{}", n.domain, n.op), msg: msg.into() }
}

fn activation(n: &Node) -> Option<Activation> {
    match n.string("activation", "") {
        "relu" => Some(Activation::Relu),
        "clip" => Some(Activation::Clip(n.float("clip_min", f32::NEG_INFINITY), n.float("clip_max", f32::INFINITY))),
        _ => None,
    }
}

fn const_f32<'a>(g: &'a Graph, name: Option<&str>) -> Option<&'a Tensor> {
    g.initializers.get(name?).filter(|t| t.dtype() == DType::F32)
}

/// A graph compiled for this CPU.
pub struct CpuProgram {
    graph: Graph,
    prepared: HashMap<usize, Prepared>,
    pool: ThreadPool,
    isa: Isa,
    blocking: Blocking,
    /// Keeps generated code mapped.
    _code: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl CpuProgram {
    /// Prepares `graph` (already optimised by the compiler's passes): packs the weights of
    /// every `aim:Conv` and `aim:Dense` node for `isa` with `blocking`, takes the generated
    /// loops of `aim:Elementwise` nodes from `code`, and starts `threads` threads.
    pub fn new(graph: Graph, isa: Isa, blocking: Blocking, threads: usize, code: Generated) -> Result<CpuProgram, RunError> {
        let mut prepared = HashMap::new();
        for (i, n) in graph.nodes.iter().enumerate() {
            if n.domain != "aim" {
                continue;
            }
            let p = match n.op.as_str() {
                "Conv" => prepare_conv(&graph, n, isa, blocking)?,
                "Dense" => prepare_dense(&graph, n, isa, blocking)?,
                "Elementwise" => Prepared::Elementwise(*code.elementwise.get(&i).ok_or_else(|| prep_err(n, "no code was generated for this node"))?),
                _ => return Err(prep_err(n, "unknown aim op")),
            };
            prepared.insert(i, p);
        }
        // Weights now live packed in the prepared nodes: their inputs are baked in, and the
        // unpacked copies nothing else reads (for ResNet-50, 100 MB) are dropped.
        let mut graph = graph;
        for (i, n) in graph.nodes.iter_mut().enumerate() {
            if prepared.contains_key(&i) && n.op != "Elementwise" {
                for k in 1..3.min(n.inputs.len()) {
                    n.inputs[k].clear();
                }
            }
        }
        let mut read = Vec::new();
        graph.names_read(&mut read);
        let read: std::collections::HashSet<String> = read.into_iter().collect();
        graph.initializers.retain(|k, _| read.contains(k));
        Ok(CpuProgram { graph, prepared, pool: ThreadPool::new(threads), isa, blocking, _code: code.owner })
    }

    /// The optimised graph this program runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The microkernel family in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The cache blocking in use.
    pub fn blocking(&self) -> Blocking {
        self.blocking
    }

    /// Threads the program runs on.
    pub fn threads(&self) -> usize {
        self.pool.size()
    }

    /// Runs the program.
    pub fn run(&self, inputs: HashMap<String, Tensor>) -> Result<Vec<Tensor>, RunError> {
        run_with(&self.graph, inputs, None, self, None)
    }

    /// Runs the program, recording every node's time.
    pub fn run_profiled(&self, inputs: HashMap<String, Tensor>) -> Result<(Vec<Tensor>, Vec<crate::NodeTiming>), RunError> {
        let mut p = Vec::new();
        let outs = run_with(&self.graph, inputs, None, self, Some(&mut p))?;
        Ok((outs, p))
    }
}

impl Runner for CpuProgram {
    fn run(&self, index: usize, n: &Node, ins: &[Option<Tensor>], scope: &Scope) -> Result<Vec<Tensor>, RunError> {
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("aim:{}", n.op), msg };
        match self.prepared.get(&index) {
            None => {
                if n.domain.is_empty() {
                    if let Some(k) = aim_kernels::fast::kernel(&n.op) {
                        let cx = aim_kernels::fast::Ctx { par: &self.pool, isa: self.isa, blocking: self.blocking };
                        let node_err = |msg: String| RunError::Node { node: n.name.clone(), op: n.op.clone(), msg };
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| k(n, ins, &cx))) {
                            Ok(Some(r)) => return r.map_err(|e| node_err(e.0)),
                            Ok(None) => {}
                            Err(e) => return Err(node_err(format!("internal error: {}", crate::exec::panic_message(&*e)))),
                        }
                    }
                }
                run_node(n, ins, scope)
            }
            Some(p) => {
                // A bug in a fast path must surface as an error naming the node, not a crash.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_prepared(p, n, ins))) {
                    Ok(r) => r,
                    Err(e) => Err(fail(format!("internal error: {}", crate::exec::panic_message(&*e)))),
                }
            }
        }
    }
}

impl CpuProgram {
    fn run_prepared(&self, p: &Prepared, n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>, RunError> {
        let fail = |msg: String| RunError::Node { node: n.name.clone(), op: format!("aim:{}", n.op), msg };
        match p {
            Prepared::Elementwise(f) => Ok(vec![run_elementwise(*f, ins, &self.pool).map_err(fail)?]),
            p => {
                let x = ins.first().and_then(|t| t.as_ref()).ok_or_else(|| fail("input 0 is missing".into()))?;
                if x.dtype() != DType::F32 {
                    return Err(fail(format!("expected f32 input, got {}", x.dtype())));
                }
                let residual = ins.get(3).and_then(|t| t.as_ref());
                let y = match p {
                    Prepared::Conv(c) => run_conv(c, x, residual, &self.pool),
                    Prepared::Depthwise(d) => run_depthwise(d, x, residual, &self.pool),
                    Prepared::Dense(d) => run_dense(d, x, residual, self.isa, self.blocking, &self.pool),
                    Prepared::Elementwise(_) => unreachable!("handled above"),
                };
                Ok(vec![y.map_err(fail)?])
            }
        }
    }
}

fn geometry(n: &Node, kernel: &[usize]) -> Geometry {
    let sp = kernel.len();
    let list = |name: &str| n.ints(name).map(|v| v.iter().map(|&x| x.max(1) as usize).collect()).unwrap_or(vec![1; sp]);
    Geometry {
        kernel: kernel.to_vec(),
        strides: list("strides"),
        dilations: list("dilations"),
        pads: n.ints("pads").map(|v| v.to_vec()).unwrap_or(vec![0; 2 * sp]),
        auto_pad: n.string("auto_pad", "NOTSET").to_string(),
    }
}

/// Output size and padding-before per spatial dim, as ONNX defines them.
fn resolve(geo: &Geometry, in_sp: &[usize]) -> Result<(Vec<usize>, Vec<usize>), String> {
    let mut out = Vec::new();
    let mut before = Vec::new();
    let sp = in_sp.len();
    if geo.kernel.len() != sp || geo.strides.len() != sp || geo.dilations.len() != sp || geo.pads.len() != 2 * sp {
        return Err(format!("attributes do not match {sp} spatial dims"));
    }
    for i in 0..sp {
        let ek = (geo.kernel[i] - 1) * geo.dilations[i] + 1;
        let s = geo.strides[i];
        match geo.auto_pad.as_str() {
            "SAME_UPPER" | "SAME_LOWER" => {
                let o = in_sp[i].div_ceil(s);
                let total = ((o - 1) * s + ek).saturating_sub(in_sp[i]);
                before.push(if geo.auto_pad == "SAME_UPPER" { total / 2 } else { total - total / 2 });
                out.push(o);
            }
            _ => {
                let (pb, pe) = if geo.auto_pad == "VALID" { (0, 0) } else { (geo.pads[i].max(0) as usize, geo.pads[sp + i].max(0) as usize) };
                let total = in_sp[i] + pb + pe;
                if total < ek {
                    return Err(format!("kernel extent {ek} exceeds the padded input {total}"));
                }
                before.push(pb);
                out.push((total - ek) / s + 1);
            }
        }
    }
    Ok((out, before))
}

fn prepare_conv(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<Prepared, RunError> {
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
        Some(b) => Some(const_f32(g, Some(b)).filter(|t| t.len() == m).ok_or_else(|| prep_err(n, "bias must be constant f32 with one value per output channel"))?.data::<f32>().to_vec()),
        None => None,
    };
    let geo = geometry(n, &kernel);
    let act = activation(n);
    if group == m && cg == 1 && kernel.len() == 2 {
        return Ok(Prepared::Depthwise(Box::new(DepthwisePrep { weights: w.data::<f32>().to_vec(), bias, act, channels: m, geo })));
    }
    let mg = m / group;
    let k: usize = cg * kernel.iter().product::<usize>();
    let wd = w.data::<f32>();
    let weights = (0..group).map(|gi| PackedA::from_slice(isa, blocking, &wd[gi * mg * k..(gi + 1) * mg * k], mg, k, false)).collect();
    Ok(Prepared::Conv(Box::new(ConvPrep { weights, bias, act, group, m, cin: cg * group, geo })))
}

fn prepare_dense(g: &Graph, n: &Node, isa: Isa, blocking: Blocking) -> Result<Prepared, RunError> {
    let w = const_f32(g, n.input(1)).filter(|t| t.rank() == 2).ok_or_else(|| prep_err(n, "weight must be a constant 2-D f32"))?;
    let (k, nn) = (w.shape()[0], w.shape()[1]);
    let bias = match n.input(2) {
        Some(b) => Some(const_f32(g, Some(b)).filter(|t| t.len() == nn).ok_or_else(|| prep_err(n, "bias must be constant f32 with one value per output"))?.data::<f32>().to_vec()),
        None => None,
    };
    let weight = PackedB::from_slice(isa, blocking, w.data::<f32>(), k, nn, false);
    Ok(Prepared::Dense(Box::new(DensePrep { weight, bias, act: activation(n), k, n: nn })))
}

fn check_residual<'a>(r: Option<&'a Tensor>, shape: &[usize]) -> Result<Option<&'a [f32]>, String> {
    match r {
        None => Ok(None),
        Some(t) if t.dtype() == DType::F32 && t.shape() == shape => Ok(Some(t.data::<f32>())),
        Some(t) => Err(format!("residual {}{:?} does not match the output {shape:?}", t.dtype(), t.shape())),
    }
}

fn run_conv(c: &ConvPrep, x: &Tensor, residual: Option<&Tensor>, pool: &ThreadPool) -> Result<Tensor, String> {
    let xs = x.shape();
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
    let mut y = Tensor::zeros(DType::F32, &shape);
    let (cg, mg) = (c.cin / c.group, c.m / c.group);
    let ksize: usize = c.geo.kernel.iter().product();
    let xd = x.data::<f32>();
    let pointwise = ksize == 1 && c.geo.strides.iter().all(|&s| s == 1) && before.iter().all(|&p| p == 0) && out_sp == in_sp;
    let yd = y.data_mut::<f32>();
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
            let fill: Box<dyn Fn(usize, usize, &mut [f32]) + Sync> = if pointwise {
                Box::new(move |p: usize, j0: usize, dst: &mut [f32]| dst.copy_from_slice(&xg[p * isize + j0..p * isize + j0 + dst.len()]))
            } else {
                im2col(xg, in_sp, &out_sp, &before, &c.geo)
            };
            let ep = Epilogue {
                row_bias: c.bias.as_ref().map(|v| &v[gi * mg..(gi + 1) * mg]),
                col_bias: None,
                residual: res.map(|r| &r[off..off + mg * osize]),
                act: c.act,
            };
            gemm_lazy_b(&c.weights[gi], osize, &*fill, &mut yd[off..off + mg * osize], osize, &ep, pool);
        }
    }
    Ok(y)
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
    let mut padded = vec![0f32; phases * cg * plane];
    let (pt, pl) = (before[0] as isize, before[1] as isize);
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
                let drow = &mut dplane[y * wp..(y + 1) * wp];
                // Phase column x reads input column x·sw + bph − pl.
                let first = if bph as isize - pl >= 0 { 0 } else { ((pl - bph as isize) as usize).div_ceil(sw) };
                let last = if w as isize + pl - (bph as isize) <= 0 { 0 } else { ((w as isize + pl - bph as isize) as usize).div_ceil(sw).min(wp) };
                if last <= first {
                    continue;
                }
                if sw == 1 {
                    let s0 = (first as isize + bph as isize - pl) as usize;
                    drow[first..last].copy_from_slice(&srow[s0..s0 + (last - first)]);
                } else {
                    for (x, d) in drow.iter_mut().enumerate().take(last).skip(first) {
                        *d = srow[(x as isize * sw as isize + bph as isize - pl) as usize];
                    }
                }
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
        out.copy_from_slice(&padded[start..start + out.len()]);
    };
    let mg = c.m / c.group;
    let mut wide = vec![0f32; mg * n_wide];
    let bias = c.bias.as_ref().map(|v| &v[gi * mg..(gi + 1) * mg]);
    // Without a residual the activation can run in the GEMM's epilogue; with one it must
    // wait until the residual is added, in the compaction.
    let ep = Epilogue { row_bias: bias, col_bias: None, residual: None, act: if res.is_none() { c.act } else { None } };
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
                None => row.copy_from_slice(src),
            }
        }
    });
}

/// The im2col matrix of one group — row (ci, kernel offset), column output position — as a
/// function filling a strip of consecutive columns of one row, for [`gemm_lazy_b`].
fn im2col<'a>(xg: &'a [f32], in_sp: &'a [usize], out_sp: &'a [usize], before: &'a [usize], geo: &'a Geometry) -> Box<dyn Fn(usize, usize, &mut [f32]) + Sync + 'a> {
    let ksize: usize = geo.kernel.iter().product();
    let isize: usize = in_sp.iter().product();
    let sp = in_sp.len();
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

/// Shares the output buffer between channel tasks, which write disjoint planes.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only its own channel's plane.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

fn run_depthwise(d: &DepthwisePrep, x: &Tensor, residual: Option<&Tensor>, pool: &ThreadPool) -> Result<Tensor, String> {
    let xs = x.shape();
    if xs.len() != 4 || xs[1] != d.channels {
        return Err(format!("input {xs:?} does not fit a depthwise conv over {} channels", d.channels));
    }
    let (nb, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (out, before) = resolve(&d.geo, &xs[2..])?;
    let (oh, ow) = (out[0], out[1]);
    let (kh, kw) = (d.geo.kernel[0], d.geo.kernel[1]);
    let (sh, sw) = (d.geo.strides[0], d.geo.strides[1]);
    let (dh, dw) = (d.geo.dilations[0], d.geo.dilations[1]);
    let shape = [nb, c, oh, ow];
    let res = check_residual(residual, &shape)?;
    let mut y = Tensor::zeros(DType::F32, &shape);
    let xd = x.data::<f32>();
    let yp = OutPtr(y.data_mut::<f32>().as_mut_ptr());
    let geo = PlaneGeo { h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt: before[0], pl: before[1] };
    let isa = pool_isa(d);
    let planes = nb * c;
    let tasks = planes.min(pool.size() * 8).max(1);
    pool.for_each(tasks, &|t| {
        let yp = yp;
        // Scratch rows, allocated once per task: a gather buffer and a row of zeros.
        // Scratch: a gather row, or for 3×3 kernels the padded stride phases of the plane
        // and the filtered rows.
        let mut scratch = vec![0f32; ow.max(dw3_scratch(&geo))];
        for plane in t * planes / tasks..(t + 1) * planes / tasks {
            let ch = plane % c;
            let src = &xd[plane * h * w..(plane + 1) * h * w];
            // SAFETY: plane `plane` of y is written by this task alone.
            let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(plane * oh * ow), oh * ow) };
            let wts = &d.weights[ch * kh * kw..(ch + 1) * kh * kw];
            let bias = d.bias.as_ref().map_or(0.0, |b| b[ch]);
            let act = d.act.unwrap_or(Activation::Identity);
            let res = res.map(|r| &r[plane * oh * ow..(plane + 1) * oh * ow]);
            depthwise_plane(isa, src, dst, wts, &geo, bias, act, res, &mut scratch);
        }
    });
    Ok(y)
}

/// The sizes of one depthwise plane.
#[derive(Clone, Copy)]
struct PlaneGeo {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
}

fn pool_isa(_d: &DepthwisePrep) -> Isa {
    if Isa::Avx512.available() {
        Isa::Avx512
    } else if Isa::Avx2.available() {
        Isa::Avx2
    } else {
        Isa::Portable
    }
}

/// One channel of a depthwise convolution, compiled for the ISA at hand.
#[allow(clippy::too_many_arguments)]
#[allow(clippy::too_many_arguments)]
fn depthwise_plane(isa: Isa, src: &[f32], dst: &mut [f32], wts: &[f32], g: &PlaneGeo, bias: f32, act: Activation, res: Option<&[f32]>, scratch: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v4(src: &[f32], dst: &mut [f32], wts: &[f32], g: &PlaneGeo, bias: f32, act: Activation, res: Option<&[f32]>, scratch: &mut [f32]) {
            depthwise_body(src, dst, wts, g, bias, act, res, scratch)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(src: &[f32], dst: &mut [f32], wts: &[f32], g: &PlaneGeo, bias: f32, act: Activation, res: Option<&[f32]>, scratch: &mut [f32]) {
            depthwise_body(src, dst, wts, g, bias, act, res, scratch)
        }
        // SAFETY: the ISA was checked available.
        match isa {
            Isa::Avx512 => return unsafe { v4(src, dst, wts, g, bias, act, res, scratch) },
            Isa::Avx2 => return unsafe { v3(src, dst, wts, g, bias, act, res, scratch) },
            Isa::Portable => {}
        }
    }
    let _ = isa;
    depthwise_body(src, dst, wts, g, bias, act, res, scratch)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn depthwise_body(src: &[f32], dst: &mut [f32], wts: &[f32], g: &PlaneGeo, bias: f32, act: Activation, res: Option<&[f32]>, scratch: &mut [f32]) {
    let PlaneGeo { h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl } = *g;
    if kh == 3 && kw == 3 && dh == 1 && dw == 1 {
        return depthwise_3x3(src, dst, wts, g, bias, act, res, scratch);
    }
    let tmp = &mut scratch[..ow];
    for oy in 0..oh {
        let row = &mut dst[oy * ow..(oy + 1) * ow];
        row.fill(bias);
        for ky in 0..kh {
            let iy = (oy * sh + ky * dh) as isize - pt as isize;
            if iy < 0 || iy >= h as isize {
                continue;
            }
            let srow = &src[iy as usize * w..(iy as usize + 1) * w];
            for kx in 0..kw {
                let wv = wts[ky * kw + kx];
                let shift = (kx * dw) as isize - pl as isize;
                // Output columns whose input column ox*sw + shift lies inside the row.
                let lo = if shift >= 0 { 0 } else { ((-shift) as usize).div_ceil(sw) };
                let hi = if (w as isize - shift) <= 0 { 0 } else { ((w as isize - shift) as usize).div_ceil(sw).min(ow) };
                if hi <= lo {
                    continue;
                }
                if sw == 1 {
                    let base = (lo as isize + shift) as usize;
                    for (o, &v) in row[lo..hi].iter_mut().zip(&srow[base..base + (hi - lo)]) {
                        *o += wv * v;
                    }
                } else {
                    for (ox, t) in tmp[lo..hi].iter_mut().enumerate() {
                        *t = srow[((ox + lo) as isize * sw as isize + shift) as usize];
                    }
                    for (o, &v) in row[lo..hi].iter_mut().zip(&tmp[lo..hi]) {
                        *o += wv * v;
                    }
                }
            }
        }
        match res {
            Some(r) => {
                for (v, &x) in row.iter_mut().zip(&r[oy * ow..(oy + 1) * ow]) {
                    *v = act.apply(*v + x);
                }
            }
            None => row.iter_mut().for_each(|v| *v = act.apply(*v)),
        }
    }
}

/// Input pointers of a generated loop, shared by the tasks that call it.
#[derive(Clone, Copy)]
struct Ptrs<'a>(&'a [*const f32]);
// SAFETY: the tensors behind the pointers are only read, and outlive the call.
unsafe impl Send for Ptrs<'_> {}
unsafe impl Sync for Ptrs<'_> {}

/// Runs a generated elementwise loop over its inputs, in chunks on the pool. The inputs must
/// all be f32 of one shape: the loop reads and writes exactly `len` elements of each.
fn run_elementwise(f: ElementwiseFn, ins: &[Option<Tensor>], pool: &ThreadPool) -> Result<Tensor, String> {
    let ts: Vec<&Tensor> = ins.iter().map(|t| t.as_ref().ok_or("an input is missing")).collect::<Result<_, _>>()?;
    let first = ts.first().ok_or("no inputs")?;
    for t in &ts {
        if t.dtype() != DType::F32 || t.shape() != first.shape() {
            return Err(format!("inputs must all be f32{:?}, got {}{:?}", first.shape(), t.dtype(), t.shape()));
        }
    }
    let n = first.len();
    let mut y = Tensor::zeros(DType::F32, first.shape());
    let ptrs: Vec<*const f32> = ts.iter().map(|t| t.data::<f32>().as_ptr()).collect();
    let (ptrs, out) = (Ptrs(&ptrs), OutPtr(y.data_mut::<f32>().as_mut_ptr()));
    const CHUNK: usize = 16 * 1024;
    pool.for_each(n.div_ceil(CHUNK), &|c| {
        let (ptrs, out) = (ptrs, out);
        let (start, end) = (c * CHUNK, ((c + 1) * CHUNK).min(n));
        // SAFETY: every input and the output hold n elements and start <= end <= n; the
        // loop touches [start, end) of each; chunks write disjoint ranges of the output.
        unsafe { f(ptrs.0.as_ptr(), out.0, start, end) };
    });
    Ok(y)
}

/// Scratch floats [`depthwise_3x3`] needs for a plane of this geometry.
fn dw3_scratch(g: &PlaneGeo) -> usize {
    let (wp, hp) = (g.ow + 2 / g.sw, g.oh + 2 / g.sh + 1);
    g.sh * g.sw * (hp * wp + 16) + g.oh * wp
}

/// A 3×3 depthwise plane (any stride) as one long 9-tap filter: the zero-padded plane is
/// split into its stride phases (phase (a, b) holds padded rows a, a+sh, ... and columns b,
/// b+sw, ...), each with rows `wp = ow + 2/sw` wide, so that every tap reads one contiguous
/// run of one phase for all output positions at once. The filter runs over all rows in one
/// loop (the extra columns per row are computed and dropped): no per-row edge cases, no
/// short vector tails, no gathers for stride 2.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn depthwise_3x3(src: &[f32], dst: &mut [f32], wts: &[f32], g: &PlaneGeo, bias: f32, act: Activation, res: Option<&[f32]>, scratch: &mut [f32]) {
    let PlaneGeo { h, w, oh, ow, sh, sw, pt, pl, .. } = *g;
    let (wp, hp) = (ow + 2 / sw, oh + 2 / sh + 1);
    let stride = hp * wp + 16;
    let (phases, rest) = scratch.split_at_mut(sh * sw * stride);
    let q = &mut rest[..oh * wp];
    phases.fill(0.0);
    for a in 0..sh {
        for b in 0..sw {
            let ph = &mut phases[(a * sw + b) * stride..(a * sw + b + 1) * stride];
            for y in 0..hp {
                let iy = (y * sh + a) as isize - pt as isize;
                if iy < 0 || iy >= h as isize {
                    continue;
                }
                let srow = &src[iy as usize * w..(iy as usize + 1) * w];
                // Phase column x reads input column x·sw + b − pl.
                let first = if b >= pl { 0 } else { (pl - b).div_ceil(sw) };
                let last = if w + pl <= b { 0 } else { (w + pl - b).div_ceil(sw).min(wp) };
                let drow = &mut ph[y * wp..(y + 1) * wp];
                if sw == 1 && last > first {
                    drow[first..last].copy_from_slice(&srow[first + b - pl..last + b - pl]);
                } else {
                    for (x, d) in drow.iter_mut().enumerate().take(last).skip(first) {
                        *d = srow[x * sw + b - pl];
                    }
                }
            }
        }
    }
    let n = oh * wp;
    let tap = |t: usize| -> &[f32] {
        let (ky, kx) = (t / 3, t % 3);
        let base = ((ky % sh) * sw + kx % sw) * stride + (ky / sh) * wp + kx / sw;
        &phases[base..base + n]
    };
    let (s0, s1, s2, s3, s4, s5, s6, s7, s8) = (tap(0), tap(1), tap(2), tap(3), tap(4), tap(5), tap(6), tap(7), tap(8));
    let k: [f32; 9] = std::array::from_fn(|i| wts[i]);
    for i in 0..n {
        q[i] = k[0] * s0[i] + k[1] * s1[i] + k[2] * s2[i] + k[3] * s3[i] + k[4] * s4[i] + k[5] * s5[i] + k[6] * s6[i] + k[7] * s7[i] + k[8] * s8[i];
    }
    for oy in 0..oh {
        let (row, qrow) = (&mut dst[oy * ow..(oy + 1) * ow], &q[oy * wp..oy * wp + ow]);
        match res {
            Some(r) => {
                for ((o, &v), &x) in row.iter_mut().zip(qrow).zip(&r[oy * ow..(oy + 1) * ow]) {
                    *o = act.apply(v + bias + x);
                }
            }
            None => {
                for (o, &v) in row.iter_mut().zip(qrow) {
                    *o = act.apply(v + bias);
                }
            }
        }
    }
}

fn run_dense(d: &DensePrep, x: &Tensor, residual: Option<&Tensor>, isa: Isa, blocking: Blocking, pool: &ThreadPool) -> Result<Tensor, String> {
    let xs = x.shape();
    if xs.is_empty() || xs[xs.len() - 1] != d.k {
        return Err(format!("input {xs:?} does not end in {} features", d.k));
    }
    let m: usize = xs[..xs.len() - 1].iter().product();
    let mut shape = xs.to_vec();
    *shape.last_mut().unwrap() = d.n;
    if xs.len() == 1 {
        shape = vec![d.n];
    }
    let res = check_residual(residual, &shape)?;
    let a = PackedA::from_rows(isa, blocking, x.data::<f32>(), m, d.k, pool);
    let mut y = Tensor::zeros(DType::F32, &shape);
    let ep = Epilogue { row_bias: None, col_bias: d.bias.as_deref(), residual: res, act: d.act };
    gemm(&a, &d.weight, y.data_mut::<f32>(), d.n, &ep, pool);
    Ok(y)
}
