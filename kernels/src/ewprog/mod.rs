//! Programs of fused elementwise nodes (`aim:Elementwise`): a straight-line list of f32
//! operations over the node's inputs, each reading earlier results, the last one being the
//! output. Stored in the node's `program` attribute, one instruction per string, so the IR
//! text shows exactly what the generated loop computes:
//!
//! ```text
//! %y = aim:Elementwise(%h) {program=["in 0", "mul 0 c0.70710677", "erf 1", "add 2 c1.0", "mul 0 3", "mul 4 c0.5"], ...}
//! ```
//!
//! Operands are instruction indices or `c<float>` constants.

mod rows;
pub mod wide;

pub use rows::Rows;

/// One operand: an earlier instruction's value or a constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operand {
    /// The value of instruction `i`.
    Ref(usize),
    /// A constant.
    Const(f32),
}

/// Unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    Neg,
    Abs,
    Sqrt,
    Relu,
    Exp,
    Erf,
    Tanh,
    Sigmoid,
    Reciprocal,
    /// Round to the nearest integer, ties to even (ONNX Round).
    Round,
}

/// Binary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
}

/// One instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Inst {
    /// Input tensor `k` of the node.
    Input(usize),
    /// A unary op.
    Unary(Unary, Operand),
    /// A binary op.
    Binary(Binary, Operand, Operand),
    /// max(min(x, hi), lo).
    Clip(Operand, f32, f32),
    /// x if x ≥ 0 else alpha·x.
    LeakyRelu(Operand, f32),
}

const UNARY: &[(&str, Unary)] = &[
    ("neg", Unary::Neg),
    ("abs", Unary::Abs),
    ("sqrt", Unary::Sqrt),
    ("relu", Unary::Relu),
    ("exp", Unary::Exp),
    ("erf", Unary::Erf),
    ("tanh", Unary::Tanh),
    ("sigmoid", Unary::Sigmoid),
    ("recip", Unary::Reciprocal),
    ("round", Unary::Round),
];
const BINARY: &[(&str, Binary)] = &[
    ("add", Binary::Add),
    ("sub", Binary::Sub),
    ("mul", Binary::Mul),
    ("div", Binary::Div),
    ("max", Binary::Max),
    ("min", Binary::Min),
];

fn operand_str(o: Operand) -> String {
    match o {
        Operand::Ref(i) => i.to_string(),
        Operand::Const(c) => format!("c{c:?}"),
    }
}

impl Inst {
    /// The instruction with each operand replaced by `f`'s (how one program is inlined
    /// into another).
    pub fn map_operands(self, mut f: impl FnMut(Operand) -> Operand) -> Inst {
        match self {
            Inst::Input(k) => Inst::Input(k),
            Inst::Unary(u, a) => Inst::Unary(u, f(a)),
            Inst::Binary(b, x, y) => Inst::Binary(b, f(x), f(y)),
            Inst::Clip(a, lo, hi) => Inst::Clip(f(a), lo, hi),
            Inst::LeakyRelu(a, al) => Inst::LeakyRelu(f(a), al),
        }
    }

    /// The instruction as program text.
    pub fn to_text(&self) -> String {
        match *self {
            Inst::Input(k) => format!("in {k}"),
            Inst::Unary(u, a) => format!("{} {}", UNARY.iter().find(|x| x.1 == u).map_or("?", |x| x.0), operand_str(a)),
            Inst::Binary(b, x, y) => format!(
                "{} {} {}",
                BINARY.iter().find(|z| z.1 == b).map_or("?", |z| z.0),
                operand_str(x),
                operand_str(y)
            ),
            Inst::Clip(a, lo, hi) => format!("clip {} {lo:?} {hi:?}", operand_str(a)),
            Inst::LeakyRelu(a, al) => format!("leakyrelu {} {al:?}", operand_str(a)),
        }
    }

    /// Parses one instruction written by [`Inst::to_text`]; `index` is its position.
    pub fn parse(s: &str, index: usize) -> Result<Inst, String> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        let op = |k: usize| -> Result<Operand, String> {
            let t = parts.get(k).ok_or_else(|| format!("'{s}': missing operand"))?;
            if let Some(c) = t.strip_prefix('c') {
                return c.parse().map(Operand::Const).map_err(|_| format!("'{s}': bad constant {t}"));
            }
            let i: usize = t.parse().map_err(|_| format!("'{s}': bad operand {t}"))?;
            if i >= index {
                return Err(format!("'{s}': operand {i} is not an earlier instruction"));
            }
            Ok(Operand::Ref(i))
        };
        let num = |k: usize| -> Result<f32, String> {
            parts.get(k).and_then(|t| t.parse().ok()).ok_or_else(|| format!("'{s}': bad number"))
        };
        let name = *parts.first().ok_or("empty instruction")?;
        if name == "in" {
            return parts
                .get(1)
                .and_then(|t| t.parse().ok())
                .map(Inst::Input)
                .ok_or_else(|| format!("'{s}': bad input index"));
        }
        if let Some(u) = UNARY.iter().find(|x| x.0 == name) {
            return Ok(Inst::Unary(u.1, op(1)?));
        }
        if let Some(b) = BINARY.iter().find(|x| x.0 == name) {
            return Ok(Inst::Binary(b.1, op(1)?, op(2)?));
        }
        match name {
            "clip" => Ok(Inst::Clip(op(1)?, num(2)?, num(3)?)),
            "leakyrelu" => Ok(Inst::LeakyRelu(op(1)?, num(2)?)),
            _ => Err(format!("unknown instruction '{name}'")),
        }
    }
}

/// The operands an instruction reads.
pub(crate) fn operands(inst: &Inst) -> Vec<Operand> {
    match *inst {
        Inst::Input(_) => vec![],
        Inst::Unary(_, a) | Inst::Clip(a, _, _) | Inst::LeakyRelu(a, _) => vec![a],
        Inst::Binary(_, x, y) => vec![x, y],
    }
}

/// Parses a whole program (the `program` attribute).
pub fn parse(lines: &[String]) -> Result<Vec<Inst>, String> {
    if lines.is_empty() {
        return Err("empty program".into());
    }
    lines.iter().enumerate().map(|(i, l)| Inst::parse(l, i)).collect()
}

/// The program's value for one element whose inputs are `inputs`, in f32 as the generated
/// loop computes it (the transcendental functions are the vector kernels' approximations,
/// the rest is exact f32 arithmetic in the program's order). For tables of a byte's 256
/// values (`passes::byte_tables`). `None` for a program that reads a missing input.
pub fn eval(prog: &[Inst], inputs: &[f32]) -> Option<f32> {
    eval_with::<false>(prog, inputs)
}

/// [`eval`] with the transcendental functions' multiply-adds fused where `FMA`: what the
/// generated loop and [`wide`] compute on targets with FMA (`f32::mul_add` is a library
/// call where this code is not compiled for FMA: for tests and tables, not hot loops).
pub fn eval_with<const FMA: bool>(prog: &[Inst], inputs: &[f32]) -> Option<f32> {
    use crate::fast::math;
    let mut v: Vec<f32> = Vec::with_capacity(prog.len());
    for inst in prog {
        let at = |o: Operand| match o {
            Operand::Ref(i) => v[i],
            Operand::Const(c) => c,
        };
        let r = match *inst {
            Inst::Input(k) => *inputs.get(k)?,
            Inst::Unary(u, a) => {
                let a = at(a);
                match u {
                    Unary::Neg => -a,
                    Unary::Abs => a.abs(),
                    Unary::Sqrt => a.sqrt(),
                    // NaN stays NaN, as in the generated loop (`fmax`).
                    Unary::Relu => {
                        if a < 0.0 {
                            0.0
                        } else {
                            a
                        }
                    }
                    Unary::Exp => math::exp_with::<FMA>(a),
                    Unary::Erf => math::erf_with::<FMA>(a),
                    Unary::Tanh => math::tanh_with::<FMA>(a),
                    Unary::Sigmoid => math::sigmoid_with::<FMA>(a),
                    Unary::Reciprocal => 1.0 / a,
                    Unary::Round => a.round_ties_even(),
                }
            }
            Inst::Binary(b, x, y) => {
                let (x, y) = (at(x), at(y));
                match b {
                    Binary::Add => x + y,
                    Binary::Sub => x - y,
                    Binary::Mul => x * y,
                    Binary::Div => x / y,
                    // A NaN on either side gives NaN, as `fmax` / `fmin` do.
                    Binary::Max => {
                        if x.is_nan() || x > y {
                            x
                        } else {
                            y
                        }
                    }
                    Binary::Min => {
                        if x.is_nan() || x < y {
                            x
                        } else {
                            y
                        }
                    }
                }
            }
            // As the generated loop: below lo is lo, above hi is hi, NaN stays NaN.
            Inst::Clip(a, lo, hi) => {
                let m = if at(a) < lo { lo } else { at(a) };
                if m > hi {
                    hi
                } else {
                    m
                }
            }
            Inst::LeakyRelu(a, alpha) => {
                let a = at(a);
                if a >= 0.0 {
                    a
                } else {
                    alpha * a
                }
            }
        };
        v.push(r);
    }
    v.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_text_round_trips() {
        let p = vec![
            Inst::Input(0),
            Inst::Binary(Binary::Mul, Operand::Ref(0), Operand::Const(0.70710677)),
            Inst::Unary(Unary::Erf, Operand::Ref(1)),
            Inst::Clip(Operand::Ref(2), -1.5, 6.0),
            Inst::LeakyRelu(Operand::Ref(3), 0.01),
        ];
        let text: Vec<String> = p.iter().map(|i| i.to_text()).collect();
        assert_eq!(parse(&text).unwrap(), p);
        assert!(Inst::parse("add 3 1", 2).is_err());
    }
}
