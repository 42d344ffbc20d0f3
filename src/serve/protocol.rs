//! The KServe v2 / Open Inference Protocol's inference request and response: JSON tensors
//! and the binary tensor data extension (a JSON header of `Inference-Header-Content-Length`
//! bytes, then each binary tensor's bytes in order), which Triton's clients use by default.

use super::json_data::{Leaf, Leaves};
use aim_ir::{DType, Tensor};
use axum::body::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// A request the server refuses or could not serve: the HTTP status and the message sent as
/// `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status (400 for a malformed request, 404 for an unknown model, 503 for a
    /// full queue, ...).
    pub status: u16,
    /// What was wrong, naming the model, input or field.
    pub message: String,
}

impl ApiError {
    /// A 400: the request is malformed.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError { status: 400, message: message.into() }
    }
    /// Any other status.
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }
}

/// The protocol's name for a dtype (`FP32`, `INT64`, ...).
pub fn datatype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "FP32",
        DType::F64 => "FP64",
        DType::F16 => "FP16",
        DType::BF16 => "BF16",
        DType::I8 => "INT8",
        DType::I16 => "INT16",
        DType::I32 => "INT32",
        DType::I64 => "INT64",
        DType::U8 => "UINT8",
        DType::U16 => "UINT16",
        DType::U32 => "UINT32",
        DType::U64 => "UINT64",
        DType::Bool => "BOOL",
    }
}

/// The dtype a protocol datatype string names; `BYTES` (strings) and unknown names: `None`.
pub fn parse_datatype(s: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| datatype_name(d) == s)
}

/// One output a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputRequest {
    /// The output's name.
    pub name: String,
    /// Whether it is sent as binary data (else as a JSON array).
    pub binary: bool,
}

/// An inference request, parsed: tensors over the request body's bytes where they came as
/// binary data (no copy).
#[derive(Debug)]
pub struct InferRequest {
    /// The request's `id`, echoed in the response.
    pub id: Option<String>,
    /// The inputs by name, in the order given.
    pub inputs: Vec<(String, Tensor)>,
    /// The outputs asked for; `None`: every output.
    pub outputs: Option<Vec<OutputRequest>>,
    /// Whether outputs not named are sent as binary data (`binary_data_output`).
    pub binary_output: bool,
    /// The request's own queue timeout (the `timeout` parameter, microseconds).
    pub timeout: Option<Duration>,
}

/// The `Inference-Header-Content-Length` header's value (absent: None): a byte count, or a
/// 400 naming the header.
pub fn header_len(value: Option<&[u8]>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) => {
            std::str::from_utf8(v).ok().and_then(|v| v.trim().parse::<usize>().ok()).map(Some).ok_or_else(|| {
                ApiError::bad(format!(
                    "Inference-Header-Content-Length must be a byte count, got {:?}",
                    String::from_utf8_lossy(v)
                ))
            })
        }
    }
}

/// The fuzz target's check (`fuzz/fuzz_targets/serve_request.rs`, replayed by
/// `tests/fuzz_corpus.rs`): `data` is an optional `Inference-Header-Content-Length` value
/// (the bytes before the first newline; none when that line is empty) and a body. Decodes it
/// and panics if a decoded tensor's bytes disagree with its shape; returns whether it
/// decoded.
pub fn decode_check(data: &[u8]) -> bool {
    let (head, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let Ok(len) = header_len((!head.is_empty()).then_some(head)) else { return false };
    match parse_infer(Bytes::copy_from_slice(body), len) {
        Ok(req) => {
            for (name, t) in &req.inputs {
                let want = t.shape().iter().product::<usize>() * t.dtype().size();
                assert_eq!(t.bytes().len(), want, "input {name}: {:?} {:?}", t.dtype(), t.shape());
            }
            true
        }
        Err(e) => {
            assert_eq!(e.status, 400, "{}", e.message);
            false
        }
    }
}

/// Parses a request body; `header_len` is the `Inference-Header-Content-Length` header (the
/// JSON's length when binary tensors follow it).
pub fn parse_infer(body: Bytes, header_len: Option<usize>) -> Result<InferRequest, ApiError> {
    let json_len = match header_len {
        Some(n) if n > body.len() => {
            return Err(ApiError::bad(format!(
                "Inference-Header-Content-Length is {n} but the body has {} bytes",
                body.len()
            )))
        }
        Some(n) => n,
        None => body.len(),
    };
    // The JSON is checked whole, then read field by field: every field but the inputs' `data`
    // as a small `Value`, each `data` decoded straight into its leaves (see `json_data`).
    let not_json = |e: serde_json::Error| ApiError::bad(format!("the request is not valid JSON: {e}"));
    let header: &RawValue = serde_json::from_slice(&body[..json_len]).map_err(not_json)?;
    if !header.get().trim_start().starts_with('{') {
        return Err(ApiError::bad("the request must be a JSON object"));
    }
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(header.get()).map_err(not_json)?;
    let small = |raw: &RawValue| serde_json::from_str::<Value>(raw.get()).map_err(not_json);
    let mut obj = serde_json::Map::new();
    for (k, raw) in &fields {
        if k != "inputs" {
            obj.insert(k.clone(), small(raw)?);
        }
    }
    for k in fields.keys() {
        if !["id", "parameters", "inputs", "outputs"].contains(&k.as_str()) {
            return Err(ApiError::bad(format!("unknown field '{k}' in the request")));
        }
    }
    let id = match obj.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(ApiError::bad(format!("'id' must be a string, got {v}"))),
    };
    let params = parameters(obj.get("parameters"), "the request")?;
    let binary_output = flag(params, "binary_data_output", "the request")?.unwrap_or(false);
    let timeout = match params.and_then(|p| p.get("timeout")) {
        None => None,
        Some(v) => match v.as_u64() {
            Some(0) => None,
            Some(us) => Some(Duration::from_micros(us)),
            None => return Err(ApiError::bad(format!("parameter 'timeout' must be microseconds, got {v}"))),
        },
    };
    let inputs: Vec<&RawValue> = fields
        .get("inputs")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .ok_or_else(|| ApiError::bad("the request has no 'inputs' array"))?;
    let mut offset = json_len;
    let mut out = Vec::with_capacity(inputs.len());
    for (i, raw) in inputs.iter().enumerate() {
        // An input's fields other than `data` as a Value (not an object: no fields).
        let parts: BTreeMap<String, &RawValue> = serde_json::from_str(raw.get()).unwrap_or_default();
        let mut t = serde_json::Map::new();
        for (k, raw) in &parts {
            if k != "data" {
                t.insert(k.clone(), small(raw)?);
            }
        }
        let (name, tensor) = input_tensor(&Value::Object(t), parts.get("data").copied(), i, &body, &mut offset)?;
        if out.iter().any(|(n, _): &(String, Tensor)| n == &name) {
            return Err(ApiError::bad(format!("input '{name}' is given twice")));
        }
        out.push((name, tensor));
    }
    if offset != body.len() {
        return Err(ApiError::bad(format!(
            "the body has {} bytes of binary data after the JSON, but the inputs' binary_data_size add up to {}",
            body.len() - json_len,
            offset - json_len
        )));
    }
    let outputs = match obj.get("outputs") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(
            list.iter()
                .enumerate()
                .map(|(i, o)| {
                    let name = o
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::bad(format!("outputs[{i}] has no 'name'")))?;
                    let p = parameters(o.get("parameters"), &format!("output '{name}'"))?;
                    let binary = flag(p, "binary_data", &format!("output '{name}'"))?.unwrap_or(binary_output);
                    Ok(OutputRequest { name: name.to_string(), binary })
                })
                .collect::<Result<Vec<_>, ApiError>>()?,
        ),
        Some(v) => return Err(ApiError::bad(format!("'outputs' must be an array, got {v}"))),
    };
    Ok(InferRequest { id, inputs: out, outputs, binary_output, timeout })
}

/// A boolean parameter, if present (`"yes"` or 1 is an error, not false).
fn flag(params: Option<&serde_json::Map<String, Value>>, key: &str, of: &str) -> Result<Option<bool>, ApiError> {
    match params.and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::bad(format!("parameter '{key}' of {of} must be true or false, got {v}"))),
    }
}

/// A `parameters` object, if present.
fn parameters<'a>(v: Option<&'a Value>, of: &str) -> Result<Option<&'a serde_json::Map<String, Value>>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => Err(ApiError::bad(format!("'parameters' of {of} must be an object, got {v}"))),
    }
}

/// One input tensor: from its binary bytes (advancing `offset`) or its JSON `data` (`t` the
/// input's other fields).
fn input_tensor(
    t: &Value,
    data: Option<&RawValue>,
    i: usize,
    body: &Bytes,
    offset: &mut usize,
) -> Result<(String, Tensor), ApiError> {
    let name =
        t.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::bad(format!("inputs[{i}] has no 'name'")))?;
    let at = |m: String| ApiError::bad(format!("input '{name}': {m}"));
    let dt = t.get("datatype").and_then(Value::as_str).ok_or_else(|| at("no 'datatype'".into()))?;
    let dtype = parse_datatype(dt).ok_or_else(|| {
        at(if dt == "BYTES" {
            "BYTES (string) tensors are not supported by aim".into()
        } else {
            format!("unknown datatype '{dt}' (expected one of BOOL, UINT8, ..., INT64, FP16, BF16, FP32, FP64)")
        })
    })?;
    let shape: Vec<usize> = t
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| at("no 'shape' array".into()))?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| at("'shape' must hold non-negative integers".into()))?;
    // The declared size is checked against the tensor limit before anything is allocated,
    // and nothing is sized from it until the data is there to match it (a shape of 2^40 once
    // made the server abort on an allocation).
    let count = aim_ir::limits::check(dtype, &shape).map_err(|e| at(format!("shape {shape:?}: {e}")))?;
    let bytes_needed = count * dtype.size();
    let p = parameters(t.get("parameters"), &format!("input '{name}'"))?;
    let tensor = match p.and_then(|p| p.get("binary_data_size")) {
        Some(size) => {
            let size = size.as_u64().ok_or_else(|| at("binary_data_size must be a byte count".into()))? as usize;
            if data.is_some() {
                return Err(at("has both binary_data_size and data".into()));
            }
            if size != bytes_needed {
                return Err(at(format!("binary_data_size is {size} bytes but {dt} {shape:?} needs {bytes_needed}")));
            }
            let end = offset.checked_add(size).filter(|&e| e <= body.len()).ok_or_else(|| {
                at(format!("binary_data_size {size} runs past the end of the body ({} bytes)", body.len()))
            })?;
            let bytes = body.slice(*offset..end);
            *offset = end;
            Tensor::from_shared_bytes(dtype, &shape, bytes).map_err(|e| at(e.to_string()))?
        }
        None => {
            let data = data.ok_or_else(|| at("no 'data' and no binary_data_size".into()))?;
            let leaves = super::json_data::decode(data).map_err(at)?;
            if leaves.values.len() != count {
                return Err(at(format!(
                    "'data' has {} elements but shape {shape:?} needs {count}",
                    leaves.values.len()
                )));
            }
            from_json(dtype, &shape, &leaves).map_err(at)?
        }
    };
    Ok((name.to_string(), tensor))
}

/// A tensor from the leaves of its JSON `data`, checked against the dtype's range.
fn from_json(dtype: DType, shape: &[usize], leaves: &Leaves) -> Result<Tensor, String> {
    let flat = &leaves.values;
    let bad = |i: usize| {
        let shown = match &leaves.invalid {
            Some((j, json)) if *j == i => json.clone(),
            _ => flat[i].to_string(),
        };
        format!("data[{i}] = {shown} is not a {}", datatype_name(dtype))
    };
    if let Some((i, _)) = leaves.invalid {
        return Err(bad(i));
    }
    if dtype == DType::Bool {
        let b: Vec<bool> = flat
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Leaf::B(b) => Ok(*b),
                _ => Err(bad(i)),
            })
            .collect::<Result<_, _>>()?;
        return Ok(Tensor::from_bools(shape, &b));
    }
    if dtype.is_float() {
        // A number past the type's range would become an infinity: refused, naming it (an
        // infinity sent as the string "Infinity" is one).
        let fits = |x: f64| {
            !x.is_finite()
                || match dtype {
                    DType::F16 => half::f16::from_f64(x).is_finite(),
                    DType::BF16 => half::bf16::from_f64(x).is_finite(),
                    DType::F32 => (x as f32).is_finite(),
                    _ => true,
                }
        };
        let v: Vec<f64> = flat
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_f64().filter(|&x| fits(x)).ok_or_else(|| bad(i)))
            .collect::<Result<_, _>>()?;
        return Ok(Tensor::from_f64(dtype, shape, &v));
    }
    let (lo, hi) = int_range(dtype);
    let ints: Vec<i128> = flat
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_int().filter(|x| (lo..=hi).contains(x)).ok_or_else(|| bad(i)))
        .collect::<Result<_, _>>()?;
    Ok(match dtype {
        // Exact past 2^53: from the integers themselves.
        DType::I64 => Tensor::from_i64(shape, ints.iter().map(|&x| x as i64).collect()),
        DType::U64 => Tensor::from_slice(shape, &ints.iter().map(|&x| x as u64).collect::<Vec<_>>()),
        _ => Tensor::from_f64(dtype, shape, &ints.iter().map(|&x| x as f64).collect::<Vec<_>>()),
    })
}

/// The values an integer dtype holds.
fn int_range(d: DType) -> (i128, i128) {
    match d {
        DType::I8 => (i8::MIN as i128, i8::MAX as i128),
        DType::I16 => (i16::MIN as i128, i16::MAX as i128),
        DType::I32 => (i32::MIN as i128, i32::MAX as i128),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        DType::U8 => (0, u8::MAX as i128),
        DType::U16 => (0, u16::MAX as i128),
        DType::U32 => (0, u32::MAX as i128),
        _ => (0, u64::MAX as i128),
    }
}

/// An output's elements as JSON sees them.
#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    F32(Floats<'a, f32>),
    F64(Floats<'a, f64>),
    I64(&'a [i64]),
    I32(&'a [i32]),
    I16(&'a [i16]),
    I8(&'a [i8]),
    U64(&'a [u64]),
    U32(&'a [u32]),
    U16(&'a [u16]),
    U8(&'a [u8]),
    Bool(Vec<bool>),
    Widened(Floats<'static, f64>),
}

/// Floats as JSON numbers, except NaN and the infinities, which JSON has no numbers for:
/// the strings `"NaN"`, `"Infinity"` and `"-Infinity"` (which requests may send too), not
/// the `null` serde would write.
struct Floats<'a, T>(std::borrow::Cow<'a, [T]>)
where
    [T]: ToOwned<Owned = Vec<T>>;

impl<T: Copy + Into<f64> + Serialize> Serialize for Floats<'_, T>
where
    [T]: ToOwned<Owned = Vec<T>>,
{
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = ser.serialize_seq(Some(self.0.len()))?;
        for &v in self.0.iter() {
            let x: f64 = v.into();
            match x {
                x if x.is_nan() => seq.serialize_element("NaN")?,
                f64::INFINITY => seq.serialize_element("Infinity")?,
                f64::NEG_INFINITY => seq.serialize_element("-Infinity")?,
                _ => seq.serialize_element(&v)?,
            }
        }
        seq.end()
    }
}

fn data(t: &Tensor) -> Data<'_> {
    match t.dtype() {
        DType::F32 => Data::F32(Floats(t.data::<f32>().into())),
        DType::F64 => Data::F64(Floats(t.data::<f64>().into())),
        DType::I64 => Data::I64(t.data()),
        DType::I32 => Data::I32(t.data()),
        DType::I16 => Data::I16(t.data()),
        DType::I8 => Data::I8(t.data()),
        DType::U64 => Data::U64(t.data()),
        DType::U32 => Data::U32(t.data()),
        DType::U16 => Data::U16(t.data()),
        DType::U8 => Data::U8(t.data()),
        DType::Bool => Data::Bool(t.bytes().iter().map(|&b| b != 0).collect()),
        DType::F16 | DType::BF16 => Data::Widened(Floats(t.to_f64_vec().into())),
    }
}

#[derive(Serialize)]
struct OutputJson<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Data<'a>>,
}

#[derive(Serialize)]
struct ResponseJson<'a> {
    model_name: &'a str,
    model_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<OutputJson<'a>>,
}

/// A response body, and the JSON header's length when binary data follows it (the
/// `Inference-Header-Content-Length` to send).
pub struct Encoded {
    /// The whole body.
    pub body: Vec<u8>,
    /// The JSON's length, when binary tensors follow it.
    pub header_len: Option<usize>,
}

/// Encodes the outputs `(name, tensor, binary)` of one request.
pub fn encode_response(model: &str, version: u64, id: Option<&str>, outputs: &[(String, Tensor, bool)]) -> Encoded {
    let json = ResponseJson {
        model_name: model,
        model_version: version.to_string(),
        id,
        outputs: outputs
            .iter()
            .map(|(name, t, binary)| OutputJson {
                name,
                datatype: datatype_name(t.dtype()),
                shape: t.shape(),
                parameters: binary.then(|| serde_json::json!({ "binary_data_size": t.bytes().len() })),
                data: (!binary).then(|| data(t)),
            })
            .collect(),
    };
    let mut body = serde_json::to_vec(&json).expect("serialising plain data cannot fail");
    let header_len = body.len();
    let mut any_binary = false;
    for (_, t, binary) in outputs {
        if *binary {
            body.extend_from_slice(t.bytes());
            any_binary = true;
        }
    }
    Encoded { body, header_len: any_binary.then_some(header_len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str, binary: &[u8]) -> Result<InferRequest, ApiError> {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(binary);
        parse_infer(Bytes::from(body), (!binary.is_empty()).then_some(json.len()))
    }

    /// A declared shape far larger than its data (or than any tensor may be) is a clean
    /// error naming the input, on the JSON and binary paths, before anything is allocated.
    #[test]
    fn huge_declared_shapes_are_refused_before_allocating() {
        for shape in ["[1099511627776,1]", "[4294967296,1]", "[3221225472,1]", "[2147483648,1]"] {
            let json = format!(r#"{{"inputs":[{{"name":"input","datatype":"FP32","shape":{shape},"data":[0]}}]}}"#);
            let e = req(&json, &[]).unwrap_err();
            assert!(e.status == 400 && e.message.contains("input 'input'"), "{shape}: {e:?}");
            let json = format!(
                r#"{{"inputs":[{{"name":"input","datatype":"FP32","shape":{shape},"parameters":{{"binary_data_size":4}}}}]}}"#
            );
            let e = req(&json, &[0, 0, 0, 0]).unwrap_err();
            assert!(e.status == 400 && e.message.contains("input 'input'"), "{shape}: {e:?}");
        }
    }

    #[test]
    fn json_tensors_nested_or_flat() {
        let r = req(
            r#"{"id":"7","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4.5]]},{"name":"n","shape":[3],"datatype":"INT64","data":[1,-2,9007199254740993]}],"outputs":[{"name":"y"}]}"#,
            &[],
        )
        .unwrap();
        assert_eq!(r.id.as_deref(), Some("7"));
        assert_eq!(r.inputs[0].1.data::<f32>(), &[1.0, 2.0, 3.0, 4.5]);
        assert_eq!(r.inputs[1].1.data::<i64>(), &[1, -2, 9007199254740993]);
        assert_eq!(r.outputs, Some(vec![OutputRequest { name: "y".into(), binary: false }]));
    }

    #[test]
    fn binary_tensors_follow_the_header_in_order() {
        let a: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b = [7u8, 8, 9];
        let json = r#"{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},{"name":"b","shape":[3],"datatype":"UINT8","parameters":{"binary_data_size":3}}],"parameters":{"binary_data_output":true}}"#;
        let r = req(json, &[a.as_slice(), &b].concat()).unwrap();
        assert_eq!(r.inputs[0].1.data::<f32>(), &[1.0, 2.0]);
        assert_eq!(r.inputs[1].1.bytes(), &b);
        assert!(r.binary_output && r.outputs.is_none());
        // One byte too many or too few, a size that does not fit the shape: 400s naming it.
        let e = req(json, &[a.as_slice(), &b, &[0]].concat()).unwrap_err();
        assert!(e.message.contains("add up to 11"), "{}", e.message);
        let e = req(json, &[a.as_slice(), &b[..2]].concat()).unwrap_err();
        assert!(e.message.contains("input 'b'") && e.message.contains("past the end"), "{}", e.message);
        let e = req(&json.replace("\"binary_data_size\":8", "\"binary_data_size\":4"), &[a.as_slice(), &b].concat())
            .unwrap_err();
        assert!(e.message.contains("needs 8"), "{}", e.message);
    }

    #[test]
    fn malformed_requests_are_400s_that_say_why() {
        let e = |j: &str| req(j, &[]).unwrap_err();
        assert!(e("{nope").message.contains("not valid JSON"));
        assert!(e(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP33","data":[1]}]}"#).message.contains("FP33"));
        assert!(e(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":["a"]}]}"#)
            .message
            .contains("BYTES"));
        assert!(e(r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}"#)
            .message
            .contains("needs 3"));
        assert!(e(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"UINT8","data":[300]}]}"#).message.contains("300"));
        assert!(e(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[1.5]}]}"#).message.contains("1.5"));
        // Past FP32's range (it became an infinity, then null in the JSON answer).
        let m = e(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1e39]}]}"#).message;
        assert!(m.contains("1e+39 is not a FP32"), "{m}");
        assert!(e(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP16","data":[70000]}]}"#)
            .message
            .contains("70000"));
        assert!(req(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[3e38]}]}"#, &[]).is_ok());
        // A flag that is not a boolean (it was taken as false).
        let yes = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"parameters":{"binary_data_output":"yes"}}"#;
        assert!(e(yes).message.contains("binary_data_output"));
        let one = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"outputs":[{"name":"y","parameters":{"binary_data":1}}]}"#;
        assert!(e(one).message.contains("binary_data"));
        assert!(e(r#"{"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[1]}]}"#).message.contains("shape"));
        assert!(e(r#"{"input":[]}"#).message.contains("unknown field 'input'"));
        assert!(e(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]},{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#).message.contains("twice"));
        let big = parse_infer(Bytes::from_static(b"{}"), Some(10)).unwrap_err();
        assert!(big.message.contains("Inference-Header-Content-Length"));
    }

    /// NaN and the infinities go out as the strings "NaN", "Infinity", "-Infinity" (not
    /// null), for every float type, and come back in from them; other strings are refused.
    #[test]
    fn non_finite_floats_are_strings_both_ways() {
        let y = Tensor::from_slice(&[4], &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.5]);
        let d = Tensor::from_slice(&[2], &[f64::NEG_INFINITY, 2.0]);
        let h = Tensor::from_f64(DType::F16, &[1], &[f64::INFINITY]);
        let outs = [("y".into(), y, false), ("d".into(), d, false), ("h".into(), h, false)];
        let e = encode_response("m", 1, None, &outs);
        let v: Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(v["outputs"][0]["data"], serde_json::json!(["NaN", "Infinity", "-Infinity", 1.5]));
        assert_eq!(v["outputs"][1]["data"], serde_json::json!(["-Infinity", 2.0]));
        assert_eq!(v["outputs"][2]["data"], serde_json::json!(["Infinity"]));
        let back = req(r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":["NaN","Infinity",-2]}]}"#, &[]);
        let x = back.unwrap().inputs.remove(0).1;
        let xs = x.data::<f32>();
        assert!(xs[0].is_nan() && xs[1] == f32::INFINITY && xs[2] == -2.0);
        let bad = req(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":["inf"]}]}"#, &[]).unwrap_err();
        assert!(bad.message.contains(r#"data[0] = "inf" is not a FP32"#), "{}", bad.message);
        let int = req(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT64","data":["Infinity"]}]}"#, &[]);
        assert!(int.unwrap_err().message.contains("is not a INT64"));
    }

    #[test]
    fn responses_mix_json_and_binary_outputs() {
        let y = Tensor::from_slice(&[2], &[0.5f32, -1.0]);
        let k = Tensor::from_slice(&[1], &[3i64]);
        let e = encode_response("m", 2, Some("r1"), &[("y".into(), y, true), ("k".into(), k, false)]);
        let n = e.header_len.unwrap();
        let v: Value = serde_json::from_slice(&e.body[..n]).unwrap();
        assert_eq!(v["model_version"], "2");
        assert_eq!(v["id"], "r1");
        assert_eq!(v["outputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(v["outputs"][1]["data"], serde_json::json!([3]));
        assert_eq!(&e.body[n..], &[0.5f32.to_le_bytes(), (-1.0f32).to_le_bytes()].concat());
        let j = encode_response("m", 1, None, &[("k".into(), Tensor::from_bools(&[2], &[true, false]), false)]);
        assert!(j.header_len.is_none());
        assert_eq!(
            serde_json::from_slice::<Value>(&j.body).unwrap()["outputs"][0]["data"],
            serde_json::json!([true, false])
        );
    }
}
