//! Einsum, evaluated directly: every combination of the equation's letters is visited
//! once, products of the operands' elements summed into the output.

use super::window::for_each_index;
use crate::util::{err, same_dtype, strides, Result};
use aim_ir::{Node, Tensor};
use std::collections::BTreeMap;

/// The letter standing for the ellipsis dim `k` places from the end (broadcast dims align
/// on the right): outside `[a-zA-Z]`, so it never clashes with the equation's own letters.
fn ellipsis_letter(k: usize) -> char {
    char::from_u32(0x100 + k as u32).unwrap_or('\u{100}')
}

/// Replaces `...` with private letters for the broadcast dims an operand of `rank` has.
fn expand_ellipsis(term: &str, rank: usize, ell: &mut usize) -> Result<Vec<char>> {
    if term.matches("...").count() > 1 {
        return err(format!("term '{term}' has more than one ellipsis"));
    }
    let letters: Vec<char> = term.replace("...", "").chars().collect();
    if let Some(c) = letters.iter().find(|c| !c.is_ascii_alphabetic()) {
        return err(format!("equation term '{term}' holds '{c}', which is not a letter"));
    }
    if !term.contains("...") {
        return Ok(letters);
    }
    let n = rank
        .checked_sub(letters.len())
        .ok_or_else(|| crate::KernelError(format!("term '{term}' has more letters than rank {rank}")))?;
    *ell = (*ell).max(n);
    let (pre, post) = term.split_once("...").unwrap_or((term, ""));
    let mut out: Vec<char> = pre.chars().collect();
    out.extend((0..n).map(|i| ellipsis_letter(n - 1 - i)));
    out.extend(post.chars());
    Ok(out)
}

fn einsum(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let ts: Vec<&Tensor> = ins.iter().flatten().collect();
    if ts.is_empty() {
        return err("Einsum needs inputs");
    }
    let dt = same_dtype(&ts)?;
    let eq: String = n.string("equation", "").chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((_, r)) if r.contains("->") || r.contains(',') => {
            return err(format!("equation '{eq}' has more than one output term"))
        }
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ts.len() {
        return err(format!("equation '{eq}' has {} operands, {} given", terms.len(), ts.len()));
    }
    let mut ell = 0;
    let mut sizes: BTreeMap<char, usize> = BTreeMap::new();
    let mut ops_letters = Vec::new();
    for (t, term) in ts.iter().zip(&terms) {
        let letters = expand_ellipsis(term, t.rank(), &mut ell)?;
        if letters.len() != t.rank() {
            return err(format!("term '{term}' does not match operand rank {}", t.rank()));
        }
        for (&c, &d) in letters.iter().zip(t.shape()) {
            let e = sizes.entry(c).or_insert(d);
            if *e != d {
                if *e == 1 {
                    *e = d;
                } else if d != 1 {
                    return err(format!("letter '{c}' has sizes {e} and {d}"));
                }
            }
        }
        ops_letters.push(letters);
    }
    let out_letters: Vec<char> = match rhs {
        Some(r) => {
            let letters = expand_ellipsis(&r, ell + r.replace("...", "").len(), &mut ell)?;
            for (i, c) in letters.iter().enumerate() {
                if !sizes.contains_key(c) {
                    return err(format!("equation '{eq}': output letter '{c}' appears in no input"));
                }
                if letters[..i].contains(c) {
                    return err(format!("equation '{eq}': output letter '{c}' appears twice"));
                }
            }
            letters
        }
        None => {
            let mut v: Vec<char> = (0..ell).map(|i| ellipsis_letter(ell - 1 - i)).collect();
            let mut singles: Vec<char> = sizes
                .keys()
                .copied()
                .filter(|c| c.is_ascii_alphabetic() && ops_letters.iter().flatten().filter(|x| *x == c).count() == 1)
                .collect();
            singles.sort();
            v.extend(singles);
            v
        }
    };
    let all: Vec<char> = sizes.keys().copied().collect();
    let dims: Vec<usize> = all.iter().map(|c| sizes[c]).collect();
    let pos = |c: char| all.iter().position(|&x| x == c).unwrap_or(0);
    let out_shape: Vec<usize> = out_letters.iter().map(|&c| sizes.get(&c).copied().unwrap_or(1)).collect();
    crate::util::check_out(dt, &out_shape)?;
    let out_st = strides(&out_shape);
    let vals: Vec<Vec<f64>> = ts.iter().map(|t| t.to_f64_vec()).collect();
    let op_map: Vec<Vec<(usize, usize)>> = ops_letters
        .iter()
        .zip(&ts)
        .map(|(l, t)| {
            let st = strides(t.shape());
            l.iter().enumerate().map(|(k, &c)| (pos(c), if t.shape()[k] == 1 { 0 } else { st[k] })).collect()
        })
        .collect();
    let out_map: Vec<(usize, usize)> = out_letters.iter().enumerate().map(|(k, &c)| (pos(c), out_st[k])).collect();
    let mut y = vec![0.0; out_shape.iter().product()];
    for_each_index(&dims, |idx| {
        let mut p = 1.0;
        for (m, v) in op_map.iter().zip(&vals) {
            p *= v[m.iter().map(|&(a, s)| idx[a] * s).sum::<usize>()];
        }
        y[out_map.iter().map(|&(a, s)| idx[a] * s).sum::<usize>()] += p;
    });
    Ok(vec![Tensor::from_f64(dt, &out_shape, &y)])
}

/// This module's ops.
pub const OPS: &[(&str, crate::Kernel)] = &[("Einsum", einsum)];
