//! ONNX backend conformance: every case in `tests/conformance/expected_pass.txt` must pass on
//! the reference backend and on the cpu backend, and every case in `expected_pass_cuda.txt`
//! on the cuda backend run in the PTX interpreter. The cases are generated from the pinned onnx package by
//! `tests/conformance/gen_onnx_cases.py` (the README's test command does it) into
//! `target/onnx-cases`, or the directory named by `AIM_ONNX_CASES`.
//!
//! Without generated cases the test says so and passes, unless `AIM_REQUIRE_CONFORMANCE=1`
//! (set by the README's test command and CI), when missing cases fail it.

use aim::conformance::{find_cases, run_case, run_case_with, Named, Outcome};
use aim::{Backend, Tensor};
use aim_cuda::GpuTarget;
use aim_ptx_interp::{run_program, Placement};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

fn cases_dir() -> PathBuf {
    match std::env::var_os("AIM_ONNX_CASES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/onnx-cases"),
    }
}

#[test]
fn onnx_node_conformance_reference_backend() {
    let list = include_str!("conformance/expected_pass.txt");
    conformance("reference", list, |c| run_case(c, Backend::Reference));
}

#[test]
fn onnx_node_conformance_cpu_backend() {
    let list = include_str!("conformance/expected_pass.txt");
    conformance("cpu", list, |c| run_case(c, Backend::Cpu));
}

/// The cuda backend without a GPU: each case's graph compiled for sm_80 and its PTX run in
/// the interpreter, twice (values in their own buffers, then in the planned arena). Cases
/// whose graph the backend cannot lower are skipped; the ones it lowers are listed in
/// `expected_pass_cuda.txt`. Every kernel they generate then goes through ptxas for sm_80
/// and sm_90 (when ptxas is installed; `AIM_REQUIRE_PTXAS=1` requires it): no errors, no
/// spills.
#[test]
fn onnx_node_conformance_cuda_in_the_ptx_interpreter() {
    if skip_interpreter() {
        return;
    }
    let list = include_str!("conformance/expected_pass_cuda.txt");
    let kernels = RefCell::new((HashSet::new(), Vec::new()));
    conformance("cuda, PTX interpreter", list, |c| run_case_with(c, |model| Ok(cuda_runner(model, c, &kernels))));
    let kernels = kernels.into_inner().1;
    let Some(ptxas) = aim_cuda::ptxas::find() else {
        assert!(std::env::var_os("AIM_REQUIRE_PTXAS").is_none(), "ptxas not found (pip install nvidia-cuda-nvcc-cu12)");
        eprintln!("ptxas not found: the conformance kernels were not checked with it");
        return;
    };
    let dir = std::env::temp_dir().join(format!("aim-conformance-ptxas-{}", std::process::id()));
    let reports = aim_cuda::ptxas::check_kernels(&ptxas, &kernels, &[80, 90], &dir).unwrap_or_else(|e| panic!("{e}"));
    for (sm, r) in [80, 90].iter().zip(&reports) {
        assert!(r.spills.is_empty(), "sm_{sm}: spills in {:?}", r.spills);
        assert_eq!(r.kernels, kernels.len(), "{}", r.log);
    }
    std::fs::remove_dir_all(&dir).ok();
    println!("{} kernels of the conformance cases pass ptxas for sm_80 and sm_90 without spills", kernels.len());
}

/// Whether `AIM_SKIP_PTX_INTERPRETER` is set (tests/cross_aarch64.sh: under QEMU the
/// interpreter repeats, ten times slower, what the native run checks).
fn skip_interpreter() -> bool {
    let skip = std::env::var_os("AIM_SKIP_PTX_INTERPRETER").is_some();
    if skip {
        eprintln!("AIM_SKIP_PTX_INTERPRETER is set: the cuda backend's conformance run is skipped");
    }
    skip
}

/// Runs a case's data sets as the cuda backend would: compiled for their input shapes.
/// Each program's kernels not seen before (`kernels.0`, by text) are added to `kernels.1`,
/// renamed apart from other cases'.
fn cuda_runner<'k>(
    model: &aim::Model,
    case: &Path,
    kernels: &'k RefCell<(HashSet<String>, Vec<String>)>,
) -> impl Fn(Named) -> Result<Named, Outcome> + 'k {
    let graph = model.ir().graph.clone();
    let path = case.display().to_string();
    move |inputs| {
        let sig: Vec<Vec<usize>> = inputs.iter().map(|(_, t)| t.shape().to_vec()).collect();
        let p = match aim::gpu::compile(&graph, &sig, &GpuTarget::SM80, &path) {
            Ok(p) => p,
            Err(e @ aim::Error::Lower { .. }) => return Err(Outcome::Skipped(e.to_string())),
            Err(e) => return Err(Outcome::Fail(e.to_string())),
        };
        // Kernels are renamed apart from other cases'; one generated again, the same text
        // under the same name by another case, is assembled once.
        let mut ks = kernels.borrow_mut();
        let case = ks.1.len();
        for k in &p.kernels {
            if ks.0.insert(k.ptx.clone()) {
                ks.1.push(k.ptx.replacen(&format!(".entry {}(", k.name), &format!(".entry c{case}_{}(", k.name), 1));
            }
        }
        drop(ks);
        let inputs: HashMap<String, Tensor> = inputs.into_iter().collect();
        let separate = run_program(&p, &inputs, Placement::Separate).map_err(Outcome::Fail)?;
        let arena = run_program(&p, &inputs, Placement::Arena).map_err(Outcome::Fail)?;
        if separate.iter().zip(&arena).any(|(a, b)| a.bytes() != b.bytes()) {
            return Err(Outcome::Fail("the outputs differ between separate buffers and the arena".into()));
        }
        Ok(graph.outputs.iter().map(|o| o.name.clone()).zip(arena).collect())
    }
}

fn conformance(label: &str, list: &str, run: impl Fn(&Path) -> Outcome) {
    let dir = cases_dir();
    let required = std::env::var("AIM_REQUIRE_CONFORMANCE").is_ok_and(|v| v == "1");
    if !dir.is_dir() {
        assert!(!required, "no ONNX cases in {}: run tests/conformance/gen_onnx_cases.py {0}", dir.display());
        eprintln!("skipping conformance: no cases in {} (run tests/conformance/gen_onnx_cases.py)", dir.display());
        return;
    }
    let expected: BTreeSet<&str> =
        list.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let cases = find_cases(std::slice::from_ref(&dir)).expect("listing cases");
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    let mut regressions = Vec::new();
    let mut newly = Vec::new();
    let mut seen = BTreeSet::new();
    for c in &cases {
        let name = c.file_name().unwrap().to_string_lossy().into_owned();
        let outcome = run(c);
        match &outcome {
            Outcome::Pass => pass += 1,
            Outcome::Fail(why) => {
                fail += 1;
                if std::env::var_os("AIM_CONFORMANCE_SHOW_FAILURES").is_some() {
                    println!("FAIL {name}: {why}");
                }
            }
            Outcome::Skipped(why) => {
                skip += 1;
                if std::env::var_os("AIM_CONFORMANCE_SHOW_SKIPS").is_some() {
                    println!("SKIP {name}: {why}");
                }
            }
        }
        if expected.contains(name.as_str()) {
            seen.insert(name.clone());
            if outcome != Outcome::Pass {
                regressions.push(format!("{name}: {outcome:?}"));
            }
        } else if outcome == Outcome::Pass {
            newly.push(name);
        }
    }
    let absent: Vec<&&str> = expected.iter().filter(|e| !seen.contains(**e)).collect();
    println!("ONNX node conformance ({label}): {} cases: {pass} passed, {fail} failed, {skip} skipped", cases.len());
    if !newly.is_empty() {
        println!("passing but not listed (add them to the list): {}", newly.join(", "));
    }
    assert!(absent.is_empty(), "listed cases missing from {}: {absent:?}", dir.display());
    assert!(regressions.is_empty(), "{} listed cases no longer pass:\n{}", regressions.len(), regressions.join("\n"));
}
