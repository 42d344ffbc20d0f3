//! Lowering an optimised graph (the cuda pipeline's output, every shape known) to a
//! [`CudaProgram`]: one kernel launch per node that computes something, views (Reshape,
//! Flatten, ...) as aliases of their input's bytes, constants uploaded once, and every
//! intermediate placed in one device arena by lifetime. A node without a GPU kernel is an
//! error naming it and its op.

use super::gemm::{ALayout, BLayout, ConvGeom, Gemm, YLayout};
use super::{
    conv, elementwise, gather, gemm, grid_for, layernorm, reduce, resize, softmax, strided, GpuTarget, Half, Kernel,
};
use crate::codegen::ReduceMode;
use crate::ewprog::{self, Binary, Inst, Operand, Unary};
use aim_ir::{DType, Graph, Node};
use aim_kernels::gemm::Activation;
pub use aim_runtime::cuda::{Arg, CudaProgram, Launch, Storage, Value};
use std::collections::HashMap;

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
        let sources = crate::passes::sources_of(n);
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

    /// Add, Sub, Mul, Div (two inputs) and Max, Min, Sum, Mean (any number), f32 with numpy
    /// broadcasting, folded left to right as the reference kernels do.
    fn variadic(&mut self, n: &Node) -> Result<(), String> {
        let xs = (0..n.inputs.len()).map(|k| self.input(n, k)).collect::<Result<Vec<_>, _>>()?;
        let binary = matches!(n.op.as_str(), "Add" | "Sub" | "Mul" | "Div");
        if xs.is_empty() || (binary && xs.len() != 2) {
            return Err(format!("{} inputs", xs.len()));
        }
        let y = self.output(n, 0)?;
        let out = self.shape(y);
        let mut strides = Vec::new();
        for &x in &xs {
            self.f32_value(x)?;
            strides.push(strided::broadcast_strides(&self.shape(x), &out).ok_or("shapes do not broadcast")?);
        }
        let bin = match n.op.as_str() {
            "Add" | "Sum" | "Mean" => Binary::Add,
            "Sub" => Binary::Sub,
            "Mul" => Binary::Mul,
            "Div" => Binary::Div,
            "Max" => Binary::Max,
            _ => Binary::Min,
        };
        let mut prog: Vec<Inst> = (0..xs.len()).map(Inst::Input).collect();
        let mut acc = 0;
        for j in 1..xs.len() {
            prog.push(Inst::Binary(bin, Operand::Ref(acc), Operand::Ref(j)));
            acc = prog.len() - 1;
        }
        if n.op == "Mean" && xs.len() > 1 {
            prog.push(Inst::Binary(Binary::Div, Operand::Ref(acc), Operand::Const(xs.len() as f32)));
        }
        self.strided(n, y, &xs, strides, &prog);
        Ok(())
    }

    /// Equal, Less, Greater, LessOrEqual, GreaterOrEqual: bool bytes, operands broadcast.
    fn compare(&mut self, n: &Node) -> Result<(), String> {
        let (a, b) = (self.input(n, 0)?, self.input(n, 1)?);
        let ty = match (self.values[a].dtype, self.values[b].dtype) {
            (DType::F32, DType::F32) => strided::Operands::F32,
            (DType::I64, DType::I64) => strided::Operands::I64,
            (DType::I32, DType::I32) => strided::Operands::I32,
            (DType::Bool, DType::Bool) if n.op == "Equal" => strided::Operands::Bool,
            (x, z) => return Err(format!("comparing {x} with {z} is not supported on the GPU yet")),
        };
        let y = self.output(n, 0)?;
        let out = self.shape(y);
        let st = |l: &Self, v: usize| strided::broadcast_strides(&l.shape(v), &out).ok_or("shapes do not broadcast");
        let strides = [st(self, a)?, st(self, b)?];
        let cmp = match n.op.as_str() {
            "Equal" => "eq",
            "Less" => "lt",
            "Greater" => "gt",
            "LessOrEqual" => "le",
            _ => "ge",
        };
        let count: usize = out.iter().product();
        let k = strided::compare("compare", &out, &strides, cmp, ty);
        let args = vec![Arg::Value(y), Arg::Value(a), Arg::Value(b), Arg::U64(count as u64)];
        let grid = grid_for(count, strided::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], strided::BLOCK, args);
        Ok(())
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

    /// Slice with constant starts, ends, axes and positive steps: a strided copy.
    fn slice(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        self.f32_value(x)?;
        let y = self.output(n, 0)?;
        let xs = self.shape(x);
        let r = xs.len() as i64;
        let starts = self.const_ints(n, 1, "starts")?.ok_or("no starts")?;
        let ends = self.const_ints(n, 2, "ends")?.ok_or("no ends")?;
        let axes = self.const_ints(n, 3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = self.const_ints(n, 4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err("starts, ends, axes and steps of different lengths".into());
        }
        let contiguous = strided::contiguous(&xs);
        let (mut begin, mut step) = (vec![0i64; xs.len()], vec![1i64; xs.len()]);
        for j in 0..starts.len() {
            let a = if axes[j] < 0 { axes[j] + r } else { axes[j] };
            if !(0..r).contains(&a) {
                return Err(format!("axis {} of rank {r}", axes[j]));
            }
            if steps[j] <= 0 {
                return Err("steps below 1 are not supported on the GPU yet".into());
            }
            let dim = xs[a as usize] as i64;
            let s = if starts[j] < 0 { starts[j].saturating_add(dim) } else { starts[j] };
            begin[a as usize] = s.clamp(0, dim);
            step[a as usize] = steps[j];
        }
        let ys = self.shape(y);
        let base: u64 = (0..xs.len()).map(|d| begin[d] as u64 * contiguous[d]).sum();
        let strides: Vec<u64> = (0..xs.len()).map(|d| step[d] as u64 * contiguous[d]).collect();
        // The inferred output must lie inside the input from the start at these steps.
        for d in 0..xs.len() {
            if ys[d] > 0 && begin[d] as usize + (ys[d] - 1) * step[d] as usize >= xs[d] {
                return Err(format!("output {ys:?} does not fit input {xs:?} along axis {d}"));
            }
        }
        let count: usize = ys.iter().product();
        if count > 0 {
            let k = strided::mapped("slice", &ys, &[strides], &[base], &strided::contiguous(&ys), 0, &[Inst::Input(0)]);
            let grid = grid_for(count, strided::BLOCK, &self.target);
            self.launch(n, k, [grid, 1, 1], strided::BLOCK, vec![Arg::Value(y), Arg::Value(x), Arg::U64(count as u64)]);
        }
        Ok(())
    }

    /// ReduceSum / Mean / Max / Min of f32 over one block of adjacent axes (the cuda
    /// pipeline turns trailing ones into `aim:Reduce`; this takes the others).
    fn reduce(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        self.f32_value(x)?;
        let y = self.output(n, 0)?;
        let xs = self.shape(x);
        let r = xs.len() as i64;
        let mode = ReduceMode::from_op(&n.op).ok_or("not a reduction")?;
        let raw = self.const_ints(n, 1, "axes")?.unwrap_or_default();
        let mut axes: Vec<usize> = if raw.is_empty() {
            if n.int("noop_with_empty_axes", 0) != 0 {
                return Err("a reduction over no axes is not supported on the GPU yet".into());
            }
            (0..xs.len()).collect()
        } else {
            let mut v = Vec::new();
            for a in raw {
                let a = if a < 0 { a + r } else { a };
                if !(0..r).contains(&a) {
                    return Err(format!("axis {a} of rank {r}"));
                }
                v.push(a as usize);
            }
            v
        };
        axes.sort_unstable();
        axes.dedup();
        let (first, last) = (axes[0], axes[axes.len() - 1]);
        if last - first + 1 != axes.len() {
            return Err("reductions over axes that are not adjacent are not supported on the GPU yet".into());
        }
        let outer: usize = xs[..first].iter().product();
        let len: usize = xs[first..=last].iter().product();
        let inner: usize = xs[last + 1..].iter().product();
        if len == 0 {
            return Err("a reduction over an empty axis is not supported on the GPU yet".into());
        }
        if self.shape(y).iter().product::<usize>() != outer * inner {
            return Err(format!("output {:?} is not the input {xs:?} reduced", self.shape(y)));
        }
        if inner == 1 {
            let k = reduce::kernel("reduce", mode);
            let args = vec![Arg::Value(x), Arg::Value(y), Arg::U64(outer as u64), Arg::U64(len as u64)];
            let grid = grid_for(outer * 32, reduce::BLOCK, &self.target);
            self.launch(n, k, [grid, 1, 1], reduce::BLOCK, args);
        } else {
            let k = reduce::columns("reduce", mode, outer as u64, len as u64, inner as u64);
            let grid = grid_for(outer * inner, reduce::BLOCK, &self.target);
            self.launch(n, k, [grid, 1, 1], reduce::BLOCK, vec![Arg::Value(x), Arg::Value(y)]);
        }
        Ok(())
    }

    fn node(&mut self, n: &Node) -> Result<(), String> {
        let op = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
        match op.as_str() {
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" | "Dropout" => {
                if n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
                    return Err("Dropout's mask output is not computed on the GPU".into());
                }
                if n.op == "Dropout" && self.const_ints(n, 2, "")?.is_some_and(|t| t.iter().any(|&v| v != 0)) {
                    return Err("Dropout in training mode is not supported on the GPU".into());
                }
                let x = self.input(n, 0)?;
                let y = self.output(n, 0)?;
                if self.values[x].bytes() != self.values[y].bytes() {
                    return Err("a view of another size".into());
                }
                self.values[y].storage = Storage::Alias(x);
            }
            "aim:Elementwise" => {
                let lines = n.strings("program").ok_or("no program")?;
                let prog = ewprog::parse(lines)?;
                let xs = (0..n.inputs.len()).map(|k| self.input(n, k)).collect::<Result<Vec<_>, _>>()?;
                let y = self.output(n, 0)?;
                for &x in &xs {
                    self.f32_value(x)?;
                    if self.shape(x) != self.shape(y) {
                        return Err("inputs of another shape than the output".into());
                    }
                }
                let count: usize = self.shape(y).iter().product();
                let k = elementwise::kernel("ew", &prog, xs.len());
                let mut args = vec![Arg::Value(y)];
                args.extend(xs.iter().map(|&x| Arg::Value(x)));
                args.push(Arg::U64(count as u64));
                let grid = grid_for(count, elementwise::BLOCK, &self.target);
                self.launch(n, k, [grid, 1, 1], elementwise::BLOCK, args);
            }
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Sum" | "Mean" => self.variadic(n)?,
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => self.compare(n)?,
            "Expand" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let y = self.output(n, 0)?;
                let strides =
                    strided::broadcast_strides(&self.shape(x), &self.shape(y)).ok_or("shapes do not broadcast")?;
                self.strided(n, y, &[x], vec![strides], &[Inst::Input(0)]);
            }
            "Slice" => self.slice(n)?,
            "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" => self.reduce(n)?,
            "Clip" => {
                let x = self.input(n, 0)?;
                let bounds = [self.opt_input(n, 1)?, self.opt_input(n, 2)?];
                let y = self.output(n, 0)?;
                let out = self.shape(y);
                let mut xs = vec![x];
                let mut prog = vec![Inst::Input(0)];
                for (b, op) in bounds.into_iter().zip([Binary::Max, Binary::Min]) {
                    let Some(b) = b else { continue };
                    if self.values[b].bytes() != 4 {
                        return Err("Clip's bounds must be scalars".into());
                    }
                    xs.push(b);
                    prog.push(Inst::Input(xs.len() - 1));
                    let last = prog.len();
                    prog.push(Inst::Binary(op, Operand::Ref(last - 2), Operand::Ref(last - 1)));
                }
                let mut strides = Vec::new();
                for &v in &xs {
                    self.f32_value(v)?;
                    strides.push(strided::broadcast_strides(&self.shape(v), &out).ok_or("shapes do not broadcast")?);
                }
                self.strided(n, y, &xs, strides, &prog);
            }
            "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Erf" | "Sqrt" | "Neg" | "Abs" | "Reciprocal" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let y = self.output(n, 0)?;
                let u = match n.op.as_str() {
                    "Relu" => Unary::Relu,
                    "Sigmoid" => Unary::Sigmoid,
                    "Tanh" => Unary::Tanh,
                    "Exp" => Unary::Exp,
                    "Erf" => Unary::Erf,
                    "Sqrt" => Unary::Sqrt,
                    "Neg" => Unary::Neg,
                    "Abs" => Unary::Abs,
                    _ => Unary::Reciprocal,
                };
                let strides = strided::broadcast_strides(&self.shape(x), &self.shape(y)).ok_or("shape mismatch")?;
                self.strided(n, y, &[x], vec![strides], &[Inst::Input(0), Inst::Unary(u, Operand::Ref(0))]);
            }
            "LeakyRelu" | "HardSigmoid" | "HardSwish" | "Gelu" | "Elu" => {
                let act = crate::passes::fuse::node_activation(self.g, n).ok_or("unknown activation")?;
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let y = self.output(n, 0)?;
                let strides = strided::broadcast_strides(&self.shape(x), &self.shape(y)).ok_or("shape mismatch")?;
                self.strided(n, y, &[x], vec![strides], &gemm::activation_program(act));
            }
            "aim:Transpose" | "Transpose" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let y = self.output(n, 0)?;
                let shape = self.shape(x);
                let perm: Vec<usize> = match n.ints("perm") {
                    Some(p) => p.iter().map(|&d| d as usize).collect(),
                    None => (0..shape.len()).rev().collect(),
                };
                if perm.len() != shape.len() || perm.iter().any(|&p| p >= shape.len()) {
                    return Err(format!("perm {perm:?} for rank {}", shape.len()));
                }
                let strides = strided::transpose_strides(&shape, &perm);
                self.strided(n, y, &[x], vec![strides], &[Inst::Input(0)]);
            }
            "aim:Reduce" | "GlobalAveragePool" | "GlobalMaxPool" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let y = self.output(n, 0)?;
                let shape = self.shape(x);
                let (mode, axis) = match n.op.as_str() {
                    "Reduce" => (
                        ReduceMode::parse(n.string("mode", "")).ok_or("unknown reduction mode")?,
                        n.int("axis", 0) as usize,
                    ),
                    "GlobalAveragePool" => (ReduceMode::Mean, 2),
                    _ => (ReduceMode::Max, 2),
                };
                if axis > shape.len() {
                    return Err(format!("axis {axis} of rank {}", shape.len()));
                }
                let rows: usize = shape[..axis].iter().product();
                let len: usize = shape[axis..].iter().product();
                let k = reduce::kernel("reduce", mode);
                let args = vec![Arg::Value(x), Arg::Value(y), Arg::U64(rows as u64), Arg::U64(len as u64)];
                let grid = grid_for(rows * 32, reduce::BLOCK, &self.target);
                self.launch(n, k, [grid, 1, 1], reduce::BLOCK, args);
            }
            "Softmax" | "LogSoftmax" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let y = self.output(n, 0)?;
                let shape = self.shape(x);
                let a = axis_of(n, -1, shape.len())?;
                let len = shape[a];
                let inner: usize = shape[a + 1..].iter().product();
                let rows = shape[..a].iter().product::<usize>() * inner;
                let log = n.op == "LogSoftmax";
                let k = softmax::kernel("softmax", rows as u64, len as u64, inner as u64, 1.0, None, log);
                let grid = grid_for(rows * 32, softmax::BLOCK, &self.target);
                self.launch(n, k, [grid, 1, 1], softmax::BLOCK, vec![Arg::Value(x), Arg::Value(y)]);
            }
            "aim:Softmax" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let mask = self.opt_input(n, 1)?;
                let y = self.output(n, 0)?;
                let shape = self.shape(x);
                let len = *shape.last().ok_or("a scalar")?;
                let rows: usize = shape[..shape.len() - 1].iter().product();
                let mr = match mask {
                    Some(m) => {
                        self.f32_value(m)?;
                        let ms = self.shape(m);
                        if ms.len() > shape.len() || ms.last() != Some(&len) {
                            return Err(format!("mask {ms:?} does not run along x {shape:?}"));
                        }
                        strided::broadcast_strides(&ms, &shape).ok_or("the mask does not broadcast")?;
                        Some(softmax::MaskRows::new(&shape, &ms))
                    }
                    None => None,
                };
                let k =
                    softmax::kernel("softmax", rows as u64, len as u64, 1, n.float("scale", 1.0), mr.as_ref(), false);
                let mut args = vec![Arg::Value(x), Arg::Value(y)];
                args.extend(mask.map(Arg::Value));
                let grid = grid_for(rows * 32, softmax::BLOCK, &self.target);
                self.launch(n, k, [grid, 1, 1], softmax::BLOCK, args);
            }
            "LayerNormalization" => {
                let x = self.input(n, 0)?;
                let scale = self.input(n, 1)?;
                let bias = self.opt_input(n, 2)?;
                self.f32_value(x)?;
                if n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
                    return Err("the Mean and InvStdDev outputs are not computed on the GPU".into());
                }
                let y = self.output(n, 0)?;
                let shape = self.shape(x);
                let axis = axis_of(n, -1, shape.len())?;
                let rows: usize = shape[..axis].iter().product();
                let len: usize = shape[axis..].iter().product();
                for v in std::iter::once(scale).chain(bias) {
                    self.f32_value(v)?;
                    if self.values[v].bytes() != 4 * len {
                        return Err(format!("scale or bias of {:?}: one value per normalised element", self.shape(v)));
                    }
                }
                let k =
                    layernorm::kernel("layernorm", rows as u64, len as u64, n.float_attr("epsilon"), bias.is_some());
                let mut args = vec![Arg::Value(x), Arg::Value(scale), Arg::Value(y)];
                args.extend(bias.map(Arg::Value));
                let grid = grid_for(rows * 32, layernorm::BLOCK, &self.target);
                self.launch(n, k, [grid, 1, 1], layernorm::BLOCK, args);
            }
            "aim:Dense" => {
                let a = self.input(n, 0)?;
                let w = self.input(n, 1)?;
                let bias = self.opt_input(n, 2)?;
                let res = self.opt_input(n, 3)?;
                let y = self.output(n, 0)?;
                for v in [Some(a), Some(w), bias, res].into_iter().flatten() {
                    self.f32_value(v)?;
                }
                let (ash, wsh) = (self.shape(a), self.shape(w));
                // `trans_b`: the weight is stored `[N, K]`.
                let cols = n.int(crate::passes::fuse::TRANS_B, 0) != 0;
                let [kw, nw] = match (cols, &wsh[..]) {
                    (false, &[k, n]) => [k, n],
                    (true, &[n, k]) => [k, n],
                    _ => return Err(format!("weights {wsh:?} are not a matrix")),
                };
                let k = *ash.last().ok_or("a scalar input")?;
                if k != kw {
                    return Err(format!("input {ash:?} and weights {wsh:?} do not chain"));
                }
                let m: usize = ash[..ash.len() - 1].iter().product();
                if let Some(b) = bias {
                    if self.values[b].bytes() != 4 * nw {
                        return Err("the bias is not one value per output feature".into());
                    }
                }
                if let Some(r) = res {
                    if self.shape(r) != self.shape(y) {
                        return Err("the residual's shape is not the output's".into());
                    }
                }
                let g = Gemm {
                    m: u32_of(m, "rows")?,
                    n: u32_of(nw, "columns")?,
                    k: u32_of(k, "depth")?,
                    batch: 1,
                    a: ALayout::Rows { batch_stride: 0 },
                    b: if cols { BLayout::Cols { batch_stride: 0 } } else { BLayout::Rows { batch_stride: 0 } },
                    y: YLayout::Rows { batch_stride: 0 },
                    bias: bias.is_some(),
                    residual: res.is_some(),
                    activation: activation(n)?,
                };
                self.gemm(n, &g, a, w, y, bias, res)?;
            }
            "MatMul" => {
                let (a, b) = (self.input(n, 0)?, self.input(n, 1)?);
                self.f32_value(a)?;
                self.f32_value(b)?;
                let y = self.output(n, 0)?;
                let (sa, sb) = (self.shape(a), self.shape(b));
                if sa.len() < 2 || sb.len() < 2 {
                    return Err("matrix products of vectors are not supported on the GPU yet".into());
                }
                let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
                let (kb, nn) = (sb[sb.len() - 2], sb[sb.len() - 1]);
                if k != kb {
                    return Err(format!("{sa:?} and {sb:?} do not chain"));
                }
                let (ba, bb): (usize, usize) =
                    (sa[..sa.len() - 2].iter().product(), sb[..sb.len() - 2].iter().product());
                let batch = ba.max(bb);
                let yb: usize = self.shape(y)[..self.shape(y).len() - 2].iter().product();
                let same = sa[..sa.len() - 2].iter().rev().zip(sb[..sb.len() - 2].iter().rev()).all(|(x, y)| x == y);
                if yb != batch || !((ba == bb && same) || ba == 1 || bb == 1) {
                    return Err(format!("batch dims of {sa:?} and {sb:?} broadcast in a way not supported yet"));
                }
                let stride = |own: usize, per: usize| if own == 1 { 0 } else { per as u64 };
                let g = Gemm {
                    m: u32_of(m, "rows")?,
                    n: u32_of(nn, "columns")?,
                    k: u32_of(k, "depth")?,
                    batch: u32_of(batch, "batch")?,
                    a: ALayout::Rows { batch_stride: stride(ba, m * k) },
                    b: BLayout::Rows { batch_stride: stride(bb, k * nn) },
                    y: YLayout::Rows { batch_stride: (m * nn) as u64 },
                    bias: false,
                    residual: false,
                    activation: Activation::Identity,
                };
                self.gemm(n, &g, a, b, y, None, None)?;
            }
            "aim:Conv" => self.conv(n)?,
            "Where" => {
                let (c, a, b) = (self.input(n, 0)?, self.input(n, 1)?, self.input(n, 2)?);
                if self.values[c].dtype != DType::Bool {
                    return Err("the condition must be bool".into());
                }
                self.f32_value(a)?;
                self.f32_value(b)?;
                let y = self.output(n, 0)?;
                let out = self.shape(y);
                let st =
                    |l: &Self, v: usize| strided::broadcast_strides(&l.shape(v), &out).ok_or("shapes do not broadcast");
                let strides = [st(self, c)?, st(self, a)?, st(self, b)?];
                let count: usize = out.iter().product();
                let k = strided::select("where", &out, &strides);
                let args = vec![Arg::Value(y), Arg::Value(c), Arg::Value(a), Arg::Value(b), Arg::U64(count as u64)];
                let grid = grid_for(count, strided::BLOCK, &self.target);
                self.launch(n, k, [grid, 1, 1], strided::BLOCK, args);
            }
            "aim:ConvTranspose" | "ConvTranspose" => self.conv_transpose(n)?,
            "Resize" => self.resize(n)?,
            "Concat" => {
                let y = self.output(n, 0)?;
                let out = self.shape(y);
                let a = axis_of(n, 0, out.len())?;
                let ys = strided::contiguous(&out);
                let mut at = 0usize;
                for k in 0..n.inputs.len() {
                    let x = self.input(n, k)?;
                    self.f32_value(x)?;
                    let xs = self.shape(x);
                    if xs.len() != out.len() {
                        return Err("inputs of another rank".into());
                    }
                    if xs.iter().product::<usize>() > 0 {
                        let prog = [Inst::Input(0)];
                        let k = strided::mapped(
                            "concat",
                            &xs,
                            &[strided::contiguous(&xs)],
                            &[0],
                            &ys,
                            at as u64 * ys[a],
                            &prog,
                        );
                        let count: usize = xs.iter().product();
                        let grid = grid_for(count, strided::BLOCK, &self.target);
                        self.launch(
                            n,
                            k,
                            [grid, 1, 1],
                            strided::BLOCK,
                            vec![Arg::Value(y), Arg::Value(x), Arg::U64(count as u64)],
                        );
                    }
                    at += xs[a];
                }
                if at != out[a] {
                    return Err(format!("inputs add up to {at} along axis {a}, the output has {}", out[a]));
                }
            }
            "Split" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                let xs = self.shape(x);
                let a = axis_of(n, 0, xs.len())?;
                let strides = strided::contiguous(&xs);
                let mut at = 0usize;
                for k in 0..n.outputs.len() {
                    if n.outputs[k].is_empty() {
                        return Err("an omitted Split output is not supported on the GPU yet".into());
                    }
                    let y = self.output(n, k)?;
                    let ys = self.shape(y);
                    let count: usize = ys.iter().product();
                    if count > 0 {
                        let prog = [Inst::Input(0)];
                        let kern = strided::mapped(
                            "split",
                            &ys,
                            &[strided::contiguous(&xs)],
                            &[at as u64 * strides[a]],
                            &strided::contiguous(&ys),
                            0,
                            &prog,
                        );
                        let grid = grid_for(count, strided::BLOCK, &self.target);
                        self.launch(
                            n,
                            kern,
                            [grid, 1, 1],
                            strided::BLOCK,
                            vec![Arg::Value(y), Arg::Value(x), Arg::U64(count as u64)],
                        );
                    }
                    at += ys.get(a).copied().unwrap_or(0);
                }
                if at != xs[a] {
                    return Err(format!("outputs add up to {at} along axis {a}, the input has {}", xs[a]));
                }
            }
            "MaxPool" | "AveragePool" => {
                let x = self.input(n, 0)?;
                self.f32_value(x)?;
                if n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
                    return Err("MaxPool's indices output is not computed on the GPU".into());
                }
                let y = self.output(n, 0)?;
                let ks = n.ints("kernel_shape").ok_or("no kernel_shape")?.to_vec();
                let geom = self.geom(n, &self.shape(x), &self.shape(y), &ks)?;
                if n.op == "AveragePool" && n.int("ceil_mode", 0) != 0 {
                    return Err("AveragePool with ceil_mode is not supported on the GPU yet".into());
                }
                let images = u32_of(self.shape(x)[0], "images")?;
                let p = conv::Pool {
                    geom,
                    images,
                    max: n.op == "MaxPool",
                    count_include_pad: n.int("count_include_pad", 0) != 0,
                };
                let count: usize = self.shape(y).iter().product();
                let grid = grid_for(count, conv::BLOCK, &self.target);
                self.launch(n, conv::pool("pool", &p), [grid, 1, 1], conv::BLOCK, vec![Arg::Value(x), Arg::Value(y)]);
            }
            "Gather" => {
                let data = self.input(n, 0)?;
                let idx = self.input(n, 1)?;
                self.f32_value(data)?;
                let i64 = match self.values[idx].dtype {
                    DType::I64 => true,
                    DType::I32 => false,
                    d => return Err(format!("indices of {d}")),
                };
                let y = self.output(n, 0)?;
                let shape = self.shape(data);
                let a = axis_of(n, 0, shape.len())?;
                let geom = gather::GatherGeom {
                    outer: shape[..a].iter().product::<usize>() as u64,
                    axis: shape[a] as u64,
                    inner: shape[a + 1..].iter().product::<usize>() as u64,
                    indices: self.shape(idx).iter().product::<usize>() as u64,
                    i64,
                };
                let count: usize = self.shape(y).iter().product();
                let args =
                    vec![Arg::Value(data), Arg::Value(idx), Arg::Value(y), Arg::ErrorFlag, Arg::U64(count as u64)];
                let grid = grid_for(count, gather::BLOCK, &self.target);
                self.launch(n, gather::gather("gather", geom), [grid, 1, 1], gather::BLOCK, args);
            }
            "Cast" | "CastLike" => {
                let x = self.input(n, 0)?;
                let y = self.output(n, 0)?;
                if self.values[x].dtype == self.values[y].dtype {
                    self.values[y].storage = Storage::Alias(x);
                    return Ok(());
                }
                let elem = |d: DType| match d {
                    DType::F32 => Some(gather::Elem::F32),
                    DType::I64 => Some(gather::Elem::I64),
                    DType::I32 => Some(gather::Elem::I32),
                    DType::Bool => Some(gather::Elem::Bool),
                    DType::F16 => Some(gather::Elem::F16),
                    DType::BF16 => Some(gather::Elem::Bf16),
                    _ => None,
                };
                let (from, to) = (self.values[x].dtype, self.values[y].dtype);
                let k = elem(from)
                    .zip(elem(to))
                    .and_then(|(f, t)| gather::cast("cast", f, t))
                    .ok_or_else(|| format!("Cast from {from} to {to} is not supported on the GPU yet"))?;
                let count: usize = self.shape(y).iter().product();
                let grid = grid_for(count, gather::BLOCK, &self.target);
                self.launch(
                    n,
                    k,
                    [grid, 1, 1],
                    gather::BLOCK,
                    vec![Arg::Value(x), Arg::Value(y), Arg::U64(count as u64)],
                );
            }
            _ => return Err("no GPU kernel for this op yet".into()),
        }
        Ok(())
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

    /// Resize through the reference kernel's plan: its taps as constant tables.
    fn resize(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        self.f32_value(x)?;
        // The plan needs the input's shape only: its slot stays empty.
        let mut ins = vec![None];
        for k in 1..n.inputs.len() {
            ins.push(match n.input(k).filter(|s| !s.is_empty()) {
                None => None,
                Some(name) => Some(
                    self.g
                        .initializers
                        .get(name)
                        .cloned()
                        .ok_or_else(|| format!("input {k} ('{name}') must be a constant on the GPU"))?,
                ),
            });
        }
        let plan =
            aim_kernels::ops::resize::plan_for(n, DType::F32, &self.shape(x), &ins).map_err(|e| e.to_string())?;
        drop(ins);
        let y = self.output(n, 0)?;
        let xs = self.shape(x);
        if plan.out != self.shape(y) {
            return Err(format!("the plan's output {:?} is not the inferred {:?}", plan.out, self.shape(y)));
        }
        // Two adjacent axes: [outer, h, w, inner] (an axis that keeps its size gets identity taps).
        let (hd, wd) = match plan.axes.as_slice() {
            [] => (xs.len().saturating_sub(2), xs.len().saturating_sub(1)),
            [(d, _)] if *d > 0 => (d - 1, *d),
            [_] => (0, 1.min(xs.len() - 1)),
            [(a, _), (b, _)] if *b == a + 1 => (*a, *b),
            _ => return Err("resizing more than two adjacent axes is not supported on the GPU yet".into()),
        };
        if xs.len() < 2 || hd == wd {
            return Err("Resize of a tensor of rank below 2 is not supported on the GPU yet".into());
        }
        let taps_of = |d: usize| -> Result<Vec<Vec<(usize, f32)>>, String> {
            match plan.axes.iter().find(|(a, _)| *a == d) {
                Some((_, t)) => t
                    .iter()
                    .map(|p| {
                        p.as_ref().map(|p| p.iter().map(|&(i, w)| (i, w as f32)).collect()).ok_or_else(|| {
                            "tf_crop_and_resize extrapolation is not supported on the GPU yet".to_string()
                        })
                    })
                    .collect(),
                None => Ok((0..xs[d]).map(|i| vec![(i, 1.0)]).collect()),
            }
        };
        let (ht, wt) = (taps_of(hd)?, taps_of(wd)?);
        let width = |t: &[Vec<(usize, f32)>]| t.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let (th, tw) = (width(&ht), width(&wt));
        if th * tw > 64 {
            return Err(format!("{th}×{tw} taps per output: too many to unroll"));
        }
        // Padded to a fixed tap count with zero weights on index 0.
        let tables = |t: &[Vec<(usize, f32)>], w: usize| -> (aim_ir::Tensor, aim_ir::Tensor) {
            let mut idx = Vec::with_capacity(t.len() * w);
            let mut wt = Vec::with_capacity(t.len() * w);
            for p in t {
                for j in 0..w {
                    let (i, v) = p.get(j).copied().unwrap_or((0, 0.0));
                    idx.push(i as i32);
                    wt.push(v);
                }
            }
            (aim_ir::Tensor::from_vec(&[idx.len()], idx), aim_ir::Tensor::from_vec(&[wt.len()], wt))
        };
        let (hi, hw) = tables(&ht, th);
        let (wi, ww) = tables(&wt, tw);
        let args_t =
            [self.table(n, "hidx", hi), self.table(n, "hw", hw), self.table(n, "widx", wi), self.table(n, "ww", ww)];
        let ys = self.shape(y);
        let geom = resize::ResizeGeom {
            outer: xs[..hd].iter().product::<usize>() as u64,
            h: xs[hd] as u64,
            w: xs[wd] as u64,
            inner: xs[wd + 1..].iter().product::<usize>() as u64,
            oh: ys[hd] as u64,
            ow: ys[wd] as u64,
            th: th as u32,
            tw: tw as u32,
        };
        let count: usize = ys.iter().product();
        let mut args = vec![Arg::Value(x), Arg::Value(y)];
        args.extend(args_t.iter().map(|&v| Arg::Value(v)));
        args.push(Arg::U64(count as u64));
        let grid = grid_for(count, resize::BLOCK, &self.target);
        self.launch(n, resize::kernel("resize", &geom), [grid, 1, 1], resize::BLOCK, args);
        Ok(())
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

    fn conv_transpose(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        let w = self.input(n, 1)?;
        let bias = self.opt_input(n, 2)?;
        let res = if n.domain == "aim" { self.opt_input(n, 3)? } else { None };
        let y = self.output(n, 0)?;
        for v in [Some(x), Some(w), bias, res].into_iter().flatten() {
            self.f32_value(v)?;
        }
        let (xs, ws, ys) = (self.shape(x), self.shape(w), self.shape(y));
        if ws.len() != 4 || xs.len() != 4 || ys.len() != 4 {
            return Err("only 2-D transposed convolutions are supported on the GPU yet".into());
        }
        if n.ints("output_shape").is_some() && n.ints("pads").is_none() {
            return Err("ConvTranspose with output_shape (pads derived from it) is not supported on the GPU yet".into());
        }
        let groups = n.int("group", 1).max(1) as u32;
        let geom = self.geom(n, &xs, &ys, &[ws[2] as i64, ws[3] as i64])?;
        let oc = u32_of(ws[1], "output channels per group")? * groups;
        if ws[0] as u32 != geom.c || geom.c % groups != 0 || ys[1] as u32 != oc {
            return Err(format!("weights {ws:?} for {} channels in {groups} groups", geom.c));
        }
        if geom.kh * geom.kw > conv::MAX_TAPS {
            return Err(format!("windows of more than {} taps are not supported on the GPU yet", conv::MAX_TAPS));
        }
        let act = if n.domain == "aim" { activation(n)? } else { Activation::Identity };
        let d = conv::DirectConv {
            geom,
            images: u32_of(xs[0], "images")?,
            oc,
            groups,
            bias: bias.is_some(),
            residual: res.is_some(),
            activation: act,
        };
        self.launch_direct(n, conv::transposed("deconv", &d), [x, w, y], bias, res);
        Ok(())
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

    fn conv(&mut self, n: &Node) -> Result<(), String> {
        if n.attrs.contains_key("layout") {
            return Err("blocked layouts are the cpu backend's".into());
        }
        let x = self.input(n, 0)?;
        let w = self.input(n, 1)?;
        let bias = self.opt_input(n, 2)?;
        let res = self.opt_input(n, 3)?;
        let y = self.output(n, 0)?;
        for v in [Some(x), Some(w), bias, res].into_iter().flatten() {
            self.f32_value(v)?;
        }
        let (xs, ws, ys) = (self.shape(x), self.shape(w), self.shape(y));
        if ws.len() != 4 {
            return Err("only 2-D convolutions are supported on the GPU yet".into());
        }
        let geom = self.geom(n, &xs, &ys, &[ws[2] as i64, ws[3] as i64])?;
        let groups = n.int("group", 1).max(1) as u32;
        let oc = u32_of(ws[0], "output channels")?;
        if geom.c % groups != 0 || oc % groups != 0 || ws[1] as u32 * groups != geom.c {
            return Err(format!("weights {ws:?} for {} channels in {groups} groups", geom.c));
        }
        if res.is_some_and(|r| self.shape(r) != ys) {
            return Err("the residual's shape is not the output's".into());
        }
        let act = activation(n)?;
        let images = u32_of(xs[0], "images")?;
        if groups == 1 {
            let hw = geom.oh * geom.ow;
            let g = Gemm {
                m: u32_of(xs[0] * hw as usize, "rows")?,
                n: oc,
                k: geom.c * geom.kh * geom.kw,
                batch: 1,
                a: ALayout::Im2col(geom),
                b: BLayout::Cols { batch_stride: 0 },
                y: YLayout::Nchw { hw },
                bias: bias.is_some(),
                residual: res.is_some(),
                activation: act,
            };
            return self.gemm(n, &g, x, w, y, bias, res);
        }
        if geom.kh * geom.kw > conv::MAX_TAPS {
            return Err(format!(
                "grouped windows of more than {} taps are not supported on the GPU yet",
                conv::MAX_TAPS
            ));
        }
        let d = conv::DirectConv {
            geom,
            images,
            oc,
            groups,
            bias: bias.is_some(),
            residual: res.is_some(),
            activation: act,
        };
        self.launch_direct(n, conv::direct("conv", &d), [x, w, y], bias, res);
        Ok(())
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
