//! BatchNormalization folded into the Conv before it: with constant statistics, BN is a
//! per-channel scale and shift, which the convolution's weights and bias can absorb. A BN
//! that follows something else (an Add, a ConvTranspose, a graph input) becomes that scale
//! and shift as `Mul` and `Add` by per-channel constants, which the layout pass keeps
//! blocked and the fast kernels (or a later convolution's epilogue) run, instead of the
//! reference kernel.

use super::{uses::readers, PassError};
use aim_ir::{DType, Graph, Tensor};

fn f32s(g: &Graph, name: Option<&str>) -> Option<Vec<f32>> {
    let t = g.initializers.get(name?)?;
    (t.dtype() == DType::F32).then(|| t.data::<f32>().to_vec())
}

/// Folds every `Conv → BatchNormalization` pair whose Conv output has no other reader.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    // Reader counts stay valid as pairs fold: a folded Conv takes over its BN's output (and
    // readers), and the Conv's old output had only the BN as reader.
    let r = readers(g);
    let mut i = 0;
    while i < g.nodes.len() {
        let bn = &g.nodes[i];
        if bn.op != "BatchNormalization"
            || !bn.domain.is_empty()
            || bn.int("training_mode", 0) != 0
            || bn.outputs.len() > 1
        {
            i += 1;
            continue;
        }
        let x = bn.inputs[0].clone();
        let Some(ci) = g.nodes.iter().position(|n| n.outputs.first() == Some(&x)) else {
            i += 1;
            continue;
        };
        let conv = &g.nodes[ci];
        let single = r.get(&x).is_some_and(|v| v.len() == 1);
        let (Some(w), Some(scale), Some(beta), Some(mean), Some(var)) = (
            g.initializers.get(conv.input(1).unwrap_or("")).filter(|t| t.dtype() == DType::F32).cloned(),
            f32s(g, bn.input(1)),
            f32s(g, bn.input(2)),
            f32s(g, bn.input(3)),
            f32s(g, bn.input(4)),
        ) else {
            i += 1;
            continue;
        };
        if conv.op != "Conv" || !conv.domain.is_empty() || !single || w.rank() < 3 {
            i += 1;
            continue;
        }
        let m = w.shape()[0];
        if [&scale, &beta, &mean, &var].iter().any(|v| v.len() != m) {
            i += 1;
            continue;
        }
        let eps = bn.float_attr("epsilon");
        let per = w.len() / m;
        let bias = match conv.input(2) {
            Some(b) => match f32s(g, Some(b)) {
                Some(v) if v.len() == m => v,
                _ => {
                    i += 1;
                    continue;
                }
            },
            None => vec![0.0; m],
        };
        // Scaled straight from the weight's bytes (a memory-mapped weight need not be aligned
        // for f32) into the new tensor: one pass, no intermediate copies (ResNet-50: 100 MB).
        let mut folded = Tensor::zeros(DType::F32, w.shape());
        let mut bv = vec![0f32; m];
        {
            let dst = folded.data_mut::<f32>();
            for o in 0..m {
                let k = scale[o] / (var[o] + eps).sqrt();
                let src = &w.bytes()[o * per * 4..(o + 1) * per * 4];
                for (d, b) in dst[o * per..(o + 1) * per].iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * k;
                }
                bv[o] = (bias[o] - mean[o]) * k + beta[o];
            }
        }
        let (conv_name, bn_name, y) = (conv.name.clone(), bn.name.clone(), bn.outputs[0].clone());
        let wname = format!("{conv_name}::folded_w");
        let bname = format!("{conv_name}::folded_b");
        g.initializers.insert(wname.clone(), folded);
        g.initializers.insert(bname.clone(), Tensor::from_vec(&[m], bv));
        let conv = &mut g.nodes[ci];
        conv.inputs = vec![conv.inputs[0].clone(), wname, bname];
        conv.outputs = vec![y];
        let sources = super::fuse::sources_of(conv);
        conv.attrs.insert(super::SOURCES.into(), aim_ir::Attr::Strings([sources, vec![bn_name]].concat()));
        // The BN is gone; the node after it now sits at `i`.
        g.nodes.remove(i);
    }
    scale_shift(g);
    Ok(())
}

/// Rewrites each remaining inference-mode BatchNormalization with constant f32 statistics
/// and an input of known rank as `Mul(x, k) → Add(·, b)`, with `k = scale / sqrt(var + eps)`
/// and `b = beta - mean·k` shaped `[C, 1, …]` to broadcast over the channel axis.
fn scale_shift(g: &mut Graph) {
    let mut i = 0;
    while i < g.nodes.len() {
        let Some((mul, add)) = scale_shift_of(g, i) else {
            i += 1;
            continue;
        };
        g.nodes.splice(i..=i, [mul, add]);
        i += 2;
    }
}

/// The `Mul` and `Add` nodes (with their constants added to `g`) that replace node `i`.
fn scale_shift_of(g: &mut Graph, i: usize) -> Option<(aim_ir::Node, aim_ir::Node)> {
    let bn = &g.nodes[i];
    if bn.op != "BatchNormalization" || !bn.domain.is_empty() || bn.int("training_mode", 0) != 0 || bn.outputs.len() > 1
    {
        return None;
    }
    let rank = g.value_type(&bn.inputs[0]).filter(|t| t.dtype == Some(DType::F32))?.shape?.len();
    let (scale, beta, mean, var) =
        (f32s(g, bn.input(1))?, f32s(g, bn.input(2))?, f32s(g, bn.input(3))?, f32s(g, bn.input(4))?);
    let c = scale.len();
    if rank < 2 || [&beta, &mean, &var].iter().any(|v| v.len() != c) {
        return None;
    }
    let eps = bn.float_attr("epsilon");
    let k: Vec<f32> = (0..c).map(|o| scale[o] / (var[o] + eps).sqrt()).collect();
    let b: Vec<f32> = (0..c).map(|o| beta[o] - mean[o] * k[o]).collect();
    let shape: Vec<usize> = std::iter::once(c).chain(std::iter::repeat_n(1, rank - 2)).collect();
    let (name, x, y) = (bn.name.clone(), bn.inputs[0].clone(), bn.outputs[0].clone());
    let sources = super::fuse::sources_of(bn);
    let (kname, bname, scaled) = (format!("{name}::scale"), format!("{name}::shift"), format!("{name}::scaled"));
    g.initializers.insert(kname.clone(), Tensor::from_vec(&shape, k));
    g.initializers.insert(bname.clone(), Tensor::from_vec(&shape, b));
    let node = |op: &str, inputs: Vec<String>, output: String| aim_ir::Node {
        name: if op == "Mul" { format!("{name}::scale") } else { name.clone() },
        op: op.into(),
        domain: String::new(),
        inputs,
        outputs: vec![output],
        attrs: [(super::SOURCES.to_string(), aim_ir::Attr::Strings(sources.clone()))].into_iter().collect(),
    };
    Some((node("Mul", vec![x, kname], scaled.clone()), node("Add", vec![scaled, bname], y)))
}
