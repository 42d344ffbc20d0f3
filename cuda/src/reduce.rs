//! Row reductions (`aim:Reduce`: sum, mean, max, min over trailing axes) as PTX: one warp
//! per row, each lane striding over the row, then a butterfly of `shfl.sync` combining
//! the 32 partial results; rows are spread grid-stride over the warps. Max and min
//! propagate NaN as the cpu backend does.

use super::ptx::{Class, Kernel, Reg};
use aim_compiler::codegen::ReduceMode;

/// Threads per block (8 warps, 8 rows at a time).
pub const BLOCK: u32 = 256;

/// The identity and the combining instruction of `mode`.
fn combine(mode: ReduceMode) -> (f32, &'static str) {
    match mode {
        ReduceMode::Sum | ReduceMode::Mean => (0.0, "add.rn.f32"),
        ReduceMode::Max => (f32::NEG_INFINITY, "max.NaN.f32"),
        ReduceMode::Min => (f32::INFINITY, "min.NaN.f32"),
    }
}

/// The warp and lane of this thread, and the grid's warp count: `(warp, lane, warps)`.
pub(super) fn warp_ids(k: &mut Kernel) -> (Reg, Reg, Reg) {
    let (i, total) = k.global_index();
    let warp = k.op2(Class::B64, "shr.u64", i, 5);
    let warps = k.op2(Class::B64, "shr.u64", total, 5);
    let tid = k.op1(Class::B32, "mov.u32", "%tid.x");
    let lane = k.op2(Class::B32, "and.b32", tid, 31);
    (warp, lane, warps)
}

/// Combines `v` across the warp with `op` (every lane ends with the result).
pub(super) fn warp_all(k: &mut Kernel, v: Reg, op: &str) {
    for s in [16, 8, 4, 2, 1] {
        let o = k.reg(Class::F32);
        k.ins(format!("shfl.sync.bfly.b32 {o}, {v}, {s}, 31, -1;"));
        k.ins(format!("{op} {v}, {v}, {o};"));
    }
}

/// Emits the loop `for j in lane..len step 32 { body(j) }`.
pub(super) fn lane_loop(k: &mut Kernel, lane64: Reg, len: u64, body: &mut dyn FnMut(&mut Kernel, Reg)) {
    let j = k.reg(Class::B64);
    k.ins(format!("mov.u64 {j}, {lane64};"));
    let (head, end) = (k.label("col"), k.label("cols_done"));
    k.place(&head);
    let past = k.op2(Class::Pred, "setp.ge.u64", j, len);
    k.ins(format!("@{past} bra {end};"));
    body(k, j);
    k.ins(format!("add.s64 {j}, {j}, 32;"));
    k.ins(format!("bra.uni {head};"));
    k.place(&end);
}

/// The kernel `name(x, y, rows, len)`: `y[r] = reduce(x[r·len .. (r+1)·len])`.
pub fn kernel(name: &str, mode: ReduceMode) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.ptr_param("x");
    let y = k.ptr_param("y");
    let rows = k.u64_param("rows");
    let len = k.u64_param("len");
    let (row, lane, warps) = warp_ids(&mut k);
    let lane64 = k.op1(Class::B64, "cvt.u64.u32", lane);
    let (identity, op) = combine(mode);
    let (head, done) = (k.label("row"), k.label("done"));
    k.place(&head);
    let past = k.op2(Class::Pred, "setp.ge.u64", row, rows);
    k.ins(format!("@{past} bra {done};"));
    let start = k.op2(Class::B64, "mul.lo.u64", row, len);
    let acc = k.fconst(identity);
    let j = k.reg(Class::B64);
    k.ins(format!("mov.u64 {j}, {lane64};"));
    let (inner, inner_done) = (k.label("elem"), k.label("row_end"));
    k.place(&inner);
    let end = k.op2(Class::Pred, "setp.ge.u64", j, len);
    k.ins(format!("@{end} bra {inner_done};"));
    let e = k.op2(Class::B64, "add.s64", start, j);
    let a = k.f32_addr(x, e);
    let v = k.reg(Class::F32);
    k.ins(format!("ld.global.nc.f32 {v}, [{a}];"));
    k.ins(format!("{op} {acc}, {acc}, {v};"));
    k.ins(format!("add.s64 {j}, {j}, 32;"));
    k.ins(format!("bra.uni {inner};"));
    k.place(&inner_done);
    warp_all(&mut k, acc, op);
    if mode == ReduceMode::Mean {
        let n = k.op1(Class::F32, "cvt.rn.f32.u64", len);
        k.ins(format!("div.rn.f32 {acc}, {acc}, {n};"));
    }
    let first = k.op2(Class::Pred, "setp.eq.u32", lane, 0);
    let out = k.f32_addr(y, row);
    k.ins(format!("@{first} st.global.f32 [{out}], {acc};"));
    k.ins(format!("add.s64 {row}, {row}, {warps};"));
    k.ins(format!("bra.uni {head};"));
    k.place(&done);
    k.ins("ret;");
    k
}

/// The kernel `name(x, y)` reducing the middle axis of `x` viewed as `[outer, len, inner]`
/// (a reduction over axes that are not the last ones, such as a mean over the height of
/// a feature map): one thread per output element, reading `len` elements `inner` apart, so
/// neighbouring threads read neighbouring addresses. Sums run in order, as the reference
/// kernel's do.
pub fn columns(name: &str, mode: ReduceMode, outer: u64, len: u64, inner: u64) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.ptr_param("x");
    let y = k.ptr_param("y");
    let lp = k.grid_loop(outer * inner);
    let i = lp.i;
    let o = k.op2(Class::B64, "div.u64", i, inner);
    let c = k.op2(Class::B64, "rem.u64", i, inner);
    let e = k.op3(Class::B64, "mad.lo.u64", o, len * inner, c);
    let (identity, op) = combine(mode);
    let acc = k.fconst(identity);
    let j = k.op1(Class::B64, "mov.u64", 0);
    let (head, end) = (k.label("elem"), k.label("elems_done"));
    k.place(&head);
    let past = k.op2(Class::Pred, "setp.ge.u64", j, len);
    k.ins(format!("@{past} bra {end};"));
    let a = k.f32_addr(x, e);
    let v = k.reg(Class::F32);
    k.ins(format!("ld.global.nc.f32 {v}, [{a}];"));
    k.ins(format!("{op} {acc}, {acc}, {v};"));
    k.ins(format!("add.s64 {e}, {e}, {inner};"));
    k.ins(format!("add.s64 {j}, {j}, 1;"));
    k.ins(format!("bra.uni {head};"));
    k.place(&end);
    if mode == ReduceMode::Mean {
        let n = k.fconst(len as f32);
        k.ins(format!("div.rn.f32 {acc}, {acc}, {n};"));
    }
    let out = k.f32_addr(y, i);
    k.ins(format!("st.global.f32 [{out}], {acc};"));
    k.end_grid_loop(lp);
    k
}
