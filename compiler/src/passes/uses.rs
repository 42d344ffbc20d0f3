//! Who reads each value: node inputs, graph outputs and reads from inside subgraphs; which
//! node computes each value; and
//! the removal of nodes a pass has marked dead, in one pass over the list.

use aim_ir::{Attr, Graph};
use std::collections::HashMap;

/// For each value a node computes: the index of that node (for the pattern passes, which
/// walk from a node back to the ones feeding it).
pub fn producers(g: &Graph) -> HashMap<&str, usize> {
    g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect()
}

/// For each value: the indices of the nodes reading it; graph outputs count as a read by
/// `usize::MAX`.
pub fn readers(g: &Graph) -> HashMap<String, Vec<usize>> {
    let mut m: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for inp in n.inputs.iter().filter(|s| !s.is_empty()) {
            m.entry(inp.clone()).or_default().push(i);
        }
        for a in n.attrs.values() {
            if let Attr::Graph(sub) = a {
                let mut names = Vec::new();
                sub.names_read(&mut names);
                for name in names {
                    m.entry(name).or_default().push(i);
                }
            }
        }
    }
    for o in &g.outputs {
        m.entry(o.name.clone()).or_default().push(usize::MAX);
    }
    m
}

/// Readers and producers of a graph's values, for the passes that fold a chain into its
/// last node (`fuse::fuse_each`): built once, and again after each fold.
pub struct Chains {
    readers: HashMap<String, Vec<usize>>,
    producers: HashMap<String, usize>,
}

impl Chains {
    /// The readers and producers of `g` as it is now.
    pub fn new(g: &Graph) -> Chains {
        let producers = producers(g).into_iter().map(|(v, k)| (v.to_string(), k)).collect();
        Chains { readers: readers(g), producers }
    }

    /// The node computing `v` when node `reader` is `v`'s only reader (a graph output is
    /// read by the caller too).
    pub fn sole_producer(&self, v: &str, reader: usize) -> Option<usize> {
        let k = *self.producers.get(v)?;
        self.readers.get(v).is_some_and(|r| r.as_slice() == [reader]).then_some(k)
    }

    /// The node reading `v` when it is `v`'s only reader (and `v` is not a graph output).
    pub fn sole_reader(&self, v: &str) -> Option<usize> {
        match self.readers.get(v)?.as_slice() {
            &[r] if r != usize::MAX => Some(r),
            _ => None,
        }
    }
}

/// Removes the nodes whose index is marked in `removed` (the fusion passes mark the nodes they
/// absorbed while indices must stay valid, then drop them all at once).
pub fn remove_marked(g: &mut Graph, removed: &[bool]) {
    let mut k = 0;
    g.nodes.retain(|_| {
        k += 1;
        !removed[k - 1]
    });
}
