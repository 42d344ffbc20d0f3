//! The integer kernels of quantized models against the reference interpreter: random
//! dynamically quantized dense layers (the form `quantize_dynamic` writes) with s8 and u8
//! weights, scalar and per-column zero points and scales, with and without a bias, run by
//! the cpu backend at every ISA cap this machine has. Where the CPU has AVX-512 VNNI the
//! layers must have become `aim:QDense` (the integer kernel); below it they run as f32
//! kernels. Either way the outputs are the reference's: the integer sums are exact.

mod common;

use aim::{Backend, Model, Options, Tensor};
use common::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.next() as usize % v.len()]
    }
}

/// A list of values for the IR text.
fn list(v: impl Iterator<Item = String>) -> String {
    v.collect::<Vec<_>>().join(", ")
}

fn caps() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        vec!["native", "x86-64-v3", "baseline"]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec!["native", "baseline"]
    }
}

/// Whether `cpu` gives this machine's integer dense kernel.
fn integer_kernel(cpu: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        cpu == "native" && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = cpu;
        false
    }
}

#[test]
fn dynamically_quantized_dense_layers_match_the_interpreter() {
    let mut r = Rng(7);
    for case in 0..24 {
        let (rows, k, n) = (r.pick(&[1, 5, 13, 40]), r.pick(&[3, 16, 64, 130]), r.pick(&[1, 7, 32, 33, 70]));
        let signed = r.pick(&[true, false]);
        let (zero_per_col, scale_per_col, bias) =
            (r.pick(&[false, true]), r.pick(&[false, true]), r.pick(&[false, true]));
        let wt = if signed { "i8" } else { "u8" };
        let int = |r: &mut Rng| {
            let v = r.next() % 256;
            if signed {
                (v as i64 - 128).to_string()
            } else {
                v.to_string()
            }
        };
        let w = list((0..k * n).map(|_| int(&mut r)));
        let zn = if zero_per_col { n } else { 1 };
        let zs = list((0..zn).map(|_| int(&mut r)));
        let sn = if scale_per_col { n } else { 1 };
        let ss = list((0..sn).map(|_| format!("{}", 0.001 + (r.next() % 100) as f32 * 1e-4)));
        let dims = |c: usize, per: bool| if per { format!("[{c}]") } else { "[]".to_string() };
        let (add, out) = if bias {
            let b = list((0..n).map(|_| format!("{}", (r.next() % 200) as f32 / 50.0 - 2.0)));
            (format!("  init %b = f32[{n}] [{b}]\n  %y = Add(%m, %b)  # bias\n"), "y")
        } else {
            (String::new(), "m")
        };
        let text = format!(
            "opset 17\ngraph \"g\" {{\n  input %x: f32[2,{rows},{k}]\n  init %w = {wt}[{k},{n}] [{w}]\n  init %wz = {wt}{} [{zs}]\n  init %ws = f32{} [{ss}]\n  %q, %s, %z = DynamicQuantizeLinear(%x)  # dq\n  %p = Mul(%s, %ws)  # scales\n  %i = MatMulInteger(%q, %w, %z, %wz)  # mm\n  %c = Cast(%i) {{to=1}}  # cast\n  %m = Mul(%c, %p)  # scale\n{add}  output %{out}: f32[2,{rows},{n}]\n}}\n",
            dims(n, zero_per_col),
            dims(n, scale_per_col),
        );
        let ir = aim_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
        let d = tempdir(&format!("qdense-{case}"));
        let path = d.join("m.onnx");
        std::fs::write(&path, aim_compiler::onnx::export_bytes(&ir)).unwrap();
        let x: Vec<f32> = (0..2 * rows * k).map(|_| (r.next() % 2001) as f32 / 500.0 - 1.5).collect();
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[2, rows, k], x))];
        let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
        for cpu in caps() {
            let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
            let m = Model::load_with_options(&path, &opts).unwrap();
            let fused = m.optimized_graph().unwrap().nodes.iter().any(|n| n.op == "QDense");
            assert_eq!(fused, integer_kernel(cpu), "case {case} [{cpu}]: the integer kernel is used where it exists");
            let got = m.run(inputs.clone()).unwrap();
            let (g, w) = (got[0].1.data::<f32>(), want[0].1.data::<f32>());
            assert_eq!(got[0].1.shape(), want[0].1.shape(), "case {case} [{cpu}]");
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                // Exact integer sums times the same scale: equal, but for the f32 path's
                // sums rounded to 24 bits (and a bias added to a product FMA-free either way).
                let tol = if fused { 0.0 } else { 1e-5 * b.abs().max(1.0) };
                assert!((a - b).abs() <= tol, "case {case} [{cpu}] at {i}: {a} vs {b}\n{text}");
            }
        }
    }
}
