//! Tensors: a dtype, a shape and 64-byte-aligned bytes that are owned, shared, or borrowed
//! from a memory-mapped file (weights stored as ONNX external data are never copied).

use crate::DType;
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;

/// The alignment of every owned tensor buffer: one cache line, and enough for AVX-512 loads.
pub const ALIGN: usize = 64;

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Block([u8; ALIGN]);

/// Where a tensor's bytes live.
enum Storage {
    /// An owned, 64-byte-aligned allocation.
    Owned { blocks: Vec<Block>, len: usize },
    /// A range of a read-only memory map (external weights); kept alive by the Arc.
    Mapped { map: Arc<memmap2::Mmap>, offset: usize, len: usize },
    /// Shared bytes, such as a tensor's `raw_data` sliced out of a memory-mapped model file.
    /// When they are not aligned for the element type, an aligned copy is made the first
    /// time the elements are viewed as typed values (never, for a model only inspected).
    Shared { bytes: bytes::Bytes, aligned: std::sync::OnceLock<Vec<Block>> },
    /// Memory owned by someone else (an executor's arena), valid and unchanged for as long
    /// as the tensor lives: see [`Tensor::borrowed`].
    Borrowed { ptr: *const u8, len: usize },
    /// Sub-byte codes packed column by column (`packed`, in `form`), read as their
    /// row-major u8 matrix: unpacked the first time the bytes are read.
    Codes { packed: Tensor, form: crate::ColumnCodes, rows: std::sync::OnceLock<Vec<Block>> },
}

// SAFETY: every variant is read-only shared data; `Borrowed` memory is, by the contract of
// `Tensor::borrowed`, valid and unwritten while any tensor over it lives, whatever thread
// reads it.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Owned { blocks, len } => &bytemuck::cast_slice::<Block, u8>(blocks)[..*len],
            Storage::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            Storage::Shared { bytes, .. } => bytes,
            // SAFETY: the contract of `Tensor::borrowed`.
            Storage::Borrowed { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Storage::Codes { packed, form, rows } => {
                let blocks = rows.get_or_init(|| match Storage::from_bytes(&form.unpack_rows(packed.bytes())) {
                    Storage::Owned { blocks, .. } => blocks,
                    _ => unreachable!("from_bytes makes owned storage"),
                });
                &bytemuck::cast_slice::<Block, u8>(blocks)[..form.k * form.n]
            }
        }
    }

    /// The bytes at an address aligned to `align` (copying shared bytes once if needed).
    fn aligned_bytes(&self, align: usize) -> &[u8] {
        match self {
            Storage::Shared { bytes, aligned } if !(bytes.as_ptr() as usize).is_multiple_of(align) => {
                let blocks = aligned.get_or_init(|| {
                    let mut s = Storage::from_bytes(bytes);
                    match std::mem::replace(&mut s, Storage::zeroed(0)) {
                        Storage::Owned { blocks, .. } => blocks,
                        _ => unreachable!("from_bytes makes owned storage"),
                    }
                });
                &bytemuck::cast_slice::<Block, u8>(blocks)[..bytes.len()]
            }
            _ => self.bytes(),
        }
    }

    fn zeroed(len: usize) -> Storage {
        Storage::Owned { blocks: vec![Block([0; ALIGN]); len.div_ceil(ALIGN)], len }
    }

    fn from_bytes(src: &[u8]) -> Storage {
        let mut s = Storage::zeroed(src.len());
        s.bytes_mut().copy_from_slice(src);
        s
    }

    /// Mutable bytes; only owned storage can be written (a mapped one is copied first by
    /// [`Tensor::bytes_mut`]).
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Storage::Owned { blocks, len } => &mut bytemuck::cast_slice_mut::<Block, u8>(blocks)[..*len],
            Storage::Mapped { .. } | Storage::Shared { .. } | Storage::Borrowed { .. } | Storage::Codes { .. } => {
                unreachable!("borrowed storage is copied before writing")
            }
        }
    }
}

/// A Rust type that can be the element of a tensor.
pub trait Elem: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype this Rust type stands for.
    const DTYPE: DType;
    /// Whether a tensor of `dt` can be viewed as a slice of this type (u8 also views bool).
    fn views(dt: DType) -> bool {
        dt == Self::DTYPE
    }
}

macro_rules! elem {
    ($($t:ty => $d:ident),*) => { $(impl Elem for $t { const DTYPE: DType = DType::$d; })* };
}
elem!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, i16 => I16, i32 => I32,
      i64 => I64, u16 => U16, u32 => U32, u64 => U64);
impl Elem for u8 {
    const DTYPE: DType = DType::U8;
    fn views(dt: DType) -> bool {
        dt == DType::U8 || dt == DType::Bool
    }
}

/// A dense, row-major tensor. Cloning is cheap (the bytes are shared); writing through
/// [`Tensor::bytes_mut`] or [`Tensor::data_mut`] copies them first if they are shared.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    storage: Arc<Storage>,
}

/// Why bytes could not be made into a tensor.
#[derive(Debug, thiserror::Error)]
#[error("tensor of {dtype}{shape:?} needs {} bytes, got {got}", expected.map_or("more than addressable".to_string(), |e| e.to_string()))]
pub struct SizeMismatch {
    /// The dtype asked for.
    pub dtype: DType,
    /// The shape asked for.
    pub shape: Vec<usize>,
    /// Bytes the dtype and shape need (`None`: the product of the dims overflows).
    pub expected: Option<usize>,
    /// Bytes given.
    pub got: usize,
}

/// Checks that `len` bytes are exactly a `dtype` tensor of `shape`.
fn check_len(dtype: DType, shape: &[usize], len: usize) -> Result<(), SizeMismatch> {
    match crate::limits::bytes_of(dtype, shape) {
        Ok(need) if need == len => Ok(()),
        need => Err(SizeMismatch { dtype, shape: shape.to_vec(), expected: need.ok(), got: len }),
    }
}

impl Tensor {
    /// A tensor of zeros (false for bool). Panics when the size is impossible or over the
    /// limit (a caller bug: shapes computed from data are checked with [`Tensor::try_zeros`]
    /// or [`crate::limits::check`] first).
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        match Tensor::try_zeros(dtype, shape) {
            Ok(t) => t,
            Err(e) => panic!("Tensor::zeros: {e}"),
        }
    }

    /// A tensor of zeros, or an error when its size overflows or is over the limit
    /// ([`crate::limits::max_tensor_bytes`]).
    pub fn try_zeros(dtype: DType, shape: &[usize]) -> Result<Tensor, crate::limits::SizeError> {
        let n = crate::limits::check(dtype, shape)?;
        Ok(Tensor { dtype, shape: shape.to_vec(), storage: Arc::new(Storage::zeroed(n * dtype.size())) })
    }

    /// A tensor over `len` bytes at `ptr` that it neither owns nor copies: how an executor
    /// hands values in its arena to kernels that take tensors. Writing through the tensor
    /// copies the bytes first, as for any shared tensor.
    ///
    /// # Safety
    /// `ptr` must be aligned for `dtype` and valid for reads of `len` bytes, and those bytes
    /// must not change, for as long as this tensor or any clone of it lives.
    pub unsafe fn borrowed(dtype: DType, shape: &[usize], ptr: *const u8, len: usize) -> Result<Tensor, SizeMismatch> {
        check_len(dtype, shape, len)?;
        Ok(Tensor { dtype, shape: shape.to_vec(), storage: Arc::new(Storage::Borrowed { ptr, len }) })
    }

    /// A tensor copied from little-endian bytes.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, SizeMismatch> {
        check_len(dtype, shape, bytes.len())?;
        Ok(Tensor { dtype, shape: shape.to_vec(), storage: Arc::new(Storage::from_bytes(bytes)) })
    }

    /// A tensor that borrows `len` bytes at `offset` of a memory map, without copying when
    /// the range is aligned for the dtype (else the bytes are copied into an aligned buffer).
    pub fn from_mmap(
        dtype: DType,
        shape: &[usize],
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    ) -> Result<Tensor, SizeMismatch> {
        check_len(dtype, shape, len)?;
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            let got = map.len().saturating_sub(offset);
            return Err(SizeMismatch { dtype, shape: shape.to_vec(), expected: Some(len), got });
        }
        let ptr = map.as_ptr() as usize + offset;
        if !ptr.is_multiple_of(dtype.size()) {
            return Tensor::from_bytes(dtype, shape, &map[offset..offset + len]);
        }
        Ok(Tensor { dtype, shape: shape.to_vec(), storage: Arc::new(Storage::Mapped { map, offset, len }) })
    }

    /// A tensor over shared bytes (e.g. `raw_data` of a memory-mapped model), without
    /// copying them (see [`Tensor::data`] for misaligned bytes).
    pub fn from_shared_bytes(dtype: DType, shape: &[usize], bytes: bytes::Bytes) -> Result<Tensor, SizeMismatch> {
        check_len(dtype, shape, bytes.len())?;
        let storage = Storage::Shared { bytes, aligned: std::sync::OnceLock::new() };
        Ok(Tensor { dtype, shape: shape.to_vec(), storage: Arc::new(storage) })
    }

    /// A tensor holding a copy of `data`.
    pub fn from_slice<T: Elem>(shape: &[usize], data: &[T]) -> Tensor {
        let n = crate::limits::elements(shape).ok();
        assert_eq!(n, Some(data.len()), "Tensor::from_slice: shape {shape:?} does not hold {} elements", data.len());
        Tensor {
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            storage: Arc::new(Storage::from_bytes(bytemuck::cast_slice(data))),
        }
    }

    /// A tensor made from a vector (copied once into aligned storage).
    pub fn from_vec<T: Elem>(shape: &[usize], data: Vec<T>) -> Tensor {
        Tensor::from_slice(shape, &data)
    }

    /// A bool tensor.
    pub fn from_bools(shape: &[usize], data: &[bool]) -> Tensor {
        let bytes: Vec<u8> = data.iter().map(|&b| b as u8).collect();
        let mut t = Tensor::from_slice(shape, &bytes);
        t.dtype = DType::Bool;
        t
    }

    /// A 0-d tensor.
    pub fn scalar<T: Elem>(v: T) -> Tensor {
        Tensor::from_slice(&[], &[v])
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The u8 `[k, n]` matrix of the codes that `packed` holds column by column in `form`
    /// (as `MatMulNBits` stores them), unpacked only when its bytes are first read: kernels
    /// that take the packed form read it through [`Tensor::column_codes`] instead.
    pub fn from_column_codes(packed: Tensor, form: crate::ColumnCodes) -> Result<Tensor, SizeMismatch> {
        let want = form.packed_len().filter(|&l| l == packed.bytes().len() && form.k.checked_mul(form.n).is_some());
        if want.is_none() {
            let (dtype, shape) = (DType::U8, vec![form.n, form.blocks(), form.blob()]);
            return Err(SizeMismatch { dtype, shape, expected: form.packed_len(), got: packed.bytes().len() });
        }
        let storage = Storage::Codes { packed, form, rows: std::sync::OnceLock::new() };
        Ok(Tensor { dtype: DType::U8, shape: vec![form.k, form.n], storage: Arc::new(storage) })
    }

    /// The packed bytes and their form, for a tensor made by [`Tensor::from_column_codes`].
    pub fn column_codes(&self) -> Option<(&[u8], crate::ColumnCodes)> {
        match &*self.storage {
            Storage::Codes { packed, form, .. } => Some((packed.bytes(), *form)),
            _ => None,
        }
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Writable bytes (copies shared or mapped storage first).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let unique_owned = matches!(Arc::get_mut(&mut self.storage), Some(Storage::Owned { .. }));
        if !unique_owned {
            self.storage = Arc::new(Storage::from_bytes(self.storage.bytes()));
        }
        Arc::get_mut(&mut self.storage).expect("storage was just made unique").bytes_mut()
    }

    /// Whether the bytes are borrowed (from a memory-mapped file or shared buffer) rather
    /// than owned.
    pub fn is_borrowed(&self) -> bool {
        !matches!(*self.storage, Storage::Owned { .. })
    }

    /// The bytes at an address aligned to `align` (at most [`ALIGN`]): for kernels that view
    /// them as typed elements. Shared bytes that are not aligned (a constant's `raw_data`
    /// in a mapped model file) are copied to an aligned buffer on first use.
    pub fn aligned_bytes(&self, align: usize) -> &[u8] {
        self.storage.aligned_bytes(align)
    }

    /// The elements as a slice of `T`; `None` if `T` is not this tensor's dtype. Shared
    /// bytes that are not aligned for `T` are copied to an aligned buffer on first use.
    pub fn try_data<T: Elem>(&self) -> Option<&[T]> {
        if !T::views(self.dtype) {
            return None;
        }
        bytemuck::try_cast_slice(self.storage.aligned_bytes(std::mem::align_of::<T>())).ok()
    }

    /// The elements as a slice of `T`. Panics on a dtype mismatch, which is a bug in the
    /// caller (kernels check dtypes before they look at data).
    pub fn data<T: Elem>(&self) -> &[T] {
        match self.try_data() {
            Some(d) => d,
            None => panic!("tensor of {} viewed as {}", self.dtype, T::DTYPE),
        }
    }

    /// The elements as a mutable slice of `T` (see [`Tensor::data`]).
    pub fn data_mut<T: Elem>(&mut self) -> &mut [T] {
        assert!(T::views(self.dtype), "tensor of {} viewed as {}", self.dtype, T::DTYPE);
        bytemuck::cast_slice_mut(self.bytes_mut())
    }

    /// The same data with another shape of the same element count.
    pub fn reshaped(&self, shape: &[usize]) -> Tensor {
        assert_eq!(crate::limits::elements(shape).ok(), Some(self.len()), "reshape must keep the element count");
        Tensor { dtype: self.dtype, shape: shape.to_vec(), storage: self.storage.clone() }
    }

    /// Every element converted to f64 (bool as 0/1), for printing and comparisons.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self.dtype {
            DType::F32 => self.data::<f32>().iter().map(|&x| x as f64).collect(),
            DType::F64 => self.data::<f64>().to_vec(),
            DType::F16 => self.data::<f16>().iter().map(|x| x.to_f64()).collect(),
            DType::BF16 => self.data::<bf16>().iter().map(|x| x.to_f64()).collect(),
            DType::I8 => self.data::<i8>().iter().map(|&x| x as f64).collect(),
            DType::I16 => self.data::<i16>().iter().map(|&x| x as f64).collect(),
            DType::I32 => self.data::<i32>().iter().map(|&x| x as f64).collect(),
            DType::I64 => self.data::<i64>().iter().map(|&x| x as f64).collect(),
            DType::U8 | DType::Bool => self.data::<u8>().iter().map(|&x| x as f64).collect(),
            DType::U16 => self.data::<u16>().iter().map(|&x| x as f64).collect(),
            DType::U32 => self.data::<u32>().iter().map(|&x| x as f64).collect(),
            DType::U64 => self.data::<u64>().iter().map(|&x| x as f64).collect(),
        }
    }

    /// Integer elements as i64 (bool as 0/1; floats truncated), for shape-like inputs.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match self.dtype {
            DType::I64 => self.data::<i64>().to_vec(),
            DType::I32 => self.data::<i32>().iter().map(|&x| x as i64).collect(),
            DType::U64 => self.data::<u64>().iter().map(|&x| x as i64).collect(),
            _ => self.to_f64_vec().into_iter().map(|x| x as i64).collect(),
        }
    }

    /// A tensor of `dtype` from f64 values (rounded or saturated the way `as` casts do).
    pub fn from_f64(dtype: DType, shape: &[usize], v: &[f64]) -> Tensor {
        match dtype {
            DType::F32 => Tensor::from_vec(shape, v.iter().map(|&x| x as f32).collect()),
            DType::F64 => Tensor::from_slice(shape, v),
            DType::F16 => Tensor::from_vec(shape, v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => Tensor::from_vec(shape, v.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::I8 => Tensor::from_vec(shape, v.iter().map(|&x| x as i8).collect()),
            DType::I16 => Tensor::from_vec(shape, v.iter().map(|&x| x as i16).collect()),
            DType::I32 => Tensor::from_vec(shape, v.iter().map(|&x| x as i32).collect()),
            DType::I64 => Tensor::from_vec(shape, v.iter().map(|&x| x as i64).collect()),
            DType::U8 => Tensor::from_vec(shape, v.iter().map(|&x| x as u8).collect()),
            DType::U16 => Tensor::from_vec(shape, v.iter().map(|&x| x as u16).collect()),
            DType::U32 => Tensor::from_vec(shape, v.iter().map(|&x| x as u32).collect()),
            DType::U64 => Tensor::from_vec(shape, v.iter().map(|&x| x as u64).collect()),
            DType::Bool => Tensor::from_bools(shape, &v.iter().map(|&x| x != 0.0).collect::<Vec<_>>()),
        }
    }

    /// An i64 tensor, the type of shapes and indices.
    pub fn from_i64(shape: &[usize], v: Vec<i64>) -> Tensor {
        Tensor::from_vec(shape, v)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}{:?}", self.dtype, self.shape)?;
        if self.len() <= 8 {
            write!(f, " {:?}", self.to_f64_vec())?;
        }
        f.write_str(")")
    }
}

impl PartialEq for Tensor {
    /// Same dtype, shape and bytes.
    fn eq(&self, other: &Tensor) -> bool {
        self.dtype == other.dtype && self.shape == other.shape && self.bytes() == other.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_shared_bytes_are_viewed_through_an_aligned_copy() {
        // A constant's raw_data at an odd offset of the model file, as protobuf lays it out.
        let mut file = vec![0u8; 1 + 12];
        file[1..].copy_from_slice(bytemuck::cast_slice(&[7i32, -3, 11]));
        let t = Tensor::from_shared_bytes(DType::I32, &[3], bytes::Bytes::from(file).slice(1..)).unwrap();
        let b = t.aligned_bytes(4);
        assert_eq!(b.as_ptr() as usize % 4, 0);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(b), [7, -3, 11]);
        assert_eq!(t.data::<i32>(), [7, -3, 11]);
    }

    #[test]
    fn owned_storage_is_aligned_and_copy_on_write() {
        let a = Tensor::from_slice(&[2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
        assert_eq!(a.bytes().as_ptr() as usize % ALIGN, 0);
        let mut b = a.clone();
        b.data_mut::<f32>()[0] = 9.0;
        assert_eq!(a.data::<f32>()[0], 1.0);
        assert_eq!(b.data::<f32>()[0], 9.0);
    }

    #[test]
    fn misaligned_shared_bytes_are_viewed_through_an_aligned_copy() {
        let mut raw = vec![0u8; 1];
        raw.extend(bytemuck::cast_slice::<f32, u8>(&[1.0, 2.0, 3.0]));
        let b = bytes::Bytes::from(raw).slice(1..);
        let t = Tensor::from_shared_bytes(DType::F32, &[3], b).unwrap();
        assert!(t.is_borrowed());
        assert_eq!(t.data::<f32>(), &[1.0, 2.0, 3.0]);
        assert_eq!(t.bytes().len(), 12);
    }

    #[test]
    fn size_mismatch_is_an_error() {
        assert!(Tensor::from_bytes(DType::F32, &[3], &[0; 8]).is_err());
    }

    #[test]
    fn bool_is_viewed_as_u8() {
        let t = Tensor::from_bools(&[3], &[true, false, true]);
        assert_eq!(t.dtype(), DType::Bool);
        assert_eq!(t.data::<u8>(), &[1, 0, 1]);
        assert!(t.try_data::<i8>().is_none());
    }
}
