//! Epilogue fusion: a Conv, Gemm or MatMul with a constant weight absorbs what follows it —
//! a constant bias Add, a residual Add, then a Relu or Clip — into one `aim` domain node,
//! `aim:Conv` or `aim:Dense`, that the CPU backend runs as one GEMM with an epilogue. The
//! fused node lists every ONNX node it came from in its `sources` attribute.

use super::{uses::readers, PassError};
use aim_ir::{Attr, DType, Graph, Node, Tensor};

/// Attribute naming the fused activation: `relu`, `clip` or absent.
pub const ACTIVATION: &str = "activation";
/// Lower bound of a fused clip.
pub const CLIP_MIN: &str = "clip_min";
/// Upper bound of a fused clip.
pub const CLIP_MAX: &str = "clip_max";
/// Attribute listing the ONNX nodes a node came from.
pub const SOURCES: &str = "sources";

/// The ONNX nodes a node stands for: its `sources` attribute, or its own name.
pub fn sources_of(n: &Node) -> Vec<String> {
    n.strings(SOURCES).map(|s| s.to_vec()).unwrap_or_else(|| vec![n.name.clone()])
}

fn scalar(g: &Graph, name: Option<&str>) -> Option<Option<f32>> {
    match name {
        None => Some(None),
        Some(n) => {
            let t = g.initializers.get(n)?;
            (t.len() == 1).then(|| Some(t.to_f64_vec()[0] as f32))
        }
    }
}

/// Turns a Conv/Gemm/MatMul with a constant f32 weight into its `aim` form, or None.
fn start(g: &mut Graph, n: &Node) -> Option<Node> {
    let w = g.initializers.get(n.input(1)?)?;
    if w.dtype() != DType::F32 || !n.domain.is_empty() {
        return None;
    }
    let mut f = n.clone();
    f.domain = "aim".into();
    f.attrs.insert(SOURCES.into(), Attr::Strings(sources_of(n)));
    match n.op.as_str() {
        "Conv" => {
            if n.input(2).is_some_and(|b| !g.initializers.contains_key(b)) {
                return None;
            }
            f.inputs.resize(3, String::new());
            Some(f)
        }
        "MatMul" if w.rank() == 2 => {
            f.op = "Dense".into();
            f.inputs = vec![n.inputs[0].clone(), n.inputs[1].clone(), String::new()];
            Some(f)
        }
        "Gemm" if w.rank() == 2 && n.float("alpha", 1.0) == 1.0 && n.int("transA", 0) == 0 => {
            let c = n.input(2);
            if c.is_some() && (n.float("beta", 1.0) != 1.0 || !g.initializers.contains_key(c?)) {
                return None;
            }
            let nout = if n.int("transB", 0) != 0 { w.shape()[0] } else { w.shape()[1] };
            let bias = match c {
                Some(c) => {
                    let t = g.initializers.get(c)?;
                    if t.dtype() != DType::F32 || t.len() != nout {
                        return None;
                    }
                    Some(c.to_string())
                }
                None => None,
            };
            let wname = if n.int("transB", 0) != 0 {
                let wt = aim_kernels::util::transpose(w, &[1, 0]).ok()?;
                let name = format!("{}::w_kn", n.name);
                g.initializers.insert(name.clone(), wt);
                name
            } else {
                n.inputs[1].clone()
            };
            f.op = "Dense".into();
            f.inputs = vec![n.inputs[0].clone(), wname, bias.unwrap_or_default()];
            for a in ["alpha", "beta", "transA", "transB"] {
                f.attrs.remove(a);
            }
            Some(f)
        }
        _ => None,
    }
}

/// Fuses every eligible chain.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let mut i = 0;
    while i < g.nodes.len() {
        let n = g.nodes[i].clone();
        let Some(mut f) = start(g, &n) else {
            i += 1;
            continue;
        };
        // The output's dims (symbolic ones included: equal names are equal sizes), and the
        // number of channels / features, which the weight tells even when the batch is symbolic.
        let out_ty: Option<Vec<aim_ir::Dim>> = g
            .value_types
            .get(&n.outputs[0])
            .and_then(|t| t.shape.clone())
            .filter(|s| !s.contains(&aim_ir::Dim::Unknown));
        let channels =
            g.initializers
                .get(&f.inputs[1])
                .map(|w| if f.op == "Conv" { w.shape()[0] } else { w.shape()[w.rank() - 1] });
        let mut out = n.outputs[0].clone();
        let mut has_residual = false;
        let mut has_act = false;
        let mut absorbed: Vec<usize> = Vec::new();
        loop {
            let r = readers(g);
            let Some(&[next]) = r.get(&out).map(|v| v.as_slice()) else { break };
            if next == usize::MAX || next <= i || absorbed.contains(&next) {
                break;
            }
            let m = g.nodes[next].clone();
            if !m.domain.is_empty() || has_act {
                break;
            }
            let taken = match m.op.as_str() {
                "Add" if m.inputs.len() == 2 => {
                    let other = if m.inputs[0] == out { &m.inputs[1] } else { &m.inputs[0] };
                    if *other == out {
                        break;
                    }
                    let bias_slot_free = f.inputs[2].is_empty();
                    match g.initializers.get(other) {
                        Some(t) if bias_slot_free && t.dtype() == DType::F32 && !has_residual => {
                            // A constant: a bias if it is one value per output channel/feature.
                            let ch = match (f.op.as_str(), &out_ty) {
                                ("Conv", Some(s)) if s.len() >= 2 => channels,
                                ("Dense", Some(s)) if !s.is_empty() => channels,
                                _ => None,
                            };
                            // Right-aligned against the output, every dim but the channel's is 1.
                            let r = out_ty.as_ref().map_or(0, |s| s.len());
                            let channel_dim = if f.op == "Conv" { 1 } else { r.saturating_sub(1) };
                            let shape_ok = ch.is_some_and(|c| {
                                t.rank() <= r
                                    && t.len() == c
                                    && (0..r).all(|d| {
                                        let td = if d + t.rank() >= r { t.shape()[d + t.rank() - r] } else { 1 };
                                        td == if d == channel_dim { c } else { 1 }
                                    })
                            });
                            if shape_ok {
                                let name = format!("{}::bias", n.name);
                                g.initializers
                                    .insert(name.clone(), Tensor::from_vec(&[t.len()], t.data::<f32>().to_vec()));
                                f.inputs[2] = name;
                                true
                            } else {
                                false
                            }
                        }
                        None if !has_residual
                            && out_ty.is_some()
                            && g.value_types.get(other).and_then(|t| t.shape.clone()) == out_ty =>
                        {
                            f.inputs.resize(4, String::new());
                            f.inputs[3] = other.clone();
                            has_residual = true;
                            true
                        }
                        _ => false,
                    }
                }
                "Relu" => {
                    f.attrs.insert(ACTIVATION.into(), Attr::String("relu".into()));
                    has_act = true;
                    true
                }
                "Clip" => match (scalar(g, m.input(1)), scalar(g, m.input(2))) {
                    (Some(lo), Some(hi)) => {
                        f.attrs.insert(ACTIVATION.into(), Attr::String("clip".into()));
                        f.attrs.insert(CLIP_MIN.into(), Attr::Float(lo.unwrap_or(f32::NEG_INFINITY)));
                        f.attrs.insert(CLIP_MAX.into(), Attr::Float(hi.unwrap_or(f32::INFINITY)));
                        has_act = true;
                        true
                    }
                    _ => false,
                },
                _ => false,
            };
            if !taken {
                break;
            }
            let mut srcs = sources_of(&f);
            srcs.push(m.name.clone());
            f.attrs.insert(SOURCES.into(), Attr::Strings(srcs));
            out = m.outputs[0].clone();
            absorbed.push(next);
        }
        f.outputs = vec![out];
        if f.inputs.len() == 4 && f.inputs[3].is_empty() {
            f.inputs.truncate(3);
        }
        // The fused node takes the place of the last node it absorbed: by then its residual
        // (computed on another branch) is defined too.
        let at = absorbed.last().copied().unwrap_or(i);
        g.nodes[at] = f;
        let mut gone: Vec<usize> =
            absorbed.iter().copied().filter(|&k| k != at).chain((at != i).then_some(i)).collect();
        gone.sort_unstable_by(|a, b| b.cmp(a));
        for k in gone {
            g.nodes.remove(k);
        }
        if at == i {
            i += 1;
        }
    }
    Ok(())
}
