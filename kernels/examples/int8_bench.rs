//! Times the byte kernels of quantized CNNs (`aim_kernels::int8`) on layer shapes of
//! ResNet-50 and MobileNetV2: `cargo run --release -p aim-kernels --example int8_bench`.
//! Prints, per layer, the median time of repeated runs on one thread and the rate in
//! multiply-adds per second (the ones the layer needs, not the padding the kernel adds).

use aim_kernels::gemm::{Activation, Isa, Sequential};
use aim_kernels::int8::conv::Conv8;
use aim_kernels::int8::depthwise::Depthwise8;
use aim_kernels::int8::{Nhwc, Out8, Weights8, Window, Q8};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

/// Median seconds of `f` over enough runs for about 0.2 s.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let runs = ((0.2 / once) as usize).clamp(5, 2000);
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() {
    let isa = Isa::best();
    let out = Out8 { act: Some(Activation::Clip(0.0, 6.0)), residual: None, q: Q8 { scale: 0.05, zero: 0 } };
    let x8 = Q8 { scale: 0.02, zero: 3 };
    let win = |k: usize, s: usize| Window { kernel: [k, k], stride: [s, s], dilation: [1, 1], pads: [k / 2; 4] };
    // (name, h, w, c, m, k, stride, depthwise)
    let layers = [
        ("mobilenetv2 stem 3x3/2 3->32", 224, 224, 3, 32, 3, 2, false),
        ("mobilenetv2 dw 3x3 32 @112", 112, 112, 32, 32, 3, 1, true),
        ("mobilenetv2 1x1 32->16 @112", 112, 112, 32, 16, 1, 1, false),
        ("mobilenetv2 1x1 16->96 @112", 112, 112, 16, 96, 1, 1, false),
        ("mobilenetv2 dw 3x3/2 96 @112", 112, 112, 96, 96, 3, 2, true),
        ("mobilenetv2 dw 3x3 144 @56", 56, 56, 144, 144, 3, 1, true),
        ("mobilenetv2 1x1 144->24 @56", 56, 56, 144, 24, 1, 1, false),
        ("mobilenetv2 1x1 24->144 @56", 56, 56, 24, 144, 1, 1, false),
        ("resnet50 stem 7x7/2 3->64", 224, 224, 3, 64, 7, 2, false),
        ("resnet50 1x1 64->256 @56", 56, 56, 64, 256, 1, 1, false),
        ("resnet50 3x3 64->64 @56", 56, 56, 64, 64, 3, 1, false),
        ("resnet50 3x3 128->128 @28", 28, 28, 128, 128, 3, 1, false),
        ("resnet50 3x3 256->256 @14", 14, 14, 256, 256, 3, 1, false),
        ("resnet50 3x3 512->512 @7", 7, 7, 512, 512, 3, 1, false),
    ];
    println!("{isa:?}, one thread");
    for (name, h, w, c, m, k, s, dw) in layers {
        let x = bytes(h * w * c, 1);
        let input = Nhwc { data: &x, n: 1, h, w, c };
        let window = win(k, s);
        let (oh, ow) = window.output(h, w).unwrap();
        let mut y = vec![0u8; oh * ow * m];
        let scale = [0.01f32];
        let (secs, macs) = if dw {
            let wt = bytes(c * k * k, 2);
            let kernel = Depthwise8::new(c, window, Weights8 { w: &wt, scale: &scale, bias: None }, x8, out).unwrap();
            (time(|| kernel.run(isa, &input, None, &mut y, &Sequential)), oh * ow * c * k * k)
        } else {
            let wt = bytes(m * c * k * k, 2);
            let kernel = Conv8::new(c, m, window, Weights8 { w: &wt, scale: &scale, bias: None }, x8, out).unwrap();
            if kernel.winograd_pays(isa, None) {
                // Winograd applies: the direct kernel too, and which one the cost model picks.
                let secs = time(|| kernel.run(isa, &input, None, &mut y, &Sequential));
                let macs = (oh * ow * m * c * k * k) as f64;
                let chosen = if kernel.winograd_pays(isa, Some([1, oh, ow])) { "Winograd" } else { "direct" };
                println!(
                    "{:32} {:8.1} us  {:6.1} GMAC/s (direct; {chosen} chosen)",
                    name,
                    secs * 1e6,
                    macs / secs / 1e9
                );
                let kernel = kernel.into_winograd(&wt).unwrap();
                let secs = time(|| kernel.run(isa, &input, None, &mut y, &Sequential));
                println!("{:32} {:8.1} us  {:6.1} GMAC/s (Winograd)", name, secs * 1e6, macs / secs / 1e9);
                continue;
            }
            (time(|| kernel.run(isa, &input, None, &mut y, &Sequential)), oh * ow * m * c * k * k)
        };
        println!("{name:32} {:8.1} us  {:6.1} GMAC/s", secs * 1e6, macs as f64 / secs / 1e9);
    }
}
