//! Unary elementwise ops: math functions and activations (computed in f64 for floats, so
//! the reference is at least as accurate as the type it returns), plus Clip and the
//! integer/bool ops Not, BitwiseNot, IsNaN, IsInf.

use crate::dispatch;
use crate::num::Num;
use crate::util::{err, opt, req, Result};
use aim_ir::{DType, Node, Tensor};

/// The error function, to about 1e-15 (Abramowitz–Stegun 7.1.26 is too coarse for an oracle,
/// so this uses the complementary-error continued fraction and a Taylor series).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Taylor series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut sum = 0.0;
        let mut term = ax;
        let x2 = ax * ax;
        let mut n = 0.0;
        loop {
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
            n += 1.0;
            term *= -x2 / n;
            if n > 200.0 {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if ax > 6.0 {
        1.0
    } else {
        // Continued fraction for erfc, evaluated bottom-up.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / (ax + f) / std::f64::consts::PI.sqrt()
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// Whether `op` (default domain) is a pointwise function of one input, computed by
/// [`unary`]: what a pass may evaluate on a table of inputs (`aim:Lut8`).
pub fn is_pointwise(op: &str) -> bool {
    let n = Node {
        name: String::new(),
        op: op.into(),
        domain: String::new(),
        inputs: vec![],
        outputs: vec![],
        attrs: Default::default(),
    };
    unary_fn(&n).is_some()
}

fn unary_fn(n: &Node) -> Option<Box<dyn Fn(f64) -> f64>> {
    let alpha = |d: f32| n.float("alpha", d) as f64;
    let beta = |d: f32| n.float("beta", d) as f64;
    Some(match n.op.as_str() {
        "Abs" => Box::new(f64::abs),
        "Neg" => Box::new(|x: f64| -x),
        "Sign" => Box::new(|x: f64| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }),
        "Ceil" => Box::new(f64::ceil),
        "Floor" => Box::new(f64::floor),
        "Round" => Box::new(f64::round_ties_even),
        "Sqrt" => Box::new(f64::sqrt),
        "Reciprocal" => Box::new(|x: f64| 1.0 / x),
        "Exp" => Box::new(f64::exp),
        "Log" => Box::new(f64::ln),
        "Sin" => Box::new(f64::sin),
        "Cos" => Box::new(f64::cos),
        "Tan" => Box::new(f64::tan),
        "Asin" => Box::new(f64::asin),
        "Acos" => Box::new(f64::acos),
        "Atan" => Box::new(f64::atan),
        "Sinh" => Box::new(f64::sinh),
        "Cosh" => Box::new(f64::cosh),
        "Asinh" => Box::new(f64::asinh),
        "Acosh" => Box::new(f64::acosh),
        "Atanh" => Box::new(f64::atanh),
        "Erf" => Box::new(erf),
        "Sigmoid" => Box::new(|x: f64| 1.0 / (1.0 + (-x).exp())),
        "Tanh" => Box::new(f64::tanh),
        "Relu" => Box::new(|x: f64| if x.is_nan() { x } else { x.max(0.0) }),
        "LeakyRelu" => {
            let a = alpha(0.01);
            Box::new(move |x| if x >= 0.0 { x } else { a * x })
        }
        "Elu" => {
            let a = alpha(1.0);
            Box::new(move |x| if x >= 0.0 { x } else { a * (x.exp() - 1.0) })
        }
        "Celu" => {
            let a = alpha(1.0);
            Box::new(move |x| x.max(0.0) + (a * ((x / a).exp() - 1.0)).min(0.0))
        }
        "Selu" => {
            let a = alpha(1.673_263_2);
            let g = n.float_attr("gamma") as f64;
            Box::new(move |x| if x > 0.0 { g * x } else { g * a * (x.exp() - 1.0) })
        }
        "HardSigmoid" => {
            let (a, b) = (alpha(0.2), beta(0.5));
            Box::new(move |x| (a * x + b).clamp(0.0, 1.0))
        }
        "HardSwish" => Box::new(|x: f64| x * (x / 6.0 + 0.5).clamp(0.0, 1.0)),
        "Softplus" => Box::new(|x: f64| if x > 30.0 { x } else { x.exp().ln_1p() }),
        "Softsign" => Box::new(|x: f64| x / (1.0 + x.abs())),
        "Mish" => Box::new(|x: f64| x * (if x > 30.0 { x } else { x.exp().ln_1p() }).tanh()),
        "Swish" => {
            let a = alpha(1.0);
            Box::new(move |x| x / (1.0 + (-a * x).exp()))
        }
        "ThresholdedRelu" => {
            let a = alpha(1.0);
            Box::new(move |x| if x > a { x } else { 0.0 })
        }
        "Shrink" => {
            let l = n.float("lambd", 0.5) as f64;
            let b = n.float_attr("bias") as f64;
            Box::new(move |x| {
                if x < -l {
                    x + b
                } else if x > l {
                    x - b
                } else {
                    0.0
                }
            })
        }
        "Gelu" => {
            if n.string("approximate", "none") == "tanh" {
                Box::new(|x: f64| {
                    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
                })
            } else {
                Box::new(|x: f64| 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)))
            }
        }
        _ => return None,
    })
}

/// Ops that work on integers too (the others require floats).
const INT_OK: &[&str] = &["Abs", "Neg", "Sign", "Relu", "Ceil", "Floor", "Round"];

fn unary(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let f = unary_fn(n).expect("registered unary op");
    if x.dtype() == DType::Bool || (!x.dtype().is_float() && !INT_OK.contains(&n.op.as_str())) {
        return err(format!("{} is not defined for {} tensors", n.op, x.dtype()));
    }
    if !x.dtype().is_float() {
        // Integer Abs/Neg/Sign/Relu: exact, wrapping like two's complement.
        return dispatch!(x.dtype(), T => {
            let v: Vec<T> = x.data::<T>().iter().map(|&a| {
                let i = a.to_i128();
                let r = match n.op.as_str() {
                    "Abs" => i.abs(),
                    "Neg" => -i,
                    "Sign" => i.signum(),
                    "Relu" => i.max(0),
                    _ => i,
                };
                T::from_i128(r)
            }).collect();
            Ok(vec![Tensor::from_vec(x.shape(), v)])
        });
    }
    let v: Vec<f64> = x.to_f64_vec().into_iter().map(f).collect();
    Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &v)])
}

fn clip(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let bound = |i: usize| -> Result<Option<f64>> {
        match opt(ins, i) {
            None => Ok(None),
            Some(t) if t.len() == 1 => Ok(Some(t.to_f64_vec()[0])),
            Some(t) => err(format!("Clip bound {i} must be a scalar, got shape {:?}", t.shape())),
        }
    };
    let (lo, hi) = (bound(1)?, bound(2)?);
    dispatch!(x.dtype(), T => {
        let lo = lo.map(T::from_f64);
        let hi = hi.map(T::from_f64);
        let v: Vec<T> = x.data::<T>().iter().map(|&a| {
            let mut a = a;
            if let Some(l) = lo { if a < l { a = l; } }
            if let Some(h) = hi { if a > h { a = h; } }
            a
        }).collect();
        Ok(vec![Tensor::from_vec(x.shape(), v)])
    }, bool => err("Clip is not defined for bool"))
}

fn not(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    if x.dtype() != DType::Bool {
        return err(format!("Not needs a bool tensor, got {}", x.dtype()));
    }
    let v: Vec<bool> = x.data::<u8>().iter().map(|&b| b == 0).collect();
    Ok(vec![Tensor::from_bools(x.shape(), &v)])
}

fn bitwise_not(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    if !x.dtype().is_int() {
        return err(format!("BitwiseNot needs an integer tensor, got {}", x.dtype()));
    }
    dispatch!(x.dtype(), T => {
        let v: Vec<T> = x.data::<T>().iter().map(|&a| T::from_i128(!a.to_i128())).collect();
        Ok(vec![Tensor::from_vec(x.shape(), v)])
    })
}

fn is_nan(_n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let v: Vec<bool> = x.to_f64_vec().iter().map(|a| a.is_nan()).collect();
    Ok(vec![Tensor::from_bools(x.shape(), &v)])
}

fn is_inf(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let x = req(ins, 0)?;
    let (pos, neg) = (n.int("detect_positive", 1) != 0, n.int("detect_negative", 1) != 0);
    let v: Vec<bool> =
        x.to_f64_vec().iter().map(|&a| (a == f64::INFINITY && pos) || (a == f64::NEG_INFINITY && neg)).collect();
    Ok(vec![Tensor::from_bools(x.shape(), &v)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[
    ("Abs", unary),
    ("Neg", unary),
    ("Sign", unary),
    ("Ceil", unary),
    ("Floor", unary),
    ("Round", unary),
    ("Sqrt", unary),
    ("Reciprocal", unary),
    ("Exp", unary),
    ("Log", unary),
    ("Sin", unary),
    ("Cos", unary),
    ("Tan", unary),
    ("Asin", unary),
    ("Acos", unary),
    ("Atan", unary),
    ("Sinh", unary),
    ("Cosh", unary),
    ("Asinh", unary),
    ("Acosh", unary),
    ("Atanh", unary),
    ("Erf", unary),
    ("Sigmoid", unary),
    ("Tanh", unary),
    ("Relu", unary),
    ("LeakyRelu", unary),
    ("Elu", unary),
    ("Celu", unary),
    ("Selu", unary),
    ("HardSigmoid", unary),
    ("HardSwish", unary),
    ("Softplus", unary),
    ("Softsign", unary),
    ("Mish", unary),
    ("Swish", unary),
    ("ThresholdedRelu", unary),
    ("Shrink", unary),
    ("Gelu", unary),
    ("Clip", clip),
    ("Not", not),
    ("BitwiseNot", bitwise_not),
    ("IsNaN", is_nan),
    ("IsInf", is_inf),
];
