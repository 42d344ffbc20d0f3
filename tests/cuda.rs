//! The cuda backend end to end without a GPU: the benchmark models at reduced sizes
//! (`tests/models/make_models.py`: resnet50_tiny, mobilenetv2_tiny, bert_tiny, and
//! concat_split for sliced copies, resizes for Resize) go through
//! the cuda pipeline and lowering, their PTX runs in the interpreter (tools/ptx-interp),
//! and the outputs are compared with the reference backend's. Each model runs twice: with
//! a buffer per value (every access checked against its own tensor) and in the planned
//! device arena (which checks the plan: values alive together must not share bytes).

use aim::{Backend, Model};
use aim_compiler::cuda::lower::{lower, Arg, CudaProgram, Storage};
use aim_compiler::cuda::GpuTarget;
use aim_ir::{Tensor, ValueType};
use aim_ptx_interp::{Launch, Memory, Module};
use std::path::PathBuf;

fn models_dir() -> Option<PathBuf> {
    let d = PathBuf::from(std::env::var_os("AIM_MODELS")?);
    d.join("bert_tiny.onnx").exists().then_some(d)
}

/// The model's graph after the cuda pipeline, its inputs bound to the shapes of `inputs`.
fn cuda_graph(path: &std::path::Path, inputs: &[(String, Tensor)]) -> aim_ir::Graph {
    let mut g = aim_compiler::onnx::import_file(path).unwrap().graph;
    for i in g.inputs.iter_mut() {
        let t = &inputs.iter().find(|(n, _)| *n == i.name).unwrap().1;
        i.ty = ValueType::known(t.dtype(), t.shape());
    }
    // Types inferred with symbolic dims would be kept over the bound ones.
    g.value_types.clear();
    aim_compiler::passes::run_pipeline(&mut g, &aim_compiler::passes::cuda_pipeline(), false).unwrap();
    g
}

/// Runs `p` in the interpreter; `arena`: values in one arena buffer at their planned
/// offsets, else a buffer each.
fn run(p: &CudaProgram, inputs: &[(String, Tensor)], arena: bool) -> Result<Vec<Tensor>, String> {
    let module = Module::parse(&p.module()).map_err(|e| e.to_string())?;
    let mut mem = Memory::new();
    let base = if arena { mem.alloc(p.arena_bytes) } else { 0 };
    let mut addr = vec![0u64; p.values.len()];
    for (v, val) in p.values.iter().enumerate() {
        addr[v] = match &val.storage {
            Storage::Input => {
                let t = &inputs.iter().find(|(n, _)| *n == val.name).ok_or("missing input")?.1;
                mem.upload_bytes(t.bytes())
            }
            Storage::Constant(t) => mem.upload_bytes(t.bytes()),
            Storage::Arena(off) if arena => base + *off as u64,
            Storage::Arena(_) => mem.alloc(val.bytes()),
            Storage::Alias(_) => 0,
        };
    }
    for v in 0..p.values.len() {
        addr[v] = addr[p.root(v)];
    }
    let err = mem.alloc(4);
    for l in &p.launches {
        let k = &p.kernels[l.kernel];
        let args: Vec<aim_ptx_interp::Arg> = l
            .args
            .iter()
            .map(|a| match a {
                Arg::Value(v) => aim_ptx_interp::Arg::U64(addr[*v]),
                Arg::U64(n) => aim_ptx_interp::Arg::U64(*n),
                Arg::ErrorFlag => aim_ptx_interp::Arg::U64(err),
            })
            .collect();
        module.launch(&k.name, Launch { grid: k.grid, block: k.block }, &args, &mut mem).map_err(|e| e.to_string())?;
    }
    if mem.read_bytes(err, 4)? != [0; 4] {
        return Err("a kernel raised the error flag (an index out of range)".into());
    }
    p.outputs
        .iter()
        .map(|&o| {
            let v = &p.values[o];
            let bytes = mem.read_bytes(addr[o], v.bytes())?;
            Tensor::from_bytes(v.dtype, &v.shape, &bytes).map_err(|e| e.to_string())
        })
        .collect()
}

fn check(name: &str, target: GpuTarget, tol: f32, arenas: &[bool]) {
    check_with(name, None, target, tol, arenas)
}

/// As [`check`], with `inputs` instead of the model's `.inputs.npz` when given.
fn check_with(name: &str, inputs: Option<Vec<(String, Tensor)>>, target: GpuTarget, tol: f32, arenas: &[bool]) {
    let Some(dir) = models_dir() else {
        assert!(std::env::var_os("AIM_REQUIRE_CONFORMANCE").is_none(), "AIM_MODELS has no {name}.onnx");
        eprintln!("AIM_MODELS not set or without the tiny models: skipping {name}");
        return;
    };
    let path = dir.join(format!("{name}.onnx"));
    let inputs = match inputs {
        Some(i) => i,
        None => aim::npz::read_npz(&dir.join(format!("{name}.inputs.npz"))).unwrap(),
    };
    let want = Model::load_with(&path, Backend::Reference).unwrap().run(inputs.clone()).unwrap();
    let g = cuda_graph(&path, &inputs);
    let p = lower(&g, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
    for &arena in arenas {
        let got = run(&p, &inputs, arena).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), want.len());
        for (g, (oname, w)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape(), "{name} {oname}");
            let (g, w) = (g.data::<f32>(), w.data::<f32>());
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= tol * (1.0 + scale), "{name} {oname} (arena {arena}): max error {err:e}, scale {scale}");
        }
    }
    eprintln!("{name}: {} launches, {} kernels, arena {} bytes", p.launches.len(), p.kernels.len(), p.arena_bytes);
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
    // In the arena only: the interpreter takes about half a minute per run of it.
    check("resnet50_tiny", GpuTarget::SM90, 1e-4, &[true]);
}

/// Every kernel of the full-size benchmark models and two real-model look-alikes (and their
/// TF32 forms) assembles with ptxas for sm_80 and sm_90 without register spills.
#[test]
fn full_size_models_pass_ptxas() {
    let Some(ptxas) = aim_compiler::cuda::ptxas::find() else {
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
        let g = cuda_graph(&path, &inputs);
        for (sm, tf32) in [(80, false), (90, true)] {
            let target = GpuTarget::parse(&format!("sm_{sm}")).unwrap().with_tf32(tf32);
            let p = lower(&g, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
            let r = aim_compiler::cuda::ptxas::check(&ptxas, &p.module(), sm, &tmp)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(r.spills.is_empty(), "{name} sm_{sm}: spills in {:?}", r.spills);
            assert_eq!(r.kernels, p.kernels.len(), "{name} sm_{sm}");
            eprintln!("{name} sm_{sm}: {} kernels assembled, no spills", r.kernels);
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
}
