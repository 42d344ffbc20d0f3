//! The `aim` domain: the ops aim's own passes make (`ir-spec/SPEC.md`, "The `aim` domain"),
//! one row each — its signature, as for the ONNX ops, and the properties the memory plan,
//! the cpu runtime and the tools ask about.
//!
//! No model file holds these ops, but a `.aim` file does: the verifier checks every `aim`
//! node against its row, so an optimized program that was edited or corrupted (an operand
//! too few, an attribute of the wrong type, an attribute no pass writes) is refused by
//! name before any kernel reads it, and a pass that writes a node its consumers do not
//! expect fails the verification that runs after the pipeline. Adding an `aim` op starts
//! here: a row in [`AIM_OPS`] (kept sorted), then the pass that makes it and the kernel
//! that runs it.

use super::{Attr, AttrKind, OpSchema, Param};

/// How the cpu runtime runs an `aim` op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Prepared at load (weights packed, code chosen) and run from what was prepared.
    Prepared,
    /// A generated elementwise loop (`aim:Elementwise`).
    Loop,
    /// A byte kernel of a quantized region (`runtime/src/cpu/int8.rs`), prepared at load.
    Bytes,
    /// A library kernel run on its operands where they are, nothing prepared.
    Library,
}

/// Where an op stands in a quantized model: what `aim info` and the quantized-node
/// census count as running on integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantized {
    /// An f32 op.
    No,
    /// Integer products or byte arithmetic.
    Integer,
    /// The edge of a byte region: f32 to bytes or back.
    Edge,
}

/// One `aim` op: its signature and what the rest of aim needs to know about it.
#[derive(Clone, Copy, Debug)]
pub struct AimOp {
    /// Inputs, outputs and attributes (`since` is 1: the domain is aim's own).
    pub schema: OpSchema,
    /// How the cpu runtime runs it.
    pub kernel: Kernel,
    /// Inputs `1..baked` (those present) are constants its prepared kernel holds, which
    /// the runtime drops from the graph once prepared; 0 or 1 where every operand is read
    /// at run time.
    pub baked: usize,
    /// Whether it writes bytes into the slot the memory plan gives its first output (the
    /// plan otherwise offers slots to f32 outputs only).
    pub writes_bytes: bool,
    /// Integer, edge or f32.
    pub quantized: Quantized,
}

/// The `aim` op named `op`, if there is one.
pub fn aim_op(op: &str) -> Option<&'static AimOp> {
    AIM_OPS.binary_search_by(|o| o.schema.op.cmp(op)).ok().map(|i| &AIM_OPS[i])
}

/// Drops the attributes of `n`, an ONNX node a pass is turning into the `aim` op of its
/// row, that the row does not name: what a model file carries beyond the ONNX schema (ONNX
/// Runtime would refuse it; aim ignores it, as on the ONNX op) must not make the `aim`
/// node fail verification. `sources` stays.
pub fn retain_known_attrs(n: &mut crate::Node) {
    let Some(o) = aim_op(&n.op) else { return };
    n.attrs.retain(|k, _| k == SOURCES || o.schema.attrs.binary_search_by(|a| a.name.cmp(k)).is_ok());
}

/// Checks the attributes of an `aim` node beyond their types: every attribute is one its
/// row names (or `sources`), and the words some of them hold are ones the kernels know.
pub(super) fn check(n: &crate::Node, s: &OpSchema) -> Result<(), String> {
    for (k, v) in &n.attrs {
        if k == SOURCES {
            if !matches!(v, crate::Attr::Strings(_)) {
                return Err("attribute 'sources' must be a list of strings (STRINGS)".into());
            }
            continue;
        }
        if s.attrs.binary_search_by(|a| a.name.cmp(k)).is_err() {
            return Err(format!("attribute '{k}' is not one aim:{} takes", s.op));
        }
    }
    let one_of = |attr: &str, words: &[&str]| match n.attrs.get(attr) {
        Some(crate::Attr::String(w)) if !words.contains(&w.as_str()) => {
            Err(format!("attribute '{attr}' is '{w}' (expected {})", words.join(" or ")))
        }
        _ => Ok(()),
    };
    one_of("layout", &["NCHWc"])?;
    one_of("in_layout", &["NCHW", "NCHWc"])?;
    one_of("mode", &["sum", "mean", "max", "min"])?;
    one_of("weights", &["f16", "q4"])?;
    for k in ["block", "channels"] {
        if let Some(b) = n.opt_int(k).filter(|&b| b < 1) {
            return Err(format!("attribute '{k}' must be positive, got {b}"));
        }
    }
    Ok(())
}

/// The attribute every node may carry: the ONNX nodes it stands for.
const SOURCES: &str = "sources";

const fn a(name: &'static str, kind: AttrKind) -> Attr {
    Attr { name, kind, required: false, default: None }
}

const fn req(name: &'static str, kind: AttrKind) -> Attr {
    Attr { name, kind, required: true, default: None }
}

const fn op(
    name: &'static str,
    inputs: &'static [Param],
    attrs: &'static [Attr],
    kernel: Kernel,
    baked: usize,
    writes_bytes: bool,
    quantized: Quantized,
) -> AimOp {
    AimOp {
        schema: OpSchema { op: name, since: 1, inputs, outputs: &[Param::One("Y")], attrs },
        kernel,
        baked,
        writes_bytes,
        quantized,
    }
}

use AttrKind::{Float as F, Int as I, Ints as Is, String as S, Strings as Ss};
use Kernel::{Bytes, Library, Loop, Prepared};
use Param::{One, Opt, Var};
use Quantized::{Edge, Integer, No};

/// Every inputs after the first is a baked constant.
const ALL: usize = usize::MAX;

/// Every `aim` op, sorted by name; each attribute list sorted by name.
pub(super) const AIM_OPS: &[AimOp] = &[
    op(
        "Add8",
        &[One("A"), One("B")],
        &[
            req("a_scale", F),
            req("a_zero", I),
            a("act_alpha", F),
            a("act_beta", F),
            a("activation", S),
            req("b_scale", F),
            req("b_zero", I),
            a("clip_max", F),
            a("clip_min", F),
            req("y_scale", F),
            req("y_zero", I),
        ],
        Bytes,
        0,
        true,
        Integer,
    ),
    op(
        "Attention",
        &[One("Q"), One("K"), One("V"), Opt("M")],
        &[a("k_perm", Is), a("out_perm", Is), a("q_perm", Is), a("scale", F), a("v_perm", Is)],
        Library,
        0,
        false,
        No,
    ),
    op(
        "AveragePool",
        &[One("X")],
        &[
            a("auto_pad", S),
            req("block", I),
            a("ceil_mode", I),
            a("count_include_pad", I),
            a("dilations", Is),
            req("kernel_shape", Is),
            req("layout", S),
            a("pads", Is),
            a("strides", Is),
        ],
        Prepared,
        0,
        false,
        No,
    ),
    op(
        "Conv",
        &[One("X"), One("W"), Opt("B"), Opt("R")],
        &[
            a("act_alpha", F),
            a("act_beta", F),
            a("activation", S),
            a("auto_pad", S),
            a("block", I),
            a("clip_max", F),
            a("clip_min", F),
            a("dilations", Is),
            a("exact_sums", I),
            a("group", I),
            a("in_layout", S),
            a("kernel", S),
            a("kernel_shape", Is),
            a("layout", S),
            a("packed_kc", I),
            a("pads", Is),
            a("post", Ss),
            a("prepacked", S),
            a("strides", Is),
            a("weight_shape", Is),
        ],
        Prepared,
        3,
        false,
        No,
    ),
    op(
        "Conv8",
        &[One("X"), One("W"), One("Ws"), Opt("B"), Opt("R")],
        &[
            a("act_alpha", F),
            a("act_beta", F),
            a("activation", S),
            a("clip_max", F),
            a("clip_min", F),
            a("depthwise", I),
            a("dilations", Is),
            a("group", I),
            a("kernel_shape", Is),
            a("mid_scale", F),
            a("mid_zero", I),
            a("pads", Is),
            a("res_act_alpha", F),
            a("res_act_beta", F),
            a("res_activation", S),
            a("res_clip_max", F),
            a("res_clip_min", F),
            a("res_scale", F),
            a("res_zero", I),
            a("strides", Is),
            req("x_scale", F),
            req("x_zero", I),
            req("y_scale", F),
            req("y_zero", I),
        ],
        Bytes,
        4,
        true,
        Integer,
    ),
    op(
        "ConvInteger",
        &[One("X"), One("W"), Opt("Xz"), Opt("S"), Opt("B"), Opt("O")],
        &[
            a("act_alpha", F),
            a("act_beta", F),
            a("activation", S),
            a("clip_max", F),
            a("clip_min", F),
            a("dilations", Is),
            a("doubled", I),
            a("group", I),
            a("kernel_shape", Is),
            a("pads", Is),
            a("post", Ss),
            a("strides", Is),
        ],
        Bytes,
        2,
        false,
        Integer,
    ),
    op(
        "ConvTranspose",
        &[One("X"), One("W"), Opt("B")],
        &[
            a("act_alpha", F),
            a("act_beta", F),
            a("activation", S),
            a("auto_pad", S),
            a("clip_max", F),
            a("clip_min", F),
            a("dilations", Is),
            a("group", I),
            a("kernel_shape", Is),
            a("output_padding", Is),
            a("output_shape", Is),
            a("pads", Is),
            a("strides", Is),
        ],
        Prepared,
        3,
        false,
        No,
    ),
    op(
        "Dense",
        &[One("A"), One("W"), Opt("B"), Opt("R")],
        &[
            a("accuracy_level", I),
            a("act_alpha", F),
            a("act_beta", F),
            a("activation", S),
            a("clip_max", F),
            a("clip_min", F),
            a("packed_kc", I),
            a("post", Ss),
            a("prepacked", S),
            a("q4_shape", Is),
            a("trans_b", I),
            a("weight_shape", Is),
            a("weights", S),
        ],
        Prepared,
        3,
        false,
        No,
    ),
    op("Dequantize8", &[One("X")], &[a("ncw", I), req("scale", F), req("zero", I)], Bytes, 0, false, Edge),
    op("Elementwise", &[Var("X", 1)], &[a("block", I), a("layout", S), req("program", Ss)], Loop, 0, false, No),
    op("FromBlocked", &[One("X")], &[req("block", I), req("channels", I)], Prepared, 0, false, No),
    op(
        "GlobalAveragePool",
        &[One("X")],
        &[req("block", I), req("channels", I), req("layout", S)],
        Prepared,
        0,
        false,
        No,
    ),
    op("GlobalAveragePool8", &[One("X")], &[req("scale", F), req("zero", I)], Bytes, 0, false, Integer),
    op("Lut8", &[One("X")], &[req("table", Is)], Bytes, 0, false, Integer),
    op(
        "MaxPool",
        &[One("X")],
        &[
            a("auto_pad", S),
            req("block", I),
            a("ceil_mode", I),
            a("dilations", Is),
            req("kernel_shape", Is),
            req("layout", S),
            a("pads", Is),
            a("storage_order", I),
            a("strides", Is),
        ],
        Prepared,
        0,
        false,
        No,
    ),
    op(
        "MaxPool8",
        &[One("X")],
        &[
            a("auto_pad", S),
            a("ceil_mode", I),
            a("dilations", Is),
            req("kernel_shape", Is),
            a("pads", Is),
            a("storage_order", I),
            a("strides", Is),
        ],
        Bytes,
        0,
        true,
        Integer,
    ),
    op(
        "QConv",
        &[One("X"), One("W"), One("sx"), One("zx"), One("sw"), Opt("B")],
        &[
            a("act_alpha", F),
            a("act_beta", F),
            a("activation", S),
            a("clip_max", F),
            a("clip_min", F),
            a("dilations", Is),
            a("group", I),
            a("pads", Is),
            a("requant_max", F),
            a("requant_min", F),
            a("requant_scale", F),
            a("requant_zero", F),
            a("strides", Is),
        ],
        Prepared,
        ALL,
        false,
        Integer,
    ),
    op(
        "QDense",
        &[One("X"), One("W"), Opt("Wz"), One("Ws"), Opt("B")],
        &[a("x_scale", F), a("x_zero", I)],
        Prepared,
        ALL,
        false,
        Integer,
    ),
    op(
        "QMatMul",
        &[One("A"), One("B")],
        &[req("a_scale", F), req("a_zero", I), req("b_scale", F), req("b_zero", I)],
        Library,
        0,
        false,
        Integer,
    ),
    op("Quantize8", &[One("X")], &[req("scale", F), req("zero", I)], Bytes, 0, true, Edge),
    op("Reduce", &[One("X")], &[req("axis", I), a("keepdims", I), req("mode", S)], Prepared, 0, false, No),
    op("Softmax", &[One("X"), Opt("M")], &[a("scale", F)], Prepared, 0, false, No),
    op("ToBlocked", &[One("X")], &[req("block", I)], Prepared, 0, false, No),
    op("Transpose", &[One("X")], &[req("perm", Is)], Prepared, 0, false, No),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_their_attributes_are_sorted() {
        assert!(AIM_OPS.windows(2).all(|w| w[0].schema.op < w[1].schema.op));
        for o in AIM_OPS {
            assert!(o.schema.attrs.windows(2).all(|w| w[0].name < w[1].name), "{}", o.schema.op);
        }
    }

    #[test]
    fn properties_follow_the_kernels() {
        let byte_kernels: Vec<&str> =
            AIM_OPS.iter().filter(|o| o.kernel == Kernel::Bytes).map(|o| o.schema.op).collect();
        assert_eq!(
            byte_kernels,
            ["Add8", "Conv8", "ConvInteger", "Dequantize8", "GlobalAveragePool8", "Lut8", "MaxPool8", "Quantize8"]
        );
        assert!(aim_op("Conv8").unwrap().writes_bytes && !aim_op("Lut8").unwrap().writes_bytes);
        assert_eq!(aim_op("Quantize8").unwrap().quantized, Quantized::Edge);
        assert!(aim_op("Nonsense").is_none());
    }
}
