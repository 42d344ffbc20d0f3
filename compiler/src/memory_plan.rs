//! Memory planning: where the CPU executor keeps intermediate tensors during a run.
//!
//! The f32 outputs of `aim` nodes (the prepared kernels and generated loops) and of ops
//! with a fast kernel (which writes into a slot it is offered) go into one arena: each value lives from the node that defines
//! it to the last node that reads it, and values alive at the same time never overlap —
//! first fit, largest first, 64-byte aligned. Reshape-like views of such a value (Reshape,
//! Flatten, Squeeze, Unsqueeze, Identity) share its bytes and extend its life. In place
//! where legal: the output of an `aim:Elementwise` loop (each output element reads only the
//! same element of each input) takes the slot of a same-sized input that dies there, and
//! a fused convolution or dense layer the slot of its residual (input 3) when that dies
//! there (the kernels start their sums from it, or the executor copies it out first).
//!
//! Left out of the arena: graph outputs (handed to the caller), values of dynamic size,
//! and the outputs of nodes that run reference kernels (which allocate their results).

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
    /// Index of the last reading node.
    pub last: usize,
    /// Offset in the arena.
    pub offset: usize,
    /// The value whose slot this one overwrites in place, if any.
    pub in_place_of: Option<String>,
    /// The value this one is a view of (same bytes, another shape), if any.
    pub view_of: Option<String>,
}

/// A memory plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryPlan {
    /// Every value placed in the arena.
    pub slots: Vec<Slot>,
    /// The arena size.
    pub arena_bytes: usize,
    /// The bytes of the values placed in the arena, views not counted (what allocating each
    /// separately would hold if nothing were freed).
    pub placed_bytes: usize,
    /// Intermediates whose size is not known statically.
    pub dynamic: Vec<String>,
    /// Values of static size left to their kernels' allocations (outputs of library
    /// kernels, graph outputs), with their bytes.
    pub allocated: Vec<(String, usize)>,
}

/// Ops whose output may share its input's bytes (the kernels return a view, and the
/// executor checks that they did).
const VIEWS: &[&str] = &["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"];

/// Whether `o` is `n`'s first output (the one kernels are offered a slot for).
fn first_output(n: &aim_ir::Node, o: &str) -> bool {
    n.outputs.first().is_some_and(|f| f == o)
}

/// Plans the intermediates of `g` (graph inputs and initializers are not in the arena).
pub fn plan(g: &Graph) -> MemoryPlan {
    // Reads inside subgraphs count at the node holding them (the shared liveness rule).
    let last = aim_ir::liveness::last_reads(g);
    let outputs: std::collections::HashSet<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let mut p = MemoryPlan::default();
    // Slot index by value, and each slot's group: a group (a value, its views, the values
    // written over it in place) is placed as one allocation living from its first
    // definition to its last read.
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut group: Vec<usize> = Vec::new();
    let mut span: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut taken: Vec<bool> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for o in n.outputs.iter().filter(|s| !s.is_empty()) {
            let ty = g.value_types.get(o);
            let size = ty.and_then(|t| aim_ir::limits::bytes_of(t.dtype?, &t.concrete_shape()?).ok());
            let Some(bytes) = size else {
                p.dynamic.push(o.clone());
                continue;
            };
            let dtype = ty.and_then(|t| t.dtype);
            // f32 values, and the bytes the byte ops of quantized regions write.
            let f32_out = dtype == Some(aim_ir::DType::F32)
                || (dtype == Some(aim_ir::DType::U8)
                    && n.domain == "aim"
                    && aim_ir::schema::aim_op(&n.op).is_some_and(|o| o.writes_bytes));
            let source = n.inputs.first().and_then(|x| index.get(x).copied());
            let view = n.domain.is_empty()
                && VIEWS.contains(&n.op.as_str())
                && n.outputs.len() == 1
                && source.is_some_and(|x| p.slots[x].bytes == bytes);
            let writes_slot = f32_out
                && first_output(n, o)
                && (n.domain == "aim" || (n.domain.is_empty() && aim_kernels::fast::kernel(&n.op).is_some()));
            if outputs.contains(o.as_str()) || !(view || writes_slot) {
                p.allocated.push((o.clone(), bytes));
                continue;
            }
            let k = p.slots.len();
            let mut slot = Slot {
                name: o.clone(),
                bytes,
                first: i,
                last: last.get(o.as_str()).copied().unwrap_or(i).max(i),
                offset: 0,
                in_place_of: None,
                view_of: None,
            };
            let mut g_k = k;
            if view {
                let x = source.expect("a view has a placed source");
                slot.view_of = Some(p.slots[x].name.clone());
                g_k = group[x];
            } else if n.domain == "aim"
                && n.outputs.len() == 1
                && matches!(n.op.as_str(), "Elementwise" | "Conv" | "Dense")
            {
                // In place over an input whose whole group dies here and that is read once:
                // any input of an elementwise loop, the residual of a fused layer.
                let replaceable: &[String] =
                    if n.op == "Elementwise" { &n.inputs } else { n.inputs.get(3..4).unwrap_or(&[]) };
                let candidate = replaceable.iter().filter_map(|x| index.get(x).copied()).find(|&x| {
                    !taken[x]
                        && span[&group[x]].1 == i
                        && p.slots[x].bytes == bytes
                        && p.slots[x].view_of.is_none()
                        && n.inputs.iter().filter(|y| **y == p.slots[x].name).count() == 1
                });
                if let Some(x) = candidate {
                    taken[x] = true;
                    slot.in_place_of = Some(p.slots[x].name.clone());
                    g_k = group[x];
                }
            }
            let e = span.entry(g_k).or_insert((slot.first, slot.last));
            *e = (e.0.min(slot.first), e.1.max(slot.last));
            if slot.view_of.is_none() {
                p.placed_bytes += bytes;
            }
            index.insert(o.clone(), k);
            group.push(g_k);
            taken.push(false);
            p.slots.push(slot);
        }
    }
    let mut order: Vec<usize> = (0..p.slots.len()).filter(|&k| group[k] == k).collect();
    order.sort_by(|&a, &b| p.slots[b].bytes.cmp(&p.slots[a].bytes).then(a.cmp(&b)));
    let mut placed: Vec<usize> = Vec::new();
    let mut offsets: HashMap<usize, usize> = HashMap::new();
    for r in order {
        let (first, last) = span[&r];
        let bytes = p.slots[r].bytes;
        // Intervals taken by placed groups whose lifetimes overlap this one, by offset.
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|q| span[q].0 <= last && first <= span[q].1)
            .map(|q| (offsets[q], offsets[q] + p.slots[*q].bytes))
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
        p.arena_bytes = p.arena_bytes.max(offset + bytes);
        placed.push(r);
    }
    for k in 0..p.slots.len() {
        p.slots[k].offset = offsets[&group[k]];
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::text::parse_graph;

    /// Parses `text`, infers types, then turns every Relu/Add into an `aim:Elementwise`
    /// loop and every Sigmoid or Sum into an `aim:Dense`-like kernel node (placement only
    /// looks at the domain, op and operand positions: a Sum's fourth input stands for a
    /// residual).
    fn lowered(text: &str) -> aim_ir::Graph {
        let mut g = parse_graph(text).unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        for n in &mut g.nodes {
            match n.op.as_str() {
                "Relu" | "Add" => (n.domain, n.op) = ("aim".into(), "Elementwise".into()),
                "Sigmoid" | "Sum" => (n.domain, n.op) = ("aim".into(), "Dense".into()),
                _ => {}
            }
        }
        g
    }

    /// Values alive together never overlap, except an in-place output and the input it
    /// replaces (which dies as it is made) and views of one value.
    fn check_disjoint(p: &MemoryPlan) {
        let base = |s: &Slot| -> String {
            let mut s = s;
            while let Some(v) = &s.view_of {
                s = p.slots.iter().find(|x| &x.name == v).unwrap();
            }
            s.name.clone()
        };
        for x in &p.slots {
            for y in &p.slots {
                let replaces = |a: &Slot, b: &Slot| a.in_place_of.as_deref() == Some(b.name.as_str());
                let same = base(x) == base(y);
                if x.name != y.name
                    && x.first <= y.last
                    && y.first <= x.last
                    && !replaces(x, y)
                    && !replaces(y, x)
                    && !same
                {
                    assert!(x.offset + x.bytes <= y.offset || y.offset + y.bytes <= x.offset, "{x:?} overlaps {y:?}");
                }
            }
        }
    }

    #[test]
    fn a_chain_reuses_memory_and_live_tensors_never_overlap() {
        let g = lowered(
            "graph \"g\" {\n input %x: f32[1024]\n %a = Relu(%x)  # a\n %b = Relu(%a)  # b\n %c = Relu(%b)  # c\n %d = Add(%c, %b)  # d\n %e = Relu(%d)  # e\n output %e: f32[1024]\n}\n",
        );
        let p = plan(&g);
        // b takes a's slot in place (a dies at b); c cannot take b's (b lives until d); d
        // takes c's. Two slots in all, b and c alive together. e is a graph output: it is
        // allocated for the caller, not placed.
        let by = |n: &str| p.slots.iter().find(|s| s.name == n).unwrap();
        assert_eq!(by("b").in_place_of.as_deref(), Some("a"));
        assert_eq!(by("c").in_place_of, None);
        assert_eq!(by("d").in_place_of.as_deref(), Some("c"));
        assert_eq!(p.allocated, vec![("e".to_string(), 4096)]);
        assert_eq!(p.placed_bytes, 4 * 4096);
        assert_eq!(p.arena_bytes, 2 * 4096, "{p:?}");
        check_disjoint(&p);
    }

    #[test]
    fn a_fused_layer_overwrites_its_residual_when_it_dies_there() {
        let g = lowered(
            "graph \"g\" {\n input %x: f32[64]\n %r = Sigmoid(%x)  # r\n %k = Sigmoid(%x)  # k\n %a = Sum(%x, %x, %x, %r)  # a\n %b = Sum(%x, %x, %x, %k)  # b\n %c = Add(%a, %b)  # c\n %y = Exp(%c)  # y\n %z = Exp(%k)  # z\n output %y: f32[64]\n output %z: f32[64]\n}\n",
        );
        let p = plan(&g);
        let by = |n: &str| p.slots.iter().find(|s| s.name == n).unwrap();
        // r dies at a: a takes its slot. k is read again later (by z): b may not.
        assert_eq!(by("a").in_place_of.as_deref(), Some("r"));
        assert_eq!(by("a").offset, by("r").offset);
        assert_eq!(by("b").in_place_of, None);
        check_disjoint(&p);
    }

    #[test]
    fn views_share_bytes_and_extend_the_life_of_their_source() {
        let g = lowered(
            "graph \"g\" {\n input %x: f32[4, 8]\n %a = Sigmoid(%x)  # a\n %v = Flatten(%a)  # v\n %b = Sigmoid(%x)  # b\n %c = Relu(%b)  # c\n %d = Add(%v, %c)  # d\n %e = Exp(%d)  # e\n output %e: f32[4, 8]\n}\n",
        );
        let p = plan(&g);
        let by = |n: &str| p.slots.iter().find(|s| s.name == n).unwrap();
        // v is a's bytes; a's group lives until d reads v, so b (alive meanwhile) goes
        // elsewhere; c overwrites b, d overwrites c (its group ends at d) but not v's group.
        assert_eq!(by("v").view_of.as_deref(), Some("a"));
        assert_eq!(by("v").offset, by("a").offset);
        assert_ne!(by("b").offset, by("a").offset);
        assert_eq!(by("c").in_place_of.as_deref(), Some("b"));
        assert_eq!(by("d").in_place_of.as_deref(), Some("c"));
        // Exp is a library kernel here: its output (a graph output too) is allocated.
        assert_eq!(p.allocated, vec![("e".to_string(), 128)]);
        assert_eq!(p.placed_bytes, 4 * 128, "views take no bytes of their own");
        assert_eq!(p.arena_bytes, 2 * 128, "{p:?}");
        check_disjoint(&p);
    }
}
