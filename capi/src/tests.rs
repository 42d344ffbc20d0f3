//! The C ABI called as a C host would: status codes, messages, introspection, both run
//! forms. (The header generated from this crate is checked against the committed one by
//! tools/header-check.)

use super::*;
use std::ptr::{null, null_mut};

/// A model file in a directory of its own, removed with it.
struct ModelFile {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl std::ops::Deref for ModelFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for ModelFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A model with a symbolic batch dim: y = Relu(x) + b, and the shape of x as i64.
fn model_file(dir: &str) -> ModelFile {
    let text = "opset 17\ngraph \"g\" {\n  input %x: f32[N,3]\n  init %b = f32[3] [0.5, -1.0, 2.0]\n  %r = Relu(%x)  # relu\n  %y = Add(%r, %b)  # add\n  %s = Shape(%x)  # shape\n  output %y: f32[N,3]\n  output %s: i64[2]\n}\n";
    let ir = aim_ir::text::parse_model(text).expect("the test model parses");
    let d = std::env::temp_dir().join(format!("aim-capi-{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    let p = d.join("m.onnx");
    std::fs::write(&p, aim_onnx::export_bytes(&ir)).expect("writes the model");
    ModelFile { dir: d, path: p }
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(aim_last_error()) }.to_string_lossy().into_owned()
}

fn load(path: &std::path::Path) -> *mut AimModel {
    let p = cstr(path.to_str().expect("utf-8 path"));
    let opts =
        AimLoadOptions { threads: 1, cpu: null(), backend: null(), weights: null(), pin_threads: 0, memory_budget: 0 };
    let mut m = null_mut();
    let s = unsafe { aim_model_load(p.as_ptr(), &opts, &mut m) };
    assert_eq!(s, AimStatus::Ok, "{}", last_error());
    assert!(!m.is_null());
    m
}

fn input<'a>(name: &'a CString, shape: &'a [i64], data: &'a [f32]) -> AimTensor {
    AimTensor {
        name: name.as_ptr(),
        dtype: AimDType::F32 as i32,
        rank: shape.len(),
        shape: shape.as_ptr(),
        data: data.as_ptr().cast(),
        byte_len: std::mem::size_of_val(data),
    }
}

#[test]
fn loading_bad_paths_and_options_is_an_error_with_a_message() {
    let mut m = null_mut();
    assert_eq!(unsafe { aim_model_load(null(), null(), &mut m) }, AimStatus::InvalidArgument);
    assert!(last_error().contains("path is null"), "{}", last_error());
    let missing = cstr("/nonexistent/model.onnx");
    assert_eq!(unsafe { aim_model_load(missing.as_ptr(), null(), &mut m) }, AimStatus::LoadFailed);
    assert!(last_error().contains("/nonexistent/model.onnx"), "{}", last_error());
    assert!(m.is_null());
    let path = model_file("bad");
    let p = cstr(path.to_str().unwrap());
    let backend = cstr("gpu");
    let opts = AimLoadOptions {
        threads: 0,
        cpu: null(),
        backend: backend.as_ptr(),
        weights: null(),
        pin_threads: 0,
        memory_budget: 0,
    };
    assert_eq!(unsafe { aim_model_load(p.as_ptr(), &opts, &mut m) }, AimStatus::InvalidArgument);
    assert!(last_error().contains("unknown backend 'gpu'"), "{}", last_error());
    let cpu = cstr("pentium");
    let opts = AimLoadOptions {
        threads: 0,
        cpu: cpu.as_ptr(),
        backend: null(),
        weights: null(),
        pin_threads: 0,
        memory_budget: 0,
    };
    assert_eq!(unsafe { aim_model_load(p.as_ptr(), &opts, &mut m) }, AimStatus::InvalidArgument);
    assert!(last_error().contains("pentium"), "{}", last_error());
    let weights = cstr("int3");
    let opts = AimLoadOptions {
        threads: 0,
        cpu: null(),
        backend: null(),
        weights: weights.as_ptr(),
        pin_threads: 0,
        memory_budget: 0,
    };
    assert_eq!(unsafe { aim_model_load(p.as_ptr(), &opts, &mut m) }, AimStatus::InvalidArgument);
    assert!(last_error().contains("options.weights 'int3'"), "{}", last_error());
    // int4 weights and pinned threads load (a layer shorter than a block stays f32).
    let weights = cstr("int4");
    let opts = AimLoadOptions {
        threads: 2,
        cpu: null(),
        backend: null(),
        weights: weights.as_ptr(),
        pin_threads: 1,
        memory_budget: 0,
    };
    assert_eq!(unsafe { aim_model_load(p.as_ptr(), &opts, &mut m) }, AimStatus::Ok, "{}", last_error());
    unsafe { aim_model_free(m) };
    // A memory budget no process fits in is refused with the breakdown; a roomy one loads.
    let opts = AimLoadOptions {
        threads: 1,
        cpu: null(),
        backend: null(),
        weights: null(),
        pin_threads: 0,
        memory_budget: 4096,
    };
    assert_ne!(unsafe { aim_model_load(p.as_ptr(), &opts, &mut m) }, AimStatus::Ok);
    assert!(
        last_error().contains("a budget of 0.0 MiB cannot be met") && last_error().contains("loaded"),
        "{}",
        last_error()
    );
    assert!(m.is_null());
    let opts = AimLoadOptions { memory_budget: 16 << 30, ..opts };
    assert_eq!(unsafe { aim_model_load(p.as_ptr(), &opts, &mut m) }, AimStatus::Ok, "{}", last_error());
    unsafe { aim_model_free(m) };
}

#[test]
fn inputs_and_outputs_are_described_with_dynamic_dims_as_minus_one() {
    let m = load(&model_file("info"));
    unsafe {
        assert_eq!((aim_model_input_count(m), aim_model_output_count(m)), (1, 2));
        assert_eq!(aim_model_threads(m), 1);
        let mut info = AimTensorInfo { name: null(), dtype: 0, rank: 0, shape: null() };
        assert_eq!(aim_model_input(m, 0, &mut info), AimStatus::Ok);
        assert_eq!(CStr::from_ptr(info.name).to_str().unwrap(), "x");
        assert_eq!(info.dtype, AimDType::F32 as i32);
        assert_eq!(std::slice::from_raw_parts(info.shape, info.rank as usize), &[-1, 3]);
        assert_eq!(aim_model_output(m, 1, &mut info), AimStatus::Ok);
        assert_eq!(CStr::from_ptr(info.name).to_str().unwrap(), "s");
        assert_eq!(info.dtype, AimDType::I64 as i32);
        assert_eq!(std::slice::from_raw_parts(info.shape, info.rank as usize), &[2]);
        assert_eq!(aim_model_output(m, 2, &mut info), AimStatus::InvalidArgument);
        assert!(last_error().contains("output 2 does not exist (there are 2)"), "{}", last_error());
        assert_eq!(aim_model_input(null(), 0, &mut info), AimStatus::InvalidArgument);
        aim_model_free(m);
    }
}

#[test]
fn runs_return_owned_outputs_and_fill_host_buffers() {
    let m = load(&model_file("run"));
    let x = cstr("x");
    let data = [-1.0f32, 2.0, 3.0, 4.0, -5.0, 6.0];
    // Two batch sizes: each input shape gets its program.
    for rows in [2usize, 1] {
        let shape = [rows as i64, 3];
        let inp = input(&x, &shape, &data[..rows * 3]);
        let mut outs = null_mut();
        unsafe {
            assert_eq!(aim_model_run(m, &inp, 1, &mut outs), AimStatus::Ok, "{}", last_error());
            assert_eq!(aim_outputs_count(outs), 2);
            let mut t = AimTensor { name: null(), dtype: 0, rank: 0, shape: null(), data: null(), byte_len: 0 };
            assert_eq!(aim_outputs_get(outs, 0, &mut t), AimStatus::Ok);
            assert_eq!(CStr::from_ptr(t.name).to_str().unwrap(), "y");
            assert_eq!(std::slice::from_raw_parts(t.shape, t.rank), &shape);
            let y = std::slice::from_raw_parts(t.data.cast::<f32>(), t.byte_len / 4);
            let want = [0.5f32, 1.0, 5.0, 4.5, -1.0, 8.0];
            assert_eq!(y, &want[..rows * 3]);
            assert_eq!(aim_outputs_get(outs, 1, &mut t), AimStatus::Ok);
            assert_eq!(std::slice::from_raw_parts(t.data.cast::<i64>(), 2), &shape);
            aim_outputs_free(outs);
        }
    }
    let shape = [2i64, 3];
    let inp = input(&x, &shape, &data);
    let y = cstr("y");
    let mut buf = [0f32; 6];
    let b = AimBuffer { name: y.as_ptr(), data: buf.as_mut_ptr().cast(), byte_len: 24 };
    unsafe {
        assert_eq!(aim_model_run_into(m, &inp, 1, &b, 1), AimStatus::Ok, "{}", last_error());
        assert_eq!(buf, [0.5, 1.0, 5.0, 4.5, -1.0, 8.0]);
        let short = AimBuffer { byte_len: 20, ..b };
        assert_eq!(aim_model_run_into(m, &inp, 1, &short, 1), AimStatus::InvalidArgument);
        assert!(last_error().contains("holds 20 bytes; the output is f32 [2, 3] (24 bytes)"), "{}", last_error());
        let z = cstr("z");
        let unknown = AimBuffer { name: z.as_ptr(), ..b };
        assert_eq!(aim_model_run_into(m, &inp, 1, &unknown, 1), AimStatus::InvalidArgument);
        assert!(last_error().contains("no output named 'z' (its outputs: y, s)"), "{}", last_error());
        aim_model_free(m);
    }
}

#[test]
fn bad_inputs_are_errors_naming_the_input() {
    let m = load(&model_file("badin"));
    let data = [1.0f32; 8];
    let (x, w) = (cstr("x"), cstr("w"));
    let mut outs = null_mut();
    let cases: Vec<(AimTensor, AimStatus, &str)> = vec![
        (input(&w, &[2, 3], &data[..6]), AimStatus::InvalidArgument, "no input named 'w'"),
        (input(&x, &[2, 4], &data), AimStatus::RunFailed, "x"),
        (input(&x, &[2, 3], &data[..5]), AimStatus::InvalidArgument, "input 'x'"),
        (input(&x, &[-2, 3], &data[..6]), AimStatus::InvalidArgument, "negative dim -2"),
        (AimTensor { dtype: 99, ..input(&x, &[2, 3], &data[..6]) }, AimStatus::InvalidArgument, "99 is not a dtype"),
        (AimTensor { data: null(), ..input(&x, &[2, 3], &data[..6]) }, AimStatus::InvalidArgument, "data is null"),
    ];
    for (t, status, msg) in cases {
        assert_eq!(unsafe { aim_model_run(m, &t, 1, &mut outs) }, status, "{}", last_error());
        assert!(last_error().contains(msg), "wanted '{msg}' in: {}", last_error());
        assert!(outs.is_null());
    }
    unsafe {
        assert_eq!(aim_model_run(m, null(), 1, &mut outs), AimStatus::InvalidArgument);
        assert_eq!(aim_model_run(m, null(), 0, null_mut()), AimStatus::InvalidArgument);
        aim_model_free(m);
    }
}
