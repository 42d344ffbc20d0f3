//! Denormal floats flushed to zero while a program runs.
//!
//! A multiply or add with a denormal operand or result takes a microcode assist on x86-64
//! (about a hundred times slower), and real models carry denormals: weights that training
//! drove towards zero (PP-OCRv6's detector holds 256,000 of them; one 1×1 convolution of it
//! took 177 ms instead of about 3) and activations that decay. TensorFlow and OpenVINO run
//! with flush-to-zero; so does aim's cpu backend: FTZ and DAZ in MXCSR on x86-64, FZ in
//! FPCR on AArch64, set on the pool's workers for good and on the calling thread for the
//! length of a run (restored after, so the host application's arithmetic is untouched). A
//! value below 1.2e-38 becomes 0: far under any tolerance the outputs are compared with.

/// Flush-to-zero for this thread until the guard is dropped, which restores the previous mode.
pub struct FlushToZero {
    saved: Option<u64>,
}

impl FlushToZero {
    /// Sets flush-to-zero (and denormals-are-zero where the ISA has it) on this thread.
    pub fn new() -> FlushToZero {
        FlushToZero { saved: set() }
    }
}

impl Default for FlushToZero {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FlushToZero {
    fn drop(&mut self) {
        if let Some(v) = self.saved {
            restore(v);
        }
    }
}

/// Sets the mode on this thread for good (the pool's workers run only kernels).
pub fn flush_this_thread() {
    set();
}

#[cfg(target_arch = "x86_64")]
fn set() -> Option<u64> {
    let mut old: u32 = 0;
    // SAFETY: stmxcsr/ldmxcsr read and write this thread's SSE control register only; bits
    // 15 (FTZ) and 6 (DAZ) change how denormals are treated, nothing else.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut old, options(nostack));
        let new = old | (1 << 15) | (1 << 6);
        std::arch::asm!("ldmxcsr [{}]", in(reg) &new, options(nostack, readonly));
    }
    Some(old as u64)
}

#[cfg(target_arch = "x86_64")]
fn restore(v: u64) {
    let v = v as u32;
    // SAFETY: writes back the value read by `set` on this thread.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, readonly)) };
}

#[cfg(target_arch = "aarch64")]
fn set() -> Option<u64> {
    let old: u64;
    // SAFETY: reads and writes this thread's FPCR; bit 24 (FZ) flushes denormals to zero.
    unsafe {
        std::arch::asm!("mrs {}, fpcr", out(reg) old, options(nostack));
        std::arch::asm!("msr fpcr, {}", in(reg) old | (1 << 24), options(nostack));
    }
    Some(old)
}

#[cfg(target_arch = "aarch64")]
fn restore(v: u64) {
    // SAFETY: writes back the value read by `set` on this thread.
    unsafe { std::arch::asm!("msr fpcr, {}", in(reg) v, options(nostack)) };
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn set() -> Option<u64> {
    None
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn restore(_: u64) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A denormal product is 0 under the guard and denormal again after it.
    #[test]
    fn flushes_inside_the_guard_only() {
        // Each product from fresh opaque operands: the compiler may not reuse one for the other.
        let product = || std::hint::black_box(1e-30f32) * std::hint::black_box(1e-10f32);
        {
            let _g = FlushToZero::new();
            if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
                assert_eq!(std::hint::black_box(product()), 0.0);
            }
        }
        assert!(std::hint::black_box(product()) > 0.0);
    }
}
