//! Weights of −128 in a packing for the AVX2 sign kernel ([`super::sign`]), which cannot
//! take them (the sign of an activation moved onto −128 does not fit a byte). A quantizer
//! whose range reaches −128 (PyTorch's per-channel qint8, or ONNX Runtime's u8 weights of 0
//! moved to s8 terms) leaves a few, typically one per output channel: each is packed as
//! −127 and its sums corrected by the activation at that depth, `a·(−128) = a·(−127) − a`.
//! A correction is a few scalar operations per output value, where the kernel spends about
//! one vector operation per ten weights: past some share of −128s the corrections cost more
//! than the other kernel saves, and the packing keeps them.

/// The positions to correct: `lowest` as it is when there are at most one in `one_in` of
/// `weights`, else none (the packing keeps its −128s and another kernel runs). The dense
/// GEMM's other AVX2 kernel is exact at 90% of the sign kernel's speed (one in 256); the
/// convolution's is the portable one (one in 8: a correction per weight would still cost
/// less than it).
pub(crate) fn few<T: Clone>(lowest: &[Vec<T>], weights: usize, one_in: usize) -> Vec<Vec<T>> {
    let count: usize = lowest.iter().map(Vec::len).sum();
    if count <= weights / one_in {
        lowest.to_vec()
    } else {
        vec![Vec::new(); lowest.len()]
    }
}
