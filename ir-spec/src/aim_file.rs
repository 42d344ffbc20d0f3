//! `.aim` files: aim's own model format (specified in `ir-spec/FORMAT.md`). A 64-byte
//! header, a JSON index holding the program as IR text (its larger constants as `@k`
//! references) with the target it was compiled for and a table of constants, and a data
//! section starting on a page boundary with every constant 64-byte aligned, so that
//! loading memory-maps the file and views the weights in place.
//!
//! Reading checks everything a damaged or hostile file could get wrong (magic, version,
//! section bounds, the index checksum, each constant's bounds, alignment, dtype and shape
//! against its use in the text) and says which; per-constant checksums are verified on
//! request ([`AimFile::verify`]), since that reads every byte.

use crate::{DType, Model, Tensor};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// The first 8 bytes of every `.aim` file.
pub const MAGIC: &[u8; 8] = b"AIMFILE\0";
/// The format version of a file with one program, which this build writes and reads.
pub const VERSION: u32 = 1;
/// The format version of a file with several programs over one data section (a package
/// for several targets, [`write_package`]), which this build writes and reads.
pub const VERSION_PACKAGE: u32 = 2;
/// Bytes of the fixed header.
pub const HEADER_BYTES: usize = 64;
/// Alignment of every constant in the data section.
pub const CONST_ALIGN: usize = 64;
/// Alignment of the data section's start (a page, so it can be mapped on its own).
pub const DATA_ALIGN: usize = 4096;

/// Why a `.aim` file could not be written, read or verified.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct AimFileError {
    /// The file.
    pub path: String,
    /// What is wrong with it.
    pub reason: String,
}

/// What a `.aim` file holds besides the program text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    /// Which graph the program is: `"optimized"` (the cpu pipeline's output for the
    /// recorded target, ready to run) or `"source"` (imported and type-inferred, compiled at
    /// load, for models with symbolic dims that are specialised per input shape).
    pub stage: String,
    /// The target it was compiled for, as key/value pairs (`arch`, `level`, `l1d`, ...).
    pub target: BTreeMap<String, String>,
    /// The aim version that wrote it.
    pub writer: String,
    /// The file it was compiled from.
    pub source: String,
    /// The arena layout the compiler planned for the program, where it recorded one (a
    /// runtime without the compiler — a shared object from `aim compile --target` — runs
    /// the program with it; loaders with the compiler plan again).
    pub plan: Option<ArenaPlan>,
}

/// Where the intermediates of a program live in its arena: the arena's size and each
/// placed value's offset and size in bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArenaPlan {
    /// Bytes of the arena.
    pub arena_bytes: usize,
    /// `(value, offset, bytes)` for every placed value.
    pub slots: Vec<(String, usize, usize)>,
}

/// An opened `.aim` file: one of its programs as a model (constants viewing the mapped
/// file), with the headers of every program it holds.
pub struct AimFile {
    /// The chosen program, with every `@k` constant a view of the mapped data section.
    pub model: Model,
    /// The chosen program's stage, target and provenance.
    pub header: Header,
    /// Every program's header, in file order (one, except in a package for several
    /// targets): what a loader chooses from, and what `aim info` lists.
    pub programs: Vec<Header>,
    /// The index in `programs` of the one read into `model`.
    pub chosen: usize,
    constants: Vec<Constant>,
    backing: Backing,
    data_off: usize,
}

/// The bytes a file's constants view.
#[derive(Clone)]
enum Backing {
    /// A memory map (a file on disk, or a copy made by [`parse_bytes`]).
    Map(Arc<memmap2::Mmap>),
    /// Bytes that live as long as the process: the read-only data of a loaded shared object.
    Static(&'static [u8]),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Static(b) => b,
        }
    }
}

/// One entry of the constant table.
#[derive(Clone, Debug)]
struct Constant {
    offset: usize,
    bytes: usize,
    dtype: DType,
    shape: Vec<usize>,
    fnv1a64: u64,
}

/// FNV-1a, 64-bit: the checksum of the index and of each constant (simple to restate in
/// any language; `FORMAT.md` gives it).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Whether `bytes` start like a `.aim` file (how loaders tell it from ONNX).
pub fn is_aim_file(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

fn align(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Writes `model` with `header` to `path` (replacing it): the program text with its
/// larger constants in the data section.
pub fn write(path: &Path, model: &Model, header: &Header) -> Result<(), AimFileError> {
    write_package(path, &[(model, header)]).map(|_| ())
}

/// How much of a package's data section one program reads ([`write_package`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramBytes {
    /// Bytes of the constants the program reads.
    pub read: usize,
    /// Bytes of those that no other program of the file reads.
    pub own: usize,
}

/// Writes several programs of one model to `path` (replacing it), each with its header,
/// over one data section in which equal constants are stored once (`aim compile --target
/// all`: a program per ISA level and architecture, sharing the weights their layouts agree
/// on). One program is written as [`write`] writes it (version [`VERSION`]); more, as
/// version [`VERSION_PACKAGE`].
/// Returns, per program, the bytes of constants it reads and of those no other program reads.
pub fn write_package(path: &Path, programs: &[(&Model, &Header)]) -> Result<Vec<ProgramBytes>, AimFileError> {
    let err = |reason: String| AimFileError { path: path.display().to_string(), reason };
    if path.is_dir() {
        return Err(err("is a directory; give the file to write".into()));
    }
    let tmp = path.with_extension("aim.partial");
    let file = std::fs::File::create(&tmp).map_err(|e| err(format!("cannot create {}: {e}", tmp.display())))?;
    let written = (|| {
        let mut w = std::io::BufWriter::new(file);
        let bytes = write_to(&mut w, programs)?;
        w.flush().map_err(|e| format!("write failed: {e}"))?;
        drop(w);
        std::fs::rename(&tmp, path).map_err(|e| format!("cannot move {} into place: {e}", tmp.display()))?;
        Ok(bytes)
    })();
    // No partial file is left behind on any error.
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(err)
}

/// The bytes of the `.aim` file [`write`] would write: what a shared object embeds.
pub fn to_bytes(model: &Model, header: &Header) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    write_to(&mut out, &[(model, header)])?;
    Ok(out)
}

/// The index entries of one program: its stage, target, arena plan and text.
fn program_entry(header: &Header, text: String) -> serde_json::Value {
    let mut p = serde_json::json!({ "stage": header.stage, "target": header.target, "program": text });
    if let Some(plan) = &header.plan {
        p["plan"] = serde_json::json!({
            "arena_bytes": plan.arena_bytes,
            "slots": plan.slots.iter().map(|(n, o, b)| serde_json::json!([n, o, b])).collect::<Vec<_>>(),
        });
    }
    p
}

/// Writes the file's bytes to `w`; returns what each program reads of them.
fn write_to(w: &mut impl Write, programs: &[(&Model, &Header)]) -> Result<Vec<ProgramBytes>, String> {
    let Some(&(_, first)) = programs.first() else {
        return Err("no program to write".into());
    };
    let models: Vec<&Model> = programs.iter().map(|&(m, _)| m).collect();
    let (texts, table) = crate::text::print_models_with_data(&models);
    let tensors = &table.tensors;
    let mut offset = 0usize;
    let mut entries = Vec::with_capacity(tensors.len());
    for (t, h) in tensors.iter().zip(&table.checksums) {
        let o = align(offset, CONST_ALIGN);
        let bytes = t.bytes();
        entries.push(serde_json::json!({
            "offset": o,
            "bytes": bytes.len(),
            "dtype": t.dtype().name(),
            "shape": t.shape(),
            "fnv1a64": format!("{h:016x}"),
        }));
        offset = o + bytes.len();
    }
    let mut entries_of = texts.into_iter().zip(programs).map(|(text, &(_, h))| program_entry(h, text));
    let (version, mut index) = if programs.len() == 1 {
        (VERSION, entries_of.next().expect("one program"))
    } else {
        (VERSION_PACKAGE, serde_json::json!({ "programs": entries_of.collect::<Vec<_>>() }))
    };
    index["writer"] = serde_json::json!(first.writer);
    index["source"] = serde_json::json!(first.source);
    index["constants"] = serde_json::json!(entries);
    let index = serde_json::to_vec(&index).map_err(|e| format!("cannot encode the index: {e}"))?;
    let index_off = HEADER_BYTES;
    let data_off = align(index_off + index.len(), DATA_ALIGN);
    let mut head = Vec::with_capacity(HEADER_BYTES);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&version.to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    for v in [index_off, index.len(), data_off, offset] {
        head.extend_from_slice(&(v as u64).to_le_bytes());
    }
    head.extend_from_slice(&fnv1a64(&index).to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes());
    let io = |e: std::io::Error| format!("write failed: {e}");
    w.write_all(&head).map_err(io)?;
    w.write_all(&index).map_err(io)?;
    w.write_all(&vec![0u8; data_off - index_off - index.len()]).map_err(io)?;
    let mut at = 0usize;
    for t in tensors {
        let o = align(at, CONST_ALIGN);
        w.write_all(&vec![0u8; o - at]).map_err(io)?;
        w.write_all(t.bytes()).map_err(io)?;
        at = o + t.bytes().len();
    }
    let mut bytes = vec![ProgramBytes { read: 0, own: 0 }; programs.len()];
    for (t, &users) in tensors.iter().zip(&table.users) {
        for (i, b) in bytes.iter_mut().enumerate() {
            if users & (1u64 << i.min(63)) != 0 {
                b.read += t.bytes().len();
                if users.count_ones() == 1 {
                    b.own += t.bytes().len();
                }
            }
        }
    }
    Ok(bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Chooses which of a file's programs to read, from their headers (file order): an index,
/// or why none fits (the error then names the file).
pub type Chooser<'a> = &'a dyn Fn(&[Header]) -> Result<usize, String>;

/// The first program (the only one, but in a package).
fn first(_: &[Header]) -> Result<usize, String> {
    Ok(0)
}

/// Opens a `.aim` file: maps it, checks its structure and builds the model of its first
/// program over the map.
pub fn read(path: &Path) -> Result<AimFile, AimFileError> {
    read_choosing(path, &first)
}

/// Opens a `.aim` file as [`read`] does, reading the program `choose` picks.
pub fn read_choosing(path: &Path, choose: Chooser<'_>) -> Result<AimFile, AimFileError> {
    let err = |reason: String| AimFileError { path: path.display().to_string(), reason };
    let file = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
    // SAFETY: the map is read-only; aim's files are not written while models use them
    // (as for ONNX external data, a file truncated underneath a running model is the
    // host's error).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))?;
    // Registered so that the pages of weights once packed are handed back
    // (`mapped::release_pages`), as for an ONNX file's.
    // Weights are read where the program needs them (a few rows of an embedding table, say),
    // not front to back: reading ahead would make the whole file resident.
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::Random);
    from_backing(Backing::Map(crate::mapped::register(map)), choose).map_err(err)
}

/// Parses a `.aim` image that lives as long as the process (the read-only data of a shared
/// object from `aim compile --target`): its constants view `bytes` in place. The image
/// must start on a page boundary for the data section's alignment to hold.
pub fn parse_static(bytes: &'static [u8]) -> Result<AimFile, String> {
    if !(bytes.as_ptr() as usize).is_multiple_of(DATA_ALIGN) {
        return Err(format!("the image at {:p} does not start on a {DATA_ALIGN}-byte boundary", bytes.as_ptr()));
    }
    from_backing(Backing::Static(bytes), &first)
}

/// Parses a `.aim` file held in memory (what [`read`] does after mapping; the fuzz target's
/// entry point).
pub fn parse_bytes(bytes: &[u8]) -> Result<AimFile, String> {
    let mut anon = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(|e| format!("cannot allocate: {e}"))?;
    anon[..bytes.len()].copy_from_slice(bytes);
    let map = anon.make_read_only().map_err(|e| format!("cannot seal: {e}"))?;
    from_backing_len(Backing::Map(Arc::new(map)), bytes.len(), &first)
}

fn from_backing(backing: Backing, choose: Chooser<'_>) -> Result<AimFile, String> {
    let len = backing.bytes().len();
    from_backing_len(backing, len, choose)
}

fn from_backing_len(backing: Backing, len: usize, choose: Chooser<'_>) -> Result<AimFile, String> {
    let b = &backing.bytes()[..len];
    if b.len() < HEADER_BYTES {
        return Err(format!("truncated: {} bytes, shorter than the {HEADER_BYTES}-byte header", b.len()));
    }
    if !is_aim_file(b) {
        return Err("not a .aim file (bad magic)".into());
    }
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if version != VERSION && version != VERSION_PACKAGE {
        return Err(format!(
            "format version {version}; this aim reads versions {VERSION} and {VERSION_PACKAGE} (compile the model again)"
        ));
    }
    let flags = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    if flags != 0 {
        return Err(format!("unknown header flags {flags:#x}"));
    }
    let field = |at: usize, what: &str| -> Result<usize, String> {
        usize::try_from(u64_at(b, at)).map_err(|_| format!("{what} {} does not fit this machine", u64_at(b, at)))
    };
    let (index_off, index_len) = (field(16, "index offset")?, field(24, "index length")?);
    let (data_off, data_len) = (field(32, "data offset")?, field(40, "data length")?);
    let within = |off: usize, n: usize| off.checked_add(n).is_some_and(|end| end <= b.len());
    if index_off < HEADER_BYTES || !within(index_off, index_len) {
        return Err(format!(
            "truncated or corrupt: the index ({index_len} bytes at {index_off}) is outside the file's {} bytes",
            b.len()
        ));
    }
    if !data_off.is_multiple_of(DATA_ALIGN) || data_off < index_off + index_len || !within(data_off, data_len) {
        return Err(format!(
            "truncated or corrupt: the data section ({data_len} bytes at {data_off}) is misplaced or outside the file's {} bytes",
            b.len()
        ));
    }
    let index = &b[index_off..index_off + index_len];
    if fnv1a64(index) != u64_at(b, 48) {
        return Err("corrupt: the index does not match its checksum".into());
    }
    let index: serde_json::Value =
        serde_json::from_slice(index).map_err(|e| format!("corrupt: the index is not valid JSON: {e}"))?;
    // Version 1 is one program whose entries sit in the index itself; version 2 lists them.
    let listed: Vec<&serde_json::Value> = if version == VERSION {
        vec![&index]
    } else {
        let list = index.get("programs").and_then(|p| p.as_array()).ok_or("the index has no 'programs' list")?;
        if list.is_empty() {
            return Err("the index's 'programs' list is empty".into());
        }
        list.iter().collect()
    };
    let top = |k: &str| -> Result<String, String> {
        index.get(k).and_then(|v| v.as_str()).map(str::to_string).ok_or_else(|| format!("the index has no '{k}'"))
    };
    let (writer, source) = (top("writer")?, top("source")?);
    let mut programs = Vec::with_capacity(listed.len());
    let mut texts = Vec::with_capacity(listed.len());
    for (i, p) in listed.iter().enumerate() {
        // Errors in a package name the program; a one-program file has only the one.
        let which = if version == VERSION { String::new() } else { format!("program {i}: ") };
        let text_of = |k: &str| -> Result<&str, String> {
            p.get(k).and_then(|v| v.as_str()).ok_or_else(|| format!("{which}the index has no '{k}'"))
        };
        let mut target = BTreeMap::new();
        if let Some(t) = p.get("target").and_then(|t| t.as_object()) {
            for (k, v) in t {
                let v = v.as_str().ok_or_else(|| format!("{which}target '{k}' is not a string"))?;
                target.insert(k.clone(), v.to_string());
            }
        }
        let plan = match p.get("plan") {
            None => None,
            Some(p) => Some(plan_of(p).ok_or_else(|| format!("{which}corrupt: the index's 'plan' is malformed"))?),
        };
        let stage = text_of("stage")?.to_string();
        texts.push(text_of("program")?);
        programs.push(Header { stage, target, writer: writer.clone(), source: source.clone(), plan });
    }
    let entries = index.get("constants").and_then(|c| c.as_array()).ok_or("the index has no 'constants' list")?;
    let mut constants = Vec::with_capacity(entries.len());
    for (k, e) in entries.iter().enumerate() {
        let num = |f: &str| -> Result<usize, String> {
            e.get(f)
                .and_then(|v| v.as_u64())
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| format!("constant {k}: bad or missing '{f}'"))
        };
        let (offset, bytes) = (num("offset")?, num("bytes")?);
        let dtype = e
            .get("dtype")
            .and_then(|v| v.as_str())
            .and_then(DType::from_name)
            .ok_or_else(|| format!("constant {k}: bad or missing 'dtype'"))?;
        let shape: Vec<usize> = e
            .get("shape")
            .and_then(|v| v.as_array())
            .and_then(|dims| dims.iter().map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok())).collect())
            .ok_or_else(|| format!("constant {k}: bad or missing 'shape'"))?;
        let fnv1a64 = e
            .get("fnv1a64")
            .and_then(|v| v.as_str())
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("constant {k}: bad or missing 'fnv1a64'"))?;
        if !offset.is_multiple_of(CONST_ALIGN) || offset.checked_add(bytes).is_none_or(|end| end > data_len) {
            return Err(format!(
                "truncated or corrupt: constant {k} ({bytes} bytes at {offset}) is misaligned or outside the data section's {data_len} bytes"
            ));
        }
        if crate::limits::bytes_of(dtype, &shape).ok() != Some(bytes) {
            return Err(format!("corrupt: constant {k} is {bytes} bytes, which is not {} {shape:?}", dtype.name()));
        }
        constants.push(Constant { offset, bytes, dtype, shape, fnv1a64 });
    }
    let chosen = choose(&programs)?;
    let program = *texts.get(chosen).ok_or_else(|| format!("there is no program {chosen}"))?;
    let resolve = |k: usize, dtype: DType, shape: &[usize]| -> Result<Tensor, String> {
        let c = constants.get(k).ok_or_else(|| format!("there are only {} constants", constants.len()))?;
        if c.dtype != dtype || c.shape != shape {
            return Err(format!(
                "the table has {} {:?}, the program wants {} {shape:?}",
                c.dtype.name(),
                c.shape,
                dtype.name()
            ));
        }
        match &backing {
            Backing::Map(map) => Tensor::from_mmap(dtype, shape, map.clone(), data_off + c.offset, c.bytes),
            Backing::Static(all) => {
                let bytes: &'static [u8] = &all[data_off + c.offset..data_off + c.offset + c.bytes];
                // SAFETY: the bytes live for the rest of the process and are never written
                // (a shared object's read-only data), and their alignment (64 within a
                // page-aligned image) suits every dtype.
                unsafe { Tensor::borrowed(dtype, shape, bytes.as_ptr(), bytes.len()) }
            }
        }
        .map_err(|e| e.to_string())
    };
    let model = crate::text::parse_model_with_data(program, &resolve)
        .map_err(|e| format!("corrupt: the program text does not parse: {e}"))?;
    let header = programs[chosen].clone();
    Ok(AimFile { model, header, programs, chosen, constants, backing, data_off })
}

/// An arena plan from its JSON form, `{"arena_bytes": n, "slots": [[name, offset, bytes]]}`.
fn plan_of(v: &serde_json::Value) -> Option<ArenaPlan> {
    let arena_bytes = usize::try_from(v.get("arena_bytes")?.as_u64()?).ok()?;
    let slots = v
        .get("slots")?
        .as_array()?
        .iter()
        .map(|s| {
            let a = s.as_array().filter(|a| a.len() == 3)?;
            let num = |x: &serde_json::Value| x.as_u64().and_then(|n| usize::try_from(n).ok());
            Some((a[0].as_str()?.to_string(), num(&a[1])?, num(&a[2])?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(ArenaPlan { arena_bytes, slots })
}

impl AimFile {
    /// Checks every constant against its checksum (reads the whole data section); the
    /// error names the first constant that does not match.
    pub fn verify(&self) -> Result<usize, String> {
        for (k, c) in self.constants.iter().enumerate() {
            let start = self.data_off + c.offset;
            if fnv1a64(&self.backing.bytes()[start..start + c.bytes]) != c.fnv1a64 {
                return Err(format!(
                    "constant {k} ({} {:?}, {} bytes at {}) does not match its checksum",
                    c.dtype.name(),
                    c.shape,
                    c.bytes,
                    start
                ));
            }
        }
        Ok(self.constants.len())
    }

    /// Bytes of constants in the data section.
    pub fn data_bytes(&self) -> usize {
        self.constants.iter().map(|c| c.bytes).sum()
    }
}

#[cfg(test)]
mod tests;
