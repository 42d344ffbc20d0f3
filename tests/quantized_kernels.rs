//! The integer kernels of quantized models against the reference interpreter: random
//! dynamically quantized dense layers (the form `quantize_dynamic` writes) with s8 and u8
//! weights, scalar and per-column zero points and scales, with and without a bias; and
//! statically quantized convolutions (the QDQ form: a quantize-dequantize pair on the
//! input, per-channel s8 weights) with u8 and s8 activations, kernel sizes, strides,
//! padding, groups, a folded Relu and a quantize-dequantize pair on the result. Each runs on the cpu backend at every ISA cap this
//! machine has: where the CPU has AVX-512 VNNI the layers must have become `aim:QDense` /
//! `aim:QConv` (the integer kernels); below it they run as f32 kernels.

mod common;

use aim::{Backend, Model, Options, Tensor};
use common::*;

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

/// Whether `cpu` gives this machine the integer convolution kernels (the byte regions and
/// `aim:QConv`): AVX-512 VNNI, or the AVX2 level (the plain and sign kernels,
/// `aim_kernels::int8::{plain, sign}`), or NEON with the dot products (`sdot`); natively on
/// an AVX-512 CPU without VNNI, and on NEON without `sdot`, they stay f32.
fn integer_kernel(cpu: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use aim_kernels::gemm::{Isa, IsaKind};
        let avx2 = Isa::new(IsaKind::Avx2).is_some();
        match cpu {
            "native" if Isa::best().kind() == IsaKind::Avx512 => std::arch::is_x86_feature_detected!("avx512vnni"),
            "native" | "x86-64-v3" => avx2,
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        cpu == "native" && std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = cpu;
        false
    }
}

/// Whether `cpu` gives this machine an integer GEMM for quantized dense layers (dynamic
/// or static): AVX-512 VNNI, AVX2's exact kernels (`aim_kernels::qgemm`), or NEON's `sdot`.
fn integer_gemm(cpu: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        integer_kernel(cpu) || (matches!(cpu, "native" | "x86-64-v3") && std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        integer_kernel(cpu)
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
        std::fs::write(&path, aim_onnx::export_bytes(&ir)).unwrap();
        let x: Vec<f32> = (0..2 * rows * k).map(|_| (r.next() % 2001) as f32 / 500.0 - 1.5).collect();
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[2, rows, k], x))];
        let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
        for cpu in caps() {
            let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
            let m = Model::load_with_options(&path, &opts).unwrap();
            let fused = m.optimized_graph().unwrap().nodes.iter().any(|n| n.op == "QDense");
            assert_eq!(fused, integer_gemm(cpu), "case {case} [{cpu}]: the integer kernel is used where it exists");
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

/// Whether `cpu` gives this machine the integer convolution of dynamically quantized
/// models (`aim:ConvInteger`) for a layer of `group` groups whose kernel shape the byte
/// kernel takes (`fits`): with AVX-512 VNNI or NEON `sdot` every such layer (the byte kernel); on the
/// AVX2 level without VNNI, one group (the exact 16-bit kernel, `aim_kernels::qconv16`).
fn integer_conv(cpu: &str, group: usize, fits: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use aim_kernels::gemm::{Isa, IsaKind};
        let vnni = Isa::best().kind() == IsaKind::Avx512 && std::arch::is_x86_feature_detected!("avx512vnni");
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        match cpu {
            "native" if vnni => fits,
            "native" | "x86-64-v3" => avx2 && group == 1,
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = group;
        integer_kernel(cpu) && fits
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (cpu, group, fits);
        false
    }
}

/// `quantize_dynamic`'s convolutions — DynamicQuantizeLinear, ConvInteger with s8 weights
/// (zero point 0) or u8 weights with zero points, Cast, Mul by the product of the scales,
/// a bias, then a Relu and a scale and shift (the activation and the program the integer
/// kernel applies in its epilogue) — with kernel sizes,
/// strides, padding and groups: the sums are exact whichever kernel runs them, so every
/// cap gives the interpreter's values; with VNNI, AVX2 or NEON `sdot` the convolution stays
/// on bytes.
#[test]
fn dynamically_quantized_convolutions_match_the_interpreter() {
    let mut r = Rng(19);
    for case in 0..20 {
        let (c, m, k, s) = (r.pick(&[4, 8, 24]), r.pick(&[4, 16, 33]), r.pick(&[1, 3, 5]), r.pick(&[1, 2]));
        let group = if c % 4 == 0 && m % 2 == 0 && r.pick(&[false, true]) { 2 } else { 1 };
        let (h, w) = (r.pick(&[5, 9, 16]), r.pick(&[7, 12]));
        let pad = k / 2;
        // s8 weights with zero point 0, or u8 weights with zero points (per tensor or per
        // channel: what older quantize_dynamic writes), whose differences leave s8.
        let unsigned = r.pick(&[false, true]);
        let per_channel = unsigned && r.pick(&[false, true]);
        // Older quantize_dynamic adds its bias to the integers, quantized per run with the
        // scales (floor(b / scale) as i32), before the Cast.
        let int_bias = r.pick(&[false, true]);
        let taps = c / group * k * k;
        let wv: Vec<i64> = (0..m * taps)
            .map(|_| if unsigned { (r.next() % 256) as i64 } else { (r.next() % 255) as i64 - 127 })
            .collect();
        let zv: Vec<i64> =
            (0..if per_channel { m } else { 1 }).map(|_| if unsigned { (r.next() % 256) as i64 } else { 0 }).collect();
        let fits_s8 = wv
            .iter()
            .enumerate()
            .all(|(i, v)| (-128..=127).contains(&(v - zv[if per_channel { i / taps } else { 0 }])));
        let wts = list(wv.iter().map(|v| v.to_string()));
        let (wt, zs) = (if unsigned { "u8" } else { "i8" }, list(zv.iter().map(|v| v.to_string())));
        let zdims = if per_channel { format!("[{m}]") } else { "[]".to_string() };
        let ws = list((0..m).map(|_| format!("{}", 0.001 + (r.next() % 100) as f32 * 1e-4)));
        let b = list((0..m).map(|_| format!("{}", (r.next() % 200) as f32 / 50.0 - 2.0)));
        let (oh, ow) = ((h + 2 * pad - k) / s + 1, (w + 2 * pad - k) / s + 1);
        let biased = match int_bias {
            true => "  %bd = Div(%b, %p)  # bias_div\n  %bf = Floor(%bd)  # bias_floor\n  %qb = Cast(%bf) {to=6}  # bias_q\n  %ib = Add(%i, %qb)  # bias_add\n  %c = Cast(%ib) {to=1}  # cast\n  %y = Mul(%c, %p)  # scale\n",
            false => "  %c = Cast(%i) {to=1}  # cast\n  %m = Mul(%c, %p)  # scale\n  %y = Add(%m, %b)  # bias\n",
        };
        let text = format!(
            "opset 17\ngraph \"g\" {{\n  input %x: f32[1,{c},{h},{w}]\n  init %w = {wt}[{m},{},{k},{k}] [{wts}]\n  init %wz = {wt}{zdims} [{zs}]\n  init %ws = f32[{m},1,1] [{ws}]\n  init %b = f32[{m},1,1] [{b}]\n  %q, %s, %z = DynamicQuantizeLinear(%x)  # dq\n  %p = Mul(%s, %ws)  # scales\n  %i = ConvInteger(%q, %w, %z, %wz) {{group={group}, pads=[{pad}, {pad}, {pad}, {pad}], strides=[{s}, {s}]}}  # conv\n{biased}  init %half = f32[] [0.5]\n  init %quarter = f32[] [0.25]\n  %r = Relu(%y)  # relu\n  %a = Mul(%r, %half)  # affine\n  %o = Add(%a, %quarter)  # shift\n  output %o: f32[1,{m},{oh},{ow}]\n}}\n",
            c / group
        );
        let ir = aim_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
        let d = tempdir(&format!("dynconv-{case}"));
        let path = d.join("m.onnx");
        std::fs::write(&path, aim_onnx::export_bytes(&ir)).unwrap();
        let x: Vec<f32> = (0..c * h * w).map(|_| (r.next() % 2001) as f32 / 500.0 - 1.5).collect();
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[1, c, h, w], x))];
        let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
        for cpu in caps() {
            let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
            let model = Model::load_with_options(&path, &opts).unwrap();
            let graph = model.optimized_graph().unwrap();
            let conv = graph.nodes.iter().find(|n| n.op == "ConvInteger");
            let bytes = conv.is_some();
            // The kernel took the scale, bias (or the integer bias as its offset, input 5),
            // Relu and the affine program after them.
            if let Some(n) = conv {
                let inputs = if int_bias { 6 } else { 5 };
                assert_eq!(
                    (n.inputs.len(), n.string("activation", "")),
                    (inputs, "relu"),
                    "case {case} [{cpu}]: {n:?}"
                );
                assert!(n.attrs.contains_key("post"), "case {case} [{cpu}]: {n:?}");
            }
            // Not where a group has fewer than 4 input channels (the kernel's 4-byte groups),
            // nor with groups where the weights less their zero point leave s8.
            let fits = group == 1 || (c / group >= 4 && fits_s8);
            assert_eq!(
                bytes,
                integer_conv(cpu, group, fits),
                "case {case} [{cpu}]: the integer convolution is used where it fits"
            );
            let got = model.run(inputs.clone()).unwrap();
            assert_eq!(got[0].1.shape(), want[0].1.shape(), "case {case} [{cpu}]");
            for (i, (a, b)) in got[0].1.data::<f32>().iter().zip(want[0].1.data::<f32>()).enumerate() {
                // Exact sums, then the same scale and bias (an FMA may fuse them).
                let tol = 1e-6 * b.abs().max(1.0);
                assert!((a - b).abs() <= tol, "case {case} [{cpu}] at {i}: {a} vs {b}\n{text}");
            }
        }
    }
}

#[test]
fn statically_quantized_convolutions_match_the_interpreter() {
    let mut r = Rng(11);
    for case in 0..16 {
        let (c, m) = (r.pick(&[3, 8, 16]), r.pick(&[4, 13, 32]));
        let group = if c % 8 == 0 && m % 2 == 0 { r.pick(&[1, 2]) } else { 1 };
        let (k, s, p) = (r.pick(&[1, 3, 5]), r.pick(&[1, 2]), r.pick(&[0, 1, 2]));
        let (h, w) = (r.pick(&[6, 9, 14]), r.pick(&[5, 8, 17]));
        let signed_x = r.pick(&[false, true]);
        let relu = r.pick(&[false, true]);
        let cg = c / group;
        let wv = list((0..m * cg * k * k).map(|_| ((r.next() % 255) as i64 - 127).to_string()));
        let sw = list((0..m).map(|_| format!("{}", 0.002 + (r.next() % 50) as f32 * 1e-4)));
        let bias = list((0..m).map(|_| format!("{}", (r.next() % 100) as f32 / 50.0 - 1.0)));
        let (xt, zx) = if signed_x { ("i8", "-7") } else { ("u8", "121") };
        let oh = (h + 2 * p - k) / s + 1;
        let ow = (w + 2 * p - k) / s + 1;
        // The result through a quantize-dequantize pair (fused into the epilogue), or not.
        let pair = r.pick(&[false, true]);
        let (mut act, mut out) =
            if relu { ("  %y = Relu(%conv)  # relu\n".to_string(), "y") } else { (String::new(), "conv") };
        if pair {
            act += &format!("  init %sy = f32[] [0.05]\n  init %zy = u8[] [9]\n  %yq = QuantizeLinear(%{out}, %sy, %zy)  # qy\n  %yd = DequantizeLinear(%yq, %sy, %zy)  # dqy\n");
            out = "yd";
        }
        let text = format!(
            "opset 17\ngraph \"g\" {{\n  input %x: f32[1,{c},{h},{w}]\n  init %sx = f32[] [0.03]\n  init %zx = {xt}[] [{zx}]\n  init %wq = i8[{m},{cg},{k},{k}] [{wv}]\n  init %sw = f32[{m}] [{sw}]\n  init %zw = i8[{m}] [{}]\n  init %b = f32[{m}] [{bias}]\n  %xq = QuantizeLinear(%x, %sx, %zx)  # q\n  %xd = DequantizeLinear(%xq, %sx, %zx)  # dq\n  %wd = DequantizeLinear(%wq, %sw, %zw) {{axis=0}}  # dqw\n  %conv = Conv(%xd, %wd, %b) {{group={group}, kernel_shape=[{k}, {k}], pads=[{p}, {p}, {p}, {p}], strides=[{s}, {s}]}}  # conv\n{act}  output %{out}: f32[1,{m},{oh},{ow}]\n}}\n",
            list((0..m).map(|_| "0".to_string())),
        );
        let ir = aim_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
        let d = tempdir(&format!("qconv-{case}"));
        let path = d.join("m.onnx");
        std::fs::write(&path, aim_onnx::export_bytes(&ir)).unwrap();
        let x: Vec<f32> = (0..c * h * w).map(|_| (r.next() % 2001) as f32 / 300.0 - 3.0).collect();
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[1, c, h, w], x))];
        let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
        let wv = want[0].1.data::<f32>();
        let scale = wv.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
        for cpu in caps() {
            let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
            let m = Model::load_with_options(&path, &opts).unwrap();
            // With the pair after it a convolution of one group runs on bytes (aim:Conv8),
            // else it reads f32 and writes f32 (aim:QConv).
            let want_op = if pair && group == 1 { "Conv8" } else { "QConv" };
            let fused = m.optimized_graph().unwrap().nodes.iter().any(|n| n.op == want_op);
            assert_eq!(fused, integer_kernel(cpu), "case {case} [{cpu}]: the integer kernel is used where it exists");
            let got = m.run(inputs.clone()).unwrap();
            assert_eq!(got[0].1.shape(), want[0].1.shape(), "case {case} [{cpu}]");
            // Exact integer sums against the f32 convolution of the dequantized values: the
            // difference is that convolution's rounding, or after a pair one quantum (0.05)
            // where a sum falls on the other side of a rounding boundary.
            let tol = if pair { 0.05 * 1.001 } else { 1e-5 * scale };
            for (i, (a, b)) in got[0].1.data::<f32>().iter().zip(wv).enumerate() {
                assert!((a - b).abs() <= tol, "case {case} [{cpu}] at {i}: {a} vs {b}\n{text}");
            }
        }
    }
}

/// One QDQ activation edge in the IR text: `%{v}_q` / `%{v}_d` = QuantizeLinear /
/// DequantizeLinear of `%v` with the constants `%{v}_s` / `%{v}_z` (u8 or s8).
fn qdq(v: &str, scale: f32, signed: bool, zero: i64) -> String {
    let zt = if signed { "i8" } else { "u8" };
    format!(
        "  init %{v}_s = f32[] [{scale}]\n  init %{v}_z = {zt}[] [{zero}]\n  %{v}_q = QuantizeLinear(%{v}, %{v}_s, %{v}_z)  # {v}_q\n  %{v}_d = DequantizeLinear(%{v}_q, %{v}_s, %{v}_z)  # {v}_dq\n"
    )
}

/// A Conv of `%{x}_d` with dequantized per-channel s8 weights and a bias, into `%{y}`.
#[allow(clippy::too_many_arguments)]
fn qconv(r: &mut Rng, x: &str, y: &str, c: usize, m: usize, k: usize, s: usize, group: usize) -> String {
    let cg = c / group;
    let wv = list((0..m * cg * k * k).map(|_| ((r.next() % 255) as i64 - 127).to_string()));
    let sw = list((0..m).map(|_| format!("{}", 0.004 + (r.next() % 50) as f32 * 2e-4)));
    let b = list((0..m).map(|_| format!("{}", (r.next() % 100) as f32 / 100.0 - 0.5)));
    let p = k / 2;
    format!(
        "  init %{y}_w = i8[{m},{cg},{k},{k}] [{wv}]\n  init %{y}_ws = f32[{m}] [{sw}]\n  init %{y}_b = f32[{m}] [{b}]\n  %{y}_wd = DequantizeLinear(%{y}_w, %{y}_ws) {{axis=0}}  # {y}_dqw\n  %{y} = Conv(%{x}_d, %{y}_wd, %{y}_b) {{group={group}, kernel_shape=[{k}, {k}], pads=[{p}, {p}, {p}, {p}], strides=[{s}, {s}]}}  # {y}_conv\n"
    )
}

/// Small quantized CNNs whose activations stay bytes NHWC between integer kernels (a stem
/// convolution of three channels, a max pool, a bottleneck with its residual Add, a
/// depthwise convolution with Clip, a projection), u8 or s8 activations, against the
/// reference interpreter: within a few quanta of the output everywhere (integer rounding
/// may flip where an f32 step lands on a tie, and the change carries through the layers),
/// and the byte ops must be the ones running.
#[test]
fn byte_regions_match_the_interpreter() {
    let mut r = Rng(23);
    for case in 0..6 {
        let signed = case % 2 == 1;
        let (h, w) = (r.pick(&[9, 16, 21]), r.pick(&[8, 13, 20]));
        let z = |r: &mut Rng| if signed { (r.next() % 40) as i64 - 20 } else { (r.next() % 40) as i64 };
        let mut t = String::new();
        t += &qdq("x", 0.02, signed, z(&mut r));
        t += &qconv(&mut r, "x", "c1", 3, 16, 3, 2, 1);
        t += "  %r1 = Relu(%c1)  # relu1\n";
        t += &qdq("r1", 0.03, signed, z(&mut r));
        t += "  %p1 = MaxPool(%r1_d) {kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]}  # pool\n";
        // The pool's output keeps the input's parameters.
        t += "  %p1_q = QuantizeLinear(%p1, %r1_s, %r1_z)  # p1_q\n  %p1_d = DequantizeLinear(%p1_q, %r1_s, %r1_z)  # p1_dq\n";
        t += &qconv(&mut r, "p1", "a1", 16, 8, 1, 1, 1);
        t += "  %a1r = Relu(%a1)  # relu_a1\n";
        t += &qdq("a1r", 0.025, signed, z(&mut r));
        t += &qconv(&mut r, "a1r", "a2", 8, 8, 3, 1, 1);
        t += &qdq("a2", 0.04, signed, z(&mut r));
        // An activation the byte kernels do not fuse, between two quantizations: a table.
        t += "  %hs = HardSwish(%a2_d)  # hardswish\n";
        t += &qdq("hs", 0.03, signed, z(&mut r));
        t += &qconv(&mut r, "hs", "a3", 8, 16, 1, 1, 1);
        t += &qdq("a3", 0.05, signed, z(&mut r));
        t += "  %s = Add(%a3_d, %p1_d)  # add\n  %sr = Relu(%s)  # relu_add\n";
        t += &qdq("sr", 0.05, signed, z(&mut r));
        t += &qconv(&mut r, "sr", "dw", 16, 16, 3, 1, 16);
        t += "  init %lo = f32[] [0.0]\n  init %hi = f32[] [6.0]\n  %dwc = Clip(%dw, %lo, %hi)  # clip\n";
        t += &qdq("dwc", 0.03, signed, z(&mut r));
        t += &qconv(&mut r, "dwc", "pr", 16, 12, 1, 1, 1);
        t += &qdq("pr", 0.06, signed, z(&mut r));
        let (oh, ow) = ((h - 1) / 2 + 1, (w - 1) / 2 + 1);
        let text = format!(
            "opset 17\ngraph \"g\" {{\n  input %x: f32[1,3,{h},{w}]\n{t}  output %pr_d: f32[1,12,{oh},{ow}]\n}}\n"
        );
        let ir = aim_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
        let d = tempdir(&format!("qregion-{case}"));
        let path = d.join("m.onnx");
        std::fs::write(&path, aim_onnx::export_bytes(&ir)).unwrap();
        let x: Vec<f32> = (0..3 * h * w).map(|_| (r.next() % 2001) as f32 / 400.0 - 2.5).collect();
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[1, 3, h, w], x))];
        let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
        let wv = want[0].1.data::<f32>();
        for cpu in caps() {
            let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
            let m = Model::load_with_options(&path, &opts).unwrap();
            let ops: Vec<String> = m.optimized_graph().unwrap().nodes.iter().map(|n| n.op.clone()).collect();
            if integer_kernel(cpu) {
                for op in ["Quantize8", "Conv8", "MaxPool8", "Dequantize8", "Lut8"] {
                    assert!(ops.iter().any(|o| o == op), "case {case} [{cpu}]: no {op} in {ops:?}");
                }
                let g = m.optimized_graph().unwrap();
                assert!(
                    g.nodes.iter().any(|n| n.op == "Conv8" && n.int("depthwise", 0) == 1),
                    "case {case}: the depthwise convolution runs on bytes"
                );
                assert!(
                    g.nodes.iter().any(|n| n.op == "Conv8" && n.input(4).is_some()),
                    "case {case}: the residual Add is fused into a convolution"
                );
                assert!(!ops.iter().any(|o| o == "QuantizeLinear" || o == "DequantizeLinear"), "{ops:?}");
            }
            let got = m.run(inputs.clone()).unwrap();
            assert_eq!(got[0].1.shape(), want[0].1.shape(), "case {case} [{cpu}]");
            let gv = got[0].1.data::<f32>();
            // Differences are whole quanta of the output (both sides dequantize the same
            // grid); most values agree.
            let q = 0.06f32;
            let diffs: Vec<f32> = gv.iter().zip(wv).map(|(a, b)| ((a - b) / q).abs()).collect();
            let worst = diffs.iter().fold(0f32, |a, &d| a.max(d));
            let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
            assert!(worst <= 4.01 && mean <= 0.25, "case {case} [{cpu}]: worst {worst} quanta, mean {mean}\n{text}");
        }
    }
}

/// A Conv1d of `%{x}_d` with dequantized per-channel s8 weights `[m, c, k]` and a bias,
/// into `%{y}` (padding `k / 2` each side).
fn qconv1d(r: &mut Rng, x: &str, y: &str, c: usize, m: usize, k: usize, s: usize) -> String {
    let wv = list((0..m * c * k).map(|_| ((r.next() % 255) as i64 - 127).to_string()));
    let sw = list((0..m).map(|_| format!("{}", 0.004 + (r.next() % 50) as f32 * 2e-4)));
    let b = list((0..m).map(|_| format!("{}", (r.next() % 100) as f32 / 100.0 - 0.5)));
    let p = k / 2;
    format!(
        "  init %{y}_w = i8[{m},{c},{k}] [{wv}]\n  init %{y}_ws = f32[{m}] [{sw}]\n  init %{y}_b = f32[{m}] [{b}]\n  %{y}_wd = DequantizeLinear(%{y}_w, %{y}_ws) {{axis=0}}  # {y}_dqw\n  %{y} = Conv(%{x}_d, %{y}_wd, %{y}_b) {{kernel_shape=[{k}], pads=[{p}, {p}], strides=[{s}]}}  # {y}_conv\n"
    )
}

/// A quantized 1-D CNN (the front end of speech encoders: Conv1d, GELU, a strided Conv1d,
/// a 1-D max pool) runs on bytes like a 2-D one, its values `[N, C, W]` as height-1 images,
/// and matches the reference interpreter within a few quanta.
#[test]
fn one_dimensional_byte_regions_match_the_interpreter() {
    let mut r = Rng(29);
    for case in 0..4 {
        let signed = case % 2 == 1;
        let w: usize = r.pick(&[17, 40, 64]);
        let z = |r: &mut Rng| if signed { (r.next() % 40) as i64 - 20 } else { (r.next() % 40) as i64 };
        let mut t = String::new();
        t += &qdq("x", 0.02, signed, z(&mut r));
        t += &qconv1d(&mut r, "x", "c1", 5, 16, 3, 1);
        t += &qdq("c1", 0.04, signed, z(&mut r));
        // GELU written out as exporters write it, between two quantizations: a table.
        t += "  init %rt2 = f32[] [1.4142135]\n  init %one = f32[] [1.0]\n  init %half = f32[] [0.5]\n";
        t += "  %g1 = Div(%c1_d, %rt2)  # div\n  %g2 = Erf(%g1)  # erf\n  %g3 = Add(%g2, %one)  # add1\n";
        t += "  %g4 = Mul(%g3, %half)  # half\n  %g = Mul(%c1_d, %g4)  # gelu\n";
        t += &qdq("g", 0.03, signed, z(&mut r));
        t += &qconv1d(&mut r, "g", "c2", 16, 12, 3, 2);
        t += &qdq("c2", 0.05, signed, z(&mut r));
        t += "  %p = MaxPool(%c2_d) {kernel_shape=[2], strides=[2]}  # pool\n";
        t +=
            "  %p_q = QuantizeLinear(%p, %c2_s, %c2_z)  # p_q\n  %p_d = DequantizeLinear(%p_q, %c2_s, %c2_z)  # p_dq\n";
        let ow = w.div_ceil(2) / 2;
        let text =
            format!("opset 17\ngraph \"g\" {{\n  input %x: f32[2,5,{w}]\n{t}  output %p_d: f32[2,12,{ow}]\n}}\n");
        let ir = aim_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
        let d = tempdir(&format!("qregion1d-{case}"));
        let path = d.join("m.onnx");
        std::fs::write(&path, aim_onnx::export_bytes(&ir)).unwrap();
        let x: Vec<f32> = (0..2 * 5 * w).map(|_| (r.next() % 2001) as f32 / 400.0 - 2.5).collect();
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[2, 5, w], x))];
        let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
        let wv = want[0].1.data::<f32>();
        for cpu in caps() {
            let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
            let m = Model::load_with_options(&path, &opts).unwrap();
            let g = m.optimized_graph().unwrap();
            if integer_kernel(cpu) {
                let count = |op: &str| g.nodes.iter().filter(|n| n.op == op).count();
                assert_eq!(count("Conv8"), 2, "case {case} [{cpu}]: both convolutions run on bytes");
                for op in ["Quantize8", "MaxPool8", "Dequantize8", "Lut8"] {
                    assert_eq!(count(op), 1, "case {case} [{cpu}]: one {op}");
                }
                assert!(g.nodes.iter().any(|n| n.op == "Dequantize8" && n.int("ncw", 0) == 1), "case {case}");
            }
            let got = m.run(inputs.clone()).unwrap();
            assert_eq!(got[0].1.shape(), want[0].1.shape(), "case {case} [{cpu}]");
            let q = 0.05f32;
            let diffs: Vec<f32> = got[0].1.data::<f32>().iter().zip(wv).map(|(a, b)| ((a - b) / q).abs()).collect();
            let worst = diffs.iter().fold(0f32, |a, &d| a.max(d));
            let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
            assert!(worst <= 4.01 && mean <= 0.25, "case {case} [{cpu}]: worst {worst} quanta, mean {mean}\n{text}");
        }
    }
}

/// Statically quantized dense layers (the QDQ form: a quantize-dequantize pair on the
/// input, dequantized 8-bit weights, per tensor or per column, with zero points; MatMul
/// with a following bias Add, or Gemm with transposed weights and a bias) against the
/// interpreter: where the CPU has AVX-512 VNNI they run as `aim:QDense` with the pair's
/// parameters, the sums exact, so the result differs from the f32 product of the
/// dequantized values only by that product's rounding.
#[test]
fn statically_quantized_dense_layers_match_the_interpreter() {
    let mut r = Rng(31);
    for case in 0..16 {
        let (rows, k, n) = (r.pick(&[1, 5, 13]), r.pick(&[3, 16, 64, 130]), r.pick(&[1, 7, 32, 70]));
        let (signed_w, signed_x, per_col, gemm, trans_b) = (
            r.pick(&[true, false]),
            r.pick(&[true, false]),
            r.pick(&[true, false]),
            r.pick(&[true, false]),
            r.pick(&[true, false]),
        );
        let wt = if signed_w { "i8" } else { "u8" };
        let int = |r: &mut Rng, signed: bool| {
            let v = r.next() % 256;
            if signed {
                (v as i64 - 128).to_string()
            } else {
                v.to_string()
            }
        };
        let w = list((0..k * n).map(|_| int(&mut r, signed_w)));
        let cols = if per_col { n } else { 1 };
        let zs = list((0..cols).map(|_| int(&mut r, signed_w)));
        let ss = list((0..cols).map(|_| format!("{}", 0.001 + (r.next() % 100) as f32 * 1e-4)));
        let b = list((0..n).map(|_| format!("{}", (r.next() % 200) as f32 / 50.0 - 2.0)));
        let dims = if per_col { format!("[{n}]") } else { "[]".to_string() };
        let (xt, zx) = if signed_x { ("i8", "-5") } else { ("u8", "130") };
        let (wdims, axis, tb) =
            if gemm && trans_b { (format!("[{n},{k}]"), 0, 1) } else { (format!("[{k},{n}]"), 1, 0) };
        let body = if gemm {
            format!("  %y = Gemm(%xd, %wd, %b) {{transB={tb}}}  # gemm\n")
        } else {
            "  %m = MatMul(%xd, %wd)  # matmul\n  %y = Add(%m, %b)  # bias\n".to_string()
        };
        let text = format!(
            "opset 17\ngraph \"g\" {{\n  input %x: f32[{rows},{k}]\n  init %sx = f32[] [0.02]\n  init %zx = {xt}[] [{zx}]\n  init %w = {wt}{wdims} [{w}]\n  init %wz = {wt}{dims} [{zs}]\n  init %ws = f32{dims} [{ss}]\n  init %b = f32[{n}] [{b}]\n  %xq = QuantizeLinear(%x, %sx, %zx)  # q\n  %xd = DequantizeLinear(%xq, %sx, %zx)  # dq\n  %wd = DequantizeLinear(%w, %ws, %wz) {{axis={axis}}}  # dqw\n{body}  output %y: f32[{rows},{n}]\n}}\n"
        );
        let ir = aim_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
        let d = tempdir(&format!("qdense-static-{case}"));
        let path = d.join("m.onnx");
        std::fs::write(&path, aim_onnx::export_bytes(&ir)).unwrap();
        let x: Vec<f32> = (0..rows * k).map(|_| (r.next() % 2001) as f32 / 500.0 - 2.0).collect();
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[rows, k], x))];
        let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
        let wv = want[0].1.data::<f32>();
        let scale = wv.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
        for cpu in caps() {
            let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
            let m = Model::load_with_options(&path, &opts).unwrap();
            let fused = m.optimized_graph().unwrap().nodes.iter().any(|n| n.op == "QDense");
            assert_eq!(fused, integer_gemm(cpu), "case {case} [{cpu}]: the integer kernel is used where it exists");
            let got = m.run(inputs.clone()).unwrap();
            assert_eq!(got[0].1.shape(), want[0].1.shape(), "case {case} [{cpu}]");
            for (i, (a, b)) in got[0].1.data::<f32>().iter().zip(wv).enumerate() {
                assert!((a - b).abs() <= 2e-5 * scale, "case {case} [{cpu}] at {i}: {a} vs {b}\n{text}");
            }
        }
    }
}
