//! A persistent thread pool for data-parallel loops: `for_each(n, f)` runs `f(0..n)` on
//! the workers and the calling thread and returns when every call has returned.
//!
//! Workers spin briefly on an atomic before sleeping, so the back-to-back small loops of a
//! model (a batch-1 dense layer takes microseconds) do not pay a wake-up each time.
//!
//! Loops from several threads (one model served by several threads) take turns; a task must
//! not start a loop on the pool that runs it (kernels pass `Sequential` to inner loops).
//!
//! # Why `for_each` returns only after every worker is done with the closure
//!
//! The closure is borrowed (its lifetime erased), so no worker may call it once
//! `for_each` has returned. A worker announces itself (`inside += 1`) before it claims
//! indices (`next.fetch_add`), and leaves (`inside -= 1`) after its last call; the caller,
//! once its own claim has found `next >= n`, waits for `inside == 0`. This is the
//! store-buffering pattern — each side writes one location and then reads the other — so
//! on weakly ordered CPUs (AArch64, POWER) acquire/release is not enough: the caller could
//! read a stale `inside == 0` while a worker that already announced itself goes on to claim
//! an index. The announcement, every claim and the caller's reads of `inside` are
//! therefore `SeqCst`: in the single total order of those operations, a worker's claim
//! that got an index precedes the caller's claim that found none (claims are read-modify-
//! writes of one location, so they are ordered), its announcement precedes its claim, and
//! the caller's claim precedes its read of `inside` — so that read sees the announcement
//! until the matching `inside -= 1`. That decrement is a release (here `SeqCst`) and the
//! read an acquire, so everything the worker's calls wrote (outputs, a panic message) is
//! visible to the caller when it returns. A worker that announces itself after the
//! caller's read finds no index left: its claim reads the latest `next` (`>= n`), so it
//! never calls the closure.

use aim_kernels::gemm::Parallel;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One loop being run: the closure (lifetime erased; `for_each` outlives every use), the
/// next index to hand out, and how many workers are still inside.
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
    /// Indices a thread claims at once: the shared counter is touched once per chunk, not
    /// per index (where the cores are far apart, as on some cloud machines, each touch
    /// moves a cache line between them).
    chunk: usize,
    next: AtomicUsize,
    inside: AtomicUsize,
    /// The message of the first call that panicked, re-raised on the calling thread.
    panic: Mutex<Option<String>>,
}

// SAFETY: `f` is Sync and `for_each` keeps it alive until `inside` drops to zero.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

struct Shared {
    generation: AtomicU64,
    job: Mutex<Option<Arc<Job>>>,
    wake: Condvar,
    /// Workers waiting on `wake` (or about to): a loop notifies only when there are some,
    /// since a notification is a system call even with nobody waiting.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
}

/// The pool. Dropping it stops the workers.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `for_each` calls from different threads.
    gate: Mutex<()>,
}

const SPIN: Duration = Duration::from_micros(200);

fn run_job(job: &Job) {
    loop {
        // SeqCst: see the module doc (the claim must be ordered after the announcement).
        let start = job.next.fetch_add(job.chunk, Ordering::SeqCst);
        if start >= job.n {
            break;
        }
        // A panicking call must not kill a worker (the caller would wait for it forever):
        // it is caught, the remaining indices are skipped, and the caller re-raises it.
        // SAFETY: see `Job`.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for i in start..(start + job.chunk).min(job.n) {
                unsafe { (*job.f)(i) }
            }
        }));
        if let Err(p) = r {
            job.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(crate::exec::panic_message(&*p));
            job.next.store(usize::MAX / 2, Ordering::Release);
        }
    }
}

impl ThreadPool {
    /// A pool running loops on `threads` threads in all (the caller counts as one), or the
    /// error of the first worker thread that could not be started.
    pub fn new(threads: usize) -> std::io::Result<ThreadPool> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        let mut pool = ThreadPool { shared, workers: Vec::new(), gate: Mutex::new(()) };
        for w in 1..threads.max(1) {
            let s = pool.shared.clone();
            // On failure, dropping the pool stops the workers started so far.
            let h = std::thread::Builder::new().name(format!("aim-worker-{w}")).spawn(move || worker(&s))?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    /// Threads in all, the caller included.
    pub fn size(&self) -> usize {
        self.workers.len() + 1
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            if s.generation.load(Ordering::Acquire) != seen {
                break;
            }
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let guard = s.job.lock().unwrap_or_else(|e| e.into_inner());
            // Counted as a sleeper before the last check, under the lock that `for_each`
            // takes to publish a job: either this check sees the new job, or `for_each`
            // (reading the count after publishing) sees this sleeper and notifies.
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            if s.generation.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::Acquire) {
                drop(s.wake.wait_timeout(guard, Duration::from_millis(50)));
            } else {
                drop(guard);
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        seen = s.generation.load(Ordering::Acquire);
        let job = s.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(job) = job {
            // SeqCst: see the module doc (announced before any claim).
            job.inside.fetch_add(1, Ordering::SeqCst);
            // Re-check: the caller may have finished and retired this job meanwhile.
            if job.next.load(Ordering::Acquire) < job.n {
                run_job(&job);
            }
            job.inside.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Parallel for ThreadPool {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if self.workers.is_empty() || n == 1 {
            (0..n).for_each(f);
            return;
        }
        let _gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the lifetime is erased only for the duration of this call: we wait below
        // until no worker is inside the job and no index is left before returning.
        let f_static: *const (dyn Fn(usize) + Sync) =
            unsafe { std::mem::transmute(f as *const (dyn Fn(usize) + Sync)) };
        // About four chunks per thread: few claims, and still room to even out.
        let chunk = (n / (4 * self.size())).max(1);
        let job = Arc::new(Job {
            f: f_static,
            n,
            chunk,
            next: AtomicUsize::new(0),
            inside: AtomicUsize::new(0),
            panic: Mutex::new(None),
        });
        {
            let mut slot = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            *slot = Some(job.clone());
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        if self.shared.sleepers.load(Ordering::SeqCst) > 0 {
            self.shared.wake.notify_all();
        }
        run_job(&job);
        // Every index is handed out; wait for workers still running one (SeqCst: see the
        // module doc).
        while job.inside.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        // A worker that cloned the job but has not yet entered sees `next >= n` and leaves
        // without calling `f`.
        job.next.store(usize::MAX / 2, Ordering::SeqCst);
        while job.inside.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        let panicked = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(msg) = panicked {
            panic!("{msg}");
        }
    }

    fn threads(&self) -> usize {
        self.size()
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_index_runs_once() {
        let pool = ThreadPool::new(3).unwrap();
        for n in [0, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.for_each(64, &|i| {
                if i == 40 {
                    panic!("task 40 failed");
                }
            })
        }));
        let msg = r.unwrap_err().downcast::<String>().map(|s| *s).unwrap_or_default();
        assert!(msg.contains("task 40 failed"), "{msg}");
        let count = AtomicUsize::new(0);
        pool.for_each(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn many_small_loops_in_a_row() {
        let pool = ThreadPool::new(2).unwrap();
        let total = AtomicUsize::new(0);
        for _ in 0..20_000 {
            pool.for_each(3, &|i| {
                total.fetch_add(i + 1, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 20_000 * 6);
    }
}
