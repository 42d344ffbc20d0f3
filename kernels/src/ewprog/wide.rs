//! Programs run at the CPU's full vector width. The code generator's loops are Cranelift's,
//! whose vectors are 128 bits on x86-64: 4 floats where AVX2 holds 8 and AVX-512 16. On
//! those CPUs a program runs here instead, one instruction at a time over a block of
//! [`BLOCK`] elements held in L1 (each instruction one loop the compiler vectorises at the
//! full width), the last instruction writing the output: the same arithmetic in the same
//! order per element as [`super::eval_with`], with `fast::math`'s approximations for the
//! transcendental functions (their multiply-adds fused: every CPU with AVX2 has FMA).

use super::{operands, Binary, Inst, Operand, Unary};
use crate::fast::math;
use crate::gemm::{Isa, IsaKind};

/// Elements per block: a program's temporaries (one block each) stay in L1.
pub const BLOCK: usize = 256;

/// Floats of temporaries [`Wide::apply`] keeps on the stack (8 KiB): room for the short
/// programs that follow a convolution or a dense layer.
const STACK_TEMPS: usize = 8 * BLOCK;

/// Where an instruction reads an operand.
#[derive(Clone, Copy, Debug)]
enum Src {
    /// Input `k` of the node.
    Input(usize),
    /// Temporary block `t`.
    Temp(usize),
    /// A constant.
    Const(f32),
}

/// What an instruction computes.
#[derive(Clone, Copy, Debug)]
enum Op {
    Copy,
    Unary(Unary),
    Binary(Binary),
    Clip(f32, f32),
    LeakyRelu(f32),
    /// `clip(round(x / s) + z, lo, hi) − z2`, times `s2` when given: a quantize-dequantize
    /// pair (six instructions, the program after every product of a QDQ model run in f32)
    /// in one loop, its intermediates in registers rather than five blocks written and
    /// re-read. The same operations in the same order as the instructions.
    FakeQuant {
        s: f32,
        z: f32,
        lo: f32,
        hi: f32,
        z2: f32,
        s2: Option<f32>,
    },
    /// `(x · (erf(x · c) + one)) · half`: the exact GELU as the fusion writes it (five
    /// instructions) in one loop, the same operations in the same order.
    Gelu {
        c: f32,
        one: f32,
        half: f32,
    },
}

/// One instruction: `dst = op(a, b)`, `dst` a temporary or (`None`) the output.
#[derive(Clone, Copy, Debug)]
struct Step {
    op: Op,
    a: Src,
    b: Src,
    dst: Option<usize>,
}

/// A program compiled for blocks: inputs read in place, one temporary block per live
/// value (reused once it is dead), the last instruction into the output.
#[derive(Clone, Debug)]
pub struct Wide {
    /// The ISA the blocks run on (read only on x86-64: elsewhere `new` makes none).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: Isa,
    steps: Vec<Step>,
    temps: usize,
    inputs: usize,
}

impl Wide {
    /// The program `prog` for `isa` (AVX2 or AVX-512: elsewhere the generated loop is as
    /// wide as the vectors), or None for another ISA or a program that reads an instruction
    /// after itself (the parser refuses those).
    pub fn new(isa: Isa, prog: &[Inst]) -> Option<Wide> {
        if !matches!(isa.kind(), IsaKind::Avx2 | IsaKind::Avx512) {
            return None;
        }
        Wide::build(isa, prog)
    }

    /// The program `prog` for any ISA (elsewhere than AVX2 and AVX-512 its loops are
    /// compiled for the baseline: NEON on AArch64), or None for a program that reads an
    /// instruction after itself. For kernels that apply a program to what they just wrote.
    pub fn anywhere(isa: Isa, prog: &[Inst]) -> Option<Wide> {
        Wide::build(isa, prog)
    }

    fn build(isa: Isa, prog: &[Inst]) -> Option<Wide> {
        if prog.is_empty() {
            return None;
        }
        // The last instruction reading each value.
        let mut last_use = vec![0usize; prog.len()];
        for (i, inst) in prog.iter().enumerate() {
            for o in operands(inst) {
                if let Operand::Ref(r) = o {
                    if r >= i {
                        return None;
                    }
                    last_use[r] = i;
                }
            }
        }
        let mut uses = vec![0usize; prog.len()];
        for o in prog.iter().flat_map(operands) {
            if let Operand::Ref(r) = o {
                uses[r] += 1;
            }
        }
        let mut place: Vec<Src> = Vec::with_capacity(prog.len());
        let (mut free, mut temps, mut steps, mut inputs) = (Vec::<usize>::new(), 0usize, Vec::new(), 0usize);
        let end = prog.len() - 1;
        let mut i = 0;
        while i < prog.len() {
            let inst = &prog[i];
            let src = |o: Operand| match o {
                Operand::Ref(r) => place[r],
                Operand::Const(c) => Src::Const(c),
            };
            // A quantize-dequantize pair or a GELU from here to `last` is one step, its
            // intermediates read by the next instruction alone.
            let (op, a, b, last) = match fake_quant(prog, i, &uses).or_else(|| gelu(prog, i, &uses)) {
                Some((op, a, last)) => (op, src(a), Src::Const(0.0), last),
                None => match *inst {
                    Inst::Input(k) => {
                        inputs = inputs.max(k + 1);
                        if i < end {
                            place.push(Src::Input(k));
                            i += 1;
                            continue;
                        }
                        (Op::Copy, Src::Input(k), Src::Const(0.0), i)
                    }
                    Inst::Unary(u, a) => (Op::Unary(u), src(a), Src::Const(0.0), i),
                    Inst::Binary(bop, x, y) => (Op::Binary(bop), src(x), src(y), i),
                    Inst::Clip(a, lo, hi) => (Op::Clip(lo, hi), src(a), Src::Const(0.0), i),
                    Inst::LeakyRelu(a, alpha) => (Op::LeakyRelu(alpha), src(a), Src::Const(0.0), i),
                },
            };
            // The result never goes where an operand is read (no slice is written while
            // another over it is read): its block is taken before the operands it reads
            // for the last time are freed for later instructions.
            let dst = if last == end {
                None
            } else {
                Some(free.pop().unwrap_or_else(|| {
                    temps += 1;
                    temps - 1
                }))
            };
            for o in prog[i..=last].iter().flat_map(operands) {
                if let Operand::Ref(r) = o {
                    if r < i && last_use[r] <= last {
                        if let Src::Temp(t) = place[r] {
                            if !free.contains(&t) {
                                free.push(t);
                            }
                        }
                    }
                }
            }
            // A fused step's intermediates are read by no step.
            place.extend((i..last).map(|_| Src::Const(0.0)));
            place.push(dst.map_or(Src::Const(0.0), Src::Temp));
            steps.push(Step { op, a, b, dst });
            i = last + 1;
        }
        Some(Wide { isa, steps, temps, inputs })
    }

    /// How many steps the program runs per block (for schedule texts).
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// How many inputs the program reads.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Replaces each of the `n` floats at `p` by the program's value of it (a program of
    /// one input): what a kernel's epilogue runs over a tile it has just stored, still in L1.
    /// Short programs keep their temporaries on the stack.
    ///
    /// # Safety
    /// `p` is valid for reads and writes of `n` floats no other thread touches, and the
    /// program reads one input.
    pub unsafe fn apply(&self, p: *mut f32, n: usize) {
        assert_eq!(self.inputs, 1, "a program applied in place reads one input");
        if (self.temps + 1) * BLOCK <= STACK_TEMPS {
            let mut temps = std::mem::MaybeUninit::<[f32; STACK_TEMPS]>::uninit();
            // SAFETY: `p` as the caller promised; the temporaries hold `temps + 1` blocks,
            // each written by a step before it is read.
            unsafe { self.dispatch(&[p], p, temps.as_mut_ptr() as *mut f32, 0, n) }
        } else {
            // SAFETY: as above.
            unsafe { self.run(&[p], p, 0, n) }
        }
    }

    /// [`Wide::apply`] over `rows` rows of `cols` floats, `ld` apart (a GEMM tile): short
    /// rows are gathered into one block first, so that each step runs over a whole block
    /// rather than over a tile's few dozen columns (measured: applying a 7-step program per
    /// 32-float row of every tile made a transformer's dense layers 35% slower; a separate
    /// pass over memory cost less).
    ///
    /// # Safety
    /// Every row `p + r·ld .. + cols` is valid for reads and writes no other thread touches,
    /// and the program reads one input.
    pub unsafe fn apply_rows(&self, p: *mut f32, rows: usize, cols: usize, ld: usize) {
        if rows == 1 || cols >= BLOCK / 2 || cols == 0 {
            for r in 0..rows {
                // SAFETY: as the caller promised.
                unsafe { self.apply(p.add(r * ld), cols) };
            }
            return;
        }
        let per = BLOCK / cols;
        let mut buf = [0f32; BLOCK];
        let mut r0 = 0;
        while r0 < rows {
            let k = per.min(rows - r0);
            // SAFETY: rows r0..r0 + k are the caller's; `buf` holds k·cols ≤ BLOCK floats.
            unsafe {
                for r in 0..k {
                    std::ptr::copy_nonoverlapping(p.add((r0 + r) * ld), buf.as_mut_ptr().add(r * cols), cols);
                }
                self.apply(buf.as_mut_ptr(), k * cols);
                for r in 0..k {
                    std::ptr::copy_nonoverlapping(buf.as_ptr().add(r * cols), p.add((r0 + r) * ld), cols);
                }
            }
            r0 += k;
        }
    }

    /// Computes elements `start..end` of the output from the same elements of the inputs.
    ///
    /// # Safety
    /// `ins` holds at least [`Wide::inputs`] pointers, each to at least `end` floats, and
    /// `out` points to at least `end` floats; `out` may be one of the inputs (the result of
    /// each block is then copied there once every step has read it) but overlaps none other.
    pub unsafe fn run(&self, ins: &[*const f32], out: *mut f32, start: usize, end: usize) {
        assert!(ins.len() >= self.inputs, "wide program: {} inputs given, {} read", ins.len(), self.inputs);
        // One more block for the result where the output is an input (written there, then
        // copied: no slice of the output is written while one of the input is read).
        let mut temps = crate::scratch::take((self.temps + 1) * BLOCK);
        // SAFETY: as the caller promised; `temps` holds `self.temps + 1` blocks.
        unsafe { self.dispatch(ins, out, temps.as_mut_ptr(), start, end) }
    }

    /// Floats of scratch [`Wide::run_in`] needs: a caller making many short calls (one per
    /// row of a broadcast) takes them once instead of once per call.
    pub fn scratch_len(&self) -> usize {
        (self.temps + 1) * BLOCK
    }

    /// [`Wide::run`] with its temporaries at `tp`.
    ///
    /// # Safety
    /// As for [`Wide::run`], and `tp` holds [`Wide::scratch_len`] floats no one else uses.
    pub unsafe fn run_in(&self, ins: &[*const f32], out: *mut f32, start: usize, end: usize, tp: *mut f32) {
        assert!(ins.len() >= self.inputs, "wide program: {} inputs given, {} read", ins.len(), self.inputs);
        // SAFETY: as the caller promised.
        unsafe { self.dispatch(ins, out, tp, start, end) }
    }

    /// `run` with temporaries at `tp` (`self.temps + 1` blocks), at the ISA's width.
    ///
    /// # Safety
    /// As for [`Wide::run`], and `tp` holds `self.temps + 1` blocks.
    unsafe fn dispatch(&self, ins: &[*const f32], out: *mut f32, tp: *mut f32, start: usize, end: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
            unsafe fn v4(w: &Wide, ins: &[*const f32], out: *mut f32, tp: *mut f32, start: usize, end: usize) {
                // SAFETY: as for `run`.
                unsafe { blocks::<true>(w, ins, out, tp, start, end) }
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3(w: &Wide, ins: &[*const f32], out: *mut f32, tp: *mut f32, start: usize, end: usize) {
                // SAFETY: as for `run`.
                unsafe { blocks::<true>(w, ins, out, tp, start, end) }
            }
            // SAFETY: the ISA was checked available when the program was built; the
            // pointers are as the caller promised, `tp` holds `temps` blocks.
            match self.isa.kind() {
                IsaKind::Avx512 => return unsafe { v4(self, ins, out, tp, start, end) },
                IsaKind::Avx2 => return unsafe { v3(self, ins, out, tp, start, end) },
                IsaKind::Portable | IsaKind::Neon => {}
            }
        }
        // SAFETY: as above.
        unsafe { blocks::<{ cfg!(target_arch = "aarch64") }>(self, ins, out, tp, start, end) }
    }
}

/// The quantize-dequantize pair starting at instruction `i` — `div x s`, `round`,
/// `add z`, `clip lo hi`, `sub z2`, and optionally `mul s2`, constants all, each
/// intermediate read only by the next — as one step: its op, its operand x and the index
/// of its last instruction.
fn fake_quant(prog: &[Inst], i: usize, uses: &[usize]) -> Option<(Op, Operand, usize)> {
    use Operand::{Const, Ref};
    let at = |k: usize| prog.get(i + k);
    // Instruction i + k reads i + k − 1, which nothing else reads.
    let chained = |k: usize, o: Operand| o == Ref(i + k - 1) && uses[i + k - 1] == 1;
    let (&Inst::Binary(Binary::Div, x, Const(s)), Some(&Inst::Unary(Unary::Round, r))) = (at(0)?, at(1)) else {
        return None;
    };
    let Some(&Inst::Binary(Binary::Add, p, Const(z))) = at(2) else { return None };
    let Some(&Inst::Clip(c, lo, hi)) = at(3) else { return None };
    let Some(&Inst::Binary(Binary::Sub, q, Const(z2))) = at(4) else { return None };
    if !(chained(1, r) && chained(2, p) && chained(3, c) && chained(4, q)) {
        return None;
    }
    let s2 = match at(5) {
        Some(&Inst::Binary(Binary::Mul, m, Const(s2))) if chained(5, m) => Some(s2),
        _ => None,
    };
    let last = i + if s2.is_some() { 5 } else { 4 };
    Some((Op::FakeQuant { s, z, lo, hi, z2, s2 }, x, last))
}

/// The GELU starting at instruction `i` — `mul x c`, `erf`, `add one`, `mul x`, `mul half`
/// (either operand order of each), each intermediate read only by the next — as one step:
/// its op, its operand x and the index of its last instruction.
fn gelu(prog: &[Inst], i: usize, uses: &[usize]) -> Option<(Op, Operand, usize)> {
    use Operand::{Const, Ref};
    let at = |k: usize| prog.get(i + k);
    let chained = |k: usize| uses[i + k - 1] == 1;
    // The other operand of a binary `op` one of whose operands is `known`.
    let other = |inst: &Inst, op: Binary, known: Operand| match *inst {
        Inst::Binary(o, a, b) if o == op && a == known => Some(b),
        Inst::Binary(o, a, b) if o == op && b == known => Some(a),
        _ => None,
    };
    let (x, c) = match *at(0)? {
        Inst::Binary(Binary::Mul, x, Const(c)) | Inst::Binary(Binary::Mul, Const(c), x) => (x, c),
        _ => return None,
    };
    if *at(1)? != Inst::Unary(Unary::Erf, Ref(i)) || !chained(1) || !chained(2) || !chained(3) || !chained(4) {
        return None;
    }
    let Const(one) = other(at(2)?, Binary::Add, Ref(i + 1))? else { return None };
    if other(at(3)?, Binary::Mul, Ref(i + 2))? != x || matches!(x, Const(_)) {
        return None;
    }
    let Const(half) = other(at(4)?, Binary::Mul, Ref(i + 3))? else { return None };
    Some((Op::Gelu { c, one, half }, x, i + 4))
}

/// Every block of `start..end`, every step over it (the transcendental functions'
/// multiply-adds fused where `FMA`, as the generated loop fuses them on such targets).
///
/// # Safety
/// As for [`Wide::run`]; `tp` holds `w.temps` blocks.
#[inline(always)]
unsafe fn blocks<const FMA: bool>(w: &Wide, ins: &[*const f32], out: *mut f32, tp: *mut f32, start: usize, end: usize) {
    let in_place = ins.iter().any(|&p| std::ptr::eq(p, out));
    let result = w.temps;
    let mut at = start;
    while at < end {
        let len = BLOCK.min(end - at);
        for s in &w.steps {
            // SAFETY: inputs and the output hold `end` floats; temporaries `BLOCK`, one
            // more than `w.temps`.
            unsafe {
                let dst = match s.dst {
                    Some(t) => std::slice::from_raw_parts_mut(tp.add(t * BLOCK), len),
                    None if in_place => std::slice::from_raw_parts_mut(tp.add(result * BLOCK), len),
                    None => std::slice::from_raw_parts_mut(out.add(at), len),
                };
                step::<FMA>(s, operand(s.a, ins, tp, at, len), operand(s.b, ins, tp, at, len), dst);
            }
        }
        if in_place {
            // SAFETY: the result block and the output's elements `at..at + len` are disjoint.
            unsafe { std::ptr::copy_nonoverlapping(tp.add(result * BLOCK), out.add(at), len) };
        }
        at += len;
    }
}

/// An operand over one block: a slice, or a constant.
enum Val<'a> {
    Slice(&'a [f32]),
    Const(f32),
}

/// # Safety
/// As for [`blocks`].
#[inline(always)]
unsafe fn operand<'a>(s: Src, ins: &[*const f32], tp: *mut f32, at: usize, len: usize) -> Val<'a> {
    // SAFETY: as for `blocks`. A temporary read here is never the step's destination.
    unsafe {
        match s {
            Src::Input(k) => Val::Slice(std::slice::from_raw_parts(ins[k].add(at), len)),
            Src::Temp(t) => Val::Slice(std::slice::from_raw_parts(tp.add(t * BLOCK), len)),
            Src::Const(c) => Val::Const(c),
        }
    }
}

/// One step over one block. Each arm is one loop over the block (vectorised at the width
/// of the caller's target features).
#[inline(always)]
fn step<const FMA: bool>(s: &Step, a: Val, b: Val, dst: &mut [f32]) {
    match s.op {
        Op::Copy => unary(a, dst, |x| x),
        Op::Unary(u) => match u {
            Unary::Neg => unary(a, dst, |x| -x),
            Unary::Abs => unary(a, dst, f32::abs),
            Unary::Sqrt => unary(a, dst, f32::sqrt),
            // NaN stays NaN, as in the generated loop.
            Unary::Relu => unary(a, dst, |x| if x < 0.0 { 0.0 } else { x }),
            Unary::Exp => unary(a, dst, math::exp_with::<FMA>),
            Unary::Erf => unary(a, dst, math::erf_with::<FMA>),
            Unary::Tanh => unary(a, dst, math::tanh_with::<FMA>),
            Unary::Sigmoid => unary(a, dst, math::sigmoid_with::<FMA>),
            Unary::Reciprocal => unary(a, dst, |x| 1.0 / x),
            Unary::Round => unary(a, dst, f32::round_ties_even),
        },
        Op::Binary(op) => match op {
            Binary::Add => binary(a, b, dst, |x, y| x + y),
            Binary::Sub => binary(a, b, dst, |x, y| x - y),
            Binary::Mul => binary(a, b, dst, |x, y| x * y),
            Binary::Div => binary(a, b, dst, |x, y| x / y),
            // A NaN on either side gives NaN (ONNX Max and Min, and the generated loop's
            // fmax / fmin).
            Binary::Max => binary(a, b, dst, |x, y| if x.is_nan() || x > y { x } else { y }),
            Binary::Min => binary(a, b, dst, |x, y| if x.is_nan() || x < y { x } else { y }),
        },
        // The generated loop's clip: below lo is lo, above hi is hi, NaN stays NaN.
        Op::Clip(lo, hi) => unary(a, dst, |x| {
            let m = if x < lo { lo } else { x };
            if m > hi {
                hi
            } else {
                m
            }
        }),
        Op::LeakyRelu(alpha) => unary(a, dst, |x| if x < 0.0 { x * alpha } else { x }),
        Op::FakeQuant { s, z, lo, hi, z2, s2 } => {
            // As the instructions: the clip's compare-selects, NaN staying NaN.
            let q = move |x: f32| {
                let v = (x / s).round_ties_even() + z;
                let v = if v < lo { lo } else { v };
                (if v > hi { hi } else { v }) - z2
            };
            match s2 {
                Some(s2) => unary(a, dst, |x| q(x) * s2),
                None => unary(a, dst, q),
            }
        }
        Op::Gelu { c, one, half } => unary(a, dst, |x| (x * (math::erf_with::<FMA>(x * c) + one)) * half),
    }
}

#[inline(always)]
fn unary(a: Val, dst: &mut [f32], f: impl Fn(f32) -> f32) {
    match a {
        Val::Slice(a) => {
            for (o, &x) in dst.iter_mut().zip(a) {
                *o = f(x);
            }
        }
        Val::Const(c) => dst.fill(f(c)),
    }
}

#[inline(always)]
fn binary(a: Val, b: Val, dst: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    match (a, b) {
        (Val::Slice(a), Val::Slice(b)) => {
            for ((o, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (Val::Slice(a), Val::Const(y)) => {
            for (o, &x) in dst.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (Val::Const(x), Val::Slice(b)) => {
            for (o, &y) in dst.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (Val::Const(x), Val::Const(y)) => dst.fill(f(x, y)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quantize-dequantize pair is one step; one whose intermediate is read elsewhere
    /// is six.
    #[test]
    fn quantize_dequantize_pairs_are_one_step() {
        let Some(isa) = Isa::new(IsaKind::Avx2) else { return };
        let steps = |text: &[&str]| {
            let lines: Vec<String> = text.iter().map(|s| s.to_string()).collect();
            Wide::new(isa, &super::super::parse(&lines).unwrap()).unwrap().steps()
        };
        let pair = ["in 0", "div 0 c0.03", "round 1", "add 2 c28.0", "clip 3 0.0 255.0", "sub 4 c28.0", "mul 5 c0.03"];
        assert_eq!(steps(&pair), 1);
        assert_eq!(steps(&pair[..6]), 1);
        let mut read_elsewhere = pair.to_vec();
        read_elsewhere.push("add 6 2");
        assert_eq!(steps(&read_elsewhere), 7);
        let gelu = ["in 0", "mul 0 c0.70710677", "erf 1", "add 2 c1.0", "mul 0 3", "mul 4 c0.5"];
        assert_eq!(steps(&gelu), 1);
        assert_eq!(steps(&["in 0", "mul 0 c0.70710677", "erf 1", "add 2 c1.0", "mul 0 3", "mul 4 c0.5", "add 5 2"]), 6);
    }

    /// Every instruction, at every block boundary and in place, against [`super::super::eval`]
    /// element by element: the same arithmetic, bit for bit (NaN as NaN).
    #[test]
    fn blocks_compute_what_eval_does() {
        let progs: Vec<Vec<&str>> = vec![
            vec![
                "in 0",
                "mul 0 c0.044715",
                "mul 0 1",
                "mul 0 2",
                "add 0 3",
                "mul c0.7978846 4",
                "tanh 5",
                "add c1.0 6",
                "mul c0.5 7",
                "mul 0 8",
            ],
            vec!["in 0", "div 0 c0.03", "round 1", "add 2 c28.0", "clip 3 0.0 255.0", "sub 4 c28.0", "mul 5 c0.03"],
            // Quantize-dequantize pairs fused into one step: centred (no multiply), the
            // pair's value read again after it, a bias added, and one whose rounded value
            // is read elsewhere (not fused).
            vec!["in 0", "div 0 c0.25", "round 1", "add 2 c3.0", "clip 3 0.0 15.0", "sub 4 c2.0"],
            vec![
                "in 1",
                "in 0",
                "div 1 c0.5",
                "round 2",
                "add 3 c-4.0",
                "clip 4 -8.0 7.0",
                "sub 5 c-4.0",
                "mul 6 c0.5",
                "add 7 0",
                "mul 7 8",
            ],
            vec![
                "in 0",
                "div 0 c0.03",
                "round 1",
                "add 2 c28.0",
                "clip 3 0.0 255.0",
                "sub 4 c28.0",
                "mul 5 c0.03",
                "add 6 2",
            ],
            // GELUs fused into one step (after a sum, operands in the other order), and
            // one whose erf is read elsewhere (not fused).
            vec!["in 0", "in 1", "add 0 1", "mul c0.70710677 2", "erf 3", "add c1.0 4", "mul 5 2", "mul c0.5 6"],
            vec!["in 0", "mul 0 c0.70710677", "erf 1", "add 2 c1.0", "mul 0 3", "mul 4 c0.5", "add 5 2"],
            vec!["in 0", "in 1", "max 0 1", "min 0 1", "sub 2 3", "abs 4", "sqrt 5", "recip 6", "neg 7"],
            vec!["in 1", "in 0", "exp 1", "erf 0", "sigmoid 2", "relu 3", "leakyrelu 0 0.2", "add 4 5", "mul 7 6"],
            vec!["in 1"],
            vec!["in 0", "add c2.0 c3.0", "mul 0 1"],
        ];
        let n = 3 * BLOCK + 37;
        let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let mut y: Vec<f32> = (0..n).map(|i| ((i * 53 % 89) as f32 - 40.0) / 5.0).collect();
        y[5] = f32::NAN;
        for text in &progs {
            let lines: Vec<String> = text.iter().map(|s| s.to_string()).collect();
            let prog = super::super::parse(&lines).unwrap();
            // The full-width blocks fuse multiply-adds (AVX2 and AVX-512 have FMA).
            let want: Vec<f32> =
                (0..n).map(|i| super::super::eval_with::<true>(&prog, &[x[i], y[i]]).unwrap()).collect();
            for kind in [IsaKind::Avx512, IsaKind::Avx2] {
                let Some(isa) = Isa::new(kind) else { continue };
                let w = Wide::new(isa, &prog).unwrap();
                let same = |got: &[f32], what: &str| {
                    for i in 0..n {
                        assert!(
                            got[i].to_bits() == want[i].to_bits() || (got[i].is_nan() && want[i].is_nan()),
                            "{text:?} {kind:?} {what}: element {i}: {} != {}",
                            got[i],
                            want[i]
                        );
                    }
                };
                let mut out = vec![0f32; n];
                // Over uneven chunks, as the pool's tasks call it.
                for (s, e) in [(0, 5), (5, BLOCK + 3), (BLOCK + 3, n)] {
                    unsafe { w.run(&[x.as_ptr(), y.as_ptr()], out.as_mut_ptr(), s, e) };
                }
                same(&out, "chunks");
                let mut inplace = x.clone();
                let p = inplace.as_mut_ptr();
                unsafe { w.run(&[p, y.as_ptr()], p, 0, n) };
                same(&inplace, "in place");
            }
        }
    }
}
