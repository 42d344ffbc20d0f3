//! Packed weights shared between the programs of one model: a model with symbolic input
//! dims gets a program per input shape, and each would otherwise pack (and hold) its own
//! copy of every weight — three shapes of a decoder, three times its weights. A packing is
//! found by the bytes it was made from (their address and length, with the packing
//! parameters) and held weakly: it lives as long as a program uses it.

use aim_ir::Tensor;
use aim_kernels::gemm::{Blocking, Isa, PackedB};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// The source bytes (address, length), k, n, transposed, the ISA, the blocking and whether
/// the packing is held as f16.
type Key = (usize, usize, usize, usize, bool, Isa, usize, usize, bool);

/// Each entry keeps its source tensor alive, so that its address is not reused by other
/// bytes while the entry exists.
type Entries = HashMap<Key, (Tensor, Weak<PackedB>)>;

static PACKED: Mutex<Option<Entries>> = Mutex::new(None);

/// `w` (k×n, or n×k when `trans`) packed as B (held as f16 when `half`), shared with every
/// live program that packed the same bytes the same way.
pub(super) fn packed_b(
    w: &Tensor,
    isa: Isa,
    blocking: Blocking,
    (k, n): (usize, usize),
    trans: bool,
    half: bool,
) -> Arc<PackedB> {
    let bytes = w.bytes();
    let key = (bytes.as_ptr() as usize, bytes.len(), k, n, trans, isa, blocking.kc, blocking.mc, half);
    let mut guard = PACKED.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(p) = map.get(&key).and_then(|(_, p)| p.upgrade()) {
        return p;
    }
    // From the bytes: a view as f32 would make (and keep, in the tensor) an aligned copy
    // of a weight read unaligned from the model file.
    let packed = PackedB::from_bytes(isa, blocking, bytes, k, n, trans);
    let p = Arc::new(if half { packed.to_half() } else { packed });
    // Read once: if the weight lies in the model file's map, its pages can go now.
    aim_ir::mapped::release_range(bytes);
    map.retain(|_, (_, q)| q.strong_count() > 0);
    map.insert(key, (w.clone(), Arc::downgrade(&p)));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_packing_per_weight_while_a_program_holds_it() {
        let w = Tensor::from_vec(&[8, 16], (0..128).map(|v| v as f32).collect());
        let b = Blocking { kc: 64, mc: 8 };
        let p = packed_b(&w, Isa::PORTABLE, b, (8, 16), false, false);
        // The same bytes (a clone of the tensor shares them) packed the same way: shared.
        assert!(Arc::ptr_eq(&p, &packed_b(&w.clone(), Isa::PORTABLE, b, (8, 16), false, false)));
        // Packed another way, or other bytes of the same values: a packing of its own.
        assert!(!Arc::ptr_eq(&p, &packed_b(&w, Isa::PORTABLE, b, (16, 8), true, false)));
        let copy = Tensor::from_vec(&[8, 16], w.data::<f32>().to_vec());
        assert!(!Arc::ptr_eq(&p, &packed_b(&copy, Isa::PORTABLE, b, (8, 16), false, false)));
        // Once no program holds it, it is gone: the next program packs again.
        // Held as f16: a packing of its own, half the bytes.
        let h = packed_b(&w, Isa::PORTABLE, b, (8, 16), false, true);
        assert!(h.is_half() && !Arc::ptr_eq(&p, &h) && h.bytes() * 2 == p.bytes());
        let weak = Arc::downgrade(&p);
        drop(p);
        assert!(weak.upgrade().is_none());
    }
}
