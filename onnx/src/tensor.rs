//! `TensorProto` → [`Tensor`]: typed fields, raw little-endian bytes, or external data
//! memory-mapped from a file next to the model.

use super::proto::TensorProto;
use super::ImportError;
use aim_ir::{DType, Tensor};
use half::{bf16, f16};
use memmap2::Mmap;
use prost::Message;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Memory maps of external data files, shared by all tensors that live in one file.
#[derive(Default)]
pub(crate) struct ExternalFiles {
    /// The directory the model file is in; external paths are relative to it.
    pub base: Option<PathBuf>,
    maps: HashMap<PathBuf, Arc<Mmap>>,
}

impl ExternalFiles {
    pub(crate) fn new(base: Option<PathBuf>) -> ExternalFiles {
        ExternalFiles { base, maps: HashMap::new() }
    }

    fn map(&mut self, what: &str, location: &str) -> Result<Arc<Mmap>, ImportError> {
        let ext = |reason: String| ImportError::ExternalData { what: what.to_string(), reason };
        let rel = Path::new(location);
        if location.is_empty() || rel.is_absolute() {
            return Err(ext(format!("location '{location}' must be a relative path")));
        }
        if rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
            return Err(ext(format!("location '{location}' may not leave the model's directory ('..' is refused)")));
        }
        let Some(base) = &self.base else {
            return Err(ext("the model was not loaded from a file, so external data cannot be found".into()));
        };
        let path = base.join(rel);
        if let Some(m) = self.maps.get(&path) {
            return Ok(m.clone());
        }
        // A symlink inside the directory may point anywhere: the file's real path must
        // still lie under the model's real directory.
        let real = path.canonicalize().map_err(|e| ext(format!("cannot open {}: {e}", path.display())))?;
        let real_base = base.canonicalize().map_err(|e| ext(format!("cannot resolve {}: {e}", base.display())))?;
        if !real.starts_with(&real_base) {
            return Err(ext(format!(
                "location '{location}' resolves to {}, outside the model's directory (through a symlink)",
                real.display()
            )));
        }
        let file = std::fs::File::open(&real).map_err(|e| ext(format!("cannot open {}: {e}", path.display())))?;
        // SAFETY: the map is read-only; aim never writes to it. As with every mmap, a file
        // truncated by another process while mapped is outside what the program can guard.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ext(format!("cannot map {}: {e}", path.display())))?;
        let map = aim_ir::mapped::register(map);
        self.maps.insert(path, map.clone());
        Ok(map)
    }
}

fn dims_of(t: &TensorProto, what: &str) -> Result<Vec<usize>, ImportError> {
    let mut total: usize = 1;
    let mut out = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(ImportError::BadTensor { what: what.into(), reason: format!("negative dimension {d}") });
        }
        total = total.checked_mul(d as usize).filter(|&n| n < (1 << 40)).ok_or_else(|| ImportError::BadTensor {
            what: what.into(),
            reason: format!("dimensions {:?} are too large", t.dims),
        })?;
        out.push(d as usize);
    }
    Ok(out)
}

/// Decodes one serialized `TensorProto` (the `input_N.pb` files of ONNX test cases).
pub fn decode_tensor_proto(bytes: &[u8], what: &str) -> Result<(String, Tensor), ImportError> {
    let t = TensorProto::decode(bytes::Bytes::copy_from_slice(bytes))
        .map_err(|e| ImportError::Decode { what: what.to_string(), reason: format!("not a TensorProto: {e}") })?;
    let tensor = tensor_from_proto(&t, what)?;
    Ok((t.name().to_string(), tensor))
}

/// Converts a `TensorProto` that has no external data.
pub fn tensor_from_proto(t: &TensorProto, what: &str) -> Result<Tensor, ImportError> {
    convert(t, what, &mut ExternalFiles::new(None))
}

/// A tensor's external data: the file's map and the byte range, checked against the
/// `expected` length (of `shape`, for messages).
fn external(
    t: &TensorProto,
    what: &str,
    ext: &mut ExternalFiles,
    expected: usize,
    shape: &str,
) -> Result<(Arc<Mmap>, usize, usize), ImportError> {
    let bad = |reason: String| ImportError::BadTensor { what: what.to_string(), reason };
    let mut location = None;
    let mut offset = 0usize;
    let mut length = None;
    for kv in &t.external_data {
        let v = kv.value();
        let num = || v.parse::<usize>().map_err(|_| bad(format!("external data {} '{v}' is not a number", kv.key())));
        match kv.key() {
            "location" => location = Some(v.to_string()),
            "offset" => offset = num()?,
            "length" => length = Some(num()?),
            _ => {}
        }
    }
    let location = location.ok_or_else(|| bad("external data without a location".into()))?;
    let map = ext.map(what, &location)?;
    let len = length.unwrap_or(expected);
    if len != expected {
        return Err(bad(format!("external data length {len} does not match {shape}")));
    }
    if offset.checked_add(len).is_none_or(|end| end > map.len()) {
        return Err(ImportError::ExternalData {
            what: what.into(),
            reason: format!("bytes {offset}..{} are past the end of '{location}' ({} bytes)", offset + len, map.len()),
        });
    }
    Ok((map, offset, len))
}

/// ONNX's 4-bit integer types (UINT4 = 21, INT4 = 22): held one value per byte, as
/// U8 / I8 (their values unchanged; QuantizeLinear to them saturates to the 4-bit range).
pub(crate) fn four_bit(code: i32) -> Option<DType> {
    match code {
        21 => Some(DType::U8),
        22 => Some(DType::I8),
        _ => None,
    }
}

/// A 4-bit tensor's packed bytes (two values a byte, the first in the low nibble) unpacked
/// one a byte (sign-extended for INT4).
fn unpack4(dtype: DType, shape: &[usize], packed: &[u8], what: &str) -> Result<Tensor, ImportError> {
    let n: usize = shape.iter().product();
    if packed.len() != n.div_ceil(2) {
        return Err(ImportError::BadTensor {
            what: what.to_string(),
            reason: format!("{n} 4-bit values take {} bytes, the proto holds {}", n.div_ceil(2), packed.len()),
        });
    }
    let signed = dtype == DType::I8;
    let bytes: Vec<u8> = (0..n)
        .map(|i| {
            let v = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
            if signed && v >= 8 {
                (v as i8 - 16) as u8
            } else {
                v
            }
        })
        .collect();
    Tensor::from_bytes(dtype, shape, &bytes)
        .map_err(|e| ImportError::BadTensor { what: what.to_string(), reason: e.to_string() })
}

pub(crate) fn convert(t: &TensorProto, what: &str, ext: &mut ExternalFiles) -> Result<Tensor, ImportError> {
    let code = t.data_type();
    if let Some(dtype) = four_bit(code) {
        let shape = dims_of(t, what)?;
        let packed: Vec<u8> = if t.data_location() == super::proto::tensor_proto::DataLocation::External {
            let n: usize = shape.iter().product();
            let (map, offset, len) = external(t, what, ext, n.div_ceil(2), &format!("{n} 4-bit values"))?;
            map[offset..offset + len].to_vec()
        } else if let Some(raw) = &t.raw_data {
            raw.to_vec()
        } else {
            t.int32_data.iter().map(|&v| v as u8).collect()
        };
        return unpack4(dtype, &shape, &packed, what);
    }
    let dtype = DType::from_onnx_code(code)
        .ok_or_else(|| ImportError::DType { what: what.to_string(), dtype: DType::onnx_code_name(code).to_string() })?;
    let shape = dims_of(t, what)?;
    let n: usize = shape.iter().product();
    let bad = |reason: String| ImportError::BadTensor { what: what.to_string(), reason };
    if t.data_location() == super::proto::tensor_proto::DataLocation::External {
        let (map, offset, len) = external(t, what, ext, n * dtype.size(), &format!("{dtype}{shape:?}"))?;
        return Tensor::from_mmap(dtype, &shape, map, offset, len).map_err(|e| bad(e.to_string()));
    }
    if let Some(raw) = &t.raw_data {
        return Tensor::from_shared_bytes(dtype, &shape, raw.clone()).map_err(|e| bad(e.to_string()));
    }
    let count = |len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(bad(format!("{dtype}{shape:?} needs {n} values, the proto holds {len}")))
        }
    };
    Ok(match dtype {
        DType::F32 => {
            count(t.float_data.len())?;
            Tensor::from_slice(&shape, &t.float_data)
        }
        DType::F64 => {
            count(t.double_data.len())?;
            Tensor::from_slice(&shape, &t.double_data)
        }
        DType::I64 => {
            count(t.int64_data.len())?;
            Tensor::from_slice(&shape, &t.int64_data)
        }
        DType::U64 | DType::U32 => {
            count(t.uint64_data.len())?;
            let v: Vec<f64> = t.uint64_data.iter().map(|&x| x as f64).collect();
            if dtype == DType::U64 {
                Tensor::from_slice(&shape, &t.uint64_data)
            } else {
                Tensor::from_f64(dtype, &shape, &v)
            }
        }
        DType::F16 => {
            count(t.int32_data.len())?;
            Tensor::from_vec(&shape, t.int32_data.iter().map(|&x| f16::from_bits(x as u16)).collect())
        }
        DType::BF16 => {
            count(t.int32_data.len())?;
            Tensor::from_vec(&shape, t.int32_data.iter().map(|&x| bf16::from_bits(x as u16)).collect())
        }
        DType::I32 => {
            count(t.int32_data.len())?;
            Tensor::from_slice(&shape, &t.int32_data)
        }
        DType::I8 | DType::I16 | DType::U8 | DType::U16 | DType::Bool => {
            count(t.int32_data.len())?;
            let v: Vec<f64> = t.int32_data.iter().map(|&x| x as f64).collect();
            Tensor::from_f64(dtype, &shape, &v)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four_bit_proto(code: i32, dims: &[i64], raw: Option<Vec<u8>>, ints: Vec<i32>) -> TensorProto {
        TensorProto {
            dims: dims.to_vec(),
            data_type: Some(code),
            raw_data: raw.map(bytes::Bytes::from),
            int32_data: ints,
            ..TensorProto::default()
        }
    }

    #[test]
    fn four_bit_tensors_unpack_one_value_a_byte() {
        // INT4 [3]: 7, -8, -1 packed low nibble first, the last byte half used.
        let t = tensor_from_proto(&four_bit_proto(22, &[3], Some(vec![0x87, 0x0F]), vec![]), "w").unwrap();
        assert_eq!((t.dtype(), t.data::<i8>()), (DType::I8, &[7i8, -8, -1][..]));
        // UINT4 from int32_data (one packed byte per entry).
        let t = tensor_from_proto(&four_bit_proto(21, &[2, 2], None, vec![0x21, 0xF3]), "w").unwrap();
        assert_eq!((t.dtype(), t.data::<u8>()), (DType::U8, &[1u8, 2, 3, 15][..]));
        // A packed length that does not fit the shape is an error naming the tensor.
        let e = tensor_from_proto(&four_bit_proto(22, &[5], Some(vec![0; 2]), vec![]), "init 'w'").unwrap_err();
        assert!(e.to_string().contains("init 'w'") && e.to_string().contains("take 3 bytes"), "{e}");
    }
}
