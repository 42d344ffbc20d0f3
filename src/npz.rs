//! Reading and writing `.npz` archives (numpy's `np.savez`): a zip of `.npy` files, one per
//! array, keyed by name. The `.npy` format is small enough to read directly: a magic
//! string, a Python-dict header (`descr`, `fortran_order`, `shape`) and the raw data.

use aim_ir::{DType, Tensor};
use std::io::{Read, Write};
use std::path::Path;

/// An error reading or writing an `.npz` file, naming the file and array.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {msg}")]
pub struct NpzError {
    /// The archive.
    pub path: String,
    /// What went wrong (naming the array where one is concerned).
    pub msg: String,
}

/// The dtype of a numpy `descr` and whether its bytes are big-endian.
fn descr_dtype(descr: &str) -> Option<(DType, bool)> {
    let mut chars = descr.chars();
    let order = chars.next()?;
    let code = chars.as_str();
    let big = match order {
        '>' => !code.ends_with('1'),
        '<' | '|' | '=' => false,
        _ => return None,
    };
    let dt = match code {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "b1" => DType::Bool,
        _ => return None,
    };
    Some((dt, big))
}

fn dtype_descr(d: DType) -> &'static str {
    match d {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::BF16 => "<V2",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
    }
}

/// Value of `key` in the header dict, as the raw text up to the next top-level comma.
fn header_field<'a>(h: &'a str, key: &str) -> Option<&'a str> {
    let at = h.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = h[at..].trim_start().strip_prefix(':')?.trim_start();
    if let Some(r) = rest.strip_prefix('(') {
        return Some(&r[..r.find(')')?]);
    }
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim().trim_matches('\''))
}

/// Parses one `.npy` file's bytes.
pub fn parse_npy(bytes: &[u8]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy array (bad magic)".into());
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!(".npy version {v} is not supported")),
    };
    let header = bytes.get(start..start + hlen).ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text")?;
    let descr = header_field(header, "descr").ok_or("the .npy header has no descr")?;
    let (dtype, big_endian) = descr_dtype(descr).ok_or_else(|| format!("numpy dtype '{descr}' is not supported"))?;
    let fortran = match header_field(header, "fortran_order") {
        Some("True") => true,
        Some("False") | None => false,
        Some(v) => return Err(format!("bad fortran_order ({v})")),
    };
    let shape_s = header_field(header, "shape").ok_or("the .npy header has no shape")?;
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse().map_err(|_| format!("bad shape ({shape_s})")))
        .collect::<Result<_, _>>()?;
    let data = &bytes[start + hlen..];
    let need = aim_ir::limits::bytes_of(dtype, &shape).map_err(|e| format!("impossible shape ({shape_s}): {e}"))?;
    if data.len() < need {
        return Err(format!("array data is truncated: {} bytes for {dtype}{shape:?}", data.len()));
    }
    let mut raw = data[..need].to_vec();
    if big_endian {
        // Stored most significant byte first: reverse each element's bytes.
        for e in raw.chunks_exact_mut(dtype.size()) {
            e.reverse();
        }
    }
    if !fortran || shape.len() < 2 {
        return Tensor::from_bytes(dtype, &shape, &raw).map_err(|e| e.to_string());
    }
    // Column-major data is the row-major array of the reversed shape, transposed back.
    let reversed: Vec<usize> = shape.iter().rev().copied().collect();
    let t = Tensor::from_bytes(dtype, &reversed, &raw).map_err(|e| e.to_string())?;
    let perm: Vec<usize> = (0..shape.len()).rev().collect();
    aim_kernels::util::transpose(&t, &perm).map_err(|e| e.to_string())
}

/// Serialises a tensor as a `.npy` file (version 1, header padded to 64 bytes).
pub fn write_npy(t: &Tensor) -> Vec<u8> {
    let shape = match t.shape() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        s => format!("({})", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}", dtype_descr(t.dtype()));
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(t.bytes());
    out
}

/// Reads every array of an `.npz` file, in archive order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>, NpzError> {
    let e = |msg: String| NpzError { path: path.display().to_string(), msg };
    let file = std::fs::File::open(path).map_err(|x| e(format!("cannot open: {x}")))?;
    read_archive(file, &path.display().to_string())
}

/// Reads every array of an `.npz` held in memory (`what` names it in errors): for inputs
/// that do not come from a file, and the fuzz target.
pub fn read_npz_bytes(bytes: &[u8], what: &str) -> Result<Vec<(String, Tensor)>, NpzError> {
    read_archive(std::io::Cursor::new(bytes), what)
}

fn read_archive<R: Read + std::io::Seek>(r: R, what: &str) -> Result<Vec<(String, Tensor)>, NpzError> {
    let e = |msg: String| NpzError { path: what.to_string(), msg };
    let mut zip = zip::ZipArchive::new(r).map_err(|x| e(format!("not an .npz (zip) archive: {x}")))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).map_err(|x| e(format!("cannot read entry {i}: {x}")))?;
        let name = f.name().trim_end_matches(".npy").to_string();
        // The archive states each entry's size: refuse one over the tensor limit before
        // reading it, and never read more than it states.
        let size = f.size();
        let limit = aim_ir::limits::max_tensor_bytes() as u64;
        if size > limit.saturating_add(1 << 20) {
            return Err(e(format!("array '{name}': {size} bytes, over the tensor limit of {limit} bytes")));
        }
        let mut bytes = Vec::new();
        (&mut f).take(size).read_to_end(&mut bytes).map_err(|x| e(format!("array '{name}': {x}")))?;
        let t = parse_npy(&bytes).map_err(|m| e(format!("array '{name}': {m}")))?;
        out.push((name, t));
    }
    Ok(out)
}

/// Writes arrays to an `.npz` file (uncompressed, like `np.savez`).
pub fn write_npz(path: &Path, arrays: &[(String, Tensor)]) -> Result<(), NpzError> {
    let e = |msg: String| NpzError { path: path.display().to_string(), msg };
    let file = std::fs::File::create(path).map_err(|x| e(format!("cannot create: {x}")))?;
    let mut zip = zip::ZipWriter::new(file);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored).large_file(true);
    for (name, t) in arrays {
        zip.start_file(format!("{name}.npy"), opts).map_err(|x| e(format!("array '{name}': {x}")))?;
        zip.write_all(&write_npy(t)).map_err(|x| e(format!("array '{name}': {x}")))?;
    }
    zip.finish().map_err(|x| e(x.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trips() {
        for t in [
            Tensor::from_slice(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]),
            Tensor::scalar(7i64),
            Tensor::from_bools(&[3], &[true, false, true]),
        ] {
            assert_eq!(parse_npy(&write_npy(&t)).unwrap(), t);
        }
    }

    /// The header of a `.npy` file with the given dict text, then `data`.
    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut h = header.to_string();
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((h.len() as u16).to_le_bytes());
        out.extend(h.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn an_overflowing_shape_is_an_error() {
        let b = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387905, 4), }", &[0; 64]);
        let e = parse_npy(&b).unwrap_err();
        assert!(e.contains("impossible shape"), "{e}");
    }

    #[test]
    fn fortran_order_and_big_endian_arrays_are_converted() {
        // np.asfortranarray([[1, 2, 3], [4, 5, 6]], dtype='>i4'): column-major, big-endian.
        let data: Vec<u8> = [1i32, 4, 2, 5, 3, 6].iter().flat_map(|v| v.to_be_bytes()).collect();
        let b = npy("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }", &data);
        let t = parse_npy(&b).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.data::<i32>(), &[1, 2, 3, 4, 5, 6]);
        let data: Vec<u8> = [1.5f64, -2.0].iter().flat_map(|v| v.to_be_bytes()).collect();
        let t = parse_npy(&npy("{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", &data)).unwrap();
        assert_eq!(t.data::<f64>(), &[1.5, -2.0]);
    }

    #[test]
    fn a_descr_of_any_text_is_parsed_or_refused() {
        // A multi-byte first character once split a string inside it (found by fuzzing).
        for descr in ["م4", "<", "", "<f", "ñf4", ">f4"] {
            let b = npy(&format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (1,), }}"), &[0; 4]);
            let _ = parse_npy(&b);
        }
    }

    #[test]
    fn bad_npy_is_an_error() {
        assert!(parse_npy(b"hello").is_err());
        let mut b = write_npy(&Tensor::from_slice(&[4], &[1.0f32; 4]));
        b.truncate(b.len() - 3);
        assert!(parse_npy(&b).unwrap_err().contains("truncated"));
    }
}
