//! The KServe v2 / Triton gRPC API (`inference.GRPCInferenceService` over HTTP/2, tonic):
//! liveness and readiness, server and model metadata, and `ModelInfer` with raw tensor
//! contents (what Triton's gRPC client sends) or typed contents. Requests join the same
//! per-model queues, batches and metrics as the REST API's. Other calls of Triton's service
//! (model configuration, statistics, repository control, shared memory) answer
//! `UNIMPLEMENTED`.

use super::grpc_messages::*;
use super::http::Shared;
use super::protocol::{self, ApiError};
use super::served::{Port, Served};
use aim_ir::{DType, Tensor};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tonic::{Code, Status};

/// The service's full name, as the gRPC paths start.
pub const SERVICE: &str = "inference.GRPCInferenceService";

/// The gRPC service over the server's models.
#[derive(Clone)]
pub struct Inference {
    shared: Arc<Shared>,
}

impl Inference {
    /// The service answering from `shared` (the models the REST API serves too).
    pub fn new(shared: Arc<Shared>) -> Inference {
        Inference { shared }
    }
}

impl tonic::server::NamedService for Inference {
    const NAME: &'static str = SERVICE;
}

/// The gRPC status of a refused or failed request.
fn status(e: ApiError) -> Status {
    let code = match e.status {
        400 => Code::InvalidArgument,
        404 => Code::NotFound,
        413 => Code::ResourceExhausted,
        503 => Code::Unavailable,
        _ => Code::Internal,
    };
    Status::new(code, e.message)
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One unary call's handler, called once.
struct Call<F>(Option<F>);

impl<T, U, F, Fut> tonic::server::UnaryService<T> for Call<F>
where
    F: FnOnce(T) -> Fut,
    Fut: Future<Output = Result<U, Status>> + Send + 'static,
{
    type Response = U;
    type Future = BoxFuture<Result<tonic::Response<U>, Status>>;

    fn call(&mut self, request: tonic::Request<T>) -> Self::Future {
        let fut = self.0.take().map(|f| f(request.into_inner()));
        Box::pin(async move {
            match fut {
                Some(fut) => fut.await.map(tonic::Response::new),
                None => Err(Status::internal("a call's handler ran twice")),
            }
        })
    }
}

/// Decodes the request message `T` (at most `limit` bytes), runs `f` and encodes its answer.
async fn unary<T, U, F, Fut, B>(limit: usize, req: http::Request<B>, f: F) -> http::Response<tonic::body::Body>
where
    T: prost::Message + Default + Send + 'static,
    U: prost::Message + Send + 'static,
    F: FnOnce(T) -> Fut,
    Fut: Future<Output = Result<U, Status>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let codec = tonic_prost::ProstCodec::<U, T>::default();
    let mut grpc =
        tonic::server::Grpc::new(codec).max_decoding_message_size(limit).max_encoding_message_size(usize::MAX);
    grpc.unary(Call(Some(f)), req).await
}

impl<B> tower_service::Service<http::Request<B>> for Inference
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let s = self.shared.clone();
        let limit = s.max_body;
        let method = req.uri().path().strip_prefix(&format!("/{SERVICE}/")).unwrap_or("").to_string();
        Box::pin(async move {
            let ready = s.ready.load(Relaxed);
            Ok(match method.as_str() {
                "ServerLive" => {
                    unary(limit, req, |_: ServerLiveRequest| async { Ok(ServerLiveResponse { live: true }) }).await
                }
                "ServerReady" => {
                    unary(limit, req, move |_: ServerReadyRequest| async move { Ok(ServerReadyResponse { ready }) })
                        .await
                }
                "ModelReady" => {
                    unary(limit, req, move |r: ModelReadyRequest| {
                        let found = find(&s, &r.name, &r.version).map(|_| ModelReadyResponse { ready });
                        async move { found }
                    })
                    .await
                }
                "ServerMetadata" => {
                    unary(limit, req, |_: ServerMetadataRequest| async {
                        Ok(ServerMetadataResponse {
                            name: "aim".into(),
                            version: env!("CARGO_PKG_VERSION").into(),
                            extensions: vec!["binary_tensor_data".into(), "model_configuration".into()],
                        })
                    })
                    .await
                }
                "ModelMetadata" => {
                    unary(limit, req, move |r: ModelMetadataRequest| {
                        let answer = find(&s, &r.name, &r.version).map(|m| metadata(&s, m));
                        async move { answer }
                    })
                    .await
                }
                "ModelInfer" => unary(limit, req, move |r: ModelInferRequest| infer(s, r)).await,
                other => Status::unimplemented(format!("aim serve does not implement {SERVICE}/{other}")).into_http(),
            })
        })
    }
}

/// A model's version ("" for the latest).
fn find<'s>(s: &'s Shared, model: &str, version: &str) -> Result<&'s Arc<Served>, Status> {
    let version = (!version.is_empty()).then_some(version);
    s.find(model, version).map_err(|e| Status::not_found(e.message))
}

fn tensor_metadata(ports: &[Port]) -> Vec<TensorMetadata> {
    ports
        .iter()
        .map(|p| TensorMetadata {
            name: p.name.clone(),
            datatype: protocol::datatype_name(p.dtype).into(),
            shape: p.dims.iter().map(|d| d.map_or(-1, |n| n as i64)).collect(),
        })
        .collect()
}

fn metadata(s: &Shared, m: &Served) -> ModelMetadataResponse {
    ModelMetadataResponse {
        name: m.model.clone(),
        versions: s.models.iter().filter(|x| x.model == m.model).map(|x| x.version.to_string()).collect(),
        platform: "aim".into(),
        inputs: tensor_metadata(&m.inputs),
        outputs: tensor_metadata(&m.outputs),
    }
}

/// `ModelInfer`: counted in the model's metrics as the REST API's requests are.
async fn infer(s: Arc<Shared>, r: ModelInferRequest) -> Result<ModelInferResponse, Status> {
    let start = Instant::now();
    let m = find(&s, &r.model_name, &r.model_version)?.clone();
    m.stats.pending.fetch_add(1, Relaxed);
    let result = infer_on(&m, r).await;
    m.stats.pending.fetch_sub(1, Relaxed);
    m.stats.answered(result.is_ok(), start.elapsed());
    result.map_err(status)
}

async fn infer_on(m: &Served, r: ModelInferRequest) -> Result<ModelInferResponse, ApiError> {
    let raw = !r.raw_input_contents.is_empty();
    if raw && r.raw_input_contents.len() != r.inputs.len() {
        return Err(ApiError::bad(format!(
            "{} inputs but {} raw_input_contents (one per input, in order)",
            r.inputs.len(),
            r.raw_input_contents.len()
        )));
    }
    let mut raws = r.raw_input_contents.into_iter();
    let mut inputs = Vec::with_capacity(r.inputs.len());
    for t in r.inputs {
        let what = |msg: String| ApiError::bad(format!("input '{}': {msg}", t.name));
        let dtype = protocol::parse_datatype(&t.datatype)
            .ok_or_else(|| what(format!("datatype '{}' is not one aim serves", t.datatype)))?;
        let shape = t
            .shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| what(format!("shape {:?} has a negative dim", t.shape))))
            .collect::<Result<Vec<usize>, _>>()?;
        if inputs.iter().any(|(n, _): &(String, Tensor)| n == &t.name) {
            return Err(ApiError::bad(format!("input '{}' is given twice", t.name)));
        }
        let bytes = match (raws.next(), &t.contents) {
            // One rule with HTTP, which refuses binary data and a 'data' list together.
            (Some(_), Some(_)) => return Err(what("has both raw_input_contents and contents".into())),
            (Some(b), None) => b,
            (None, Some(c)) => typed_bytes(dtype, c).map_err(what)?,
            (None, None) => return Err(what("no data: neither raw_input_contents nor contents".into())),
        };
        let tensor = Tensor::from_bytes(dtype, &shape, &bytes).map_err(|e| what(e.to_string()))?;
        inputs.push((t.name, tensor));
    }
    let timeout = match r.parameters.get("timeout").and_then(|p| p.parameter_choice.as_ref()) {
        None => None,
        Some(ParameterChoice::Int64Param(us)) if *us >= 0 => Some(Duration::from_micros(*us as u64)),
        Some(ParameterChoice::Uint64Param(us)) => Some(Duration::from_micros(*us)),
        Some(p) => return Err(ApiError::bad(format!("the timeout parameter must be microseconds, got {p:?}"))),
    };
    let wanted: Vec<usize> = if r.outputs.is_empty() {
        (0..m.outputs.len()).collect()
    } else {
        r.outputs.iter().map(|o| m.output_index(&o.name)).collect::<Result<_, _>>()?
    };
    let done = m.request(inputs, timeout).await?;
    let mut resp = ModelInferResponse {
        model_name: m.model.clone(),
        model_version: m.version.to_string(),
        id: r.id,
        ..Default::default()
    };
    for i in wanted {
        let t = &done.outputs[i];
        resp.outputs.push(InferOutputTensor {
            name: m.outputs[i].name.clone(),
            datatype: protocol::datatype_name(t.dtype()).into(),
            shape: t.shape().iter().map(|&d| d as i64).collect(),
            ..Default::default()
        });
        resp.raw_output_contents.push(t.bytes().to_vec());
    }
    Ok(resp)
}

/// The little-endian bytes of typed contents for `dtype` (their list for the type must be
/// the one filled; lengths are checked against the shape by the caller).
fn typed_bytes(dtype: DType, c: &InferTensorContents) -> Result<Vec<u8>, String> {
    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    fn narrow<T: TryFrom<i64>>(v: impl Iterator<Item = i64>, dtype: DType) -> Result<Vec<T>, String> {
        v.map(|x| T::try_from(x).map_err(|_| format!("{x} does not fit {}", protocol::datatype_name(dtype)))).collect()
    }
    Ok(match dtype {
        DType::F32 => le(&c.fp32_contents, f32::to_le_bytes),
        DType::F64 => le(&c.fp64_contents, f64::to_le_bytes),
        DType::I64 => le(&c.int64_contents, i64::to_le_bytes),
        DType::I32 => le(&c.int_contents, i32::to_le_bytes),
        DType::I16 => le(&narrow::<i16>(c.int_contents.iter().map(|&x| x.into()), dtype)?, i16::to_le_bytes),
        DType::I8 => le(&narrow::<i8>(c.int_contents.iter().map(|&x| x.into()), dtype)?, i8::to_le_bytes),
        DType::U64 => le(&c.uint64_contents, u64::to_le_bytes),
        DType::U32 => le(&c.uint_contents, u32::to_le_bytes),
        DType::U16 => le(&narrow::<u16>(c.uint_contents.iter().map(|&x| x.into()), dtype)?, u16::to_le_bytes),
        DType::U8 => le(&narrow::<u8>(c.uint_contents.iter().map(|&x| x.into()), dtype)?, u8::to_le_bytes),
        DType::Bool => c.bool_contents.iter().map(|&b| u8::from(b)).collect(),
        DType::F16 | DType::BF16 => return Err("FP16 and BF16 data must come as raw_input_contents".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_contents_become_little_endian_bytes() {
        let c = InferTensorContents { fp32_contents: vec![1.5, -2.0], ..Default::default() };
        assert_eq!(typed_bytes(DType::F32, &c).unwrap(), [1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat());
        let c = InferTensorContents { int_contents: vec![-3, 100], ..Default::default() };
        assert_eq!(typed_bytes(DType::I8, &c).unwrap(), vec![0xfd, 100]);
        let c = InferTensorContents { int_contents: vec![300], ..Default::default() };
        assert!(typed_bytes(DType::I8, &c).unwrap_err().contains("300 does not fit INT8"));
        let c = InferTensorContents { bool_contents: vec![true, false], ..Default::default() };
        assert_eq!(typed_bytes(DType::Bool, &c).unwrap(), vec![1, 0]);
        assert!(typed_bytes(DType::F16, &c).is_err());
    }

    #[test]
    fn refusals_map_to_grpc_codes() {
        assert_eq!(status(ApiError::bad("x")).code(), Code::InvalidArgument);
        assert_eq!(status(ApiError::new(503, "full")).code(), Code::Unavailable);
        assert_eq!(status(ApiError::new(500, "lost")).code(), Code::Internal);
    }
}
