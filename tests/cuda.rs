//! The cuda backend end to end without a GPU: the benchmark models at reduced sizes
//! (`tests/models/make_models.py`: resnet50_tiny, mobilenetv2_tiny, bert_tiny, and
//! concat_split for sliced copies, resizes for Resize) go through
//! the cuda pipeline and lowering, their PTX runs in the interpreter (tools/ptx-interp),
//! and the outputs are compared with the reference backend's. Each model runs twice: with
//! a buffer per value (every access checked against its own tensor) and in the planned
//! device arena (which checks the plan: values alive together must not share bytes).

use aim::{Backend, Model};
use aim_cuda::GpuTarget;
use aim_ir::Tensor;
use aim_ptx_interp::{run_program, Placement};
use aim_runtime::cuda::CudaProgram;
use std::collections::HashMap;
use std::path::PathBuf;

fn models_dir() -> Option<PathBuf> {
    let d = PathBuf::from(std::env::var_os("AIM_MODELS")?);
    d.join("bert_tiny.onnx").exists().then_some(d)
}

/// The model compiled for `target` with its inputs of the shapes of `inputs`, as the cuda
/// backend compiles it (`aim::gpu::compile`).
fn compile(model: &Model, inputs: &[(String, Tensor)], target: &GpuTarget) -> CudaProgram {
    let sig: Vec<Vec<usize>> =
        model.inputs().iter().map(|i| inputs.iter().find(|(n, _)| *n == i.name).unwrap().1.shape().to_vec()).collect();
    let path = model.path().display().to_string();
    aim::gpu::compile(&model.ir().graph, &sig, target, &path).unwrap_or_else(|e| panic!("{e}"))
}

fn check(name: &str, target: GpuTarget, tol: f64, arenas: &[bool]) {
    check_with(name, None, target, tol, arenas);
}

/// As [`check`], with `inputs` instead of the model's `.inputs.npz` when given; returns the
/// program (None when the models are not there).
fn check_with(
    name: &str,
    inputs: Option<Vec<(String, Tensor)>>,
    target: GpuTarget,
    tol: f64,
    arenas: &[bool],
) -> Option<CudaProgram> {
    let Some(dir) = models_dir() else {
        assert!(std::env::var_os("AIM_REQUIRE_CONFORMANCE").is_none(), "AIM_MODELS has no {name}.onnx");
        eprintln!("AIM_MODELS not set or without the tiny models: skipping {name}");
        return None;
    };
    let path = dir.join(format!("{name}.onnx"));
    let inputs = match inputs {
        Some(i) => i,
        None => aim::npz::read_npz(&dir.join(format!("{name}.inputs.npz"))).unwrap(),
    };
    let model = Model::load_with(&path, Backend::Reference).unwrap();
    let want = model.run(inputs.clone()).unwrap();
    let p = compile(&model, &inputs, &target);
    let by_name: HashMap<String, Tensor> = inputs.iter().cloned().collect();
    for &arena in arenas {
        let placement = if arena { Placement::Arena } else { Placement::Separate };
        let got = run_program(&p, &by_name, placement).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), want.len());
        for (g, (oname, w)) in got.iter().zip(&want) {
            assert_eq!((g.dtype(), g.shape()), (w.dtype(), w.shape()), "{name} {oname}");
            let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
            let scale = w.iter().fold(0f64, |m, v| m.max(v.abs()));
            let err = g.iter().zip(&w).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= tol * (1.0 + scale), "{name} {oname} (arena {arena}): max error {err:e}, scale {scale}");
        }
    }
    eprintln!("{name}: {} launches, {} kernels, arena {} bytes", p.launches.len(), p.kernels.len(), p.arena_bytes);
    Some(p)
}

/// Whether the program multiplies on half tensor cores of `ty` (`f16`, `bf16`) with its
/// weights stored in that type, and keeps no f32 copy of them.
fn on_half_tensor_cores(p: &CudaProgram, ty: &str, dtype: aim_ir::DType) -> bool {
    let mma = p.kernels.iter().any(|k| k.ptx.contains(&format!("m16n8k16.row.col.f32.{ty}.{ty}.f32")));
    let halves = p.values.iter().filter(|v| v.dtype == dtype && v.shape.len() == 2).count();
    mma && halves > 0
}

/// Half models (every float tensor f16) keep their weights f16 on the device and multiply
/// on f16 tensor cores; an f32 model does the same in bf16 when asked. Tolerances: the
/// products' operands are rounded to the half type (2^-11 / 2^-8 relative).
#[test]
fn half_weights_on_f16_and_bf16_tensor_cores() {
    for name in ["bert_tiny_f16", "mobilenetv2_tiny_f16"] {
        if let Some(p) = check_with(name, None, GpuTarget::SM80, 2e-2, &[true]) {
            assert!(on_half_tensor_cores(&p, "f16", aim_ir::DType::F16), "{name}: not on f16 tensor cores");
        }
    }
    let bf16 = GpuTarget::SM90.with_half(Some(aim_cuda::Half::Bf16));
    if let Some(p) = check_with("bert_tiny", None, bf16, 5e-2, &[true]) {
        assert!(on_half_tensor_cores(&p, "bf16", aim_ir::DType::BF16), "bert_tiny: not on bf16 tensor cores");
        // The packed weights replace the f32 ones: those are not uploaded as well.
        let names: Vec<&str> = p.values.iter().map(|v| v.name.as_str()).collect();
        let both = names.iter().filter_map(|n| n.strip_suffix(":bf16")).filter(|w| names.contains(w)).count();
        assert_eq!(both, 0, "f32 copies of packed weights are uploaded too");
    }
}

#[test]
fn split_concat_and_channel_softmax_on_the_ptx_interpreter() {
    check("concat_split", GpuTarget::SM80, 1e-6, &[false, true]);
}

#[test]
fn resizes_on_the_ptx_interpreter() {
    check("resizes", GpuTarget::SM80, 1e-5, &[false, true]);
}

/// The OCR detector look-alike (MobileNetV3 backbone, FPN with Resize, ConvTranspose head)
/// at a 64×64 input: its symbolic dims bound, as the JIT binds them.
#[test]
fn dbnet_like_at_64_pixels_on_the_ptx_interpreter() {
    let x: Vec<f32> = (0..3 * 64 * 64).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
    let inputs = vec![("x".to_string(), Tensor::from_vec(&[1, 3, 64, 64], x))];
    check_with("dbnet_like", Some(inputs), GpuTarget::SM80, 1e-4, &[true]);
}

/// The exported-transformer look-alikes (symbolic batch and sequence; the decoder step's
/// causal mask through Where) at short sequences.
#[test]
fn bert_hf_and_gpt2_step_on_the_ptx_interpreter() {
    let ids = |n: usize| Tensor::from_vec(&[1, n], (0..n as i64).map(|i| (i * 37 + 5) % 8000).collect::<Vec<i64>>());
    let bert = vec![
        ("input_ids".to_string(), ids(8)),
        ("attention_mask".to_string(), Tensor::from_vec(&[1, 8], vec![1i64, 1, 1, 1, 1, 1, 0, 0])),
        ("token_type_ids".to_string(), Tensor::from_vec(&[1, 8], vec![0i64; 8])),
    ];
    check_with("bert_hf", Some(bert), GpuTarget::SM80, 1e-4, &[true]);
    let mut gpt = vec![("input_ids".to_string(), ids(1))];
    for l in 0..4 {
        for kind in ["key", "value"] {
            let v: Vec<f32> = (0..4 * 8 * 64).map(|i| (((i + 13 * l) * 7919 % 997) as f32 / 498.0) - 1.0).collect();
            gpt.push((format!("past_{kind}_{l}"), Tensor::from_vec(&[1, 4, 8, 64], v)));
        }
    }
    check_with("gpt2_step", Some(gpt), GpuTarget::SM90, 1e-4, &[true]);
}

/// The same BERT as exported by ONNX Runtime's transformer optimizer (its mask through an
/// i64 → i32 Cast), and the text recogniser with its LSTM unrolled (a mean over the feature
/// map's height, not its last axis; LogSoftmax for the CTC head).
#[test]
fn bert_hf_ort_and_crnn_unrolled_on_the_ptx_interpreter() {
    let ids = |n: usize| Tensor::from_vec(&[1, n], (0..n as i64).map(|i| (i * 37 + 5) % 8000).collect::<Vec<i64>>());
    let bert = vec![
        ("input_ids".to_string(), ids(8)),
        ("attention_mask".to_string(), Tensor::from_vec(&[1, 8], vec![1i64, 1, 1, 1, 1, 0, 0, 0])),
        ("token_type_ids".to_string(), Tensor::from_vec(&[1, 8], vec![0i64; 8])),
    ];
    check_with("bert_hf_ort", Some(bert), GpuTarget::SM80, 1e-4, &[true]);
    check("crnn_unrolled", GpuTarget::SM80, 1e-4, &[true]);
}

#[test]
fn bert_tiny_on_the_ptx_interpreter() {
    check("bert_tiny", GpuTarget::SM80, 1e-4, &[false, true]);
}

#[test]
fn bert_tiny_with_tf32_tensor_cores() {
    check("bert_tiny", GpuTarget::SM90.with_tf32(true), 1e-2, &[true]);
}

#[test]
fn mobilenetv2_tiny_on_the_ptx_interpreter() {
    check("mobilenetv2_tiny", GpuTarget::SM80, 1e-4, &[false, true]);
}

#[test]
fn resnet50_tiny_on_the_ptx_interpreter() {
    // In the arena only: each run of it is the longest the interpreter makes here (about
    // 15 s, with half of ResNet-50's channels).
    check("resnet50_tiny", GpuTarget::SM90, 1e-4, &[true]);
}

/// Every kernel of the full-size benchmark models and two real-model look-alikes (and their
/// TF32 and f16-weight forms) assembles with ptxas for sm_80 and sm_90 without register
/// spills.
#[test]
fn full_size_models_pass_ptxas() {
    let Some(ptxas) = aim_cuda::ptxas::find() else {
        assert!(std::env::var_os("AIM_REQUIRE_PTXAS").is_none(), "ptxas not found");
        eprintln!("ptxas not found: skipping");
        return;
    };
    let Some(dir) = std::env::var_os("AIM_MODELS").map(PathBuf::from) else {
        assert!(std::env::var_os("AIM_REQUIRE_CONFORMANCE").is_none(), "AIM_MODELS is not set");
        return;
    };
    let tmp = std::env::temp_dir().join(format!("aim-cuda-ptxas-{}", std::process::id()));
    for name in ["resnet50", "mobilenetv2", "bert_l6", "yolo_like", "mobilenetv3"] {
        let path = dir.join(format!("{name}.onnx"));
        let inputs = aim::npz::read_npz(&dir.join(format!("{name}.inputs.npz"))).unwrap();
        let model = Model::load_with(&path, Backend::Reference).unwrap();
        let f16 = Some(aim_cuda::Half::F16);
        // The f16-weight forms of the two benchmark models with the most GEMMs.
        let forms: &[_] = if ["resnet50", "bert_l6"].contains(&name) {
            &[(80, false, None), (90, true, None), (80, false, f16)]
        } else {
            &[(80, false, None), (90, true, None)]
        };
        for &(sm, tf32, half) in forms {
            let target = GpuTarget::parse(&format!("sm_{sm}")).unwrap().with_tf32(tf32).with_half(half);
            let p = compile(&model, &inputs, &target);
            let ptx: Vec<String> = p.kernels.iter().map(|k| k.ptx.clone()).collect();
            let r = aim_cuda::ptxas::check_kernels(&ptxas, &ptx, &[sm], &tmp)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .remove(0);
            assert!(r.spills.is_empty(), "{name} sm_{sm}: spills in {:?}", r.spills);
            assert_eq!(r.kernels, p.kernels.len(), "{name} sm_{sm}");
            // ResNet-50 repeats identical blocks: their launches share kernels.
            if name == "resnet50" {
                assert!(p.kernels.len() < p.launches.len(), "resnet50: no kernel shared between launches");
            }
            eprintln!(
                "{name} sm_{sm}: {} launches, {} distinct kernels assembled, no spills",
                p.launches.len(),
                r.kernels
            );
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
}
