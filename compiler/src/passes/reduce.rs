//! ReduceSum / ReduceMean / ReduceMax / ReduceMin of f32 over trailing axes (the common
//! case: a mean over the last dim, as in decomposed layer norms) become `aim:Reduce` nodes,
//! which the code generator compiles to vectorised row loops. `mode` names the reduction,
//! `axis` the first reduced axis (all axes after it are reduced too), `keepdims` as in
//! ONNX. Other reductions (other dtypes, non-trailing axes, sizes only known at run time
//! along the reduced axes, empty rows) keep their reference kernels.
//!
//! A mean over the spatial dims of a 4-D tensor, kept (`ReduceMean(x, [2, 3])`, as
//! paddle2onnx writes a squeeze-excitation's pooling), is a GlobalAveragePool: it becomes
//! one, which the blocked layout runs without converting its input back to NCHW.

use super::fuse::{sources_of, SOURCES};
use super::PassError;
use crate::codegen::ReduceMode;
use aim_ir::{Attr, DType, Dim, Graph, Node};

/// The first reduced axis of `n` if it reduces a trailing block of known, non-zero dims.
fn trailing_axis(g: &Graph, n: &Node) -> Option<usize> {
    let t = g.value_type(n.input(0)?)?;
    if t.dtype != Some(DType::F32) {
        return None;
    }
    let shape = t.shape.as_ref()?;
    let rank = shape.len() as i64;
    let raw: Vec<i64> = match (n.input(1), n.ints("axes")) {
        (Some(a), _) => g.initializers.get(a)?.to_f64_vec().iter().map(|&v| v as i64).collect(),
        (None, Some(a)) => a.to_vec(),
        (None, None) => vec![],
    };
    let mut axes: Vec<i64> = if raw.is_empty() {
        if n.int("noop_with_empty_axes", 0) != 0 {
            return None;
        }
        (0..rank).collect()
    } else {
        raw.iter().map(|&a| if a < 0 { a + rank } else { a }).collect()
    };
    axes.sort_unstable();
    axes.dedup();
    let first = *axes.first()?;
    let trailing =
        axes.iter().enumerate().all(|(i, &a)| a == first + i as i64) && *axes.last()? == rank - 1 && first >= 0;
    let known = shape[first as usize..].iter().all(|d| matches!(d, Dim::Known(k) if *k > 0));
    (trailing && known && rank > 0).then_some(first as usize)
}

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        if !n.domain.is_empty() || n.outputs.len() != 1 {
            continue;
        }
        let Some(mode) = ReduceMode::from_op(&n.op) else { continue };
        let Some(axis) = trailing_axis(g, n) else { continue };
        let rank = n.input(0).and_then(|x| g.value_type(x)).and_then(|t| t.shape).map_or(0, |s| s.len());
        if mode == ReduceMode::Mean && rank == 4 && axis == 2 && n.int("keepdims", 1) != 0 {
            let mut attrs = std::collections::BTreeMap::new();
            attrs.insert(SOURCES.to_string(), Attr::Strings(sources_of(n)));
            g.nodes[i] = Node {
                name: n.name.clone(),
                op: "GlobalAveragePool".into(),
                domain: String::new(),
                inputs: vec![n.inputs[0].clone()],
                outputs: n.outputs.clone(),
                attrs,
            };
            continue;
        }
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("mode".to_string(), Attr::String(mode.name().into()));
        attrs.insert("axis".to_string(), Attr::Int(axis as i64));
        attrs.insert("keepdims".to_string(), Attr::Int(n.int("keepdims", 1)));
        attrs.insert(SOURCES.to_string(), Attr::Strings(sources_of(n)));
        let r = Node {
            name: n.name.clone(),
            op: "Reduce".into(),
            domain: "aim".into(),
            inputs: vec![n.inputs[0].clone()],
            outputs: n.outputs.clone(),
            attrs,
        };
        g.nodes[i] = r;
    }
    Ok(())
}
