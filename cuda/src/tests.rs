//! The generated kernels run in the PTX interpreter against exact (f64) arithmetic, and
//! pass `ptxas` for sm_80 and sm_90 with no spills.

use super::{elementwise, gather, gemm, ptx, reduce, softmax, strided, GpuTarget, Half, Kernel};
use aim_compiler::codegen::ReduceMode;
use aim_compiler::ewprog::{self, Binary, Inst, Operand, Unary};
use aim_kernels::gemm::Activation;
use aim_ptx_interp::{Arg, Launch, Memory, Module};

/// A seeded xorshift generator of floats in [lo, hi).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }

    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.next()).collect()
    }
}

fn launch(k: &Kernel, args: &[Arg], mem: &mut Memory) {
    let module =
        Module::parse(&ptx::module(80, std::slice::from_ref(&k.ptx))).unwrap_or_else(|e| panic!("{e}\n{}", k.ptx));
    module.launch(&k.name, Launch { grid: k.grid, block: k.block }, args, mem).unwrap_or_else(|e| panic!("{e}"));
}

fn close(got: f32, want: f64, tol: f64, what: &str) {
    if want.is_nan() {
        assert!(got.is_nan(), "{what}: got {got}, want NaN");
        return;
    }
    let err = (f64::from(got) - want).abs();
    assert!(err <= tol * want.abs().max(1.0), "{what}: got {got}, want {want} (error {err:e})");
}

/// The program's value at `xs`, in f64 with the exact functions.
fn eval(prog: &[Inst], xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = Vec::new();
    let get = |v: &[f64], o: Operand| match o {
        Operand::Ref(i) => v[i],
        Operand::Const(c) => f64::from(c),
    };
    for inst in prog {
        let r = match *inst {
            Inst::Input(k) => xs[k],
            Inst::Unary(u, a) => {
                let a = get(&v, a);
                match u {
                    Unary::Neg => -a,
                    Unary::Abs => a.abs(),
                    Unary::Sqrt => a.sqrt(),
                    Unary::Relu if a.is_nan() => a,
                    Unary::Relu => a.max(0.0),
                    Unary::Exp => a.exp(),
                    Unary::Erf => erf(a),
                    Unary::Tanh => a.tanh(),
                    Unary::Sigmoid => 1.0 / (1.0 + (-a).exp()),
                    Unary::Reciprocal => 1.0 / a,
                    Unary::Round => a.round_ties_even(),
                }
            }
            Inst::Binary(b, x, y) => {
                let (x, y) = (get(&v, x), get(&v, y));
                match b {
                    Binary::Add => x + y,
                    Binary::Sub => x - y,
                    Binary::Mul => x * y,
                    Binary::Div => x / y,
                    Binary::Max if x.is_nan() || y.is_nan() => f64::NAN,
                    Binary::Min if x.is_nan() || y.is_nan() => f64::NAN,
                    Binary::Max => x.max(y),
                    Binary::Min => x.min(y),
                }
            }
            Inst::Clip(a, lo, hi) => {
                let a = get(&v, a);
                if a.is_nan() {
                    a
                } else {
                    a.max(f64::from(lo)).min(f64::from(hi))
                }
            }
            Inst::LeakyRelu(a, al) => {
                let a = get(&v, a);
                if a < 0.0 {
                    a * f64::from(al)
                } else {
                    a
                }
            }
        };
        v.push(r);
    }
    *v.last().unwrap()
}

/// erf by its series / continued fraction to double precision (Numerical Recipes' erfc
/// Chebyshev fit, error < 1.2e-7 relative, is not enough; this sums the Taylor series
/// below 3 and uses the asymptotic complement above).
fn erf(x: f64) -> f64 {
    if x.abs() > 5.0 {
        return x.signum();
    }
    // Taylor series: erf x = 2/√π Σ (−1)^n x^(2n+1) / (n! (2n+1)).
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn program(lines: &[&str]) -> Vec<Inst> {
    ewprog::parse(&lines.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

#[test]
fn elementwise_programs_match_exact_math() {
    let cases: Vec<(Vec<&str>, usize, f32, f32)> = vec![
        (vec!["in 0", "mul 0 c0.70710677", "erf 1", "add 2 c1.0", "mul 0 3", "mul 4 c0.5"], 1, -6.0, 6.0),
        (vec!["in 0", "in 1", "add 0 1", "relu 2", "clip 3 0.0 6.0"], 2, -8.0, 8.0),
        (vec!["in 0", "exp 0"], 1, -90.0, 88.3),
        (vec!["in 0", "tanh 0"], 1, -10.0, 10.0),
        (vec!["in 0", "sigmoid 0", "in 1", "mul 1 2", "sub 3 c0.25"], 2, -20.0, 20.0),
        (vec!["in 0", "in 1", "div 0 1", "max 2 c-1.0", "min 3 1", "leakyrelu 4 0.1"], 2, -3.0, 3.0),
        (vec!["in 0", "abs 0", "sqrt 1", "neg 2", "recip 3", "round 0", "add 4 5"], 1, -50.0, 50.0),
    ];
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (lines, n_in, lo, hi) in cases {
        let prog = program(&lines);
        let n = 1000;
        let k = elementwise::kernel("ew", &prog, n_in);
        let target = GpuTarget::SM80;
        let kern = Kernel {
            name: "ew".into(),
            ptx: k.finish(),
            grid: [super::grid_for(n / 3, elementwise::BLOCK, &target), 1, 1],
            block: [elementwise::BLOCK, 1, 1],
            shared_bytes: 0,
            sources: vec![],
        };
        let mut xs: Vec<Vec<f32>> = (0..n_in).map(|_| rng.vec(n, lo, hi)).collect();
        xs[0][7] = f32::NAN;
        let mut mem = Memory::new();
        let y = mem.alloc(n * 4);
        let mut args = vec![Arg::U64(y)];
        for x in &xs {
            args.push(Arg::U64(mem.upload(x)));
        }
        args.push(Arg::U64(n as u64));
        launch(&kern, &args, &mut mem);
        let got = mem.download(y);
        for i in 0..n {
            let inputs: Vec<f64> = xs.iter().map(|x| f64::from(x[i])).collect();
            close(got[i], eval(&prog, &inputs), 2e-6, &format!("{lines:?} at {inputs:?}"));
        }
    }
}

#[test]
fn row_reductions_match() {
    let (rows, len) = (37usize, 100usize);
    let mut rng = Rng(7);
    let mut x = rng.vec(rows * len, -4.0, 4.0);
    x[5 * len + 3] = f32::NAN;
    for mode in [ReduceMode::Sum, ReduceMode::Mean, ReduceMode::Max, ReduceMode::Min] {
        let k = reduce::kernel("red", mode);
        let kern = Kernel {
            name: "red".into(),
            ptx: k.finish(),
            grid: [2, 1, 1],
            block: [reduce::BLOCK, 1, 1],
            shared_bytes: 0,
            sources: vec![],
        };
        let mut mem = Memory::new();
        let (xa, ya) = (mem.upload(&x), mem.alloc(rows * 4));
        launch(&kern, &[Arg::U64(xa), Arg::U64(ya), Arg::U64(rows as u64), Arg::U64(len as u64)], &mut mem);
        let got = mem.download(ya);
        for r in 0..rows {
            let row: Vec<f64> = x[r * len..(r + 1) * len].iter().map(|&v| f64::from(v)).collect();
            let want = match mode {
                _ if row.iter().any(|v| v.is_nan()) => f64::NAN,
                ReduceMode::Sum => row.iter().sum(),
                ReduceMode::Mean => row.iter().sum::<f64>() / len as f64,
                ReduceMode::Max => row.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ReduceMode::Min => row.iter().cloned().fold(f64::INFINITY, f64::min),
            };
            close(got[r], want, 1e-5, &format!("{mode:?} row {r}"));
        }
    }
}

#[test]
fn masked_softmax_matches() {
    let shape = [2usize, 3, 5, 40];
    let mshape = [2usize, 1, 1, 40];
    let (len, rows) = (40usize, 30usize);
    let mut rng = Rng(99);
    let x = rng.vec(rows * len, -6.0, 6.0);
    let mask = rng.vec(2 * len, -3.0, 0.0);
    let scale = 0.125;
    let mr = softmax::MaskRows::new(&shape, &mshape);
    for masked in [false, true] {
        let k = softmax::kernel("sm", rows as u64, len as u64, 1, scale, masked.then_some(&mr), false);
        let kern = Kernel {
            name: "sm".into(),
            ptx: k.finish(),
            grid: [2, 1, 1],
            block: [softmax::BLOCK, 1, 1],
            shared_bytes: 0,
            sources: vec![],
        };
        let mut mem = Memory::new();
        let (xa, ya) = (mem.upload(&x), mem.alloc(rows * len * 4));
        let mut args = vec![Arg::U64(xa), Arg::U64(ya)];
        if masked {
            args.push(Arg::U64(mem.upload(&mask)));
        }
        launch(&kern, &args, &mut mem);
        let got = mem.download(ya);
        for r in 0..rows {
            let b = r / 15;
            let v: Vec<f64> = (0..len)
                .map(|j| {
                    let m = if masked { f64::from(mask[b * len + j]) } else { 0.0 };
                    f64::from(x[r * len + j]) * f64::from(scale) + m
                })
                .collect();
            let mx = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = v.iter().map(|a| (a - mx).exp()).sum();
            for j in 0..len {
                close(got[r * len + j], (v[j] - mx).exp() / s, 2e-6, &format!("row {r} col {j}"));
            }
        }
    }
}

/// Runs a dense layer on the interpreter and checks it within `tol` of Σ|a·w| per element.
fn check_dense(d: gemm::Dense, target: GpuTarget, tol: f64, seed: u64) {
    let (m, n, k) = (d.m as usize, d.n as usize, d.k as usize);
    let mut rng = Rng(seed);
    let a = rng.vec(m * k, -1.0, 1.0);
    let w = rng.vec(k * n, -1.0, 1.0);
    let b = rng.vec(n, -1.0, 1.0);
    let r = rng.vec(m * n, -1.0, 1.0);
    // With `target.half`, the weights go in packed as the lowering packs constants.
    let mut g = d.gemm();
    let mut mem = Memory::new();
    let wa = match target.half {
        Some(h) => {
            g.b = gemm::BLayout::Half(h);
            mem.upload_bytes(gemm::pack_half(&w, k, n, false, h).bytes())
        }
        None => mem.upload(&w),
    };
    let kern = gemm::gemm_kernel("dense", &g, &target, vec![]).unwrap();
    let (aa, ya) = (mem.upload(&a), mem.alloc(m * n * 4));
    let mut args = vec![Arg::U64(aa), Arg::U64(wa), Arg::U64(ya)];
    if d.bias {
        args.push(Arg::U64(mem.upload(&b)));
    }
    if d.residual {
        args.push(Arg::U64(mem.upload(&r)));
    }
    launch(&kern, &args, &mut mem);
    let got = mem.download(ya);
    let act = gemm::activation_program(d.activation);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (0f64, 0f64);
            for p in 0..k {
                let t = f64::from(a[i * k + p]) * f64::from(w[p * n + j]);
                s += t;
                mag += t.abs();
            }
            if d.bias {
                s += f64::from(b[j]);
            }
            if d.residual {
                s += f64::from(r[i * n + j]);
            }
            let want = eval(&act, &[s]);
            let err = (f64::from(got[i * n + j]) - want).abs();
            assert!(err <= tol * (mag + 1.0), "{d:?} at ({i}, {j}): got {}, want {want}", got[i * n + j]);
        }
    }
}

#[test]
fn dense_ffma_matches_on_edges_and_epilogues() {
    let shapes = [(1, 1, 1), (70, 75, 33), (128, 64, 64), (5, 130, 17), (64, 3, 200)];
    let acts = [Activation::Identity, Activation::Relu, Activation::Gelu, Activation::Silu, Activation::Elu(0.7)];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        let act = acts[s % acts.len()];
        let d = gemm::Dense { m, n, k, bias: s % 2 == 0, residual: s % 3 == 1, activation: act };
        check_dense(d, GpuTarget::SM80, 2e-6, 11 + s as u64);
    }
}

#[test]
fn dense_tf32_tensor_cores_match_within_tf32_rounding() {
    let shapes = [(16, 8, 8), (70, 75, 33), (128, 128, 64), (3, 65, 40)];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        let act = [Activation::Identity, Activation::GeluTanh, Activation::Clip(-0.5, 0.5), Activation::HardSwish][s];
        let d = gemm::Dense { m, n, k, bias: true, residual: s % 2 == 1, activation: act };
        // Two TF32 roundings (2^-11 each) per product.
        check_dense(d, GpuTarget::SM90.with_tf32(true), 1.1e-3, 21 + s as u64);
    }
}

#[test]
fn dense_half_tensor_cores_match_within_half_rounding() {
    // Odd depths (the packed weights' zero pad), edges in M and N, every epilogue part.
    let shapes = [(16, 8, 16), (70, 75, 33), (128, 128, 64), (3, 65, 17)];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        let act = [Activation::Identity, Activation::Relu, Activation::Gelu, Activation::Silu][s];
        let d = gemm::Dense { m, n, k, bias: s != 1, residual: s % 2 == 1, activation: act };
        // Two roundings per product: 2^-11 each for f16, 2^-8 for bf16.
        check_dense(d, GpuTarget::SM80.with_half(Some(Half::F16)), 1.1e-3, 31 + s as u64);
        check_dense(d, GpuTarget::SM90.with_half(Some(Half::Bf16)), 8.5e-3, 41 + s as u64);
    }
}

/// Every kernel family, for the ptxas check.
fn all_kernels() -> Vec<String> {
    let mut out = Vec::new();
    let prog =
        program(&["in 0", "in 1", "mul 0 c0.70710677", "erf 2", "tanh 1", "sigmoid 4", "exp 3", "add 5 6", "round 7"]);
    out.push(elementwise::kernel("ew_all", &prog, 2).finish());
    for (i, mode) in [ReduceMode::Sum, ReduceMode::Mean, ReduceMode::Max, ReduceMode::Min].into_iter().enumerate() {
        out.push(reduce::kernel(&format!("reduce_{i}"), mode).finish());
    }
    let ys = super::strided::contiguous(&[1, 8, 6, 6]);
    let xs = super::strided::contiguous(&[1, 3, 6, 6]);
    out.push(super::strided::mapped("concat_slice", &[1, 3, 6, 6], &[xs], &[0], &ys, 36, &[Inst::Input(0)]).finish());
    out.push(
        super::gather::gather(
            "gather",
            super::gather::GatherGeom { outer: 1, axis: 100, inner: 64, indices: 16, i64: true },
        )
        .finish(),
    );
    for (f, t) in [
        (super::gather::Elem::I64, super::gather::Elem::F32),
        (super::gather::Elem::Bool, super::gather::Elem::F32),
        (super::gather::Elem::F32, super::gather::Elem::I32),
    ] {
        out.push(super::gather::cast(&format!("cast_{}", out.len()), f, t).unwrap().finish());
    }
    out.push(super::layernorm::kernel("layernorm", 128, 768, 1e-12, true).finish());
    let bs = |s: &[usize]| super::strided::broadcast_strides(s, &[1, 4, 8, 8]).unwrap();
    out.push(
        super::strided::select("where", &[1, 4, 8, 8], &[bs(&[1, 1, 8, 8]), bs(&[1, 4, 8, 8]), bs(&[1])]).finish(),
    );
    let rg = super::resize::ResizeGeom { outer: 256, h: 40, w: 40, inner: 1, oh: 80, ow: 80, th: 4, tw: 4 };
    out.push(super::resize::kernel("resize", &rg).finish());
    let g = square_geom(64, [56, 56], 3, [56, 56], 1, 1, 1);
    let pool = super::conv::Pool { geom: g, images: 1, max: true, count_include_pad: false };
    out.push(super::conv::pool("maxpool", &pool).finish());
    let d = super::conv::DirectConv {
        geom: g,
        images: 1,
        oc: 64,
        groups: 64,
        bias: true,
        residual: true,
        activation: Activation::Clip(0.0, 6.0),
    };
    out.push(super::conv::direct("depthwise", &d).finish());
    let t = square_geom(64, [40, 40], 2, [80, 80], 2, 1, 0);
    let d = super::conv::DirectConv {
        geom: t,
        images: 1,
        oc: 64,
        groups: 1,
        bias: true,
        residual: false,
        activation: Activation::Relu,
    };
    out.push(super::conv::transposed("deconv", &d).finish());
    let mr = softmax::MaskRows::new(&[2, 12, 128, 128], &[2, 1, 1, 128]);
    out.push(softmax::kernel("softmax_masked", 2 * 12 * 128, 128, 1, 0.125, Some(&mr), false).finish());
    out.push(softmax::kernel("log_softmax_inner", 4 * 7, 37, 7, 1.0, None, true).finish());
    out.push(reduce::columns("reduce_columns", ReduceMode::Mean, 2, 32, 96).finish());
    for (j, ty) in [strided::Operands::F32, strided::Operands::I64, strided::Operands::I32, strided::Operands::Bool]
        .into_iter()
        .enumerate()
    {
        let k = strided::compare(&format!("compare{j}"), &[2, 3, 4], &[vec![12, 4, 1], vec![0, 1, 0]], "lt", ty);
        out.push(k.finish());
    }
    let elems = [
        gather::Elem::F32,
        gather::Elem::I64,
        gather::Elem::I32,
        gather::Elem::Bool,
        gather::Elem::F16,
        gather::Elem::Bf16,
    ];
    for (a, &from) in elems.iter().enumerate() {
        for (b, &to) in elems.iter().enumerate() {
            out.extend(gather::cast(&format!("cast{a}{b}"), from, to).map(|k| k.finish()));
        }
    }
    for tf32 in [false, true] {
        let d = gemm::Dense { m: 128, n: 768, k: 768, bias: true, residual: true, activation: Activation::Gelu };
        let t = GpuTarget::SM80.with_tf32(tf32);
        out.push(gemm::kernel(&format!("dense_tf32_{tf32}"), &d, &t, vec![]).unwrap().ptx);
    }
    for h in [Half::F16, Half::Bf16] {
        let d = gemm::Dense { m: 128, n: 768, k: 768, bias: true, residual: true, activation: Activation::Gelu };
        let g = gemm::Gemm { b: gemm::BLayout::Half(h), ..d.gemm() };
        out.push(gemm::gemm_kernel(&format!("dense_{}", h.ptx()), &g, &GpuTarget::SM80, vec![]).unwrap().ptx);
    }
    out
}

#[test]
fn every_kernel_passes_ptxas_without_spills() {
    let Some(ptxas) = super::ptxas::find() else {
        // tests/run.sh installs ptxas and requires the check.
        assert!(
            std::env::var_os("AIM_REQUIRE_PTXAS").is_none(),
            "ptxas not found (pip install nvidia-cuda-nvcc-cu12, or set PTXAS)"
        );
        eprintln!("ptxas not found: skipping the ptxas check (pip install nvidia-cuda-nvcc-cu12)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("aim-ptxas-{}", std::process::id()));
    let kernels = all_kernels();
    let reports = super::ptxas::check_kernels(&ptxas, &kernels, &[80, 90], &dir).unwrap_or_else(|e| panic!("{e}"));
    for (sm, r) in [80, 90].iter().zip(&reports) {
        assert!(r.spills.is_empty(), "sm_{sm}: spills in {:?}\n{}", r.spills, r.log);
        assert_eq!(r.kernels, kernels.len(), "{}", r.log);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A naive NCHW convolution (groups, strides, dilations, leading pads; the output size
/// given), then bias and relu.
#[allow(clippy::too_many_arguments)]
fn naive_conv(x: &[f32], w: &[f32], b: &[f32], n: usize, g: &gemm::ConvGeom, oc: usize, groups: usize) -> Vec<f64> {
    let (c, h, wd) = (g.c as usize, g.h as usize, g.w as usize);
    let (kh, kw, oh, ow) = (g.kh as usize, g.kw as usize, g.oh as usize, g.ow as usize);
    let (icg, ocg) = (c / groups, oc / groups);
    let mut y = vec![0f64; n * oc * oh * ow];
    for img in 0..n {
        for o in 0..oc {
            let grp = o / ocg;
            for p in 0..oh {
                for q in 0..ow {
                    let mut s = f64::from(b[o]);
                    for ic in 0..icg {
                        for r in 0..kh {
                            for t in 0..kw {
                                let ih = (p * g.stride[0] as usize + r * g.dilation[0] as usize) as isize
                                    - g.pad[0] as isize;
                                let iw = (q * g.stride[1] as usize + t * g.dilation[1] as usize) as isize
                                    - g.pad[1] as isize;
                                if ih < 0 || iw < 0 || ih >= h as isize || iw >= wd as isize {
                                    continue;
                                }
                                let xi = ((img * c + grp * icg + ic) * h + ih as usize) * wd + iw as usize;
                                let wi = ((o * icg + ic) * kh + r) * kw + t;
                                s += f64::from(x[xi]) * f64::from(w[wi]);
                            }
                        }
                    }
                    y[((img * oc + o) * oh + p) * ow + q] = s.max(0.0);
                }
            }
        }
    }
    y
}

/// A square window's geometry: `c` channels of `h × w` in, `k × k` taps, `oh × ow` out.
fn square_geom(
    c: usize,
    [h, w]: [usize; 2],
    k: usize,
    [oh, ow]: [usize; 2],
    st: usize,
    dil: usize,
    pad: usize,
) -> gemm::ConvGeom {
    gemm::ConvGeom {
        c: c as u32,
        h: h as u32,
        w: w as u32,
        kh: k as u32,
        kw: k as u32,
        oh: oh as u32,
        ow: ow as u32,
        stride: [st as u32; 2],
        dilation: [dil as u32; 2],
        pad: [pad as u32; 2],
    }
}

/// A direct or transposed convolution kernel (`gen`) with a bias, launched a thread per
/// output element of `n` images.
fn direct_kernel(
    gen: fn(&str, &super::conv::DirectConv) -> super::ptx::Kernel,
    geom: gemm::ConvGeom,
    n: usize,
    oc: usize,
    groups: usize,
    activation: Activation,
) -> Kernel {
    let d = super::conv::DirectConv {
        geom,
        images: n as u32,
        oc: oc as u32,
        groups: groups as u32,
        bias: true,
        residual: false,
        activation,
    };
    let count = n as u32 * d.oc * geom.oh * geom.ow;
    Kernel {
        name: "conv".into(),
        ptx: gen("conv", &d).finish(),
        grid: [super::grid_for(count as usize, super::conv::BLOCK, &GpuTarget::SM80), 1, 1],
        block: [super::conv::BLOCK, 1, 1],
        shared_bytes: 0,
        sources: vec![],
    }
}

/// Runs a convolution kernel `(x, w, y, bias)` with an output of `count` elements.
fn run_conv(kern: &Kernel, x: &[f32], w: &[f32], b: &[f32], count: usize) -> Vec<f32> {
    let mut mem = Memory::new();
    let (xa, wa, ya, ba) = (mem.upload(x), mem.upload(w), mem.alloc(count * 4), mem.upload(b));
    launch(kern, &[Arg::U64(xa), Arg::U64(wa), Arg::U64(ya), Arg::U64(ba)], &mut mem);
    mem.download(ya)
}

#[test]
fn convolutions_match_with_strides_dilations_pads_and_groups() {
    // (channels, h, w, k, stride, dilation, pad (leading; the trailing pad is 1 less), out channels, groups)
    let cases = [
        (3, 11, 9, 3, 2, 1, 1, 8, 1),
        (4, 10, 10, 3, 1, 2, 2, 6, 1),
        (6, 9, 7, 3, 2, 1, 1, 6, 6),
        (4, 8, 8, 5, 1, 1, 2, 4, 2),
    ];
    for (s, &(c, h, w, k, st, dil, pad, oc, groups)) in cases.iter().enumerate() {
        let span = dil * (k - 1) + 1;
        let (oh, ow) = ((h + 2 * pad - 1 - span) / st + 1, (w + 2 * pad - 1 - span) / st + 1);
        let geom = square_geom(c, [h, w], k, [oh, ow], st, dil, pad);
        let n = 2;
        let mut rng = Rng(31 + s as u64);
        let x = rng.vec(n * c * h * w, -1.0, 1.0);
        let wt = rng.vec(oc * (c / groups) * k * k, -1.0, 1.0);
        let b = rng.vec(oc, -1.0, 1.0);
        let kern = if groups == 1 {
            let g = gemm::Gemm {
                m: (n * oh * ow) as u32,
                n: oc as u32,
                k: (c * k * k) as u32,
                batch: 1,
                a: gemm::ALayout::Im2col(geom),
                b: gemm::BLayout::Cols { batch_stride: 0 },
                y: gemm::YLayout::Nchw { hw: (oh * ow) as u32 },
                bias: true,
                residual: false,
                activation: Activation::Relu,
            };
            gemm::gemm_kernel("conv", &g, &GpuTarget::SM80, vec![]).unwrap()
        } else {
            direct_kernel(super::conv::direct, geom, n, oc, groups, Activation::Relu)
        };
        let got = run_conv(&kern, &x, &wt, &b, n * oc * oh * ow);
        let want = naive_conv(&x, &wt, &b, n, &geom, oc, groups);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            close(g, w, 1e-5, &format!("case {s} element {i}"));
        }
    }
}

#[test]
fn transposed_convolutions_match_a_scatter() {
    // (channels, h, w, k, stride, dilation, pad, out channels, groups)
    let cases = [(4, 5, 6, 2, 2, 1, 0, 3, 1), (4, 4, 5, 3, 2, 1, 1, 6, 2), (3, 5, 4, 3, 1, 2, 1, 2, 1)];
    for (s, &(c, h, w, k, st, dil, pad, oc, groups)) in cases.iter().enumerate() {
        let span = dil * (k - 1) + 1;
        let (oh, ow) = ((h - 1) * st + span - 2 * pad, (w - 1) * st + span - 2 * pad);
        let geom = square_geom(c, [h, w], k, [oh, ow], st, dil, pad);
        let n = 2;
        let (icg, ocg) = (c / groups, oc / groups);
        let mut rng = Rng(71 + s as u64);
        let x = rng.vec(n * c * h * w, -1.0, 1.0);
        let wt = rng.vec(c * ocg * k * k, -1.0, 1.0);
        let b = rng.vec(oc, -1.0, 1.0);
        // The scatter form: every input pixel adds its taps into the output.
        let mut want: Vec<f64> = (0..n * oc * oh * ow).map(|e| f64::from(b[(e / (oh * ow)) % oc])).collect();
        for img in 0..n {
            for ic in 0..c {
                let grp = ic / icg;
                for o in 0..ocg {
                    for p in 0..h {
                        for q in 0..w {
                            for r in 0..k {
                                for t in 0..k {
                                    let y = (p * st + r * dil) as isize - pad as isize;
                                    let z = (q * st + t * dil) as isize - pad as isize;
                                    if y < 0 || z < 0 || y >= oh as isize || z >= ow as isize {
                                        continue;
                                    }
                                    let xv = f64::from(x[((img * c + ic) * h + p) * w + q]);
                                    let wv = f64::from(wt[((ic * ocg + o) * k + r) * k + t]);
                                    let oc_all = grp * ocg + o;
                                    want[((img * oc + oc_all) * oh + y as usize) * ow + z as usize] += xv * wv;
                                }
                            }
                        }
                    }
                }
            }
        }
        let kern = direct_kernel(super::conv::transposed, geom, n, oc, groups, Activation::Identity);
        let got = run_conv(&kern, &x, &wt, &b, n * oc * oh * ow);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            close(g, w, 1e-5, &format!("case {s} element {i}"));
        }
    }
}
