//! Attention's scaled, masked softmax — `Softmax(x / c + mask)` or `Softmax(x · c + mask)`
//! over the last axis, with `c` a constant scalar and the mask running along that axis
//! (shape `[.., L]` with other dims 1 or x's), and the forms without the scale or the mask —
//! becomes one `aim:Softmax` node (`scale`, inputs `x` and the mask), which runs as one pass
//! per row instead of three passes over the scores. Intermediates read elsewhere stop the
//! match; the node keeps every original node in `sources`.

use super::fuse::{sources_of, SOURCES};
use super::uses::Chains;
use super::PassError;
use aim_ir::{Attr, DType, Dim, Graph, Node};

/// The f32 scalar constant `name` holds, if it is one.
fn scalar(g: &Graph, name: &str) -> Option<f32> {
    let t = g.initializers.get(name)?;
    (t.len() == 1 && t.dtype() == DType::F32).then(|| t.data::<f32>()[0])
}

/// Whether `mask` runs along the last axis of `x`: its last dim is x's, and its other dims
/// are 1 or x's (aligned from the right).
fn mask_fits(g: &Graph, mask: &str, x: &[Dim]) -> bool {
    let Some(ms) = g.value_type(mask).filter(|t| t.dtype == Some(DType::F32)).and_then(|t| t.shape.clone()) else {
        return false;
    };
    let r = x.len();
    if ms.is_empty() || ms.len() > r || ms[ms.len() - 1] != x[r - 1] || matches!(x[r - 1], Dim::Unknown) {
        return false;
    }
    ms[..ms.len() - 1]
        .iter()
        .zip(&x[r - ms.len()..r - 1])
        .all(|(a, b)| *a == Dim::Known(1) || (a == b && !matches!(a, Dim::Unknown)))
}

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    super::fuse::fuse_each(g, fuse_at);
    Ok(())
}

/// The fused node for the Softmax at `i`, and the nodes it absorbs.
fn fuse_at(g: &Graph, c: &Chains, i: usize) -> Option<(Node, Vec<usize>)> {
    let sm = &g.nodes[i];
    if !sm.domain.is_empty() || sm.op != "Softmax" || sm.outputs.len() != 1 {
        return None;
    }
    let input = sm.input(0)?;
    let shape = g.value_type(input).filter(|t| t.dtype == Some(DType::F32)).and_then(|t| t.shape.clone())?;
    let r = shape.len() as i64;
    let axis = sm.int("axis", -1);
    if r == 0 || (axis != -1 && axis != r - 1) {
        return None;
    }
    // The producer of `v` when this chain is its only reader and it is a plain binary op.
    let only = |v: &str, reader: usize| -> Option<usize> {
        let k = c.sole_producer(v, reader)?;
        let n = &g.nodes[k];
        (n.domain.is_empty() && n.outputs.len() == 1 && n.inputs.len() == 2).then_some(k)
    };
    let mut absorbed = Vec::new();
    let (mut x, mut mask, mut scale) = (input.to_string(), None, 1.0f32);
    // The mask: Add(scores, mask), either order; the scores have the softmax's shape.
    if let Some(k) = only(&x, i).filter(|&k| g.nodes[k].op == "Add") {
        let n = &g.nodes[k];
        let (a, b) = (n.inputs[0].as_str(), n.inputs[1].as_str());
        let full = |v: &str| g.value_type(v).and_then(|t| t.shape.clone()).as_deref() == Some(shape.as_slice());
        let pick = if full(a) && mask_fits(g, b, &shape) {
            Some((a, b))
        } else if full(b) && mask_fits(g, a, &shape) {
            Some((b, a))
        } else {
            None
        };
        if let Some((s, m)) = pick {
            absorbed.push(k);
            mask = Some(m.to_string());
            x = s.to_string();
        }
    }
    // The scale: Div(scores, c) or Mul(scores, c) / Mul(c, scores).
    let reader = *absorbed.last().unwrap_or(&i);
    if let Some(k) = only(&x, reader).filter(|&k| matches!(g.nodes[k].op.as_str(), "Div" | "Mul")) {
        let n = &g.nodes[k];
        let (a, b) = (n.inputs[0].as_str(), n.inputs[1].as_str());
        let found = match n.op.as_str() {
            "Div" => scalar(g, b).filter(|c| *c != 0.0).map(|c| (a, 1.0 / c)),
            _ => scalar(g, b).map(|c| (a, c)).or_else(|| scalar(g, a).map(|c| (b, c))),
        };
        if let Some((s, c)) =
            found.filter(|(s, _)| g.value_type(s).and_then(|t| t.shape.clone()).as_deref() == Some(shape.as_slice()))
        {
            absorbed.push(k);
            scale = c;
            x = s.to_string();
        }
    }
    if absorbed.is_empty() {
        return None;
    }
    let mut sources = Vec::new();
    for &k in absorbed.iter().rev() {
        sources.extend(sources_of(&g.nodes[k]));
    }
    sources.extend(sources_of(sm));
    let mut attrs = std::collections::BTreeMap::new();
    attrs.insert("scale".to_string(), Attr::Float(scale));
    attrs.insert(SOURCES.to_string(), Attr::Strings(sources));
    let mut inputs = vec![x];
    inputs.extend(mask);
    Some((
        Node {
            name: sm.name.clone(),
            op: "Softmax".into(),
            domain: "aim".into(),
            inputs,
            outputs: sm.outputs.clone(),
            attrs,
        },
        absorbed,
    ))
}
