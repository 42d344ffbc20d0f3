//! Lowering an optimised graph (the cuda pipeline's output, every shape known) to a
//! [`CudaProgram`]: one kernel launch per node that computes something, views (Reshape,
//! Flatten, ...) as aliases of their input's bytes, constants uploaded once, and every
//! intermediate placed in one device arena by lifetime. A node without a GPU kernel is an
//! error naming it and its op.

use super::gemm::{ALayout, BLayout, ConvGeom, Gemm, YLayout};
use super::{
    conv, elementwise, gather, gemm, grid_for, layernorm, reduce, resize, softmax, strided, GpuTarget, Half, Kernel,
};
use aim_compiler::codegen::ReduceMode;
use aim_compiler::ewprog::{self, Binary, Inst, Operand, Unary};
use aim_ir::{DType, Graph, Node};
use aim_kernels::gemm::Activation;
pub use aim_runtime::cuda::{Arg, CudaProgram, Launch, Storage, Value};
use std::collections::HashMap;

mod data;
mod dense;
mod norm;
mod pointwise;
mod windows;

/// One op's lowering: checks the node and emits its kernels and launches.
type LowerOp<'g> = fn(&mut Lowering<'g>, &Node) -> Result<(), String>;

/// How each op lowers, by name (`aim` ops as `aim:Op`): the method, in its family's file
/// (`lower/data.rs`, `pointwise.rs`, `norm.rs`, `dense.rs`, `windows.rs`); the helpers they
/// share (values, launches, the GEMM) stay in this file. An op not listed has no GPU kernel: lowering it is an error naming
/// the node.
fn lowerings<'g>() -> Vec<(&'static [&'static str], LowerOp<'g>)> {
    vec![
        (&["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"], Lowering::views),
        (&["aim:Elementwise"], Lowering::program),
        (&["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"], Lowering::variadic),
        (&["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"], Lowering::compare),
        (&["Expand"], Lowering::expand),
        (&["Slice"], Lowering::slice),
        (&["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"], Lowering::reduce),
        (&["Clip"], Lowering::clip),
        (&["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Sqrt", "Neg", "Abs", "Reciprocal"], Lowering::unary),
        (&["LeakyRelu", "HardSigmoid", "HardSwish", "Gelu", "Elu"], Lowering::activation),
        (&["aim:Transpose", "Transpose"], Lowering::transpose),
        (&["aim:Reduce", "GlobalAveragePool", "GlobalMaxPool"], Lowering::reduce_to),
        (&["Softmax", "LogSoftmax"], Lowering::softmax),
        (&["aim:Softmax"], Lowering::softmax_aim),
        (&["LayerNormalization"], Lowering::layer_norm),
        (&["aim:Dense"], Lowering::dense),
        (&["MatMul"], Lowering::matmul),
        (&["aim:Conv"], Lowering::conv),
        (&["Where"], Lowering::select),
        (&["aim:ConvTranspose", "ConvTranspose"], Lowering::conv_transpose),
        (&["Resize"], Lowering::resize),
        (&["Concat"], Lowering::concat),
        (&["Split"], Lowering::split),
        (&["MaxPool", "AveragePool"], Lowering::pool),
        (&["Gather"], Lowering::gather),
        (&["Cast", "CastLike"], Lowering::cast),
    ]
}

/// The lowering of `op`, if the GPU has one.
fn lowering<'g>(op: &str) -> Option<LowerOp<'g>> {
    lowerings().into_iter().find(|(ops, _)| ops.contains(&op)).map(|(_, f)| f)
}

/// Why a graph could not be lowered.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cuda backend: node '{node}' ({op}): {msg}")]
pub struct LowerError {
    /// The graph node (or the graph, for its inputs and outputs).
    pub node: String,
    /// Its op (`domain:op` outside the default domain).
    pub op: String,
    /// Why.
    pub msg: String,
}

struct Lowering<'g> {
    g: &'g Graph,
    target: GpuTarget,
    values: Vec<Value>,
    index: HashMap<String, usize>,
    kernels: Vec<Kernel>,
    launches: Vec<Launch>,
    /// Each distinct kernel (code with its name left out, geometry) and its index.
    distinct: HashMap<(String, [u32; 3], [u32; 3], usize), usize>,
}

/// The activation fused into an `aim:Dense` / `aim:Conv` (as the cpu runtime reads it).
fn activation(n: &Node) -> Result<Activation, String> {
    let name = n.string("activation", "");
    if name.is_empty() || name == "none" {
        return Ok(Activation::Identity);
    }
    let get = |k: &str| n.attrs.contains_key(k).then(|| n.float(k, 0.0));
    let (a, b) = if name == "clip" { (get("clip_min"), get("clip_max")) } else { (get("act_alpha"), get("act_beta")) };
    if n.attrs.contains_key("res_activation") {
        return Err("an activation before the residual is not supported on the GPU yet".into());
    }
    Activation::parse(name, a, b).ok_or_else(|| format!("unknown activation '{name}'"))
}

/// The node's `axis` attribute (`default` when absent; negative counts from the end) as
/// an index into a shape of `rank` dims.
fn axis_of(n: &Node, default: i64, rank: usize) -> Result<usize, String> {
    let (axis, r) = (n.int("axis", default), rank as i64);
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..r).contains(&a) {
        return Err(format!("axis {axis} of rank {r}"));
    }
    Ok(a as usize)
}

fn u32_of(v: usize, what: &str) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{what} {v} does not fit 32 bits"))
}

impl Lowering<'_> {
    fn fail(&self, n: &Node, msg: impl Into<String>) -> LowerError {
        let op = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
        LowerError { node: n.name.clone(), op, msg: msg.into() }
    }

    /// The value `name` (constants are added on first use).
    fn value(&mut self, name: &str) -> Result<usize, String> {
        if let Some(&v) = self.index.get(name) {
            return Ok(v);
        }
        let t = self.g.initializers.get(name).ok_or_else(|| format!("value '{name}' is not computed before use"))?;
        let v = self.values.len();
        self.values.push(Value {
            name: name.to_string(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            storage: Storage::Constant(t.clone()),
        });
        self.index.insert(name.to_string(), v);
        Ok(v)
    }

    fn input(&mut self, n: &Node, k: usize) -> Result<usize, String> {
        let name = n.input(k).filter(|s| !s.is_empty()).ok_or_else(|| format!("input {k} is missing"))?;
        self.value(name)
    }

    fn opt_input(&mut self, n: &Node, k: usize) -> Result<Option<usize>, String> {
        match n.input(k).filter(|s| !s.is_empty()) {
            Some(name) => self.value(name).map(Some),
            None => Ok(None),
        }
    }

    fn shape(&self, v: usize) -> Vec<usize> {
        self.values[v].shape.clone()
    }

    /// Declares output `k` of `n` (its type from inference) as an arena value.
    fn output(&mut self, n: &Node, k: usize) -> Result<usize, String> {
        let name = n.outputs.get(k).filter(|s| !s.is_empty()).ok_or_else(|| format!("output {k} is missing"))?;
        let t = self.g.value_type(name).ok_or_else(|| format!("output '{name}' has no type"))?;
        let shape = t
            .concrete_shape()
            .ok_or_else(|| format!("output '{name}' has shape {t}: the GPU needs every dim known"))?;
        let dtype = t.dtype.ok_or_else(|| format!("output '{name}' has no element type"))?;
        let v = self.values.len();
        self.values.push(Value { name: name.clone(), dtype, shape, storage: Storage::Arena(0) });
        self.index.insert(name.clone(), v);
        Ok(v)
    }

    fn f32_value(&self, v: usize) -> Result<(), String> {
        match self.values[v].dtype {
            DType::F32 => Ok(()),
            d => Err(format!("'{}' is {d}; this kernel reads f32", self.values[v].name)),
        }
    }

    fn launch(&mut self, n: &Node, k: super::ptx::Kernel, grid: [u32; 3], block: u32, args: Vec<Arg>) {
        let name = format!("k{}_{}", self.kernels.len(), sanitize(&n.name));
        let text = k.finish().replacen(&format!(".entry {}(", k.name()), &format!(".entry {name}("), 1);
        self.push(
            n,
            Kernel { name, ptx: text, grid, block: [block, 1, 1], shared_bytes: k.shared_bytes(), sources: vec![] },
            args,
        );
    }

    /// Adds a launch of `kernel`; a kernel already in the program with the same code and
    /// geometry (a repeated layer) is launched again instead of being added twice.
    fn push(&mut self, n: &Node, mut kernel: Kernel, args: Vec<Arg>) {
        let sources = aim_compiler::passes::sources_of(n);
        let body = kernel.ptx.replacen(&format!(".entry {}(", kernel.name), ".entry (", 1);
        let key = (body, kernel.grid, kernel.block, kernel.shared_bytes);
        let index = match self.distinct.get(&key) {
            Some(&i) => {
                let known = &mut self.kernels[i].sources;
                known.extend(sources.into_iter().filter(|s| !known.contains(s)).collect::<Vec<_>>());
                i
            }
            None => {
                kernel.sources = sources;
                self.distinct.insert(key, self.kernels.len());
                self.kernels.push(kernel);
                self.kernels.len() - 1
            }
        };
        self.launches.push(Launch { kernel: index, args, node: n.name.clone() });
    }

    fn kernel_name(&self, n: &Node) -> String {
        format!("k{}_{}", self.kernels.len(), sanitize(&n.name))
    }

    /// A strided elementwise launch: output `y` of `out` shape from `xs` at `strides`.
    fn strided(&mut self, n: &Node, y: usize, xs: &[usize], strides: Vec<Vec<u64>>, prog: &[Inst]) {
        let out = self.shape(y);
        let count: usize = out.iter().product();
        let k = strided::kernel("strided", &out, &strides, prog);
        let mut args = vec![Arg::Value(y)];
        args.extend(xs.iter().map(|&x| Arg::Value(x)));
        args.push(Arg::U64(count as u64));
        let grid = grid_for(count, strided::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], strided::BLOCK, args);
    }

    /// The integers of constant input `k` (or of attribute `attr` in older opsets).
    fn const_ints(&self, n: &Node, k: usize, attr: &str) -> Result<Option<Vec<i64>>, String> {
        match n.input(k).filter(|s| !s.is_empty()) {
            Some(name) => {
                let t = self
                    .g
                    .initializers
                    .get(name)
                    .ok_or_else(|| format!("input {k} ('{name}') must be a constant on the GPU"))?;
                Ok(Some(t.to_f64_vec().iter().map(|&v| v as i64).collect()))
            }
            None => Ok(n.ints(attr).map(|v| v.to_vec())),
        }
    }

    /// Lowers `n` through its op's entry in [`lowerings`].
    fn node(&mut self, n: &Node) -> Result<(), String> {
        let op = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
        let lower = lowering(&op).ok_or("no GPU kernel for this op yet")?;
        lower(self, n)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        n: &Node,
        g: &Gemm,
        a: usize,
        w: usize,
        y: usize,
        bias: Option<usize>,
        res: Option<usize>,
    ) -> Result<(), String> {
        // Constant weights go to the device in half precision when the target says so.
        let packed = match (self.target.half, g.b) {
            (Some(h), BLayout::Rows { batch_stride: 0 } | BLayout::Cols { batch_stride: 0 }) => {
                let cols = matches!(g.b, BLayout::Cols { .. });
                self.half_weights(w, g.k as usize, g.n as usize, cols, h).map(|v| (v, h))
            }
            _ => None,
        };
        let (g, w) = match packed {
            Some((v, h)) => (Gemm { b: BLayout::Half(h), ..*g }, v),
            None => (*g, w),
        };
        let g = &g;
        let name = self.kernel_name(n);
        let k = gemm::gemm_kernel(&name, g, &self.target, vec![]).map_err(|e| e.0)?;
        let mut args = vec![Arg::Value(a), Arg::Value(w), Arg::Value(y)];
        args.extend(bias.map(Arg::Value));
        args.extend(res.map(Arg::Value));
        self.push(n, k, args);
        Ok(())
    }

    /// The value `w`, when it is a constant of f32 weights (`[K, N]`, or with `cols`
    /// `[N, K]`), packed for half-precision GEMMs (`gemm::pack_half`), once per weight and
    /// type; `None` for any other value.
    fn half_weights(&mut self, w: usize, k: usize, n: usize, cols: bool, h: Half) -> Option<usize> {
        let name = format!("{}:{}", self.values[w].name, h.ptx());
        if let Some(&v) = self.index.get(&name) {
            return Some(v);
        }
        let t = match &self.values[w].storage {
            Storage::Constant(t) if t.dtype() == DType::F32 && t.len() == k * n => t,
            _ => return None,
        };
        let packed = gemm::pack_half(t.data::<f32>(), k, n, cols, h);
        let v = self.values.len();
        self.values.push(Value {
            name: name.clone(),
            dtype: packed.dtype(),
            shape: packed.shape().to_vec(),
            storage: Storage::Constant(packed),
        });
        self.index.insert(name, v);
        Some(v)
    }

    /// A constant table the program uploads (named after its node).
    fn table(&mut self, n: &Node, what: &str, t: aim_ir::Tensor) -> usize {
        let v = self.values.len();
        self.values.push(Value {
            name: format!("{}:{what}", n.name),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            storage: Storage::Constant(t),
        });
        v
    }

    /// A 2-D window's geometry from the node's attributes and the NCHW shapes.
    fn geom(&self, n: &Node, x: &[usize], y: &[usize], ks: &[i64]) -> Result<ConvGeom, String> {
        if x.len() != 4 || y.len() != 4 || ks.len() != 2 {
            return Err("only 2-D windows over NCHW are supported on the GPU yet".into());
        }
        if !matches!(n.string("auto_pad", "NOTSET"), "NOTSET" | "VALID") {
            return Err("auto_pad SAME_* is not supported on the GPU yet".into());
        }
        let two = |name: &str, default: i64| -> Result<[u32; 2], String> {
            match n.ints(name) {
                Some(v) if v.len() >= 2 => Ok([
                    u32::try_from(v[0]).map_err(|_| name.to_string())?,
                    u32::try_from(v[1]).map_err(|_| name.to_string())?,
                ]),
                Some(_) => Err(format!("{name} needs two values")),
                None => Ok([default as u32; 2]),
            }
        };
        Ok(ConvGeom {
            c: u32_of(x[1], "channels")?,
            h: u32_of(x[2], "height")?,
            w: u32_of(x[3], "width")?,
            kh: u32_of(ks[0] as usize, "kernel height")?,
            kw: u32_of(ks[1] as usize, "kernel width")?,
            oh: u32_of(y[2], "output height")?,
            ow: u32_of(y[3], "output width")?,
            stride: two("strides", 1)?,
            dilation: two("dilations", 1)?,
            pad: two("pads", 0)?,
        })
    }

    /// Launches a direct or transposed convolution kernel (`x, w, y[, bias][, r]`), a
    /// thread per output element.
    fn launch_direct(
        &mut self,
        n: &Node,
        k: super::ptx::Kernel,
        [x, w, y]: [usize; 3],
        bias: Option<usize>,
        res: Option<usize>,
    ) {
        let mut args = vec![Arg::Value(x), Arg::Value(w), Arg::Value(y)];
        args.extend(bias.map(Arg::Value));
        args.extend(res.map(Arg::Value));
        let count: usize = self.shape(y).iter().product();
        let grid = grid_for(count, conv::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], conv::BLOCK, args);
    }
}

/// A node name as a PTX identifier part.
fn sanitize(s: &str) -> String {
    let t: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    t.chars().take(48).collect()
}

/// Lowers `g` (the cuda pipeline's output, shapes static) for `target`.
pub fn lower(g: &Graph, target: &GpuTarget) -> Result<CudaProgram, LowerError> {
    let mut l = Lowering {
        g,
        target: *target,
        values: Vec::new(),
        index: HashMap::new(),
        kernels: Vec::new(),
        launches: Vec::new(),
        distinct: HashMap::new(),
    };
    let mut inputs = Vec::new();
    for i in &g.inputs {
        let fail = |msg: String| LowerError { node: g.name.clone(), op: "input".into(), msg };
        let shape = i.ty.concrete_shape().ok_or_else(|| {
            fail(format!(
                "'{}' has shape {}: the GPU program needs every dim known (bind them with --shape NAME=DIMS)",
                i.name, i.ty
            ))
        })?;
        let dtype = i.ty.dtype.ok_or_else(|| fail(format!("'{}' has no element type", i.name)))?;
        inputs.push(l.values.len());
        l.index.insert(i.name.clone(), l.values.len());
        l.values.push(Value { name: i.name.clone(), dtype, shape, storage: Storage::Input });
    }
    let mut defined_at: Vec<usize> = Vec::new();
    for n in &g.nodes {
        let before = l.values.len();
        l.node(n).map_err(|m| l.fail(n, m))?;
        defined_at.resize(l.values.len(), usize::MAX);
        for d in defined_at.iter_mut().skip(before) {
            *d = l.launches.len();
        }
    }
    let mut outputs = Vec::new();
    for o in &g.outputs {
        let v = l.value(&o.name).map_err(|m| LowerError { node: g.name.clone(), op: "output".into(), msg: m })?;
        outputs.push(v);
    }
    let mut p = CudaProgram {
        sm: target.sm,
        kernels: l.kernels,
        values: l.values,
        launches: l.launches,
        inputs,
        outputs,
        arena_bytes: 0,
    };
    drop_unused_constants(&mut p);
    plan_arena(&mut p);
    Ok(p)
}

/// Removes constants no launch reads and no output is (weights replaced by their packed
/// half-precision form), so they are not uploaded; value indices are renumbered.
fn drop_unused_constants(p: &mut CudaProgram) {
    let mut used = vec![false; p.values.len()];
    fn mark(p: &CudaProgram, used: &mut [bool], mut v: usize) {
        loop {
            used[v] = true;
            match p.values[v].storage {
                Storage::Alias(a) => v = a,
                _ => break,
            }
        }
    }
    for l in &p.launches {
        for a in &l.args {
            if let Arg::Value(v) = a {
                mark(p, &mut used, *v);
            }
        }
    }
    for &v in p.inputs.iter().chain(&p.outputs) {
        mark(p, &mut used, v);
    }
    let keep: Vec<bool> =
        p.values.iter().enumerate().map(|(v, val)| used[v] || !matches!(val.storage, Storage::Constant(_))).collect();
    if keep.iter().all(|&k| k) {
        return;
    }
    let mut new_index = vec![usize::MAX; p.values.len()];
    let mut next = 0;
    for (v, &k) in keep.iter().enumerate() {
        if k {
            new_index[v] = next;
            next += 1;
        }
    }
    let values = std::mem::take(&mut p.values);
    p.values = values.into_iter().enumerate().filter(|(v, _)| keep[*v]).map(|(_, val)| val).collect();
    for val in &mut p.values {
        if let Storage::Alias(a) = &mut val.storage {
            *a = new_index[*a];
        }
    }
    for l in &mut p.launches {
        for a in &mut l.args {
            if let Arg::Value(v) = a {
                *v = new_index[*v];
            }
        }
    }
    for v in p.inputs.iter_mut().chain(p.outputs.iter_mut()) {
        *v = new_index[*v];
    }
}

/// Places every arena value by lifetime (first fit, 256-byte aligned): a value lives from
/// the launch that writes it to the last launch reading it (or one of its views); graph
/// outputs live to the end.
fn plan_arena(p: &mut CudaProgram) {
    let nv = p.values.len();
    let end = p.launches.len();
    let mut first = vec![usize::MAX; nv];
    let mut last = vec![0usize; nv];
    for (t, l) in p.launches.iter().enumerate() {
        for a in &l.args {
            if let Arg::Value(v) = a {
                let r = p.root(*v);
                first[r] = first[r].min(t);
                last[r] = last[r].max(t);
            }
        }
    }
    for &o in &p.outputs {
        last[p.root(o)] = end;
    }
    let mut order: Vec<usize> = (0..nv).filter(|&v| matches!(p.values[v].storage, Storage::Arena(_))).collect();
    order.sort_by_key(|&v| (first[v], v));
    let mut live: Vec<(usize, usize, usize)> = Vec::new(); // (offset, bytes, last)
    let mut arena = 0;
    for v in order {
        live.retain(|&(_, _, l)| l >= first[v]);
        live.sort_unstable();
        let bytes = p.values[v].bytes().next_multiple_of(256).max(256);
        let mut off = 0;
        for &(o, b, _) in &live {
            if off + bytes <= o {
                break;
            }
            off = off.max(o + b);
        }
        live.push((off, bytes, last[v]));
        p.values[v].storage = Storage::Arena(off);
        arena = arena.max(off + bytes);
    }
    p.arena_bytes = arena;
}

#[cfg(test)]
mod table_tests {
    /// Each op is in one row (a second would never be reached), and every name is an ONNX
    /// op or an op of aim's table.
    #[test]
    fn every_op_lowers_one_way() {
        let mut seen = std::collections::BTreeSet::new();
        for (ops, _) in super::lowerings() {
            for &op in ops {
                assert!(seen.insert(op), "{op} is listed twice");
                let known = match op.strip_prefix("aim:") {
                    Some(a) => aim_ir::schema::lookup("aim", a).is_some(),
                    None => aim_ir::schema::lookup("", op).is_some(),
                };
                assert!(known, "{op} is not an op of the schema");
            }
        }
    }
}
