//! Constant folding: nodes whose inputs are all constants are evaluated now with the
//! reference kernels, and `Shape`/`Size` of values whose shapes are statically known become
//! constants — which then lets the shape arithmetic around Reshape fold away.

use super::PassError;
use aim_ir::{Graph, Tensor};

/// Ops never folded: control flow (subgraphs) and ops whose result is not a function of
/// their inputs alone.
const KEEP: &[&str] = &[
    "If",
    "Loop",
    "Scan",
    "RandomUniform",
    "RandomNormal",
    "RandomUniformLike",
    "RandomNormalLike",
    "Bernoulli",
    "Multinomial",
];

/// Folds until nothing changes.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let err = |msg: String| PassError { pass: "constant-folding", msg };
    loop {
        aim_ir::infer::infer_types(g).map_err(|e| err(e.to_string()))?;
        let mut changed = false;
        let mut i = 0;
        while i < g.nodes.len() {
            let n = &g.nodes[i];
            if !n.domain.is_empty() || KEEP.contains(&n.op.as_str()) {
                i += 1;
                continue;
            }
            let folded: Option<Vec<Tensor>> = if matches!(n.op.as_str(), "Shape" | "Size") {
                let shape = n.input(0).and_then(|x| g.value_type(x)).and_then(|t| t.concrete_shape());
                match shape {
                    Some(s) => {
                        let probe = Tensor::zeros(aim_ir::DType::U8, &s);
                        let k = aim_kernels::kernel(&n.op).expect("Shape/Size kernels exist");
                        Some(k(n, &[Some(probe)]).map_err(|e| err(format!("node '{}': {}", n.name, e.0)))?)
                    }
                    None => None,
                }
            } else if n.inputs.iter().all(|s| s.is_empty() || g.initializers.contains_key(s)) {
                match aim_kernels::kernel(&n.op) {
                    Some(k) => {
                        let ins: Vec<Option<Tensor>> = n
                            .inputs
                            .iter()
                            .map(|s| if s.is_empty() { None } else { g.initializers.get(s).cloned() })
                            .collect();
                        Some(k(n, &ins).map_err(|e| err(format!("node '{}' ({}): {}", n.name, n.op, e.0)))?)
                    }
                    None => None,
                }
            } else {
                None
            };
            match folded {
                Some(outs) => {
                    let n = g.nodes.remove(i);
                    for (name, t) in n.outputs.iter().zip(outs) {
                        if !name.is_empty() {
                            g.initializers.insert(name.clone(), t);
                        }
                    }
                    changed = true;
                }
                None => i += 1,
            }
        }
        if !changed {
            return Ok(());
        }
    }
}
