//! Replays the fuzz corpora (`fuzz/corpus/<target>/`) so every seed, and every crash input
//! once added there, stays a regression test without cargo-fuzz: the ONNX importer, the
//! `.npz` reader, the `.aim` reader, the IR text parser, and the cpu backend against the reference on the
//! generated graphs of `fuzz/graphgen.rs` (plus a few hundred more from a fixed seed).

#[path = "../fuzz/graphgen.rs"]
mod graphgen;

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

#[test]
fn import_corpus_never_panics() {
    let seeds = corpus("import_onnx");
    let mut accepted = 0;
    for (_, bytes) in &seeds {
        accepted += aim::check_model_bytes(bytes) as usize;
        // Every prefix of a seed is a truncated file: each must be refused or accepted cleanly.
        for cut in (0..bytes.len()).step_by(97) {
            aim::check_model_bytes(&bytes[..cut]);
        }
    }
    assert!(seeds.len() >= 5, "the corpus has only {} files", seeds.len());
    assert!(accepted >= 5, "only {accepted} of {} seeds were accepted: the valid seeds must import", seeds.len());
}

#[test]
fn aim_file_corpus_reads_or_refuses() {
    let seeds = corpus("read_aim");
    let mut read = 0;
    for (path, bytes) in &seeds {
        if let Ok(f) = aim_ir::aim_file::parse_bytes(bytes) {
            read += 1;
            f.verify().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        // Truncations and single-byte damage anywhere: refused, or (in padding) harmless.
        for cut in (0..bytes.len()).step_by(61) {
            assert!(aim_ir::aim_file::parse_bytes(&bytes[..cut]).is_err(), "{} cut at {cut}", path.display());
        }
        for at in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[at] ^= 0x5a;
            if let Ok(f) = aim_ir::aim_file::parse_bytes(&b) {
                let _ = f.verify();
            }
        }
    }
    assert!(read >= 3, "only {read} of {} seeds read: the valid seeds must", seeds.len());
}

#[test]
fn npz_corpus_reads_or_refuses() {
    let seeds = corpus("read_npz");
    let mut read = 0;
    for (_, bytes) in &seeds {
        read += aim::npz::read_npz_bytes(bytes, "seed").is_ok() as usize;
        let _ = aim::npz::parse_npy(bytes);
        for cut in (0..bytes.len()).step_by(13) {
            let _ = aim::npz::read_npz_bytes(&bytes[..cut], "prefix");
            let _ = aim::npz::parse_npy(&bytes[..cut]);
        }
    }
    assert!(read >= 3, "only {read} of {} seeds read: the valid seeds must", seeds.len());
}

#[test]
fn ir_text_corpus_round_trips() {
    let full = aim_ir::text::TensorDetail::Full;
    for (path, bytes) in corpus("ir_text") {
        let Ok(text) = std::str::from_utf8(&bytes) else { continue };
        let Ok(m) = aim_ir::text::parse_model(text) else { continue };
        let printed = aim_ir::text::print_model(&m, full);
        let again = aim_ir::text::parse_model(&printed).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(printed, aim_ir::text::print_model(&again, full), "{}", path.display());
    }
}

#[test]
fn generated_graphs_agree_with_the_reference() {
    let mut seeds: Vec<Vec<u8>> = corpus("compile_vs_reference").into_iter().map(|(_, b)| b).collect();
    // And a few hundred more, from a fixed seed.
    let mut s = 0x9e3779b97f4a7c15u64;
    for _ in 0..300 {
        let len = 16 + (s >> 58) as usize * 8;
        seeds.push(
            (0..len)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 24) as u8
                })
                .collect(),
        );
    }
    let mut failures = Vec::new();
    let mut refused = 0;
    for bytes in &seeds {
        match graphgen::compare(&graphgen::generate(bytes), 2) {
            Ok(true) => {}
            Ok(false) => refused += 1,
            Err(e) => failures.push(e),
        }
    }
    println!(
        "generated graphs: {} compared, {refused} refused by both backends, {} disagreed",
        seeds.len(),
        failures.len()
    );
    assert!(refused * 10 < seeds.len(), "most generated graphs should be valid");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
#[ignore]
fn print_some_generated_graphs() {
    for i in 0..3u8 {
        let bytes: Vec<u8> = (0..200u32).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i * 17)).collect();
        println!("{}", graphgen::generate(&bytes).text);
    }
}

/// The server's request decoding (`fuzz/fuzz_targets/serve_request.rs`): every seed, its
/// truncations and single-byte changes decode into tensors of the sizes their shapes say or
/// are refused with a 400.
#[cfg(feature = "serve")]
#[test]
fn serve_request_corpus_decodes_or_refuses() {
    let seeds = corpus("serve_request");
    let mut decoded = 0;
    for (_, bytes) in &seeds {
        decoded += aim::serve::protocol::decode_check(bytes) as usize;
        for cut in (0..bytes.len()).step_by(5) {
            aim::serve::protocol::decode_check(&bytes[..cut]);
        }
        for at in 0..bytes.len() {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut b = bytes.clone();
                b[at] ^= flip;
                aim::serve::protocol::decode_check(&b);
            }
        }
    }
    assert!(decoded >= 4, "only {decoded} of {} seeds decoded: the valid seeds must", seeds.len());
}
