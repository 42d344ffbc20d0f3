use aim_kernels::gemm::*;

fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] as f64 * b[p * n + j] as f64;
            }
        }
    }
    c.into_iter().map(|x| x as f32).collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn isas() -> Vec<Isa> {
    Isa::all_available()
}

#[test]
fn matches_reference_on_awkward_sizes() {
    for isa in isas() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (13, 7, 33),
            (12, 64, 32),
            (25, 300, 70),
            (5, 0, 3),
            (40, 129, 17),
            (3, 1000, 2),
            (64, 300, 64),
            (20, 50, 96),
            (1, 784, 512),
            (4, 129, 70),
            (2, 0, 5),
        ] {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let blocking = Blocking { kc: 64, mc: 2 * isa.mr() };
            let pa = PackedA::from_slice(isa, blocking, &a, m, k, false);
            let pr = PackedA::from_rows(isa, blocking, &a, m, k, &Sequential);
            assert_eq!(format!("{pa:?}"), format!("{pr:?}"), "from_rows packs as from_slice does");
            let pb = PackedB::from_slice(isa, blocking, &b, k, n, false);
            // From bytes at an odd address (as weights lie in a model file), both ways.
            let mut raw = vec![0u8; 1];
            raw.extend(b.iter().flat_map(|v| v.to_le_bytes()));
            let pbytes = PackedB::from_bytes(isa, blocking, &raw[1..], k, n, false);
            assert_eq!(format!("{pb:?}"), format!("{pbytes:?}"), "from_bytes packs as from_slice does");
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let mut rawt = vec![0u8; 3];
            rawt.extend(bt.iter().flat_map(|v| v.to_le_bytes()));
            let pbt = PackedB::from_bytes(isa, blocking, &rawt[3..], k, n, true);
            assert_eq!(format!("{pb:?}"), format!("{pbt:?}"), "from_bytes (transposed) packs as from_slice does");
            let mut c = vec![f32::NAN; m * n];
            gemm(&pa, &pb, &mut c, n, &Epilogue::default(), &Sequential);
            let want = reference(&a, &b, m, k, n);
            for (i, (g, w)) in c.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()) * (k as f32).sqrt(),
                    "{isa:?} {m}x{k}x{n} at {i}: {g} vs {w}"
                );
            }
            // The same product with A as plain rows (read in place: up to four rows as
            // vector-matrix products, more by the AVX-512 / AVX2 tile kernels).
            let mut c2 = vec![f32::NAN; m * n];
            gemm_rows(&a, m, k, blocking, &pb, &mut c2, n, &Epilogue::default(), &Sequential);
            for (i, (g, w)) in c2.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()) * (k as f32).sqrt(),
                    "{isa:?} rows {m}x{k}x{n} at {i}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn transposed_packing_and_epilogue() {
    for isa in isas() {
        let (m, k, n) = (9, 20, 35);
        let (a, b) = (values(m * k, 3), values(k * n, 4));
        // Store both transposed and pack them back.
        let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
        let blocking = Blocking::for_caches(isa, 32 << 10, 1 << 20);
        let pa = PackedA::from_slice(isa, blocking, &at, m, k, true);
        let pb = PackedB::from_slice(isa, blocking, &bt, k, n, true);
        let (rb, cb, res) = (values(m, 5), values(n, 6), values(m * n, 7));
        let ep = Epilogue {
            row_bias: Some(&rb),
            col_bias: Some(&cb),
            residual: Some(&res),
            act: Some(Activation::Clip(-0.5, 0.5)),
            ..Epilogue::default()
        };
        let mut c = vec![0f32; m * n];
        gemm(&pa, &pb, &mut c, n, &ep, &Sequential);
        let want = reference(&a, &b, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let w = (want[i * n + j] + rb[i] + cb[j] + res[i * n + j]).clamp(-0.5, 0.5);
                assert!((c[i * n + j] - w).abs() < 1e-4, "{isa:?} ({i},{j}): {} vs {w}", c[i * n + j]);
            }
        }
    }
}

/// C holding the residual (overwritten in place) gives what a separate residual gives: for
/// packed and plain A, small and tiled products, several k blocks, edge tiles.
#[test]
fn residual_in_c_matches_a_separate_residual() {
    for isa in isas() {
        for &(m, k, n) in &[(3, 70, 40), (13, 130, 33), (64, 9, 70)] {
            let (a, b, res, cb) = (values(m * k, 11), values(k * n, 12), values(m * n, 13), values(n, 14));
            let blocking = Blocking { kc: 64, mc: 2 * isa.mr() };
            let pa = PackedA::from_slice(isa, blocking, &a, m, k, false);
            let pb = PackedB::from_slice(isa, blocking, &b, k, n, false);
            let separate = Epilogue {
                col_bias: Some(&cb),
                residual: Some(&res),
                act: Some(Activation::Relu),
                ..Epilogue::default()
            };
            let mut want = vec![f32::NAN; m * n];
            gemm(&pa, &pb, &mut want, n, &separate, &Sequential);
            let in_c = Epilogue {
                col_bias: Some(&cb),
                residual_in_c: true,
                act: Some(Activation::Relu),
                ..Epilogue::default()
            };
            let mut packed = res.clone();
            gemm(&pa, &pb, &mut packed, n, &in_c, &Sequential);
            let mut plain = res.clone();
            gemm_rows(&a, m, k, blocking, &pb, &mut plain, n, &in_c, &Sequential);
            for (i, w) in want.iter().enumerate() {
                assert!(
                    (packed[i] - w).abs() < 1e-4 && (plain[i] - w).abs() < 1e-4,
                    "{isa:?} {m}x{k}x{n} at {i}: {} / {} vs {w}",
                    packed[i],
                    plain[i]
                );
            }
        }
    }
}

#[test]
fn lazy_b_matches_packed_b() {
    for isa in isas() {
        for &(m, k, n) in &[(13, 7, 33), (25, 300, 70), (64, 9, 5), (1, 1, 1)] {
            let (a, b) = (values(m * k, 8), values(k * n, 9));
            let blocking = Blocking { kc: 64, mc: 2 * isa.mr() };
            let pa = PackedA::from_slice(isa, blocking, &a, m, k, false);
            let rb = values(m, 10);
            let ep = Epilogue { row_bias: Some(&rb), act: Some(Activation::Relu), ..Epilogue::default() };
            let mut lazy = vec![f32::NAN; m * n];
            gemm_lazy_b(
                &pa,
                n,
                &|p, j0, dst: &mut [f32]| dst.copy_from_slice(&b[p * n + j0..p * n + j0 + dst.len()]),
                &mut lazy,
                n,
                &ep,
                &Sequential,
            );
            let want = reference(&a, &b, m, k, n);
            for i in 0..m {
                for j in 0..n {
                    let w = (want[i * n + j] + rb[i]).max(0.0);
                    assert!((lazy[i * n + j] - w).abs() < 1e-4 * (k as f32).sqrt(), "{isa:?} {m}x{k}x{n} ({i},{j})");
                }
            }
        }
    }
}

#[test]
fn half_weights_compute_what_their_f16_values_give() {
    for isa in isas() {
        for &(m, k, n) in &[(1, 300, 70), (2, 129, 33), (40, 129, 17), (64, 300, 64)] {
            let (a, b) = (values(m * k, 3), values(k * n, 4));
            // The f16 rounding of every weight, as f32.
            let b16: Vec<f32> = b.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
            let blocking = Blocking { kc: 64, mc: 2 * isa.mr() };
            let pa = PackedA::from_slice(isa, blocking, &a, m, k, false);
            let half = PackedB::from_slice(isa, blocking, &b, k, n, false).to_half();
            assert!(half.is_half());
            assert_eq!(half.bytes() * 2, PackedB::from_slice(isa, blocking, &b, k, n, false).bytes());
            let exact16 = PackedB::from_slice(isa, blocking, &b16, k, n, false);
            let (mut c, mut want) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            gemm(&pa, &half, &mut c, n, &Epilogue::default(), &Sequential);
            gemm(&pa, &exact16, &mut want, n, &Epilogue::default(), &Sequential);
            assert_eq!(c, want, "{isa:?} {m}x{k}x{n}");
            // Rows read in place (the small-m path) too.
            let (mut c, mut want) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            gemm_rows(&a, m, k, blocking, &half, &mut c, n, &Epilogue::default(), &Sequential);
            gemm_rows(&a, m, k, blocking, &exact16, &mut want, n, &Epilogue::default(), &Sequential);
            assert_eq!(c, want, "{isa:?} {m}x{k}x{n} (rows)");
            // Packed back to f32 (what a .aim file stores): the f16 values.
            assert_eq!(&*half.packed(), &*exact16.packed());
        }
    }
}
