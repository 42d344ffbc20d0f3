//! Fused elementwise loops: an `aim:Elementwise` program becomes
//! `fn(inputs: *const *const f32, out: *mut f32, start: usize, end: usize)`, computing
//! `out[i] = program(inputs[0][i], ...)` for `start <= i < end`: four lanes at a time in
//! f32x4 vectors (Cranelift's SIMD width on x86-64), then one at a time for the tail. exp,
//! erf, tanh and sigmoid use the same approximations as `aim_kernels::fast::math`, whose
//! errors are stated and tested there; the generated code is tested against them.

use super::CodegenError;
use crate::ewprog::{Binary, Inst, Operand, Unary};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, Function, InstBuilder, MemFlagsData, Type, Value};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Module};

/// Emits the program for one element type (F32 for the tail, F32X4 for the body).
struct Emit<'a, 'b> {
    b: &'a mut FunctionBuilder<'b>,
    ty: Type,
    /// Flags of the bitcasts (native endianness).
    cast: MemFlagsData,
    /// Whether polynomial steps are fused multiply-adds (targets with FMA: the bits
    /// `aim_kernels::fast::math`'s `FMA = true` forms, and ONNX Runtime's MLAS, give there).
    fma: bool,
}

impl Emit<'_, '_> {
    fn ity(&self) -> Type {
        if self.ty == types::F32X4 {
            types::I32X4
        } else {
            types::I32
        }
    }

    fn f(&mut self, c: f32) -> Value {
        let s = self.b.ins().f32const(c);
        if self.ty == types::F32X4 {
            self.b.ins().splat(types::F32X4, s)
        } else {
            s
        }
    }

    fn i(&mut self, c: i32) -> Value {
        let s = self.b.ins().iconst(types::I32, c as i64);
        if self.ty == types::F32X4 {
            self.b.ins().splat(types::I32X4, s)
        } else {
            s
        }
    }

    fn bits(&mut self, v: Value) -> Value {
        let ity = self.ity();
        let c = self.cast;
        self.b.ins().bitcast(ity, c, v)
    }

    fn float(&mut self, v: Value) -> Value {
        let ty = self.ty;
        let c = self.cast;
        self.b.ins().bitcast(ty, c, v)
    }

    /// `cond ? a : b` for a float comparison result.
    fn select(&mut self, cond: Value, a: Value, b: Value) -> Value {
        if self.ty == types::F32X4 {
            let mask = self.float(cond);
            self.b.ins().bitselect(mask, a, b)
        } else {
            self.b.ins().select(cond, a, b)
        }
    }

    fn lt(&mut self, x: Value, c: f32) -> Value {
        let k = self.f(c);
        self.b.ins().fcmp(FloatCC::LessThan, x, k)
    }

    fn ge(&mut self, x: Value, c: f32) -> Value {
        let k = self.f(c);
        self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, x, k)
    }

    /// Horner evaluation of `coeffs[0] + x·(coeffs[1] + x·(...))`, each step one fused
    /// multiply-add where the target has them.
    fn poly(&mut self, x: Value, coeffs: &[f32]) -> Value {
        let mut acc = self.f(coeffs[coeffs.len() - 1]);
        for &c in coeffs[..coeffs.len() - 1].iter().rev() {
            let k = self.f(c);
            acc = if self.fma {
                self.b.ins().fma(acc, x, k)
            } else {
                let m = self.b.ins().fmul(acc, x);
                self.b.ins().fadd(m, k)
            };
        }
        acc
    }

    /// `magnitude` with the sign of `sign`.
    fn copysign(&mut self, magnitude: Value, sign: Value) -> Value {
        let (m, s) = (self.bits(magnitude), self.bits(sign));
        let (keep, sbit) = (self.i(0x7fff_ffff), self.i(i32::MIN));
        let m = self.b.ins().band(m, keep);
        let s = self.b.ins().band(s, sbit);
        let r = self.b.ins().bor(m, s);
        self.float(r)
    }

    /// `x < c ? c : x` (cheaper than `fmax`, whose NaN and ±0 rules cost extra code; a NaN
    /// input stays NaN).
    fn at_least(&mut self, x: Value, c: f32) -> Value {
        let k = self.f(c);
        let below = self.b.ins().fcmp(FloatCC::LessThan, x, k);
        self.select(below, k, x)
    }

    /// `x > c ? c : x`.
    fn at_most(&mut self, x: Value, c: f32) -> Value {
        let k = self.f(c);
        let above = self.b.ins().fcmp(FloatCC::GreaterThan, x, k);
        self.select(above, k, x)
    }

    fn exp(&mut self, x: Value) -> Value {
        let under = self.lt(x, -87.3);
        let x = self.at_least(x, -87.3);
        let x = self.at_most(x, 88.7);
        let l2e = self.f(std::f32::consts::LOG2_E);
        let t = self.b.ins().fmul(x, l2e);
        let n = self.b.ins().nearest(t);
        let (c1, c2) = (self.f(0.693_145_75), self.f(1.428_606_8e-6));
        let a = self.b.ins().fmul(n, c1);
        let r = self.b.ins().fsub(x, a);
        let a2 = self.b.ins().fmul(n, c2);
        let r = self.b.ins().fsub(r, a2);
        let p = self.poly(r, &[1.0, 1.0, 0.5, 0.166_666_67, 0.041_666_42, 0.008_333_45, 0.001_388_89]);
        // 2^n without a float-to-int conversion: n + (1.5·2^23 + 127) holds n + 127 in its
        // low mantissa bits; shifting them into the exponent field drops everything else.
        let magic = self.f(12_583_039.0);
        let biased = self.b.ins().fadd(n, magic);
        let e = self.bits(biased);
        let e = self.b.ins().ishl_imm_u(e, 23);
        let scale = self.float(e);
        let v = self.b.ins().fmul(scale, p);
        let zero = self.f(0.0);
        self.select(under, zero, v)
    }

    /// erf as `x·P(x²)/Q(x²)` on [−4, 4], the rational fit of `aim_kernels::fast::math::erf`.
    fn erf(&mut self, x: Value) -> Value {
        // ±1 exactly past ±4, as `aim_kernels::fast::math::erf` (what f32 rounds erf to there).
        let a = self.b.ins().fabs(x);
        let big = self.ge(a, 4.0);
        let one = self.f(1.0);
        let sat = self.copysign(one, x);
        let x = self.at_least(x, -4.0);
        let x = self.at_most(x, 4.0);
        let x2 = self.b.ins().fmul(x, x);
        let p = self.poly(
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
        let q = self.poly(x2, &[-1.426_474e-2, -7.373_329_4e-3, -1.682_827e-3, -2.133_740_6e-4, -1.456_607_2e-5]);
        let xp = self.b.ins().fmul(x, p);
        let r = self.b.ins().fdiv(xp, q);
        self.select(big, sat, r)
    }

    /// tanh as `c·P(c²)/Q(c²)` with c = x clamped to ±9, kept within [−1, 1]: the rational fit of
    /// `aim_kernels::fast::math::tanh`, operation for operation, so that a program gives
    /// the same bits here as at the full vector width.
    fn tanh(&mut self, x: Value) -> Value {
        let c = self.at_least(x, -9.0);
        let c = self.at_most(c, 9.0);
        let x2 = self.b.ins().fmul(c, c);
        let p = self.poly(
            x2,
            &[
                4.893_524_6e-3,
                6.372_619_3e-4,
                1.485_722_35e-5,
                5.122_297_3e-8,
                -8.604_672e-11,
                2.000_188e-13,
                -2.760_768_4e-16,
            ],
        );
        let q = self.poly(x2, &[4.893_525e-3, 2.268_434_7e-3, 1.185_347_1e-4, 1.198_258_4e-6]);
        let cp = self.b.ins().fmul(c, p);
        let r = self.b.ins().fdiv(cp, q);
        let r = self.at_least(r, -1.0);
        self.at_most(r, 1.0)
    }

    /// The logistic function as `0.5 + v·P(v²)/Q(v²)` with v = x clamped to ±18, clamped to
    /// [0, 1]: the rational fit of `aim_kernels::fast::math::sigmoid`, operation for operation.
    fn sigmoid(&mut self, x: Value) -> Value {
        let v = self.at_least(x, -18.0);
        let v = self.at_most(v, 18.0);
        let v2 = self.b.ins().fmul(v, v);
        let p = self.poly(v2, &[2.482_879_5e-1, 8.513_771e-3, 6.085_749e-5, 1.156_273_2e-7, 4.370_31e-11]);
        let q = self
            .poly(v2, &[9.931_519e-1, 1.168_176_5e-1, 1.701_988_2e-3, 6.291_068e-6, 5.761_021_4e-9, 6.102_473_7e-13]);
        let vp = self.b.ins().fmul(v, p);
        let r = self.b.ins().fdiv(vp, q);
        let half = self.f(0.5);
        let r = self.b.ins().fadd(r, half);
        let r = self.at_least(r, 0.0);
        self.at_most(r, 1.0)
    }

    /// Emits the whole program over `inputs` (one loaded value per node input).
    fn program(&mut self, prog: &[Inst], inputs: &[Value]) -> Value {
        let mut vals: Vec<Value> = Vec::with_capacity(prog.len());
        for inst in prog {
            let v = match *inst {
                Inst::Input(k) => inputs[k],
                Inst::Unary(u, a) => {
                    let a = self.operand(&vals, a);
                    match u {
                        Unary::Neg => self.b.ins().fneg(a),
                        Unary::Abs => self.b.ins().fabs(a),
                        Unary::Sqrt => self.b.ins().sqrt(a),
                        Unary::Relu => {
                            let z = self.f(0.0);
                            self.b.ins().fmax(a, z)
                        }
                        Unary::Exp => self.exp(a),
                        Unary::Erf => self.erf(a),
                        Unary::Tanh => self.tanh(a),
                        Unary::Sigmoid => self.sigmoid(a),
                        Unary::Reciprocal => {
                            let one = self.f(1.0);
                            self.b.ins().fdiv(one, a)
                        }
                        Unary::Round => self.b.ins().nearest(a),
                    }
                }
                Inst::Binary(op, x, y) => {
                    let (x, y) = (self.operand(&vals, x), self.operand(&vals, y));
                    match op {
                        Binary::Add => self.b.ins().fadd(x, y),
                        Binary::Sub => self.b.ins().fsub(x, y),
                        Binary::Mul => self.b.ins().fmul(x, y),
                        Binary::Div => self.b.ins().fdiv(x, y),
                        Binary::Max => self.b.ins().fmax(x, y),
                        Binary::Min => self.b.ins().fmin(x, y),
                    }
                }
                Inst::Clip(a, lo, hi) => {
                    let a = self.operand(&vals, a);
                    let m = self.at_least(a, lo);
                    self.at_most(m, hi)
                }
                Inst::LeakyRelu(a, alpha) => {
                    let a = self.operand(&vals, a);
                    let k = self.f(alpha);
                    let scaled = self.b.ins().fmul(a, k);
                    let neg = self.lt(a, 0.0);
                    self.select(neg, scaled, a)
                }
            };
            vals.push(v);
        }
        *vals.last().expect("programs are not empty")
    }

    fn operand(&mut self, vals: &[Value], o: Operand) -> Value {
        match o {
            Operand::Ref(i) => vals[i],
            Operand::Const(c) => self.f(c),
        }
    }
}

/// Builds the CLIF function of a program with `n_inputs` inputs; `fma`: whether the target
/// has fused multiply-adds (see [`super::has_fma`]).
pub fn lower_elementwise(prog: &[Inst], n_inputs: usize, func: &mut Function, cfg: TargetFrontendConfig, fma: bool) {
    let ptr = types::I64;
    let mut fbc = FunctionBuilderContext::new();
    let (mut b, _, params) = super::begin(func, &mut fbc, 4);
    let (vec_head, vec_body, tail_head, tail_body, exit) =
        (b.create_block(), b.create_block(), b.create_block(), b.create_block(), b.create_block());
    for blk in [vec_head, vec_body, tail_head, tail_body] {
        b.append_block_param(blk, ptr);
    }
    let (ins, out, start, end) = (params[0], params[1], params[2], params[3]);
    // The data is only ever read and written inside [start, end) of each buffer (checked by
    // the caller), so accesses cannot trap; they need not be aligned.
    let flags = MemFlagsData::new().with_notrap();
    let cast = MemFlagsData::new();
    let bases: Vec<Value> = (0..n_inputs).map(|k| b.ins().load(ptr, flags, ins, (k * 8) as i32)).collect();
    b.ins().jump(vec_head, &[start.into()]);

    b.switch_to_block(vec_head);
    let i = b.block_params(vec_head)[0];
    let i4 = b.ins().iadd_imm_s(i, 4);
    let fits = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, i4, end);
    b.ins().brif(fits, vec_body, &[i.into()], tail_head, &[i.into()]);

    for (blk, ty, step) in [(vec_body, types::F32X4, 4), (tail_body, types::F32, 1)] {
        b.switch_to_block(blk);
        let i = b.block_params(blk)[0];
        let off = b.ins().ishl_imm_u(i, 2);
        let loaded: Vec<Value> = bases
            .iter()
            .map(|&base| {
                let addr = b.ins().iadd(base, off);
                b.ins().load(ty, flags, addr, 0)
            })
            .collect();
        let v = Emit { b: &mut b, ty, cast, fma }.program(prog, &loaded);
        let addr = b.ins().iadd(out, off);
        b.ins().store(flags, v, addr, 0);
        let next = b.ins().iadd_imm_s(i, step);
        let back = if step == 4 { vec_head } else { tail_head };
        b.ins().jump(back, &[next.into()]);
    }

    b.switch_to_block(tail_head);
    let i = b.block_params(tail_head)[0];
    let more = b.ins().icmp(IntCC::UnsignedLessThan, i, end);
    b.ins().brif(more, tail_body, &[i.into()], exit, &[]);

    b.switch_to_block(exit);
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize(cfg);
}

/// Compiles one `aim:Elementwise` node's program into `module`, under `name`: a JIT module
/// (call `JITModule::finalize_definitions` afterwards, through [`Jit`]) or an object module
/// for ahead-of-time compilation. Exported (`Linkage::Export`) when `export`.
pub fn compile_elementwise<M: Module>(
    module: &mut M,
    node: &str,
    name: &str,
    export: bool,
    prog: &[Inst],
    n_inputs: usize,
) -> Result<FuncId, CodegenError> {
    let fma = super::has_fma(module.isa());
    super::define(module, node, name, export, |f, cfg| lower_elementwise(prog, n_inputs, f, cfg, fma))
}

#[cfg(test)]
mod tests {
    use crate::codegen::generate;
    use crate::target::Target;
    use aim_ir::{Attr, Graph, Node};

    /// Compiles `program` as the only node of a graph, for the host and for the SSE4.2
    /// baseline, and runs it over `xs`: the outputs, each with whether its target fused
    /// multiply-adds.
    fn run_with_fma(program: &[&str], xs: &[f32]) -> Vec<(bool, Vec<f32>)> {
        let mut g = Graph::default();
        g.nodes.push(Node {
            name: "n".into(),
            op: "Elementwise".into(),
            domain: "aim".into(),
            inputs: vec!["x".into()],
            outputs: vec!["y".into()],
            attrs: [("program".to_string(), Attr::Strings(program.iter().map(|s| s.to_string()).collect()))]
                .into_iter()
                .collect(),
        });
        ["native", "x86-64-v2"]
            .iter()
            .map(|cpu| {
                let target = Target::host().with_cpu(cpu).unwrap();
                let code = generate(&g, &target).unwrap();
                let f = code.elementwise[&0];
                let mut out = vec![f32::NAN; xs.len()];
                let ins = [xs.as_ptr()];
                // SAFETY: one input of xs.len() elements, an output as long.
                unsafe { f(ins.as_ptr(), out.as_mut_ptr(), 0, xs.len()) };
                (target.features.fma || target.arch == "aarch64", out)
            })
            .collect()
    }

    /// [`run_with_fma`]'s outputs.
    fn run(program: &[&str], xs: &[f32]) -> Vec<Vec<f32>> {
        run_with_fma(program, xs).into_iter().map(|(_, out)| out).collect()
    }

    /// The same lowering emits into an object file (the ahead-of-time path): an exported
    /// symbol in a relocatable ELF/Mach-O/COFF object for the host.
    #[test]
    fn emits_into_an_object_module() {
        use cranelift_module::Module;
        let target = Target::host();
        let isa = crate::codegen::isa_for(&target).unwrap();
        let builder =
            cranelift_object::ObjectBuilder::new(isa, "aim_test", cranelift_module::default_libcall_names()).unwrap();
        let mut module = cranelift_object::ObjectModule::new(builder);
        let prog = crate::ewprog::parse(&["in 0".to_string(), "relu 0".to_string()]).unwrap();
        let id = super::compile_elementwise(&mut module, "n", "aim_relu", true, &prog, 1).unwrap();
        assert_eq!(module.declarations().get_function_decl(id).name.as_deref(), Some("aim_relu"));
        let bytes = module.finish().emit().unwrap();
        assert!(bytes.len() > 64);
        assert!(bytes.windows(8).any(|w| w == b"aim_relu"), "the symbol is in the object's string table");
    }

    fn grid(lo: f32, hi: f32, n: usize) -> Vec<f32> {
        (0..=n).map(|i| lo + (hi - lo) * i as f32 / n as f32).collect()
    }

    #[test]
    fn generated_math_meets_the_stated_error_bounds() {
        let xs = grid(-20.0, 20.0, 400_003);
        let check = |op: &str, bound: f64, relative: bool, want: fn(f64) -> f64| {
            for got in run(&["in 0", &format!("{op} 0")], &xs) {
                let worst = xs
                    .iter()
                    .zip(&got)
                    .map(|(&x, &g)| {
                        let w = want(x as f64);
                        let e = (g as f64 - w).abs();
                        if relative {
                            e / w.abs().max(1e-30)
                        } else {
                            e
                        }
                    })
                    .fold(0.0, f64::max);
                assert!(worst <= bound, "{op}: error {worst:e} > {bound:e}");
            }
        };
        check("exp", 3e-7, true, f64::exp);
        check("erf", 5e-7, false, aim_kernels::erf);
        check("tanh", 4.5e-7, false, f64::tanh);
        check("sigmoid", 3e-7, false, |x| 1.0 / (1.0 + (-x).exp()));
    }

    /// A generated loop computes a program's bits exactly as `ewprog::eval_with` does, with
    /// multiply-adds fused where the target has FMA (and so as the full-width blocks of
    /// `ewprog::wide`, which the runtime runs on AVX2 and AVX-512 for the longer loops): a
    /// node's result does not depend on which of them ran it.
    #[test]
    fn generated_loops_give_the_bits_eval_gives() {
        let xs = grid(-30.0, 30.0, 20_011);
        let progs: [&[&str]; 3] = [
            &["in 0", "tanh 0", "sigmoid 0", "exp 0", "erf 0", "add 1 2", "add 5 3", "add 6 4"],
            &["in 0", "mul 0 c0.044715", "mul 0 1", "mul 0 2", "add 0 3", "mul c0.7978846 4", "tanh 5", "add c1.0 6"],
            &["in 0", "div 0 c0.03", "round 1", "add 2 c28.0", "clip 3 0.0 255.0", "sub 4 c28.0", "mul 5 c0.03"],
        ];
        for prog in progs {
            let lines: Vec<String> = prog.iter().map(|s| s.to_string()).collect();
            let parsed = crate::ewprog::parse(&lines).unwrap();
            for (fma, got) in run_with_fma(prog, &xs) {
                for (&x, &g) in xs.iter().zip(&got) {
                    let want = if fma {
                        aim_kernels::ewprog::eval_with::<true>(&parsed, &[x])
                    } else {
                        aim_kernels::ewprog::eval_with::<false>(&parsed, &[x])
                    }
                    .unwrap();
                    assert_eq!(g.to_bits(), want.to_bits(), "{prog:?} at {x}: {g} vs {want}");
                }
            }
        }
    }

    #[test]
    fn tails_specials_and_arithmetic() {
        // 7 elements: one f32x4 iteration and three scalar ones.
        let xs = [-2.0f32, -0.5, 0.0, 0.5, 3.0, f32::NAN, 1e30];
        let prog = ["in 0", "mul 0 c2.0", "add 1 c1.0", "clip 2 -1.0 5.0", "max 3 0", "leakyrelu 4 0.1"];
        for got in run(&prog, &xs) {
            for (i, &x) in xs.iter().enumerate() {
                let v = (x * 2.0 + 1.0).clamp(-1.0, 5.0).max(x);
                let want = if v >= 0.0 { v } else { 0.1 * v };
                assert!(got[i] == want || (got[i].is_nan() && x.is_nan()), "at {x}: {} vs {want}", got[i]);
            }
        }
        let big = run(&["in 0", "exp 0"], &[-1000.0, 1000.0, f32::NAN]);
        for got in big {
            assert_eq!(got[0], 0.0);
            assert!(got[1] > 3e38);
            assert!(got[2].is_nan());
        }
    }
}
