//! Kernel selection: which kernel runs each node, decided by the compiler for the target
//! and written on the node, so that `aim explore` shows it, `.aim` files record it and the
//! runtime only checks and executes it. Today this covers the convolutions: the blocked
//! ones' choice between Winograd, direct and depthwise kernels (the rule is
//! `aim_kernels::nchwc::ConvShape::choose`), the unblocked (NCHW) ones' between the
//! depthwise kernel and the GEMM kernels (`aim_runtime::cpu::nchw_conv_kernel_of`); dense layers have
//! one kernel.

use crate::passes::layout::{BLOCK, IN_LAYOUT, LAYOUT};
use crate::passes::PassError;
use aim_ir::{Attr, Graph};

/// The attribute naming a node's kernel.
pub const KERNEL: &str = "kernel";

/// Records the kernel of every `aim:Conv` of `g` (channel block `lanes` for the blocked
/// ones; GEMM microkernel tiles of `tile` = (rows, columns) for the unblocked ones). A node no kernel fits
/// is left for the runtime to refuse with its reason.
pub fn run(g: &mut Graph, lanes: usize, tile: (usize, usize)) -> Result<(), PassError> {
    let mut choices = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.domain != "aim" || n.op != "Conv" || n.attrs.contains_key(KERNEL) {
            continue;
        }
        let dims: Vec<usize> = match n.attrs.get("weight_shape") {
            Some(Attr::Ints(d)) => d.iter().map(|&x| x.max(0) as usize).collect(),
            _ => match n.input(1).and_then(|w| g.initializers.get(w)) {
                Some(w) => w.shape().to_vec(),
                None => continue,
            },
        };
        if !n.attrs.contains_key(LAYOUT) {
            let output = aim_runtime::cpu::static_output(g, n);
            choices.push((i, aim_runtime::cpu::nchw_conv_kernel_of(n, &dims, output, tile)));
            continue;
        }
        let [cout, cin, kh, kw] = dims[..] else { continue };
        let pair = |name: &str| match n.ints(name) {
            Some([a, b]) => [(*a).max(0) as usize, (*b).max(0) as usize],
            _ => [1, 1],
        };
        let shape = aim_kernels::nchwc::ConvShape {
            kernel: [kh, kw],
            strides: pair("strides"),
            dilations: pair("dilations"),
            group: n.int("group", 1).max(1) as usize,
            blocked_input: n.string(IN_LAYOUT, "NCHWc") == "NCHWc",
            cin,
            cout,
            lanes: n.int(BLOCK, lanes as i64).max(1) as usize,
            exact: n.int(aim_kernels::nchwc::EXACT_SUMS, 0) != 0,
        };
        if let Some(k) = shape.choose() {
            choices.push((i, k.name()));
        }
    }
    for (i, k) in choices {
        g.nodes[i].attrs.insert(KERNEL.into(), Attr::String(k.into()));
    }
    Ok(())
}
