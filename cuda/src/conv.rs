//! Direct convolution and pooling kernels over NCHW tensors: one thread per output
//! element, the window's taps unrolled (their offsets constants), taps in the padding
//! skipped. The direct convolution serves grouped and depthwise convolutions, where each
//! output reads few inputs and a GEMM tile would be mostly empty; it applies the same
//! epilogue as the GEMMs (bias, residual, activation).

use super::elementwise::program;
use super::gemm::{activation_program, ConvGeom};
use super::ptx::{fimm, Class, GridLoop, Kernel, Reg};
use aim_kernels::gemm::Activation;

/// Threads per block.
pub const BLOCK: u32 = 256;

/// Most taps a window may have (they are unrolled).
pub const MAX_TAPS: u32 = 64;

/// Opens the grid-stride loop over the `count` output elements: the loop and this
/// element's `[n, c, oh, ow]`.
fn output_coords(k: &mut Kernel, count: u64, c: u32, oh: u32, ow: u32) -> (GridLoop, [Reg; 4]) {
    let lp = k.grid_loop(count);
    let i32_ = k.op1(Class::B32, "cvt.u32.u64", lp.i);
    let v = k.coords(Class::B32, i32_, &[u64::from(c), u64::from(oh), u64::from(ow)]);
    (lp, [v[0], v[1], v[2], v[3]])
}

/// Emits, for each tap of the window, `visit(tap_kh, tap_kw, input_index)` under a
/// branch that skips taps in the padding. `plane` is the index of the input plane's
/// first element.
fn taps(k: &mut Kernel, g: &ConvGeom, oh: Reg, ow: Reg, plane: Reg, visit: &mut dyn FnMut(&mut Kernel, u32, u32, Reg)) {
    let ih0 = k.op2(Class::B32, "mul.lo.s32", oh, g.stride[0]);
    let ih0 = k.op2(Class::B32, "sub.s32", ih0, g.pad[0]);
    let iw0 = k.op2(Class::B32, "mul.lo.s32", ow, g.stride[1]);
    let iw0 = k.op2(Class::B32, "sub.s32", iw0, g.pad[1]);
    for kh in 0..g.kh {
        let ih = k.op2(Class::B32, "add.s32", ih0, kh * g.dilation[0]);
        let in_h = k.op2(Class::Pred, "setp.lt.u32", ih, g.h);
        for kw in 0..g.kw {
            let skip = k.label("tap");
            let iw = k.op2(Class::B32, "add.s32", iw0, kw * g.dilation[1]);
            let in_w = k.op2(Class::Pred, "setp.lt.u32", iw, g.w);
            let ok = k.op2(Class::Pred, "and.pred", in_h, in_w);
            k.ins(format!("@!{ok} bra {skip};"));
            let row = k.op3(Class::B32, "mad.lo.u32", ih, g.w, iw);
            let idx = k.op2(Class::B32, "add.u32", plane, row);
            visit(k, kh, kw, idx);
            k.place(&skip);
        }
    }
}

/// A grouped 2-D convolution: `g.c` input channels in `groups` groups, `oc` outputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DirectConv {
    /// The input, window and output geometry.
    pub geom: ConvGeom,
    /// Images in the batch.
    pub images: u32,
    /// Output channels.
    pub oc: u32,
    /// Channel groups (input and output channels split evenly).
    pub groups: u32,
    /// A bias per output channel (`bias` parameter).
    pub bias: bool,
    /// A residual of the output's shape (`r` parameter).
    pub residual: bool,
    /// The activation applied last.
    pub activation: Activation,
}

/// What the element loop of a direct or transposed convolution kernel works with: its
/// pointer parameters, the loop over output elements and the element's coordinates and
/// group, and the accumulator.
struct Frame {
    x: Reg,
    w: Reg,
    y: Reg,
    bias: Option<Reg>,
    res: Option<Reg>,
    lp: GridLoop,
    n: Reg,
    oc: Reg,
    oh: Reg,
    ow: Reg,
    grp: Reg,
    acc: Reg,
}

impl Frame {
    /// Declares `x, w, y[, bias][, r]` and opens the loop over `d`'s output elements.
    fn open(k: &mut Kernel, d: &DirectConv) -> Frame {
        let g = d.geom;
        let x = k.ptr_param("x");
        let w = k.ptr_param("w");
        let y = k.ptr_param("y");
        let bias = d.bias.then(|| k.ptr_param("bias"));
        let res = d.residual.then(|| k.ptr_param("r"));
        let count = u64::from(d.images) * u64::from(d.oc) * u64::from(g.oh) * u64::from(g.ow);
        let (lp, [n, oc, oh, ow]) = output_coords(k, count, d.oc, g.oh, g.ow);
        let grp = k.op2(Class::B32, "div.u32", oc, d.oc / d.groups);
        let acc = k.fconst(0.0);
        Frame { x, w, y, bias, res, lp, n, oc, oh, ow, grp, acc }
    }

    /// `acc += x[idx] · w[wbase + tap]`.
    fn mac(&self, k: &mut Kernel, idx: Reg, wbase: Reg, tap: u32) {
        let a = k.op2(Class::B64, "mul.wide.u32", idx, 4);
        let a = k.op2(Class::B64, "add.s64", self.x, a);
        let xv = k.reg(Class::F32);
        k.ins(format!("ld.global.nc.f32 {xv}, [{a}];"));
        let widx = k.op2(Class::B32, "add.u32", wbase, tap);
        let wa = k.op2(Class::B64, "mul.wide.u32", widx, 4);
        let wa = k.op2(Class::B64, "add.s64", self.w, wa);
        let wv = k.reg(Class::F32);
        k.ins(format!("ld.global.nc.f32 {wv}, [{wa}];"));
        k.ins(format!("fma.rn.f32 {}, {xv}, {wv}, {};", self.acc, self.acc));
    }

    /// Stores the element through the epilogue and closes the loop.
    fn close(self, k: &mut Kernel, act: Activation) {
        let i = self.lp.i;
        let v = epilogue(k, self.acc, self.oc, i, self.bias, self.res, act);
        let a = k.f32_addr(self.y, i);
        k.ins(format!("st.global.f32 [{a}], {v};"));
        k.end_grid_loop(self.lp);
    }
}

/// The kernel `name(x, w, y[, bias][, r], n)`.
pub fn direct(name: &str, d: &DirectConv) -> Kernel {
    let g = d.geom;
    let icg = g.c / d.groups;
    let mut k = Kernel::new(name);
    let f = Frame::open(&mut k, d);
    // for ic in 0..icg (a loop: channels per group can be many)
    let ic = k.op1(Class::B32, "mov.u32", 0);
    let (ch_head, ch_done) = (k.label("ch"), k.label("ch_done"));
    k.place(&ch_head);
    let c_in = k.op3(Class::B32, "mad.lo.u32", f.grp, icg, ic);
    let nc = k.op3(Class::B32, "mad.lo.u32", f.n, g.c, c_in);
    let plane = k.op2(Class::B32, "mul.lo.u32", nc, g.h * g.w);
    let wrow = k.op3(Class::B32, "mad.lo.u32", f.oc, icg, ic);
    let wbase = k.op2(Class::B32, "mul.lo.u32", wrow, g.kh * g.kw);
    taps(&mut k, &g, f.oh, f.ow, plane, &mut |k, kh, kw, idx| f.mac(k, idx, wbase, kh * g.kw + kw));
    k.ins(format!("add.u32 {ic}, {ic}, 1;"));
    let more = k.op2(Class::Pred, "setp.lt.u32", ic, icg);
    k.ins(format!("@{more} bra {ch_head};"));
    k.place(&ch_done);
    f.close(&mut k, d.activation);
    k
}

/// The kernel `name(x, w, y[, bias][, r], n)` of a transposed convolution (ConvTranspose):
/// `d.geom` gives the input (`c`, `h`, `w`), the output size (`oh`, `ow`), the kernel,
/// strides, dilations and leading pads; weights are `[c, oc / groups, kh, kw]`. Each output
/// element gathers the input pixels whose taps land on it: tap `(kh, kw)` reads input row
/// `(oh + pad − kh·dilation) / stride` where that divides exactly and is inside.
pub fn transposed(name: &str, d: &DirectConv) -> Kernel {
    let g = d.geom;
    let (icg, ocg) = (g.c / d.groups, d.oc / d.groups);
    let mut k = Kernel::new(name);
    let f = Frame::open(&mut k, d);
    let oc_in = k.op2(Class::B32, "rem.u32", f.oc, ocg);
    let ic = k.op1(Class::B32, "mov.u32", 0);
    let ch_head = k.label("ch");
    k.place(&ch_head);
    let c_in = k.op3(Class::B32, "mad.lo.u32", f.grp, icg, ic);
    let nc = k.op3(Class::B32, "mad.lo.u32", f.n, g.c, c_in);
    let plane = k.op2(Class::B32, "mul.lo.u32", nc, g.h * g.w);
    let wrow = k.op3(Class::B32, "mad.lo.u32", c_in, ocg, oc_in);
    let wbase = k.op2(Class::B32, "mul.lo.u32", wrow, g.kh * g.kw);
    let th = k.op2(Class::B32, "add.s32", f.oh, g.pad[0]);
    let tw = k.op2(Class::B32, "add.s32", f.ow, g.pad[1]);
    // The input row (column) tap `t` reads along one axis: `(o + pad − t·dilation) / stride`,
    // or a branch to `skip` where that is negative, not exact, or past `len`.
    let source = |k: &mut Kernel, shifted: Reg, back: u32, stride: u32, len: u32, skip: &str| {
        let a = k.op2(Class::B32, "sub.s32", shifted, back);
        let neg = k.op2(Class::Pred, "setp.lt.s32", a, 0);
        k.ins(format!("@{neg} bra {skip};"));
        let rem = k.op2(Class::B32, "rem.u32", a, stride);
        let off = k.op2(Class::Pred, "setp.ne.u32", rem, 0);
        k.ins(format!("@{off} bra {skip};"));
        let i = k.op2(Class::B32, "div.u32", a, stride);
        let out = k.op2(Class::Pred, "setp.ge.u32", i, len);
        k.ins(format!("@{out} bra {skip};"));
        i
    };
    for kh in 0..g.kh {
        let skip_row = k.label("row");
        let ih = source(&mut k, th, kh * g.dilation[0], g.stride[0], g.h, &skip_row);
        for kw in 0..g.kw {
            let skip = k.label("tap");
            let iw = source(&mut k, tw, kw * g.dilation[1], g.stride[1], g.w, &skip);
            let row = k.op3(Class::B32, "mad.lo.u32", ih, g.w, iw);
            let idx = k.op2(Class::B32, "add.u32", plane, row);
            f.mac(&mut k, idx, wbase, kh * g.kw + kw);
            k.place(&skip);
        }
        k.place(&skip_row);
    }
    k.ins(format!("add.u32 {ic}, {ic}, 1;"));
    let more = k.op2(Class::Pred, "setp.lt.u32", ic, icg);
    k.ins(format!("@{more} bra {ch_head};"));
    f.close(&mut k, d.activation);
    k
}

/// Bias per channel, residual at the element, activation: the value to store.
fn epilogue(k: &mut Kernel, acc: Reg, oc: Reg, i: Reg, bias: Option<Reg>, res: Option<Reg>, act: Activation) -> Reg {
    let mut v = acc;
    if let Some(bp) = bias {
        let a = k.op2(Class::B64, "mul.wide.u32", oc, 4);
        let a = k.op2(Class::B64, "add.s64", bp, a);
        let bv = k.reg(Class::F32);
        k.ins(format!("ld.global.nc.f32 {bv}, [{a}];"));
        v = k.op2(Class::F32, "add.rn.f32", v, bv);
    }
    if let Some(rp) = res {
        let a = k.f32_addr(rp, i);
        let rv = k.reg(Class::F32);
        k.ins(format!("ld.global.f32 {rv}, [{a}];"));
        v = k.op2(Class::F32, "add.rn.f32", v, rv);
    }
    program(k, &activation_program(act), &[v])
}

/// A 2-D pooling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pool {
    /// The input, window and output geometry (`c` channels pooled one by one).
    pub geom: ConvGeom,
    /// Images in the batch.
    pub images: u32,
    /// Max (else average).
    pub max: bool,
    /// Average pooling divides by the whole window, padding included.
    pub count_include_pad: bool,
}

/// The kernel `name(x, y)`: MaxPool or AveragePool of NCHW x.
pub fn pool(name: &str, p: &Pool) -> Kernel {
    let g = p.geom;
    let mut k = Kernel::new(name);
    let x = k.ptr_param("x");
    let y = k.ptr_param("y");
    let count = u64::from(p.images) * u64::from(g.c) * u64::from(g.oh) * u64::from(g.ow);
    let (lp, [n, c, oh, ow]) = output_coords(&mut k, count, g.c, g.oh, g.ow);
    let i = lp.i;
    let nc = k.op3(Class::B32, "mad.lo.u32", n, g.c, c);
    let plane = k.op2(Class::B32, "mul.lo.u32", nc, g.h * g.w);
    let acc = k.fconst(if p.max { f32::NEG_INFINITY } else { 0.0 });
    let cnt = k.fconst(0.0);
    taps(&mut k, &g, oh, ow, plane, &mut |k, _, _, idx| {
        let a = k.op2(Class::B64, "mul.wide.u32", idx, 4);
        let a = k.op2(Class::B64, "add.s64", x, a);
        let xv = k.reg(Class::F32);
        k.ins(format!("ld.global.nc.f32 {xv}, [{a}];"));
        if p.max {
            k.ins(format!("max.NaN.f32 {acc}, {acc}, {xv};"));
        } else {
            k.ins(format!("add.rn.f32 {acc}, {acc}, {xv};"));
            k.ins(format!("add.rn.f32 {cnt}, {cnt}, {};", fimm(1.0)));
        }
    });
    let v = if p.max {
        acc
    } else if p.count_include_pad {
        k.op2(Class::F32, "div.rn.f32", acc, fimm((g.kh * g.kw) as f32))
    } else {
        k.op2(Class::F32, "div.rn.f32", acc, cnt)
    };
    let a = k.f32_addr(y, i);
    k.ins(format!("st.global.f32 [{a}], {v};"));
    k.end_grid_loop(lp);
    k
}
