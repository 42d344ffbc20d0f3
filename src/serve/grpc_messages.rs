//! The messages of the KServe v2 / Triton `inference.GRPCInferenceService` that aim serves,
//! declared with prost's derive (field numbers as in the protocol's `.proto`, so Triton's
//! own gRPC client talks to it unchanged). Only the calls aim answers are here.

use std::collections::HashMap;

/// `ServerLiveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerLiveRequest {}

/// `ServerLiveResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerLiveResponse {
    /// Whether the server is live.
    #[prost(bool, tag = "1")]
    pub live: bool,
}

/// `ServerReadyRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerReadyRequest {}

/// `ServerReadyResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerReadyResponse {
    /// Whether the server takes requests (false once shutdown began).
    #[prost(bool, tag = "1")]
    pub ready: bool,
}

/// `ModelReadyRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelReadyRequest {
    /// The model.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its version ("": the latest).
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `ModelReadyResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelReadyResponse {
    /// Whether the model takes requests.
    #[prost(bool, tag = "1")]
    pub ready: bool,
}

/// `ServerMetadataRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMetadataRequest {}

/// `ServerMetadataResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMetadataResponse {
    /// The server's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its version.
    #[prost(string, tag = "2")]
    pub version: String,
    /// The protocol extensions it supports.
    #[prost(string, repeated, tag = "3")]
    pub extensions: Vec<String>,
}

/// `ModelMetadataRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelMetadataRequest {
    /// The model.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its version ("": the latest).
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `ModelMetadataResponse.TensorMetadata`: an input or output.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorMetadata {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its datatype (`FP32`, `INT64`, ...).
    #[prost(string, tag = "2")]
    pub datatype: String,
    /// Its shape, -1 for symbolic dims.
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
}

/// `ModelMetadataResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelMetadataResponse {
    /// The model.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The versions served.
    #[prost(string, repeated, tag = "2")]
    pub versions: Vec<String>,
    /// The framework (`aim`).
    #[prost(string, tag = "3")]
    pub platform: String,
    /// Its inputs.
    #[prost(message, repeated, tag = "4")]
    pub inputs: Vec<TensorMetadata>,
    /// Its outputs.
    #[prost(message, repeated, tag = "5")]
    pub outputs: Vec<TensorMetadata>,
}

/// `InferParameter`: a request or tensor parameter.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferParameter {
    /// Its value.
    #[prost(oneof = "ParameterChoice", tags = "1, 2, 3, 4, 5")]
    pub parameter_choice: Option<ParameterChoice>,
}

/// The value of an [`InferParameter`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ParameterChoice {
    /// A bool.
    #[prost(bool, tag = "1")]
    BoolParam(bool),
    /// A signed integer.
    #[prost(int64, tag = "2")]
    Int64Param(i64),
    /// A string.
    #[prost(string, tag = "3")]
    StringParam(String),
    /// A double.
    #[prost(double, tag = "4")]
    DoubleParam(f64),
    /// An unsigned integer.
    #[prost(uint64, tag = "5")]
    Uint64Param(u64),
}

/// `InferTensorContents`: tensor data as typed lists (the alternative to raw contents).
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferTensorContents {
    /// BOOL data.
    #[prost(bool, repeated, tag = "1")]
    pub bool_contents: Vec<bool>,
    /// INT8, INT16 and INT32 data.
    #[prost(int32, repeated, tag = "2")]
    pub int_contents: Vec<i32>,
    /// INT64 data.
    #[prost(int64, repeated, tag = "3")]
    pub int64_contents: Vec<i64>,
    /// UINT8, UINT16 and UINT32 data.
    #[prost(uint32, repeated, tag = "4")]
    pub uint_contents: Vec<u32>,
    /// UINT64 data.
    #[prost(uint64, repeated, tag = "5")]
    pub uint64_contents: Vec<u64>,
    /// FP32 data.
    #[prost(float, repeated, tag = "6")]
    pub fp32_contents: Vec<f32>,
    /// FP64 data.
    #[prost(double, repeated, tag = "7")]
    pub fp64_contents: Vec<f64>,
    /// BYTES data (not served by aim).
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub bytes_contents: Vec<Vec<u8>>,
}

/// `ModelInferRequest.InferInputTensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferInputTensor {
    /// The input's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its datatype.
    #[prost(string, tag = "2")]
    pub datatype: String,
    /// Its shape.
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
    /// Its parameters.
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    /// Its data, when not in the request's raw contents.
    #[prost(message, optional, tag = "5")]
    pub contents: Option<InferTensorContents>,
}

/// `ModelInferRequest.InferRequestedOutputTensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferRequestedOutputTensor {
    /// The output's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its parameters.
    #[prost(map = "string, message", tag = "2")]
    pub parameters: HashMap<String, InferParameter>,
}

/// `ModelInferRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInferRequest {
    /// The model.
    #[prost(string, tag = "1")]
    pub model_name: String,
    /// Its version ("": the latest).
    #[prost(string, tag = "2")]
    pub model_version: String,
    /// The request's id, echoed.
    #[prost(string, tag = "3")]
    pub id: String,
    /// Request parameters (`timeout` in microseconds).
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    /// The inputs.
    #[prost(message, repeated, tag = "5")]
    pub inputs: Vec<InferInputTensor>,
    /// The outputs asked for (none: all).
    #[prost(message, repeated, tag = "6")]
    pub outputs: Vec<InferRequestedOutputTensor>,
    /// Each input's bytes, in input order (empty when the inputs carry `contents`).
    #[prost(bytes = "vec", repeated, tag = "7")]
    pub raw_input_contents: Vec<Vec<u8>>,
}

/// `ModelInferResponse.InferOutputTensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferOutputTensor {
    /// The output's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its datatype.
    #[prost(string, tag = "2")]
    pub datatype: String,
    /// Its shape.
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
    /// Its parameters.
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    /// Typed data (aim sends raw contents instead).
    #[prost(message, optional, tag = "5")]
    pub contents: Option<InferTensorContents>,
}

/// `ModelInferResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInferResponse {
    /// The model.
    #[prost(string, tag = "1")]
    pub model_name: String,
    /// The version that ran.
    #[prost(string, tag = "2")]
    pub model_version: String,
    /// The request's id.
    #[prost(string, tag = "3")]
    pub id: String,
    /// Response parameters.
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    /// The outputs.
    #[prost(message, repeated, tag = "5")]
    pub outputs: Vec<InferOutputTensor>,
    /// Each output's bytes, in output order.
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub raw_output_contents: Vec<Vec<u8>>,
}
