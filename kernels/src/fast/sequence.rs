//! What the recurrent fast kernels (LSTM, GRU, RNN) share: reading a node's operands into
//! one description of the sequence — steps, batch, sizes, directions, layout — with the
//! checks that send other configurations to the reference kernel, and where each step's
//! state goes in the outputs.

use aim_ir::{DType, Node, Tensor};

/// A recurrent node's operands and sizes.
pub(super) struct Seq<'a> {
    pub x: &'a Tensor,
    pub w: &'a Tensor,
    pub r: &'a Tensor,
    /// `[dirs, 2·gates·hidden]`, if given.
    pub bias: Option<&'a Tensor>,
    pub t_len: usize,
    pub batch: usize,
    pub input: usize,
    pub dirs: usize,
    pub hidden: usize,
    /// `layout = 1`: X and Y batch-major.
    pub batch_first: bool,
    direction: String,
}

impl<'a> Seq<'a> {
    /// X, W `[dirs, gates·h, input]`, R `[dirs, gates·h, h]` and B `[dirs, 2·gates·h]` of
    /// f32 (W and R of 8 bits with `dynamic_quantize`), sequence lengths (if given) all the whole sequence; None otherwise.
    pub fn parse(n: &Node, ins: &'a [Option<Tensor>], gates: usize) -> Option<Seq<'a>> {
        let f32_at = |i: usize| ins.get(i).and_then(|t| t.as_ref()).filter(|t| t.dtype() == DType::F32);
        // An LSTM of DynamicQuantizeLSTM's holds its weights in 8 bits (see `qrecurrent`).
        let weight_at = |i: usize| {
            if crate::qrecurrent::dynamic_quantize(n) {
                ins.get(i).and_then(|t| t.as_ref()).filter(|t| matches!(t.dtype(), DType::I8 | DType::U8))
            } else {
                f32_at(i)
            }
        };
        let (x, w, r) = (f32_at(0)?, weight_at(1)?, weight_at(2)?);
        if x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
            return None;
        }
        let batch_first = n.int("layout", 0) != 0;
        let (t_len, batch, input) = if batch_first {
            (x.shape()[1], x.shape()[0], x.shape()[2])
        } else {
            (x.shape()[0], x.shape()[1], x.shape()[2])
        };
        let (dirs, hidden) = (w.shape()[0], r.shape()[2]);
        let direction = n.string("direction", "forward").to_string();
        let fits = (direction == "bidirectional") == (dirs == 2)
            && w.shape()[1..] == [gates * hidden, input]
            && r.shape() == [dirs, gates * hidden, hidden]
            && n.opt_int("hidden_size").is_none_or(|h| h as usize == hidden);
        if !fits {
            return None;
        }
        if let Some(lens) = ins.get(4).and_then(|t| t.as_ref()) {
            if lens.len() != batch || lens.to_i64_vec().iter().any(|&l| l != t_len as i64) {
                return None;
            }
        }
        let bias = f32_at(3).filter(|b| b.shape() == [dirs, 2 * gates * hidden]);
        if ins.get(3).is_some_and(|b| b.is_some()) && bias.is_none() {
            return None;
        }
        Some(Seq { x, w, r, bias, t_len, batch, input, dirs, hidden, batch_first, direction })
    }

    /// Initial state input `i`: absent, or f32 `[dirs, batch, hidden]`; None for another
    /// shape (the reference kernel takes those).
    pub fn state<'b>(&self, ins: &'b [Option<Tensor>], i: usize) -> Option<Option<&'b Tensor>> {
        match ins.get(i).and_then(|t| t.as_ref()) {
            None => Some(None),
            Some(t) => {
                (t.dtype() == DType::F32 && t.shape() == [self.dirs, self.batch, self.hidden]).then_some(Some(t))
            }
        }
    }

    /// Direction `d`'s initial state (zeros if none was given).
    pub fn initial(&self, t: Option<&Tensor>, d: usize) -> Vec<f32> {
        let n = self.batch * self.hidden;
        t.map_or(vec![0.0; n], |t| t.data::<f32>()[d * n..(d + 1) * n].to_vec())
    }

    /// Whether direction `d` runs from the last step to the first.
    pub fn reverse(&self, d: usize) -> bool {
        self.direction == "reverse" || d == 1
    }

    /// The shape of Y.
    pub fn y_shape(&self) -> Vec<usize> {
        let (t, b, d, h) = (self.t_len, self.batch, self.dirs, self.hidden);
        if self.batch_first {
            vec![b, t, d, h]
        } else {
            vec![t, d, b, h]
        }
    }

    /// The shape of the final states.
    pub fn state_shape(&self) -> Vec<usize> {
        if self.batch_first {
            vec![self.batch, self.dirs, self.hidden]
        } else {
            vec![self.dirs, self.batch, self.hidden]
        }
    }

    /// The row of X (and of the input projection) of step `t`, sequence `bi`.
    pub fn x_row(&self, t: usize, bi: usize) -> usize {
        if self.batch_first {
            bi * self.t_len + t
        } else {
            t * self.batch + bi
        }
    }

    /// Where step `t`'s state of sequence `bi`, direction `d`, starts in Y.
    pub fn y_at(&self, t: usize, bi: usize, d: usize) -> usize {
        let h = self.hidden;
        if self.batch_first {
            ((bi * self.t_len + t) * self.dirs + d) * h
        } else {
            ((t * self.dirs + d) * self.batch + bi) * h
        }
    }

    /// Where the final state of sequence `bi`, direction `d`, starts in a state output.
    pub fn state_at(&self, bi: usize, d: usize) -> usize {
        if self.batch_first {
            (bi * self.dirs + d) * self.hidden
        } else {
            (d * self.batch + bi) * self.hidden
        }
    }
}

/// The multiply-adds of a product (a step's, or a short sequence's input projection)
/// below which it runs on the calling thread: waking the other threads costs more than it
/// saves (a 2-thread speech VAD step measured 0.029 ms against 0.021 ms on one).
pub(super) const STEP_PARALLEL_MACS: usize = 1 << 20;

/// `par` for a product of `macs` multiply-adds, or the calling thread alone below
/// [`STEP_PARALLEL_MACS`].
pub(super) fn parallel_for(macs: usize, par: &dyn crate::gemm::Parallel) -> &dyn crate::gemm::Parallel {
    if macs < STEP_PARALLEL_MACS {
        &crate::gemm::Sequential
    } else {
        par
    }
}

/// One direction's recurrence, resumable between steps: it holds its state (and scratch)
/// so that [`by_direction`] can run it a few steps at a time on whichever thread is free.
pub(super) trait Recurrence: Send {
    /// Runs steps `steps` (counted in the direction's own order: step 0 is the last time
    /// step of a reverse direction), each step's products on `par`.
    fn run(&mut self, steps: std::ops::Range<usize>, par: &dyn crate::gemm::Parallel);
}

/// Runs every direction's `t_len` steps and returns the directions (their final states) in
/// order. When a step (`step_macs` multiply-adds) is too small to share between threads (see
/// [`parallel_for`]) and there are two directions and two threads, the directions run side
/// by side, each step's product on one thread; otherwise one after the other, with the
/// step's product shared through [`parallel_for`].
///
/// Side by side, a direction is not bound to a thread: a thread that has finished its own
/// direction waits for the other's current step and takes over the rest of it. On a machine
/// whose other core is busy with another process, the thread there runs at a fraction of
/// the speed, and a static split of one direction per thread made two threads 1.2× slower
/// than one (a bidirectional LSTM tagger); with the handover the free core does what the
/// slowed one has not reached.
pub(super) fn by_direction<R: Recurrence>(
    dirs: Vec<R>,
    t_len: usize,
    step_macs: usize,
    par: &dyn crate::gemm::Parallel,
) -> Vec<R> {
    if dirs.len() == 2 && par.threads() >= 2 && step_macs < STEP_PARALLEL_MACS && t_len > 1 {
        side_by_side(dirs, t_len, par)
    } else {
        let step_par = parallel_for(step_macs, par);
        let mut dirs = dirs;
        dirs.iter_mut().for_each(|r| r.run(0..t_len, step_par));
        dirs
    }
}

/// [`by_direction`]'s side-by-side schedule: task `i` starts on direction `i`, runs it a
/// step at a time while no other task is idle, and hands it over (returns) when one is; an
/// idle task takes over any unfinished direction that no task holds.
fn side_by_side<R: Recurrence>(dirs: Vec<R>, t_len: usize, par: &dyn crate::gemm::Parallel) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Mutex, TryLockError};
    let n = dirs.len();
    let slots: Vec<Mutex<R>> = dirs.into_iter().map(Mutex::new).collect();
    // The next step of each direction (t_len when done); written by its lock's holder.
    let next: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    let idle = AtomicUsize::new(0);
    let all_done = || next.iter().all(|s| s.load(Ordering::Acquire) >= t_len);
    // An unfinished direction no task holds, `first` preferred, locked.
    let claim = |first: usize| {
        (0..n).map(|k| (first + k) % n).find_map(|d| {
            if next[d].load(Ordering::Acquire) >= t_len {
                return None;
            }
            let guard = match slots[d].try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return None,
            };
            (next[d].load(Ordering::Acquire) < t_len).then_some((d, guard))
        })
    };
    par.for_each(n, &|i| loop {
        let (d, mut r) = match claim(i) {
            Some(c) => c,
            None => {
                idle.fetch_add(1, Ordering::AcqRel);
                let mut spins = 0u32;
                let claimed = loop {
                    if all_done() {
                        break None;
                    }
                    if let Some(c) = claim(i) {
                        break Some(c);
                    }
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                };
                idle.fetch_sub(1, Ordering::AcqRel);
                match claimed {
                    Some(c) => c,
                    None => return,
                }
            }
        };
        loop {
            let s = next[d].load(Ordering::Acquire);
            if s >= t_len {
                break;
            }
            r.run(s..s + 1, &crate::gemm::Sequential);
            next[d].store(s + 1, Ordering::Release);
            if s + 1 < t_len && idle.load(Ordering::Acquire) > 0 {
                // Another task is idle: it takes over from here (this one may be the
                // thread on a busy core).
                return;
            }
        }
    });
    slots.into_iter().map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).collect()
}

/// Y's values, which the directions' recurrences write at disjoint places (each its own
/// direction's states), perhaps from two threads at once.
#[derive(Clone, Copy)]
pub(super) struct SharedY(*mut f32, usize);
// SAFETY: writers keep to disjoint places (see `write`).
unsafe impl Send for SharedY {}
unsafe impl Sync for SharedY {}

impl SharedY {
    /// Y's values.
    pub fn new(y: &mut [f32]) -> SharedY {
        SharedY(y.as_mut_ptr(), y.len())
    }

    /// Copies `src` to Y from `at` on. Panics outside Y.
    ///
    /// # Safety
    /// No other thread reads or writes `at..at + src.len()` meanwhile, and Y outlives the
    /// call.
    pub unsafe fn write(&self, at: usize, src: &[f32]) {
        assert!(at + src.len() <= self.1, "Y holds every step's state");
        std::slice::from_raw_parts_mut(self.0.add(at), src.len()).copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::{by_direction, Recurrence};
    use crate::gemm::{Parallel, Sequential};
    use std::time::Duration;

    /// A recurrence that records which steps it ran and on which thread, slowed on the
    /// thread named `slow`.
    struct Record {
        ran: Vec<(usize, String)>,
    }

    impl Recurrence for Record {
        fn run(&mut self, steps: std::ops::Range<usize>, _: &dyn Parallel) {
            for s in steps {
                let name = std::thread::current().name().unwrap_or("").to_string();
                if name == "slow" {
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.ran.push((s, name));
            }
        }
    }

    /// Task `i` on a thread of its own, named "fast" (task 0) or "slow" (task 1).
    struct Named;

    impl Parallel for Named {
        fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            std::thread::scope(|s| {
                for i in 0..n {
                    let name = if i == 0 { "fast" } else { "slow" };
                    std::thread::Builder::new().name(name.into()).spawn_scoped(s, move || f(i)).unwrap();
                }
            });
        }
        fn threads(&self) -> usize {
            2
        }
    }

    /// Both tasks on the calling thread, one after the other (a pool whose other thread
    /// has not woken yet).
    struct OneAfterOther;

    impl Parallel for OneAfterOther {
        fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            (0..n).for_each(f)
        }
        fn threads(&self) -> usize {
            2
        }
    }

    fn dirs(n: usize) -> Vec<Record> {
        (0..n).map(|_| Record { ran: Vec::new() }).collect()
    }

    fn steps(r: &Record) -> Vec<usize> {
        r.ran.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn every_step_runs_once_in_order_under_every_schedule() {
        let pools: [&dyn Parallel; 3] = [&Sequential, &OneAfterOther, &Named];
        for par in pools {
            for n in [1, 2] {
                for t_len in [1, 2, 7] {
                    let out = by_direction(dirs(n), t_len, 10, par);
                    assert_eq!(out.len(), n);
                    for r in &out {
                        assert_eq!(steps(r), (0..t_len).collect::<Vec<_>>());
                    }
                }
            }
        }
    }

    #[test]
    fn a_free_thread_takes_over_a_slowed_direction() {
        let out = by_direction(dirs(2), 20, 10, &Named);
        assert!(out[0].ran.iter().all(|(_, t)| t == "fast"), "direction 0 stays on its thread");
        assert_eq!(steps(&out[1]), (0..20).collect::<Vec<_>>());
        // Direction 1 starts on the slowed thread; once direction 0 is done, the free
        // thread runs the rest of it.
        let on_fast = out[1].ran.iter().filter(|(_, t)| t == "fast").count();
        assert!(on_fast >= 15, "the free thread ran {on_fast} of direction 1's 20 steps");
        assert_eq!(out[1].ran.last().map(|(_, t)| t.as_str()), Some("fast"));
    }

    #[test]
    fn large_steps_run_one_direction_after_the_other() {
        let out = by_direction(dirs(2), 5, super::STEP_PARALLEL_MACS, &Named);
        for r in &out {
            assert_eq!(steps(r), (0..5).collect::<Vec<_>>());
            assert!(r.ran.iter().all(|(_, t)| !matches!(t.as_str(), "fast" | "slow")), "on the calling thread");
        }
    }
}
