use aim_ir::{DType, Tensor};
use aim_kernels::util::*;

#[test]
fn tiled_matrix_transpose_equals_the_offset_one() {
    for dtype in [DType::F32, DType::I64, DType::F16, DType::Bool] {
        for (r, c) in [(1, 1), (3, 70), (33, 32), (65, 7), (0, 5)] {
            let v: Vec<f64> = (0..r * c).map(|i| (i % 2 + i % 7) as f64).collect();
            let t = Tensor::from_f64(dtype, &[r, c], &v);
            let tiled = transpose(&t, &[1, 0]).unwrap();
            let st = strides(t.shape());
            let offs = strided_offsets(&[c, r], &[st[1], st[0]]).unwrap();
            let want = gather_elems(&t, &[c, r], &offs).unwrap();
            assert_eq!((tiled.shape(), tiled.bytes()), (want.shape(), want.bytes()), "{dtype} {r}x{c}");
        }
    }
}
