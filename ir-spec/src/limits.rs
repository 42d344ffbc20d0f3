//! Tensor sizes: overflow-checked element counts, and the one limit on how large a tensor
//! aim will allocate.
//!
//! Architecture invariant: every [`Tensor`](crate::Tensor) that exists has a shape whose
//! element count fits in `usize` and whose bytes exist, so products over an existing
//! tensor's dims never overflow. A shape computed from data or attributes (a kernel's
//! output, an `.npy` header, an initializer's dims, `ConstantOfShape`'s input) is checked
//! here — with [`elements`] or [`check`] — before anything is allocated for it: an
//! impossible size is an error naming the value, and a possible but huge one is refused
//! against [`max_tensor_bytes`] instead of aborting the process on allocation.
//!
//! The limit is process-wide (kernels have no per-model context): `AIM_MAX_TENSOR_BYTES`
//! in the environment, else half the machine's physical memory, and
//! [`set_max_tensor_bytes`] (which `aim::Options::max_tensor_bytes` calls on load).

use crate::DType;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Why a tensor of some shape cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizeError {
    /// The product of the dims does not fit in a machine word.
    #[error("shape {shape:?} has more elements than can be addressed (the product of its dims overflows)")]
    Overflow {
        /// The dims.
        shape: Vec<usize>,
    },
    /// The tensor would be larger than the limit.
    #[error("a {dtype}{shape:?} tensor would take {} bytes, over the limit of {} bytes (set AIM_MAX_TENSOR_BYTES to raise it)", .bytes, .limit)]
    TooLarge {
        /// Its element type.
        dtype: DType,
        /// The dims.
        shape: Vec<usize>,
        /// Bytes it would take.
        bytes: u128,
        /// The limit in force.
        limit: usize,
    },
}

/// The product of `shape`, or an error if it overflows.
pub fn elements(shape: &[usize]) -> Result<usize, SizeError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| SizeError::Overflow { shape: shape.to_vec() })
}

/// The bytes a `dtype` tensor of `shape` takes, if that is possible at all (no limit).
pub fn bytes_of(dtype: DType, shape: &[usize]) -> Result<usize, SizeError> {
    elements(shape)?.checked_mul(dtype.size()).ok_or_else(|| SizeError::Overflow { shape: shape.to_vec() })
}

/// Checks that a `dtype` tensor of `shape` may be allocated: its size is computable and
/// within [`max_tensor_bytes`]. Returns its element count.
pub fn check(dtype: DType, shape: &[usize]) -> Result<usize, SizeError> {
    let n = elements(shape)?;
    let bytes = n as u128 * dtype.size() as u128;
    let limit = max_tensor_bytes();
    if bytes > limit as u128 {
        return Err(SizeError::TooLarge { dtype, shape: shape.to_vec(), bytes, limit });
    }
    Ok(n)
}

/// Checks a count of `elems` elements of `elem_bytes` bytes each against the limit (for
/// buffers that are not tensors yet, such as a kernel's scratch or a growing list).
pub fn check_count(elems: usize, elem_bytes: usize) -> Result<(), SizeError> {
    let bytes = elems as u128 * elem_bytes as u128;
    let limit = max_tensor_bytes();
    if bytes > limit as u128 {
        return Err(SizeError::TooLarge { dtype: DType::U8, shape: vec![elems, elem_bytes], bytes, limit });
    }
    Ok(())
}

/// 0 until first read: then the environment's or the default limit, or what was set.
static MAX_TENSOR_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The largest tensor, in bytes, aim allocates (see the module doc for where it comes from).
pub fn max_tensor_bytes() -> usize {
    match MAX_TENSOR_BYTES.load(Ordering::Relaxed) {
        0 => {
            let v = std::env::var("AIM_MAX_TENSOR_BYTES")
                .ok()
                .and_then(|s| parse_bytes(&s))
                .filter(|&v| v > 0)
                .unwrap_or_else(default_limit);
            // A concurrent first read computes the same value; whichever store lands is it.
            let _ = MAX_TENSOR_BYTES.compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed);
            MAX_TENSOR_BYTES.load(Ordering::Relaxed)
        }
        v => v,
    }
}

/// Sets the limit for the whole process (0 restores the default).
pub fn set_max_tensor_bytes(bytes: usize) {
    MAX_TENSOR_BYTES.store(bytes, Ordering::Relaxed);
}

/// `123`, `64K`, `512M`, `2G` (binary multiples).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1usize << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        b'T' | b't' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

/// Half the physical memory (Linux: `MemTotal` of /proc/meminfo), else 8 GiB.
fn default_limit() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<usize>().ok()?.checked_mul(1024)
    });
    total.map_or(8 << 30, |t| t / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_and_huge_shapes_are_errors() {
        assert_eq!(elements(&[2, 3, 4]), Ok(24));
        assert_eq!(elements(&[]), Ok(1));
        assert!(matches!(elements(&[1 << 62, 4, 4]), Err(SizeError::Overflow { .. })));
        assert!(matches!(bytes_of(DType::F32, &[(1 << 62) + 1, 4]), Err(SizeError::Overflow { .. })));
        assert!(matches!(check(DType::F32, &[1 << 20, 1 << 20]), Err(SizeError::TooLarge { .. })));
        assert_eq!(check(DType::F32, &[0, 1 << 40]), Ok(0));
    }

    #[test]
    fn byte_counts_parse_with_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64K"), Some(65536));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("x"), None);
    }
}
