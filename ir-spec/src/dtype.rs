//! Element types of tensors, with their ONNX codes and text names.

use std::fmt;

/// The element type of a tensor. The set is ONNX's numeric types plus bool; strings,
/// complex numbers and the 8/4-bit float formats are refused at import with a clear error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order (used by the text parser and by tests).
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// Size of one element in bytes (bool is stored as one byte, 0 or 1).
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The short name used by the text format (`f32`, `i64`, `bool`...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
        }
    }

    /// Parses a name written by [`DType::name`].
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == s)
    }

    /// The `TensorProto.DataType` code ONNX uses for this type.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
        }
    }

    /// The dtype of an ONNX `TensorProto.DataType` code, or `None` for types aim does not
    /// support (string, complex, float8, 4-bit types).
    pub fn from_onnx_code(code: i32) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.onnx_code() == code)
    }

    /// The ONNX name of a data type code, for error messages about unsupported types.
    pub fn onnx_code_name(code: i32) -> &'static str {
        match code {
            0 => "UNDEFINED",
            8 => "STRING",
            14 => "COMPLEX64",
            15 => "COMPLEX128",
            17 => "FLOAT8E4M3FN",
            18 => "FLOAT8E4M3FNUZ",
            19 => "FLOAT8E5M2",
            20 => "FLOAT8E5M2FNUZ",
            21 => "UINT4",
            22 => "INT4",
            23 => "FLOAT4E2M1",
            24 => "FLOAT8E8M0",
            25 => "UINT2",
            26 => "INT2",
            c => DType::from_onnx_code(c).map(|d| d.name()).unwrap_or("unknown"),
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// True for the signed and unsigned integer types (not bool).
    pub fn is_int(self) -> bool {
        !self.is_float() && self != DType::Bool
    }

    /// True for the signed integer types.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
