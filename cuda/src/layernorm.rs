//! LayerNormalization over trailing axes as PTX: one warp per row; the mean, then the
//! variance around it (two passes: no cancellation from Σx² − n·mean²), then
//! `(x − mean) / √(var + ε) · scale + bias` with scale and bias per element of the row.

use super::ptx::{fimm, Class, Kernel, Reg};
use super::reduce::{lane_loop, warp_all, warp_ids};

/// Threads per block (8 warps).
pub const BLOCK: u32 = 256;

/// The kernel `name(x, scale, y[, bias])` for `rows` rows of `len`.
pub fn kernel(name: &str, rows: u64, len: u64, epsilon: f32, bias: bool) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.ptr_param("x");
    let scale = k.ptr_param("scale");
    let y = k.ptr_param("y");
    let b = bias.then(|| k.ptr_param("bias"));
    let (row, lane, warps) = warp_ids(&mut k);
    let lane64 = k.op1(Class::B64, "cvt.u64.u32", lane);
    let (head, done) = (k.label("row"), k.label("done"));
    k.place(&head);
    let past = k.op2(Class::Pred, "setp.ge.u64", row, rows);
    k.ins(format!("@{past} bra {done};"));
    let start = k.op2(Class::B64, "mul.lo.u64", row, len);
    let load = |k: &mut Kernel, base: Reg, j: Reg, offset: Option<Reg>| -> Reg {
        let e = match offset {
            Some(o) => k.op2(Class::B64, "add.s64", o, j),
            None => j,
        };
        let a = k.f32_addr(base, e);
        let v = k.reg(Class::F32);
        k.ins(format!("ld.global.nc.f32 {v}, [{a}];"));
        v
    };
    let sum = k.fconst(0.0);
    lane_loop(&mut k, lane64, len, &mut |k, j| {
        let v = load(k, x, j, Some(start));
        k.ins(format!("add.rn.f32 {sum}, {sum}, {v};"));
    });
    warp_all(&mut k, sum, "add.rn.f32");
    let mean = k.op2(Class::F32, "div.rn.f32", sum, fimm(len as f32));
    let sq = k.fconst(0.0);
    lane_loop(&mut k, lane64, len, &mut |k, j| {
        let v = load(k, x, j, Some(start));
        let d = k.op2(Class::F32, "sub.rn.f32", v, mean);
        k.ins(format!("fma.rn.f32 {sq}, {d}, {d}, {sq};"));
    });
    warp_all(&mut k, sq, "add.rn.f32");
    let var = k.op2(Class::F32, "div.rn.f32", sq, fimm(len as f32));
    let ve = k.op2(Class::F32, "add.rn.f32", var, fimm(epsilon));
    let sd = k.op1(Class::F32, "sqrt.rn.f32", ve);
    let inv = k.op2(Class::F32, "div.rn.f32", fimm(1.0), sd);
    lane_loop(&mut k, lane64, len, &mut |k, j| {
        let v = load(k, x, j, Some(start));
        let d = k.op2(Class::F32, "sub.rn.f32", v, mean);
        let nrm = k.op2(Class::F32, "mul.rn.f32", d, inv);
        let s = load(k, scale, j, None);
        let mut o = k.op2(Class::F32, "mul.rn.f32", nrm, s);
        if let Some(bp) = b {
            let bv = load(k, bp, j, None);
            o = k.op2(Class::F32, "add.rn.f32", o, bv);
        }
        let e = k.op2(Class::B64, "add.s64", start, j);
        let a = k.f32_addr(y, e);
        k.ins(format!("st.global.f32 [{a}], {o};"));
    });
    k.ins(format!("add.s64 {row}, {row}, {warps};"));
    k.ins(format!("bra.uni {head};"));
    k.place(&done);
    k.ins("ret;");
    k
}
