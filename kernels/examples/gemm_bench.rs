//! Measures the f32 GEMM against this core's peak: `cargo run --release -p aim-kernels
//! --example gemm_bench [M K N]`. The peak is measured, not taken from a spec sheet: a loop
//! of independent FMAs on registers (enough chains to hide the FMA latency) for each ISA.
//! Prints medians of repeated runs on one thread, with B (the weights) out of cache.

#[cfg(target_arch = "x86_64")]
use aim_kernels::gemm::IsaKind;
use aim_kernels::gemm::{gemm_rows, Blocking, Epilogue, Isa, PackedB, Sequential};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// FLOP/s of `chains` independent FMA chains of width `isa` (2 FLOPs per lane per FMA).
#[cfg(target_arch = "x86_64")]
fn peak(isa: Isa) -> f64 {
    use std::arch::x86_64::*;
    // Twelve named accumulators (not an array) so they live in registers: with FMA latency 4
    // and two FMA pipes, 8 independent chains would already saturate the core.
    macro_rules! chains {
        ($fma:ident, $set:ident, $ty:ty, $iters:expr, $($v:ident)*) => {{
            let x = $set(std::hint::black_box(0.999_999));
            let y = $set(std::hint::black_box(1e-7));
            $(let mut $v: $ty = $set(std::hint::black_box(1.0));)*
            for _ in 0..$iters {
                $($v = $fma($v, x, y);)*
            }
            [$($v),*]
        }};
    }
    #[target_feature(enable = "avx512f")]
    unsafe fn z(iters: usize) -> f32 {
        let acc = chains!(_mm512_fmadd_ps, _mm512_set1_ps, __m512, iters, a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 b0 b1);
        acc.iter().map(|a| _mm512_reduce_add_ps(*a)).sum()
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn y(iters: usize) -> f32 {
        let acc = chains!(_mm256_fmadd_ps, _mm256_set1_ps, __m256, iters, a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 b0 b1);
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), acc.iter().fold(_mm256_setzero_ps(), |s, a| _mm256_add_ps(s, *a)));
        out.iter().sum()
    }
    let iters = std::hint::black_box(2_000_000);
    let runs: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            let (flops, s) = match isa.kind() {
                IsaKind::Avx512 => (12.0 * 16.0 * 2.0 * iters as f64, unsafe { z(iters) }),
                _ => (12.0 * 8.0 * 2.0 * iters as f64, unsafe { y(iters) }),
            };
            std::hint::black_box(s);
            flops / t.elapsed().as_secs_f64()
        })
        .collect();
    median(runs)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (m, k, n) = if args.len() == 3 { (args[0], args[1], args[2]) } else { (512, 512, 512) };
    let a: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 13) as f32 * 0.1).collect();
    let mut c = vec![0f32; m * n];
    for isa in Isa::all_available() {
        let blocking = Blocking::for_caches(isa, 48 << 10, 1 << 20);
        // A as activations (they change every run: read in place on AVX-512 / AVX2, packed
        // within the call elsewhere), B as a weight packed once: what a dense layer runs.
        // Twelve copies of B used in turn, as a model's layers use theirs: each run finds
        // its B out of cache. (One B used over and over stays in L2 and hid a 10% loss on
        // AVX2 that every model showed.)
        let pbs: Vec<PackedB> = (0..12).map(|_| PackedB::from_slice(isa, blocking, &b, k, n, false)).collect();
        let mut which = 0;
        let runs: Vec<f64> = (0..21)
            .map(|_| {
                let t = Instant::now();
                which = (which + 1) % pbs.len();
                gemm_rows(&a, m, k, blocking, &pbs[which], &mut c, n, &Epilogue::default(), &Sequential);
                t.elapsed().as_secs_f64()
            })
            .collect();
        let secs = median(runs);
        let gflops = 2.0 * (m * k * n) as f64 / secs / 1e9;
        #[cfg(target_arch = "x86_64")]
        let pk = if matches!(isa.kind(), IsaKind::Portable | IsaKind::Neon) { f64::NAN } else { peak(isa) / 1e9 };
        #[cfg(not(target_arch = "x86_64"))]
        let pk = f64::NAN;
        println!(
            "{isa:?}: {m}x{k}x{n} sgemm {:.3} ms = {gflops:.1} GFLOP/s; measured FMA peak {pk:.1} GFLOP/s; {:.0}% of peak (kc={}, mc={})",
            secs * 1e3,
            100.0 * gflops / pk,
            blocking.kc,
            blocking.mc
        );
    }
}
