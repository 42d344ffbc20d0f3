//! Value rules the types alone do not state: what ONNX Runtime refuses and aim's kernels
//! rely on. Checked for every node by [`super::check`], so both backends refuse the same
//! nodes with the same message before anything runs.

use crate::Node;

/// Ops with a sliding window (strides, dilations, pads, kernel_shape, auto_pad).
const WINDOWED: &[&str] = &[
    "AveragePool",
    "Conv",
    "ConvInteger",
    "ConvTranspose",
    "DeformConv",
    "LpPool",
    "MaxPool",
    "MaxUnpool",
    "QLinearConv",
];

/// Ops with a `group` attribute.
const GROUPED: &[&str] = &["Conv", "ConvInteger", "ConvTranspose", "DeformConv", "QLinearConv"];

/// Checks `n`'s attribute values.
pub(super) fn check(n: &Node) -> Result<(), String> {
    let op = n.op.as_str();
    if WINDOWED.contains(&op) {
        window(n)?;
    }
    if matches!(op, "Cast" | "EyeLike" | "RandomNormal" | "RandomUniform" | "RandomNormalLike" | "RandomUniformLike") {
        let attr = if op == "Cast" { "to" } else { "dtype" };
        if let Some(code) = n.opt_int(attr) {
            if i32::try_from(code).ok().and_then(crate::DType::from_onnx_code).is_none() {
                return Err(format!("attribute '{attr}' is {code}, which is not an element type aim supports"));
            }
        }
    }
    if GROUPED.contains(&op) && n.opt_int("group").is_some_and(|g| g < 1) {
        return Err(format!("attribute 'group' must be at least 1, got {}", n.int("group", 1)));
    }
    Ok(())
}

/// Strides, dilations and kernel sizes are positive, pads non-negative, the lists agree in
/// length, and `auto_pad` is one of the four values ONNX defines.
fn window(n: &Node) -> Result<(), String> {
    let positive = ["strides", "dilations", "kernel_shape"];
    let mut rank: Option<(&str, usize)> = None;
    for name in positive.iter().chain(&["output_padding"]) {
        let Some(v) = n.ints(name) else { continue };
        if v.is_empty() {
            return Err(format!("attribute '{name}' is an empty list (leave it out for the default)"));
        }
        let min = if *name == "output_padding" { 0 } else { 1 };
        if let Some(bad) = v.iter().find(|&&x| x < min) {
            let want = if min == 1 { "positive" } else { "non-negative" };
            return Err(format!("attribute '{name}' must be {want}, got {bad} in {v:?}"));
        }
        match rank {
            Some((other, r)) if r != v.len() => {
                return Err(format!("attributes '{other}' and '{name}' have {r} and {} values", v.len()))
            }
            _ => rank = Some((name, v.len())),
        }
    }
    if let Some(p) = n.ints("pads") {
        if p.is_empty() {
            return Err("attribute 'pads' is an empty list (leave it out for the default)".into());
        }
        if let Some(bad) = p.iter().find(|&&x| x < 0) {
            return Err(format!("attribute 'pads' must be non-negative, got {bad} in {p:?}"));
        }
        if p.len() % 2 != 0 || rank.is_some_and(|(_, r)| 2 * r != p.len()) {
            return Err(format!("attribute 'pads' has {} values, expected two per spatial dim", p.len()));
        }
    }
    match n.string("auto_pad", "NOTSET") {
        "NOTSET" | "SAME_UPPER" | "SAME_LOWER" | "VALID" => Ok(()),
        other => Err(format!("attribute 'auto_pad' is '{other}' (expected NOTSET, SAME_UPPER, SAME_LOWER or VALID)")),
    }
}
