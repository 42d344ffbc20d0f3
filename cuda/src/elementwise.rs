//! Fused elementwise chains (`aim:Elementwise`) as PTX: one grid-stride loop over the
//! elements, each thread loading its element of every input through the read-only path,
//! running the node's program in registers, and storing one result. Every operation
//! rounds as written (`.rn`: no contraction ptxas could choose differently from the
//! interpreter), and max/min propagate NaN (`.NaN`), as the cpu backend's loops do.

use super::math;
use super::ptx::{fimm, Class, Kernel, Reg};
use aim_compiler::ewprog::{Binary, Inst, Operand, Unary};

/// Threads per block of the elementwise kernels.
pub const BLOCK: u32 = 256;

/// The kernel `name(y, x0, .., x{n-1}, n)`: `y[i] = program(x0[i], ..)` for `i < n`.
pub fn kernel(name: &str, prog: &[Inst], n_inputs: usize) -> Kernel {
    let mut k = Kernel::new(name);
    let y = k.ptr_param("y");
    let xs: Vec<Reg> = (0..n_inputs).map(|j| k.ptr_param(&format!("x{j}"))).collect();
    let n = k.u64_param("n");
    let lp = k.grid_loop(n);
    let i = lp.i;
    let off = k.op2(Class::B64, "shl.b64", i, 2);
    let ins: Vec<Reg> = xs
        .iter()
        .map(|&x| {
            let a = k.op2(Class::B64, "add.s64", x, off);
            let v = k.reg(Class::F32);
            k.ins(format!("ld.global.nc.f32 {v}, [{a}];"));
            v
        })
        .collect();
    let v = program(&mut k, prog, &ins);
    let a = k.op2(Class::B64, "add.s64", y, off);
    k.ins(format!("st.global.f32 [{a}], {v};"));
    k.end_grid_loop(lp);
    k
}

/// Emits `prog` over the loaded `inputs`; returns the register of its result.
pub fn program(k: &mut Kernel, prog: &[Inst], inputs: &[Reg]) -> Reg {
    let mut vals: Vec<Reg> = Vec::with_capacity(prog.len());
    let opnd = |vals: &[Reg], o: Operand| match o {
        Operand::Ref(i) => vals[i].to_string(),
        Operand::Const(c) => fimm(c),
    };
    for inst in prog {
        let v = match *inst {
            Inst::Input(j) => inputs[j],
            Inst::Unary(u, a) => {
                let a = match a {
                    Operand::Ref(i) => vals[i],
                    Operand::Const(c) => k.fconst(c),
                };
                match u {
                    Unary::Neg => k.op1(Class::F32, "neg.f32", a),
                    Unary::Abs => k.op1(Class::F32, "abs.f32", a),
                    Unary::Sqrt => k.op1(Class::F32, "sqrt.rn.f32", a),
                    Unary::Relu => k.op2(Class::F32, "max.NaN.f32", a, fimm(0.0)),
                    Unary::Exp => math::exp(k, a),
                    Unary::Erf => math::erf(k, a),
                    Unary::Tanh => math::tanh(k, a),
                    Unary::Sigmoid => math::sigmoid(k, a),
                    Unary::Reciprocal => k.op2(Class::F32, "div.rn.f32", fimm(1.0), a),
                    Unary::Round => k.op1(Class::F32, "cvt.rni.f32.f32", a),
                }
            }
            Inst::Binary(op, x, y) => {
                let (x, y) = (opnd(&vals, x), opnd(&vals, y));
                let name = match op {
                    Binary::Add => "add.rn.f32",
                    Binary::Sub => "sub.rn.f32",
                    Binary::Mul => "mul.rn.f32",
                    Binary::Div => "div.rn.f32",
                    Binary::Max => "max.NaN.f32",
                    Binary::Min => "min.NaN.f32",
                };
                k.op2(Class::F32, name, x, y)
            }
            Inst::Clip(a, lo, hi) => {
                let a = opnd(&vals, a);
                let below = k.op2(Class::Pred, "setp.lt.f32", &a, fimm(lo));
                let m = k.op3(Class::F32, "selp.f32", fimm(lo), &a, below);
                let above = k.op2(Class::Pred, "setp.gt.f32", m, fimm(hi));
                k.op3(Class::F32, "selp.f32", fimm(hi), m, above)
            }
            Inst::LeakyRelu(a, alpha) => {
                let a = opnd(&vals, a);
                let scaled = k.op2(Class::F32, "mul.rn.f32", &a, fimm(alpha));
                let neg = k.op2(Class::Pred, "setp.lt.f32", &a, fimm(0.0));
                k.op3(Class::F32, "selp.f32", scaled, &a, neg)
            }
        };
        vals.push(v);
    }
    *vals.last().expect("programs are not empty")
}
