//! The server's counters, in Prometheus' text exposition format under Triton's metric names
//! (so existing Grafana dashboards read them unchanged), plus `aim_inference_latency`
//! (p50/p90/p99 over the recent requests), `aim_hw_utilization` and `aim_model_versions`.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many recent requests the latency quantiles cover.
pub const LATENCY_WINDOW: usize = 4096;

/// One model version's counters (Triton's `nv_inference_*` with labels model and version).
#[derive(Default)]
pub struct ModelStats {
    /// Requests answered with outputs.
    pub success: AtomicU64,
    /// Requests answered with an error (after the model was found).
    pub failure: AtomicU64,
    /// Inferences done: rows of the batch dim (1 per request without batching).
    pub inference_count: AtomicU64,
    /// Runs of the model (one per batch).
    pub exec_count: AtomicU64,
    /// Cumulative time of the successful requests, from the request decoded (its body read
    /// and parsed, as Triton starts the clock) to its outputs, in microseconds.
    pub request_us: AtomicU64,
    /// Cumulative time requests waited in the queue.
    pub queue_us: AtomicU64,
    /// Cumulative time of the runs that served requests (counted once per request).
    pub compute_us: AtomicU64,
    /// Requests received and not yet answered.
    pub pending: AtomicU64,
    /// Recent request durations (microseconds), and their running sum and count.
    latency: Mutex<Latency>,
}

#[derive(Default)]
struct Latency {
    recent: VecDeque<u64>,
    sum_us: u64,
    count: u64,
}

impl ModelStats {
    /// Records an answered request: its outcome and its time from decoded to answered. As
    /// in Triton, the durations (`nv_inference_request_duration_us` and the latency
    /// quantiles) are of successful requests only; a failure is counted, not timed.
    pub fn answered(&self, ok: bool, took: Duration) {
        let us = took.as_micros() as u64;
        if !ok {
            self.failure.fetch_add(1, Relaxed);
            return;
        }
        self.success.fetch_add(1, Relaxed);
        self.request_us.fetch_add(us, Relaxed);
        let mut l = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        if l.recent.len() == LATENCY_WINDOW {
            l.recent.pop_front();
        }
        l.recent.push_back(us);
        l.sum_us += us;
        l.count += 1;
    }

    /// The p50, p90 and p99 of the recent request durations (microseconds), the sum and the
    /// count of all of them.
    pub fn latency(&self) -> ([u64; 3], u64, u64) {
        let l = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<u64> = l.recent.iter().copied().collect();
        v.sort_unstable();
        let q = |p: f64| if v.is_empty() { 0 } else { v[((v.len() - 1) as f64 * p).round() as usize] };
        ([q(0.5), q(0.9), q(0.99)], l.sum_us, l.count)
    }
}

/// A serving device's busy time, for `aim_hw_utilization`.
pub struct DeviceStats {
    /// The device's name.
    pub name: String,
    /// Cumulative time its model instances spent running, in nanoseconds.
    pub busy_ns: AtomicU64,
    /// The wall time and busy time at the last scrape.
    last: Mutex<(Instant, u64)>,
}

impl DeviceStats {
    /// Counters for a device, starting now.
    pub fn new(name: &str) -> DeviceStats {
        DeviceStats { name: name.to_string(), busy_ns: AtomicU64::new(0), last: Mutex::new((Instant::now(), 0)) }
    }

    /// The fraction of the time since the last scrape its instances were running (over 1
    /// when several instances ran at once).
    fn utilization(&self) -> f64 {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let (now, busy) = (Instant::now(), self.busy_ns.load(Relaxed));
        let wall = now.duration_since(last.0).as_nanos().max(1) as f64;
        let u = busy.saturating_sub(last.1) as f64 / wall;
        *last = (now, busy);
        u
    }
}

/// One model version as the metrics see it.
pub struct Labelled<'a> {
    /// The model's name.
    pub model: &'a str,
    /// The version.
    pub version: u64,
    /// Its counters.
    pub stats: &'a ModelStats,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A counter family: its name, its help and how to read it off a model's stats.
type Counter = (&'static str, &'static str, fn(&ModelStats) -> u64);

/// The text exposition of every metric.
pub fn render(models: &[Labelled<'_>], devices: &[&DeviceStats], versions: &[(&str, usize)]) -> String {
    let mut out = String::new();
    let counters: [Counter; 8] = [
        ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", |s| {
            s.success.load(Relaxed)
        }),
        ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", |s| {
            s.failure.load(Relaxed)
        }),
        ("nv_inference_count", "Number of inferences performed (batch rows)", |s| s.inference_count.load(Relaxed)),
        ("nv_inference_exec_count", "Number of model executions performed (batches)", |s| s.exec_count.load(Relaxed)),
        ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", |s| {
            s.request_us.load(Relaxed)
        }),
        ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", |s| {
            s.queue_us.load(Relaxed)
        }),
        ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds", |s| {
            s.compute_us.load(Relaxed)
        }),
        ("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution", |s| {
            s.pending.load(Relaxed)
        }),
    ];
    for (name, help, get) in counters {
        let kind = if name.ends_with("pending_request_count") { "gauge" } else { "counter" };
        family(&mut out, name, kind, help);
        for m in models {
            let _ = writeln!(out, "{name}{{model=\"{}\",version=\"{}\"}} {}", m.model, m.version, get(m.stats));
        }
    }
    family(
        &mut out,
        "aim_inference_latency",
        "summary",
        "Request latency in seconds, receipt to response (quantiles over the recent requests)",
    );
    for m in models {
        let ([p50, p90, p99], sum, count) = m.stats.latency();
        let l = format!("model=\"{}\",version=\"{}\"", m.model, m.version);
        for (q, v) in [("0.5", p50), ("0.9", p90), ("0.99", p99)] {
            let _ = writeln!(out, "aim_inference_latency{{{l},quantile=\"{q}\"}} {}", v as f64 / 1e6);
        }
        let _ = writeln!(out, "aim_inference_latency_sum{{{l}}} {}", sum as f64 / 1e6);
        let _ = writeln!(out, "aim_inference_latency_count{{{l}}} {count}");
    }
    family(
        &mut out,
        "aim_hw_utilization",
        "gauge",
        "Fraction of the time since the last scrape a device's model instances were running",
    );
    for d in devices {
        let _ = writeln!(out, "aim_hw_utilization{{device=\"{}\"}} {:.4}", d.name, d.utilization());
    }
    family(&mut out, "aim_model_versions", "gauge", "Versions of each model loaded and served");
    for (model, n) in versions {
        let _ = writeln!(out, "aim_model_versions{{model=\"{model}\"}} {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_family_with_labels() {
        let s = ModelStats::default();
        for us in 1..=100 {
            s.answered(us != 100, Duration::from_micros(us * 10));
        }
        s.inference_count.store(99, Relaxed);
        s.exec_count.store(30, Relaxed);
        let d = DeviceStats::new("cpu");
        d.busy_ns.store(1, Relaxed);
        let text = render(&[Labelled { model: "mlp", version: 1, stats: &s }], &[&d], &[("mlp", 1)]);
        for line in [
            "nv_inference_request_success{model=\"mlp\",version=\"1\"} 99",
            "nv_inference_request_failure{model=\"mlp\",version=\"1\"} 1",
            "nv_inference_count{model=\"mlp\",version=\"1\"} 99",
            "nv_inference_exec_count{model=\"mlp\",version=\"1\"} 30",
            // The failed request (the 100th, 1000 us) is counted, not timed.
            "nv_inference_request_duration_us{model=\"mlp\",version=\"1\"} 49500",
            "# TYPE nv_inference_pending_request_count gauge",
            "aim_inference_latency{model=\"mlp\",version=\"1\",quantile=\"0.5\"} 0.0005",
            "aim_inference_latency{model=\"mlp\",version=\"1\",quantile=\"0.99\"} 0.00098",
            "aim_inference_latency_count{model=\"mlp\",version=\"1\"} 99",
            "aim_model_versions{model=\"mlp\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(text.contains("aim_hw_utilization{device=\"cpu\"}"));
    }
}
