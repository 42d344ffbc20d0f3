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

/// The largest value folded at compile time: bigger ones (a ConstantOfShape of a large
/// static shape, an Expand) stay nodes and are computed per run, so loading neither holds
/// them in memory nor fails on them.
pub const MAX_FOLDED_BYTES: usize = 64 << 20;

/// Ops whose result shares its constant input's bytes (a new shape over the same data):
/// folded whatever their size, since folding them allocates nothing. A weight read through
/// them then reaches its kernel's packing as a constant.
const VIEWS: &[&str] = &["Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"];

/// Whether every output of `n` has a static size no larger than [`MAX_FOLDED_BYTES`] (an
/// output whose size inference cannot tell is judged after evaluation).
fn small_enough(g: &Graph, n: &aim_ir::Node) -> bool {
    if VIEWS.contains(&n.op.as_str()) {
        return true;
    }
    n.outputs.iter().filter(|o| !o.is_empty()).all(|o| {
        let Some(t) = g.value_types.get(o) else { return true };
        match (t.dtype, t.concrete_shape()) {
            (Some(d), Some(s)) => aim_ir::limits::bytes_of(d, &s).is_ok_and(|b| b <= MAX_FOLDED_BYTES),
            _ => true,
        }
    })
}

/// Folds until nothing changes. A node whose evaluation fails (bad constants, a size over
/// the limit) is left in place: the run reports its error, naming it, as it would have
/// without folding.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    fold(g, &[])
}

/// Folds as [`run`] does, except nodes of the ops in `defer` (left for a later pass to
/// fold, after passes that read them as they are).
pub fn run_deferring(g: &mut Graph, defer: &[&str]) -> Result<(), PassError> {
    fold(g, defer)
}

/// The values every reader of which is a MatMul reading it as its weight (input 1): a
/// transposed constant read only there stays a Transpose node, which the epilogue fusion
/// absorbs by packing the weight from the untransposed bytes — no transposed copy made.
fn matmul_weights_only(g: &Graph) -> std::collections::HashSet<String> {
    let mut other: std::collections::HashSet<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let mut weights = std::collections::HashSet::new();
    for n in &g.nodes {
        for (k, i) in n.inputs.iter().enumerate() {
            if n.domain.is_empty() && n.op == "MatMul" && k == 1 {
                weights.insert(i.clone());
            } else {
                other.insert(i);
            }
        }
    }
    weights.retain(|w| !other.contains(w.as_str()));
    weights
}

/// Whether `n` transposes a constant 2-D f32 matrix, as a dense layer's packing can read
/// in place.
fn absorbed_transpose(g: &Graph, n: &aim_ir::Node) -> bool {
    let perm_ok = n.ints("perm").is_none_or(|p| p == [1, 0]);
    let w = n.input(0).and_then(|w| g.initializers.get(w));
    n.op == "Transpose" && perm_ok && w.is_some_and(|w| w.rank() == 2 && w.dtype() == aim_ir::DType::F32)
}

fn fold(g: &mut Graph, defer: &[&str]) -> Result<(), PassError> {
    let err = |msg: String| PassError { pass: "constant-folding", msg };
    loop {
        aim_ir::infer::infer_types(g).map_err(|e| err(e.to_string()))?;
        let weights = matmul_weights_only(g);
        let mut changed = false;
        let mut i = 0;
        while i < g.nodes.len() {
            let n = &g.nodes[i];
            if !n.domain.is_empty()
                || KEEP.contains(&n.op.as_str())
                || defer.contains(&n.op.as_str())
                || !small_enough(g, n)
                || (absorbed_transpose(g, n) && n.outputs.iter().all(|o| weights.contains(o)))
            {
                i += 1;
                continue;
            }
            let folded: Option<Vec<Tensor>> = if matches!(n.op.as_str(), "Shape" | "Size") {
                let shape = n.input(0).and_then(|x| g.value_type(x)).and_then(|t| t.concrete_shape());
                shape.and_then(|s| aim_kernels::ops::shape::shape_of(n, &s).ok()).map(|t| vec![t])
            } else if n.inputs.iter().all(|s| s.is_empty() || g.initializers.contains_key(s)) {
                aim_kernels::kernel(&n.op).and_then(|k| {
                    let ins: Vec<Option<Tensor>> = n
                        .inputs
                        .iter()
                        .map(|s| if s.is_empty() { None } else { g.initializers.get(s).cloned() })
                        .collect();
                    let outs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| k(n, &ins))).ok()?.ok()?;
                    let bytes: usize = outs.iter().map(|t| t.bytes().len()).sum();
                    (bytes <= MAX_FOLDED_BYTES || VIEWS.contains(&n.op.as_str())).then_some(outs)
                })
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
