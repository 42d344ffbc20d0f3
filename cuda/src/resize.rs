//! Resize over two adjacent axes (an NCHW image's H and W, or any `[outer, H, W, inner]`
//! view): the taps of every output row and column come from the reference kernel's plan
//! (`aim_kernels::ops::resize::plan`, so every mode — nearest, linear, cubic, antialiased —
//! and coordinate transformation agrees with it), uploaded as constant tables of source
//! indices and weights; each output element is the weighted sum of its window, the taps
//! unrolled.

use super::ptx::{Class, Kernel};

/// Threads per block.
pub const BLOCK: u32 = 256;

/// The geometry: input `[outer, h, w, inner]`, output `[outer, oh, ow, inner]`, and the
/// taps per output row (`th`) and column (`tw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResizeGeom {
    /// Elements of the dims before the resized pair.
    pub outer: u64,
    /// Input length of the first resized axis.
    pub h: u64,
    /// Input length of the second.
    pub w: u64,
    /// Elements of the dims after the pair.
    pub inner: u64,
    /// Output length of the first resized axis.
    pub oh: u64,
    /// Output length of the second.
    pub ow: u64,
    /// Taps per output position along the first axis.
    pub th: u32,
    /// Taps per output position along the second.
    pub tw: u32,
}

/// The kernel `name(x, y, hidx, hw, widx, ww, n)`: `hidx`/`widx` are i32 source indices and
/// `hw`/`ww` f32 weights, `th` (`tw`) per output row (column).
pub fn kernel(name: &str, g: &ResizeGeom) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.ptr_param("x");
    let y = k.ptr_param("y");
    let hidx = k.ptr_param("hidx");
    let hw = k.ptr_param("hw");
    let widx = k.ptr_param("widx");
    let ww = k.ptr_param("ww");
    let n = k.u64_param("n");
    let lp = k.grid_loop(n);
    let i = lp.i;
    let c = k.coords(Class::B64, i, &[g.oh, g.ow, g.inner]);
    let (o, oy, ox, e) = (c[0], c[1], c[2], c[3]);
    let plane = k.op2(Class::B64, "mul.lo.u64", o, g.h);
    let acc = k.fconst(0.0);
    let load_tap = |k: &mut Kernel, idx, wt, pos, t: u32, taps: u32| {
        let j = k.op3(Class::B64, "mad.lo.u64", pos, u64::from(taps), u64::from(t));
        let off = k.op2(Class::B64, "shl.b64", j, 2);
        let ia = k.op2(Class::B64, "add.s64", idx, off);
        let wa = k.op2(Class::B64, "add.s64", wt, off);
        let si = k.reg(Class::B32);
        k.ins(format!("ld.global.nc.u32 {si}, [{ia}];"));
        let w = k.reg(Class::F32);
        k.ins(format!("ld.global.nc.f32 {w}, [{wa}];"));
        (k.op1(Class::B64, "cvt.u64.u32", si), w)
    };
    for a in 0..g.th {
        let (sy, wy) = load_tap(&mut k, hidx, hw, oy, a, g.th);
        let row = k.op2(Class::B64, "add.s64", plane, sy);
        let row = k.op2(Class::B64, "mul.lo.u64", row, g.w);
        let part = k.fconst(0.0);
        for b in 0..g.tw {
            let (sx, wx) = load_tap(&mut k, widx, ww, ox, b, g.tw);
            let col = k.op2(Class::B64, "add.s64", row, sx);
            let idx = k.op3(Class::B64, "mad.lo.u64", col, g.inner, e);
            let xa = k.f32_addr(x, idx);
            let v = k.reg(Class::F32);
            k.ins(format!("ld.global.nc.f32 {v}, [{xa}];"));
            k.ins(format!("fma.rn.f32 {part}, {wx}, {v}, {part};"));
        }
        k.ins(format!("fma.rn.f32 {acc}, {wy}, {part}, {acc};"));
    }
    let a = k.f32_addr(y, i);
    k.ins(format!("st.global.f32 [{a}], {acc};"));
    k.end_grid_loop(lp);
    k
}
