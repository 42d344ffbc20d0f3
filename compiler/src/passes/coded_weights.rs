//! Dense layers whose weights stay in their bits (cpu backend): a MatMul whose B is a
//! blocked `DequantizeLinear` (along K) of constant 8-bit integer codes — what `MatMulNBits`
//! imports to, what ONNX's own blocked quantization writes, what `--weights int4|int8` make
//! — becomes an `aim:Dense` holding the codes (4 bits each where they all fit, else 8),
//! their scales and zero points in the GEMM's panel layout (`aim_kernels::gemm::coded`),
//! laid out here for the target's panel width. The runtime reads them in place and widens
//! each panel as the GEMM reads it, with the f32 weights' bits: an eighth (a quarter) of
//! their memory and of the bytes each product streams. Signed codes are stored offset by
//! 128 (code + 128 with zero point + 128: the same differences).

use super::fuse::SOURCES;
use super::PassError;
use aim_ir::{Attr, DType, Graph, Node, Tensor};
use aim_kernels::gemm::CodedShape;
use std::collections::HashMap;

/// `weights` attribute value of a dense layer with coded weights (named when they were
/// 4-bit only; kept so that compiled files stay readable).
pub const Q4: &str = "q4";
/// Attribute of such a layer: `[k, n, block, nr, zeros, bits]` of its [`CodedShape`].
pub const Q4_SHAPE: &str = "q4_shape";
/// ONNX Runtime's `MatMulNBits` accuracy level, on the dequantization `MatMulNBits` imports
/// to and then on the dense layer: at 4, few-row products may quantize their rows to int8.
pub const ACCURACY_LEVEL: &str = "accuracy_level";

/// The [`CodedShape`] a dense layer records, if its weights are coded.
pub fn shape_of(n: &Node) -> Option<CodedShape> {
    if !matches!(n.attrs.get("weights"), Some(Attr::String(s)) if s == Q4) {
        return None;
    }
    CodedShape::from_ints(n.ints(Q4_SHAPE)?)
}

/// Rewrites every eligible MatMul for panels of `nr` columns.
pub fn run(g: &mut Graph, nr: usize) -> Result<(), PassError> {
    let producers: HashMap<String, usize> =
        g.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i))).collect();
    // Readers per value, so that each layer's unpacked codes are dropped as soon as their
    // packed form exists (every layer's codes and packing alive at once would be the peak of
    // the load: a byte per weight on top of the packed one).
    let mut readers: HashMap<String, usize> = super::uses::readers(g).into_iter().map(|(v, r)| (v, r.len())).collect();
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        if !n.domain.is_empty() || n.op != "MatMul" || n.inputs.len() != 2 {
            continue;
        }
        let Some(&d) = producers.get(&n.inputs[1]) else { continue };
        let Some((shape, blob)) = layout(g, &g.nodes[d], nr) else { continue };
        let name = format!("{}::q4", g.nodes[d].outputs[0]);
        if !g.initializers.contains_key(&name) {
            g.initializers.insert(name.clone(), blob);
        }
        let dq = super::fuse::sources_of(&g.nodes[d]);
        let level = g.nodes[d].opt_int(ACCURACY_LEVEL);
        let f = &mut g.nodes[i];
        let mut sources = super::fuse::sources_of(f);
        for s in dq {
            if !sources.contains(&s) {
                sources.push(s);
            }
        }
        f.domain = "aim".into();
        f.op = "Dense".into();
        f.inputs = vec![f.inputs[0].clone(), name, String::new()];
        f.attrs.insert(SOURCES.into(), Attr::Strings(sources));
        f.attrs.insert("weights".into(), Attr::String(Q4.into()));
        f.attrs.insert(Q4_SHAPE.into(), Attr::Ints(shape.to_ints()));
        if let Some(level) = level {
            f.attrs.insert(ACCURACY_LEVEL.into(), Attr::Int(level));
        }
        let out = g.nodes[d].outputs[0].clone();
        if release(&mut readers, &out) {
            // The dequantization is now unread (DCE removes it below): so are its constants
            // unless something else reads them.
            for x in g.nodes[d].inputs.clone() {
                if release(&mut readers, &x) {
                    g.initializers.remove(&x);
                }
            }
        }
    }
    super::dce::run(g)
}

/// One reader of `x` fewer; whether none is left.
fn release(readers: &mut HashMap<String, usize>, x: &str) -> bool {
    match readers.get_mut(x) {
        Some(c) => {
            *c = c.saturating_sub(1);
            *c == 0
        }
        None => false,
    }
}

/// The coded layout of `d`'s output, if `d` is a blocked DequantizeLinear along axis 0 of a
/// constant 2-D u8 or i8 tensor of codes, with constant f32 scales and zero points of the
/// codes' type.
fn layout(g: &Graph, d: &Node, nr: usize) -> Option<(CodedShape, Tensor)> {
    if !d.domain.is_empty() || d.op != "DequantizeLinear" || !matches!(d.int("axis", 1), 0 | -2) {
        return None;
    }
    let block = usize::try_from(d.int("block_size", 0)).ok().filter(|&b| b > 0)?;
    let codes = g.initializers.get(d.input(0)?)?;
    let scales = g.initializers.get(d.input(1)?)?;
    let zeros = match d.input(2) {
        Some(z) => Some(g.initializers.get(z)?),
        None => None,
    };
    let [k, n] = codes.shape()[..] else { return None };
    let blocks = k.div_ceil(block);
    let params_ok = |t: &Tensor, dt: DType| t.dtype() == dt && t.shape() == [blocks, n];
    let signed = codes.dtype() == DType::I8;
    let ok = matches!(codes.dtype(), DType::U8 | DType::I8)
        && params_ok(scales, DType::F32)
        && zeros.is_none_or(|z| params_ok(z, codes.dtype()));
    if !ok {
        return None;
    }
    // Signed codes move to u8 by +128 (flipping the top bit), their zero point with them.
    let flip = if signed { 0x80 } else { 0 };
    let bits = if !signed && codes.column_codes().is_some_and(|(_, f)| f.bits == 4) || fit4(codes.bytes(), flip) {
        4
    } else {
        8
    };
    let shape = CodedShape { k, n, block, nr, zeros: zeros.is_some() || signed, bits };
    shape.check().ok()?;
    let s = scales.data::<f32>();
    let z = zeros.map(|z| z.bytes());
    let (scale, zero) = (|b, j| s[b * n + j], |b, j| z.map_or(0, |z: &[u8]| z[b * n + j]) ^ flip);
    let blob = match codes.column_codes() {
        // 4-bit codes as MatMulNBits stores them: a column's byte r holds its rows 2r, 2r + 1.
        Some((packed, form)) if form.bits == 4 && (form.k, form.n) == (k, n) => {
            let per_col = form.blocks() * form.blob();
            let pair = |r: usize, j: usize| {
                let byte = packed[j * per_col + r];
                if 2 * r + 1 < k {
                    byte
                } else {
                    byte & 15
                }
            };
            let blob = shape.pack_rows(pair, scale, zero);
            // Those bytes of the model file are now held in the kernel's layout.
            aim_ir::mapped::release_range(packed);
            blob
        }
        _ => {
            let q = codes.bytes();
            shape.pack(|p, j| q[p * n + j] ^ flip, scale, zero)
        }
    };
    Some((shape, Tensor::from_vec(&[blob.len()], blob)))
}

/// Whether every code (as u8 after `flip`) fits in 4 bits.
fn fit4(codes: &[u8], flip: u8) -> bool {
    codes.iter().all(|&c| c ^ flip <= 15)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aim_ir::text::parse_graph;

    fn graph(codes: &str, zeros: bool) -> Graph {
        let zp = if zeros { ", %z" } else { "" };
        let text = format!(
            "graph \"g\" {{\n  input %x: f32[2,3]\n  init %q = u8[3,2] [{codes}]\n  init %s = f32[2,2] [0.5, 0.25, 2.0, 1.0]\n  init %z = u8[2,2] [8, 8, 1, 0]\n  %w = DequantizeLinear(%q, %s{zp}) {{axis=0, block_size=2}}  # dq\n  %y = MatMul(%x, %w)  # mm\n  output %y: f32[2,2]\n}}\n"
        );
        parse_graph(&text).unwrap()
    }

    /// A MatMul of a blocked dequantization of 4-bit codes becomes a dense layer with its
    /// codes laid out for the panel width, the dequantization gone; it records its shape.
    #[test]
    fn four_bit_codes_become_a_dense_layer() {
        for zeros in [true, false] {
            let mut g = graph("1, 2, 3, 4, 15, 0", zeros);
            run(&mut g, 16).unwrap();
            let ops: Vec<String> = g.nodes.iter().map(|n| format!("{}:{}", n.domain, n.op)).collect();
            assert_eq!(ops, ["aim:Dense"]);
            let s = shape_of(&g.nodes[0]).unwrap();
            assert_eq!(s, CodedShape { k: 3, n: 2, block: 2, nr: 16, zeros, bits: 4 });
            assert_eq!(g.initializers[&g.nodes[0].inputs[1]].len(), s.bytes());
            assert_eq!(g.nodes[0].strings(SOURCES).unwrap(), ["mm", "dq"]);
        }
    }

    /// Codes kept packed as MatMulNBits stores them (column by column, two a byte) are laid
    /// out without unpacking them, into the same bytes as the unpacked codes give.
    #[test]
    fn codes_packed_by_column_give_the_same_layout() {
        let blob = |g: &Graph| g.initializers[&g.nodes[0].inputs[1]].bytes().to_vec();
        let mut plain = graph("1, 2, 3, 4, 15, 0", true);
        run(&mut plain, 16).unwrap();
        let mut packed = graph("1, 2, 3, 4, 15, 0", true);
        // Column 0 holds 1, 3, 15; column 1 holds 2, 4, 0; blocks of two codes, a byte each.
        let codes = || Tensor::from_vec(&[4], vec![0x31u8, 0x0F, 0x42, 0x00]);
        let form = aim_ir::ColumnCodes { bits: 4, block: 2, k: 3, n: 2 };
        assert_eq!(Tensor::from_column_codes(codes(), form).unwrap().bytes(), [1, 2, 3, 4, 15, 0]);
        packed.initializers.insert("q".into(), Tensor::from_column_codes(codes(), form).unwrap());
        run(&mut packed, 16).unwrap();
        assert_eq!(blob(&packed), blob(&plain));
    }

    /// Codes of more than 4 bits are kept at 8: one byte each in the layout.
    #[test]
    fn wider_codes_are_kept_at_eight_bits() {
        let mut g = graph("1, 2, 3, 4, 16, 0", true);
        run(&mut g, 16).unwrap();
        let s = shape_of(&g.nodes[0]).unwrap();
        assert_eq!(s, CodedShape { k: 3, n: 2, block: 2, nr: 16, zeros: true, bits: 8 });
        assert_eq!(g.initializers[&g.nodes[0].inputs[1]].len(), s.bytes());
    }

    /// Signed codes are laid out as unsigned ones 128 higher with zero points 128 higher
    /// (0 without them): the same weights, the same bytes.
    #[test]
    fn signed_codes_are_offset_unsigned_ones() {
        let blob = |g: &Graph| g.initializers[&g.nodes[0].inputs[1]].bytes().to_vec();
        let mut unsigned = graph("129, 2, 125, 140, 255, 0", true);
        unsigned.initializers.insert("z".into(), Tensor::from_vec(&[2, 2], vec![128u8; 4]));
        run(&mut unsigned, 16).unwrap();
        let mut signed = graph("1, 2, 3, 4, 15, 0", false);
        let codes: Vec<i8> = vec![1, -126, -3, 12, 127, -128];
        signed.initializers.insert("q".into(), Tensor::from_vec(&[3, 2], codes));
        run(&mut signed, 16).unwrap();
        assert_eq!(shape_of(&signed.nodes[0]), shape_of(&unsigned.nodes[0]));
        assert_eq!(blob(&signed), blob(&unsigned));
    }
}
