//! Pools over static shapes get explicit padding: `auto_pad = SAME_UPPER / SAME_LOWER` (as
//! paddle2onnx writes it) becomes the `pads` it stands for, and a MaxPool's `ceil_mode`
//! becomes extra padding at the end (padding never wins a max, so a window that ceil mode
//! lets hang over the input takes the same values). The blocked-layout pool kernel then
//! takes them instead of leaving them in NCHW, with layout conversions around.

use super::PassError;
use aim_ir::{Attr, Graph, Node};

/// Runs the pass.
pub fn run(g: &mut Graph) -> Result<(), PassError> {
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        if !n.domain.is_empty() || !matches!(n.op.as_str(), "MaxPool" | "AveragePool") {
            continue;
        }
        if let Some(pads) = explicit(g, n) {
            let n = &mut g.nodes[i];
            n.attrs.insert("pads".into(), Attr::Ints(pads));
            n.attrs.remove("auto_pad");
            n.attrs.remove("ceil_mode");
        }
    }
    Ok(())
}

/// The explicit `pads` that give `n` the same output, where it needs any rewriting and
/// its input's spatial dims are static; None otherwise (or when it would not be the same).
fn explicit(g: &Graph, n: &Node) -> Option<Vec<i64>> {
    let auto = n.string("auto_pad", "NOTSET");
    let ceil = n.int("ceil_mode", 0) != 0;
    let same = matches!(auto, "SAME_UPPER" | "SAME_LOWER");
    if !same && !ceil {
        return None;
    }
    // An average counts the cells it covers: ceil mode's overhang is not padding there.
    let average = n.op == "AveragePool";
    if average && (ceil || n.int("count_include_pad", 0) != 0) {
        return None;
    }
    if n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return None; // MaxPool's indices output depends on the padding
    }
    let shape = g.value_type(n.input(0)?)?.concrete_shape()?;
    let in_sp = shape.get(2..)?;
    let kernel: Vec<usize> = n.ints("kernel_shape")?.iter().map(|&k| usize::try_from(k).ok()).collect::<Option<_>>()?;
    let w = aim_kernels::ops::window::window(n, in_sp, &kernel, ceil).ok()?;
    let sp = in_sp.len();
    let mut pads = vec![0i64; 2 * sp];
    for d in 0..sp {
        let extent = (kernel[d] - 1) * w.dilations[d] + 1;
        // The end padding that makes the floor formula give the resolved output size.
        let reach = (w.out[d] - 1) * w.strides[d] + extent;
        let end = reach.saturating_sub(in_sp[d] + w.pad_begin[d]);
        // Checked: the floor formula over these pads gives the same output size.
        let total = in_sp[d] + w.pad_begin[d] + end;
        if total < extent || (total - extent) / w.strides[d] + 1 != w.out[d] {
            return None;
        }
        pads[d] = w.pad_begin[d] as i64;
        pads[sp + d] = end as i64;
    }
    Some(pads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::text::parse_graph;

    fn pads_of(attrs: &str, input: &str) -> Option<Vec<i64>> {
        let text = format!(
            "graph \"g\" {{\n  input %x: f32[{input}]\n  %y = MaxPool(%x) {{{attrs}}}  # p\n  output %y: f32[*]\n}}\n"
        );
        let mut g = parse_graph(&text).unwrap();
        aim_ir::infer::infer_types(&mut g).unwrap();
        run(&mut g).unwrap();
        g.nodes[0].ints("pads").map(|p| p.to_vec())
    }

    #[test]
    fn same_and_ceil_become_explicit_pads() {
        // PP-OCRv5/6's 2×2 stride-1 SAME_UPPER max pool: one column and row at the end.
        assert_eq!(
            pads_of("auto_pad=\"SAME_UPPER\", kernel_shape=[2, 2], strides=[1, 1]", "1,4,8,8"),
            Some(vec![0, 0, 1, 1])
        );
        assert_eq!(
            pads_of("auto_pad=\"SAME_LOWER\", kernel_shape=[2, 2], strides=[1, 1]", "1,4,8,8"),
            Some(vec![1, 1, 0, 0])
        );
        // A CRNN's 3×3 stride-2 ceil-mode pool over 9 columns: 4 outputs, one padded column.
        assert_eq!(pads_of("ceil_mode=1, kernel_shape=[3, 3], strides=[2, 2]", "1,4,9,10"), Some(vec![0, 0, 0, 1]));
        // Nothing to rewrite.
        assert_eq!(pads_of("kernel_shape=[2, 2], pads=[1, 1, 1, 1]", "1,4,8,8"), Some(vec![1, 1, 1, 1]));
    }
}
