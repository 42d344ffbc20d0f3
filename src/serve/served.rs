//! One served model version: its signature, a loaded instance per serving device, the
//! queue(s) feeding them and the worker threads that run batches — concatenated along the
//! batch dim, run once, split back per request.

use super::config::{Batching, Device, ModelConfig, Policy};
use super::metrics::{DeviceStats, ModelStats};
use super::protocol::ApiError;
use super::queue::{Done, Job, Queue, ShapeKey};
use aim_ir::{DType, Dim, Tensor};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// An input's or output's declared type: `None` dims are symbolic (-1 in metadata).
#[derive(Debug, Clone)]
pub struct Port {
    /// Its name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its dims; `None` where symbolic.
    pub dims: Vec<Option<usize>>,
}

/// A model version being served.
pub struct Served {
    /// The model's name.
    pub model: String,
    /// This version.
    pub version: u64,
    /// The inputs, in the model's order.
    pub inputs: Vec<Port>,
    /// The outputs, in the model's order.
    pub outputs: Vec<Port>,
    /// Its batching (`max_batch_size` 0 when the model cannot be batched).
    pub batching: Batching,
    /// Its counters.
    pub stats: Arc<ModelStats>,
    /// One queue all devices take from (latency-aware) or one per device (round-robin).
    queues: Vec<Arc<Queue>>,
    /// Smooth weighted round-robin state per queue: (current, weight).
    turns: Mutex<Vec<(i64, i64)>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

fn port(v: &aim_ir::ValueInfo, path: &Path) -> Result<Port> {
    let dtype = v.ty.dtype.with_context(|| format!("{}: '{}' has no known dtype", path.display(), v.name))?;
    let dims = v.ty.shape.as_ref().with_context(|| format!("{}: '{}' has no known rank", path.display(), v.name))?;
    let dims = dims.iter().map(|d| if let Dim::Known(n) = d { Some(*n) } else { None }).collect();
    Ok(Port { name: v.name.clone(), dtype, dims })
}

/// The model file a path names: the path itself, or the one `.onnx` or `.aim` file in a
/// directory (as KServe mounts a model under `/mnt/models`).
fn model_file(path: &Path) -> Result<std::path::PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let mut found = Vec::new();
    for e in std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))? {
        let p = e.with_context(|| format!("reading {}", path.display()))?.path();
        if p.is_file() && p.extension().is_some_and(|x| x == "onnx" || x == "aim") {
            found.push(p);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!("{}: a directory with no .onnx or .aim file in it", path.display()),
        _ => bail!("{}: a directory with {} model files in it; name one", path.display(), found.len()),
    }
}

/// Why a model cannot be batched along its first dim, if it cannot: every input and output
/// needs a symbolic leading dim, the same one where they are named.
fn unbatchable(model: &crate::Model) -> Option<String> {
    let mut named: Option<&str> = None;
    for v in model.inputs().iter().chain(model.outputs()) {
        match v.ty.shape.as_deref().and_then(|s| s.first()) {
            None => return Some(format!("'{}' has no leading dim to batch along", v.name)),
            Some(Dim::Known(n)) => return Some(format!("'{}' has a fixed leading dim of {n}", v.name)),
            Some(Dim::Sym(s)) => match named {
                Some(n) if n != s => return Some(format!("the leading dims differ ('{n}' and '{s}' of '{}')", v.name)),
                _ => named = Some(s.as_str()),
            },
            Some(Dim::Unknown) => {}
        }
    }
    None
}

impl Served {
    /// Loads `path` once per serving device and starts their workers.
    pub fn start(
        cfg: &ModelConfig,
        version: u64,
        path: &Path,
        devices: &[(Device, Arc<DeviceStats>)],
        policy: Policy,
        weights: &[u32],
    ) -> Result<Served> {
        let path = &model_file(path).with_context(|| format!("model '{}' version {version}", cfg.name))?;
        let at = format!("model '{}' version {version} ({})", cfg.name, path.display());
        let mut batching = cfg.batching.clone();
        let mut instances = Vec::new();
        for (d, _) in devices {
            let backend =
                if d.kind == super::config::DeviceKind::Cuda { crate::Backend::Cuda } else { crate::Backend::Cpu };
            let opts = crate::Options {
                backend,
                threads: d.threads,
                // Every batch size gets its program: keep them all, and a few other shapes.
                shape_cache: Some((2 * batching.max_batch_size).max(8)),
                half_weights: cfg.weights.half,
                int4_weights: cfg.weights.int4,
                int8_weights: cfg.weights.int8,
                memory_budget: cfg.memory_budget.filter(|_| backend == crate::Backend::Cpu),
                ..crate::Options::default()
            };
            instances.push(crate::Model::load_with_options(path, &opts).with_context(|| at.clone())?);
        }
        let first = instances.first().context("no device serves")?;
        let inputs = first.inputs().iter().map(|v| port(v, path)).collect::<Result<Vec<_>>>()?;
        let outputs = first.outputs().iter().map(|v| port(v, path)).collect::<Result<Vec<_>>>()?;
        if batching.max_batch_size > 0 {
            if let Some(why) = unbatchable(first) {
                if batching.explicit {
                    bail!("{at}: max_batch_size is {} but the model cannot be batched: {why}", batching.max_batch_size);
                }
                eprintln!("aim serve: {at}: no dynamic batching ({why})");
                batching.max_batch_size = 0;
                batching.preferred_batch_size.clear();
            }
        }
        for model in &instances {
            warm_up(model, &inputs, batching.max_batch_size, &at);
        }
        let stats = Arc::new(ModelStats::default());
        let shared = policy == Policy::LatencyAware;
        let queues: Vec<Arc<Queue>> = (0..if shared { 1 } else { devices.len() })
            .map(|_| Arc::new(Queue::new(batching.max_queue_size)))
            .collect();
        let mut workers = Vec::new();
        for (i, (model, (d, dstats))) in instances.into_iter().zip(devices).enumerate() {
            let w = Worker {
                model,
                queue: queues[if shared { 0 } else { i }].clone(),
                batching: batching.clone(),
                names: inputs.iter().map(|p| p.name.clone()).collect(),
                stats: stats.clone(),
                device: dstats.clone(),
            };
            let name = format!("aim-{}-{version}-{}", cfg.name, d.name);
            workers.push(std::thread::Builder::new().name(name).spawn(move || w.work()).context("starting a worker")?);
        }
        let turns = weights.iter().map(|&w| (0, w as i64)).collect();
        Ok(Served {
            model: cfg.name.clone(),
            version,
            inputs,
            outputs,
            batching,
            stats,
            queues,
            turns: Mutex::new(turns),
            workers: Mutex::new(workers),
        })
    }

    /// Checks a request's inputs against the model and makes its job.
    pub fn job(
        &self,
        given: Vec<(String, Tensor)>,
        timeout: Option<Duration>,
        reply: tokio::sync::oneshot::Sender<Result<Done, ApiError>>,
    ) -> Result<Job, ApiError> {
        let mut given = given;
        let mut inputs = Vec::with_capacity(self.inputs.len());
        for p in &self.inputs {
            let i = given
                .iter()
                .position(|(n, _)| n == &p.name)
                .ok_or_else(|| ApiError::bad(format!("model '{}': input '{}' is missing", self.model, p.name)))?;
            let (_, t) = given.swap_remove(i);
            check(&self.model, p, &t)?;
            inputs.push(t);
        }
        if let Some((n, _)) = given.first() {
            let known: Vec<&str> = self.inputs.iter().map(|p| p.name.as_str()).collect();
            return Err(ApiError::bad(format!(
                "model '{}' has no input named '{n}' (its inputs: {})",
                self.model,
                known.join(", ")
            )));
        }
        let batched = self.batching.max_batch_size > 0;
        let rows = if batched { inputs.first().map_or(1, |t| t.shape()[0]) } else { 1 };
        if batched {
            if let Some((p, t)) = self.inputs.iter().zip(&inputs).find(|(_, t)| t.shape()[0] != rows) {
                return Err(ApiError::bad(format!(
                    "model '{}': input '{}' has {} rows in the batch dim but '{}' has {rows}",
                    self.model,
                    p.name,
                    t.shape()[0],
                    self.inputs[0].name
                )));
            }
            if rows == 0 || rows > self.batching.max_batch_size {
                return Err(ApiError::bad(format!(
                    "model '{}': the batch size {rows} is not between 1 and max_batch_size ({})",
                    self.model, self.batching.max_batch_size
                )));
            }
        }
        let key: ShapeKey = inputs
            .iter()
            .map(|t| (t.dtype(), if batched { t.shape()[1..].to_vec() } else { t.shape().to_vec() }))
            .collect();
        let queued = Instant::now();
        let deadline = timeout.or(self.batching.default_timeout).map(|t| queued + t);
        Ok(Job { inputs, rows, key, queued, deadline, reply })
    }

    /// The index of output `name`, or a 400 naming the outputs there are.
    pub fn output_index(&self, name: &str) -> Result<usize, ApiError> {
        self.outputs.iter().position(|p| p.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.outputs.iter().map(|p| p.name.as_str()).collect();
            ApiError::bad(format!(
                "model '{}' has no output named '{name}' (its outputs: {})",
                self.model,
                known.join(", ")
            ))
        })
    }

    /// Serves one request, whatever protocol it came by: checks its inputs, queues it and
    /// waits for its batch's answer.
    pub async fn request(&self, inputs: Vec<(String, Tensor)>, timeout: Option<Duration>) -> Result<Done, ApiError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = self.job(inputs, timeout, tx)?;
        self.submit(job).map_err(|(_, e)| e)?;
        rx.await.map_err(|_| ApiError::new(500, "internal error: the request's batch was lost"))?
    }

    /// Queues a job on the device the policy picks.
    #[allow(clippy::result_large_err)]
    pub fn submit(&self, job: Job) -> Result<(), (Job, ApiError)> {
        let q = if self.queues.len() == 1 { 0 } else { self.next_turn() };
        self.queues[q].push(job)
    }

    /// Smooth weighted round-robin: each device gains its weight, the highest goes and pays
    /// the total back.
    fn next_turn(&self) -> usize {
        let mut t = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        let total: i64 = t.iter().map(|x| x.1).sum();
        t.iter_mut().for_each(|x| x.0 += x.1);
        let best = (0..t.len()).max_by_key(|&i| (t[i].0, std::cmp::Reverse(i))).unwrap_or(0);
        t[best].0 -= total;
        best
    }

    /// Stops taking requests, serves those queued, and waits for the workers.
    pub fn stop(&self) {
        self.queues.iter().for_each(|q| q.close());
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in workers {
            let _ = w.join();
        }
    }
}

/// Runs the model once per batch size it can be sent (1 to `max_batch`, or once when it is
/// not batched) on zeros, so that the program specialised to each shape is compiled before
/// the first request rather than during it. Only where every other dim is fixed (other
/// shapes are not known in advance); a failed run (zeros a model cannot take) is logged,
/// not fatal: requests are what the model is for.
fn warm_up(model: &crate::Model, inputs: &[Port], max_batch: usize, at: &str) {
    let batched = max_batch > 0;
    if inputs.iter().any(|p| p.dims.iter().skip(batched as usize).any(|d| d.is_none())) {
        return;
    }
    let t = Instant::now();
    for rows in 1..=max_batch.max(1) {
        let feeds: Result<Vec<(String, Tensor)>, String> = inputs
            .iter()
            .map(|p| {
                let shape: Vec<usize> = p
                    .dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| if batched && i == 0 { rows } else { d.unwrap_or(1) })
                    .collect();
                Ok((p.name.clone(), Tensor::try_zeros(p.dtype, &shape).map_err(|e| e.to_string())?))
            })
            .collect();
        if let Err(e) = feeds.and_then(|f| model.run(f).map_err(|e| e.to_string())) {
            eprintln!("aim serve: {at}: warm-up at batch size {rows} failed (requests will compile on first use): {e}");
            return;
        }
    }
    eprintln!(
        "aim serve: {at}: warmed up {} in {:.0} ms",
        if batched { format!("batch sizes 1 to {max_batch}") } else { "one run".to_string() },
        t.elapsed().as_secs_f64() * 1e3
    );
}

/// A tensor against the port it is fed to: dtype, rank and fixed dims.
fn check(model: &str, p: &Port, t: &Tensor) -> Result<(), ApiError> {
    let show = |d: &[Option<usize>]| {
        let v: Vec<String> = d.iter().map(|x| x.map_or("-1".to_string(), |n| n.to_string())).collect();
        format!("[{}]", v.join(", "))
    };
    if t.dtype() != p.dtype {
        return Err(ApiError::bad(format!(
            "model '{model}': input '{}' takes {}, got {}",
            p.name,
            super::protocol::datatype_name(p.dtype),
            super::protocol::datatype_name(t.dtype())
        )));
    }
    let fits = t.shape().len() == p.dims.len() && t.shape().iter().zip(&p.dims).all(|(&n, d)| d.is_none_or(|d| d == n));
    if !fits {
        return Err(ApiError::bad(format!(
            "model '{model}': input '{}' has shape {:?}, expected {}",
            p.name,
            t.shape(),
            show(&p.dims)
        )));
    }
    Ok(())
}

/// A device's instance of a model version, running the batches of its queue.
struct Worker {
    model: crate::Model,
    queue: Arc<Queue>,
    batching: Batching,
    names: Vec<String>,
    stats: Arc<ModelStats>,
    device: Arc<DeviceStats>,
}

impl Worker {
    fn work(self) {
        while let Some(batch) = self.queue.next_batch(&self.batching) {
            // A panic past aim's own containment drops the batch's reply channels, which
            // answers its requests with an internal error; the worker goes on.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run(batch)));
        }
    }

    fn run(&self, batch: Vec<Job>) {
        let start = Instant::now();
        let rows: usize = batch.iter().map(|j| j.rows).sum();
        let inputs = if batch.len() == 1 {
            batch[0].inputs.clone()
        } else {
            (0..self.names.len()).map(|i| concat(batch.iter().map(|j| &j.inputs[i]), rows)).collect()
        };
        let result = self.model.run(self.names.iter().cloned().zip(inputs).collect());
        let compute = start.elapsed();
        self.device.busy_ns.fetch_add(compute.as_nanos() as u64, Relaxed);
        self.stats.exec_count.fetch_add(1, Relaxed);
        let outputs = match result {
            Ok(o) => o.into_iter().map(|(_, t)| t).collect::<Vec<_>>(),
            Err(_) if batch.len() > 1 => {
                // One request's data (an index out of range, say) fails the whole batch:
                // each request runs again alone, so that the valid ones get their answers
                // and no client sees another's error.
                batch.into_iter().for_each(|j| self.run(vec![j]));
                return;
            }
            Err(e) => {
                let msg = format!("running the model: {e}");
                batch.into_iter().for_each(|j| j.answer(Err(ApiError::new(500, msg.clone()))));
                return;
            }
        };
        if batch.len() > 1 {
            if let Some(t) = outputs.iter().find(|t| t.shape().first() != Some(&rows)) {
                let msg = format!(
                    "an output of shape {:?} does not have the batch's {rows} rows first: the model cannot be batched (set max_batch_size: 0)",
                    t.shape()
                );
                batch.into_iter().for_each(|j| j.answer(Err(ApiError::new(500, msg.clone()))));
                return;
            }
        }
        self.stats.inference_count.fetch_add(rows as u64, Relaxed);
        let single = batch.len() == 1;
        let mut row = 0;
        for j in batch {
            let queue = start.saturating_duration_since(j.queued);
            self.stats.queue_us.fetch_add(queue.as_micros() as u64, Relaxed);
            self.stats.compute_us.fetch_add(compute.as_micros() as u64, Relaxed);
            let mine = if single { outputs.clone() } else { outputs.iter().map(|t| rows_of(t, row, j.rows)).collect() };
            row += j.rows;
            j.answer(Ok(Done { outputs: mine, queue, compute }));
        }
    }
}

/// The tensors stacked along their first dim (they share the rest of their shape).
fn concat<'a>(parts: impl Iterator<Item = &'a Tensor> + Clone, rows: usize) -> Tensor {
    let first = parts.clone().next().expect("a batch has a request");
    let mut shape = first.shape().to_vec();
    shape[0] = rows;
    let mut bytes = Vec::with_capacity(parts.clone().map(|t| t.bytes().len()).sum());
    parts.for_each(|t| bytes.extend_from_slice(t.bytes()));
    Tensor::from_bytes(first.dtype(), &shape, &bytes).expect("the parts' bytes fill the stacked shape")
}

/// Rows `at..at + n` of a tensor's first dim.
fn rows_of(t: &Tensor, at: usize, n: usize) -> Tensor {
    let mut shape = t.shape().to_vec();
    let row_bytes = t.bytes().len().checked_div(shape[0]).unwrap_or(0);
    shape[0] = n;
    Tensor::from_bytes(t.dtype(), &shape, &t.bytes()[at * row_bytes..(at + n) * row_bytes])
        .expect("a row range of the tensor")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacking_and_splitting_rows_round_trip() {
        let a = Tensor::from_slice(&[1, 3], &[1.0f32, 2.0, 3.0]);
        let b = Tensor::from_slice(&[2, 3], &[4.0f32, 5.0, 6.0, 7.0, 8.0, 9.0]);
        let s = concat([&a, &b].into_iter(), 3);
        assert_eq!(s.shape(), &[3, 3]);
        assert_eq!(rows_of(&s, 0, 1).data::<f32>(), a.data::<f32>());
        assert_eq!(rows_of(&s, 1, 2).data::<f32>(), b.data::<f32>());
    }

    #[test]
    fn inputs_are_checked_against_the_ports() {
        let p = Port { name: "x".into(), dtype: DType::F32, dims: vec![None, Some(4)] };
        assert!(check("m", &p, &Tensor::zeros(DType::F32, &[3, 4])).is_ok());
        let e = check("m", &p, &Tensor::zeros(DType::F32, &[3, 5])).unwrap_err();
        assert!(e.message.contains("expected [-1, 4]"), "{}", e.message);
        let e = check("m", &p, &Tensor::zeros(DType::I64, &[3, 4])).unwrap_err();
        assert!(e.message.contains("takes FP32, got INT64"), "{}", e.message);
    }
}
