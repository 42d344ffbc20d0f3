//! Memory planning: the intermediate tensors of a graph with static shapes, their
//! lifetimes (from the node that defines them to the last node that reads them), and
//! offsets in one arena such that tensors alive at the same time never overlap — first fit,
//! largest tensors first, 64-byte aligned. In place where legal: the output of an
//! elementwise node (each output element reads only the same element of that input), or of
//! a fused convolution or dense layer over its residual, takes the slot of that input when
//! it is the same size and dies at that node.
//!
//! The plan is computed and reported (`aim info`); the executor does not place tensors in
//! the arena yet.

use aim_ir::Graph;
use std::collections::HashMap;

/// One planned tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// The value.
    pub name: String,
    /// Bytes.
    pub bytes: usize,
    /// Index of the defining node.
    pub first: usize,
    /// Index of the last reading node (or the last node, for graph outputs).
    pub last: usize,
    /// Offset in the arena.
    pub offset: usize,
    /// The value whose slot this one reuses in place, if any.
    pub in_place_of: Option<String>,
}

/// A memory plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryPlan {
    /// Every intermediate with a static size.
    pub slots: Vec<Slot>,
    /// The arena size.
    pub arena_bytes: usize,
    /// The sum of all intermediate sizes (what allocating each separately would hold if
    /// nothing were freed).
    pub total_bytes: usize,
    /// Intermediates whose size is not known statically (left out of the plan).
    pub dynamic: Vec<String>,
}

/// Plans the node outputs of `g` (graph inputs and initializers are not in the arena).
pub fn plan(g: &Graph) -> MemoryPlan {
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for inp in n.inputs.iter().filter(|s| !s.is_empty()) {
            last.insert(inp, i);
        }
    }
    let end = g.nodes.len().saturating_sub(1);
    for o in &g.outputs {
        last.insert(&o.name, end);
    }
    let mut slots = Vec::new();
    let mut dynamic = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for o in n.outputs.iter().filter(|s| !s.is_empty()) {
            let size = g.value_types.get(o).and_then(|t| Some(t.concrete_shape()?.iter().product::<usize>() * t.dtype?.size()));
            match size {
                Some(bytes) => slots.push(Slot { name: o.clone(), bytes, first: i, last: *last.get(o.as_str()).unwrap_or(&i), offset: 0, in_place_of: None }),
                None => dynamic.push(o.clone()),
            }
        }
    }
    let total_bytes = slots.iter().map(|s| s.bytes).sum();
    // In place: each slot joins the group of the input whose slot it takes; a group is
    // placed as one allocation living from its first definition to its last read.
    let index: HashMap<String, usize> = slots.iter().enumerate().map(|(k, s)| (s.name.clone(), k)).collect();
    let mut group: Vec<usize> = (0..slots.len()).collect();
    let mut taken = vec![false; slots.len()];
    for k in 0..slots.len() {
        let n = &g.nodes[slots[k].first];
        // Elementwise nodes may overwrite any same-sized input; a fused convolution or dense
        // layer only its residual, which its epilogue reads element by element as it writes.
        let replaceable: &[String] = if elementwise(n) {
            &n.inputs
        } else if n.domain == "aim" && matches!(n.op.as_str(), "Conv" | "Dense") && n.inputs.len() > 3 {
            &n.inputs[3..4]
        } else {
            continue;
        };
        if n.outputs.len() != 1 {
            continue;
        }
        let candidate = replaceable.iter().filter_map(|x| index.get(x).copied()).find(|&x| {
            !taken[x] && slots[x].last == slots[k].first && slots[x].bytes == slots[k].bytes && n.inputs.iter().filter(|y| **y == slots[x].name).count() == 1
        });
        if let Some(x) = candidate {
            taken[x] = true;
            group[k] = group[x];
            slots[k].in_place_of = Some(slots[x].name.clone());
        }
    }
    let groups: Vec<usize> = (0..slots.len()).filter(|&k| group[k] == k).collect();
    let mut spans: HashMap<usize, (usize, usize)> = HashMap::new();
    for (k, s) in slots.iter().enumerate() {
        let e = spans.entry(group[k]).or_insert((s.first, s.last));
        *e = (e.0.min(s.first), e.1.max(s.last));
    }
    let mut order = groups.clone();
    order.sort_by(|&a, &b| slots[b].bytes.cmp(&slots[a].bytes).then(a.cmp(&b)));
    let mut placed: Vec<usize> = Vec::new();
    let mut offsets: HashMap<usize, usize> = HashMap::new();
    let mut arena = 0;
    for r in order {
        let (first, last) = spans[&r];
        let bytes = slots[r].bytes;
        // Intervals taken by placed groups whose lifetimes overlap this one, by offset.
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|p| spans[p].0 <= last && first <= spans[p].1)
            .map(|p| (offsets[p], offsets[p] + slots[*p].bytes))
            .collect();
        busy.sort();
        let mut offset = 0;
        for (a, b) in busy {
            if offset + bytes <= a {
                break;
            }
            offset = offset.max(b.next_multiple_of(64));
        }
        offsets.insert(r, offset);
        arena = arena.max(offset + bytes);
        placed.push(r);
    }
    for k in 0..slots.len() {
        slots[k].offset = offsets[&group[k]];
    }
    MemoryPlan { slots, arena_bytes: arena, total_bytes, dynamic }
}

/// Whether each output element of `n` reads only the same element of its same-shaped
/// inputs (so the output may overwrite such an input).
fn elementwise(n: &aim_ir::Node) -> bool {
    const OPS: &[&str] = &[
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Erf", "Neg", "Abs", "Sqrt", "Reciprocal", "Clip", "Gelu",
        "HardSigmoid", "HardSwish", "Softplus", "Elu", "Selu", "Add", "Sub", "Mul", "Div", "Max", "Min", "Identity",
    ];
    match n.domain.as_str() {
        "" => OPS.contains(&n.op.as_str()),
        "aim" => n.op == "Elementwise",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::text::parse_graph;

    #[test]
    fn a_chain_reuses_memory_and_live_tensors_never_overlap() {
        let mut g = parse_graph(
            "graph \"g\" {\n input %x: f32[1024]\n %a = Relu(%x)  # a\n %b = Relu(%a)  # b\n %c = Relu(%b)  # c\n %d = Add(%c, %b)  # d\n output %d: f32[1024]\n}\n",
        )
        .unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        let p = plan(&g);
        assert_eq!(p.total_bytes, 4 * 4096);
        // b takes a's slot in place (a dies at b); c cannot take b's (b lives until d); d
        // takes c's. Two slots in all, b and c alive together.
        let by = |n: &str| p.slots.iter().find(|s| s.name == n).unwrap();
        assert_eq!(by("b").in_place_of.as_deref(), Some("a"));
        assert_eq!(by("c").in_place_of, None);
        assert_eq!(by("d").in_place_of.as_deref(), Some("c"));
        assert_eq!(p.arena_bytes, 2 * 4096, "{p:?}");
        // Values alive together never overlap, except an in-place output and the input it
        // replaces (which dies as it is made).
        for x in &p.slots {
            for y in &p.slots {
                let replaces = |a: &Slot, b: &Slot| a.in_place_of.as_deref() == Some(b.name.as_str());
                if x.name != y.name && x.first <= y.last && y.first <= x.last && !replaces(x, y) && !replaces(y, x) {
                    assert!(x.offset + x.bytes <= y.offset || y.offset + y.bytes <= x.offset, "{x:?} overlaps {y:?}");
                }
            }
        }
    }
}
