//! The Cranelift portable GEMM microkernel against the Rust portable one (compiler-vectorised
//! for the build target), on a 512×512×512 product, single thread:
//! `cargo run --release -p aim-compiler --example portable_micro_bench`.

use aim_kernels::gemm::{gemm, Blocking, Epilogue, Isa, PackedA, PackedB, Sequential};
use std::time::Instant;

fn time(a: &PackedA, b: &PackedB, c: &mut [f32], n: usize) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        gemm(a, b, c, n, &Epilogue::default(), &Sequential);
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let n = 512;
    let target = aim_compiler::target::Target::host().with_cpu("baseline").expect("baseline");
    let blocking = Blocking::for_caches(Isa::PORTABLE, target.l1d, target.l2);
    let a: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 / 17.0).collect();
    let pa = PackedA::from_slice(Isa::PORTABLE, blocking, &a, n, n, false);
    let pb = PackedB::from_slice(Isa::PORTABLE, blocking, &a, n, n, false);
    let mut c = vec![0f32; n * n];
    let flops = 2.0 * (n * n * n) as f64;
    let rust = time(&pa, &pb, &mut c, n);
    let want = c.clone();
    let installed = aim_compiler::codegen::install_portable_microkernel(&target).expect("compiles");
    assert!(installed && aim_kernels::gemm::portable_is_generated());
    let gen = time(&pa, &pb, &mut c, n);
    let worst = c.iter().zip(&want).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    println!(
        "portable Rust: {:.1} GFLOP/s; Cranelift f32x4: {:.1} GFLOP/s; max difference {worst:e}",
        flops / rust / 1e9,
        flops / gen / 1e9
    );
}
