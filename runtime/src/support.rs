//! Which ops the runtime can execute, for refusing a model up front with every missing op.

use aim_ir::{Attr, Graph};
use std::collections::BTreeMap;

/// The ops executed by the runtime itself rather than by a kernel.
pub const CONTROL_FLOW: &[&str] = &["If", "Loop", "Scan"];

/// Whether an op of `domain` can be executed: aim's own, or a registered custom op
/// (`aim_ir::custom`).
pub fn is_supported(domain: &str, op: &str) -> bool {
    (matches!(domain, "" | "ai.onnx") && (CONTROL_FLOW.contains(&op) || aim_kernels::kernel(op).is_some()))
        || aim_ir::custom::lookup(domain, op).is_some()
}

/// Every unsupported op in a graph (subgraphs included), as `domain:op` or `op`, with the
/// names of the nodes that use it.
pub fn unsupported_ops(g: &Graph) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    collect(g, &mut out);
    out
}

fn collect(g: &Graph, out: &mut BTreeMap<String, Vec<String>>) {
    for n in &g.nodes {
        if !is_supported(&n.domain, &n.op) {
            let key = if n.domain.is_empty() { n.op.clone() } else { format!("{}:{}", n.domain, n.op) };
            out.entry(key).or_default().push(n.name.clone());
        }
        for a in n.attrs.values() {
            if let Attr::Graph(sub) = a {
                collect(sub, out);
            }
        }
    }
}
