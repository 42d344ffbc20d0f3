//! Replays the importer fuzz corpus (fuzz/corpus/import_onnx) so every seed, and every
//! crash input once added there, stays a regression test without cargo-fuzz.

#[test]
fn import_corpus_never_panics() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/import_onnx");
    let mut n = 0;
    let mut accepted = 0;
    for e in std::fs::read_dir(&dir).expect("corpus directory") {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        accepted += aim::check_model_bytes(&bytes) as usize;
        // Every prefix of a seed is a truncated file: each must be refused or accepted cleanly.
        for cut in (0..bytes.len()).step_by(97) {
            aim::check_model_bytes(&bytes[..cut]);
        }
        n += 1;
    }
    assert!(n >= 5, "the corpus has only {n} files");
    assert!(accepted >= 5, "only {accepted} of {n} seeds were accepted: the valid seeds must import");
}
