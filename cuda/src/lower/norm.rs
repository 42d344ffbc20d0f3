//! How the reductions, softmaxes, normalisations and pools lower.

use super::*;

impl Lowering<'_> {
    /// `aim:Reduce` and the global pools: a reduction over the trailing axes.
    pub(super) fn reduce_to(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        self.f32_value(x)?;
        let y = self.output(n, 0)?;
        let shape = self.shape(x);
        let (mode, axis) = match n.op.as_str() {
            "Reduce" => {
                (ReduceMode::parse(n.string("mode", "")).ok_or("unknown reduction mode")?, n.int("axis", 0) as usize)
            }
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

        Ok(())
    }

    /// Softmax and LogSoftmax over the last axis.
    pub(super) fn softmax(&mut self, n: &Node) -> Result<(), String> {
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

        Ok(())
    }

    /// `aim:Softmax`: the fused scale, mask and softmax over the last axis.
    pub(super) fn softmax_aim(&mut self, n: &Node) -> Result<(), String> {
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
        let k = softmax::kernel("softmax", rows as u64, len as u64, 1, n.float("scale", 1.0), mr.as_ref(), false);
        let mut args = vec![Arg::Value(x), Arg::Value(y)];
        args.extend(mask.map(Arg::Value));
        let grid = grid_for(rows * 32, softmax::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], softmax::BLOCK, args);

        Ok(())
    }

    /// LayerNormalization over the last axis.
    pub(super) fn layer_norm(&mut self, n: &Node) -> Result<(), String> {
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
        let k = layernorm::kernel("layernorm", rows as u64, len as u64, n.float_attr("epsilon"), bias.is_some());
        let mut args = vec![Arg::Value(x), Arg::Value(scale), Arg::Value(y)];
        args.extend(bias.map(Arg::Value));
        let grid = grid_for(rows * 32, layernorm::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], layernorm::BLOCK, args);

        Ok(())
    }

    /// MaxPool and AveragePool over 2-D windows.
    pub(super) fn pool(&mut self, n: &Node) -> Result<(), String> {
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
        let p =
            conv::Pool { geom, images, max: n.op == "MaxPool", count_include_pad: n.int("count_include_pad", 0) != 0 };
        let count: usize = self.shape(y).iter().product();
        let grid = grid_for(count, conv::BLOCK, &self.target);
        self.launch(n, conv::pool("pool", &p), [grid, 1, 1], conv::BLOCK, vec![Arg::Value(x), Arg::Value(y)]);

        Ok(())
    }

    /// ReduceSum / Mean / Max / Min of f32 over one block of adjacent axes (the cuda
    /// pipeline turns trailing ones into `aim:Reduce`; this takes the others).
    pub(super) fn reduce(&mut self, n: &Node) -> Result<(), String> {
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
}
