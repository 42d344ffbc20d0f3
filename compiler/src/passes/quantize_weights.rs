//! `--weights int4`: aim's own weight-only quantization of an f32 model's dense layers. A
//! MatMul (or a Gemm, made a MatMul and an Add of its bias) with a constant 2-D f32 weight
//! `[K, N]` gets that weight as a blocked `DequantizeLinear` of 4-bit codes along K — per
//! block of `block` rows and per column: `scale = (max − min) / 15` over the block's values
//! and 0, `zero = round(−min / scale)`, `code = clamp(round(w / scale) + zero, 0, 15)`, as
//! ONNX Runtime's `MatMulNBitsQuantizer` does asymmetrically — which the four-bit-weights
//! pass then keeps at 4 bits in the GEMM's panels. Layers whose K is below one block are
//! left in f32.

use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor};

/// The blockwise codes, scales and zero points of `w` (`[k, n]`, row-major).
pub fn quantize(w: &[f32], k: usize, n: usize, block: usize) -> (Vec<u8>, Vec<f32>, Vec<u8>) {
    let blocks = k.div_ceil(block);
    let (mut codes, mut scales, mut zeros) = (vec![0u8; k * n], vec![0f32; blocks * n], vec![0u8; blocks * n]);
    for b in 0..blocks {
        let rows = b * block..((b + 1) * block).min(k);
        for j in 0..n {
            let (mut lo, mut hi) = (0f32, 0f32);
            for r in rows.clone() {
                lo = lo.min(w[r * n + j]);
                hi = hi.max(w[r * n + j]);
            }
            let scale = if hi > lo { (hi - lo) / 15.0 } else { 1.0 };
            let zero = (-lo / scale).round().clamp(0.0, 15.0);
            for r in rows.clone() {
                codes[r * n + j] = ((w[r * n + j] / scale).round() + zero).clamp(0.0, 15.0) as u8;
            }
            scales[b * n + j] = scale;
            zeros[b * n + j] = zero as u8;
        }
    }
    (codes, scales, zeros)
}

/// Quantizes every eligible dense layer's weight to 4-bit blocks of `block` rows.
pub fn run(g: &mut Graph, block: usize) -> Result<(), PassError> {
    let mut i = 0;
    while i < g.nodes.len() {
        let n = g.nodes[i].clone();
        let Some((w, trans)) = weight(g, &n) else {
            i += 1;
            continue;
        };
        let w = if trans { transpose(&w) } else { w };
        let [k, cols] = w.shape()[..] else {
            i += 1;
            continue;
        };
        if k < block {
            i += 1;
            continue;
        }
        let (codes, scales, zeros) = quantize(w.data::<f32>(), k, cols, block);
        let blocks = k.div_ceil(block);
        let base = format!("{}::int4", n.name);
        let name = |s: &str| format!("{base}_{s}");
        g.initializers.insert(name("codes"), Tensor::from_vec(&[k, cols], codes));
        g.initializers.insert(name("scales"), Tensor::from_slice(&[blocks, cols], &scales));
        g.initializers.insert(name("zeros"), Tensor::from_vec(&[blocks, cols], zeros));
        let mut dq = Node {
            name: name("dequantize"),
            op: "DequantizeLinear".into(),
            domain: String::new(),
            inputs: vec![name("codes"), name("scales"), name("zeros")],
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

/// `w` (`[a, b]`; `weight` gives only 2-D ones) as `[b, a]`.
fn transpose(w: &Tensor) -> Tensor {
    let (a, b) = (w.shape()[0], w.shape()[1]);
    let v = w.data::<f32>();
    let t: Vec<f32> = (0..a * b).map(|i| v[(i % a) * b + i / a]).collect();
    Tensor::from_slice(&[b, a], &t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_weight_is_within_half_a_step_of_its_block() {
        let (k, n, block) = (70, 3, 32);
        let w: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.3).collect();
        let (codes, scales, zeros) = quantize(&w, k, n, block);
        for r in 0..k {
            for j in 0..n {
                let b = r / block;
                let back = (codes[r * n + j] as f32 - zeros[b * n + j] as f32) * scales[b * n + j];
                assert!((back - w[r * n + j]).abs() <= scales[b * n + j] / 2.0 + 1e-6, "{r},{j}");
                assert!(codes[r * n + j] <= 15);
            }
        }
        // An all-zero block: scale 1, zero 0, codes 0.
        let (c, s, z) = quantize(&[0.0; 32], 32, 1, 32);
        assert!(c.iter().all(|&x| x == 0) && s == [1.0] && z == [0]);
    }
}
