//! Dead code elimination: nodes none of whose outputs are read, and unread initializers.

use super::{uses::readers, PassError};
use aim_ir::Graph;

/// Removes dead nodes (repeatedly, back to front) and initializers nothing reads.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    loop {
        let r = readers(g);
        let before = g.nodes.len();
        g.nodes.retain(|n| n.outputs.iter().any(|o| !o.is_empty() && r.contains_key(o)));
        if g.nodes.len() == before {
            g.initializers.retain(|k, _| r.contains_key(k));
            let live: std::collections::HashSet<&String> = g.nodes.iter().flat_map(|n| n.outputs.iter()).collect();
            let inputs: std::collections::HashSet<&String> = g.inputs.iter().map(|i| &i.name).collect();
            g.value_types.retain(|k, _| live.contains(k) || inputs.contains(k));
            return Ok(());
        }
    }
}
