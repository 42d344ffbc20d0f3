//! A dense layer whose output is split along its features (the fused query-key-value
//! projection of ONNX Runtime's transformer optimizer and of GPT-style exports: one
//! `[K, 3·H]` weight, then `Split` into Q, K and V) becomes one `aim:Dense` per part, each
//! with its columns of the weight and bias, writing the part directly: the Split's copy
//! of every value (and a pass over them) is gone. Parts nothing reads are not computed.
//! Runs at the end of epilogue fusion, on layers without a residual (which would need
//! splitting too); the activation applies per element, so each part keeps it.

use super::fuse::{sources_of, SOURCES, TRANS_B};
use super::uses::readers;
use aim_ir::{Attr, DType, Graph, Node, Tensor};

/// Splits every matching layer (see the module doc).
pub(super) fn run(g: &mut Graph) {
    let mut i = 0;
    let mut r = readers(g);
    while i < g.nodes.len() {
        let found = r.get(&g.nodes[i].outputs[0]).and_then(|rs| match rs[..] {
            [s] if s != usize::MAX => split_of(g, i, s).map(|p| (s, p)),
            _ => None,
        });
        let Some((s, parts)) = found else {
            i += 1;
            continue;
        };
        let nodes = parts_of(g, i, s, &parts);
        // The Split comes after the layer: it goes first, then the parts take the layer's
        // place (whatever reads them comes after the Split, so after them too).
        g.nodes.remove(s);
        let added = nodes.len();
        g.nodes.splice(i..=i, nodes);
        i += added;
        // Node indices moved.
        r = readers(g);
    }
}

/// The column ranges of the parts when node `i` is a plain dense layer (f32 2-D weight,
/// no residual) and node `s`, its only reader, splits its output along the last axis into
/// constant sizes.
fn split_of(g: &Graph, i: usize, s: usize) -> Option<Vec<(usize, usize)>> {
    let f = &g.nodes[i];
    let sp = &g.nodes[s];
    if f.domain != "aim" || f.op != "Dense" || f.inputs.len() > 3 || f.attrs.contains_key("weights") {
        return None;
    }
    if !sp.domain.is_empty() || sp.op != "Split" || sp.input(0) != Some(f.outputs[0].as_str()) {
        return None;
    }
    let w = g.initializers.get(f.input(1)?)?;
    if w.dtype() != DType::F32 || w.rank() != 2 {
        return None;
    }
    let n = if f.int(TRANS_B, 0) != 0 { w.shape()[0] } else { w.shape()[1] };
    let rank = g.value_type(&f.outputs[0])?.shape?.len();
    let axis = sp.int("axis", 0);
    if rank == 0 || !(axis == -1 || axis == rank as i64 - 1) {
        return None;
    }
    let outs = sp.outputs.len();
    let sizes: Vec<i64> = match sp.input(1) {
        Some(v) => g.initializers.get(v).filter(|t| t.dtype().is_int())?.to_i64_vec(),
        None => match sp.ints("split") {
            Some(s) => s.to_vec(),
            // Equal parts (the last smaller where it does not divide, as opset 18 says).
            None if outs > 0 => {
                let each = n.div_ceil(outs) as i64;
                (0..outs as i64).map(|k| (n as i64 - k * each).clamp(0, each)).collect()
            }
            None => return None,
        },
    };
    if sizes.len() != outs || sizes.iter().any(|&z| z <= 0) || sizes.iter().sum::<i64>() != n as i64 {
        return None;
    }
    let mut at = 0;
    Some(
        sizes
            .iter()
            .map(|&z| {
                let part = (at, at + z as usize);
                at += z as usize;
                part
            })
            .collect(),
    )
}

/// One dense layer per read part of layer `i`'s columns, writing Split `s`'s outputs.
fn parts_of(g: &mut Graph, i: usize, s: usize, parts: &[(usize, usize)]) -> Vec<Node> {
    let (f, sp) = (g.nodes[i].clone(), g.nodes[s].clone());
    let w = g.initializers[&f.inputs[1]].clone();
    let bias = f.input(2).and_then(|b| g.initializers.get(b)).map(|b| b.data::<f32>().to_vec());
    let trans = f.int(TRANS_B, 0) != 0;
    let (k, n) = if trans { (w.shape()[1], w.shape()[0]) } else { (w.shape()[0], w.shape()[1]) };
    let data = w.data::<f32>();
    let mut sources = sources_of(&f);
    sources.extend(sources_of(&sp).into_iter().filter(|x| !sources_of(&f).contains(x)));
    let mut out = Vec::new();
    for (j, (&(c0, c1), y)) in parts.iter().zip(&sp.outputs).enumerate() {
        if y.is_empty() {
            continue;
        }
        let cols = c1 - c0;
        // Transposed weights keep their layout: a part is rows of `[N, K]`.
        let part: Vec<f32> = if trans {
            data[c0 * k..c1 * k].to_vec()
        } else {
            (0..k).flat_map(|row| data[row * n + c0..row * n + c1].iter().copied()).collect()
        };
        let shape = if trans { [cols, k] } else { [k, cols] };
        let wname = format!("{}::part{j}", f.inputs[1]);
        g.initializers.insert(wname.clone(), Tensor::from_vec(&shape, part));
        let mut node = f.clone();
        node.name = format!("{}/part{j}", f.name);
        node.inputs[1] = wname;
        if let Some(b) = &bias {
            let bname = format!("{}::part{j}", f.inputs[2]);
            g.initializers.insert(bname.clone(), Tensor::from_vec(&[cols], b[c0..c1].to_vec()));
            node.inputs[2] = bname;
        }
        node.outputs = vec![y.clone()];
        node.attrs.insert(SOURCES.into(), Attr::Strings(sources.clone()));
        out.push(node);
    }
    g.value_types.remove(&f.outputs[0]);
    out
}
