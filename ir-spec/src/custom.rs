//! Custom operators: ops aim does not have, supplied by the user — a Rust implementation of
//! [`CustomOp`], or a C library loaded by `aim_runtime::custom_library` — and registered for
//! the whole process by domain and name. Type inference asks a registered op for its
//! outputs' types; the runtime runs it through [`run`], which checks what the kernel
//! returns against those types, so a kernel's mistake is an error naming the node, never a
//! wrong read by the code after it.
//!
//! Registering replaces an earlier op of the same domain and name. The domains aim runs
//! itself (`""`, `ai.onnx`, `aim`) are refused: a custom op extends the op set, it does
//! not shadow an ONNX op.

use crate::{DType, Dim, Node, Tensor, ValueType};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Runs `f(0..n)` on the runtime's threads (the calling one included) and returns when
/// every call has returned. `f` must not call it itself.
pub type ParallelFor<'f> = dyn Fn(usize, &(dyn Fn(usize) + Sync)) + Sync + 'f;

/// What the runtime lends a kernel while it computes: its worker threads.
pub struct Host<'a> {
    /// See [`ParallelFor`].
    pub parallel_for: &'a ParallelFor<'a>,
    /// How many threads `parallel_for` spreads over.
    pub threads: usize,
}

impl Host<'_> {
    /// A host of one thread: `parallel_for` runs the calls in order (the reference
    /// interpreter's, and for tests).
    pub fn sequential() -> Host<'static> {
        Host { parallel_for: &|n, f| (0..n).for_each(f), threads: 1 }
    }
}

/// An operator the user provides.
pub trait CustomOp: Send + Sync {
    /// Its domain (`com.example`).
    fn domain(&self) -> &str;
    /// Its op type within the domain.
    fn name(&self) -> &str;
    /// The types of the node's outputs (one per output the node names) from its input
    /// types (`None` for an absent optional input) and its attributes. Symbolic or unknown
    /// dims are allowed where the inputs have them; when a run's inputs are all known the
    /// output types must be too.
    fn infer(&self, node: &Node, inputs: &[Option<ValueType>]) -> Result<Vec<ValueType>, String>;
    /// Computes the node's outputs from its inputs (`None` for an absent optional input),
    /// with the runtime's threads in `host`; each output must have the type `infer` gives
    /// for these inputs.
    fn compute(&self, node: &Node, inputs: &[Option<Tensor>], host: &Host<'_>) -> Result<Vec<Tensor>, String>;
}

type Registry = HashMap<(String, String), Arc<dyn CustomOp>>;

fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: std::sync::OnceLock<RwLock<Registry>> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(HashMap::new()))
}

/// The domains a custom op may not use: aim's own op sets.
pub const RESERVED_DOMAINS: [&str; 3] = ["", "ai.onnx", "aim"];

/// Registers `op` for the process (replacing an op of the same domain and name), or says
/// why not.
pub fn register(op: Arc<dyn CustomOp>) -> Result<(), String> {
    let (domain, name) = (op.domain().to_string(), op.name().to_string());
    if RESERVED_DOMAINS.contains(&domain.as_str()) {
        return Err(format!(
            "custom op '{name}': domain '{domain}' is aim's own (ONNX's default domain and aim's); give it a domain of its own"
        ));
    }
    if name.is_empty() {
        return Err(format!("a custom op of domain '{domain}' has no name"));
    }
    registry().write().unwrap_or_else(|e| e.into_inner()).insert((domain, name), op);
    Ok(())
}

/// The registered op of `domain` and `op`, if any.
pub fn lookup(domain: &str, op: &str) -> Option<Arc<dyn CustomOp>> {
    if RESERVED_DOMAINS.contains(&domain) {
        return None;
    }
    registry().read().unwrap_or_else(|e| e.into_inner()).get(&(domain.to_string(), op.to_string())).cloned()
}

/// Every registered op as `domain:name`, sorted.
pub fn registered() -> Vec<String> {
    let mut v: Vec<String> =
        registry().read().unwrap_or_else(|e| e.into_inner()).keys().map(|(d, n)| format!("{d}:{n}")).collect();
    v.sort();
    v
}

/// The output types `op` gives for `node`, checked: one per output the node names.
pub fn infer(op: &dyn CustomOp, node: &Node, inputs: &[Option<ValueType>]) -> Result<Vec<ValueType>, String> {
    let outs = op.infer(node, inputs)?;
    if outs.len() != node.outputs.len() {
        return Err(format!(
            "custom op {}:{} inferred {} output types, the node has {} outputs",
            op.domain(),
            op.name(),
            outs.len(),
            node.outputs.len()
        ));
    }
    Ok(outs)
}

/// Runs `op` on `node`'s inputs with `host`'s threads: a panic in it, a failure, or outputs
/// of other types than its own inference gives for these inputs become an error message
/// (the caller names the node).
pub fn run(op: &dyn CustomOp, node: &Node, inputs: &[Option<Tensor>], host: &Host<'_>) -> Result<Vec<Tensor>, String> {
    let types: Vec<Option<ValueType>> =
        inputs.iter().map(|t| t.as_ref().map(|t| ValueType::known(t.dtype(), t.shape()))).collect();
    let want = infer(op, node, &types)?;
    let outs = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op.compute(node, inputs, host))) {
        Ok(r) => r?,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(format!("the custom op's kernel panicked: {msg}"));
        }
    };
    if outs.len() != want.len() {
        return Err(format!("the custom op's kernel returned {} outputs, the node has {}", outs.len(), want.len()));
    }
    for (i, (t, w)) in outs.iter().zip(&want).enumerate() {
        if !fits(t, w) {
            return Err(format!(
                "the custom op's kernel returned output {i} as {}, its inference says {w}",
                describe(t)
            ));
        }
    }
    Ok(outs)
}

/// Whether tensor `t` has type `w` where `w` says anything.
fn fits(t: &Tensor, w: &ValueType) -> bool {
    let dtype_ok = w.dtype.is_none_or(|d| d == t.dtype());
    let shape_ok = w.shape.as_ref().is_none_or(|s| {
        s.len() == t.shape().len() && s.iter().zip(t.shape()).all(|(d, &n)| !matches!(d, Dim::Known(k) if *k != n))
    });
    dtype_ok && shape_ok
}

fn describe(t: &Tensor) -> String {
    ValueType::known(t.dtype(), t.shape()).to_string()
}

/// The element type an ONNX `TensorProto.DataType` code names, for custom-op libraries that
/// speak in codes.
pub fn dtype_of_code(code: i32) -> Option<DType> {
    DType::from_onnx_code(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `y = x * k` (attribute `k`), its output typed as its input.
    struct Scale;
    impl CustomOp for Scale {
        fn domain(&self) -> &str {
            "test.custom"
        }
        fn name(&self) -> &str {
            "Scale"
        }
        fn infer(&self, _: &Node, inputs: &[Option<ValueType>]) -> Result<Vec<ValueType>, String> {
            Ok(vec![inputs.first().cloned().flatten().ok_or("Scale needs an input")?])
        }
        fn compute(&self, node: &Node, inputs: &[Option<Tensor>], _: &Host<'_>) -> Result<Vec<Tensor>, String> {
            let x = inputs[0].as_ref().ok_or("no input")?;
            let k = node.float("k", 1.0) as f64;
            if k == 13.0 {
                return Ok(vec![Tensor::from_f64(DType::F32, &[1], &[0.0])]);
            }
            Ok(vec![Tensor::from_f64(x.dtype(), x.shape(), &x.to_f64_vec().iter().map(|v| v * k).collect::<Vec<_>>())])
        }
    }

    #[test]
    fn registered_ops_run_and_their_outputs_are_checked() {
        register(Arc::new(Scale)).unwrap();
        let op = lookup("test.custom", "Scale").expect("registered");
        assert!(registered().contains(&"test.custom:Scale".to_string()));
        let mut n = Node {
            name: "s".into(),
            op: "Scale".into(),
            domain: "test.custom".into(),
            inputs: vec!["x".into()],
            outputs: vec!["y".into()],
            attrs: Default::default(),
        };
        n.attrs.insert("k".into(), crate::Attr::Float(2.0));
        let x = Tensor::from_slice(&[2], &[1.0f32, 3.0]);
        let y = run(&*op, &n, &[Some(x.clone())], &Host::sequential()).unwrap();
        assert_eq!(y[0].to_f64_vec(), vec![2.0, 6.0]);
        // A kernel whose output disagrees with its own inference is an error, not a value.
        n.attrs.insert("k".into(), crate::Attr::Float(13.0));
        let e = run(&*op, &n, &[Some(x)], &Host::sequential()).unwrap_err();
        assert!(e.contains("output 0 as f32[1]") && e.contains("f32[2]"), "{e}");
    }

    #[test]
    fn a_panicking_kernel_is_an_error() {
        struct Panics;
        impl CustomOp for Panics {
            fn domain(&self) -> &str {
                "test.custom"
            }
            fn name(&self) -> &str {
                "Panics"
            }
            fn infer(&self, _: &Node, inputs: &[Option<ValueType>]) -> Result<Vec<ValueType>, String> {
                Ok(vec![inputs[0].clone().unwrap_or_else(ValueType::unknown)])
            }
            fn compute(&self, _: &Node, _: &[Option<Tensor>], _: &Host<'_>) -> Result<Vec<Tensor>, String> {
                panic!("index 9 out of range")
            }
        }
        let n = Node {
            name: "p".into(),
            op: "Panics".into(),
            domain: "test.custom".into(),
            inputs: vec!["x".into()],
            outputs: vec!["y".into()],
            attrs: Default::default(),
        };
        let e = run(&Panics, &n, &[Some(Tensor::from_slice(&[1], &[1.0f32]))], &Host::sequential()).unwrap_err();
        assert!(e.contains("panicked") && e.contains("index 9 out of range"), "{e}");
    }

    #[test]
    fn aims_own_domains_are_refused() {
        struct Shadow;
        impl CustomOp for Shadow {
            fn domain(&self) -> &str {
                ""
            }
            fn name(&self) -> &str {
                "Relu"
            }
            fn infer(&self, _: &Node, _: &[Option<ValueType>]) -> Result<Vec<ValueType>, String> {
                Ok(vec![])
            }
            fn compute(&self, _: &Node, _: &[Option<Tensor>], _: &Host<'_>) -> Result<Vec<Tensor>, String> {
                Ok(vec![])
            }
        }
        assert!(register(Arc::new(Shadow)).unwrap_err().contains("aim's own"));
        assert!(lookup("", "Relu").is_none());
    }
}
