//! Writing and reading `.aim` files: round trip, alignment, and every kind of damage.

use super::*;
use crate::text::{print_model, TensorDetail};
use crate::{Graph, Node, ValueInfo, ValueType};

fn sample() -> Model {
    let mut g = Graph { name: "g".into(), ..Graph::default() };
    g.inputs.push(ValueInfo { name: "x".into(), ty: ValueType::known(DType::F32, &[1, 300]) });
    let w: Vec<f32> = (0..300 * 7).map(|i| (i as f32).sin()).collect();
    g.initializers.insert("w".into(), Tensor::from_slice(&[300, 7], &w));
    g.initializers.insert("b".into(), Tensor::from_slice(&[7], &[0.5f32; 7]));
    g.initializers.insert("odd".into(), Tensor::from_slice(&[33], &[3u8; 33]));
    g.nodes.push(Node {
        name: "mm".into(),
        op: "MatMul".into(),
        domain: String::new(),
        inputs: vec!["x".into(), "w".into()],
        outputs: vec!["y".into()],
        attrs: Default::default(),
    });
    g.outputs.push(ValueInfo { name: "y".into(), ty: ValueType::known(DType::F32, &[1, 7]) });
    Model {
        graph: g,
        opset: 17,
        producer: "pytorch".into(),
        doc: "a doc".into(),
        metadata: vec![("labels".into(), "cat,dog".into())],
    }
}

fn header() -> Header {
    let target = [("arch".to_string(), "x86_64".to_string()), ("level".into(), "x86-64-v3".into())];
    Header {
        stage: "optimized".into(),
        target: target.into_iter().collect(),
        writer: "aim test".into(),
        source: "m.onnx".into(),
        plan: Some(ArenaPlan { arena_bytes: 128, slots: vec![("t".into(), 64, 16)] }),
    }
}

fn written(name: &str) -> (std::path::PathBuf, Vec<u8>) {
    let dir = std::env::temp_dir().join(format!("aim-file-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join("m.aim");
    write(&p, &sample(), &header()).expect("writes");
    let bytes = std::fs::read(&p).expect("reads back");
    (p, bytes)
}

#[test]
fn round_trips_with_constants_mapped_and_aligned() {
    let (p, bytes) = written("round");
    let f = read(&p).expect("reads");
    assert_eq!(f.header, header());
    assert_eq!(print_model(&f.model, TensorDetail::Full), print_model(&sample(), TensorDetail::Full));
    assert_eq!(f.model.metadata, sample().metadata);
    let w = &f.model.graph.initializers["w"];
    assert!(w.is_borrowed(), "the weight is a view of the map, not a copy");
    assert_eq!(w.bytes().as_ptr() as usize % CONST_ALIGN, 0);
    let data_off = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
    assert_eq!(data_off % DATA_ALIGN, 0);
    assert_eq!(f.verify(), Ok(2), "w and odd are in the data section; b (7 values) is inline");
    assert_eq!(f.data_bytes(), 300 * 7 * 4 + 33);
}

#[test]
fn damaged_data_fails_verification_naming_the_constant() {
    let (p, mut bytes) = written("verify");
    let n = bytes.len();
    bytes[n - 1] ^= 0xff; // the last byte of the last constant
    std::fs::write(&p, &bytes).unwrap();
    let f = read(&p).expect("structure is intact");
    let e = f.verify().unwrap_err();
    assert!(e.contains("constant 1 (f32 [300, 7], 8400 bytes"), "{e}");
}

#[test]
fn every_truncation_is_a_clear_error() {
    let (_, bytes) = written("trunc");
    for len in (0..bytes.len()).step_by(97).chain([bytes.len() - 1, 63, 64, 65]) {
        let e = parse_bytes(&bytes[..len]).err().unwrap_or_else(|| panic!("{len} bytes accepted"));
        assert!(e.contains("truncated") || e.contains("corrupt"), "{len}: {e}");
    }
}

#[test]
fn damaged_headers_and_indexes_are_clear_errors() {
    let (_, bytes) = written("damage");
    let cases: Vec<(usize, u8, &str)> = vec![
        (0, b'X', "bad magic"),
        (8, 9, "format version 9"),
        (12, 1, "unknown header flags"),
        (23, 0x7f, "the index"),
        (33, 0x01, "the data section"),
        (70, b'#', "checksum"),
    ];
    for (at, v, want) in cases {
        let mut b = bytes.clone();
        b[at] = v;
        let e = parse_bytes(&b).err().unwrap_or_else(|| panic!("byte {at} = {v} accepted"));
        assert!(e.contains(want), "byte {at}: wanted '{want}' in: {e}");
    }
    assert!(parse_bytes(b"\x08\x07onnx...").err().expect("refused").contains("truncated"));
}

/// The file `bytes` with the first `from` of its index replaced by `to`, the header's
/// index length and checksum made to match (so only what the index says is wrong).
fn with_index_edited(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    let index_len = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
    let index = std::str::from_utf8(&bytes[64..64 + index_len]).unwrap();
    assert!(index.contains(from), "{from} not in {index}");
    let fixed = index.replacen(from, to, 1);
    let mut b = bytes[..64].to_vec();
    b[24..32].copy_from_slice(&(fixed.len() as u64).to_le_bytes());
    b[48..56].copy_from_slice(&fnv1a64(fixed.as_bytes()).to_le_bytes());
    b.extend_from_slice(fixed.as_bytes());
    let data_off = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
    b.resize(data_off, 0);
    b.extend_from_slice(&bytes[data_off..]);
    b
}

/// An index that passes its checksum but lies about a constant is still caught.
#[test]
fn inconsistent_indexes_are_clear_errors() {
    let (_, bytes) = written("lies");
    let edits = [
        ("\"dtype\":\"f32\"", "\"dtype\":\"i32\"", "the program wants f32"),
        ("\"bytes\":8400", "\"bytes\":8000", "not f32 [300, 7]"),
        ("\"offset\":64", "\"offset\":65", "misaligned"),
        ("\"offset\":64", "\"offset\":999936", "outside the data section"),
        ("@1", "@5", "only 2 constants"),
    ];
    for (from, to, want) in edits {
        let e = parse_bytes(&with_index_edited(&bytes, from, to))
            .err()
            .unwrap_or_else(|| panic!("{from} -> {to} accepted"));
        assert!(e.contains(want), "{from} -> {to}: wanted '{want}' in: {e}");
    }
}

/// An image in memory that lives for the process (a shared object's read-only data) is
/// read in place: its constants point into it, and the header (with the arena plan) and
/// the program come back as written. A misaligned image is refused.
#[test]
fn static_images_are_read_in_place() {
    let (_, bytes) = written("static");
    let pages = bytes.len().div_ceil(DATA_ALIGN) + 1;
    let buf: &'static mut [u8] = Vec::leak(vec![0u8; pages * DATA_ALIGN]);
    let start = (DATA_ALIGN - (buf.as_ptr() as usize) % DATA_ALIGN) % DATA_ALIGN;
    buf[start..start + bytes.len()].copy_from_slice(&bytes);
    let image: &'static [u8] = &buf[start..start + bytes.len()];
    let f = parse_static(image).expect("reads");
    assert_eq!(f.header, header());
    let range = image.as_ptr_range();
    let big = f.model.graph.initializers.values().max_by_key(|t| t.bytes().len()).expect("constants");
    assert!(range.contains(&big.bytes().as_ptr()), "the largest constant is a view of the image");
    assert_eq!(f.verify().expect("checksums match"), f.constants.len());
    let shifted: &'static [u8] = &buf[start + 1..start + 1 + bytes.len() - 1];
    assert!(parse_static(shifted).err().expect("refused").contains("boundary"));
}

/// Writing over a directory is a clean error that leaves no partial file behind (one was
/// once left beside the directory).
#[test]
fn writing_over_a_directory_leaves_nothing_behind() {
    let dir = std::env::temp_dir().join(format!("aim-file-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = write(&dir, &sample(), &header()).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");
    assert!(!dir.with_extension("aim.partial").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The same model with its weight `w` scaled by `k`: a program whose other constants equal
/// `sample`'s (as two targets' programs share the weights their layouts agree on).
fn sample_with_w_scaled(k: f32) -> Model {
    let mut m = sample();
    let w: Vec<f32> = m.graph.initializers["w"].data::<f32>().iter().map(|x| x * k).collect();
    m.graph.initializers.insert("w".into(), Tensor::from_slice(&[300, 7], &w));
    m
}

fn header_for_level(level: &str) -> Header {
    let mut h = header();
    h.target.insert("level".into(), level.into());
    h
}

/// A package of three programs stores each distinct constant once, lists every program's
/// header, and reads the program the chooser picks, its constants views of the one data
/// section.
#[test]
fn packages_share_equal_constants_and_read_the_chosen_program() {
    let dir = std::env::temp_dir().join(format!("aim-file-package-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("all.aim");
    let (a, b, c) = (sample(), sample_with_w_scaled(2.0), sample());
    let (ha, hb, hc) = (header_for_level("x86-64-v2"), header_for_level("x86-64-v3"), header_for_level("x86-64-v4"));
    let bytes_read = write_package(&p, &[(&a, &ha), (&b, &hb), (&c, &hc)]).expect("writes");
    let (w, odd) = (300 * 7 * 4, 33);
    let both = |read, own| ProgramBytes { read, own };
    assert_eq!(bytes_read, vec![both(w + odd, 0), both(w + odd, w), both(w + odd, 0)]);
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), VERSION_PACKAGE);
    let pick_v3 = |hs: &[Header]| -> Result<usize, String> {
        hs.iter().position(|h| h.target["level"] == "x86-64-v3").ok_or_else(|| "no v3".to_string())
    };
    let f = read_choosing(&p, &pick_v3).expect("reads");
    assert_eq!(f.programs, vec![ha, hb.clone(), hc]);
    assert_eq!((f.chosen, &f.header), (1, &hb));
    assert_eq!(print_model(&f.model, TensorDetail::Full), print_model(&b, TensorDetail::Full));
    // w twice (two values) and `odd` once: the programs share `odd` and a's w with c's.
    assert_eq!(f.verify(), Ok(3));
    assert_eq!(f.data_bytes(), 2 * 300 * 7 * 4 + 33);
    let first = read(&p).expect("reads the first");
    assert_eq!(print_model(&first.model, TensorDetail::Full), print_model(&a, TensorDetail::Full));
    let e = read_choosing(&p, &|_: &[Header]| Err("none of them runs here".to_string())).err().expect("refused");
    assert!(e.to_string().contains("none of them runs here") && e.to_string().contains("all.aim"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A package whose program list is missing or empty, or whose program lacks its text, is a
/// clear error naming the program.
#[test]
fn damaged_package_indexes_are_clear_errors() {
    let (a, b) = (sample(), sample_with_w_scaled(3.0));
    let (ha, hb) = (header_for_level("x86-64-v3"), header_for_level("x86-64-v4"));
    let mut bytes = Vec::new();
    write_to(&mut bytes, &[(&a, &ha), (&b, &hb)]).unwrap();
    assert!(parse_bytes(&bytes).is_ok());
    let edits = [
        ("\"programs\":", "\"programz\":", "no 'programs' list"),
        ("\"program\":\"opset", "\"text\":\"opset", "program 0: the index has no 'program'"),
        ("\"stage\":\"optimized\"", "\"stage\":7", "program 0: the index has no 'stage'"),
    ];
    for (from, to, want) in edits {
        let e = parse_bytes(&with_index_edited(&bytes, from, to))
            .err()
            .unwrap_or_else(|| panic!("{from} -> {to} accepted"));
        assert!(e.contains(want), "{from} -> {to}: wanted '{want}' in: {e}");
    }
}
