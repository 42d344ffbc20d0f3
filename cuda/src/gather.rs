//! Index and type kernels: Gather along any axis with int64 or int32 indices (negative
//! ones counted from the end; an index outside the axis writes 0 and raises the launch's
//! error flag, which the runtime reports naming the node — nothing is read outside the
//! data), and Cast between f32 and the integer types models feed (int64, int32, bool).

use super::ptx::{Class, Kernel};

/// Threads per block.
pub const BLOCK: u32 = 256;

/// Gather's geometry: data viewed as `[outer, axis, inner]`, `indices` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherGeom {
    /// Elements of the dims before the axis.
    pub outer: u64,
    /// The axis's length.
    pub axis: u64,
    /// Elements of the dims after the axis.
    pub inner: u64,
    /// How many indices.
    pub indices: u64,
    /// Whether indices are int64 (else int32).
    pub i64: bool,
}

/// The kernel `name(data, indices, y, err, n)`: `y[o, q, i] = data[o, indices[q], i]`.
pub fn gather(name: &str, g: GatherGeom) -> Kernel {
    let mut k = Kernel::new(name);
    let data = k.ptr_param("data");
    let idx = k.ptr_param("indices");
    let y = k.ptr_param("y");
    let err = k.ptr_param("err");
    let n = k.u64_param("n");
    let lp = k.grid_loop(n);
    let i = lp.i;
    let (bad, store) = (k.label("bad"), k.label("store"));
    let c = k.coords(Class::B64, i, &[g.indices, g.inner]);
    let (outer, q, inner) = (c[0], c[1], c[2]);
    let v = k.reg(Class::B64);
    if g.i64 {
        let off = k.op2(Class::B64, "shl.b64", q, 3);
        let a = k.op2(Class::B64, "add.s64", idx, off);
        k.ins(format!("ld.global.nc.s64 {v}, [{a}];"));
    } else {
        let off = k.op2(Class::B64, "shl.b64", q, 2);
        let a = k.op2(Class::B64, "add.s64", idx, off);
        let r = k.reg(Class::B32);
        k.ins(format!("ld.global.nc.s32 {r}, [{a}];"));
        k.ins(format!("cvt.s64.s32 {v}, {r};"));
    }
    let neg = k.op2(Class::Pred, "setp.lt.s64", v, 0);
    let wrapped = k.op2(Class::B64, "add.s64", v, g.axis);
    k.ins(format!("selp.b64 {v}, {wrapped}, {v}, {neg};"));
    // Still negative, or past the axis: one unsigned comparison.
    let out = k.op2(Class::Pred, "setp.ge.u64", v, g.axis);
    k.ins(format!("@{out} bra {bad};"));
    let row = k.op3(Class::B64, "mad.lo.u64", outer, g.axis, v);
    let src = k.op3(Class::B64, "mad.lo.u64", row, g.inner, inner);
    let a = k.f32_addr(data, src);
    let x = k.reg(Class::F32);
    k.ins(format!("ld.global.nc.f32 {x}, [{a}];"));
    k.ins(format!("bra.uni {store};"));
    k.place(&bad);
    k.ins(format!("st.global.u32 [{err}], 1;"));
    k.ins(format!("mov.f32 {x}, 0f00000000;"));
    k.place(&store);
    let a = k.f32_addr(y, i);
    k.ins(format!("st.global.f32 [{a}], {x};"));
    k.end_grid_loop(lp);
    k
}

/// An element type a Cast kernel reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// f32.
    F32,
    /// int64.
    I64,
    /// int32.
    I32,
    /// bool (one byte, nonzero is true).
    Bool,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl Elem {
    fn bytes(self) -> u32 {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::I64 => 8,
            Elem::Bool => 1,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }
}

/// The kernel `name(x, y, n)` converting `n` elements from `from` to `to` (integers to f32
/// rounding to nearest; f32 to integers truncating as ONNX Cast does, NaN to 0; between
/// integers: sign-extended or truncated to the low bits, as numpy's casts; to bool:
/// nonzero, NaN included; between f32 and f16 / bf16, rounding to nearest even). `None`
/// for pairs it does not convert: f16 and bf16 convert to and from f32 only.
pub fn cast(name: &str, from: Elem, to: Elem) -> Option<Kernel> {
    let mut k = Kernel::new(name);
    let x = k.ptr_param("x");
    let y = k.ptr_param("y");
    let n = k.u64_param("n");
    let lp = k.grid_loop(n);
    let i = lp.i;
    let addr = |k: &mut Kernel, base, e: Elem| {
        let off = k.op2(Class::B64, "mul.lo.u64", i, e.bytes());
        k.op2(Class::B64, "add.s64", base, off)
    };
    let src = addr(&mut k, x, from);
    let dst = addr(&mut k, y, to);
    // Loaded: f32 in a float register, i64 in 64 bits, i32 and bool in 32.
    let (lty, class) = match from {
        Elem::F32 => ("f32", Class::F32),
        Elem::I64 => ("s64", Class::B64),
        Elem::I32 => ("s32", Class::B32),
        Elem::Bool => ("u8", Class::B32),
        Elem::F16 | Elem::Bf16 => ("b16", Class::B16),
    };
    let v = k.reg(class);
    k.ins(format!("ld.global.nc.{lty} {v}, [{src}];"));
    let nonzero = |k: &mut Kernel| match from {
        Elem::F32 => k.op2(Class::Pred, "setp.neu.f32", v, "0f00000000"),
        Elem::I64 => k.op2(Class::Pred, "setp.ne.s64", v, 0),
        Elem::I32 | Elem::Bool | Elem::F16 | Elem::Bf16 => k.op2(Class::Pred, "setp.ne.u32", v, 0),
    };
    let half = |e: Elem| matches!(e, Elem::F16 | Elem::Bf16);
    let (out, sty) = match (from, to) {
        (a, b) if a == b && a != Elem::Bool => (v, lty),
        (Elem::F16, Elem::F32) => (k.op1(Class::F32, "cvt.f32.f16", v), "f32"),
        // A bf16 is the upper half of the f32 it widens to.
        (Elem::Bf16, Elem::F32) => {
            let w = k.op1(Class::B32, "cvt.u32.u16", v);
            let w = k.op2(Class::B32, "shl.b32", w, 16);
            (k.op1(Class::F32, "mov.b32", w), "f32")
        }
        (Elem::F32, Elem::F16) => (k.op1(Class::B16, "cvt.rn.f16.f32", v), "b16"),
        (Elem::F32, Elem::Bf16) => (k.op1(Class::B16, "cvt.rn.bf16.f32", v), "b16"),
        (a, b) if half(a) || half(b) => return None,
        (_, Elem::Bool) | (Elem::Bool, Elem::I32) => {
            let p = nonzero(&mut k);
            (k.op3(Class::B32, "selp.u32", 1, 0, p), if to == Elem::Bool { "u8" } else { "s32" })
        }
        (Elem::Bool, Elem::F32) => {
            let p = nonzero(&mut k);
            (k.op3(Class::F32, "selp.f32", "0f3F800000", "0f00000000", p), "f32")
        }
        (Elem::Bool, Elem::I64) => {
            let p = nonzero(&mut k);
            (k.op3(Class::B64, "selp.u64", 1, 0, p), "s64")
        }
        (Elem::I64, Elem::F32) => (k.op1(Class::F32, "cvt.rn.f32.s64", v), "f32"),
        (Elem::I32, Elem::F32) => (k.op1(Class::F32, "cvt.rn.f32.s32", v), "f32"),
        (Elem::F32, Elem::I64) => (k.op1(Class::B64, "cvt.rzi.s64.f32", v), "s64"),
        (Elem::F32, Elem::I32) => (k.op1(Class::B32, "cvt.rzi.s32.f32", v), "s32"),
        (Elem::I64, Elem::I32) => (k.op1(Class::B32, "cvt.u32.u64", v), "s32"),
        (Elem::I32, Elem::I64) => (k.op1(Class::B64, "cvt.s64.s32", v), "s64"),
        _ => return None,
    };
    k.ins(format!("st.global.{sty} [{dst}], {out};"));
    k.end_grid_loop(lp);
    Some(k)
}
