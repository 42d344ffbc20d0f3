//! Memory planning: the intermediate tensors of a graph with static shapes, their
//! lifetimes (from the node that defines them to the last node that reads them), and
//! offsets in one arena such that tensors alive at the same time never overlap — first fit,
//! largest tensors first, 64-byte aligned.
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
                Some(bytes) => slots.push(Slot { name: o.clone(), bytes, first: i, last: *last.get(o.as_str()).unwrap_or(&i), offset: 0 }),
                None => dynamic.push(o.clone()),
            }
        }
    }
    let total_bytes = slots.iter().map(|s| s.bytes).sum();
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.sort_by(|&a, &b| slots[b].bytes.cmp(&slots[a].bytes).then(a.cmp(&b)));
    let mut placed: Vec<usize> = Vec::new();
    let mut arena = 0;
    for idx in order {
        let s = &slots[idx];
        // Intervals taken by placed slots whose lifetimes overlap this one, by offset.
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .map(|&p| &slots[p])
            .filter(|p| p.first <= s.last && s.first <= p.last)
            .map(|p| (p.offset, p.offset + p.bytes))
            .collect();
        busy.sort();
        let mut offset = 0;
        for (a, b) in busy {
            if offset + s.bytes <= a {
                break;
            }
            offset = offset.max(b.next_multiple_of(64));
        }
        slots[idx].offset = offset;
        arena = arena.max(offset + slots[idx].bytes);
        placed.push(idx);
    }
    MemoryPlan { slots, arena_bytes: arena, total_bytes, dynamic }
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
        // a dies when b is made... but b lives until d: a, b, c alive together at most.
        assert!(p.arena_bytes <= 3 * 4096 && p.arena_bytes >= 2 * 4096, "{p:?}");
        for x in &p.slots {
            for y in &p.slots {
                if x.name != y.name && x.first <= y.last && y.first <= x.last {
                    assert!(x.offset + x.bytes <= y.offset || y.offset + y.bytes <= x.offset, "{x:?} overlaps {y:?}");
                }
            }
        }
    }
}
