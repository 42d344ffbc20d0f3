//! `aim:Softmax` — `softmax(x · scale + mask)` over the last axis — as PTX: one warp per
//! row (grid-stride over rows); a pass for the row's maximum, one writing `e^(v − max)`
//! and summing it, one scaling by the sum's reciprocal. The mask row of each x row is
//! found from the broadcast strides, baked in as constants.

use super::math;
use super::ptx::{fimm, Class, Kernel, Reg};
use super::reduce::{lane_loop, warp_all, warp_ids};

/// Threads per block (8 warps).
pub const BLOCK: u32 = 256;

/// How the mask broadcasts over x's rows: for each leading dim of x (outermost first),
/// its size and the mask's element stride along it (0 where the mask's dim is 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaskRows {
    /// `(dim, mask stride)` per leading dim of x.
    pub dims: Vec<(u32, u64)>,
}

impl MaskRows {
    /// The mapping for x of `x_shape` and a mask of `mask_shape` (aligned from the right;
    /// its last dim is x's).
    pub fn new(x_shape: &[usize], mask_shape: &[usize]) -> MaskRows {
        let r = x_shape.len();
        let pad = r - mask_shape.len();
        let m: Vec<usize> = std::iter::repeat_n(1, pad).chain(mask_shape.iter().copied()).collect();
        let mut strides = vec![0u64; r];
        let mut s = 1u64;
        for d in (0..r).rev() {
            strides[d] = if m[d] == 1 { 0 } else { s };
            s *= m[d] as u64;
        }
        MaskRows { dims: (0..r - 1).map(|d| (x_shape[d] as u32, strides[d])).collect() }
    }
}

/// The kernel `name(x, y[, mask])` for `rows` rows of `len`, a row's elements `inner`
/// apart (1: the last axis; a softmax over an inner axis of `[outer, len, inner]` has
/// `outer · inner` rows). A mask needs `inner` = 1. `log`: LogSoftmax, `v − max − ln Σ`,
/// with the logarithm from `lg2.approx` (absolute error below 2⁻²² on the sum, which is
/// at least 1).
pub fn kernel(name: &str, rows: u64, len: u64, inner: u64, scale: f32, mask: Option<&MaskRows>, log: bool) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.ptr_param("x");
    let y = k.ptr_param("y");
    let m = mask.map(|_| k.ptr_param("mask"));
    let (row, lane, warps) = warp_ids(&mut k);
    let lane64 = k.op1(Class::B64, "cvt.u64.u32", lane);
    let (head, done) = (k.label("row"), k.label("done"));
    k.place(&head);
    let past = k.op2(Class::Pred, "setp.ge.u64", row, rows);
    k.ins(format!("@{past} bra {done};"));
    let start = if inner == 1 {
        k.op2(Class::B64, "mul.lo.u64", row, len)
    } else {
        let o = k.op2(Class::B64, "div.u64", row, inner);
        let i = k.op2(Class::B64, "rem.u64", row, inner);
        let o = k.op2(Class::B64, "mul.lo.u64", o, len * inner);
        k.op2(Class::B64, "add.s64", o, i)
    };
    // Element j of the row.
    let elem = move |k: &mut Kernel, j: Reg| -> Reg {
        if inner == 1 {
            k.op2(Class::B64, "add.s64", start, j)
        } else {
            k.op3(Class::B64, "mad.lo.u64", j, inner, start)
        }
    };
    // The mask row: Σ coord_d · stride_d over x's leading dims.
    let mrow = match (mask, m) {
        (Some(mr), Some(_)) => {
            let moff = k.op1(Class::B64, "mov.u64", 0);
            let rest = k.op1(Class::B64, "mov.u64", row);
            for &(dim, stride) in mr.dims.iter().rev() {
                let c = k.op2(Class::B64, "rem.u64", rest, dim);
                k.ins(format!("div.u64 {rest}, {rest}, {dim};"));
                if stride != 0 {
                    k.ins(format!("mad.lo.u64 {moff}, {c}, {stride}, {moff};"));
                }
            }
            Some(moff)
        }
        _ => None,
    };
    let value = |k: &mut Kernel, j: Reg| -> Reg {
        let e = elem(k, j);
        let a = k.f32_addr(x, e);
        let v = k.reg(Class::F32);
        k.ins(format!("ld.global.nc.f32 {v}, [{a}];"));
        let v = k.op2(Class::F32, "mul.rn.f32", v, fimm(scale));
        match (mrow, m) {
            (Some(moff), Some(mp)) => {
                let me = k.op2(Class::B64, "add.s64", moff, j);
                let ma = k.f32_addr(mp, me);
                let mv = k.reg(Class::F32);
                k.ins(format!("ld.global.nc.f32 {mv}, [{ma}];"));
                k.op2(Class::F32, "add.rn.f32", v, mv)
            }
            _ => v,
        }
    };
    let max = k.fconst(f32::NEG_INFINITY);
    lane_loop(&mut k, lane64, len, &mut |k, j| {
        let v = value(k, j);
        k.ins(format!("max.NaN.f32 {max}, {max}, {v};"));
    });
    warp_all(&mut k, max, "max.NaN.f32");
    let sum = k.fconst(0.0);
    lane_loop(&mut k, lane64, len, &mut |k, j| {
        let v = value(k, j);
        let d = k.op2(Class::F32, "sub.rn.f32", v, max);
        let e = math::exp(k, d);
        k.ins(format!("add.rn.f32 {sum}, {sum}, {e};"));
        if !log {
            let o = elem(k, j);
            let a = k.f32_addr(y, o);
            k.ins(format!("st.global.f32 [{a}], {e};"));
        }
    });
    warp_all(&mut k, sum, "add.rn.f32");
    if log {
        // ln Σ = log2 Σ · ln 2; the row's outputs are v − (max + ln Σ).
        let l2 = k.op1(Class::F32, "lg2.approx.f32", sum);
        let ln = k.op2(Class::F32, "mul.rn.f32", l2, fimm(std::f32::consts::LN_2));
        lane_loop(&mut k, lane64, len, &mut |k, j| {
            let v = value(k, j);
            let d = k.op2(Class::F32, "sub.rn.f32", v, max);
            let r = k.op2(Class::F32, "sub.rn.f32", d, ln);
            let o = elem(k, j);
            let a = k.f32_addr(y, o);
            k.ins(format!("st.global.f32 [{a}], {r};"));
        });
    } else {
        let inv = k.op2(Class::F32, "div.rn.f32", fimm(1.0), sum);
        lane_loop(&mut k, lane64, len, &mut |k, j| {
            let o = elem(k, j);
            let a = k.f32_addr(y, o);
            let v = k.reg(Class::F32);
            k.ins(format!("ld.global.f32 {v}, [{a}];"));
            let v = k.op2(Class::F32, "mul.rn.f32", v, inv);
            k.ins(format!("st.global.f32 [{a}], {v};"));
        });
    }
    k.ins(format!("add.s64 {row}, {row}, {warps};"));
    k.ins(format!("bra.uni {head};"));
    k.place(&done);
    k.ins("ret;");
    k
}
