//! The REST endpoints of the KServe v2 / Open Inference Protocol (health, server and model
//! metadata, readiness, inference), Triton's `/config`, and `/metrics` on its own port.

use super::config::ServeConfig;
use super::metrics::{self, DeviceStats, Labelled};
use super::protocol::{self, ApiError, OutputRequest};
use super::served::{Port, Served};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// What the handlers share: the models, the devices and the server's limits.
pub struct Shared {
    /// Every model version served, grouped by model, versions ascending.
    pub models: Vec<Arc<Served>>,
    /// The configuration they came from (devices and fallbacks for `/v2`).
    pub config: ServeConfig,
    /// The serving devices' counters.
    pub devices: Vec<Arc<DeviceStats>>,
    /// The largest request body taken, in bytes.
    pub max_body: usize,
    /// False once shutdown began.
    pub ready: AtomicBool,
    /// The memory that bodies being decoded may take at once.
    pub decoding: DecodeBudget,
}

/// Bytes of memory a body's decoding may take per byte of body, at most: a JSON number of
/// two bytes (`0,`) becomes a 16-byte leaf, then 8 bytes of f64 and up to 8 of tensor.
const DECODE_BYTES_PER_BODY_BYTE: usize = 16;

/// The memory that request bodies being decoded may take at once, in KiB: each request
/// reserves its share (its body's length times [`DECODE_BYTES_PER_BODY_BYTE`]) before its
/// body is parsed on the blocking pool, and waits while others hold the rest. JSON is
/// parsed off the runtime's two threads, so that health checks and metrics answer at once
/// whatever the requests in flight; the budget keeps many large bodies from taking all
/// memory together.
pub struct DecodeBudget {
    permits: tokio::sync::Semaphore,
    kib: u32,
}

impl DecodeBudget {
    /// Room for two bodies of `max_body` bytes at their worst, and at least 256 MiB.
    pub fn new(max_body: usize) -> DecodeBudget {
        let kib = (max_body / 1024).saturating_mul(2 * DECODE_BYTES_PER_BODY_BYTE).clamp(256 * 1024, 1 << 30);
        DecodeBudget { permits: tokio::sync::Semaphore::new(kib), kib: kib as u32 }
    }

    /// Waits for the share of a body of `len` bytes.
    async fn reserve(&self, len: usize) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
        let want = (len / 1024).saturating_mul(DECODE_BYTES_PER_BODY_BYTE).clamp(1, self.kib as usize) as u32;
        self.permits.acquire_many(want).await.map_err(|_| ApiError::new(503, "the server is shutting down"))
    }
}

/// Runs `f` on the blocking pool (decoding or encoding a body), off the runtime's threads.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::new(500, format!("a request's decoding failed: {e}")))
}

type St = State<Arc<Shared>>;

/// The binary extension's header naming the JSON part's length.
pub const HEADER_LEN: &str = "inference-header-content-length";

impl Shared {
    /// A model's version (the latest when none is named).
    pub fn find(&self, model: &str, version: Option<&str>) -> Result<&Arc<Served>, ApiError> {
        let versions: Vec<&Arc<Served>> = self.models.iter().filter(|s| s.model == model).collect();
        if versions.is_empty() {
            let names: Vec<&str> = self.config.models.iter().map(|m| m.name.as_str()).collect();
            return Err(ApiError::bad(format!("unknown model '{model}' (served: {})", names.join(", "))));
        }
        match version {
            None => Ok(versions[versions.len() - 1]),
            Some(v) => versions
                .into_iter()
                .find(|s| s.version.to_string() == v)
                .ok_or_else(|| ApiError::bad(format!("model '{model}' has no version '{v}'"))),
        }
    }
}

/// A JSON response.
fn json_response(status: u16, v: &Value) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &json!({ "error": self.message }))
    }
}

/// The inference API's routes.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/{model}", get(|s: St, Path(m): Path<String>| async move { metadata(s, m, None) }))
        .route(
            "/v2/models/{model}/versions/{version}",
            get(|s: St, Path((m, v)): Path<(String, String)>| async move { metadata(s, m, Some(v)) }),
        )
        .route("/v2/models/{model}/ready", get(|s: St, Path(m): Path<String>| async move { model_ready(s, m, None) }))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(|s: St, Path((m, v)): Path<(String, String)>| async move { model_ready(s, m, Some(v)) }),
        )
        .route("/v2/models/{model}/config", get(|s: St, Path(m): Path<String>| async move { config(s, m, None) }))
        .route(
            "/v2/models/{model}/versions/{version}/config",
            get(|s: St, Path((m, v)): Path<(String, String)>| async move { config(s, m, Some(v)) }),
        )
        .route(
            "/v2/models/{model}/infer",
            post(|s: St, Path(m): Path<String>, h: HeaderMap, b: Body| async move { infer(s, m, None, h, b).await }),
        )
        .route(
            "/v2/models/{model}/versions/{version}/infer",
            post(|s: St, Path((m, v)): Path<(String, String)>, h: HeaderMap, b: Body| async move {
                infer(s, m, Some(v), h, b).await
            }),
        )
        .fallback(|uri: axum::http::Uri| async move {
            ApiError::new(404, format!("no endpoint {uri} (the KServe v2 API is under /v2)"))
        })
        .with_state(shared)
}

/// The metrics port's one route.
pub fn metrics_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(s): St| async move {
                let labelled: Vec<Labelled<'_>> = s
                    .models
                    .iter()
                    .map(|m| Labelled { model: &m.model, version: m.version, stats: &m.stats })
                    .collect();
                let devices: Vec<&DeviceStats> = s.devices.iter().map(|d| &**d).collect();
                let versions: Vec<(&str, usize)> =
                    s.config.models.iter().map(|m| (m.name.as_str(), m.versions.len())).collect();
                let text = metrics::render(&labelled, &devices, &versions);
                ([("content-type", "text/plain; version=0.0.4")], text)
            }),
        )
        .with_state(shared)
}

async fn ready(State(s): St) -> StatusCode {
    if s.ready.load(Relaxed) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn server_metadata(State(s): St) -> Response {
    let devices: Vec<Value> = s
        .config
        .devices
        .iter()
        .map(|d| {
            let mut v = json!({ "name": d.name, "type": d.kind.name(), "weight": d.weight });
            match &d.unavailable {
                None => v["serving"] = json!(true),
                Some(why) => {
                    v["serving"] = json!(false);
                    v["reason"] = json!(why);
                    v["traffic_to"] = json!(d.serves_on);
                }
            }
            v
        })
        .collect();
    json_response(
        200,
        &json!({
            "name": "aim",
            "version": env!("CARGO_PKG_VERSION"),
            "extensions": ["binary_tensor_data", "model_configuration"],
            "devices": devices,
            "scheduler": s.config.policy.name(),
        }),
    )
}

fn ports(p: &[Port]) -> Vec<Value> {
    p.iter()
        .map(|p| {
            let shape: Vec<i64> = p.dims.iter().map(|d| d.map_or(-1, |n| n as i64)).collect();
            json!({ "name": p.name, "datatype": protocol::datatype_name(p.dtype), "shape": shape })
        })
        .collect()
}

fn metadata(State(s): St, model: String, version: Option<String>) -> Response {
    match s.find(&model, version.as_deref()) {
        Err(e) => e.into_response(),
        Ok(m) => {
            let versions: Vec<String> =
                s.models.iter().filter(|x| x.model == model).map(|x| x.version.to_string()).collect();
            json_response(
                200,
                &json!({
                    "name": m.model,
                    "versions": versions,
                    "platform": "aim",
                    "inputs": ports(&m.inputs),
                    "outputs": ports(&m.outputs),
                }),
            )
        }
    }
}

fn model_ready(State(s): St, model: String, version: Option<String>) -> Response {
    match s.find(&model, version.as_deref()) {
        Err(e) => e.into_response(),
        Ok(_) if s.ready.load(Relaxed) => StatusCode::OK.into_response(),
        Ok(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// Triton's model configuration (what its clients and perf tools read).
fn config(State(s): St, model: String, version: Option<String>) -> Response {
    match s.find(&model, version.as_deref()) {
        Err(e) => e.into_response(),
        Ok(m) => {
            let b = &m.batching;
            let batched = b.max_batch_size > 0;
            // Triton's dims leave out the batch dim of a batched model.
            let dims = |p: &[Port]| -> Vec<Value> {
                p.iter()
                    .map(|p| {
                        let d: Vec<i64> =
                            p.dims.iter().skip(batched as usize).map(|d| d.map_or(-1, |n| n as i64)).collect();
                        json!({ "name": p.name, "data_type": format!("TYPE_{}", protocol::datatype_name(p.dtype)), "dims": d })
                    })
                    .collect()
            };
            let mut c = json!({
                "name": m.model,
                "platform": "aim",
                "max_batch_size": b.max_batch_size,
                "input": dims(&m.inputs),
                "output": dims(&m.outputs),
            });
            if batched {
                c["dynamic_batching"] = json!({
                    "preferred_batch_size": b.preferred_batch_size,
                    "max_queue_delay_microseconds": b.max_queue_delay.as_micros() as u64,
                    "default_queue_policy": {
                        "max_queue_size": b.max_queue_size,
                        "default_timeout_microseconds": b.default_timeout.map_or(0, |t| t.as_micros() as u64),
                    },
                });
            }
            json_response(200, &c)
        }
    }
}

async fn infer(State(s): St, model: String, version: Option<String>, headers: HeaderMap, body: Body) -> Response {
    let m = match s.find(&model, version.as_deref()) {
        Ok(m) => m.clone(),
        Err(e) => return unread(body, e.into_response()).await,
    };
    m.stats.pending.fetch_add(1, Relaxed);
    // The clock starts once the body is read and decoded (`infer_on` sets it), as Triton's.
    let mut decoded = None;
    let result = infer_on(&s, &m, headers, body, &mut decoded).await;
    m.stats.pending.fetch_sub(1, Relaxed);
    m.stats.answered(result.is_ok(), decoded.map(|t: Instant| t.elapsed()).unwrap_or_default());
    match result {
        Ok(r) => r,
        // A body over the limit is refused before it is all read: the connection closes.
        Err(e) if e.status == 413 => closing(e.into_response()),
        Err(e) => e.into_response(),
    }
}

/// Bytes of an unread request body that are read and dropped so that its connection stays
/// usable, and how long that may take.
const DRAIN_BYTES: usize = 1 << 20;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// `r`, answering a request whose body was not read: the connection's next request would
/// start inside that body, so hyper closes it — without a word, and the client's next
/// request on it failed with a broken pipe. A small body (up to [`DRAIN_BYTES`], within
/// [`DRAIN_TIME`]) is read and dropped first, so the connection stays alive; past that the
/// response says `Connection: close`.
async fn unread(mut body: Body, r: Response) -> Response {
    let drained = tokio::time::timeout(DRAIN_TIME, async {
        let mut left = DRAIN_BYTES;
        while let Some(frame) = body.frame().await {
            match frame.map(|f| f.into_data()) {
                Ok(Ok(d)) if d.len() <= left => left -= d.len(),
                Ok(Err(_)) => {}
                _ => return false,
            }
        }
        true
    })
    .await;
    if drained == Ok(true) {
        r
    } else {
        closing(r)
    }
}

/// `r` with `Connection: close`: the server closes the connection after it.
fn closing(mut r: Response) -> Response {
    r.headers_mut().insert(axum::http::header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Reads, decodes and serves a request; `decoded` is set when the request is decoded (where
/// its metrics' clock starts).
async fn infer_on(
    s: &Shared,
    m: &Served,
    headers: HeaderMap,
    body: Body,
    decoded: &mut Option<Instant>,
) -> Result<Response, ApiError> {
    let too_big = || ApiError::new(413, format!("the request body is over the server's limit of {} bytes", s.max_body));
    if let Some(n) = headers.get("content-length").and_then(|v| v.to_str().ok()?.parse::<usize>().ok()) {
        if n > s.max_body {
            return Err(too_big());
        }
    }
    // Read frame by frame, refused as soon as it passes the limit (a chunked body has no
    // length to check first).
    let mut body = body;
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad(format!("reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > s.max_body {
                return Err(too_big());
            }
            buf.extend_from_slice(&data);
        }
    }
    let bytes = axum::body::Bytes::from(buf);
    let header_len = protocol::header_len(headers.get(HEADER_LEN).map(|v| v.as_bytes()))?;
    let share = s.decoding.reserve(bytes.len()).await?;
    let req = off_runtime(move || protocol::parse_infer(bytes, header_len)).await??;
    drop(share);
    *decoded = Some(Instant::now());
    let wanted: Vec<(usize, bool)> = match &req.outputs {
        None => (0..m.outputs.len()).map(|i| (i, req.binary_output)).collect(),
        Some(list) => list
            .iter()
            .map(|OutputRequest { name, binary }| Ok((m.output_index(name)?, *binary)))
            .collect::<Result<_, ApiError>>()?,
    };
    let done = m.request(req.inputs, req.timeout).await?;
    let outputs: Vec<(String, aim_ir::Tensor, bool)> =
        wanted.iter().map(|&(i, b)| (m.outputs[i].name.clone(), done.outputs[i].clone(), b)).collect();
    let (model, version, id) = (m.model.clone(), m.version, req.id.clone());
    let enc = off_runtime(move || protocol::encode_response(&model, version, id.as_deref(), &outputs)).await?;
    let mut r = Response::new(Body::from(enc.body));
    let h = r.headers_mut();
    match enc.header_len {
        Some(n) => {
            h.insert("content-type", HeaderValue::from_static("application/octet-stream"));
            h.insert(HEADER_LEN, HeaderValue::from(n));
        }
        None => {
            h.insert("content-type", HeaderValue::from_static("application/json"));
        }
    }
    Ok(r)
}
