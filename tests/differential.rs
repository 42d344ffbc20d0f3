//! Differential tests: the cpu backend (fused, packed, vectorised) against the reference
//! backend on randomly generated small graphs — convolutions of every geometry with fused
//! bias/residual/activation, dense layers, and the fast elementwise, softmax, norm, pooling
//! and transpose kernels — under every ISA cap this machine supports; and the cuda backend,
//! compiled for sm_80 and run in the PTX interpreter, on every graph it lowers (the
//! convolution, dense, blocked-region and transposed-convolution graphs must all lower).
//! Tolerance: 1e-4 of each output's largest magnitude (the fast math approximations are
//! within 5e-7).

mod common;

use aim::{Backend, Model, Options, Tensor};
use aim_cuda::GpuTarget;
use aim_onnx::proto::{attribute_proto::AttributeType, AttributeProto};
use aim_ptx_interp::{run_program, Placement};
use common::*;

fn string_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(v.as_bytes().to_vec().into()),
        ..Default::default()
    }
}

fn auto_pad(v: &str) -> AttributeProto {
    string_attr("auto_pad", v)
}

fn i64_tensor(name: &str, v: &[i64]) -> aim_onnx::proto::TensorProto {
    aim_onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// The ISA caps to test under: every level this machine has (on AArch64, NEON and the
/// portable kernels).
fn caps() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut v = vec!["native", "x86-64-v3", "baseline"];
        if !std::arch::is_x86_feature_detected!("avx512f") {
            v.retain(|c| *c != "native");
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec!["native", "baseline"]
    }
}

/// Runs `model` on the reference backend, on the cpu backend under each cap, and (when
/// the cuda backend lowers it) compiled for sm_80 in the PTX interpreter, and compares.
/// Returns whether the cuda backend ran it (or would have: under `AIM_SKIP_PTX_INTERPRETER`,
/// set for the QEMU run, its part is skipped).
fn check(tag: &str, model: Vec<u8>, inputs: Vec<(String, Tensor)>) -> bool {
    let d = tempdir(&format!("diff-{tag}"));
    let path = d.join("m.onnx");
    std::fs::write(&path, model).unwrap();
    let reference = Model::load_with(&path, Backend::Reference).unwrap();
    let want = reference.run(inputs.clone()).unwrap();
    for cpu in caps() {
        let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
        let m = Model::load_with_options(&path, &opts).unwrap();
        let got = m.run(inputs.clone()).unwrap();
        let got: Vec<Tensor> = got.into_iter().map(|(_, t)| t).collect();
        compare(&format!("{tag} [{cpu}]"), &got, &want);
        // A capture runs node by node; a plain run of static shapes runs the typed steps from
        // the generated entry function. The same kernels: the same bytes.
        let by_node = m.run_capture(inputs.clone()).unwrap().outputs;
        for ((name, a), b) in by_node.iter().zip(&got) {
            assert_eq!(a.bytes(), b.bytes(), "{tag} [{cpu}] output {name}: steps and node-by-node runs differ");
        }
    }
    // tests/cross_aarch64.sh: under QEMU the interpreter repeats what the native run checks.
    if std::env::var_os("AIM_SKIP_PTX_INTERPRETER").is_some() {
        return true;
    }
    let sig: Vec<Vec<usize>> = reference
        .inputs()
        .iter()
        .map(|i| inputs.iter().find(|(n, _)| *n == i.name).unwrap().1.shape().to_vec())
        .collect();
    let p = match aim::gpu::compile(&reference.ir().graph, &sig, &GpuTarget::SM80, tag) {
        Ok(p) => p,
        Err(aim::Error::Lower { .. }) => return false,
        Err(e) => panic!("{tag} [cuda]: {e}"),
    };
    let by_name: std::collections::HashMap<String, Tensor> = inputs.into_iter().collect();
    let got = run_program(&p, &by_name, Placement::Arena).unwrap_or_else(|e| panic!("{tag} [cuda]: {e}"));
    compare(&format!("{tag} [cuda]"), &got, &want);
    true
}

/// `bytes` loaded on the cpu backend from a temporary folder named after `tag`: for tests
/// that read the optimised graph or the kernels a run used.
fn cpu_model(tag: &str, bytes: &[u8]) -> Model {
    let d = tempdir(tag);
    std::fs::write(d.join("m.onnx"), bytes).unwrap();
    Model::load_with(d.join("m.onnx"), Backend::Cpu).unwrap()
}

/// As [`check`], for graphs every backend must run (the cuda backend included).
fn check_all(tag: &str, model: Vec<u8>, inputs: Vec<(String, Tensor)>) {
    assert!(check(tag, model, inputs), "{tag}: the cuda backend did not lower it");
}

/// Each output within 1e-4 of the reference's largest magnitude.
fn compare(tag: &str, got: &[Tensor], want: &[(String, Tensor)]) {
    assert_eq!(got.len(), want.len(), "{tag}");
    for (g, (name, w)) in got.iter().zip(want) {
        assert_eq!(g.shape(), w.shape(), "{tag} output {name}");
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        let scale = w.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-4 * scale, "{tag} output {name}: max error {worst:e} vs scale {scale:e}");
    }
}

#[test]
fn random_convolutions_with_fused_epilogues() {
    let mut r = Rng(42);
    for case in 0..200 {
        let c: usize = r.pick(&[1, 3, 8, 16]);
        let depthwise = r.pick(&[false, false, true]);
        let group = if depthwise { c } else { r.pick(&[1, 1, 1, if c.is_multiple_of(2) { 2 } else { 1 }]) };
        let m = if depthwise { c } else { group * r.pick(&[1, 4, 13]) };
        let (h, w) = (r.pick(&[5, 9, 16]), r.pick(&[4, 9, 17]));
        let k = r.pick(&[1, 3, 3, 5]);
        let s = r.pick(&[1, 1, 2]);
        let d = if k > 1 { r.pick(&[1, 1, 2]) } else { 1 };
        let p = r.pick(&[0, 1, 2]);
        if (h + 2 * p) < (k - 1) * d + 1 || (w + 2 * p) < (k - 1) * d + 1 {
            continue;
        }
        let oh = (h + 2 * p - (k - 1) * d - 1) / s + 1;
        let ow = (w + 2 * p - (k - 1) * d - 1) / s + 1;
        let act = r.pick(&[
            "none",
            "Relu",
            "Clip",
            "LeakyRelu",
            "HardSigmoid",
            "HardSwish",
            "SiLU",
            "Tanh",
            "Elu",
            "Sigmoid",
        ]);
        let residual = r.pick(&[false, true]);
        let bn = r.pick(&[false, true]);
        let wt = r.values(m * (c / group) * k * k);
        let mut nodes = vec![node(
            "Conv",
            "conv",
            &["x", "W", "B"],
            &["y0"],
            vec![
                ints("kernel_shape", &[k as i64, k as i64]),
                ints("strides", &[s as i64, s as i64]),
                ints("dilations", &[d as i64, d as i64]),
                ints("pads", &[p as i64; 4]),
                int_attr("group", group as i64),
            ],
        )];
        let mut inits = vec![
            f32_tensor("W", &[m as i64, (c / group) as i64, k as i64, k as i64], &wt),
            f32_tensor("B", &[m as i64], &r.values(m)),
        ];
        let mut last = "y0".to_string();
        if bn {
            let var: Vec<f32> = r.values(m).iter().map(|v| v.abs() + 0.5).collect();
            inits.extend([
                f32_tensor("s", &[m as i64], &r.values(m)),
                f32_tensor("b", &[m as i64], &r.values(m)),
                f32_tensor("mu", &[m as i64], &r.values(m)),
                f32_tensor("var", &[m as i64], &var),
            ]);
            nodes.push(node("BatchNormalization", "bn", &[&last, "s", "b", "mu", "var"], &["y1"], vec![]));
            last = "y1".into();
        }
        let mut inputs = vec![("x".to_string(), Tensor::from_vec(&[2, c, h, w], r.values(2 * c * h * w)))];
        let mut graph_inputs = vec![value("x", 1, &[Ok(2), Ok(c as i64), Ok(h as i64), Ok(w as i64)])];
        if residual {
            nodes.push(node("Add", "res", &["skip", &last], &["y2"], vec![]));
            last = "y2".into();
            inputs.push(("skip".into(), Tensor::from_vec(&[2, m, oh, ow], r.values(2 * m * oh * ow))));
            graph_inputs.push(value("skip", 1, &[Ok(2), Ok(m as i64), Ok(oh as i64), Ok(ow as i64)]));
        }
        match act {
            "Relu" => nodes.push(node("Relu", "act", &[&last], &["y"], vec![])),
            "Clip" => {
                inits.extend([f32_tensor("lo", &[], &[-0.3]), f32_tensor("hi", &[], &[0.4])]);
                nodes.push(node("Clip", "act", &[&last, "lo", "hi"], &["y"], vec![]));
            }
            "SiLU" => {
                nodes.push(node("Sigmoid", "gate", &[&last], &["gate"], vec![]));
                nodes.push(node("Mul", "act", &[&last, "gate"], &["y"], vec![]));
            }
            "LeakyRelu" | "HardSigmoid" | "Elu" => {
                let alpha = AttributeProto {
                    name: Some("alpha".into()),
                    r#type: Some(AttributeType::Float as i32),
                    f: Some(0.3),
                    ..Default::default()
                };
                nodes.push(node(act, "act", &[&last], &["y"], vec![alpha]));
            }
            "HardSwish" | "Tanh" | "Sigmoid" => nodes.push(node(act, "act", &[&last], &["y"], vec![])),
            _ => nodes.push(node("Identity", "act", &[&last], &["y"], vec![])),
        }
        let model = model(
            nodes,
            graph_inputs,
            vec![value("y", 1, &[Ok(2), Ok(m as i64), Ok(oh as i64), Ok(ow as i64)])],
            inits,
            17,
        );
        check_all(&format!("conv{case}-c{c}m{m}g{group}k{k}s{s}d{d}p{p}-{act}-res{residual}-bn{bn}"), model, inputs);
    }
}

#[test]
fn random_dense_layers() {
    let mut r = Rng(7);
    for case in 0..20 {
        let (m, k, n) = (r.pick(&[1, 3, 17, 64]), r.pick(&[1, 5, 33, 128]), r.pick(&[1, 7, 40, 100]));
        let gemm = r.pick(&[false, true]);
        let wt = r.values(k * n);
        let (nodes, inits) = if gemm {
            let mut a = vec![int_attr("transB", 1)];
            a.push(AttributeProto {
                name: Some("beta".into()),
                r#type: Some(AttributeType::Float as i32),
                f: Some(1.0),
                ..Default::default()
            });
            (
                vec![node("Gemm", "fc", &["x", "W", "b"], &["h"], a), node("Relu", "r", &["h"], &["y"], vec![])],
                vec![f32_tensor("W", &[n as i64, k as i64], &wt), f32_tensor("b", &[n as i64], &r.values(n))],
            )
        } else {
            (
                vec![
                    node("MatMul", "mm", &["x", "W"], &["h"], vec![]),
                    node("Add", "bias", &["h", "b"], &["y"], vec![]),
                ],
                vec![f32_tensor("W", &[k as i64, n as i64], &wt), f32_tensor("b", &[n as i64], &r.values(n))],
            )
        };
        let model = model(
            nodes,
            vec![value("x", 1, &[Ok(m as i64), Ok(k as i64)])],
            vec![value("y", 1, &[Ok(m as i64), Ok(n as i64)])],
            inits,
            17,
        );
        check_all(
            &format!("dense{case}-{m}x{k}x{n}-gemm{gemm}"),
            model,
            vec![("x".into(), Tensor::from_vec(&[m, k], r.values(m * k)))],
        );
    }
}

#[test]
fn fast_kernels_match_reference() {
    let mut r = Rng(3);
    let shape = [2i64, 4, 6, 10];
    let n: usize = shape.iter().product::<i64>() as usize;
    let xin = || vec![value("x", 1, &shape.iter().map(|&d| Ok(d)).collect::<Vec<_>>())];
    let unknown = |name: &str| {
        let mut v = value(name, 1, &[]);
        if let Some(t) = v.r#type.as_mut() {
            if let Some(aim_onnx::proto::type_proto::Value::TensorType(tt)) = t.value.as_mut() {
                tt.shape = None;
            }
        }
        v
    };
    let cases: Vec<(&str, Vec<aim_onnx::proto::NodeProto>, Vec<aim_onnx::proto::TensorProto>)> = vec![
        ("erf", vec![node("Erf", "e", &["x"], &["y"], vec![])], vec![]),
        (
            "tanh-sigmoid-exp",
            vec![
                node("Tanh", "t", &["x"], &["a"], vec![]),
                node("Sigmoid", "s", &["a"], &["b"], vec![]),
                node("Exp", "e", &["b"], &["y"], vec![]),
            ],
            vec![],
        ),
        ("softmax", vec![node("Softmax", "s", &["x"], &["y"], vec![int_attr("axis", -1)])], vec![]),
        (
            "layernorm",
            vec![node("LayerNormalization", "ln", &["x", "g", "b"], &["y"], vec![int_attr("axis", -1)])],
            vec![f32_tensor("g", &[10], &r.values(10)), f32_tensor("b", &[10], &r.values(10))],
        ),
        ("transpose", vec![node("Transpose", "t", &["x"], &["y"], vec![ints("perm", &[0, 2, 1, 3])])], vec![]),
        ("transpose-last", vec![node("Transpose", "t", &["x"], &["y"], vec![ints("perm", &[3, 1, 0, 2])])], vec![]),
        (
            "row-broadcast",
            vec![node("Add", "a", &["x", "r"], &["m"], vec![]), node("Div", "d", &["m", "s"], &["y"], vec![])],
            vec![f32_tensor("r", &[1, 1, 1, 10], &r.values(10)), f32_tensor("s", &[], &[3.0])],
        ),
        (
            "pow-sqrt",
            vec![node("Pow", "p", &["x", "two"], &["a"], vec![]), node("Sqrt", "s", &["a"], &["y"], vec![])],
            vec![f32_tensor("two", &[], &[2.0])],
        ),
        (
            "maxpool",
            vec![node(
                "MaxPool",
                "p",
                &["x"],
                &["y"],
                vec![ints("kernel_shape", &[3, 3]), ints("strides", &[2, 2]), ints("pads", &[1, 1, 1, 1])],
            )],
            vec![],
        ),
        (
            "avgpool",
            vec![node(
                "AveragePool",
                "p",
                &["x"],
                &["y"],
                vec![ints("kernel_shape", &[2, 3]), ints("pads", &[1, 0, 1, 2]), int_attr("count_include_pad", 1)],
            )],
            vec![],
        ),
        ("gap", vec![node("GlobalAveragePool", "p", &["x"], &["y"], vec![])], vec![]),
        // Pools as real exporters write them: ceil mode (CRNNs), auto_pad SAME_UPPER
        // (paddle2onnx), and an average counting the padding with a ceil-mode overhang.
        (
            "maxpool-ceil",
            vec![node(
                "MaxPool",
                "p",
                &["x"],
                &["y"],
                vec![ints("kernel_shape", &[3, 3]), ints("strides", &[2, 2]), int_attr("ceil_mode", 1)],
            )],
            vec![],
        ),
        (
            "maxpool-same-upper",
            vec![node("MaxPool", "p", &["x"], &["y"], vec![ints("kernel_shape", &[2, 2]), auto_pad("SAME_UPPER")])],
            vec![],
        ),
        (
            "avgpool-ceil-pad",
            vec![node(
                "AveragePool",
                "p",
                &["x"],
                &["y"],
                vec![
                    ints("kernel_shape", &[3, 2]),
                    ints("strides", &[2, 2]),
                    ints("pads", &[1, 0, 1, 0]),
                    int_attr("ceil_mode", 1),
                    int_attr("count_include_pad", 1),
                ],
            )],
            vec![],
        ),
        // The Focus layer of YOLOv5/YOLOX: every other row and column, from 0 and from 1.
        (
            "slice-strided",
            vec![
                node("Slice", "s0", &["x", "st0", "en", "ax", "two"], &["a"], vec![]),
                node("Slice", "s1", &["x", "st1", "en", "ax", "two"], &["b"], vec![]),
                node("Concat", "c", &["a", "b"], &["y"], vec![int_attr("axis", 1)]),
            ],
            vec![
                i64_tensor("st0", &[0, 0]),
                i64_tensor("st1", &[1, 1]),
                i64_tensor("en", &[i64::MAX, 9]),
                i64_tensor("ax", &[2, 3]),
                i64_tensor("two", &[2, 3]),
            ],
        ),
        (
            "pad-constant",
            vec![node("Pad", "p", &["x", "pads", "cv"], &["y"], vec![])],
            vec![i64_tensor("pads", &[0, 1, 2, 0, 0, 0, 1, 3]), f32_tensor("cv", &[], &[0.5])],
        ),
        (
            "pad-reflect",
            vec![node("Pad", "p", &["x", "pads"], &["y"], vec![string_attr("mode", "reflect")])],
            vec![i64_tensor("pads", &[0, 0, 2, 3, 0, 0, 1, 4])],
        ),
        (
            "pad-edge",
            vec![node("Pad", "p", &["x", "pads"], &["y"], vec![string_attr("mode", "edge")])],
            vec![i64_tensor("pads", &[0, 2, 0, 1, 0, 1, 0, 5])],
        ),
        // GELU written out with Erf, in both multiplication orders: fused into one Gelu.
        (
            "gelu-erf",
            vec![
                node("Div", "d", &["x", "sqrt2"], &["a"], vec![]),
                node("Erf", "e", &["a"], &["b"], vec![]),
                node("Add", "p", &["one", "b"], &["c"], vec![]),
                node("Mul", "m", &["x", "c"], &["h"], vec![]),
                node("Mul", "half", &["h", "h5"], &["y"], vec![]),
            ],
            vec![
                f32_tensor("sqrt2", &[], &[std::f32::consts::SQRT_2]),
                f32_tensor("one", &[], &[1.0]),
                f32_tensor("h5", &[], &[0.5]),
            ],
        ),
        (
            "gelu-erf-half-first",
            vec![
                node("Mul", "d", &["x", "isq"], &["a"], vec![]),
                node("Erf", "e", &["a"], &["b"], vec![]),
                node("Add", "p", &["b", "one"], &["c"], vec![]),
                node("Mul", "half", &["h5", "x"], &["h"], vec![]),
                node("Mul", "m", &["h", "c"], &["y"], vec![]),
            ],
            vec![
                f32_tensor("isq", &[], &[std::f32::consts::FRAC_1_SQRT_2]),
                f32_tensor("one", &[], &[1.0]),
                f32_tensor("h5", &[], &[0.5]),
            ],
        ),
        // GELU written out with Tanh, as GPT-2 writes it (Pow, half first) and with x·x·x.
        (
            "gelu-tanh-pow",
            vec![
                node("Pow", "p3", &["x", "three"], &["p"], vec![]),
                node("Mul", "q", &["p", "k"], &["q"], vec![]),
                node("Add", "r", &["x", "q"], &["r"], vec![]),
                node("Mul", "s", &["r", "s2pi"], &["s"], vec![]),
                node("Tanh", "t", &["s"], &["t"], vec![]),
                node("Mul", "half", &["x", "h5"], &["h"], vec![]),
                node("Add", "u", &["t", "one"], &["u"], vec![]),
                node("Mul", "m", &["h", "u"], &["y"], vec![]),
            ],
            vec![
                f32_tensor("three", &[], &[3.0]),
                f32_tensor("k", &[], &[0.044715]),
                f32_tensor("s2pi", &[], &[(2.0 / std::f32::consts::PI).sqrt()]),
                f32_tensor("one", &[], &[1.0]),
                f32_tensor("h5", &[], &[0.5]),
            ],
        ),
        (
            "gelu-tanh-cube",
            vec![
                node("Mul", "sq", &["x", "x"], &["x2"], vec![]),
                node("Mul", "cu", &["x", "x2"], &["p"], vec![]),
                node("Mul", "q", &["k", "p"], &["q"], vec![]),
                node("Add", "r", &["q", "x"], &["r"], vec![]),
                node("Mul", "s", &["s2pi", "r"], &["s"], vec![]),
                node("Tanh", "t", &["s"], &["t"], vec![]),
                node("Add", "u", &["one", "t"], &["u"], vec![]),
                node("Mul", "m", &["x", "u"], &["h"], vec![]),
                node("Mul", "half", &["h", "h5"], &["y"], vec![]),
            ],
            vec![
                f32_tensor("k", &[], &[0.044715]),
                f32_tensor("s2pi", &[], &[(2.0 / std::f32::consts::PI).sqrt()]),
                f32_tensor("one", &[], &[1.0]),
                f32_tensor("h5", &[], &[0.5]),
            ],
        ),
        (
            "matmul-activations",
            vec![
                node("Transpose", "t", &["x"], &["xt"], vec![ints("perm", &[0, 1, 3, 2])]),
                node("MatMul", "mm", &["x", "xt"], &["y"], vec![]),
            ],
            vec![],
        ),
        // B broadcast over consecutive batch items (grouped attention heads sharing a
        // key/value head): [2,4,6,10] × [2,1,10,6], one product of 4·6 rows per B.
        (
            "matmul-shared-b",
            vec![
                node("ReduceMean", "kv", &["x"], &["r"], vec![ints("axes", &[1])]),
                node("Transpose", "t", &["r"], &["rt"], vec![ints("perm", &[0, 1, 3, 2])]),
                node("MatMul", "mm", &["x", "rt"], &["y"], vec![]),
            ],
            vec![],
        ),
        // Attention over a key/value head shared by the four query heads, scaled and
        // masked (one aim:Attention on the cpu backend), and without either.
        (
            "attention-shared-kv",
            vec![
                node("ReduceMean", "kv", &["x"], &["k"], vec![ints("axes", &[1])]),
                node("Transpose", "t", &["k"], &["kt"], vec![ints("perm", &[0, 1, 3, 2])]),
                node("MatMul", "qk", &["x", "kt"], &["s"], vec![]),
                node("Mul", "scale", &["s", "c"], &["sc"], vec![]),
                node("Add", "mask", &["sc", "m"], &["sm"], vec![]),
                node("Softmax", "p", &["sm"], &["p"], vec![int_attr("axis", -1)]),
                node("MatMul", "pv", &["p", "k"], &["y"], vec![]),
            ],
            vec![f32_tensor("c", &[], &[0.3]), f32_tensor("m", &[1, 1, 1, 6], &[0.0, -1e30, 0.0, 0.5, -2.0, 0.0])],
        ),
        (
            "attention-plain",
            vec![
                node("Transpose", "t", &["x"], &["xt"], vec![ints("perm", &[0, 1, 3, 2])]),
                node("MatMul", "qk", &["x", "xt"], &["s"], vec![]),
                node("Softmax", "p", &["s"], &["p"], vec![int_attr("axis", -1)]),
                node("MatMul", "pv", &["p", "x"], &["y"], vec![]),
            ],
            vec![],
        ),
        // Multi-head attention as exporters write it: x [2, 4, 6, 10] read as [batch,
        // seq, heads, head dim], split into heads by transposes (K straight to [.., H, S]),
        // merged back by one: every transpose is read or written in place.
        (
            "attention-heads",
            vec![
                node("Transpose", "tq", &["x"], &["q"], vec![ints("perm", &[0, 2, 1, 3])]),
                node("Transpose", "tk", &["x"], &["kt"], vec![ints("perm", &[0, 2, 3, 1])]),
                node("Transpose", "tv", &["x"], &["v"], vec![ints("perm", &[0, 2, 1, 3])]),
                node("MatMul", "qk", &["q", "kt"], &["s"], vec![]),
                node("Mul", "scale", &["s", "c"], &["sc"], vec![]),
                node("Softmax", "p", &["sc"], &["p"], vec![int_attr("axis", -1)]),
                node("MatMul", "pv", &["p", "v"], &["o"], vec![]),
                node("Transpose", "merge", &["o"], &["y"], vec![ints("perm", &[0, 2, 1, 3])]),
            ],
            vec![f32_tensor("c", &[], &[0.3])],
        ),
        // The same with one key/value head (the mean over the heads) for all six query
        // heads: 24 query rows per key/value item, the panel schedule.
        (
            "attention-heads-shared-kv",
            vec![
                node("ReduceMean", "kv", &["x"], &["r"], vec![ints("axes", &[2])]),
                node("Transpose", "tq", &["x"], &["q"], vec![ints("perm", &[0, 2, 1, 3])]),
                node("Transpose", "tk", &["r"], &["kt"], vec![ints("perm", &[0, 2, 3, 1])]),
                node("Transpose", "tv", &["r"], &["v"], vec![ints("perm", &[0, 2, 1, 3])]),
                node("MatMul", "qk", &["q", "kt"], &["s"], vec![]),
                node("Mul", "scale", &["s", "c"], &["sc"], vec![]),
                node("Add", "mask", &["sc", "m"], &["sm"], vec![]),
                node("Softmax", "p", &["sm"], &["p"], vec![int_attr("axis", -1)]),
                node("MatMul", "pv", &["p", "v"], &["o"], vec![]),
                node("Transpose", "merge", &["o"], &["y"], vec![ints("perm", &[0, 2, 1, 3])]),
            ],
            vec![f32_tensor("c", &[], &[0.3]), f32_tensor("m", &[1, 1, 1, 4], &[0.0, -1e30, 0.5, -2.0])],
        ),
        // Both operands broadcast: a column times a row (a LayerNorm written out in full).
        (
            "outer-broadcast",
            vec![
                node("ReduceMean", "col", &["x"], &["c"], vec![ints("axes", &[3])]),
                node("ReduceMax", "row", &["x"], &["r"], vec![ints("axes", &[2])]),
                node("Mul", "outer", &["c", "r"], &["o"], vec![]),
                node("Sub", "shift", &["r", "o"], &["y"], vec![]),
            ],
            vec![],
        ),
        // A 1-D global max pool (NCW) and a transpose whose size-one dims reduce it to a
        // matrix transpose (magika's).
        (
            "gmp-1d",
            vec![
                node("Reshape", "flat", &["x", "ncw"], &["w"], vec![]),
                node("GlobalMaxPool", "p", &["w"], &["y"], vec![]),
            ],
            vec![i64_tensor("ncw", &[2, 4, 60])],
        ),
        (
            "transpose-ones",
            vec![
                node("Reshape", "flat", &["x", "mat"], &["w"], vec![]),
                node("Transpose", "t", &["w"], &["y"], vec![ints("perm", &[0, 2, 1, 3])]),
            ],
            vec![i64_tensor("mat", &[1, 8, 60, 1])],
        ),
        // A comparison against a constant, then a cast (a one-hot written as Equal).
        (
            "compare-cast",
            vec![
                node("Less", "lt", &["x", "k"], &["b"], vec![]),
                node("Cast", "c", &["b"], &["y"], vec![int_attr("to", 1)]),
            ],
            vec![f32_tensor("k", &[10], &r.values(10))],
        ),
        // A squeeze-excitation gate pooled by ReduceMean over H and W (a GlobalAveragePool),
        // and a SAME_UPPER 2×2 stride-1 max pool (explicit pads for the blocked kernel).
        (
            "se-reducemean",
            vec![
                node("ReduceMean", "pool", &["x"], &["m"], vec![ints("axes", &[2, 3])]),
                node("Sigmoid", "gate", &["m"], &["s"], vec![]),
                node("Mul", "scale", &["x", "s"], &["y"], vec![]),
            ],
            vec![],
        ),
        (
            "maxpool-same-stride1",
            vec![node(
                "MaxPool",
                "p",
                &["x"],
                &["y"],
                vec![ints("kernel_shape", &[2, 2]), ints("strides", &[1, 1]), auto_pad("SAME_UPPER")],
            )],
            vec![],
        ),
    ];
    // The cases added with their fast kernels: none may fall back to a reference kernel.
    let census =
        ["outer-broadcast", "gmp-1d", "transpose-ones", "compare-cast", "se-reducemean", "maxpool-same-stride1"];
    for (tag, nodes, inits) in cases {
        let m = model(nodes, xin(), vec![unknown("y")], inits, 17);
        if census.contains(&tag) {
            let model = cpu_model(&format!("census-{tag}"), &m);
            model.run(vec![("x".into(), Tensor::from_vec(&[2, 4, 6, 10], r.values(n)))]).unwrap();
            let (_, kinds) = model.node_kinds().unwrap();
            let slow: Vec<&String> =
                kinds.iter().filter(|(_, k)| *k == aim_runtime::cpu::NodeKind::Reference).map(|(n, _)| n).collect();
            assert!(slow.is_empty(), "{tag}: nodes on reference kernels: {slow:?}");
        }
        if tag.starts_with("attention") {
            let model = cpu_model(&format!("fused-{tag}"), &m);
            let ops: Vec<String> = model.optimized_graph().unwrap().nodes.iter().map(|n| n.op.clone()).collect();
            assert!(ops.contains(&"Attention".to_string()) && !ops.contains(&"MatMul".to_string()), "{tag}: {ops:?}");
        }
        if tag.starts_with("gelu") {
            let model = cpu_model(&format!("fused-{tag}"), &m);
            let ops: Vec<String> = model.optimized_graph().unwrap().nodes.iter().map(|n| n.op.clone()).collect();
            assert_eq!(ops, ["Gelu"], "{tag}: the written-out GELU is one node");
        }
        check(
            tag,
            m,
            vec![("x".into(), Tensor::from_vec(&[2, 4, 6, 10], r.values(n).iter().map(|v| v * 3.0).collect()))],
        );
    }
    // Reductions over trailing axes compile to generated loops (axes as a constant input at
    // opset 18, as an attribute at 13); other axes keep the reference kernel.
    let i64s = |name: &str, v: &[i64]| aim_onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    for op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"] {
        for (axes, keep) in [(vec![-1i64], 1i64), (vec![2, 3], 0), (vec![1, 2, 3], 1), (vec![1], 1), (vec![], 0)] {
            let tag = format!("{op}-{axes:?}-keep{keep}");
            let m18 = model(
                vec![node(op, "r", &["x", "axes"], &["y"], vec![int_attr("keepdims", keep)])],
                xin(),
                vec![unknown("y")],
                vec![i64s("axes", &axes)],
                18,
            );
            check(&tag, m18, vec![("x".into(), Tensor::from_vec(&[2, 4, 6, 10], r.values(n)))]);
            if op != "ReduceSum" && !axes.is_empty() {
                let m13 = model(
                    vec![node(op, "r", &["x"], &["y"], vec![ints("axes", &axes), int_attr("keepdims", keep)])],
                    xin(),
                    vec![unknown("y")],
                    vec![],
                    13,
                );
                check(
                    &format!("{tag}-opset13"),
                    m13,
                    vec![("x".into(), Tensor::from_vec(&[2, 4, 6, 10], r.values(n)))],
                );
            }
        }
    }
}

#[test]
fn symbolic_batch_fusions() {
    // MatMul + bias + Relu, then an elementwise chain, over a symbolic batch.
    let mut r = Rng(11);
    let m = model(
        vec![
            node("MatMul", "mm", &["x", "W"], &["h"], vec![]),
            node("Add", "bias", &["h", "b"], &["hb"], vec![]),
            node("Relu", "act", &["hb"], &["a"], vec![]),
            node("Mul", "m1", &["a", "x2"], &["p"], vec![]),
            node("Add", "a1", &["p", "one"], &["q"], vec![]),
            node("Sqrt", "s", &["q"], &["y"], vec![]),
        ],
        vec![value("x", 1, &[Err("N"), Ok(6)]), value("x2", 1, &[Err("N"), Ok(5)])],
        vec![value("y", 1, &[Err("N"), Ok(5)])],
        vec![
            f32_tensor("W", &[6, 5], &r.values(30)),
            f32_tensor("b", &[5], &r.values(5)),
            f32_tensor("one", &[], &[1.0]),
        ],
        17,
    );
    for batch in [1usize, 7, 33] {
        let x = Tensor::from_vec(&[batch, 6], r.values(batch * 6));
        let x2 = Tensor::from_vec(&[batch, 5], r.values(batch * 5).iter().map(|v| v.abs()).collect());
        check(&format!("symbolic-{batch}"), m.clone(), vec![("x".into(), x), ("x2".into(), x2)]);
    }
}

/// Chains the layout pass moves to the blocked layout: a first convolution (read as NCHW
/// when it has few input channels), a depthwise one, a pointwise one with a residual from
/// earlier in the chain, and an intermediate value that a non-convolution also reads (so it
/// needs its NCHW copy back) — over channel counts that do and do not fill a block; 3×3
/// first layers with enough channels run as Winograd.
#[test]
fn random_blocked_chains() {
    let mut r = Rng(99);
    for case in 0..40 {
        // 16 and 40 input channels with a 3×3 first layer take the Winograd path (at least
        // two channel blocks: 16 under x86-64-v3, 32 with AVX-512).
        let c0 = r.pick(&[3, 8, 16, 20, 40]);
        let c = r.pick(&[8, 16, 24, 40]);
        let (h, w) = (r.pick(&[7, 12, 15]), r.pick(&[6, 11, 14]));
        let k0 = r.pick(&[1, 3]);
        let s = r.pick(&[1, 2]);
        let p0 = k0 / 2;
        let kv = |k: usize| ints("kernel_shape", &[k as i64, k as i64]);
        let pads = |p: usize| ints("pads", &[p as i64; 4]);
        let strides = |s: usize| ints("strides", &[s as i64, s as i64]);
        let (oh, ow) = ((h - 1) / s + 1, (w - 1) / s + 1);
        // Pooling after the chain (it stays blocked), then global pooling (it leaves it).
        let pool_op = r.pick(&["MaxPool", "AveragePool"]);
        let (pk, ps, pp) = (r.pick(&[2, 3]), r.pick(&[1, 2]), r.pick(&[0, 1]));
        let pp = if pk == 2 { 0 } else { pp };
        let pool_attrs = vec![kv(pk), strides(ps), pads(pp), int_attr("count_include_pad", r.pick(&[0, 1]))];
        let inits = vec![
            f32_tensor("W0", &[c as i64, c0 as i64, k0 as i64, k0 as i64], &r.values(c * c0 * k0 * k0)),
            f32_tensor("B0", &[c as i64], &r.values(c)),
            f32_tensor("W1", &[c as i64, 1, 3, 3], &r.values(c * 9)),
            f32_tensor("B1", &[c as i64], &r.values(c)),
            f32_tensor("W2", &[c as i64, c as i64, 1, 1], &r.values(c * c)),
            f32_tensor("lo", &[], &[0.0]),
            f32_tensor("hi", &[], &[6.0]),
        ];
        let nodes = vec![
            node("Conv", "stem", &["x", "W0", "B0"], &["a0"], vec![kv(k0), pads(p0)]),
            node("Relu", "stem_relu", &["a0"], &["a"], vec![]),
            node(
                "Conv",
                "dw",
                &["a", "W1", "B1"],
                &["b0"],
                vec![kv(3), pads(1), strides(s), int_attr("group", c as i64)],
            ),
            node("Clip", "dw_clip", &["b0", "lo", "hi"], &["b"], vec![]),
            node("Conv", "pw", &["b", "W2"], &["c0"], vec![kv(1)]),
            node("Add", "res", &["c0", "b"], &["y"], vec![]),
            node("Sigmoid", "side", &["b"], &["z"], vec![]),
            node(pool_op, "pool", &["y"], &["q"], pool_attrs),
            node("GlobalAveragePool", "gap", &["q"], &["v"], vec![]),
        ];
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[2, c0, h, w], r.values(2 * c0 * h * w)))];
        let dims = |c: usize| [Ok(2), Ok(c as i64), Ok(oh as i64), Ok(ow as i64)];
        let outputs =
            vec![value("y", 1, &dims(c)), value("z", 1, &dims(c)), value("v", 1, &[Ok(2), Ok(c as i64), Ok(1), Ok(1)])];
        let model =
            model(nodes, vec![value("x", 1, &[Ok(2), Ok(c0 as i64), Ok(h as i64), Ok(w as i64)])], outputs, inits, 17);
        let tag = format!("chain{case}-c{c0}-{c}-{h}x{w}-k{k0}-s{s}");
        // The chain did go blocked: three blocked convolutions, the Sigmoid of b (pointwise:
        // it stays blocked), and NCHW copies of the two values read outside it (the outputs
        // y and z).
        let d = tempdir(&format!("layout-{tag}"));
        std::fs::write(d.join("m.onnx"), &model).unwrap();
        let m = Model::load_with_options(
            d.join("m.onnx"),
            &Options { backend: Backend::Cpu, threads: Some(1), cpu: "native".into(), ..Options::default() },
        )
        .unwrap();
        let g = m.optimized_graph().unwrap();
        // Three convolutions, the Sigmoid, the pooling and the global pooling.
        assert_eq!(g.nodes.iter().filter(|n| n.attrs.contains_key("layout")).count(), 6, "{tag}");
        assert_eq!(
            g.nodes.iter().filter(|n| n.op == "FromBlocked").count(),
            2,
            "{tag}: y and z leave the blocked layout"
        );
        check_all(&tag, model, inputs);
    }
}

/// A model with a symbolic batch that computes a Reshape target from its input's shape (as
/// exported transformers do): each new batch size compiles one specialised program, in
/// which the shape arithmetic has been folded away; results match the reference; a batch
/// seen before reuses its program.
#[test]
fn shape_specialisation_per_input_signature() {
    let i64s = |name: &str, dims: &[i64], v: &[i64]| aim_onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let nodes = vec![
        node("Shape", "shape", &["x"], &["s"], vec![]),
        node("Gather", "batch", &["s", "zero"], &["b"], vec![int_attr("axis", 0)]),
        node("Unsqueeze", "b1", &["b", "axis0"], &["b1"], vec![]),
        node("Concat", "target", &["b1", "rest"], &["t"], vec![int_attr("axis", 0)]),
        node("Reshape", "reshape", &["x", "t"], &["r"], vec![]),
        node("Relu", "relu", &["r"], &["y"], vec![]),
    ];
    let inits = vec![i64s("zero", &[], &[0]), i64s("axis0", &[1], &[0]), i64s("rest", &[2], &[3, 2])];
    let m = model(
        nodes,
        vec![value("x", 1, &[Err("N"), Ok(6)])],
        vec![value("y", 1, &[Err("N"), Ok(3), Ok(2)])],
        inits,
        17,
    );
    let d = tempdir("specialise");
    let path = d.join("m.onnx");
    std::fs::write(&path, m).unwrap();
    let cpu = Model::load_with_options(
        &path,
        &Options { backend: Backend::Cpu, threads: Some(2), cpu: "native".into(), ..Options::default() },
    )
    .unwrap();
    let reference = Model::load_with(&path, Backend::Reference).unwrap();
    assert!(cpu.specializations().is_empty());
    let mut r = Rng(5);
    for (round, n) in [2usize, 5, 2].into_iter().enumerate() {
        let x = vec![("x".to_string(), Tensor::from_vec(&[n, 6], r.values(n * 6)))];
        let (got, want) = (cpu.run(x.clone()).unwrap(), reference.run(x).unwrap());
        assert_eq!(got[0].1.shape(), &[n, 3, 2]);
        assert_eq!(got[0].1.to_f64_vec(), want[0].1.to_f64_vec(), "batch {n}");
        let specs = cpu.specializations();
        assert_eq!(specs.len(), if round == 0 { 1 } else { 2 }, "one program per new batch size");
        assert_eq!(specs[0].0, vec![vec![n, 6]], "the most recent signature first");
        let g = specs[0].1.as_ref().expect("specialised");
        assert!(
            !g.nodes.iter().any(|n| n.op == "Shape"),
            "the shape arithmetic was folded: {:?}",
            g.nodes.iter().map(|n| &n.op).collect::<Vec<_>>()
        );
    }
}

/// The arena: an elementwise loop of two inputs (so not a program in the dense layer's
/// epilogue) overwrites the dense output it reads (in place), Flatten
/// views share their source's bytes, a library kernel (Softmax) reads such a view in place,
/// and a view that is a graph output is copied out. Two runs with different inputs (the
/// second finds the first's values in the arena, the first finds NaN) both match the
/// reference.
#[test]
fn arena_in_place_views_and_reuse() {
    let mut r = Rng(5);
    let (m, k, n) = (5, 24, 40);
    let f32s = |name: &str, dims: &[i64], r: &mut Rng| {
        f32_tensor(name, dims, &r.values(dims.iter().product::<i64>() as usize))
    };
    let inits = vec![
        f32s("W1", &[k, n], &mut r),
        f32s("b1", &[n], &mut r),
        f32_tensor("s", &[], &[0.75]),
        f32s("W2", &[n, 16], &mut r),
        f32s("b2", &[16], &mut r),
    ];
    let nodes = vec![
        node("MatMul", "fc1", &["x", "W1"], &["h0"], vec![]),
        node("Add", "fc1_bias", &["h0", "b1"], &["h"], vec![]),
        node("Abs", "act", &["h"], &["t"], vec![]),
        node("Mul", "scale", &["t", "s"], &["ts"], vec![]),
        node("Mul", "gate", &["ts", "g"], &["u"], vec![]),
        node("Flatten", "rows", &["u"], &["v"], vec![int_attr("axis", 2)]),
        node("MatMul", "fc2", &["v", "W2"], &["y0"], vec![]),
        node("Add", "fc2_bias", &["y0", "b2"], &["y"], vec![]),
        node("Flatten", "flat", &["u"], &["f"], vec![int_attr("axis", 1)]),
        node("Softmax", "sm", &["v"], &["z"], vec![int_attr("axis", -1)]),
    ];
    let outputs = vec![
        value("y", 1, &[Ok(2 * m), Ok(16)]),
        value("z", 1, &[Ok(2 * m), Ok(n)]),
        value("f", 1, &[Ok(2), Ok(m * n)]),
    ];
    let inputs = vec![value("x", 1, &[Ok(2), Ok(m), Ok(k)]), value("g", 1, &[Ok(2), Ok(m), Ok(n)])];
    let model = model(nodes, inputs, outputs, inits, 17);
    let d = tempdir("arena");
    let path = d.join("m.onnx");
    std::fs::write(&path, &model).unwrap();
    let cpu = Model::load_with_options(
        &path,
        &Options { backend: Backend::Cpu, threads: Some(2), cpu: "native".into(), ..Options::default() },
    )
    .unwrap();
    let plan = aim_compiler::memory_plan::plan(cpu.optimized_graph().unwrap());
    assert!(plan.slots.iter().any(|s| s.in_place_of.is_some()), "the |h|·s·g loop runs in place: {plan:?}");
    assert_eq!(
        plan.slots.iter().filter(|s| s.view_of.is_some()).count(),
        1,
        "the Flatten read by fc2 is a view: {plan:?}"
    );
    assert!(plan.allocated.iter().any(|(v, _)| v == "f"), "the Flatten that is an output is allocated: {plan:?}");
    let reference = Model::load_with(&path, Backend::Reference).unwrap();
    for round in 0..2 {
        let x = Tensor::from_vec(&[2, m as usize, k as usize], r.values(2 * (m * k) as usize));
        let g = Tensor::from_vec(&[2, m as usize, n as usize], r.values(2 * (m * n) as usize));
        let feeds = vec![("x".to_string(), x), ("g".to_string(), g)];
        let want = reference.run(feeds.clone()).unwrap();
        let got = cpu.run(feeds).unwrap();
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape(), "round {round}, output {name}");
            let worst = g.to_f64_vec().iter().zip(w.to_f64_vec()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst <= 1e-5, "round {round}, output {name}: max error {worst:e}");
        }
    }
}

/// Fused convolutions overwrite their residual in place when it dies there: the direct
/// blocked kernel starts its sums from it, the depthwise and Winograd kernels (and plain
/// NCHW convolutions) get a copy of it first. Each variant against the reference, under
/// every ISA cap.
#[test]
fn residuals_overwritten_in_place() {
    let mut r = Rng(77);
    let c = 32;
    let kv = |k: i64| ints("kernel_shape", &[k, k]);
    for (tag, k, group) in [("direct", 1, 1), ("depthwise", 3, c), ("winograd", 3, 1), ("grouped", 3, 4)] {
        let inits = vec![
            f32_tensor("Wa", &[c, c, 1, 1], &r.values((c * c) as usize)),
            f32_tensor("W", &[c, c / group, k, k], &r.values((c * c / group * k * k) as usize)),
            f32_tensor("B", &[c], &r.values(c as usize)),
        ];
        let nodes = vec![
            // A residual no convolution can absorb (so the Add fuses into "conv").
            node("Sigmoid", "res", &["x"], &["r"], vec![]),
            node("Conv", "pre", &["x", "Wa"], &["a"], vec![kv(1)]),
            node(
                "Conv",
                "conv",
                &["a", "W", "B"],
                &["y0"],
                vec![kv(k), ints("pads", &[k / 2; 4]), int_attr("group", group)],
            ),
            node("Add", "add", &["y0", "r"], &["y1"], vec![]),
            node("Relu", "act", &["y1"], &["y"], vec![]),
            // So that y is an intermediate (graph outputs are allocated for the caller).
            node("Sigmoid", "post", &["y"], &["z"], vec![]),
        ];
        let (h, w) = (9, 10);
        let dims = [Ok(1), Ok(c), Ok(h), Ok(w)];
        let model = model(nodes, vec![value("x", 1, &dims)], vec![value("z", 1, &dims)], inits, 17);
        let d = tempdir(&format!("in-place-{tag}"));
        std::fs::write(d.join("m.onnx"), &model).unwrap();
        let m = Model::load_with_options(
            d.join("m.onnx"),
            &Options { backend: Backend::Cpu, threads: Some(2), cpu: "native".into(), ..Options::default() },
        )
        .unwrap();
        let plan = aim_compiler::memory_plan::plan(m.optimized_graph().unwrap());
        assert!(
            plan.slots.iter().any(|s| s.in_place_of.is_some()),
            "{tag}: the conv takes its residual's slot: {plan:?}"
        );
        let x = Tensor::from_vec(&[1, c as usize, h as usize, w as usize], r.values((c * h * w) as usize));
        check(&format!("in-place-{tag}"), model, vec![("x".into(), x)]);
    }
}

/// One model run from several threads at once: each run takes its own arena (the program
/// keeps one per concurrent run), so results equal those of runs one at a time.
#[test]
fn concurrent_runs_use_separate_arenas() {
    let mut r = Rng(31);
    let (k, n) = (48, 64);
    let inits = vec![
        f32_tensor("W1", &[k, n], &r.values((k * n) as usize)),
        f32_tensor("W2", &[n, k], &r.values((k * n) as usize)),
    ];
    let nodes = vec![
        node("MatMul", "fc1", &["x", "W1"], &["h"], vec![]),
        node("Tanh", "act", &["h"], &["t"], vec![]),
        node("MatMul", "fc2", &["t", "W2"], &["y0"], vec![]),
        node("Add", "res", &["y0", "x"], &["y"], vec![]),
    ];
    let model = model(nodes, vec![value("x", 1, &[Ok(16), Ok(k)])], vec![value("y", 1, &[Ok(16), Ok(k)])], inits, 17);
    let d = tempdir("concurrent");
    std::fs::write(d.join("m.onnx"), &model).unwrap();
    let m = Model::load_with_options(
        d.join("m.onnx"),
        &Options { backend: Backend::Cpu, threads: Some(2), cpu: "native".into(), ..Options::default() },
    )
    .unwrap();
    let inputs: Vec<Tensor> = (0..8).map(|_| Tensor::from_vec(&[16, k as usize], r.values(16 * k as usize))).collect();
    let want: Vec<Vec<f64>> =
        inputs.iter().map(|x| m.run(vec![("x".into(), x.clone())]).unwrap()[0].1.to_f64_vec()).collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (m, inputs, want) = (&m, &inputs, &want);
            s.spawn(move || {
                for round in 0..50 {
                    let i = (t + round) % inputs.len();
                    let got = m.run(vec![("x".into(), inputs[i].clone())]).unwrap()[0].1.to_f64_vec();
                    assert_eq!(got, want[i], "thread {t}, round {round}");
                }
            });
        }
    });
}

/// Attention's scaled, masked softmax fuses into one `aim:Softmax` (Div or Mul by a
/// constant, a mask along the last axis in either operand order, or only one of the two),
/// and a mask that does not run along the last axis keeps the separate nodes; all against
/// the reference under every ISA cap.
#[test]
fn scaled_masked_softmax_fusion() {
    let mut r = Rng(123);
    let (h, s) = (3i64, 20i64);
    let scores = [Ok(1), Ok(h), Ok(s), Ok(s)];
    // (tag, nodes, mask shape, fused)
    let cases: Vec<(&str, Vec<_>, Vec<i64>, bool)> = vec![
        (
            "div-mask",
            vec![
                node("Div", "scale", &["x", "c"], &["a"], vec![]),
                node("Add", "mask", &["a", "m"], &["b"], vec![]),
                node("Softmax", "sm", &["b"], &["y"], vec![int_attr("axis", -1)]),
            ],
            vec![1, 1, 1, s],
            true,
        ),
        (
            "mul-mask-swapped",
            vec![
                node("Mul", "scale", &["c", "x"], &["a"], vec![]),
                node("Add", "mask", &["m", "a"], &["b"], vec![]),
                node("Softmax", "sm", &["b"], &["y"], vec![]),
            ],
            vec![s],
            true,
        ),
        (
            "full-mask",
            vec![
                node("Add", "mask", &["x", "m"], &["b"], vec![]),
                node("Softmax", "sm", &["b"], &["y"], vec![int_attr("axis", 3)]),
            ],
            vec![1, h, s, s],
            true,
        ),
        (
            "scale-only",
            vec![node("Div", "scale", &["x", "c"], &["a"], vec![]), node("Softmax", "sm", &["a"], &["y"], vec![])],
            vec![1],
            true,
        ),
        (
            "row-mask",
            vec![node("Add", "mask", &["x", "m"], &["b"], vec![]), node("Softmax", "sm", &["b"], &["y"], vec![])],
            vec![1, 1, s, 1],
            false,
        ),
    ];
    for (tag, nodes, mshape, fused) in cases {
        let mvals: Vec<f32> = r
            .values(mshape.iter().product::<i64>() as usize)
            .iter()
            .map(|v| if *v < -0.5 { -10000.0 } else { *v })
            .collect();
        let inits = vec![f32_tensor("c", &[], &[5.656854]), f32_tensor("m", &mshape, &mvals)];
        let model = model(nodes, vec![value("x", 1, &scores)], vec![value("y", 1, &scores)], inits, 17);
        let d = tempdir(&format!("softmax-{tag}"));
        std::fs::write(d.join("m.onnx"), &model).unwrap();
        let m = Model::load_with_options(
            d.join("m.onnx"),
            &Options { backend: Backend::Cpu, threads: Some(2), cpu: "native".into(), ..Options::default() },
        )
        .unwrap();
        let g = m.optimized_graph().unwrap();
        let has = g.nodes.iter().any(|n| n.domain == "aim" && n.op == "Softmax");
        assert_eq!(has, fused, "{tag}: {}", aim_ir::text::print_graph(g, aim_ir::text::TensorDetail::Summary(4)));
        if fused {
            assert_eq!(g.nodes.len(), 1, "{tag}: one node is left");
        }
        let x = Tensor::from_vec(
            &[1, h as usize, s as usize, s as usize],
            r.values((h * s * s) as usize).iter().map(|v| v * 8.0).collect(),
        );
        check(&format!("softmax-{tag}"), model, vec![("x".into(), x)]);
    }
}

/// Broadcasting binary ops whose small operand repeats along inner, middle or outer dims
/// (per-channel scales, SE gates, in NCHW and in the blocked layout's 5-D shape): the
/// strided fast path against the reference, both operand orders.
#[test]
fn strided_broadcasts_match_reference() {
    let mut r = Rng(21);
    let cases: Vec<([usize; 4], &[usize])> =
        [&[1usize, 3, 1, 1][..], &[2, 1, 4, 1], &[3, 1, 5], &[1, 1, 1, 5], &[2, 3, 1, 1], &[2, 1, 1, 5], &[4, 1]]
            .into_iter()
            .map(|s| ([2usize, 3, 4, 5], s))
            // A blocked layout's per-channel gate: 16 values repeated over more pixels than one
            // tile holds.
            .chain([([1, 3, 30, 16], &[1usize, 3, 1, 16][..]), ([2, 2, 7, 16], &[2, 1, 1, 16])])
            .collect();
    for (big, small) in cases {
        for op in ["Add", "Sub", "Mul", "Div"] {
            for swap in [false, true] {
                let dims = |s: &[usize]| s.iter().map(|&d| Ok(d as i64)).collect::<Vec<_>>();
                let (x, s) = (value("x", 1, &dims(&big)), value("s", 1, &dims(small)));
                let ins = if swap { ["s", "x"] } else { ["x", "s"] };
                let m = model(
                    vec![node(op, "op", &ins, &["y"], vec![])],
                    vec![x, s],
                    vec![value("y", 1, &dims(&big))],
                    vec![],
                    17,
                );
                let n: usize = small.iter().product();
                // Divisors away from zero.
                let sv: Vec<f32> = r.values(n).iter().map(|v| if op == "Div" { 1.5 + v } else { *v }).collect();
                let xv: Vec<f32> =
                    r.values(big.iter().product()).iter().map(|v| if op == "Div" { 1.5 + v } else { *v }).collect();
                let inputs =
                    vec![("x".to_string(), Tensor::from_vec(&big, xv)), ("s".to_string(), Tensor::from_vec(small, sv))];
                check(&format!("{op}-{small:?}-swap{swap}"), m, inputs);
            }
        }
    }
}

/// Elementwise chains whose inputs broadcast run as one loop over rows of the output: two
/// projections broadcast against each other (additive attention), a per-channel scale over
/// maps whose rows exceed one task (the row is split), a bias of lower rank, and a third
/// input of the output's shape (which the loop may overwrite in place); each is one fused
/// node and gives the reference's values under every cap.
#[test]
fn broadcast_loops_match_reference() {
    let mut r = Rng(33);
    type Case<'a> = (&'a [usize], &'a [usize], Option<&'a [usize]>);
    let cases: [Case; 4] = [
        (&[1, 4, 1, 64], &[1, 1, 4, 64], None),
        (&[1, 2, 160, 128], &[1, 2, 1, 1], None),
        (&[3, 5, 70], &[70], None),
        (&[2, 1, 3, 80], &[1, 4, 1, 80], Some(&[2, 4, 3, 80])),
    ];
    for (a, b, c) in cases {
        let out: Vec<usize> = (0..a.len().max(b.len()))
            .map(|i| {
                let at = |s: &[usize]| (i + s.len()).checked_sub(a.len().max(b.len())).map_or(1, |j| s[j]);
                at(a).max(at(b))
            })
            .collect();
        let dims = |s: &[usize]| s.iter().map(|&d| Ok(d as i64)).collect::<Vec<_>>();
        let mut nodes = vec![
            node("Add", "add", &["a", "b"], &["s"], vec![]),
            node("Tanh", "tanh", &["s"], &[if c.is_some() { "t" } else { "y" }], vec![]),
        ];
        let mut ins = vec![value("a", 1, &dims(a)), value("b", 1, &dims(b))];
        let mut inputs = vec![
            ("a".to_string(), Tensor::from_vec(a, r.values(a.iter().product()))),
            ("b".to_string(), Tensor::from_vec(b, r.values(b.iter().product()))),
        ];
        if let Some(c) = c {
            nodes.push(node("Mul", "mul", &["t", "c"], &["y"], vec![]));
            ins.push(value("c", 1, &dims(c)));
            inputs.push(("c".to_string(), Tensor::from_vec(c, r.values(c.iter().product()))));
        }
        let m = model(nodes, ins, vec![value("y", 1, &dims(&out))], vec![], 17);
        let tag = format!("broadcast-{a:?}-{b:?}");
        check(&tag, m.clone(), inputs);
        let loaded = cpu_model(&tag, &m);
        let g = loaded.optimized_graph().unwrap();
        let fused: Vec<_> = g.nodes.iter().filter(|n| n.op == "Elementwise").collect();
        assert_eq!(fused.len(), 1, "{tag}: {:?}", g.nodes);
        assert_eq!(fused[0].inputs.len(), 2 + usize::from(c.is_some()), "{tag}: {:?}", g.nodes);
    }
}

/// An i64 tensor proto.
fn i64s(name: &str, dims: &[i64], v: &[i64]) -> aim_onnx::proto::TensorProto {
    aim_onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

/// Ops the layout pass keeps blocked between convolutions — pointwise activations, a
/// per-channel constant scale and an SE-style gate (GlobalAveragePool → conv → HardSigmoid →
/// Mul), a sum of two branches, a channel Concat, a nearest or linear Resize — over channel
/// counts that fill blocks and that do not, against the reference under every ISA cap.
#[test]
fn random_blocked_regions() {
    let mut r = Rng(123);
    for case in 0..60 {
        let c = r.pick(&[8usize, 16, 20, 32, 40]);
        let (h, w) = (r.pick(&[5usize, 8, 11]), r.pick(&[6usize, 9]));
        let what =
            r.pick(&["act", "scale", "div", "gate", "sum", "concat", "split", "resize_nearest", "resize_linear"]);
        let kv = |k: i64| ints("kernel_shape", &[k, k]);
        let mut inits = vec![
            f32_tensor("W0", &[c as i64, 3, 3, 3], &r.values(c * 27)),
            f32_tensor("B0", &[c as i64], &r.values(c)),
        ];
        let mut nodes = vec![
            node("Conv", "c0", &["x", "W0", "B0"], &["a"], vec![kv(3), ints("pads", &[1; 4])]),
            node("Relu", "r0", &["a"], &["a1"], vec![]),
        ];
        let mut c1 = c;
        let (mut oh, mut ow) = (h, w);
        match what {
            "act" => nodes.push(node(r.pick(&["HardSwish", "Sigmoid", "Tanh", "Neg"]), "op", &["a1"], &["m"], vec![])),
            "scale" | "div" => {
                let v: Vec<f32> = r.values(c).iter().map(|v| 1.5 + v).collect();
                inits.push(f32_tensor("s", &[1, c as i64, 1, 1], &v));
                nodes.push(node(if what == "div" { "Div" } else { "Mul" }, "op", &["a1", "s"], &["m"], vec![]));
            }
            "gate" => {
                inits.push(f32_tensor("Wg", &[c as i64, c as i64, 1, 1], &r.values(c * c)));
                nodes.push(node("GlobalAveragePool", "gap", &["a1"], &["g0"], vec![]));
                nodes.push(node("Conv", "gc", &["g0", "Wg"], &["g1"], vec![kv(1)]));
                nodes.push(node("HardSigmoid", "gs", &["g1"], &["g2"], vec![]));
                nodes.push(node("Mul", "op", &["a1", "g2"], &["m"], vec![]));
            }
            "sum" => {
                inits.push(f32_tensor("Wb", &[c as i64, c as i64, 1, 1], &r.values(c * c)));
                nodes.push(node("Conv", "b", &["a1", "Wb"], &["b1"], vec![kv(1)]));
                nodes.push(node("Sigmoid", "bs", &["b1"], &["b2"], vec![]));
                nodes.push(node("Add", "op", &["a1", "b2"], &["m"], vec![]));
            }
            "split" => {
                // Two halves, then their sum (C/2 channels each).
                let half = c / 2;
                inits.push(i64s("halves", &[2], &[half as i64, (c - half) as i64]));
                let mut sp = node("Split", "op", &["a1", "halves"], &["p0"], vec![int_attr("axis", 1)]);
                sp.output.push("p1".into());
                nodes.push(sp);
                nodes.push(node("Mul", "sum", &["p0", "p1"], &["m"], vec![]));
                c1 = c - half;
            }
            "concat" => {
                let c2 = r.pick(&[8usize, 16, 24]);
                inits.push(f32_tensor("Wb", &[c2 as i64, c as i64, 1, 1], &r.values(c * c2)));
                nodes.push(node("Conv", "b", &["a1", "Wb"], &["b1"], vec![kv(1)]));
                nodes.push(node("Concat", "op", &["a1", "b1"], &["m"], vec![int_attr("axis", 1)]));
                c1 = c + c2;
            }
            _ => {
                let mode = if what == "resize_linear" { "linear" } else { "nearest" };
                inits.push(f32_tensor("sc", &[4], &[1.0, 1.0, 2.0, 2.0]));
                let mode = AttributeProto {
                    name: Some("mode".into()),
                    r#type: Some(AttributeType::String as i32),
                    s: Some(mode.as_bytes().to_vec().into()),
                    ..Default::default()
                };
                nodes.push(node("Resize", "op", &["a1", "", "sc"], &["m"], vec![mode]));
                (oh, ow) = (2 * h, 2 * w);
            }
        }
        inits.push(f32_tensor("W1", &[8, c1 as i64, 1, 1], &r.values(8 * c1)));
        nodes.push(node("Conv", "c1", &["m", "W1"], &["y"], vec![kv(1)]));
        let model = model(
            nodes,
            vec![value("x", 1, &[Ok(1), Ok(3), Ok(h as i64), Ok(w as i64)])],
            vec![value("y", 1, &[Ok(1), Ok(8), Ok(oh as i64), Ok(ow as i64)])],
            inits,
            17,
        );
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[1, 3, h, w], r.values(3 * h * w)))];
        check_all(&format!("region{case}-{what}-c{c}-{h}x{w}"), model, inputs);
    }
}

/// Transposed convolutions with constant weights (`aim:ConvTranspose`: a GEMM and an
/// overlap-add) over strides, kernels, pads, output padding, dilations, groups, a bias and a
/// fused activation, against the reference.
#[test]
fn random_transposed_convolutions() {
    let mut r = Rng(77);
    for case in 0..60 {
        let group = r.pick(&[1usize, 1, 2]);
        let cin = group * r.pick(&[1usize, 3, 8]);
        let mg = r.pick(&[1usize, 4, 5]);
        let (mut k, mut s, mut d) = (r.pick(&[1usize, 2, 3, 4]), r.pick(&[1usize, 2, 3]), r.pick(&[1usize, 1, 2]));
        let mut p = r.pick(&[0usize, 0, 1]).min(k.saturating_sub(1));
        let mut op = r.pick(&[0usize, 0, 1]).min(s.max(d) - 1);
        let (h, mut w) = (r.pick(&[1usize, 4, 7]), r.pick(&[3usize, 6]));
        if case % 4 == 0 {
            // Kernel equal to stride (each output pixel one tap), rows of whole 16-pixel
            // blocks and a tail.
            (k, d, p, op) = (r.pick(&[1usize, 2, 3, 4]), 1, 0, 0);
            s = k;
            w = r.pick(&[16usize, 37]);
        }
        let ek = (k - 1) * d + 1;
        let (oh, ow) = (s * (h - 1) + op + ek - 2 * p, s * (w - 1) + op + ek - 2 * p);
        let act = r.pick(&["none", "Relu", "Sigmoid"]);
        let mut nodes = vec![node(
            "ConvTranspose",
            "up",
            &["x", "W", "B"],
            &["y0"],
            vec![
                ints("kernel_shape", &[k as i64, k as i64]),
                ints("strides", &[s as i64, s as i64]),
                ints("dilations", &[d as i64, d as i64]),
                ints("pads", &[p as i64; 4]),
                ints("output_padding", &[op as i64, op as i64]),
                int_attr("group", group as i64),
            ],
        )];
        match act {
            "none" => nodes.push(node("Identity", "act", &["y0"], &["y"], vec![])),
            a => nodes.push(node(a, "act", &["y0"], &["y"], vec![])),
        }
        let m = group * mg;
        let inits = vec![
            f32_tensor("W", &[cin as i64, mg as i64, k as i64, k as i64], &r.values(cin * mg * k * k)),
            f32_tensor("B", &[m as i64], &r.values(m)),
        ];
        let model = model(
            nodes,
            vec![value("x", 1, &[Ok(2), Ok(cin as i64), Ok(h as i64), Ok(w as i64)])],
            vec![value("y", 1, &[Ok(2), Ok(m as i64), Ok(oh as i64), Ok(ow as i64)])],
            inits,
            17,
        );
        let inputs = vec![("x".to_string(), Tensor::from_vec(&[2, cin, h, w], r.values(2 * cin * h * w)))];
        check_all(
            &format!("deconv{case}-g{group}-c{cin}-m{m}-k{k}-s{s}-d{d}-p{p}-op{op}-{h}x{w}-{act}"),
            model,
            inputs,
        );
    }
}

/// LSTMs on the fast path (projections and recurrence on the packed GEMMs, vector gates):
/// forward, reverse and bidirectional, both layouts, with and without a bias and initial
/// states, against the reference.
#[test]
fn random_lstms() {
    random_recurrent("LSTM", 31);
}

/// GRUs on the fast path, as the LSTMs, with and without `linear_before_reset`.
#[test]
fn random_grus() {
    random_recurrent("GRU", 37);
}

/// Plain RNNs on the fast path, as the LSTMs, with Tanh or Relu.
#[test]
fn random_rnns() {
    random_recurrent("RNN", 41);
}

/// Random `op` nodes (`LSTM`: 4 gates, hidden and cell state; `GRU`: 3 gates, hidden state;
/// `RNN`: 1 gate, hidden state).
fn random_recurrent(op: &str, seed: u64) {
    let (gates, states): (usize, &[&str]) = match op {
        "LSTM" => (4, &["h0", "c0"]),
        "GRU" => (3, &["h0"]),
        _ => (1, &["h0"]),
    };
    let mut r = Rng(seed);
    for case in 0..40 {
        let dir = r.pick(&["forward", "reverse", "bidirectional"]);
        let dirs = if dir == "bidirectional" { 2 } else { 1 };
        let (t, b, i, h) =
            (r.pick(&[1usize, 5, 12]), r.pick(&[1usize, 3]), r.pick(&[4usize, 17]), r.pick(&[8usize, 21]));
        let layout = r.pick(&[0i64, 1]);
        let with_bias = r.pick(&[false, true]);
        let with_state = r.pick(&[false, true]);
        let lbr = r.pick(&[0i64, 1]);
        let s = |name: &str, v: &str| AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::String as i32),
            s: Some(v.as_bytes().to_vec().into()),
            ..Default::default()
        };
        let g = gates * h;
        let mut inits = vec![
            f32_tensor("W", &[dirs as i64, g as i64, i as i64], &r.values(dirs * g * i)),
            f32_tensor("R", &[dirs as i64, g as i64, h as i64], &r.values(dirs * g * h)),
        ];
        let mut ins: Vec<&str> = vec!["x", "W", "R"];
        if with_bias || with_state {
            inits.push(f32_tensor("B", &[dirs as i64, 2 * g as i64], &r.values(dirs * 2 * g)));
            ins.push(if with_bias { "B" } else { "" });
        }
        let mut graph_inputs = vec![value(
            "x",
            1,
            &if layout == 0 {
                [Ok(t as i64), Ok(b as i64), Ok(i as i64)]
            } else {
                [Ok(b as i64), Ok(t as i64), Ok(i as i64)]
            },
        )];
        let x_shape = if layout == 0 { [t, b, i] } else { [b, t, i] };
        let mut inputs = vec![("x".to_string(), Tensor::from_vec(&x_shape, r.values(t * b * i)))];
        if with_state {
            ins.push("");
            ins.extend(states);
            let st = if layout == 0 { [dirs, b, h] } else { [b, dirs, h] };
            for &name in states {
                graph_inputs.push(value(name, 1, &st.map(|d| Ok(d as i64))));
                inputs.push((name.to_string(), Tensor::from_vec(&st, r.values(dirs * b * h))));
            }
        }
        let outs: &[&str] = if op == "LSTM" { &["y", "yh", "yc"] } else { &["y", "yh"] };
        let mut attrs = vec![int_attr("hidden_size", h as i64), int_attr("layout", layout), s("direction", dir)];
        if op == "GRU" {
            attrs.push(int_attr("linear_before_reset", lbr));
        }
        if op == "RNN" && lbr == 1 {
            let act = if dirs == 2 {
                vec![b"Relu".to_vec().into(), b"Tanh".to_vec().into()]
            } else {
                vec![b"Relu".to_vec().into()]
            };
            attrs.push(AttributeProto {
                name: Some("activations".into()),
                r#type: Some(AttributeType::Strings as i32),
                strings: act,
                ..Default::default()
            });
        }
        let mut n = node(op, "rnn", &ins, outs, attrs);
        n.output = outs.iter().map(|o| o.to_string()).collect();
        let y_dims = if layout == 0 { vec![t, dirs, b, h] } else { vec![b, t, dirs, h] };
        let st_dims = if layout == 0 { vec![dirs, b, h] } else { vec![b, dirs, h] };
        let dims = |v: &[usize]| v.iter().map(|&d| Ok(d as i64)).collect::<Vec<_>>();
        let mut out_values = vec![value("y", 1, &dims(&y_dims))];
        out_values.extend(outs[1..].iter().map(|o| value(o, 1, &dims(&st_dims))));
        let model = model(vec![n], graph_inputs, out_values, inits, 17);
        check(
            &format!("{op}{case}-{dir}-t{t}b{b}i{i}h{h}-layout{layout}-bias{with_bias}-state{with_state}-lbr{lbr}"),
            model,
            inputs,
        );
    }
}

/// Every unary activation of the ONNX schema, scalar Max/Min, Clip with bounds computed at
/// run time, and a standalone BatchNormalization: alone in NCHW, and between two
/// convolutions (where the layout pass keeps them blocked). Each must match the reference
/// backend under every ISA cap and leave no node on a reference kernel — an op that falls
/// back is what made real models (paddle2onnx's HardSwish, tf2onnx's Maximum, a BN after an
/// Add) spend a third of their time in the interpreter.
#[test]
fn activations_leave_no_reference_kernel() {
    let mut r = Rng(11);
    let float = |name: &str, v: f32| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v),
        ..Default::default()
    };
    let ops: Vec<(&str, Vec<AttributeProto>)> = vec![
        ("Relu", vec![]),
        ("LeakyRelu", vec![float("alpha", 0.2)]),
        ("HardSigmoid", vec![float("alpha", 0.25), float("beta", 0.4)]),
        ("HardSwish", vec![]),
        ("Sigmoid", vec![]),
        ("Tanh", vec![]),
        ("Elu", vec![float("alpha", 0.7)]),
        ("Selu", vec![]),
        ("Celu", vec![float("alpha", 1.5)]),
        ("Softplus", vec![]),
        ("Softsign", vec![]),
        ("Mish", vec![]),
        ("Swish", vec![]),
        ("Swish", vec![float("alpha", 1.7)]),
        ("ThresholdedRelu", vec![float("alpha", 0.3)]),
        ("Gelu", vec![]),
        ("Erf", vec![]),
        ("Neg", vec![]),
        ("Abs", vec![]),
        ("Floor", vec![]),
        ("Ceil", vec![]),
        ("PRelu", vec![]),
        ("Max", vec![]),
        ("Min", vec![]),
        ("Clip", vec![]),
        ("BatchNormalization", vec![]),
    ];
    let (c, h, w) = (8usize, 6usize, 10usize);
    let shape = [Ok(2), Ok(c as i64), Ok(h as i64), Ok(w as i64)];
    for (op, attrs) in ops {
        for blocked in [false, true] {
            let mut inits = vec![
                f32_tensor("slope", &[], &[0.15]),
                f32_tensor("k", &[], &[-0.2]),
                f32_tensor("s", &[c as i64], &r.values(c)),
                f32_tensor("b", &[c as i64], &r.values(c)),
                f32_tensor("mu", &[c as i64], &r.values(c)),
                f32_tensor("var", &[c as i64], &r.values(c).iter().map(|v| v.abs() + 0.5).collect::<Vec<_>>()),
            ];
            let mut inputs = vec![("x".to_string(), Tensor::from_vec(&[2, c, h, w], r.values(2 * c * h * w)))];
            let mut graph_inputs = vec![value("x", 1, &shape)];
            let mut nodes = Vec::new();
            let mut x = "x".to_string();
            if blocked {
                inits.push(f32_tensor("W1", &[c as i64, c as i64, 3, 3], &r.values(c * c * 9)));
                nodes.push(node("Conv", "conv1", &["x", "W1"], &["c1"], vec![ints("pads", &[1, 1, 1, 1])]));
                x = "c1".into();
            }
            // A BN after an Add (not after a convolution, which would absorb it).
            if op == "BatchNormalization" {
                nodes.push(node("Add", "add", &[&x, "x"], &["sum"], vec![]));
                x = "sum".into();
            }
            let mut ins = vec![x.as_str()];
            match op {
                "PRelu" => ins.push("slope"),
                "Max" | "Min" => ins.push("k"),
                "BatchNormalization" => ins.extend(["s", "b", "mu", "var"]),
                "Clip" => {
                    ins.extend(["lo", "hi"]);
                    for (name, v) in [("lo", -0.3f32), ("hi", 0.45)] {
                        graph_inputs.push(value(name, 1, &[]));
                        inputs.push((name.into(), Tensor::from_vec(&[], vec![v])));
                    }
                }
                _ => {}
            }
            let act = if blocked { "act" } else { "y" };
            nodes.push(node(op, "op", &ins, &[act], attrs.clone()));
            if blocked {
                inits.push(f32_tensor("W2", &[c as i64, c as i64, 1, 1], &r.values(c * c)));
                nodes.push(node("Conv", "conv2", &["act", "W2"], &["y"], vec![]));
            }
            let tag = format!("{op}-{}", if blocked { "blocked" } else { "nchw" });
            let m = model(nodes, graph_inputs, vec![value("y", 1, &shape)], inits, 18);
            check(&tag, m.clone(), inputs.clone());
            let model = cpu_model(&format!("kinds-{tag}"), &m);
            model.run(inputs).unwrap();
            let (_, kinds) = model.node_kinds().unwrap();
            let reference: Vec<&String> =
                kinds.iter().filter(|(_, k)| *k == aim_runtime::cpu::NodeKind::Reference).map(|(n, _)| n).collect();
            assert!(reference.is_empty(), "{tag}: nodes on reference kernels: {reference:?}");
        }
    }
}

/// k×1 convolutions over one-column images (1-D convolutions exported as 2-D, as tf2onnx
/// writes them), which the direct kernel runs as 1×k ones over the row the same bytes are:
/// every stride, padding and dilation along the column, against the reference.
#[test]
fn column_convolutions_match_reference() {
    let mut r = Rng(5);
    for (c, m, k, s, p, d) in
        [(16, 32, 5, 1, 0, 1), (20, 24, 3, 2, 1, 1), (8, 16, 5, 1, 2, 2), (32, 48, 1, 1, 0, 1), (3, 16, 7, 3, 3, 1)]
    {
        let h = 37usize;
        let oh = (h + 2 * p - (k - 1) * d - 1) / s + 1;
        let nodes = vec![
            node(
                "Conv",
                "conv",
                &["x", "W", "B"],
                &["c"],
                vec![
                    ints("kernel_shape", &[k as i64, 1]),
                    ints("strides", &[s as i64, 1]),
                    ints("dilations", &[d as i64, 1]),
                    ints("pads", &[p as i64, 0, p as i64, 0]),
                ],
            ),
            node("Relu", "act", &["c"], &["y"], vec![]),
        ];
        let inits = vec![
            f32_tensor("W", &[m as i64, c as i64, k as i64, 1], &r.values(m * c * k)),
            f32_tensor("B", &[m as i64], &r.values(m)),
        ];
        let model = model(
            nodes,
            vec![value("x", 1, &[Ok(2), Ok(c as i64), Ok(h as i64), Ok(1)])],
            vec![value("y", 1, &[Ok(2), Ok(m as i64), Ok(oh as i64), Ok(1)])],
            inits,
            17,
        );
        check_all(
            &format!("column-c{c}m{m}k{k}s{s}p{p}d{d}"),
            model,
            vec![("x".into(), Tensor::from_vec(&[2, c, h, 1], r.values(2 * c * h)))],
        );
    }
}

/// One convolution of the convolution tests: `rank` (3: 1-D, 4: 2-D), batch, input and
/// output channels, kernel, stride, padding and dilation (the same along every spatial
/// dim), groups, input length per spatial dim, whether a residual is added, and the
/// activation that follows.
#[derive(Clone, Copy)]
struct ConvCase {
    rank: usize,
    nb: usize,
    c: usize,
    m: usize,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
    group: usize,
    len: usize,
    residual: bool,
    act: &'static str,
}

impl ConvCase {
    /// A name for failure messages and temporary folders.
    fn tag(&self, what: &str) -> String {
        let ConvCase { rank, nb, c, m, k, s, p, d, group, residual, .. } = *self;
        format!("{what}-r{rank}n{nb}c{c}m{m}k{k}s{s}p{p}d{d}g{group}res{residual}")
    }

    /// The model (Conv with a bias, the residual Add, the activation) and random inputs.
    fn model(&self, r: &mut Rng) -> (Vec<u8>, Vec<(String, Tensor)>) {
        let ConvCase { rank, nb, c, m, k, s, p, d, group, len, residual, act } = *self;
        let sp = rank - 2;
        let o = (len + 2 * p - d * (k - 1) - 1) / s + 1;
        let dims_in: Vec<usize> = [nb, c].into_iter().chain(std::iter::repeat_n(len, sp)).collect();
        let dims_out: Vec<usize> = [nb, m].into_iter().chain(std::iter::repeat_n(o, sp)).collect();
        let kern: Vec<i64> = vec![k as i64; sp];
        let wdims: Vec<i64> = [m as i64, (c / group) as i64].into_iter().chain(kern.clone()).collect();
        let mut nodes = vec![node(
            "Conv",
            "conv",
            &["x", "W", "B"],
            &["c"],
            vec![
                ints("kernel_shape", &kern),
                ints("strides", &vec![s as i64; sp]),
                ints("pads", &vec![p as i64; 2 * sp]),
                ints("dilations", &vec![d as i64; sp]),
                int_attr("group", group as i64),
            ],
        )];
        let as_dims = |d: &[usize]| d.iter().map(|&v| Ok(v as i64)).collect::<Vec<_>>();
        let mut graph_inputs = vec![value("x", 1, &as_dims(&dims_in))];
        let mut inputs = vec![("x".to_string(), Tensor::from_vec(&dims_in, r.values(dims_in.iter().product())))];
        let mut last = "c";
        if residual {
            nodes.push(node("Add", "res", &["c", "skip"], &["sum"], vec![]));
            graph_inputs.push(value("skip", 1, &as_dims(&dims_out)));
            inputs.push(("skip".into(), Tensor::from_vec(&dims_out, r.values(dims_out.iter().product()))));
            last = "sum";
        }
        nodes.push(node(act, "act", &[last], &["y"], vec![]));
        let wn = m * (c / group) * k.pow(sp as u32);
        let inits = vec![f32_tensor("W", &wdims, &r.values(wn)), f32_tensor("B", &[m as i64], &r.values(m))];
        (model(nodes, graph_inputs, vec![value("y", 1, &as_dims(&dims_out))], inits, 17), inputs)
    }

    /// The kernel the compiler records for the convolution.
    fn kernel(&self, tag: &str, bytes: &[u8]) -> String {
        let loaded = cpu_model(tag, bytes);
        let g = loaded.optimized_graph().unwrap();
        g.nodes.iter().find(|n| n.op == "Conv").expect("a convolution").string("kernel", "").to_string()
    }
}

/// Convolutions over a batch of images with few output positions each (1-D convolutions
/// over a batch of short frames, as speech models run them), which run as one GEMM over the
/// batch: 1-D and 2-D, grouped, strided, with a fused residual and activation.
#[test]
fn batched_short_convolutions_match_reference() {
    let mut r = Rng(9);
    for (rank, c, m, k, s, p, group, residual) in [
        (3usize, 1usize, 24usize, 8usize, 4usize, 0usize, 1usize, false),
        (3, 16, 8, 3, 1, 1, 1, true),
        (3, 12, 12, 3, 2, 1, 2, false),
        (4, 8, 16, 3, 1, 1, 1, true),
    ] {
        let case = ConvCase { rank, nb: 6, c, m, k, s, p, d: 1, group, len: 9, residual, act: "Relu" };
        let (bytes, inputs) = case.model(&mut r);
        check(&case.tag("batched"), bytes, inputs);
    }
}

/// A node whose fast kernel declines it at run time (here a dilated MaxPool, which the fast
/// pool does not take) runs on the reference kernel, and `node_kinds` says so after the run
/// instead of counting it as a fast kernel: the census `aim info` and the corpus benchmark
/// print must not hide a fallback.
#[test]
fn declined_fast_kernels_count_as_reference() {
    let mut r = Rng(13);
    let nodes =
        vec![node("MaxPool", "pool", &["x"], &["y"], vec![ints("kernel_shape", &[2, 2]), ints("dilations", &[2, 2])])];
    let m = model(
        nodes,
        vec![value("x", 1, &[Ok(1), Ok(3), Ok(8), Ok(8)])],
        vec![value("y", 1, &[Ok(1), Ok(3), Ok(6), Ok(6)])],
        vec![],
        17,
    );
    let pool = cpu_model("declined", &m);
    let kind = |model: &Model| model.node_kinds().unwrap().1.into_iter().find(|(n, _)| n == "pool").unwrap().1;
    assert_eq!(kind(&pool), aim_runtime::cpu::NodeKind::Fast, "before a run the op's fast kernel is assumed");
    pool.run(vec![("x".into(), Tensor::from_vec(&[1, 3, 8, 8], r.values(192)))]).unwrap();
    assert_eq!(kind(&pool), aim_runtime::cpu::NodeKind::Reference);
    // A strided Slice (the Focus layer's) is one the fast kernel takes: still fast after a run.
    let nodes = vec![node("Slice", "pool", &["x", "st", "en", "ax", "two"], &["y"], vec![])];
    let inits = vec![
        i64_tensor("st", &[1, 0]),
        i64_tensor("en", &[8, 8]),
        i64_tensor("ax", &[2, 3]),
        i64_tensor("two", &[2, 2]),
    ];
    let m = model(
        nodes,
        vec![value("x", 1, &[Ok(1), Ok(3), Ok(8), Ok(8)])],
        vec![value("y", 1, &[Ok(1), Ok(3), Ok(4), Ok(4)])],
        inits,
        17,
    );
    let slice = cpu_model("declined-slice", &m);
    slice.run(vec![("x".into(), Tensor::from_vec(&[1, 3, 8, 8], r.values(192)))]).unwrap();
    assert_eq!(kind(&slice), aim_runtime::cpu::NodeKind::Fast);
}

/// A decoder's tied output projection, `MatMul(h, Transpose(E))` with `E` the token
/// embedding table that a Gather also reads: the dense kernel packs `E`'s bytes as a
/// transposed weight, so no Transpose is left to run (nor a transposed copy of the table
/// held), and the logits match the reference.
#[test]
fn tied_embedding_projection_packs_the_table_in_place() {
    let mut r = Rng(13);
    let (vocab, dim, seq) = (37usize, 24usize, 5usize);
    let nodes = vec![
        node("Gather", "embed", &["E", "ids"], &["h0"], vec![]),
        node("Tanh", "mix", &["h0"], &["h"], vec![]),
        node("Transpose", "tied", &["E"], &["Et"], vec![ints("perm", &[1, 0])]),
        node("MatMul", "lm_head", &["h", "Et"], &["logits"], vec![]),
    ];
    let m = model(
        nodes,
        vec![value("ids", 7, &[Ok(seq as i64)])],
        vec![value("logits", 1, &[Ok(seq as i64), Ok(vocab as i64)])],
        vec![f32_tensor("E", &[vocab as i64, dim as i64], &r.values(vocab * dim))],
        17,
    );
    let ids = Tensor::from_vec(&[seq], vec![3i64, 0, 36, 17, 3]);
    check_all("tied-embedding", m.clone(), vec![("ids".into(), ids)]);
    let model = cpu_model("tied-embedding-graph", &m);
    let g = model.optimized_graph().unwrap();
    let ops: Vec<String> = g.nodes.iter().map(|n| format!("{}:{}", n.domain, n.op)).collect();
    assert!(!ops.iter().any(|o| o.ends_with(":Transpose")), "a transpose is left: {ops:?}");
    let dense = g.nodes.iter().find(|n| n.op == "Dense").unwrap_or_else(|| panic!("no dense layer: {ops:?}"));
    assert_eq!(dense.int("trans_b", 0), 1);
    assert!(dense.strings("sources").is_some_and(|s| s.iter().any(|s| s == "tied")), "{dense:?}");
    assert_eq!(g.initializers.len(), 1, "one copy of the table: {:?}", g.initializers.keys().collect::<Vec<_>>());
}

/// Convolutions with a handful of output positions (a speech model's 1-D convolutions over
/// one short frame, an STFT's strided frames) run with the positions as GEMM rows
/// (`gemm_by_position`, which the compiler records; 1-D undilated ones gather their windows
/// channels last): batch 1 and 2, strided, dilated, padded, with a fused residual and
/// activation, against the reference; 2-D ones over tiny maps (blocked, on the direct
/// kernel) alongside.
#[test]
fn few_position_convolutions_match_reference() {
    let mut r = Rng(17);
    // (rank, batch, in channels, out channels, kernel, stride, pad, dilation, len, residual)
    for (rank, nb, c, m, k, s, p, d, len, residual) in [
        (3usize, 1usize, 1usize, 40usize, 16usize, 8usize, 0usize, 1usize, 40usize, false),
        // A strided STFT frame: its 17 positions fill tiles no better as rows than as
        // columns, but as columns they are gathered value by value.
        (3, 1, 1, 66, 64, 20, 0, 1, 400, false),
        // Four frames of 48 positions: windows gathered and results scattered on both
        // threads (each image, each range of channels to one of them).
        (3, 4, 48, 48, 3, 1, 1, 1, 48, true),
        (3, 1, 33, 24, 3, 1, 1, 1, 4, true),
        (3, 2, 20, 16, 3, 2, 1, 1, 8, false),
        (3, 1, 7, 24, 3, 1, 2, 2, 5, true),
        (3, 4, 10, 8, 3, 2, 1, 1, 4, true),
        (4, 1, 5, 12, 3, 1, 1, 1, 4, true),
        (4, 2, 3, 8, 2, 2, 0, 1, 5, false),
    ] {
        let case = ConvCase { rank, nb, c, m, k, s, p, d, group: 1, len, residual, act: "Tanh" };
        let (bytes, inputs) = case.model(&mut r);
        let tag = case.tag("few");
        check(&tag, bytes.clone(), inputs);
        if rank == 3 {
            assert_eq!(case.kernel(&tag, &bytes), "gemm_by_position", "{tag}");
        }
    }
}

/// A convolution whose input shape the compiler cannot know (reshaped by a shape computed
/// at run time, as inside a speech model's `If`) chooses its kernel per run: few positions
/// take the positions-as-rows GEMM (its weights packed on first use), many the other; both
/// against the reference, in either order.
#[test]
fn convolutions_of_unknown_shape_choose_their_kernel_per_run() {
    let mut r = Rng(19);
    let (c, m, k) = (6usize, 40usize, 3usize);
    let nodes = vec![
        node("Reshape", "shape", &["flat", "dims"], &["x"], vec![]),
        node("Conv", "conv", &["x", "W", "B"], &["c"], vec![ints("kernel_shape", &[k as i64]), ints("pads", &[1, 1])]),
        node("Relu", "act", &["c"], &["y"], vec![]),
    ];
    let model = model(
        nodes,
        vec![value("flat", 1, &[Err("n")]), value("dims", 7, &[Ok(3)])],
        vec![value("y", 1, &[Err("b"), Ok(m as i64), Err("l")])],
        vec![
            f32_tensor("W", &[m as i64, c as i64, k as i64], &r.values(m * c * k)),
            f32_tensor("B", &[m as i64], &r.values(m)),
        ],
        17,
    );
    let d = tempdir("unknown-shape-conv");
    std::fs::write(d.join("m.onnx"), &model).unwrap();
    let reference = Model::load_with(d.join("m.onnx"), Backend::Reference).unwrap();
    for cpu in caps() {
        let opts = Options { backend: Backend::Cpu, threads: Some(2), cpu: cpu.into(), ..Options::default() };
        let loaded = Model::load_with_options(d.join("m.onnx"), &opts).unwrap();
        for (nb, len) in [(1usize, 4usize), (2, 300), (3, 2), (1, 4)] {
            let flat = Tensor::from_vec(&[nb * c * len], r.values(nb * c * len));
            let dims = Tensor::from_vec(&[3], vec![nb as i64, c as i64, len as i64]);
            let inputs = vec![("flat".to_string(), flat), ("dims".to_string(), dims)];
            let want = reference.run(inputs.clone()).unwrap();
            let got: Vec<Tensor> = loaded.run(inputs).unwrap().into_iter().map(|(_, t)| t).collect();
            compare(&format!("unknown-shape [{cpu}] n{nb} l{len}"), &got, &want);
        }
    }
}

/// 1-D depthwise convolutions (one filter per channel, as speech models' separable blocks
/// write them) run on the depthwise kernel, strided, dilated and padded, with a residual.
#[test]
fn depthwise_1d_convolutions_match_reference() {
    let mut r = Rng(23);
    for (c, k, s, p, d, len, residual) in [
        (16usize, 5usize, 1usize, 2usize, 1usize, 40usize, false),
        (9, 3, 2, 1, 1, 17, false),
        (8, 3, 1, 2, 2, 12, true),
    ] {
        let case = ConvCase { rank: 3, nb: 2, c, m: c, k, s, p, d, group: c, len, residual, act: "Relu" };
        let (bytes, inputs) = case.model(&mut r);
        let tag = case.tag("dw1d");
        check(&tag, bytes.clone(), inputs);
        assert_eq!(case.kernel(&tag, &bytes), "depthwise", "{tag}");
    }
}

/// A HardSwish written out as `x · Clip(x + 3, 0, 6) / 6` (as paddle2onnx exports it)
/// between convolutions whose channel count is not a whole number of blocks stays in the
/// blocked layout: dividing the padding lanes' zeros by a nonzero constant keeps them zero,
/// so no conversion to NCHW and back surrounds it.
#[test]
fn hardswish_by_division_stays_blocked() {
    let mut r = Rng(29);
    let c = 88usize;
    let nodes = vec![
        node("Conv", "c1", &["x", "W1"], &["a"], vec![ints("kernel_shape", &[1, 1])]),
        node("Add", "plus3", &["a", "three"], &["b"], vec![]),
        node("Clip", "clip", &["b", "zero", "six"], &["d"], vec![]),
        node("Mul", "mul", &["a", "d"], &["e"], vec![]),
        node("Div", "div", &["e", "six"], &["f"], vec![]),
        node("Conv", "c2", &["f", "W2"], &["y"], vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])]),
    ];
    let inits = vec![
        f32_tensor("W1", &[c as i64, 8, 1, 1], &r.values(c * 8)),
        f32_tensor("W2", &[c as i64, c as i64, 3, 3], &r.values(c * c * 9).iter().map(|v| v * 0.1).collect::<Vec<_>>()),
        f32_tensor("three", &[], &[3.0]),
        f32_tensor("zero", &[], &[0.0]),
        f32_tensor("six", &[], &[6.0]),
    ];
    let m = model(
        nodes,
        vec![value("x", 1, &[Ok(1), Ok(8), Ok(6), Ok(10)])],
        vec![value("y", 1, &[Ok(1), Ok(c as i64), Ok(6), Ok(10)])],
        inits,
        17,
    );
    let x = Tensor::from_vec(&[1, 8, 6, 10], r.values(8 * 60));
    check("hardswish-div", m.clone(), vec![("x".into(), x)]);
    let model = cpu_model("hardswish-div-graph", &m);
    let ops: Vec<String> = model.optimized_graph().unwrap().nodes.iter().map(|n| n.op.clone()).collect();
    // Between the two convolutions nothing goes back to NCHW (the input may be blocked by
    // a reorder or read directly by the first convolution, as the ISA's block size decides).
    let first = ops.iter().position(|o| o == "Conv").expect("a convolution");
    let last = ops.iter().rposition(|o| o == "Conv").expect("a convolution");
    let between = &ops[first..last];
    assert!(!between.iter().any(|o| o == "FromBlocked" || o == "ToBlocked"), "layout conversions: {ops:?}");
}

/// PP-LCNet's block as paddle2onnx writes it: a convolution, a learnable scalar affine
/// (`· k + b`) and a HardSwish written out as `x · Clip(x + 3, 0, 6) / 6`. The affine folds
/// into the convolution's weights and bias, the HardSwish into its epilogue: one node, and
/// the same numbers as the reference.
#[test]
fn affine_and_written_out_hardswish_fold_into_the_convolution() {
    let mut r = Rng(31);
    let c = 24usize;
    let nodes = vec![
        node(
            "Conv",
            "conv",
            &["x", "W", "B"],
            &["a"],
            vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
        ),
        node("Mul", "scale", &["a", "k"], &["b"], vec![]),
        node("Add", "shift", &["b", "s"], &["h"], vec![]),
        node("Add", "plus3", &["h", "three"], &["p"], vec![]),
        node("Clip", "clip", &["p", "zero", "six"], &["q"], vec![]),
        node("Mul", "gate", &["h", "q"], &["t"], vec![]),
        node("Div", "sixth", &["t", "six"], &["y"], vec![]),
    ];
    let inits = vec![
        f32_tensor("W", &[c as i64, 8, 3, 3], &r.values(c * 8 * 9)),
        f32_tensor("B", &[c as i64], &r.values(c)),
        f32_tensor("k", &[1], &[1.7]),
        f32_tensor("s", &[1], &[0.3]),
        f32_tensor("three", &[], &[3.0]),
        f32_tensor("zero", &[], &[0.0]),
        f32_tensor("six", &[], &[6.0]),
    ];
    let m = model(
        nodes,
        vec![value("x", 1, &[Ok(1), Ok(8), Ok(7), Ok(9)])],
        vec![value("y", 1, &[Ok(1), Ok(c as i64), Ok(7), Ok(9)])],
        inits,
        17,
    );
    let x = Tensor::from_vec(&[1, 8, 7, 9], r.values(8 * 63).iter().map(|v| v * 2.0).collect());
    check("affine-hardswish", m.clone(), vec![("x".into(), x)]);
    let model = cpu_model("affine-hardswish-graph", &m);
    let g = model.optimized_graph().unwrap();
    let convs: Vec<&aim_ir::Node> = g.nodes.iter().filter(|n| n.op == "Conv").collect();
    // Layout reorders at the graph's edges aside.
    let others: Vec<&str> = g
        .nodes
        .iter()
        .filter(|n| !matches!(n.op.as_str(), "Conv" | "FromBlocked" | "ToBlocked"))
        .map(|n| n.op.as_str())
        .collect();
    assert_eq!(convs.len(), 1);
    assert_eq!(convs[0].string("activation", ""), "hardswish", "{:?}", convs[0]);
    assert!(others.is_empty(), "left unfused: {others:?}");
}

/// A dense layer followed by a constant scale (per output feature, or one value) and a
/// scalar shift folds them into its weights and bias, stored `[K, N]` (MatMul) or
/// transposed (Gemm with transB), against the reference.
#[test]
fn dense_scale_and_shift_fold_into_the_weights() {
    let mut r = Rng(37);
    let (m, k, n) = (5usize, 12usize, 20usize);
    for gemm in [false, true] {
        let (first, w) = if gemm {
            (
                node("Gemm", "fc", &["x", "W"], &["a"], vec![int_attr("transB", 1)]),
                f32_tensor("W", &[n as i64, k as i64], &r.values(n * k)),
            )
        } else {
            (
                node("MatMul", "fc", &["x", "W"], &["a"], vec![]),
                f32_tensor("W", &[k as i64, n as i64], &r.values(n * k)),
            )
        };
        let nodes = vec![
            first,
            node("Mul", "scale", &["a", "sc"], &["b"], vec![]),
            node("Add", "shift", &["b", "sh"], &["c"], vec![]),
            node("Relu", "act", &["c"], &["y"], vec![]),
        ];
        let scale = if gemm { f32_tensor("sc", &[], &[0.6]) } else { f32_tensor("sc", &[n as i64], &r.values(n)) };
        let model_bytes = model(
            nodes,
            vec![value("x", 1, &[Ok(m as i64), Ok(k as i64)])],
            vec![value("y", 1, &[Ok(m as i64), Ok(n as i64)])],
            vec![w, scale, f32_tensor("sh", &[1], &[0.25])],
            17,
        );
        let tag = format!("dense-affine-gemm{gemm}");
        check(&tag, model_bytes.clone(), vec![("x".into(), Tensor::from_vec(&[m, k], r.values(m * k)))]);
        let loaded = cpu_model(&tag, &model_bytes);
        let ops: Vec<String> = loaded.optimized_graph().unwrap().nodes.iter().map(|n| n.op.clone()).collect();
        assert_eq!(ops, ["Dense"], "{tag}");
    }
}

/// Byte tensors moved and dequantized at run time (an int8 embedding's rows transposed
/// for an LSTM, as quantize_dynamic leaves them): Transpose of 1-, 2- and 8-byte elements
/// and DequantizeLinear run on fast kernels and match the reference.
#[test]
fn byte_transposes_and_dequantization_run_fast() {
    let mut r = Rng(41);
    for (elem, qtype) in [(3, 2), (5, 3)] {
        // elem: a Cast target of 1 or 2 bytes (i8, i16; then i64, 8 bytes); qtype: u8 or i8.
        let zp = aim_onnx::proto::TensorProto {
            name: Some("zp".into()),
            data_type: Some(qtype),
            dims: vec![],
            raw_data: Some(vec![if qtype == 2 { 128u8 } else { 0 }].into()),
            ..Default::default()
        };
        let nodes = vec![
            node("QuantizeLinear", "q", &["x", "s", "zp"], &["xq"], vec![]),
            node("Transpose", "t", &["xq"], &["tq"], vec![ints("perm", &[1, 0, 2])]),
            node("DequantizeLinear", "dq", &["tq", "s", "zp"], &["d"], vec![]),
            node("Cast", "wide", &["tq"], &["w"], vec![int_attr("to", elem)]),
            node("Transpose", "t2", &["w"], &["w2"], vec![ints("perm", &[2, 1, 0])]),
            node("Cast", "long", &["w2"], &["l"], vec![int_attr("to", 7)]),
            node("Transpose", "t3", &["l"], &["l2"], vec![ints("perm", &[2, 1, 0])]),
            node("Cast", "back", &["l2"], &["f"], vec![int_attr("to", 1)]),
            node("Add", "sum", &["d", "f"], &["y"], vec![]),
        ];
        let m = model(
            nodes,
            vec![value("x", 1, &[Ok(4), Ok(6), Ok(10)])],
            vec![value("y", 1, &[Ok(6), Ok(4), Ok(10)])],
            vec![f32_tensor("s", &[], &[0.02]), zp],
            17,
        );
        let x = Tensor::from_vec(&[4, 6, 10], r.values(240));
        let tag = format!("byte-moves-{elem}-{qtype}");
        check(&tag, m.clone(), vec![("x".into(), x.clone())]);
        let loaded = cpu_model(&tag, &m);
        loaded.run(vec![("x".into(), x)]).unwrap();
        let (_, kinds) = loaded.node_kinds().unwrap();
        for name in ["t", "dq", "t2", "t3"] {
            let kind = kinds.iter().find(|(n, _)| n == name).map(|(_, k)| *k);
            assert_ne!(kind, Some(aim_runtime::cpu::NodeKind::Reference), "{tag}: {name} on the reference kernel");
        }
    }
}

/// ONNX Runtime's `DynamicQuantizeLSTM` (8-bit W and R, scales per direction or per gate
/// column, zero points): the fast LSTM rounds X and each step's hidden state to u8 and
/// sums whole numbers, as the reference does in f64, on every ISA, and runs no node on a
/// reference kernel. (Against ORT itself: `ms_dynamic_lstm` in tests/run.sh.)
#[test]
fn dynamic_quantize_lstms_match_reference() {
    let mut r = Rng(43);
    let bytes = |name: &str, dtype: i32, dims: &[i64], v: Vec<u8>| aim_onnx::proto::TensorProto {
        name: Some(name.into()),
        data_type: Some(dtype),
        dims: dims.to_vec(),
        raw_data: Some(v.into()),
        ..Default::default()
    };
    for case in 0..12 {
        let dir = r.pick(&["forward", "reverse", "bidirectional"]);
        let dirs = if dir == "bidirectional" { 2 } else { 1 };
        let (t, b, i, h) = (r.pick(&[1usize, 7]), r.pick(&[1usize, 3]), r.pick(&[5usize, 24]), r.pick(&[8usize, 19]));
        let per_column = r.pick(&[false, true]);
        let unsigned = r.pick(&[false, true]);
        let g = 4 * h;
        // s8 weights with zero zero points, or u8 around nonzero ones.
        let (dtype, weight, zero): (i32, fn(f32) -> u8, u8) =
            if unsigned { (2, |v| (v * 120.0 + 128.0) as u8, 128) } else { (3, |v| ((v * 120.0) as i8) as u8, 0) };
        let scales = if per_column { dirs * g } else { dirs };
        let sdims: Vec<i64> = if per_column { vec![dirs as i64, g as i64] } else { vec![dirs as i64] };
        let mut inits = vec![
            bytes(
                "W",
                dtype,
                &[dirs as i64, i as i64, g as i64],
                r.values(dirs * i * g).iter().map(|&v| weight(v)).collect(),
            ),
            bytes(
                "R",
                dtype,
                &[dirs as i64, h as i64, g as i64],
                r.values(dirs * h * g).iter().map(|&v| weight(v)).collect(),
            ),
            f32_tensor("B", &[dirs as i64, 2 * g as i64], &r.values(dirs * 2 * g)),
        ];
        for w in ["W", "R"] {
            let s: Vec<f32> = r.values(scales).iter().map(|v| 0.004 + 0.002 * v.abs()).collect();
            inits.push(f32_tensor(&format!("{w}s"), &sdims, &s));
            inits.push(bytes(&format!("{w}z"), dtype, &sdims, vec![zero; scales]));
        }
        let x = Tensor::from_vec(&[t, b, i], r.values(t * b * i));
        let h0 = Tensor::from_vec(&[dirs, b, h], r.values(dirs * b * h));
        let mut n = node(
            "DynamicQuantizeLSTM",
            "qlstm",
            &["x", "W", "R", "B", "", "h0", "", "", "Ws", "Wz", "Rs", "Rz"],
            &["y", "yh", "yc"],
            vec![int_attr("hidden_size", h as i64), string_attr("direction", dir)],
        );
        n.domain = Some("com.microsoft".into());
        let st = [Ok(dirs as i64), Ok(b as i64), Ok(h as i64)];
        let m = model(
            vec![n],
            vec![value("x", 1, &[Ok(t as i64), Ok(b as i64), Ok(i as i64)]), value("h0", 1, &st)],
            vec![
                value("y", 1, &[Ok(t as i64), Ok(dirs as i64), Ok(b as i64), Ok(h as i64)]),
                value("yh", 1, &st),
                value("yc", 1, &st),
            ],
            inits,
            17,
        );
        let tag = format!("qlstm{case}-{dir}-t{t}b{b}i{i}h{h}-col{per_column}-u8{unsigned}");
        let inputs = vec![("x".to_string(), x), ("h0".to_string(), h0)];
        check(&tag, m.clone(), inputs.clone());
        let loaded = cpu_model(&tag, &m);
        loaded.run(inputs).unwrap();
        let (_, kinds) = loaded.node_kinds().unwrap();
        assert!(!kinds.iter().any(|(_, k)| *k == aim_runtime::cpu::NodeKind::Reference), "{tag}: {kinds:?}");
    }
}

/// Layer normalization written out as PyTorch exports it before opset 17 and paddle2onnx
/// writes it (ReduceMean, Sub, Pow, ReduceMean, Add ε, Sqrt, Div, Mul γ, Add β) runs as one
/// `LayerNormalization` node, over a symbolic batch and with a static one, and matches the
/// reference computing the nine nodes; `d · d` squares as well as `Pow(d, 2)`.
#[test]
fn written_out_layer_norms_run_as_one() {
    let mut r = Rng(23);
    let (t, c) = (7usize, 24usize);
    for (square, batch) in [("Pow", Err("n")), ("Mul", Ok(3i64))] {
        let sq = if square == "Pow" {
            node("Pow", "sq", &["d", "two"], &["d2"], vec![])
        } else {
            node("Mul", "sq", &["d", "d"], &["d2"], vec![])
        };
        let nodes = vec![
            node("ReduceMean", "mean", &["x"], &["mu"], vec![ints("axes", &[-1])]),
            node("Sub", "centre", &["x", "mu"], &["d"], vec![]),
            sq,
            node("ReduceMean", "var", &["d2"], &["v"], vec![ints("axes", &[-1])]),
            node("Add", "eps", &["v", "e"], &["ve"], vec![]),
            node("Sqrt", "sd", &["ve"], &["s"], vec![]),
            node("Div", "norm", &["d", "s"], &["n"], vec![]),
            node("Mul", "gamma", &["n", "g"], &["ng"], vec![]),
            node("Add", "beta", &["ng", "b"], &["y"], vec![]),
        ];
        let m = model(
            nodes,
            vec![value("x", 1, &[batch, Ok(t as i64), Ok(c as i64)])],
            vec![value("y", 1, &[batch, Ok(t as i64), Ok(c as i64)])],
            vec![
                f32_tensor("two", &[], &[2.0]),
                f32_tensor("e", &[], &[1e-5]),
                f32_tensor("g", &[c as i64], &r.values(c)),
                f32_tensor("b", &[c as i64], &r.values(c)),
            ],
            13,
        );
        let x: Vec<f32> = r.values(3 * t * c).iter().map(|v| v * 4.0 + 1.5).collect();
        let tag = format!("layer-norm-{square}");
        check(&tag, m.clone(), vec![("x".into(), Tensor::from_vec(&[3, t, c], x))]);
        let loaded = cpu_model(&tag, &m);
        let g = loaded.optimized_graph().unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(ops, ["LayerNormalization"], "{tag}");
    }
}

/// A one-hot encoding times a constant matrix (`jax.nn.one_hot` then a dense layer, as
/// jax2tf exports an embedding) runs as a row lookup, and matches the reference's product
/// for ids inside the encoding and outside it (negative, equal to the depth, far beyond:
/// rows of zeros).
#[test]
fn one_hot_products_run_as_lookups() {
    let mut r = Rng(29);
    let (depth, cols) = (11usize, 6usize);
    let iota: Vec<f32> = (0..depth).map(|v| v as f32).collect();
    let nodes = vec![
        node("Cast", "ids32", &["ids"], &["i"], vec![int_attr("to", 6)]),
        node("Cast", "iota32", &["iota_f"], &["iota"], vec![int_attr("to", 6)]),
        node("Equal", "eq", &["i", "iota"], &["hot"], vec![]),
        node("Cast", "f", &["hot"], &["oh"], vec![int_attr("to", 1)]),
        node("MatMul", "embed", &["oh", "W"], &["e"], vec![]),
        node("Tanh", "act", &["e"], &["y"], vec![]),
    ];
    let m = model(
        nodes,
        vec![value("ids", 7, &[Ok(2), Ok(5), Ok(1)])],
        vec![value("y", 1, &[Ok(2), Ok(5), Ok(cols as i64)])],
        vec![
            f32_tensor("iota_f", &[1, 1, depth as i64], &iota),
            f32_tensor("W", &[depth as i64, cols as i64], &r.values(depth * cols)),
        ],
        17,
    );
    let ids = Tensor::from_vec(&[2, 5, 1], vec![0i64, 10, 3, -1, 11, 7, 7, 1_000_000, 2, 5]);
    check("one-hot", m.clone(), vec![("ids".into(), ids)]);
    let loaded = cpu_model("one-hot-graph", &m);
    let g = loaded.optimized_graph().unwrap();
    assert!(g.nodes.iter().any(|n| n.op == "Gather"), "{:?}", g.nodes.iter().map(|n| &n.op).collect::<Vec<_>>());
    assert!(!g.nodes.iter().any(|n| n.op == "Dense" || n.op == "MatMul" || n.op == "Equal"));
}

/// Elementwise ops after a layer's activation that the activation table does not hold (a
/// learnt scale and shift after HardSwish, `max(x, -0.4)` after LeakyRelu) run inside the
/// layer's epilogue as its `post` program, and match the reference: blocked convolutions
/// (direct, depthwise, Winograd, 1×1), NCHW 1-D ones, dense layers; with a residual too
/// (compared only: the residual may join the program instead).
#[test]
fn programs_after_layers_run_in_their_epilogues() {
    let mut r = Rng(31);
    let alpha = || AttributeProto {
        name: Some("alpha".into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(0.2),
        ..Default::default()
    };
    // (kind, input channels, output channels, kernel, group)
    let layers: [(&str, usize, usize, usize, usize); 6] = [
        ("conv2d", 8, 24, 3, 1),
        ("conv2d", 16, 16, 3, 16),
        ("conv2d", 32, 32, 3, 1),
        ("conv2d", 12, 40, 1, 1),
        ("conv1d", 6, 20, 5, 1),
        ("dense", 24, 36, 0, 1),
    ];
    for (case, &(kind, c, m, k, group)) in layers.iter().enumerate() {
        for (act, residual) in [("HardSwish", false), ("LeakyRelu", true), ("none", false)] {
            let (xshape, yshape, mut nodes, mut inits): (Vec<usize>, Vec<usize>, Vec<_>, Vec<_>) = match kind {
                "dense" => (
                    vec![5, 7, c],
                    vec![5, 7, m],
                    vec![node("MatMul", "layer", &["x", "W"], &["y0"], vec![])],
                    vec![f32_tensor("W", &[c as i64, m as i64], &r.values(c * m))],
                ),
                "conv1d" => (
                    vec![2, c, 30],
                    vec![2, m, 30],
                    vec![node(
                        "Conv",
                        "layer",
                        &["x", "W", "B"],
                        &["y0"],
                        vec![ints("kernel_shape", &[k as i64]), ints("pads", &[2, 2])],
                    )],
                    vec![
                        f32_tensor("W", &[m as i64, c as i64, k as i64], &r.values(m * c * k)),
                        f32_tensor("B", &[m as i64], &r.values(m)),
                    ],
                ),
                _ => {
                    let p = (k / 2) as i64;
                    (
                        vec![1, c, 14, 13],
                        vec![1, m, 14, 13],
                        vec![node(
                            "Conv",
                            "layer",
                            &["x", "W", "B"],
                            &["y0"],
                            vec![
                                ints("kernel_shape", &[k as i64, k as i64]),
                                ints("pads", &[p; 4]),
                                int_attr("group", group as i64),
                            ],
                        )],
                        vec![
                            f32_tensor(
                                "W",
                                &[m as i64, (c / group) as i64, k as i64, k as i64],
                                &r.values(m * c / group * k * k),
                            ),
                            f32_tensor("B", &[m as i64], &r.values(m)),
                        ],
                    )
                }
            };
            let dims = |s: &[usize]| s.iter().map(|&d| Ok(d as i64)).collect::<Vec<_>>();
            let mut inputs = vec![("x".to_string(), Tensor::from_vec(&xshape, r.values(xshape.iter().product())))];
            let mut graph_inputs = vec![value("x", 1, &dims(&xshape))];
            let mut last = "y0".to_string();
            if residual {
                nodes.push(node("Add", "res", &["skip", &last], &["y1"], vec![]));
                last = "y1".into();
                inputs.push(("skip".into(), Tensor::from_vec(&yshape, r.values(yshape.iter().product()))));
                graph_inputs.push(value("skip", 1, &dims(&yshape)));
            }
            match act {
                "LeakyRelu" => nodes.push(node("LeakyRelu", "act", &[&last], &["a"], vec![alpha()])),
                "HardSwish" => nodes.push(node("HardSwish", "act", &[&last], &["a"], vec![])),
                _ => nodes.push(node("Identity", "act", &[&last], &["a"], vec![])),
            }
            // The program: a scale and shift, then a lower bound.
            inits.extend([
                f32_tensor("scale", &[], &[0.75]),
                f32_tensor("shift", &[], &[-0.125]),
                f32_tensor("floor", &[], &[-0.4]),
            ]);
            nodes.push(node("Mul", "scale", &["a", "scale"], &["s"], vec![]));
            nodes.push(node("Add", "shift", &["s", "shift"], &["t"], vec![]));
            nodes.push(node("Max", "floor", &["t", "floor"], &["y"], vec![]));
            let bytes = model(nodes, graph_inputs, vec![value("y", 1, &dims(&yshape))], inits, 17);
            let tag = format!("post{case}-{kind}-c{c}m{m}k{k}g{group}-{act}-res{residual}");
            check(&tag, bytes.clone(), inputs);
            if residual {
                // The residual is added by the program when the layer does not take it.
                continue;
            }
            let loaded = cpu_model(&tag, &bytes);
            let g = loaded.optimized_graph().unwrap();
            let layer = g.nodes.iter().find(|n| n.domain == "aim" && matches!(n.op.as_str(), "Conv" | "Dense"));
            let layer = layer.unwrap_or_else(|| panic!("{tag}: no layer in {:?}", g.nodes));
            assert!(layer.attrs.contains_key("post"), "{tag}: {:#?}", g.nodes);
            assert!(!g.nodes.iter().any(|n| n.op == "Elementwise"), "{tag}: {:?}", g.nodes);
        }
    }
}

/// A graph output that is a Reshape-like view of a value another step makes is written by
/// that step straight into the output's buffer: the view runs no step (it copied the whole
/// value on every run: a recogniser's 2.9 MiB softmax), chains of views included, and the
/// values are the reference's. An output viewing a graph input, or another output, still
/// gets its own copy.
#[test]
fn outputs_viewed_from_computed_values_are_written_in_place() {
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[2,6]\n  init %s = i64[2] [3, 4]\n  init %t = i64[1] [12]\n  %p = Softmax(%x) {axis=1}  # softmax\n  %y = Reshape(%p, %s)  # reshape\n  %e = Exp(%x)  # exp\n  %f = Flatten(%e) {axis=0}  # flat\n  %z = Reshape(%f, %t)  # chain\n  %w = Reshape(%x, %s)  # of the input\n  %v = Identity(%y)  # of an output\n  output %y: f32[3,4]\n  output %z: f32[12]\n  output %w: f32[3,4]\n  output %v: f32[3,4]\n}\n";
    let bytes = aim_onnx::export_bytes(&aim_ir::text::parse_model(text).unwrap());
    let x: Vec<f32> = (0..12).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
    let inputs = vec![("x".to_string(), Tensor::from_vec(&[2, 6], x))];
    // Against the reference under every ISA cap (and the cuda backend where it lowers).
    check("output views", bytes.clone(), inputs.clone());
    let m = cpu_model("output-views", &bytes);
    let got = m.run(inputs).unwrap();
    assert_eq!(got[0].1.data::<f32>(), got[3].1.data::<f32>(), "the identity of an output is a copy of it");
    let how = m.runs_as().unwrap();
    // Softmax and Exp write the first two outputs; the input's and the output's views copy.
    assert!(how.starts_with("4 typed steps"), "{how}");
}

/// An output whose declared shape the computation contradicts (a stale `[1, N]` on a
/// `[3, 1, 4]` result, as a real OCR export declares it): ONNX Runtime warns and returns the
/// computed tensor, and so does aim — from a planned program, not node by node (the
/// declared shape once left the output without a static type, and the whole model ran
/// unplanned), with the output still written in place through its Reshape.
#[test]
fn a_contradicted_output_shape_still_gets_a_plan() {
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[3,4]\n  init %s = i64[3] [3, 1, 4]\n  %p = Softmax(%x) {axis=1}  # softmax\n  %y = Reshape(%p, %s)  # reshape\n  output %y: f32[1,N]\n}\n";
    let bytes = aim_onnx::export_bytes(&aim_ir::text::parse_model(text).unwrap());
    let x: Vec<f32> = (0..12).map(|i| (i as f32 * 0.9).cos() * 2.0).collect();
    let inputs = vec![("x".to_string(), Tensor::from_vec(&[3, 4], x))];
    let m = cpu_model("contradicted-output", &bytes);
    let got = m.run(inputs.clone()).unwrap();
    assert_eq!(got[0].1.shape(), &[3, 1, 4]);
    let d = tempdir("contradicted-output-reference");
    std::fs::write(d.join("m.onnx"), &bytes).unwrap();
    let want = Model::load_with(d.join("m.onnx"), Backend::Reference).unwrap().run(inputs).unwrap();
    let err = got[0].1.data::<f32>().iter().zip(want[0].1.data::<f32>()).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= 1e-6, "max difference {err}");
    let how = m.runs_as().unwrap();
    assert!(how.starts_with("1 typed steps"), "{how}");
}

/// A dense layer split along its features (a fused query-key-value projection, with a
/// transposed weight as a Gemm with `transB` holds it, and one part nobody reads) runs as
/// one layer per part: the reference's values under every ISA cap.
#[test]
fn split_dense_layers_match_reference() {
    let w: Vec<String> = (0..8 * 12).map(|i| format!("{:.3}", ((i * 29) % 31) as f32 / 31.0 - 0.5)).collect();
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[5,8]\n  init %w = f32[12,8] [{}]\n  init %b = f32[12] [{}]\n  init %s = i64[3] [4, 4, 4]\n  %m = Gemm(%x, %w, %b) {{transB=1}}  # qkv\n  %q, %k, %v = Split(%m, %s) {{axis=1}}  # split\n  %y = Add(%q, %v)  # use\n  output %y: f32[5,4]\n}}\n",
        w.join(", "),
        (0..12).map(|i| format!("{:.2}", i as f32 / 10.0 - 0.6)).collect::<Vec<_>>().join(", ")
    );
    let bytes = aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap());
    let x: Vec<f32> = (0..40).map(|i| (i as f32 * 0.37).sin()).collect();
    check("split dense", bytes.clone(), vec![("x".to_string(), Tensor::from_vec(&[5, 8], x))]);
    let m = cpu_model("split-dense", &bytes);
    let g = m.optimized_graph().unwrap();
    assert!(!g.nodes.iter().any(|n| n.op == "Split"), "{:#?}", g.nodes);
}

/// A residual added after a Reshape of a dense layer's output (GPT-2's blocks) joins the
/// layer through a view of the residual: the reference's values under every ISA cap, and
/// no Add left.
#[test]
fn residuals_after_a_reshape_join_the_layer() {
    let w: Vec<String> = (0..8 * 6).map(|i| format!("{:.3}", ((i * 17) % 13) as f32 / 13.0 - 0.5)).collect();
    let text = format!(
        "opset 17\ngraph \"g\" {{\n  input %x: f32[4,8]\n  input %r: f32[2,2,6]\n  init %w = f32[8,6] [{}]\n  init %b = f32[6] [0.1, -0.2, 0.3, -0.4, 0.5, -0.6]\n  init %s = i64[3] [2, 2, 6]\n  %m = Gemm(%x, %w, %b)  # proj\n  %v = Reshape(%m, %s)  # view\n  %y = Add(%v, %r)  # residual\n  output %y: f32[2,2,6]\n}}\n",
        w.join(", ")
    );
    let bytes = aim_onnx::export_bytes(&aim_ir::text::parse_model(&text).unwrap());
    let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.41).cos()).collect();
    let r: Vec<f32> = (0..24).map(|i| (i as f32 * 0.23).sin()).collect();
    let inputs =
        vec![("x".to_string(), Tensor::from_vec(&[4, 8], x)), ("r".to_string(), Tensor::from_vec(&[2, 2, 6], r))];
    check("reshaped residual", bytes.clone(), inputs);
    let m = cpu_model("reshaped-residual", &bytes);
    let g = m.optimized_graph().unwrap();
    assert!(!g.nodes.iter().any(|n| n.op == "Add"), "{:#?}", g.nodes);
}
