//! How the matrix products lower: GEMMs.

use super::*;

impl Lowering<'_> {
    /// `aim:Dense`: a GEMM with its packed weights, bias and activation.
    pub(super) fn dense(&mut self, n: &Node) -> Result<(), String> {
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
        let cols = n.int(aim_compiler::passes::fuse::TRANS_B, 0) != 0;
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

        Ok(())
    }

    /// MatMul of two run-time operands (batched): a GEMM per batch.
    pub(super) fn matmul(&mut self, n: &Node) -> Result<(), String> {
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
        let (ba, bb): (usize, usize) = (sa[..sa.len() - 2].iter().product(), sb[..sb.len() - 2].iter().product());
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

        Ok(())
    }
}
