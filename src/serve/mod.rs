//! `aim serve`: models behind the KServe v2 / Open Inference Protocol REST and gRPC APIs,
//! with dynamic batching per model, `deploy.yml` devices and scheduling, and Prometheus
//! metrics.
//!
//! Requests are parsed on the async HTTP threads, queued per model version, gathered into
//! batches by one worker thread per (version, device) that runs the model, and answered
//! through a one-shot channel each. SIGTERM (or Ctrl-C) stops accepting connections,
//! finishes every request already received, then stops the workers.

pub mod config;
pub mod grpc;
pub mod grpc_messages;
pub mod http;
pub mod json_data;
pub mod metrics;
pub mod protocol;
pub mod queue;
pub mod served;

use anyhow::{Context, Result};
use config::ServeConfig;
use metrics::DeviceStats;
use served::Served;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Where and how the server listens.
#[derive(Debug, Clone)]
pub struct Listen {
    /// The address to bind (`0.0.0.0` in a container, `127.0.0.1` for local use).
    pub host: String,
    /// The inference API's port (0: any free port).
    pub http_port: u16,
    /// The gRPC inference API's port (0: any free port).
    pub grpc_port: u16,
    /// The metrics port (0: any free port).
    pub metrics_port: u16,
    /// The largest request body taken, in bytes.
    pub max_body: usize,
    /// After the stop signal, how long the requests received may take to finish; then the
    /// connections still open are closed.
    pub shutdown_timeout: std::time::Duration,
}

/// Loads every model version on every serving device, then serves until SIGTERM or Ctrl-C.
pub fn serve(cfg: ServeConfig, listen: &Listen) -> Result<()> {
    for lib in &cfg.custom_ops {
        let ops = crate::register_custom_ops_library(lib)?;
        eprintln!("aim serve: custom ops {} from {}", ops.join(", "), lib.display());
    }
    for d in &cfg.devices {
        if let Some(why) = &d.unavailable {
            eprintln!(
                "aim serve: device '{}' ({}) cannot serve here ({why}); its traffic goes to '{}'",
                d.name,
                d.kind.name(),
                d.serves_on
            );
        }
    }
    let serving: Vec<(config::Device, Arc<DeviceStats>)> =
        cfg.serving_devices().map(|d| (d.clone(), Arc::new(DeviceStats::new(&d.name)))).collect();
    let weights: Vec<u32> = serving.iter().map(|(d, _)| cfg.traffic_weight(&d.name)).collect();
    let mut models = Vec::new();
    for m in &cfg.models {
        for (v, path) in &m.versions {
            let t = std::time::Instant::now();
            let s = Served::start(m, *v, path, &serving, cfg.policy, &weights)?;
            let b = &s.batching;
            eprintln!(
                "aim serve: model '{}' version {v} loaded from {} in {:.0} ms on {}; {}",
                m.name,
                path.display(),
                t.elapsed().as_secs_f64() * 1e3,
                serving.iter().map(|(d, _)| d.name.as_str()).collect::<Vec<_>>().join(", "),
                if b.max_batch_size > 0 {
                    format!("batches of up to {} within {} us", b.max_batch_size, b.max_queue_delay.as_micros())
                } else {
                    "no batching".to_string()
                }
            );
            models.push(Arc::new(s));
        }
    }
    let shared = Arc::new(http::Shared {
        models,
        config: cfg,
        devices: serving.iter().map(|(_, s)| s.clone()).collect(),
        max_body: listen.max_body,
        ready: AtomicBool::new(true),
        decoding: http::DecodeBudget::new(listen.max_body),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("aim-http")
        .enable_all()
        .build()
        .context("starting the server's runtime")?;
    let result = rt.block_on(run(shared.clone(), listen));
    // Every request received has been answered (graceful shutdown waits for them); stop
    // the workers, which finish anything still queued.
    shared.ready.store(false, Relaxed);
    for m in &shared.models {
        m.stop();
    }
    let served: u64 = shared.models.iter().map(|m| m.stats.success.load(Relaxed)).sum();
    eprintln!("aim serve: stopped after {served} successful requests");
    result
}

async fn run(shared: Arc<http::Shared>, listen: &Listen) -> Result<()> {
    let bind = |port: u16| {
        let host = listen.host.clone();
        async move {
            tokio::net::TcpListener::bind((host.as_str(), port)).await.with_context(|| format!("binding {host}:{port}"))
        }
    };
    let api = bind(listen.http_port).await?;
    let grpc = bind(listen.grpc_port).await?;
    let metrics = bind(listen.metrics_port).await?;
    eprintln!(
        "aim serve: KServe v2 HTTP on {}, gRPC on {}, metrics on http://{}/metrics",
        api.local_addr()?,
        grpc.local_addr()?,
        metrics.local_addr()?
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut deadline_rx = stop_rx.clone();
    let timeout = listen.shutdown_timeout;
    // The drain is bounded: past the timeout the servers are dropped, closing whatever
    // connections remain (a client holding a half-sent request kept the server alive).
    let deadline = async move {
        let _ = deadline_rx.wait_for(|s| *s).await;
        tokio::time::sleep(timeout).await;
    };
    let flag = shared.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        eprintln!("aim serve: shutting down: finishing the requests received");
        flag.ready.store(false, Relaxed);
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let a = axum::serve(api, http::router(shared.clone())).with_graceful_shutdown(stopped(stop_rx.clone()));
    let g = tonic::transport::Server::builder().serve_with_incoming_shutdown(
        grpc::Inference::new(shared.clone()),
        tonic::transport::server::TcpIncoming::from(grpc),
        stopped(stop_rx.clone()),
    );
    let m = axum::serve(metrics, http::metrics_router(shared)).with_graceful_shutdown(stopped(stop_rx));
    let (a, g, m) = tokio::select! {
        r = async { tokio::join!(a, g, m) } => r,
        _ = deadline => {
            eprintln!(
                "aim serve: connections still open {:.0} s after the stop signal (--shutdown-timeout): closing them",
                timeout.as_secs_f64()
            );
            return Ok(());
        }
    };
    a.context("the inference server")?;
    g.context("the gRPC inference server")?;
    m.context("the metrics server")?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
