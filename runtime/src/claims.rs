//! The handshake of one parallel loop: which indices are handed out, and which workers are
//! still inside the loop's closure — both in one atomic word.
//!
//! # Why the caller can free the closure once `idle()` is true
//!
//! The word holds `inside << INSIDE_SHIFT | next`: every operation on the loop (a worker
//! entering, a claim of indices, a worker leaving, the caller's reads) is an access to this
//! one location, so all of them are ordered by its modification order on any CPU, weakly
//! ordered ones (AArch64, POWER) included — no reasoning across locations, and no `SeqCst`,
//! is needed. A worker enters (`inside + 1`) before it claims and leaves (`inside − 1`,
//! release) after its last call. The caller claims until a claim finds `next ≥ n`, then waits
//! until a read (acquire) sees `inside = 0`:
//!
//! - A worker whose entry comes before the caller's last claim in the modification order is
//!   counted in every later value until it leaves, so the caller's read — which comes after
//!   its own claim — sees `inside = 0` only after that worker left. Its release and the
//!   caller's acquire make every write of its calls visible to the caller.
//! - A worker whose entry comes after the caller's last claim makes its own claims after
//!   that too: a read-modify-write reads the latest value, `next ≥ n`, so it gets nothing
//!   and never calls the closure.
//!
//! `tests::loom_model` checks this with loom's model of the C11 memory model
//! (`RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p aim-loom-check
//! --release`, which compiles this file alone, with loom's atomics).

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of the word below the count of workers inside: the next index.
const INSIDE_SHIFT: u32 = 40;
const ONE_INSIDE: u64 = 1 << INSIDE_SHIFT;
const NEXT: u64 = ONE_INSIDE - 1;

/// The most indices one loop may hand out (the rest of the word counts workers).
pub(crate) const MAX_INDICES: usize = 1 << (INSIDE_SHIFT - 1);

/// The claim counter of one loop over `0..n`.
pub(crate) struct Claims {
    word: AtomicU64,
    n: u64,
}

impl Claims {
    /// A loop over `0..n` (`n ≤ MAX_INDICES`).
    pub(crate) fn new(n: usize) -> Claims {
        assert!(n <= MAX_INDICES, "a loop of {n} indices is more than the claim counter holds");
        Claims { word: AtomicU64::new(0), n: n as u64 }
    }

    /// A worker enters the loop (before any claim).
    pub(crate) fn enter(&self) {
        self.word.fetch_add(ONE_INSIDE, Ordering::Acquire);
    }

    /// Claims the next `chunk` indices, or `None` once all are handed out. Each thread stops
    /// at its first `None`, so `next` passes `n` by at most one chunk per thread.
    pub(crate) fn claim(&self, chunk: usize) -> Option<std::ops::Range<usize>> {
        let start = self.word.fetch_add(chunk as u64, Ordering::AcqRel) & NEXT;
        (start < self.n).then(|| start as usize..(start + chunk as u64).min(self.n) as usize)
    }

    /// Hands out no more indices (after a panic, or once the caller is done).
    pub(crate) fn close(&self) {
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            if cur & NEXT >= self.n {
                return;
            }
            let closed = (cur & !NEXT) | self.n;
            match self.word.compare_exchange_weak(cur, closed, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// A worker leaves the loop (after its last call).
    pub(crate) fn leave(&self) {
        self.word.fetch_sub(ONE_INSIDE, Ordering::Release);
    }

    /// Whether no worker is inside: once the caller's own claim found nothing left, nothing
    /// will call the closure any more (see the module doc).
    pub(crate) fn idle(&self) -> bool {
        self.word.load(Ordering::Acquire) >> INSIDE_SHIFT == 0
    }
}

#[cfg(all(test, loom))]
mod tests {
    use super::Claims;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// A worker and the caller share a loop of two indices; index i writes its own output
    /// (cell i), and once the caller sees the loop idle it reads both and frees "the
    /// closure" (writes every cell). loom checks every interleaving and memory ordering
    /// for a race on the cells: a worker writing after the caller returned, or the caller
    /// reading an output not yet visible.
    #[test]
    fn loom_model() {
        loom::model(|| {
            let claims = Arc::new(Claims::new(2));
            let cells: Arc<[UnsafeCell<u32>; 2]> = Arc::new([UnsafeCell::new(0), UnsafeCell::new(0)]);
            let run = |claims: &Claims, cells: &[UnsafeCell<u32>; 2]| {
                while let Some(r) = claims.claim(1) {
                    for i in r {
                        // SAFETY: loom checks this access against all the others.
                        cells[i].with_mut(|c| unsafe { *c = i as u32 + 1 });
                    }
                }
            };
            let worker = {
                let (claims, cells) = (claims.clone(), cells.clone());
                loom::thread::spawn(move || {
                    claims.enter();
                    run(&claims, &cells);
                    claims.leave();
                })
            };
            run(&claims, &cells);
            while !claims.idle() {
                loom::thread::yield_now();
            }
            for (i, cell) in cells.iter().enumerate() {
                // SAFETY: as above: the worker must be done with every cell by now.
                cell.with_mut(|c| unsafe {
                    assert_eq!(*c, i as u32 + 1, "output {i} was written and is visible");
                    *c = u32::MAX;
                });
            }
            worker.join().unwrap();
        });
    }
}

#[cfg(all(test, loom))]
mod old_protocol {
    //! The handshake as it was before: the next index and the workers inside in two
    //! separate atomics, claims `Relaxed`. It is the store-buffering pattern — each side
    //! writes one location, then reads the other — so on a weakly ordered CPU the caller
    //! may read `inside = 0` while a worker that already entered goes on to claim an index
    //! and run it after the caller returned. loom finds that execution.
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::Arc;

    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_finds_the_race_in_the_old_handshake() {
        loom::model(|| {
            let next = Arc::new(AtomicUsize::new(0));
            let inside = Arc::new(AtomicUsize::new(0));
            let cell = Arc::new(UnsafeCell::new(0u32));
            let worker = {
                let (next, inside, cell) = (next.clone(), inside.clone(), cell.clone());
                loom::thread::spawn(move || {
                    inside.fetch_add(1, Ordering::AcqRel);
                    while next.fetch_add(1, Ordering::Relaxed) < 1 {
                        // SAFETY: loom checks this access.
                        cell.with_mut(|c| unsafe { *c = 1 });
                    }
                    inside.fetch_sub(1, Ordering::AcqRel);
                })
            };
            while next.fetch_add(1, Ordering::Relaxed) < 1 {
                cell.with_mut(|c| unsafe { *c = 1 });
            }
            while inside.load(Ordering::Acquire) != 0 {
                loom::thread::yield_now();
            }
            // The caller returns: the closure (the cell) is freed.
            cell.with_mut(|c| unsafe { *c = u32::MAX });
            worker.join().unwrap();
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn claims_hand_out_each_index_once_and_stop() {
        let c = Claims::new(5);
        c.enter();
        assert_eq!(c.claim(2), Some(0..2));
        assert_eq!(c.claim(2), Some(2..4));
        assert_eq!(c.claim(2), Some(4..5));
        assert_eq!(c.claim(2), None);
        assert!(!c.idle());
        c.leave();
        assert!(c.idle());
        let c = Claims::new(10);
        assert_eq!(c.claim(3), Some(0..3));
        c.close();
        assert_eq!(c.claim(3), None);
    }
}
