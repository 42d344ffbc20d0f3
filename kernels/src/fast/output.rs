//! Where a fast kernel writes its output: memory the executor offers (a slot of its arena),
//! or a new tensor when there is none or it does not fit.

use aim_ir::{DType, Tensor};

/// Memory an executor offers for a kernel's first output, so that the kernel writes into
/// the executor's arena instead of allocating.
#[derive(Clone, Copy, Debug)]
pub struct OutSlot {
    ptr: *mut f32,
    len: usize,
}

impl OutSlot {
    /// A slot of `len` floats at `ptr`.
    ///
    /// # Safety
    /// `ptr` is 64-byte aligned and valid for reads and writes of `len` floats; nothing
    /// reads or writes them while the kernel runs (in particular, no input of the kernel
    /// overlaps them), and once it returns they are not written while a tensor the kernel
    /// returned over them (see [`Tensor::borrowed`]) lives.
    pub unsafe fn new(ptr: *mut f32, len: usize) -> OutSlot {
        OutSlot { ptr, len }
    }
}

/// An output being written.
pub(super) enum Output {
    /// The offered slot, and the output's shape.
    Slot(OutSlot, Vec<usize>),
    Owned(Tensor),
}

impl Output {
    /// Room for an output of `dtype` and `shape`: the slot `cx` offers when it is f32 of
    /// exactly that size, else a new tensor. A kernel makes one output this way.
    /// Fails when a new tensor of that size may not be allocated (see `aim_ir::limits`).
    pub(super) fn new(out: Option<OutSlot>, dtype: DType, shape: &[usize]) -> crate::util::Result<Output> {
        let n = crate::util::elements(shape)?;
        Ok(match out {
            Some(s) if dtype == DType::F32 && s.len == n => Output::Slot(s, shape.to_vec()),
            _ => {
                Output::Owned(Tensor::try_zeros(dtype, shape).map_err(|e| crate::KernelError(format!("output: {e}")))?)
            }
        })
    }

    /// The elements (of a 4-byte dtype) as f32 bit patterns, to write.
    pub(super) fn bits_mut(&mut self) -> &mut [f32] {
        match self {
            // SAFETY: the contract of `OutSlot::new`: valid, and used by this kernel alone.
            Output::Slot(s, _) => unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) },
            Output::Owned(t) => match t.dtype() {
                DType::F32 => t.data_mut::<f32>(),
                DType::I32 => bytemuck::cast_slice_mut(t.data_mut::<i32>()),
                DType::U32 => bytemuck::cast_slice_mut(t.data_mut::<u32>()),
                d => panic!("a 4-byte output was expected, not {d}"),
            },
        }
    }

    /// The output's bytes (any dtype), to write.
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: the contract of `OutSlot::new`: valid, and used by this kernel alone.
            Output::Slot(s, _) => unsafe { std::slice::from_raw_parts_mut(s.ptr as *mut u8, 4 * s.len) },
            Output::Owned(t) => t.bytes_mut(),
        }
    }

    /// The finished output as a tensor (over the slot, when it was written there).
    pub(super) fn finish(self) -> Tensor {
        match self {
            // SAFETY: the contract of `OutSlot::new` (the bytes outlive the tensor unchanged).
            Output::Slot(s, shape) => unsafe { Tensor::borrowed(DType::F32, &shape, s.ptr as *const u8, 4 * s.len) }
                .expect("the slot holds the shape"),
            Output::Owned(t) => t,
        }
    }
}
