//! The sum of two quantized values of one shape (and layout), quantized:
//! `y = QuantizeLinear(act(DequantizeLinear(a) + DequantizeLinear(b)))`, step for step as
//! the f32 ops compute it (the division by the scale included), so the bytes are exactly
//! those of the QDQ graph.

use super::{SharedMut, Q8};
use crate::gemm::{Activation, Isa, Parallel};

/// `y[i] = q(act(dq_a(a[i]) + dq_b(b[i])))` over `par`'s threads.
///
/// Panics when the lengths differ.
#[allow(clippy::too_many_arguments)]
pub fn add(
    isa: Isa,
    a: &[u8],
    qa: Q8,
    b: &[u8],
    qb: Q8,
    act: Option<Activation>,
    q: Q8,
    y: &mut [u8],
    par: &dyn Parallel,
) {
    assert!(a.len() == b.len() && y.len() == a.len(), "the operands and the output differ in length");
    let n = a.len();
    let per = n.div_ceil(par.threads() * 4).max(16384);
    let yp = SharedMut(y.as_mut_ptr());
    par.for_each(n.div_ceil(per), &|t| {
        let yp = yp;
        let (lo, hi) = (t * per, ((t + 1) * per).min(n));
        // SAFETY: tasks write disjoint ranges of `y`.
        let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(lo), hi - lo) };
        chunk(isa, &a[lo..hi], qa, &b[lo..hi], qb, act, q, dst);
    });
}

#[allow(clippy::too_many_arguments)]
fn chunk(isa: Isa, a: &[u8], qa: Q8, b: &[u8], qb: Q8, act: Option<Activation>, q: Q8, y: &mut [u8]) {
    #[inline(always)]
    fn body(a: &[u8], qa: Q8, b: &[u8], qb: Q8, act: Option<Activation>, q: Q8, y: &mut [u8]) {
        let mut v = [0f32; 64];
        for ((a, b), y) in a.chunks(64).zip(b.chunks(64)).zip(y.chunks_mut(64)) {
            let v = &mut v[..a.len()];
            for ((v, &a), &b) in v.iter_mut().zip(a).zip(b) {
                *v = qa.dequantize(a) + qb.dequantize(b);
            }
            if let Some(act) = act {
                match act.clamp_bounds() {
                    Some((lo, hi)) => v.iter_mut().for_each(|x| *x = crate::gemm::clamp(*x, lo, hi)),
                    None => v.iter_mut().for_each(|x| *x = act.apply(*x)),
                }
            }
            let (s, z) = (q.scale, q.zero as f32);
            for (y, &x) in y.iter_mut().zip(v.iter()) {
                let r = super::byte_range((x / s).round_ties_even() + z);
                // SAFETY: in [0, 255] (NaN became 0).
                *y = unsafe { r.to_int_unchecked::<i32>() } as u8;
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        use crate::gemm::IsaKind;
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
        unsafe fn v4(a: &[u8], qa: Q8, b: &[u8], qb: Q8, act: Option<Activation>, q: Q8, y: &mut [u8]) {
            body(a, qa, b, qb, act, q, y)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v3(a: &[u8], qa: Q8, b: &[u8], qb: Q8, act: Option<Activation>, q: Q8, y: &mut [u8]) {
            body(a, qa, b, qb, act, q, y)
        }
        // SAFETY: an `Isa` exists only for features this CPU has (BW checked here).
        match isa.kind() {
            IsaKind::Avx512 if std::arch::is_x86_feature_detected!("avx512bw") => {
                return unsafe { v4(a, qa, b, qb, act, q, y) }
            }
            IsaKind::Avx512 | IsaKind::Avx2 => return unsafe { v3(a, qa, b, qb, act, q, y) },
            _ => {}
        }
    }
    let _ = isa;
    body(a, qa, b, qb, act, q, y)
}
