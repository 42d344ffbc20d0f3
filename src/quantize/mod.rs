//! `aim quantize`: an f32 ONNX model to a quantized one that ONNX Runtime runs as well as
//! aim, and what it costs in accuracy.
//!
//! - **static** (QDQ): the activations that Conv, MatMul and Gemm nodes with constant
//!   weights read (and both operands of 4-D Adds, and the inputs of pooling, so that
//!   residual CNNs stay quantized end to end; a BatchNormalization after a Conv is folded
//!   into it first, as ONNX Runtime's pre-processing does) are calibrated over a directory of `.npz` input sets — each
//!   value's range by min/max, percentile or entropy (`calibrate.rs`) — and get a
//!   QuantizeLinear / DequantizeLinear pair: u8 with a zero point (asymmetric, the
//!   default) or s8 around 0 (symmetric). Weights become s8 (zero point 0, per tensor or per
//!   output channel), biases int32 in steps of input scale × weight scale. A MaxPool's
//!   output keeps its input's parameters (so pooling runs on the integers).
//! - **dynamic**: MatMul and Gemm nodes with constant weights as DynamicQuantizeLinear →
//!   MatMulInteger → Cast → Mul (+ bias): activations quantized per run, no calibration.
//!
//! Both are what ONNX Runtime's quantizer writes, so the cpu backend's integer kernels take
//! them (`compiler/src/passes/int8.rs`, `qdense.rs`, `qdense_static.rs`). The accuracy cost
//! is then measured: every output of the quantized model against the f32 model's, over the
//! calibration set (or seeded random inputs for a dynamic quantization without one).

mod calibrate;
mod rewrite;

pub use calibrate::{entropy_threshold, Method, Params};

use crate::{Backend, Model, Options as LoadOptions};
use aim_ir::{DType, Tensor};
use aim_onnx::proto::{ModelProto, StringStringEntryProto};
use prost::Message;
use rewrite::Target;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Static (calibrated QDQ) or dynamic quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Activations quantized with ranges from a calibration set.
    Static,
    /// Activations quantized per run.
    Dynamic,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "static" => Ok(Mode::Static),
            "dynamic" => Ok(Mode::Dynamic),
            _ => Err(format!("unknown mode '{s}' (static or dynamic)")),
        }
    }
}

/// How to quantize.
#[derive(Clone, Debug)]
pub struct Options {
    /// Static or dynamic.
    pub mode: Mode,
    /// A directory of `.npz` input sets (keyed by input name); needed for static.
    pub calibration: Option<PathBuf>,
    /// How ranges are chosen (static).
    pub method: Method,
    /// s8 activations around 0 instead of u8 with a zero point.
    pub symmetric: bool,
    /// One weight scale per output channel (column) instead of one per tensor.
    pub per_channel: bool,
    /// Nodes left in f32, by name.
    pub exclude: Vec<String>,
    /// Threads for the calibration and accuracy runs.
    pub threads: Option<usize>,
}

/// Why quantizing failed: the file, node or input named, and the reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QuantizeError(pub String);

impl From<crate::Error> for QuantizeError {
    fn from(e: crate::Error) -> QuantizeError {
        QuantizeError(e.to_string())
    }
}

/// One output's error against the f32 model over the samples.
#[derive(Clone, Debug)]
pub struct OutputError {
    /// The output.
    pub name: String,
    /// The largest absolute difference.
    pub max_abs: f64,
    /// The RMS of the difference over the RMS of the f32 output.
    pub rel_rms: f64,
    /// For 2-D outputs of more than one column (scores): the samples whose rows' argmax
    /// agree, and the rows compared.
    pub top1: Option<(usize, usize)>,
}

/// What quantizing did.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The nodes quantized, with their op.
    pub quantized: Vec<(String, String)>,
    /// The input sets calibrated on.
    pub calibration_sets: usize,
    /// The error of each output, and where the inputs came from.
    pub accuracy: Vec<OutputError>,
    /// Input sets the accuracy was measured on (0: not measured, the inputs having
    /// symbolic dims and no calibration set given), and whether they were random.
    pub accuracy_sets: (usize, bool),
}

fn err(msg: impl Into<String>) -> QuantizeError {
    QuantizeError(msg.into())
}

/// Quantizes `model` into `out` (see the module doc). `progress(phase, done, total)` is
/// called as calibration and measurement go.
pub fn quantize(
    model: &Path,
    out: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Summary, QuantizeError> {
    let what = model.display().to_string();
    let bytes = std::fs::read(model).map_err(|e| err(format!("reading {what}: {e}")))?;
    let mut proto = ModelProto::decode(&bytes[..]).map_err(|e| err(format!("{what}: not an ONNX model: {e}")))?;
    let opset = proto
        .opset_import
        .iter()
        .find(|o| o.domain.as_deref().unwrap_or("").is_empty() || o.domain() == "ai.onnx")
        .map_or(0, |o| o.version());
    let need = if opts.mode == Mode::Static { 13 } else { 11 };
    if opset < need {
        return Err(err(format!(
            "{what}: opset {opset}; quantizing writes ops of opset {need} (per-axis DequantizeLinear, DynamicQuantizeLinear): convert the model to opset {need} or later first"
        )));
    }
    // The weights (external data resolved) and the values' types come from the importer.
    let mut ir = aim_onnx::import_file(model).map_err(|e| err(e.to_string()))?;
    let _ = aim_ir::infer::infer_types(&mut ir.graph);
    let graph = proto.graph.as_mut().ok_or_else(|| err(format!("{what}: the model has no graph")))?;
    let mut weights: HashMap<String, Tensor> = ir
        .graph
        .initializers
        .iter()
        .filter(|(_, t)| t.dtype() == DType::F32)
        .map(|(k, t)| (k.clone(), t.clone()))
        .collect();
    if opts.mode == Mode::Static {
        rewrite::fold_batchnorm(graph, &mut weights);
    }
    let rank = |v: &str| ir.graph.value_type(v).and_then(|t| t.shape).map(|s| s.len());
    let (targets, pools) = find_targets(graph, &weights, opts, &rank);
    if targets.is_empty() {
        return Err(err(format!("{what}: no Conv, MatMul or Gemm node with constant f32 weights to quantize")));
    }
    let quantized: Vec<(String, String)> = targets
        .iter()
        .map(|t| (graph.node[t.node].name().to_string(), graph.node[t.node].op_type().to_string()))
        .collect();
    let mut calibration_sets = 0;
    match opts.mode {
        Mode::Static => {
            let dir = opts
                .calibration
                .as_ref()
                .ok_or_else(|| err("static quantization needs --calibration DIR (a directory of .npz input sets)"))?;
            let samples = npz_files(dir)?;
            calibration_sets = samples.len();
            let mut wanted: Vec<String> = Vec::new();
            for t in &targets {
                for &k in &t.activations {
                    let v = &graph.node[t.node].input[k];
                    if !wanted.contains(v) {
                        wanted.push(v.clone());
                    }
                }
            }
            let stats = calibrate(model, &proto, &ir, &wanted, &samples, opts, progress)?;
            let mut params: HashMap<String, Params> = stats
                .iter()
                .map(|(v, s)| {
                    let (lo, hi) = s.range(opts.method);
                    (v.clone(), calibrate::params(lo, hi, opts.symmetric))
                })
                .collect();
            for (x, y) in &pools {
                if let Some(p) = params.get(x).copied() {
                    params.insert(y.clone(), p);
                }
            }
            let graph = proto.graph.as_mut().expect("checked above");
            rewrite::static_qdq(graph, &targets, &params, &weights).map_err(|e| err(format!("{what}: {e}")))?;
        }
        Mode::Dynamic => {
            rewrite::dynamic(graph, &targets, &weights).map_err(|e| err(format!("{what}: {e}")))?;
        }
    }
    inline_external_data(&mut proto, &ir)?;
    let m = opts.method;
    let note = match opts.mode {
        Mode::Static => format!(
            "static QDQ: {} activations ({:?} over {calibration_sets} input sets), s8 weights {}",
            if opts.symmetric { "s8 symmetric" } else { "u8 asymmetric" },
            m,
            if opts.per_channel { "per channel" } else { "per tensor" }
        ),
        Mode::Dynamic => format!("dynamic: s8 weights {}", if opts.per_channel { "per channel" } else { "per tensor" }),
    };
    proto.metadata_props.push(StringStringEntryProto { key: Some("aim_quantize".into()), value: Some(note) });
    std::fs::write(out, proto.encode_to_vec()).map_err(|e| err(format!("writing {}: {e}", out.display())))?;
    let (accuracy, accuracy_sets) = measure(model, out, opts, progress)?;
    Ok(Summary { quantized, calibration_sets, accuracy, accuracy_sets })
}

/// The nodes to quantize (in graph order) and the MaxPools whose output keeps its input's
/// parameters (input, output).
fn find_targets(
    g: &aim_onnx::proto::GraphProto,
    weights: &HashMap<String, Tensor>,
    opts: &Options,
    rank: &dyn Fn(&str) -> Option<usize>,
) -> (Vec<Target>, Vec<(String, String)>) {
    let constant = |v: &str| weights.contains_key(v);
    let dims = |v: &str| weights.get(v).map(|t| t.shape().to_vec());
    let int = |n: &aim_onnx::proto::NodeProto, name: &str, d: i64| {
        n.attribute.iter().find(|a| a.name() == name).map_or(d, |a| a.i())
    };
    let float = |n: &aim_onnx::proto::NodeProto, name: &str, d: f32| {
        n.attribute.iter().find(|a| a.name() == name).map_or(d, |a| a.f())
    };
    let (mut targets, mut pools) = (Vec::new(), Vec::new());
    let per = |axis: usize| opts.per_channel.then_some(axis);
    for (i, n) in g.node.iter().enumerate() {
        if !(n.domain().is_empty() || n.domain() == "ai.onnx") || opts.exclude.iter().any(|e| e == n.name()) {
            continue;
        }
        let input = |k: usize| n.input.get(k).map(|s| s.as_str()).filter(|s| !s.is_empty());
        let activation = |k: usize| input(k).is_some_and(|v| !constant(v));
        let static_only = opts.mode == Mode::Static;
        let t = match n.op_type() {
            "Conv" if static_only && activation(0) => match input(1).and_then(dims) {
                Some(d) if d.len() == 4 => Some(Target {
                    node: i,
                    activations: vec![0],
                    weight: Some((1, per(0), d)),
                    bias: input(2).filter(|b| constant(b)).map(|_| 2),
                    transposed: false,
                }),
                _ => None,
            },
            "MatMul" if activation(0) => match input(1).and_then(dims) {
                Some(d) if d.len() == 2 => Some(Target {
                    node: i,
                    activations: vec![0],
                    weight: Some((1, per(1), d)),
                    bias: None,
                    transposed: false,
                }),
                _ => None,
            },
            "Gemm"
                if activation(0)
                    && float(n, "alpha", 1.0) == 1.0
                    && float(n, "beta", 1.0) == 1.0
                    && int(n, "transA", 0) == 0 =>
            {
                let transposed = int(n, "transB", 0) != 0;
                // The output columns: the weights' rows when they are stored transposed.
                let axis = if transposed { 0 } else { 1 };
                match input(1).and_then(dims) {
                    Some(d) if d.len() == 2 => {
                        let n_out = d[axis];
                        let bias = input(2).filter(|b| weights.get(*b).is_some_and(|t| t.len() == n_out)).map(|_| 2);
                        if input(2).is_some() && bias.is_none() {
                            None
                        } else {
                            Some(Target {
                                node: i,
                                activations: vec![0],
                                weight: Some((1, per(axis), d)),
                                bias,
                                transposed,
                            })
                        }
                    }
                    _ => None,
                }
            }
            "Add" if static_only && activation(0) && activation(1) && n.input.len() == 2 => {
                let four = |k: usize| input(k).and_then(rank) == Some(4);
                (four(0) && four(1)).then(|| Target {
                    node: i,
                    activations: vec![0, 1],
                    weight: None,
                    bias: None,
                    transposed: false,
                })
            }
            "GlobalAveragePool" | "AveragePool" if static_only && activation(0) => {
                Some(Target { node: i, activations: vec![0], weight: None, bias: None, transposed: false })
            }
            "MaxPool" if static_only && activation(0) && n.output.len() == 1 => {
                pools.push((n.input[0].clone(), n.output[0].clone()));
                Some(Target { node: i, activations: vec![0], weight: None, bias: None, transposed: false })
            }
            _ => None,
        };
        targets.extend(t);
    }
    (targets, pools)
}

/// The `.npz` files of `dir`, sorted by name.
fn npz_files(dir: &Path) -> Result<Vec<PathBuf>, QuantizeError> {
    let entries = std::fs::read_dir(dir).map_err(|e| err(format!("calibration directory {}: {e}", dir.display())))?;
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npz"))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(err(format!("calibration directory {}: no .npz input sets", dir.display())));
    }
    Ok(v)
}

fn load_options(opts: &Options) -> LoadOptions {
    LoadOptions { backend: Backend::Cpu, threads: opts.threads, ..LoadOptions::default() }
}

/// The statistics of each `wanted` value over the samples: the model run with those
/// values as extra outputs (graph inputs read from the samples), once for the ranges and,
/// for the methods that need one, once more for the histograms.
fn calibrate(
    model: &Path,
    proto: &ModelProto,
    ir: &aim_ir::Model,
    wanted: &[String],
    samples: &[PathBuf],
    opts: &Options,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<HashMap<String, calibrate::Stats>, QuantizeError> {
    let g = proto.graph.as_ref().expect("checked by the caller");
    let inputs: HashSet<&str> = g.input.iter().map(|v| v.name()).collect();
    let outputs: HashSet<&str> = g.output.iter().map(|v| v.name()).collect();
    let mut augmented = proto.clone();
    let ag = augmented.graph.as_mut().expect("checked by the caller");
    for v in wanted.iter().filter(|v| !inputs.contains(v.as_str()) && !outputs.contains(v.as_str())) {
        let ty = ir.graph.value_type(v).unwrap_or_else(aim_ir::ValueType::unknown);
        let vi = aim_ir::ValueInfo { name: v.clone(), ty };
        ag.output.push(aim_onnx::value_info_proto(&vi));
    }
    let external =
        g.initializer.iter().any(|t| t.data_location() == aim_onnx::proto::tensor_proto::DataLocation::External);
    let exported = augmented.encode_to_vec();
    let m = if external {
        // Its external data is found relative to the model: loaded from its directory.
        let dir = model.parent().unwrap_or(Path::new("."));
        let temp = dir.join(format!(".{}.aim-calibration.onnx", std::process::id()));
        std::fs::write(&temp, &exported).map_err(|e| err(format!("writing {}: {e}", temp.display())))?;
        let loaded = Model::load_with_options(&temp, &load_options(opts));
        let _ = std::fs::remove_file(&temp);
        loaded?
    } else {
        let what = format!("{} (with the calibrated values as outputs)", model.display());
        let ir = aim_onnx::import_bytes(&exported, &what).map_err(|e| err(e.to_string()))?;
        Model::from_ir_with(ir, model, &load_options(opts))?
    };
    let mut stats: HashMap<String, calibrate::Stats> = wanted.iter().map(|v| (v.clone(), Default::default())).collect();
    let passes: &[bool] = if opts.method == Method::MinMax { &[false] } else { &[false, true] };
    for (pass, &histogram) in passes.iter().enumerate() {
        let phase = if pass == 0 { "calibrating" } else { "histograms" };
        for (k, path) in samples.iter().enumerate() {
            progress(phase, k, samples.len());
            let feeds = crate::npz::read_npz(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
            let mut values: HashMap<String, Tensor> =
                feeds.iter().filter(|(n, _)| inputs.contains(n.as_str())).cloned().collect();
            let outs = m.run(feeds).map_err(|e| err(format!("calibrating on {}: {e}", path.display())))?;
            values.extend(outs);
            for (v, s) in stats.iter_mut() {
                let t = values.get(v).ok_or_else(|| err(format!("calibration did not produce '{v}'")))?;
                if t.dtype() != DType::F32 {
                    return Err(err(format!("'{v}' is {}, not f32: it cannot be quantized", t.dtype())));
                }
                if histogram {
                    s.observe_histogram(t.data::<f32>(), opts.method);
                } else {
                    s.observe_range(t.data::<f32>());
                }
            }
        }
        progress(phase, samples.len(), samples.len());
    }
    Ok(stats)
}

/// Replaces initializers stored in external files by their values inline (the quantized
/// model is written whole, next to nothing).
fn inline_external_data(proto: &mut ModelProto, ir: &aim_ir::Model) -> Result<(), QuantizeError> {
    use aim_onnx::proto::tensor_proto::DataLocation;
    let g = proto.graph.as_mut().expect("checked by the caller");
    let mut total = 0usize;
    for t in g.initializer.iter_mut().filter(|t| t.data_location() == DataLocation::External) {
        let v = ir
            .graph
            .initializers
            .get(t.name())
            .ok_or_else(|| err(format!("the external initializer '{}' was not loaded", t.name())))?;
        total += v.bytes().len();
        *t = aim_onnx::tensor_proto(t.name(), v);
    }
    if total > (1 << 31) - (64 << 20) {
        return Err(err("the quantized model would exceed protobuf's 2 GB with its weights inline"));
    }
    Ok(())
}

/// Every output of the quantized model against the f32 model's, over the calibration sets
/// (or four seeded random input sets when there are none).
fn measure(
    model: &Path,
    quantized: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<(Vec<OutputError>, (usize, bool)), QuantizeError> {
    let f32m = Model::load_with_options(model, &load_options(opts))?;
    let q = Model::load_with_options(quantized, &load_options(opts))?;
    let sets: Vec<Vec<(String, Tensor)>> = match &opts.calibration {
        Some(dir) => npz_files(dir)?
            .iter()
            .map(|p| crate::npz::read_npz(p).map_err(|e| err(format!("{}: {e}", p.display()))))
            .collect::<Result<_, _>>()?,
        None => match (0..4).map(|s| crate::random::random_inputs(f32m.inputs(), s)).collect::<Result<Vec<_>, _>>() {
            Ok(sets) => sets,
            // Inputs of symbolic shape and no input sets: nothing to measure on.
            Err(_) => return Ok((Vec::new(), (0, true))),
        },
    };
    let random = opts.calibration.is_none();
    let mut acc: Vec<(String, f64, f64, f64, usize, usize)> = Vec::new();
    for (k, feeds) in sets.iter().enumerate() {
        progress("measuring", k, sets.len());
        let want = f32m.run(feeds.clone())?;
        let got = q.run(feeds.clone())?;
        for (i, ((name, w), (_, g))) in want.iter().zip(&got).enumerate() {
            if acc.len() <= i {
                acc.push((name.clone(), 0.0, 0.0, 0.0, 0, 0));
            }
            if w.dtype() != DType::F32 || g.dtype() != DType::F32 || w.shape() != g.shape() {
                continue;
            }
            let (w, gv) = (w.data::<f32>(), g.data::<f32>());
            let a = &mut acc[i];
            for (&x, &y) in w.iter().zip(gv) {
                let d = (x as f64 - y as f64).abs();
                a.1 = a.1.max(d);
                a.2 += d * d;
                a.3 += x as f64 * x as f64;
            }
            let shape = want[i].1.shape();
            if shape.len() == 2 && shape[1] > 1 {
                let argmax = |v: &[f32]| {
                    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (j, &x)| if x > b.1 { (j, x) } else { b }).0
                };
                for r in 0..shape[0] {
                    let row = r * shape[1]..(r + 1) * shape[1];
                    a.4 += (argmax(&w[row.clone()]) == argmax(&gv[row])) as usize;
                    a.5 += 1;
                }
            }
        }
    }
    progress("measuring", sets.len(), sets.len());
    let errors = acc
        .into_iter()
        .map(|(name, max_abs, d2, x2, agree, rows)| OutputError {
            name,
            max_abs,
            rel_rms: if x2 > 0.0 { (d2 / x2).sqrt() } else { d2.sqrt() },
            top1: (rows > 0).then_some((agree, rows)),
        })
        .collect();
    Ok((errors, (sets.len(), random)))
}
