//! Elementwise kernels over strided inputs: each output element's coordinates are taken
//! apart (divisions by the output dims, constants in the code) and every input is read at
//! its own strides — 0 along broadcast dims, permuted for a transpose — then an
//! elementwise program combines the values. One generator covers broadcasting binary ops
//! (Add, Mul, ... with numpy broadcasting), Transpose, Expand and plain copies.

use super::elementwise::program;
use super::ptx::{Class, Kernel, Reg};
use aim_compiler::ewprog::Inst;

/// Threads per block.
pub const BLOCK: u32 = 256;

/// The element strides of an input of `shape` read at output coordinates of `out`
/// (aligned from the right; 0 where the input's dim is 1 or missing), or `None` when the
/// shapes do not broadcast.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Option<Vec<u64>> {
    if shape.len() > out.len() {
        return None;
    }
    let pad = out.len() - shape.len();
    let mut strides = vec![0u64; out.len()];
    let mut s = 1u64;
    for d in (0..shape.len()).rev() {
        let (dim, o) = (shape[d], out[pad + d]);
        if dim == o {
            strides[pad + d] = if dim == 1 { 0 } else { s };
        } else if dim != 1 {
            return None;
        }
        s *= dim as u64;
    }
    Some(strides)
}

/// The strides of an input of `shape` read through the permutation `perm`
/// (`out[d] = in[perm[d]]`).
pub fn transpose_strides(shape: &[usize], perm: &[usize]) -> Vec<u64> {
    let mut own = vec![0u64; shape.len()];
    let mut s = 1u64;
    for d in (0..shape.len()).rev() {
        own[d] = s;
        s *= shape[d] as u64;
    }
    perm.iter().map(|&p| own[p]).collect()
}

/// The row-major strides of `shape`.
pub fn contiguous(shape: &[usize]) -> Vec<u64> {
    transpose_strides(shape, &(0..shape.len()).collect::<Vec<_>>())
}

/// The kernel `name(y, x0, .., n)`: for each of the `n` elements of an output of shape
/// `out`, loads input j at `Σ coord_d · strides[j][d]` and stores `program(loads)`.
/// Element indices are 64-bit.
pub fn kernel(name: &str, out: &[usize], strides: &[Vec<u64>], prog: &[Inst]) -> Kernel {
    let bases = vec![0; strides.len()];
    mapped(name, out, strides, &bases, &contiguous(out), 0, prog)
}

/// As [`kernel`] over the index space `dims`, with input j read from element `bases[j]`
/// on and the result stored at `y_base + Σ coord_d · y_strides[d]`: a slice of a larger
/// output (Concat) or of a larger input (Split, Slice).
pub fn mapped(
    name: &str,
    out: &[usize],
    strides: &[Vec<u64>],
    bases: &[u64],
    y_strides: &[u64],
    y_base: u64,
    prog: &[Inst],
) -> Kernel {
    let mut k = Kernel::new(name);
    let y = k.ptr_param("y");
    let xs: Vec<Reg> = (0..strides.len()).map(|j| k.ptr_param(&format!("x{j}"))).collect();
    let n = k.u64_param("n");
    let lp = k.grid_loop(n);
    let i = lp.i;
    let offs: Vec<Reg> = bases.iter().map(|&b| k.op1(Class::B64, "mov.u64", b)).collect();
    // A whole, row-major output is stored at the loop index itself.
    let whole = y_base == 0 && y_strides == contiguous(out).as_slice();
    let yoff = if whole { i } else { k.op1(Class::B64, "mov.u64", y_base) };
    let y_strides: Vec<u64> = if whole { vec![0; out.len()] } else { y_strides.to_vec() };
    let rest = k.op1(Class::B64, "mov.u64", i);
    for d in (0..out.len()).rev() {
        if (strides.iter().all(|s| s[d] == 0) && y_strides[d] == 0) || out[d] == 1 {
            if d > 0 {
                k.ins(format!("div.u64 {rest}, {rest}, {};", out[d]));
            }
            continue;
        }
        let c = if d > 0 { k.op2(Class::B64, "rem.u64", rest, out[d]) } else { rest };
        for (j, s) in strides.iter().enumerate() {
            if s[d] != 0 {
                k.ins(format!("mad.lo.u64 {o}, {c}, {}, {o};", s[d], o = offs[j]));
            }
        }
        if y_strides[d] != 0 {
            k.ins(format!("mad.lo.u64 {yoff}, {c}, {}, {yoff};", y_strides[d]));
        }
        if d > 0 {
            k.ins(format!("div.u64 {rest}, {rest}, {};", out[d]));
        }
    }
    let vals: Vec<Reg> = xs
        .iter()
        .zip(&offs)
        .map(|(&x, &o)| {
            let a = k.f32_addr(x, o);
            let v = k.reg(Class::F32);
            k.ins(format!("ld.global.nc.f32 {v}, [{a}];"));
            v
        })
        .collect();
    let v = program(&mut k, prog, &vals);
    let a = k.f32_addr(y, yoff);
    k.ins(format!("st.global.f32 [{a}], {v};"));
    k.end_grid_loop(lp);
    k
}

/// The kernel `name(y, cond, a, b, n)`: `y = cond ? a : b` (ONNX Where) over an output of
/// shape `out`, `cond` bytes (bool) and `a`, `b` f32, each read at its own broadcast
/// strides.
pub fn select(name: &str, out: &[usize], strides: &[Vec<u64>; 3]) -> Kernel {
    let mut k = Kernel::new(name);
    let y = k.ptr_param("y");
    let ptrs: Vec<Reg> = ["cond", "a", "b"].iter().map(|p| k.ptr_param(p)).collect();
    let n = k.u64_param("n");
    let lp = k.grid_loop(n);
    let i = lp.i;
    let offs = offsets(&mut k, i, out, strides);
    let ca = k.op2(Class::B64, "add.s64", ptrs[0], offs[0]);
    let cv = k.reg(Class::B32);
    k.ins(format!("ld.global.nc.u8 {cv}, [{ca}];"));
    let pa = k.f32_addr(ptrs[1], offs[1]);
    let pb = k.f32_addr(ptrs[2], offs[2]);
    let (va, vb) = (k.reg(Class::F32), k.reg(Class::F32));
    k.ins(format!("ld.global.nc.f32 {va}, [{pa}];"));
    k.ins(format!("ld.global.nc.f32 {vb}, [{pb}];"));
    let p = k.op2(Class::Pred, "setp.ne.u32", cv, 0);
    let v = k.op3(Class::F32, "selp.f32", va, vb, p);
    let a = k.f32_addr(y, i);
    k.ins(format!("st.global.f32 [{a}], {v};"));
    k.end_grid_loop(lp);
    k
}

/// Each input's element offset for output element `i` of an output of shape `out`: the
/// element's coordinates taken apart by divisions, times the input's `strides`.
fn offsets(k: &mut Kernel, i: Reg, out: &[usize], strides: &[Vec<u64>]) -> Vec<Reg> {
    let offs: Vec<Reg> = strides.iter().map(|_| k.op1(Class::B64, "mov.u64", 0)).collect();
    let rest = k.op1(Class::B64, "mov.u64", i);
    for d in (0..out.len()).rev() {
        let used = strides.iter().any(|s| s[d] != 0) && out[d] != 1;
        if used {
            let c = if d > 0 { k.op2(Class::B64, "rem.u64", rest, out[d]) } else { rest };
            for (j, s) in strides.iter().enumerate() {
                if s[d] != 0 {
                    k.ins(format!("mad.lo.u64 {o}, {c}, {}, {o};", s[d], o = offs[j]));
                }
            }
        }
        if d > 0 {
            k.ins(format!("div.u64 {rest}, {rest}, {};", out[d]));
        }
    }
    offs
}

/// The element type a comparison reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operands {
    /// f32 (ordered comparisons: NaN compares false).
    F32,
    /// Signed 64-bit integers.
    I64,
    /// Signed 32-bit integers.
    I32,
    /// Bytes of bool.
    Bool,
}

impl Operands {
    /// The load's type, the register class and the bytes of one element.
    fn load(self) -> (&'static str, Class, u32) {
        match self {
            Operands::F32 => ("f32", Class::F32, 2),
            Operands::I64 => ("s64", Class::B64, 3),
            Operands::I32 => ("s32", Class::B32, 2),
            Operands::Bool => ("u8", Class::B32, 0),
        }
    }
}

/// The kernel `name(y, a, b, n)`: `y = a <cmp> b` as bool bytes (ONNX Equal, Less, ...),
/// over an output of shape `out`, `a` and `b` read at their own broadcast strides. `cmp` is
/// a `setp` comparison: `eq`, `lt`, `le`, `gt` or `ge`.
pub fn compare(name: &str, out: &[usize], strides: &[Vec<u64>; 2], cmp: &str, ty: Operands) -> Kernel {
    let mut k = Kernel::new(name);
    let y = k.ptr_param("y");
    let ptrs = [k.ptr_param("a"), k.ptr_param("b")];
    let n = k.u64_param("n");
    let lp = k.grid_loop(n);
    let i = lp.i;
    let offs = offsets(&mut k, i, out, strides);
    let (lty, class, shift) = ty.load();
    let cty = if ty == Operands::Bool { "u32" } else { lty };
    let vals: Vec<Reg> = ptrs
        .iter()
        .zip(&offs)
        .map(|(&p, &o)| {
            let b = k.op2(Class::B64, "shl.b64", o, shift);
            let a = k.op2(Class::B64, "add.s64", p, b);
            let v = k.reg(class);
            k.ins(format!("ld.global.nc.{lty} {v}, [{a}];"));
            v
        })
        .collect();
    let p = k.op2(Class::Pred, &format!("setp.{cmp}.{cty}"), vals[0], vals[1]);
    let r = k.op3(Class::B32, "selp.u32", 1, 0, p);
    let a = k.op2(Class::B64, "add.s64", y, i);
    k.ins(format!("st.global.u8 [{a}], {r};"));
    k.end_grid_loop(lp);
    k
}
