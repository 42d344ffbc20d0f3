//! How the convolutions (implicit GEMMs) and Resize (a sampling kernel) lower.

use super::*;

impl Lowering<'_> {
    /// Resize through the reference kernel's plan: its taps as constant tables.
    pub(super) fn resize(&mut self, n: &Node) -> Result<(), String> {
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

    pub(super) fn conv_transpose(&mut self, n: &Node) -> Result<(), String> {
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

    pub(super) fn conv(&mut self, n: &Node) -> Result<(), String> {
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
