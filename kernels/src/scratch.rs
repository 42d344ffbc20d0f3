//! Scratch buffers reused from call to call: the large temporaries of a kernel call (a
//! convolution's zero-padded input, Winograd's transformed tiles) come from a free list
//! kept by the calling thread instead of a fresh allocation, which for buffers of
//! megabytes costs page faults and zeroing on every run (measured: 2.5% of ResNet-50).
//!
//! A buffer's contents are unspecified when it is taken: the caller writes every element
//! it reads. New buffers are filled with NaN, so a kernel that reads what it did not write
//! shows in its results (the tests compare them).

use std::cell::RefCell;

/// Buffers kept per thread, in floats: more is freed when returned.
const KEEP: usize = 64 << 20 >> 2;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A scratch buffer of `len` floats, returned to this thread's free list when dropped.
pub struct Scratch {
    buf: Vec<f32>,
    len: usize,
}

/// Takes a buffer of `len` floats (contents unspecified): the smallest free one that is
/// large enough, else a new one.
pub fn take(len: usize) -> Scratch {
    let found = FREE.with(|f| {
        let mut f = f.borrow_mut();
        let best = f.iter().enumerate().filter(|(_, b)| b.len() >= len).min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
        best.map(|i| f.swap_remove(i))
    });
    Scratch { buf: found.unwrap_or_else(|| vec![f32::NAN; len]), len }
}

impl std::ops::Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // During thread teardown the list may be gone: the buffer is then just freed.
        let _ = FREE.try_with(|f| {
            let mut f = f.borrow_mut();
            f.push(buf);
            // Keep the largest buffers up to the cap.
            f.sort_by_key(|b| std::cmp::Reverse(b.len()));
            let mut total = 0;
            f.retain(|b| {
                total += b.len();
                total <= KEEP
            });
        });
    }
}

/// A scratch buffer of bytes (the integer kernels' quantized operands), from the same free
/// list: contents unspecified.
pub struct ScratchBytes {
    inner: Scratch,
    len: usize,
}

/// Takes a buffer of `len` bytes (contents unspecified).
pub fn take_bytes(len: usize) -> ScratchBytes {
    ScratchBytes { inner: take(len.div_ceil(4)), len }
}

impl std::ops::Deref for ScratchBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the float buffer holds at least `len` bytes; any bytes are valid u8.
        unsafe { std::slice::from_raw_parts(self.inner.as_ptr() as *const u8, self.len) }
    }
}

impl std::ops::DerefMut for ScratchBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`; the buffer is borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.inner.as_mut_ptr() as *mut u8, self.len) }
    }
}
