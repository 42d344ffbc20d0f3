//! A model's request queue and the dynamic batcher that drains it, with Triton's semantics:
//! the first request of a batch waits at most `max_queue_delay` for others of the same
//! non-batch shapes, up to `max_batch_size` rows (or a preferred size, which runs at once);
//! requests whose timeout passed while queued are answered with an error instead of run.

use super::config::Batching;
use super::protocol::ApiError;
use aim_ir::{DType, Tensor};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What a request needs its batch to agree on: each input's dtype and its shape without
/// the batch dim (the whole shape when the model is not batched).
pub type ShapeKey = Vec<(DType, Vec<usize>)>;

/// What a served request gets back: its outputs (in the model's order) and where its time
/// went.
#[derive(Debug)]
pub struct Done {
    /// Every output of the model, this request's rows only.
    pub outputs: Vec<Tensor>,
    /// Time from being queued to its batch starting.
    pub queue: Duration,
    /// Time of its batch's run.
    pub compute: Duration,
}

/// One queued request.
#[derive(Debug)]
pub struct Job {
    /// Its inputs, in the model's input order.
    pub inputs: Vec<Tensor>,
    /// Its rows (the batch dim; 1 when the model is not batched).
    pub rows: usize,
    /// What its batch must share.
    pub key: ShapeKey,
    /// When it was queued.
    pub queued: Instant,
    /// When it stops being worth running.
    pub deadline: Option<Instant>,
    /// Where its answer goes (exactly one is sent).
    pub reply: oneshot::Sender<Result<Done, ApiError>>,
}

impl Job {
    /// Answers the request (a client that went away is no error).
    pub fn answer(self, r: Result<Done, ApiError>) {
        let _ = self.reply.send(r);
    }

    fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

struct State {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// A queue of requests for one model version (shared by the devices that serve it, or one
/// per device under round-robin).
pub struct Queue {
    state: Mutex<State>,
    arrived: Condvar,
    limit: usize,
}

impl Queue {
    /// An empty queue holding at most `limit` requests (0: no limit).
    pub fn new(limit: usize) -> Queue {
        Queue { state: Mutex::new(State { jobs: VecDeque::new(), closed: false }), arrived: Condvar::new(), limit }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A worker never panics holding the lock (runs happen outside it), so poison only
        // means a panic elsewhere; the queue's state is still whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a request; a full or closed queue gives it back with the error to answer.
    #[allow(clippy::result_large_err)]
    pub fn push(&self, job: Job) -> Result<(), (Job, ApiError)> {
        let mut s = self.lock();
        if s.closed {
            return Err((job, ApiError::new(503, "the server is shutting down")));
        }
        if self.limit > 0 && s.jobs.len() >= self.limit {
            let e = ApiError::new(503, format!("the queue is full ({} requests waiting; max_queue_size)", self.limit));
            return Err((job, e));
        }
        s.jobs.push_back(job);
        drop(s);
        self.arrived.notify_all();
        Ok(())
    }

    /// Stops taking requests; those queued are still served, then the workers stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.arrived.notify_all();
    }

    /// The next batch: blocks for a first request, then gathers more as `b` allows. `None`
    /// once the queue is closed and empty.
    pub fn next_batch(&self, b: &Batching) -> Option<Vec<Job>> {
        let mut s = self.lock();
        let first = loop {
            let now = Instant::now();
            match s.jobs.pop_front() {
                Some(j) if j.expired(now) => timed_out(j),
                Some(j) => break j,
                None if s.closed => return None,
                None => s = self.arrived.wait(s).unwrap_or_else(|p| p.into_inner()),
            }
        };
        let mut rows = first.rows;
        let window_ends = first.queued + b.max_queue_delay;
        let mut batch = vec![first];
        if b.max_batch_size == 0 {
            return Some(batch);
        }
        loop {
            let now = Instant::now();
            let mut i = 0;
            while i < s.jobs.len() && rows < b.max_batch_size {
                let j = &s.jobs[i];
                if j.expired(now) {
                    timed_out(s.jobs.remove(i).expect("in range"));
                } else if j.key == batch[0].key && rows + j.rows <= b.max_batch_size {
                    rows += j.rows;
                    batch.push(s.jobs.remove(i).expect("in range"));
                } else {
                    i += 1;
                }
            }
            if rows >= b.max_batch_size || b.preferred_batch_size.contains(&rows) || s.closed || now >= window_ends {
                return Some(batch);
            }
            s = self.arrived.wait_timeout(s, window_ends - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

fn timed_out(j: Job) {
    let waited = j.queued.elapsed();
    j.answer(Err(ApiError::new(503, format!("the request timed out after {} us in the queue", waited.as_micros()))));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn job(rows: usize, width: usize, deadline: Option<Instant>) -> (Job, oneshot::Receiver<Result<Done, ApiError>>) {
        let (tx, rx) = oneshot::channel();
        let t = Tensor::zeros(DType::F32, &[rows, width]);
        let key = vec![(DType::F32, vec![width])];
        (Job { inputs: vec![t], rows, key, queued: Instant::now(), deadline, reply: tx }, rx)
    }

    fn batching(max: usize, delay_ms: u64, preferred: Vec<usize>) -> Batching {
        Batching {
            max_batch_size: max,
            preferred_batch_size: preferred,
            max_queue_delay: Duration::from_millis(delay_ms),
            max_queue_size: 0,
            default_timeout: None,
            explicit: true,
        }
    }

    #[test]
    fn batches_gather_same_shapes_up_to_the_limit() {
        let q = Queue::new(0);
        let mut rx = Vec::new();
        for (rows, width) in [(1, 4), (2, 4), (1, 5), (3, 4), (1, 4)] {
            let (j, r) = job(rows, width, None);
            q.push(j).unwrap();
            rx.push(r);
        }
        let b = batching(4, 0, vec![]);
        let first = q.next_batch(&b).unwrap();
        // 1 + 2 rows of width 4; the width-5 request is skipped, the 3-row one does not fit,
        // the last 1-row one does.
        assert_eq!(first.iter().map(|j| j.rows).collect::<Vec<_>>(), vec![1, 2, 1]);
        let second = q.next_batch(&b).unwrap();
        assert_eq!(second.iter().map(|j| (j.rows, j.key[0].1[0])).collect::<Vec<_>>(), vec![(1, 5)]);
        assert_eq!(q.next_batch(&b).unwrap().len(), 1);
        q.close();
        assert!(q.next_batch(&b).is_none());
    }

    #[test]
    fn the_first_request_waits_for_company_until_the_delay() {
        let q = Arc::new(Queue::new(0));
        let (j, _r) = job(1, 4, None);
        q.push(j).unwrap();
        let q2 = q.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let (j, r) = job(1, 4, None);
            q2.push(j).unwrap();
            r
        });
        let t = Instant::now();
        let b = q.next_batch(&batching(8, 400, vec![2])).unwrap();
        // The second request arrived within the window and made a preferred size of 2: the
        // batch ran then, not at the end of the 400 ms window.
        assert_eq!(b.len(), 2);
        assert!(t.elapsed() < Duration::from_millis(300));
        let _ = late.join();
    }

    #[test]
    fn full_queues_and_expired_requests_are_answered() {
        let q = Queue::new(1);
        let (a, ra) = job(1, 4, Some(Instant::now()));
        q.push(a).unwrap();
        let (b, _rb) = job(1, 4, None);
        let (_b, e) = q.push(b).unwrap_err();
        assert_eq!(e.status, 503);
        assert!(e.message.contains("max_queue_size"));
        q.close();
        // The expired request is answered with a timeout, not run; then the queue is done.
        assert!(q.next_batch(&batching(4, 0, vec![])).is_none());
        assert!(ra.blocking_recv().unwrap().unwrap_err().message.contains("timed out"));
    }
}
