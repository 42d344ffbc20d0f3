//! f32 math for generated kernels: the algorithms of the Cranelift loops
//! (`codegen::elementwise`) written in PTX — the same range reductions, polynomials and
//! clamps, with fused multiply-adds in the polynomials — so the cuda backend's exp, erf,
//! tanh and sigmoid carry the error bounds the cpu backend states, not those of the
//! hardware's approximate instructions.

use super::ptx::{fimm, Class, Kernel, Reg};

/// `x < c` (false for NaN).
fn lt(k: &mut Kernel, x: Reg, c: f32) -> Reg {
    k.op2(Class::Pred, "setp.lt.f32", x, fimm(c))
}

/// `x < c ? c : x`: a NaN stays NaN (PTX's `max` would drop it).
fn at_least(k: &mut Kernel, x: Reg, c: f32) -> Reg {
    let p = lt(k, x, c);
    k.op3(Class::F32, "selp.f32", fimm(c), x, p)
}

/// `x > c ? c : x`.
fn at_most(k: &mut Kernel, x: Reg, c: f32) -> Reg {
    let p = k.op2(Class::Pred, "setp.gt.f32", x, fimm(c));
    k.op3(Class::F32, "selp.f32", fimm(c), x, p)
}

/// Horner evaluation of `coeffs[0] + x·(coeffs[1] + x·(...))` with fused multiply-adds.
fn poly(k: &mut Kernel, x: Reg, coeffs: &[f32]) -> Reg {
    let mut acc = k.fconst(coeffs[coeffs.len() - 1]);
    for &c in coeffs[..coeffs.len() - 1].iter().rev() {
        acc = k.op3(Class::F32, "fma.rn.f32", acc, x, fimm(c));
    }
    acc
}

/// `magnitude` with the sign of `sign`.
fn copysign(k: &mut Kernel, magnitude: Reg, sign: Reg) -> Reg {
    let m = k.op1(Class::B32, "mov.b32", magnitude);
    let s = k.op1(Class::B32, "mov.b32", sign);
    let m = k.op2(Class::B32, "and.b32", m, "0x7FFFFFFF");
    let s = k.op2(Class::B32, "and.b32", s, "0x80000000");
    let r = k.op2(Class::B32, "or.b32", m, s);
    k.op1(Class::F32, "mov.b32", r)
}

/// e^x: n = round(x·log2 e), r = x − n·ln 2 in two parts, a degree-6 polynomial, 2^n
/// built in the exponent field; 0 below −87.3, clamped at 88.7.
pub fn exp(k: &mut Kernel, x: Reg) -> Reg {
    let under = lt(k, x, -87.3);
    let x = at_least(k, x, -87.3);
    let x = at_most(k, x, 88.7);
    let t = k.op2(Class::F32, "mul.rn.f32", x, fimm(std::f32::consts::LOG2_E));
    let n = k.op1(Class::F32, "cvt.rni.f32.f32", t);
    let a = k.op2(Class::F32, "mul.rn.f32", n, fimm(0.693_145_75));
    let r = k.op2(Class::F32, "sub.rn.f32", x, a);
    let a2 = k.op2(Class::F32, "mul.rn.f32", n, fimm(1.428_606_8e-6));
    let r = k.op2(Class::F32, "sub.rn.f32", r, a2);
    let p = poly(k, r, &[1.0, 1.0, 0.5, 0.166_666_67, 0.041_666_42, 0.008_333_45, 0.001_388_89]);
    // 2^n: n + (1.5·2^23 + 127) holds n + 127 in its low mantissa bits.
    let biased = k.op2(Class::F32, "add.rn.f32", n, fimm(12_583_039.0));
    let e = k.op1(Class::B32, "mov.b32", biased);
    let e = k.op2(Class::B32, "shl.b32", e, 23);
    let scale = k.op1(Class::F32, "mov.b32", e);
    let v = k.op2(Class::F32, "mul.rn.f32", scale, p);
    k.op3(Class::F32, "selp.f32", fimm(0.0), v, under)
}

/// erf as `x·P(x²)/Q(x²)` on [−4, 4] (the rational fit of `aim_kernels::fast::math::erf`),
/// ±1 beyond.
pub fn erf(k: &mut Kernel, x: Reg) -> Reg {
    let a = k.op1(Class::F32, "abs.f32", x);
    let big = k.op2(Class::Pred, "setp.ge.f32", a, fimm(4.0));
    let one = k.fconst(1.0);
    let sat = copysign(k, one, x);
    let x = at_least(k, x, -4.0);
    let x = at_most(k, x, 4.0);
    let x2 = k.op2(Class::F32, "mul.rn.f32", x, x);
    let p = poly(
        k,
        x2,
        &[
            -1.609_603_4e-2,
            -2.954_600_1e-3,
            -7.349_906_3e-4,
            -5.692_506_4e-5,
            -2.101_024e-6,
            2.770_681_4e-8,
            -2.726_142_3e-10,
        ],
    );
    let q = poly(k, x2, &[-1.426_474e-2, -7.373_329_4e-3, -1.682_827e-3, -2.133_740_6e-4, -1.456_607_2e-5]);
    let xp = k.op2(Class::F32, "mul.rn.f32", x, p);
    let r = k.op2(Class::F32, "div.rn.f32", xp, q);
    k.op3(Class::F32, "selp.f32", sat, r, big)
}

/// tanh: an odd polynomial below |x| = 0.3, else `1 − 2/(e^{2|x|} + 1)` with x's sign.
pub fn tanh(k: &mut Kernel, x: Reg) -> Reg {
    let a = k.op1(Class::F32, "abs.f32", x);
    let x2 = k.op2(Class::F32, "mul.rn.f32", x, x);
    let sp = poly(k, x2, &[1.0, -0.333_333_34, 0.133_333_33, -0.053_968_25, 0.021_869_49]);
    let small = k.op2(Class::F32, "mul.rn.f32", x, sp);
    let a2 = k.op2(Class::F32, "add.rn.f32", a, a);
    let e = exp(k, a2);
    let d = k.op2(Class::F32, "add.rn.f32", e, fimm(1.0));
    let q = k.op2(Class::F32, "div.rn.f32", fimm(2.0), d);
    let big = k.op2(Class::F32, "sub.rn.f32", fimm(1.0), q);
    let big = copysign(k, big, x);
    let c = lt(k, a, 0.3);
    k.op3(Class::F32, "selp.f32", small, big, c)
}

/// 1 / (1 + e^−x).
pub fn sigmoid(k: &mut Kernel, x: Reg) -> Reg {
    let nx = k.op1(Class::F32, "neg.f32", x);
    let e = exp(k, nx);
    let d = k.op2(Class::F32, "add.rn.f32", e, fimm(1.0));
    k.op2(Class::F32, "div.rn.f32", fimm(1.0), d)
}
