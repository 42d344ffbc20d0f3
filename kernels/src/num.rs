//! The numeric element trait the generic kernels are written against, and dtype dispatch.

use aim_ir::Elem;
use half::{bf16, f16};

/// Arithmetic on one element type, with ONNX semantics: integers wrap, integer division
/// truncates toward zero (division by zero gives 0 rather than trapping), and half
/// precision types compute through f32.
pub trait Num: Elem + Copy + PartialOrd + Default + std::fmt::Debug {
    /// True for floating-point types.
    const FLOAT: bool;
    /// Converts to f64 (exact for every type but the largest 64-bit integers).
    fn to_f64(self) -> f64;
    /// Converts from f64, truncating toward zero and saturating for integer types.
    fn from_f64(v: f64) -> Self;
    /// Zero.
    fn zero() -> Self;
    /// One.
    fn one() -> Self;
    /// Addition (wrapping for integers).
    fn add(self, o: Self) -> Self;
    /// Subtraction (wrapping for integers).
    fn sub(self, o: Self) -> Self;
    /// Multiplication (wrapping for integers).
    fn mul(self, o: Self) -> Self;
    /// Division (truncating for integers, 0 on division by zero).
    fn div(self, o: Self) -> Self;
    /// True for NaN.
    fn is_nan(self) -> bool {
        false
    }
    /// Converts to i128 (floats truncate), for exact integer ops (Mod, bit ops).
    fn to_i128(self) -> i128;
    /// Converts from i128, wrapping for integers the way a C cast does.
    fn from_i128(v: i128) -> Self;
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const FLOAT: bool = false;
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn zero() -> Self { 0 }
            fn one() -> Self { 1 }
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn div(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_div(o) } }
            fn to_i128(self) -> i128 { self as i128 }
            fn from_i128(v: i128) -> Self { v as $t }
        }
    )*};
}
int_num!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const FLOAT: bool = true;
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn zero() -> Self { 0.0 }
            fn one() -> Self { 1.0 }
            fn add(self, o: Self) -> Self { self + o }
            fn sub(self, o: Self) -> Self { self - o }
            fn mul(self, o: Self) -> Self { self * o }
            fn div(self, o: Self) -> Self { self / o }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            fn to_i128(self) -> i128 { self as i128 }
            fn from_i128(v: i128) -> Self { v as $t }
        }
    )*};
}
float_num!(f32, f64);

macro_rules! half_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const FLOAT: bool = true;
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn zero() -> Self { <$t>::ZERO }
            fn one() -> Self { <$t>::ONE }
            fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            fn sub(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() - o.to_f32()) }
            fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            fn div(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() / o.to_f32()) }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            fn to_i128(self) -> i128 { self.to_f32() as i128 }
            fn from_i128(v: i128) -> Self { <$t>::from_f64(v as f64) }
        }
    )*};
}
half_num!(f16, bf16);

/// Runs `$body` with `$T` bound to the Rust type of a numeric dtype; bool yields the
/// `$bool` expression instead.
#[macro_export]
macro_rules! dispatch {
    ($dt:expr, $T:ident => $body:expr, bool => $bool:expr) => {
        match $dt {
            aim_ir::DType::F32 => { type $T = f32; $body }
            aim_ir::DType::F64 => { type $T = f64; $body }
            aim_ir::DType::F16 => { type $T = half::f16; $body }
            aim_ir::DType::BF16 => { type $T = half::bf16; $body }
            aim_ir::DType::I8 => { type $T = i8; $body }
            aim_ir::DType::I16 => { type $T = i16; $body }
            aim_ir::DType::I32 => { type $T = i32; $body }
            aim_ir::DType::I64 => { type $T = i64; $body }
            aim_ir::DType::U8 => { type $T = u8; $body }
            aim_ir::DType::U16 => { type $T = u16; $body }
            aim_ir::DType::U32 => { type $T = u32; $body }
            aim_ir::DType::U64 => { type $T = u64; $body }
            aim_ir::DType::Bool => $bool,
        }
    };
    ($dt:expr, $T:ident => $body:expr) => {
        $crate::dispatch!($dt, $T => $body, bool => { type $T = u8; $body })
    };
}
