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

pub(crate) fn convert(t: &TensorProto, what: &str, ext: &mut ExternalFiles) -> Result<Tensor, ImportError> {
    let code = t.data_type();
    let dtype = DType::from_onnx_code(code)
        .ok_or_else(|| ImportError::DType { what: what.to_string(), dtype: DType::onnx_code_name(code).to_string() })?;
    let shape = dims_of(t, what)?;
    let n: usize = shape.iter().product();
    let bad = |reason: String| ImportError::BadTensor { what: what.to_string(), reason };
    if t.data_location() == super::proto::tensor_proto::DataLocation::External {
        let mut location = None;
        let mut offset = 0usize;
        let mut length = None;
        for kv in &t.external_data {
            let v = kv.value();
            let num =
                || v.parse::<usize>().map_err(|_| bad(format!("external data {} '{v}' is not a number", kv.key())));
            match kv.key() {
                "location" => location = Some(v.to_string()),
                "offset" => offset = num()?,
                "length" => length = Some(num()?),
                _ => {}
            }
        }
        let location = location.ok_or_else(|| bad("external data without a location".into()))?;
        let map = ext.map(what, &location)?;
        let len = length.unwrap_or(n * dtype.size());
        if len != n * dtype.size() {
            return Err(bad(format!("external data length {len} does not match {dtype}{shape:?}")));
        }
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(ImportError::ExternalData {
                what: what.into(),
                reason: format!(
                    "bytes {offset}..{} are past the end of '{location}' ({} bytes)",
                    offset + len,
                    map.len()
                ),
            });
        }
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
