//! `com.microsoft:GatherBlockQuantized`: rows gathered from a blockwise-quantized table, as
//! onnxruntime-genai writes the token embeddings of a 4-bit LLM whose output projection
//! shares them, and as ONNX Runtime's weight-only quantizer writes a quantized `Gather`.
//! The table's codes are unpacked once at import into one byte each; each run gathers the
//! rows it needs and dequantizes only those (`(code − zero point) · scale` of their block).

use super::contrib::{bad, input, Emit};
use super::ImportError;
use aim_ir::{Attr, DType, Node, Tensor};

/// The attribute the importer sets on a `GatherBlockQuantized` whose data is an INT4 or
/// UINT4 tensor (held one value a byte, so its type would otherwise be lost).
pub(super) const FOUR_BIT_DATA: &str = "aim_four_bit_data";

/// `GatherBlockQuantized(data, indices, scales, zero_points?)`, attributes `gather_axis`
/// (0), `quantize_axis` (1), `block_size` (128) and `bits` (4). `data` is INT4 / UINT4, or
/// u8 holding `8 / bits` codes a byte along the quantized axis (low bits first). Zero
/// points are of the data's type and packing; without them they are 0 for INT4 / UINT4 and
/// `2^(bits−1)` for u8, as ONNX Runtime defines them. `data`, `scales` and `zero_points`
/// must be constants (or constants reshaped by constant shapes).
pub(super) fn gather_block_quantized(e: &mut Emit, n: &Node) -> Result<(), ImportError> {
    let block = n.int("block_size", 128);
    let bits = n.int("bits", 4);
    if block < 16 || block & (block - 1) != 0 || !matches!(bits, 2 | 4 | 8) {
        return Err(bad(n, format!("block_size {block} and bits {bits}: a power of two from 16, and 2, 4 or 8 bits")));
    }
    let (block, bits) = (block as usize, bits as usize);
    let constant = |e: &Emit, i: usize, what: &str| -> Result<Tensor, ImportError> {
        let name = input(n, i)?;
        e.constant_or_reshaped(name).ok_or_else(|| bad(n, format!("{what} ('{name}') must be a constant")))
    };
    let data = constant(e, 0, "the quantized data")?;
    let scales = constant(e, 2, "the scales")?;
    let rank = data.shape().len();
    let axis = |name: &str, default: i64| -> Result<usize, ImportError> {
        let a = n.int(name, default);
        let r = rank as i64;
        if a < -r || a >= r {
            return Err(bad(n, format!("{name} {a} is outside the data's {rank} axes")));
        }
        Ok(((a + r) % r) as usize)
    };
    let (gather_axis, q_axis) = (axis("gather_axis", 0)?, axis("quantize_axis", 1)?);
    if rank == 0 || gather_axis == q_axis {
        return Err(bad(n, "gather_axis and quantize_axis must be two different axes of the data"));
    }
    let sdtype = scales.dtype();
    if !matches!(sdtype, DType::F32 | DType::F16) || scales.shape().len() != rank {
        return Err(bad(
            n,
            format!("the scales are {sdtype} {:?}: f32 or f16 of the data's rank {rank}", scales.shape()),
        ));
    }
    let blocks = scales.shape()[q_axis];
    // The length of the quantized axis, and whether the codes are packed into bytes.
    let held = data.shape()[q_axis];
    let fits = |len: usize| len.div_ceil(block) == blocks;
    let four_bit = data.dtype() == DType::I8 || n.int(FOUR_BIT_DATA, 0) != 0;
    let packed = match data.dtype() {
        _ if four_bit => false,
        DType::U8 if bits == 8 => false,
        // u8 codes packed along the axis; failing that, a 4-bit table reshaped on its way
        // here (its type lost) whose codes are one a byte already.
        DType::U8 => fits(held * 8 / bits) || !fits(held),
        d => return Err(bad(n, format!("the data is {d}: INT4, UINT4 or u8 expected"))),
    };
    let four_bit = four_bit || (data.dtype() == DType::U8 && bits < 8 && !packed);
    if packed && q_axis != rank - 1 {
        return Err(bad(n, "codes packed into bytes must be quantized along the last axis"));
    }
    let per_byte = if packed { 8 / bits } else { 1 };
    let len = held * per_byte;
    let mut logical = data.shape().to_vec();
    logical[q_axis] = len;
    let expect: Vec<usize> =
        logical.iter().enumerate().map(|(i, &d)| if i == q_axis { d.div_ceil(block) } else { d }).collect();
    if scales.shape() != expect.as_slice() {
        return Err(bad(
            n,
            format!("the scales are {:?}; the data {logical:?} in blocks of {block} needs {expect:?}", scales.shape()),
        ));
    }
    let codes = if packed { unpack(data.bytes(), bits) } else { data.bytes().to_vec() };
    let codes = Tensor::from_bytes(data.dtype(), &logical, &codes).map_err(|err| bad(n, format!("the data: {err}")))?;
    let zeros = match n.input(3) {
        None => None,
        Some(_) => {
            let z = constant(e, 3, "the zero points")?;
            let mut zshape = expect.clone();
            if packed {
                zshape[q_axis] = blocks.div_ceil(per_byte);
            }
            if z.dtype() != data.dtype() || z.shape() != zshape.as_slice() {
                return Err(bad(
                    n,
                    format!("the zero points are {} {:?}: {} {zshape:?} expected", z.dtype(), z.shape(), data.dtype()),
                ));
            }
            let bytes = if packed { unpack(z.bytes(), bits) } else { z.bytes().to_vec() };
            let bytes: Vec<u8> =
                bytes.chunks(zshape[q_axis] * per_byte).flat_map(|row| row[..blocks].iter().copied()).collect();
            Some(Tensor::from_bytes(data.dtype(), &expect, &bytes).map_err(|err| bad(n, err.to_string()))?)
        }
    };
    let idx = input(n, 1)?;
    let idx_rank = e.rank(idx).ok_or_else(|| bad(n, "the rank of the indices is not known"))?;
    // Where the quantized axis lands in the output.
    let out_axis = if q_axis < gather_axis { q_axis } else { q_axis + idx_rank - 1 };
    let g = Attr::Int(gather_axis as i64);
    let codes = e.konst(codes);
    let rows = e.op("Gather", &[&codes, idx], vec![("axis", g.clone())]);
    let to = Attr::Int(sdtype.onnx_code() as i64);
    let mut value = e.op("Cast", &[&rows], vec![("to", to.clone())]);
    // Each position of the quantized axis reads its block's scale and zero point.
    let which = e.konst(Tensor::from_i64(&[len], (0..len).map(|i| (i / block) as i64).collect()));
    let spread = |e: &mut Emit, t: Tensor| -> String {
        let t = e.konst(t);
        let per_row = e.op("Gather", &[&t, idx], vec![("axis", g.clone())]);
        e.op("Gather", &[&per_row, &which], vec![("axis", Attr::Int(out_axis as i64))])
    };
    let zero = match zeros {
        Some(z) => {
            let z = spread(e, z);
            Some(e.op("Cast", &[&z], vec![("to", to.clone())]))
        }
        None if four_bit => None,
        None => Some(e.konst(aim_kernels::cast(&Tensor::scalar((1u32 << (bits - 1)) as f32), sdtype))),
    };
    if let Some(z) = zero {
        value = e.op("Sub", &[&value, &z], vec![]);
    }
    let scale = spread(e, scales);
    e.op_to("Mul", &[&value, &scale], &n.outputs[..1], vec![]);
    Ok(())
}

/// Codes packed `8 / bits` a byte, low bits first, one a byte.
fn unpack(packed: &[u8], bits: usize) -> Vec<u8> {
    (0..packed.len() * 8 / bits).map(|i| aim_ir::field(packed, i, bits)).collect()
}

#[cfg(test)]
mod tests {
    use crate::contrib::expand;
    use aim_ir::{Attr, DType, Dim, Graph, Node, Tensor, ValueInfo, ValueType};

    #[test]
    fn codes_unpack_low_bits_first() {
        assert_eq!(super::unpack(&[0x21, 0xF0], 4), vec![1, 2, 0, 15]);
        assert_eq!(super::unpack(&[0b1110_0100], 2), vec![0, 1, 2, 3]);
        assert_eq!(super::unpack(&[7], 8), vec![7]);
    }

    /// A graph of one GatherBlockQuantized over a 4×32 table packed two codes a byte
    /// (blocks of 16), with `scales` and `attrs` as given.
    fn graph(scales: &[usize], attrs: &[(&str, i64)]) -> Graph {
        let mut g = Graph::default();
        let idx = ValueType { dtype: Some(DType::I64), shape: Some(vec![Dim::Known(3)]) };
        g.inputs.push(ValueInfo { name: "ids".into(), ty: idx });
        let bytes: Vec<u8> = (0..64u8).collect();
        g.initializers.insert("data".into(), Tensor::from_vec(&[4, 16], bytes));
        let n = scales.iter().product();
        g.initializers.insert("scales".into(), Tensor::from_vec(scales, vec![0.5f32; n]));
        let mut node = Node {
            name: "embed".into(),
            op: "GatherBlockQuantized".into(),
            domain: "com.microsoft".into(),
            inputs: vec!["data".into(), "ids".into(), "scales".into()],
            outputs: vec!["y".into()],
            attrs: Default::default(),
        };
        node.attrs.insert("block_size".into(), Attr::Int(16));
        for (k, v) in attrs {
            node.attrs.insert(k.to_string(), Attr::Int(*v));
        }
        g.nodes.push(node);
        g
    }

    #[test]
    fn packed_bytes_become_one_code_a_byte() {
        let mut g = graph(&[4, 2], &[]);
        expand(&mut g).expect("a consistent node expands");
        let codes = g.initializers.values().find(|t| t.dtype() == DType::U8 && t.shape() == [4, 32]);
        let codes = codes.expect("the codes, unpacked, one a byte");
        assert_eq!(&codes.bytes()[..4], &[0, 0, 1, 0]);
        assert!(g.nodes.iter().all(|n| n.domain.is_empty()));
    }

    #[test]
    fn inconsistent_nodes_are_errors_naming_the_node() {
        for (scales, attrs, wanted) in [
            (&[4usize, 3][..], &[][..], "scales"),
            (&[4, 2, 1][..], &[][..], "rank"),
            (&[4, 2][..], &[("block_size", 8)][..], "block_size"),
            (&[4, 2][..], &[("bits", 3)][..], "bits"),
            (&[4, 2][..], &[("quantize_axis", 0), ("gather_axis", 1)][..], "last axis"),
            (&[4, 2][..], &[("gather_axis", 1)][..], "different axes"),
            (&[4, 2][..], &[("gather_axis", 5)][..], "outside"),
        ] {
            let err = expand(&mut graph(scales, attrs)).expect_err("refused").to_string();
            assert!(err.contains("embed") && err.contains(wanted), "{attrs:?}: {err}");
        }
    }
}
