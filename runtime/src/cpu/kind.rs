//! How the program runs each node, in a few kinds: what `aim info` counts and the schedule
//! falls back on, decided in one place from the program itself (its prepared nodes, views
//! and compiled bodies) so the two never disagree with what runs.

use super::CpuProgram;

/// The kind of code that runs a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeKind {
    /// A loop generated with Cranelift (fused elementwise, reductions, transposes).
    Generated,
    /// The fused row kernels (scaled, masked softmax).
    RowKernel,
    /// Packed GEMM and direct convolution kernels (with their fused epilogues).
    Library,
    /// A view of its input in the arena: no kernel runs.
    View,
    /// A relabelling of its input or a read of its shape: no data moved.
    Metadata,
    /// A hand-written fast kernel of the library.
    Fast,
    /// Control flow whose bodies are compiled programs.
    CompiledControlFlow,
    /// A custom operator the user registered (`aim_ir::custom`).
    Custom,
    /// The reference kernel (interpreted, unoptimised).
    Reference,
}

impl NodeKind {
    /// The kind in a word or two, for log lines.
    pub fn short(self) -> &'static str {
        match self {
            NodeKind::Generated => "generated",
            NodeKind::RowKernel => "row kernel",
            NodeKind::Library => "packed kernel",
            NodeKind::View => "view",
            NodeKind::Metadata => "metadata",
            NodeKind::Fast => "fast kernel",
            NodeKind::CompiledControlFlow => "compiled control flow",
            NodeKind::Custom => "custom op",
            NodeKind::Reference => "reference kernel",
        }
    }

    /// The kind as `aim info` prints it.
    pub fn label(self) -> &'static str {
        match self {
            NodeKind::Generated => "generated code (Cranelift)",
            NodeKind::RowKernel => "fused row kernels (scaled, masked softmax)",
            NodeKind::Library => "packed GEMM / direct kernels",
            NodeKind::View => "views of their input in the arena (no kernel runs)",
            NodeKind::Metadata => "shape metadata (new shape over the same bytes, or a shape read: no data moved)",
            NodeKind::Fast => "fast kernels (vectorised / parallel)",
            NodeKind::CompiledControlFlow => "control flow with compiled bodies",
            NodeKind::Custom => "custom operators (the user's kernels)",
            NodeKind::Reference => "reference kernels (fallback)",
        }
    }
}

impl CpuProgram {
    /// The kind of code that runs each node of [`CpuProgram::graph`], in order. A fast
    /// kernel counts where it takes the first input's dtype (or that is not known yet) and
    /// has not declined the node in a run so far (then the reference kernel ran it).
    pub fn node_kinds(&self) -> Vec<NodeKind> {
        let g = &self.graph;
        g.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                if n.domain == "aim" {
                    return match n.op.as_str() {
                        "Elementwise" | "Reduce" | "Transpose" => NodeKind::Generated,
                        "Softmax" => NodeKind::RowKernel,
                        "Attention" | "QMatMul" => NodeKind::Fast,
                        _ => NodeKind::Library,
                    };
                }
                if self.values.is_view(i) {
                    return NodeKind::View;
                }
                if self.bodies.contains_key(&i) {
                    return NodeKind::CompiledControlFlow;
                }
                if aim_ir::custom::lookup(&n.domain, &n.op).is_some() {
                    return NodeKind::Custom;
                }
                if !n.domain.is_empty() {
                    return NodeKind::Reference;
                }
                if aim_kernels::fast::moves_no_data(&n.op) {
                    return NodeKind::Metadata;
                }
                let dtype = n.input(0).and_then(|x| g.value_type(x)).and_then(|t| t.dtype);
                let declined = self.declined.get(i).is_some_and(|d| d.load(std::sync::atomic::Ordering::Relaxed));
                if aim_kernels::fast::covers(&n.op, dtype) && !declined {
                    return NodeKind::Fast;
                }
                NodeKind::Reference
            })
            .collect()
    }
}
