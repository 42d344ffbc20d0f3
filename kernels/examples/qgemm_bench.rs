//! Measures the integer GEMM against this core's measured VNNI peak: `cargo run --release
//! -p aim-kernels --example qgemm_bench [M K N [W]]` (weights within ±W, default 127: 64
//! or less lets every pair fit `vpmaddubsw`, the AVX2 plain kernel). The peak is a loop of independent
//! `vpdpbusd` chains on registers (64 multiply-adds each). Prints medians of repeated runs
//! (`REPS`, default 15: raise it to profile one shape with `perf record`) on one thread;
//! without AVX-512 VNNI it says so and times the kernel the ISA has. `ISA=avx2` runs the
//! AVX2 kernels on a machine with AVX-512 (the path `--cpu x86-64-v3` takes).

use aim_kernels::gemm::{Isa, Sequential};
use aim_kernels::qgemm::{qgemm, PackedQB, QEpilogue, QuantizedA};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Multiply-adds per second of 16 independent `vpdpbusd` chains.
#[cfg(target_arch = "x86_64")]
fn peak() -> Option<f64> {
    if !std::arch::is_x86_feature_detected!("avx512vnni") {
        return None;
    }
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn run(iters: usize) -> [i32; 16] {
        use std::arch::x86_64::*;
        let a = _mm512_set1_epi32(std::hint::black_box(0x01010101));
        let b = _mm512_set1_epi32(std::hint::black_box(0x01010101));
        let mut c = [_mm512_setzero_si512(); 16];
        for _ in 0..iters {
            for v in c.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, a, b);
            }
        }
        let mut out = [0i32; 16];
        for (o, v) in out.iter_mut().zip(c) {
            *o = _mm512_reduce_add_epi32(v);
        }
        out
    }
    let iters = 20_000_000;
    let t = Instant::now();
    // SAFETY: VNNI checked above.
    std::hint::black_box(unsafe { run(iters) });
    Some((iters * 16 * 64) as f64 / t.elapsed().as_secs_f64())
}

#[cfg(not(target_arch = "x86_64"))]
fn peak() -> Option<f64> {
    None
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let bound = args.get(3).map_or(127, |&w| w.clamp(1, 127) as i32);
    let shapes: Vec<(usize, usize, usize)> = if args.len() >= 3 {
        vec![(args[0], args[1], args[2])]
    } else {
        vec![(128, 384, 384), (128, 384, 1536), (128, 1536, 384), (64, 576, 3136), (512, 4608, 49), (256, 2304, 196)]
    };
    let isa = match std::env::var("ISA").as_deref() {
        Ok("avx2") => Isa::new(aim_kernels::gemm::IsaKind::Avx2).expect("this CPU has no AVX2"),
        _ => Isa::best(),
    };
    match peak() {
        Some(p) => println!("VNNI peak (one core, measured): {:.1} GMAC/s", p / 1e9),
        None => println!("no AVX-512 VNNI: the AVX2 kernel the weights take is timed (or the portable one)"),
    }
    for (m, k, n) in shapes {
        let a: Vec<u8> = (0..m * k.div_ceil(4) * 4).map(|i| (i * 7 % 251) as u8).collect();
        // Symmetric s8 weights in [−127, 127], most of them small, as a per-channel
        // quantizer writes them (a sum of three uniform draws: about normal).
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut draw = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % (2 * (bound as u64 / 3) + 1)) as i32 - bound / 3
        };
        let b: Vec<u8> = (0..k * n).map(|_| (draw() + draw() + draw()).clamp(-bound, bound) as i8 as u8).collect();
        let packed = PackedQB::new(&b, true, k, n, &[0]).unwrap();
        let mut y = vec![0f32; m * n];
        let qa = QuantizedA { data: &a, m, stride: k.div_ceil(4) * 4, zero: 3, row_sums: &[] };
        let bias = vec![0.5f32; n];
        let ep = QEpilogue { scale: &[0.01], bias: Some(&bias), act: None };
        let mut ts = Vec::new();
        for _ in 0..std::env::var("REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(15) {
            let t = Instant::now();
            qgemm(isa, &qa, &packed, &ep, &mut y, n, &Sequential);
            ts.push(t.elapsed().as_secs_f64());
        }
        let s = median(ts);
        println!(
            "M {m:5} K {k:5} N {n:5}: {:8.1} us, {:6.1} GMAC/s  ({}, {} corrections)",
            s * 1e6,
            (m * k * n) as f64 / s / 1e9,
            packed.micro_name(isa),
            packed.corrections()
        );
    }
}
