//! How the data-movement ops lower: views, copies by strides, gathers and casts.

use super::*;

impl Lowering<'_> {
    /// Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout (inference): the output aliases the
    /// input's bytes.
    pub(super) fn views(&mut self, n: &Node) -> Result<(), String> {
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

        Ok(())
    }

    /// Expand: a broadcast copy.
    pub(super) fn expand(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        self.f32_value(x)?;
        let y = self.output(n, 0)?;
        let strides = strided::broadcast_strides(&self.shape(x), &self.shape(y)).ok_or("shapes do not broadcast")?;
        self.strided(n, y, &[x], vec![strides], &[Inst::Input(0)]);

        Ok(())
    }

    /// Transpose (and `aim:Transpose`): a strided copy.
    pub(super) fn transpose(&mut self, n: &Node) -> Result<(), String> {
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

        Ok(())
    }

    /// Where: a broadcast select.
    pub(super) fn select(&mut self, n: &Node) -> Result<(), String> {
        let (c, a, b) = (self.input(n, 0)?, self.input(n, 1)?, self.input(n, 2)?);
        if self.values[c].dtype != DType::Bool {
            return Err("the condition must be bool".into());
        }
        self.f32_value(a)?;
        self.f32_value(b)?;
        let y = self.output(n, 0)?;
        let out = self.shape(y);
        let st = |l: &Self, v: usize| strided::broadcast_strides(&l.shape(v), &out).ok_or("shapes do not broadcast");
        let strides = [st(self, c)?, st(self, a)?, st(self, b)?];
        let count: usize = out.iter().product();
        let k = strided::select("where", &out, &strides);
        let args = vec![Arg::Value(y), Arg::Value(c), Arg::Value(a), Arg::Value(b), Arg::U64(count as u64)];
        let grid = grid_for(count, strided::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], strided::BLOCK, args);

        Ok(())
    }

    /// Concat: a strided copy per input.
    pub(super) fn concat(&mut self, n: &Node) -> Result<(), String> {
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
                let k =
                    strided::mapped("concat", &xs, &[strided::contiguous(&xs)], &[0], &ys, at as u64 * ys[a], &prog);
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

        Ok(())
    }

    /// Split: a strided copy per output.
    pub(super) fn split(&mut self, n: &Node) -> Result<(), String> {
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

        Ok(())
    }

    /// Gather along an axis, indices checked on the device.
    pub(super) fn gather(&mut self, n: &Node) -> Result<(), String> {
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
        let args = vec![Arg::Value(data), Arg::Value(idx), Arg::Value(y), Arg::ErrorFlag, Arg::U64(count as u64)];
        let grid = grid_for(count, gather::BLOCK, &self.target);
        self.launch(n, gather::gather("gather", geom), [grid, 1, 1], gather::BLOCK, args);

        Ok(())
    }

    /// Cast and CastLike between the numeric types the GPU holds.
    pub(super) fn cast(&mut self, n: &Node) -> Result<(), String> {
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
        self.launch(n, k, [grid, 1, 1], gather::BLOCK, vec![Arg::Value(x), Arg::Value(y), Arg::U64(count as u64)]);

        Ok(())
    }

    /// Slice with constant starts, ends, axes and positive steps: a strided copy.
    pub(super) fn slice(&mut self, n: &Node) -> Result<(), String> {
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
}
