//! ONNX backend conformance: every case in `tests/conformance/expected_pass.txt` must pass on
//! the reference backend and on the cpu backend. The cases are generated from the pinned onnx package by
//! `tests/conformance/gen_onnx_cases.py` (the README's test command does it) into
//! `target/onnx-cases`, or the directory named by `AIM_ONNX_CASES`.
//!
//! Without generated cases the test says so and passes, unless `AIM_REQUIRE_CONFORMANCE=1`
//! (set by the README's test command and CI), when missing cases fail it.

use aim::conformance::{find_cases, run_case, Outcome};
use aim::Backend;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn cases_dir() -> PathBuf {
    match std::env::var_os("AIM_ONNX_CASES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/onnx-cases"),
    }
}

#[test]
fn onnx_node_conformance_reference_backend() {
    conformance(Backend::Reference);
}

#[test]
fn onnx_node_conformance_cpu_backend() {
    conformance(Backend::Cpu);
}

fn conformance(backend: Backend) {
    let dir = cases_dir();
    let required = std::env::var("AIM_REQUIRE_CONFORMANCE").is_ok_and(|v| v == "1");
    if !dir.is_dir() {
        assert!(!required, "no ONNX cases in {}: run tests/conformance/gen_onnx_cases.py {0}", dir.display());
        eprintln!("skipping conformance: no cases in {} (run tests/conformance/gen_onnx_cases.py)", dir.display());
        return;
    }
    let list = include_str!("conformance/expected_pass.txt");
    let expected: BTreeSet<&str> =
        list.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let cases = find_cases(std::slice::from_ref(&dir)).expect("listing cases");
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    let mut regressions = Vec::new();
    let mut newly = Vec::new();
    let mut seen = BTreeSet::new();
    for c in &cases {
        let name = c.file_name().unwrap().to_string_lossy().into_owned();
        let outcome = run_case(c, backend);
        match &outcome {
            Outcome::Pass => pass += 1,
            Outcome::Fail(_) => fail += 1,
            Outcome::Skipped(_) => skip += 1,
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
    println!(
        "ONNX node conformance ({backend:?}): {} cases: {pass} passed, {fail} failed, {skip} skipped",
        cases.len()
    );
    if !newly.is_empty() {
        println!("passing but not listed in expected_pass.txt (add them): {}", newly.join(", "));
    }
    assert!(absent.is_empty(), "listed cases missing from {}: {absent:?}", dir.display());
    assert!(regressions.is_empty(), "{} listed cases no longer pass:\n{}", regressions.len(), regressions.join("\n"));
}
