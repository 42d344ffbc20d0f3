//! `--weights int4|int8`: aim's own weight-only quantization of an f32 model's dense layers.
//! A MatMul (or a Gemm, made a MatMul and an Add of its bias) with a constant 2-D f32 weight
//! `[K, N]` gets that weight as a blocked `DequantizeLinear` of integer codes along K, which
//! the coded-weights pass then keeps in their bits in the GEMM's panels:
//! - int4: per block of `block` rows and per column, `scale = (max − min) / 15` over the
//!   block's values and 0, `zero = round(−min / scale)`, `code = clamp(round(w / scale) +
//!   zero, 0, 15)`, as ONNX Runtime's `MatMulNBitsQuantizer` does asymmetrically. Layers
//!   whose K is below one block are left in f32.
//! - int8: per column (one block of all K rows), symmetric: `scale = max|w| / 127`, `code =
//!   round(w / scale)` in −127..=127 as i8, no zero point — the per-channel weights of ONNX
//!   Runtime's `quantize_dynamic` and of most int8 toolchains.
//!
//! The f32 weight is read from its bytes where it lies (a mapped model file: typed access
//! would copy an unaligned one), and once quantized its pages are handed back and the
//! initializer dropped unless something else reads it: the load then never holds every f32
//! weight and every code at once.

use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor};

/// How weights are coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// 4-bit asymmetric codes per block of this many rows.
    Int4 {
        /// Rows per block.
        block: usize,
    },
    /// 8-bit symmetric codes per column.
    Int8,
}

/// The blockwise 4-bit codes, scales and zero points of the `k × n` weight `w(r, j)`.
pub fn quantize(w: impl Fn(usize, usize) -> f32, k: usize, n: usize, block: usize) -> (Vec<u8>, Vec<f32>, Vec<u8>) {
    let blocks = k.div_ceil(block);
    let (mut codes, mut scales, mut zeros) = (vec![0u8; k * n], vec![0f32; blocks * n], vec![0u8; blocks * n]);
    for b in 0..blocks {
        let rows = b * block..((b + 1) * block).min(k);
        for j in 0..n {
            let (mut lo, mut hi) = (0f32, 0f32);
            for r in rows.clone() {
                lo = lo.min(w(r, j));
                hi = hi.max(w(r, j));
            }
            let scale = if hi > lo { (hi - lo) / 15.0 } else { 1.0 };
            let zero = (-lo / scale).round().clamp(0.0, 15.0);
            for r in rows.clone() {
                codes[r * n + j] = ((w(r, j) / scale).round() + zero).clamp(0.0, 15.0) as u8;
            }
            scales[b * n + j] = scale;
            zeros[b * n + j] = zero as u8;
        }
    }
    (codes, scales, zeros)
}

/// The per-column symmetric 8-bit codes and scales of the `k × n` weight `w(r, j)` (a
/// column of zeros gets scale 1 and codes 0).
pub fn quantize_int8(w: impl Fn(usize, usize) -> f32, k: usize, n: usize) -> (Vec<i8>, Vec<f32>) {
    let mut scales = vec![0f32; n];
    for r in 0..k {
        for (j, s) in scales.iter_mut().enumerate() {
            *s = s.max(w(r, j).abs());
        }
    }
    for s in &mut scales {
        *s = if *s > 0.0 { *s / 127.0 } else { 1.0 };
    }
    let mut codes = vec![0i8; k * n];
    for r in 0..k {
        for j in 0..n {
            codes[r * n + j] = (w(r, j) / scales[j]).round().clamp(-127.0, 127.0) as i8;
        }
    }
    (codes, scales)
}

/// Quantizes every eligible dense layer's weight by `scheme`.
pub fn run(g: &mut Graph, scheme: Scheme) -> Result<(), PassError> {
    let mut readers: std::collections::HashMap<String, usize> =
        super::uses::readers(g).into_iter().map(|(v, r)| (v, r.len())).collect();
    let mut i = 0;
    while i < g.nodes.len() {
        let n = g.nodes[i].clone();
        let Some((w, trans)) = weight(g, &n) else {
            i += 1;
            continue;
        };
        let [a, b] = w.shape()[..] else { unreachable!("weight gives 2-D tensors") };
        let (k, cols) = if trans { (b, a) } else { (a, b) };
        let block = match scheme {
            Scheme::Int4 { block } => block,
            Scheme::Int8 => k,
        };
        if k < block {
            i += 1;
            continue;
        }
        // Element (r, j) of the [k, cols] weight, read from the bytes as they lie.
        let bytes = w.bytes();
        let at = |r: usize, j: usize| if trans { j * k + r } else { r * cols + j };
        let value = |r: usize, j: usize| {
            let o = 4 * at(r, j);
            f32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
        };
        let blocks = k.div_ceil(block);
        let base = match scheme {
            Scheme::Int4 { .. } => format!("{}::int4", n.name),
            Scheme::Int8 => format!("{}::int8", n.name),
        };
        let name = |s: &str| format!("{base}_{s}");
        let mut dq_inputs = vec![name("codes"), name("scales")];
        match scheme {
            Scheme::Int4 { .. } => {
                let (codes, scales, zeros) = quantize(value, k, cols, block);
                g.initializers.insert(name("codes"), Tensor::from_vec(&[k, cols], codes));
                g.initializers.insert(name("scales"), Tensor::from_slice(&[blocks, cols], &scales));
                g.initializers.insert(name("zeros"), Tensor::from_vec(&[blocks, cols], zeros));
                dq_inputs.push(name("zeros"));
            }
            Scheme::Int8 => {
                let (codes, scales) = quantize_int8(value, k, cols);
                g.initializers.insert(name("codes"), Tensor::from_vec(&[k, cols], codes));
                g.initializers.insert(name("scales"), Tensor::from_slice(&[1, cols], &scales));
            }
        }
        // The f32 weight is read by nothing else: hand back its pages and drop it.
        let wname = n.inputs[1].clone();
        if let Some(c) = readers.get_mut(&wname) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                if let Some(t) = g.initializers.remove(&wname) {
                    aim_ir::mapped::release_range(t.bytes());
                }
            }
        }
        let mut dq = Node {
            name: name("dequantize"),
            op: "DequantizeLinear".into(),
            domain: String::new(),
            inputs: dq_inputs,
            outputs: vec![name("weight")],
            attrs: Default::default(),
        };
        dq.attrs.insert("axis".into(), Attr::Int(0));
        dq.attrs.insert("block_size".into(), Attr::Int(block as i64));
        let mut mm = n.clone();
        mm.op = "MatMul".into();
        mm.attrs.clear();
        mm.inputs = vec![n.inputs[0].clone(), name("weight")];
        let mut added = vec![dq];
        let bias = (n.op == "Gemm").then(|| n.input(2).map(str::to_string)).flatten();
        if let Some(c) = bias {
            let product = format!("{base}_product");
            mm.outputs = vec![product.clone()];
            added.push(mm);
            added.push(Node {
                name: format!("{base}_bias"),
                op: "Add".into(),
                domain: String::new(),
                inputs: vec![product, c],
                outputs: n.outputs.clone(),
                attrs: Default::default(),
            });
        } else {
            added.push(mm);
        }
        // Every node made here traces back to the layer's own ONNX nodes.
        let sources = Attr::Strings(super::fuse::sources_of(&n));
        for a in &mut added {
            a.attrs.insert(super::fuse::SOURCES.into(), sources.clone());
        }
        let count = added.len();
        g.nodes.splice(i..=i, added);
        i += count;
    }
    super::dce::run(g)
}

/// The constant f32 weight a MatMul or plain Gemm multiplies by, and whether it is stored
/// transposed (`transB`).
fn weight(g: &Graph, n: &Node) -> Option<(Tensor, bool)> {
    if !n.domain.is_empty() || n.outputs.len() != 1 {
        return None;
    }
    let trans = match n.op.as_str() {
        "MatMul" => false,
        "Gemm" if n.float_attr("alpha") == 1.0 && n.float_attr("beta") == 1.0 && n.int("transA", 0) == 0 => {
            n.int("transB", 0) != 0
        }
        _ => return None,
    };
    let w = g.initializers.get(n.input(1)?)?;
    (w.dtype() == DType::F32 && w.rank() == 2 && !w.is_empty()).then(|| (w.clone(), trans))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_weight_is_within_half_a_step_of_its_block() {
        let (k, n, block) = (70, 3, 32);
        let w: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.3).collect();
        let (codes, scales, zeros) = quantize(|r, j| w[r * n + j], k, n, block);
        for r in 0..k {
            for j in 0..n {
                let b = r / block;
                let back = (codes[r * n + j] as f32 - zeros[b * n + j] as f32) * scales[b * n + j];
                assert!((back - w[r * n + j]).abs() <= scales[b * n + j] / 2.0 + 1e-6, "{r},{j}");
                assert!(codes[r * n + j] <= 15);
            }
        }
        // An all-zero block: scale 1, zero 0, codes 0.
        let (c, s, z) = quantize(|_, _| 0.0, 32, 1, 32);
        assert!(c.iter().all(|&x| x == 0) && s == [1.0] && z == [0]);
    }

    /// Per column: within half a step of max|w| / 127, the largest magnitude exact.
    #[test]
    fn int8_codes_are_within_half_a_step_of_their_column() {
        let (k, n) = (37, 4);
        let w: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 103) as f32 / 40.0 - 1.1).collect();
        let (codes, scales) = quantize_int8(|r, j| if j == 3 { 0.0 } else { w[r * n + j] }, k, n);
        for j in 0..3 {
            let max = (0..k).map(|r| w[r * n + j].abs()).fold(0f32, f32::max);
            assert_eq!(scales[j], max / 127.0);
            for r in 0..k {
                let back = codes[r * n + j] as f32 * scales[j];
                assert!((back - w[r * n + j]).abs() <= scales[j] / 2.0 + 1e-6, "{r},{j}");
            }
            assert!((0..k).any(|r| codes[r * n + j].abs() == 127));
        }
        assert!(scales[3] == 1.0 && (0..k).all(|r| codes[r * n + 3] == 0));
    }
}
