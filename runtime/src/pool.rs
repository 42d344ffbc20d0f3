//! A persistent thread pool for data-parallel loops: `for_each(n, f)` runs `f(0..n)` on
//! the workers and the calling thread and returns when every call has returned.
//!
//! Workers spin briefly on an atomic before sleeping, so the back-to-back small loops of a
//! model (a batch-1 dense layer takes microseconds) do not pay a wake-up each time.
//!
//! Loops from several threads (one model served by several threads) take turns; a task must
//! not start a loop on the pool that runs it (kernels pass `Sequential` to inner loops).
//!
//! `for_each` returns only after every worker is done with the borrowed closure, on weakly
//! ordered CPUs too: the handshake is one atomic word per loop, [`crate::claims::Claims`],
//! whose module doc gives the argument (and a loom model checks it).

use crate::claims::Claims;
use aim_kernels::gemm::Parallel;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One loop being run: the closure (lifetime erased; `for_each` outlives every use) and
/// the claim counter (the next index to hand out and how many workers are inside).
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    /// Indices a thread claims at once: the shared counter is touched once per chunk, not
    /// per index (where the cores are far apart, as on some cloud machines, each touch
    /// moves a cache line between them).
    chunk: usize,
    claims: Claims,
    /// The message of the first call that panicked, re-raised on the calling thread.
    panic: Mutex<Option<String>>,
    /// Where the caller sleeps while workers finish their last chunks (see `finish`).
    caller: Mutex<()>,
    done: Condvar,
    /// Whether the caller sleeps (or is about to) on `done`: the last worker to leave
    /// notifies only then, since a notification is a system call.
    caller_sleeps: AtomicBool,
}

// SAFETY: `f` is Sync and `for_each` keeps it alive until the claims are idle.
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
    /// The logical CPU each worker is bound to, when pinned.
    pinned: Vec<usize>,
}

const SPIN: Duration = Duration::from_micros(200);

/// How long a spinning thread spins before it yields between checks: where the machine is
/// busy, the thread it waits for may share its core, and a spin that never yields would
/// keep that thread off the core for a whole time slice.
const PURE_SPIN: Duration = Duration::from_micros(10);

/// How long the caller spins for workers to finish their last chunks before it sleeps.
/// Sleeping frees its core: a worker that the OS preempted (for another process, on a
/// busy machine) is then moved there at once instead of waiting for its time slice.
const CALLER_SPIN: Duration = Duration::from_micros(30);

/// A spinning thread's wait step: a pause instruction at first, a yield of the core
/// after [`PURE_SPIN`].
fn spin_step(since: Instant) {
    if since.elapsed() < PURE_SPIN {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// The caller's wait, once every index is handed out, for the workers still running one:
/// spins briefly, then sleeps until the last one leaves (`leave_job` notifies it; the
/// timeout bounds the wait should a notification be missed).
fn finish(job: &Job) {
    let start = Instant::now();
    while !job.claims.idle() {
        if start.elapsed() < CALLER_SPIN {
            std::hint::spin_loop();
            continue;
        }
        let guard = job.caller.lock().unwrap_or_else(|e| e.into_inner());
        job.caller_sleeps.store(true, Ordering::SeqCst);
        if !job.claims.idle() {
            drop(job.done.wait_timeout(guard, Duration::from_micros(500)));
        }
        job.caller_sleeps.store(false, Ordering::SeqCst);
    }
}

/// A worker leaves `job`; the last one out wakes the caller if it sleeps.
fn leave_job(job: &Job) {
    job.claims.leave();
    if job.caller_sleeps.load(Ordering::SeqCst) && job.claims.idle() {
        let _guard = job.caller.lock().unwrap_or_else(|e| e.into_inner());
        job.done.notify_one();
    }
}

fn run_job(job: &Job) {
    while let Some(range) = job.claims.claim(job.chunk) {
        // A panicking call must not kill a worker (the caller would wait for it forever):
        // it is caught, the remaining indices are skipped, and the caller re-raises it.
        // SAFETY: see `Job`.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for i in range {
                unsafe { (*job.f)(i) }
            }
        }));
        if let Err(p) = r {
            job.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(crate::exec::panic_message(&*p));
            job.claims.close();
        }
    }
}

impl ThreadPool {
    /// A pool running loops on `threads` threads in all (the caller counts as one), or the
    /// error of the first worker thread that could not be started.
    pub fn new(threads: usize) -> std::io::Result<ThreadPool> {
        ThreadPool::with_pinning(threads, false)
    }

    /// [`ThreadPool::new`], with each worker bound to a core of its own when `pin` is set
    /// (see [`crate::affinity`]; the first core in the order is left to the calling
    /// thread, which is not pinned), or the error that prevented it.
    pub fn with_pinning(threads: usize, pin: bool) -> std::io::Result<ThreadPool> {
        let order = if pin { crate::affinity::pin_order()? } else { Vec::new() };
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        let mut pool = ThreadPool { shared, workers: Vec::new(), gate: Mutex::new(()), pinned: Vec::new() };
        let (said, told) = std::sync::mpsc::channel();
        for w in 1..threads.max(1) {
            let s = pool.shared.clone();
            // More workers than CPUs: they share them round the order.
            let cpu = (!order.is_empty()).then(|| order[w % order.len()]);
            let said = said.clone();
            // On failure, dropping the pool stops the workers started so far.
            let h = std::thread::Builder::new().name(format!("aim-worker-{w}")).spawn(move || {
                if let Some(cpu) = cpu {
                    let _ = said.send(crate::affinity::pin_current_thread(cpu).map(|()| cpu));
                }
                drop(said);
                worker(&s)
            })?;
            pool.workers.push(h);
        }
        drop(said);
        for r in told {
            pool.pinned.push(r?);
        }
        pool.pinned.sort_unstable();
        Ok(pool)
    }

    /// Threads in all, the caller included.
    pub fn size(&self) -> usize {
        self.workers.len() + 1
    }

    /// The logical CPUs the workers are bound to (empty when not pinned).
    pub fn pinned_cpus(&self) -> &[usize] {
        &self.pinned
    }
}

fn worker(s: &Shared) {
    crate::denormals::flush_this_thread();
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
                spin_step(start);
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
            // The caller may have finished and retired this job meanwhile: then the claims
            // give nothing (see `Claims`).
            job.claims.enter();
            run_job(&job);
            leave_job(&job);
        }
    }
}

impl Parallel for ThreadPool {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if self.workers.is_empty() || n == 1 || n > crate::claims::MAX_INDICES {
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
            chunk,
            claims: Claims::new(n),
            panic: Mutex::new(None),
            caller: Mutex::new(()),
            done: Condvar::new(),
            caller_sleeps: AtomicBool::new(false),
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
        // Every index is handed out; wait for workers still running one. A worker that
        // cloned the job but enters later finds nothing to claim (see `Claims`).
        finish(&job);
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
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

/// The physical cores of this machine (the default thread count): distinct (package, core)
/// pairs in Linux's topology files for the first `logical` processors, or `logical` where
/// those files cannot be read.
pub fn physical_cores(logical: usize) -> usize {
    let mut cores = std::collections::BTreeSet::new();
    for cpu in 0..logical {
        let base = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let read = |f: &str| std::fs::read_to_string(format!("{base}/{f}")).ok().map(|s| s.trim().to_string());
        match (read("physical_package_id"), read("core_id")) {
            (Some(p), Some(c)) => {
                cores.insert((p, c));
            }
            _ => return logical,
        }
    }
    cores.len().max(1)
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
