//! The `aim` command line: run, info and test-onnx (explore, compile and bench follow with
//! the backends they need).

use aim::{conformance, npz, Backend, Model};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "aim", version, about = "An inference compiler for neural networks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log what aim does to stderr (or the file AIM_LOG_FILE names): info (load phases with
    /// times), debug (also every pass, and every node of every run with its kernel, shapes
    /// and time) or trace (also input shapes); overrides AIM_LOG.
    #[arg(long, global = true, value_name = "LEVEL")]
    log: Option<String>,
    /// Load a custom-op library first (it exports `aim_custom_ops`, see include/aim.h and
    /// examples/custom_op/); its ops are registered for every model this command loads.
    /// Repeatable.
    #[arg(long = "custom-ops", global = true, value_name = "LIB.so")]
    custom_ops: Vec<PathBuf>,
}

/// How a model is loaded and run: the options `run`, `bench` and `compare` share.
#[derive(Args, Clone)]
struct LoadArgs {
    /// Threads (cpu backend; default: the physical core count; at most 1024). The reference
    /// backend runs on one.
    #[arg(long)]
    threads: Option<usize>,
    /// Cap the ISA level for the cpu backend (native, x86-64-v4, x86-64-v3, x86-64-v2,
    /// baseline; also AIM_CPU).
    #[arg(long, env = "AIM_CPU", default_value = "native")]
    cpu: String,
    /// Stop a run that takes longer than this many seconds, with an error.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    timeout: Option<f64>,
    /// The largest tensor aim may allocate (bytes, or with a K, M or G suffix; default:
    /// AIM_MAX_TENSOR_BYTES, else half the machine's memory).
    #[arg(long, value_name = "BYTES")]
    max_tensor_bytes: Option<String>,
    /// Compile a program specialised to this input shape at load (`input=1x3x640x640`);
    /// repeatable: one per input with symbolic dims, a name given again starts another
    /// signature. Other shapes are compiled on first use. Without `--inputs`, the random
    /// inputs take the first signature's shapes.
    #[arg(long, value_name = "NAME=DIMS")]
    shape: Vec<String>,
    /// How many shape-specialised programs to keep (the most recently used; default 8).
    #[arg(long, value_name = "N")]
    shape_cache: Option<usize>,
    /// On the cuda backend, let f32 GEMMs and convolutions use TF32 tensor cores.
    #[arg(long)]
    allow_tf32: bool,
    #[command(flatten)]
    passes: PassArgs,
    /// Bind each worker thread to a core of its own (one per physical core first; the
    /// calling thread is not pinned). Also AIM_PIN_THREADS=cores.
    #[arg(long)]
    pin_threads: bool,
}

/// How the program is compiled: `-O`, `--disable-pass` and `--weights`, for every command
/// that compiles.
#[derive(Args, Clone)]
struct PassArgs {
    /// Optimisation level (cpu backend): 0 runs every node on its reference kernel,
    /// interpreted; 1 adds constant folding, simplification, dead-code elimination and
    /// BatchNormalization folding; 2 fusion, packed-weight, quantized and 4-bit kernels; 3
    /// (the default) blocked layouts and every other pass.
    #[arg(short = 'O', long = "opt-level", value_name = "LEVEL", default_value_t = 3)]
    opt_level: u32,
    /// Do not run this pass of the cpu pipeline (repeatable; `aim explore --passes` lists
    /// them by name).
    #[arg(long = "disable-pass", value_name = "NAME")]
    disable_pass: Vec<String>,
    /// How dense layers (MatMul / Gemm) hold their weights: f32, f16 (half the memory,
    /// widened inside the GEMM; each weight rounded to the nearest f16), or int4 / int4:BLOCK
    /// (an eighth of the memory: 4-bit codes per block of 32, 64 or 128 rows with a scale
    /// and zero point each, as ONNX Runtime's MatMulNBits quantizer writes them; cpu
    /// backend). On the cuda backend f16 also covers convolutions and multiplies on f16
    /// tensor cores (a model whose weights are f16 or bf16 gets that without asking).
    #[arg(long, value_name = "f32|f16|int4[:BLOCK]", default_value = "f32")]
    weights: String,
}

impl PassArgs {
    /// The level, checked.
    fn level(&self) -> Result<aim::OptLevel> {
        aim::OptLevel::from_number(self.opt_level)
            .ok_or_else(|| anyhow::anyhow!("-O{}: the levels are 0, 1, 2 and 3", self.opt_level))
    }

    /// The compiler's pass selection.
    fn optimization(&self) -> Result<aim_compiler::passes::Optimization> {
        Ok(aim_compiler::passes::Optimization { level: self.level()?, disabled: self.disable_pass.clone() })
    }
}

/// `--weights`: whether f16, and the int4 block size.
fn parse_weights(w: &str) -> Result<(bool, Option<usize>)> {
    aim::parse_weights(w).map_err(|e| anyhow::anyhow!("--weights {w}: {e}"))
}

/// `--shape` values as signatures: a name given again starts the next one.
fn parse_shapes(given: &[String]) -> Result<Vec<aim::InputShapes>> {
    let mut out: Vec<aim::InputShapes> = Vec::new();
    for g in given {
        let Some((name, dims)) = g.split_once('=') else {
            bail!("--shape {g}: expected NAME=DIMS, e.g. input=1x3x224x224")
        };
        let dims: Vec<usize> = if dims.trim().is_empty() {
            Vec::new()
        } else {
            dims.split(['x', 'X', ','])
                .map(|d| d.trim().parse::<usize>())
                .collect::<Result<_, _>>()
                .map_err(|_| anyhow::anyhow!("--shape {g}: dims must be non-negative integers separated by x"))?
        };
        match out.last_mut() {
            Some(sig) if !sig.iter().any(|(n, _)| n == name) => sig.push((name.to_string(), dims)),
            _ => out.push(vec![(name.to_string(), dims)]),
        }
    }
    Ok(out)
}

impl LoadArgs {
    /// The library's options for these arguments and `backend`.
    fn options(&self, backend: Backend) -> Result<aim::Options> {
        let timeout = match self.timeout {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Some(std::time::Duration::from_secs_f64(s)),
            Some(s) => bail!("--timeout {s}: expected a positive number of seconds"),
        };
        let max_tensor_bytes =
            match &self.max_tensor_bytes {
                None => None,
                Some(b) => Some(aim_ir::limits::parse_bytes(b).filter(|&n| n > 0).ok_or_else(|| {
                    anyhow::anyhow!("--max-tensor-bytes {b}: expected a size such as 4096, 64M or 2G")
                })?),
            };
        // An unknown --cpu is an error on either backend (the reference one does not use it).
        aim_compiler::target::Target::host().with_cpu(&self.cpu)?;
        if self.shape_cache == Some(0) {
            bail!("--shape-cache must be at least 1");
        }
        let (half_weights, int4_weights) = parse_weights(&self.passes.weights)?;
        Ok(aim::Options {
            backend,
            threads: self.threads,
            cpu: self.cpu.clone(),
            timeout,
            max_tensor_bytes,
            shapes: parse_shapes(&self.shape)?,
            shape_cache: self.shape_cache,
            half_weights,
            int4_weights,
            allow_tf32: self.allow_tf32,
            opt_level: self.passes.level()?,
            disabled_passes: self.passes.disable_pass.clone(),
            pin_threads: self.pin_threads,
            custom_ops: Vec::new(),
        })
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a model on inputs from an .npz (or seeded random inputs) and print each output.
    Run {
        /// The ONNX model.
        model: PathBuf,
        /// Inputs keyed by graph input name, as np.savez(path, **{name: array}) writes them.
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// Where to write the outputs, keyed by graph output name.
        #[arg(long)]
        outputs: Option<PathBuf>,
        /// cpu (compiled and optimised for this CPU, the default), reference (the reference
        /// kernels, interpreted: the oracle) or cuda (aim's PTX on an NVIDIA GPU, sm_80+).
        #[arg(long, default_value = "cpu")]
        backend: Backend,
        /// Seed of the random inputs used when --inputs is not given.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Time a model: compile time, then latency over repeated runs.
    Bench {
        /// The ONNX model.
        model: PathBuf,
        /// Inputs (.npz); default: seeded random inputs. Repeatable: the runs cycle through
        /// the input sets (inputs of several shapes: each gets its program, and the latency
        /// and peak memory cover them all).
        #[arg(long)]
        inputs: Vec<PathBuf>,
        /// Timed runs.
        #[arg(long, default_value_t = 50)]
        iters: usize,
        /// Untimed runs first.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// The backend.
        #[arg(long, default_value = "cpu")]
        backend: Backend,
        #[command(flatten)]
        load: LoadArgs,
        /// End with one JSON line: compile_ms, latency_ms {min, median, p90, max}, iters,
        /// threads, peak_rss_mb.
        #[arg(long)]
        json: bool,
        /// Also profile one run per node: print the top nodes by time and write a Chrome
        /// trace (opens in Perfetto) to this file.
        #[arg(long)]
        profile: Option<PathBuf>,
    },
    /// Compile a model ahead of time: into a `.aim` file (the optimised program for this
    /// CPU, or the --cpu level, with its weights aligned for memory-mapping, loaded by every
    /// command and API in place of the ONNX file), or with --target into a shared object
    /// with a C ABI that runs with libaim_runtime alone.
    Compile {
        /// The ONNX model.
        model: PathBuf,
        /// The `.aim` file, or with --target the shared object (`libNAME.so`), to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Compile a shared object for TRIPLE[,LEVEL]: x86_64-unknown-linux-gnu (levels
        /// x86-64-v3, x86-64-v4, ...; default the host's) or aarch64-unknown-linux-gnu.
        #[arg(long, value_name = "TRIPLE[,LEVEL]")]
        target: Option<String>,
        /// With --target: the prefix of the exported symbols (NAME_load); default from the
        /// output's file name.
        #[arg(long)]
        name: Option<String>,
        /// With --target: the linker driver (default $CC or cc, or ARCH-linux-gnu-gcc for
        /// another architecture).
        #[arg(long)]
        linker: Option<String>,
        /// Cap the ISA level the program is compiled for (also AIM_CPU).
        #[arg(long, env = "AIM_CPU", default_value = "native")]
        cpu: String,
        /// Specialise a model with symbolic dims to these input shapes (NAME=DIMS, one per
        /// such input); without it such a model is stored as its source graph and
        /// specialised at load. With --target, repeatable: a name given again starts
        /// another signature, and inputs of other shapes run the shape-generic program.
        #[arg(long, value_name = "NAME=DIMS")]
        shape: Vec<String>,
        /// Quantize the model first (static or dynamic, as `aim quantize` does, with its
        /// --calibration, --method, --symmetric and --per-channel) and compile the result.
        #[arg(long, value_name = "MODE")]
        quantize: Option<String>,
        /// With --quantize: the directory of .npz input sets.
        #[arg(long, requires = "quantize")]
        calibration: Option<PathBuf>,
        /// With --quantize: minmax, entropy or percentile.
        #[arg(long, requires = "quantize", default_value = "minmax")]
        method: String,
        /// With --quantize: s8 activations around 0.
        #[arg(long, requires = "quantize")]
        symmetric: bool,
        /// With --quantize: one weight scale per output channel.
        #[arg(long, requires = "quantize")]
        per_channel: bool,
        #[command(flatten)]
        passes: PassArgs,
    },
    /// Quantize a model to 8 bits, as ONNX that ONNX Runtime runs too: static (QDQ: the
    /// ranges of the activations Conv, MatMul and Gemm read calibrated over a directory of
    /// .npz input sets) or dynamic (MatMul and Gemm with s8 weights, activations quantized
    /// per run); then print each output's error against the f32 model.
    Quantize {
        /// The f32 ONNX model.
        model: PathBuf,
        /// The quantized ONNX model to write.
        #[arg(short, long)]
        output: PathBuf,
        /// static or dynamic.
        #[arg(long, default_value = "static")]
        mode: String,
        /// A directory of .npz input sets (keyed by input name), as np.savez writes them:
        /// the calibration set (static), and the inputs the accuracy is measured on.
        #[arg(long)]
        calibration: Option<PathBuf>,
        /// How each activation's range is chosen: minmax, entropy (least KL divergence, as
        /// TensorRT's calibrator) or percentile (99.999%).
        #[arg(long, default_value = "minmax")]
        method: String,
        /// s8 activations around 0 (zero point 0).
        #[arg(long, conflicts_with = "asymmetric")]
        symmetric: bool,
        /// u8 activations with a zero point (the default).
        #[arg(long)]
        asymmetric: bool,
        /// One weight scale per output channel instead of one per tensor.
        #[arg(long)]
        per_channel: bool,
        /// Nodes to leave in f32, by name (repeatable).
        #[arg(long, num_args = 1..)]
        exclude: Vec<String>,
        /// Threads for the calibration and accuracy runs.
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Show a model's inputs, outputs, opset, op histogram and unsupported ops, and/or
    /// the target description of this CPU.
    Info {
        /// The ONNX or `.aim` model.
        model: Option<PathBuf>,
        /// For a `.aim` file: check every constant against its checksum.
        #[arg(long)]
        verify: bool,
        /// Print the target: CPU features, ISA level, caches and cores.
        #[arg(long)]
        target: bool,
        /// Cap the ISA level: native, x86-64-v4, x86-64-v3, x86-64-v2 or baseline (also the
        /// AIM_CPU environment variable).
        #[arg(long, env = "AIM_CPU", default_value = "native")]
        cpu: String,
        /// Describe the program specialised to these input shapes (NAME=DIMS, one per input
        /// with symbolic dims) instead of the shape-generic one.
        #[arg(long, value_name = "NAME=DIMS")]
        shape: Vec<String>,
    },
    /// Show what aim does to a model, stage by stage: the ONNX graph, the imported IR, the
    /// optimised IR, the schedule, the Cranelift IR and the machine code, each line naming
    /// the ONNX nodes it came from.
    Explore {
        /// The ONNX model.
        model: PathBuf,
        /// Stages to print: onnx, graph, optimized, scheduled, clif, asm, ptx or all
        /// (repeatable, or comma-separated). `ptx` (the cuda backend's kernels) is printed
        /// when named or when `--gpu` is given.
        #[arg(long, value_delimiter = ',', default_value = "all")]
        stage: Vec<String>,
        /// Only the lines of this ONNX node (its journey through every stage).
        #[arg(long)]
        node: Option<String>,
        /// Also print the graph after each pass, marking what each pass changed, and its time.
        #[arg(long)]
        passes: bool,
        /// Write a self-contained HTML page with the stages side by side instead.
        #[arg(long)]
        html: Option<PathBuf>,
        /// A Chrome trace from `aim bench --profile`: measured node times for the page.
        #[arg(long)]
        profile: Option<PathBuf>,
        /// Cap the ISA level, as for `aim run` (also AIM_CPU).
        #[arg(long, env = "AIM_CPU", default_value = "native")]
        cpu: String,
        /// Schedule for these cache sizes instead of this CPU's: L1D,L2,L3 in bytes with an
        /// optional K or M suffix (48K,1M,32M), so the output reads the same on any machine.
        #[arg(long)]
        caches: Option<String>,
        /// Show the program specialised to these input shapes (NAME=DIMS, one per input with
        /// symbolic dims), as a run with them compiles it, instead of the shape-generic one.
        #[arg(long, value_name = "NAME=DIMS")]
        shape: Vec<String>,
        /// The GPU the ptx stage is generated for: sm_80 or sm_90 (default sm_80).
        #[arg(long, value_name = "ARCH")]
        gpu: Option<String>,
        /// Let the ptx stage's f32 GEMMs use TF32 tensor cores (mma.sync).
        #[arg(long)]
        allow_tf32: bool,
        /// The ptx stage's constant GEMM weights in half precision, on tensor cores of that
        /// type: f16 or bf16 (a model whose weights are f16 or bf16 gets its own type).
        #[arg(long, value_name = "f16|bf16")]
        half: Option<String>,
        #[command(flatten)]
        pass_choice: PassArgs,
    },
    /// Find where the cpu backend's numbers part from the reference: run both keeping every
    /// intermediate value and print, per node output in graph order, max abs error, max
    /// relative error, MSE and the value's scale, marking the first over the tolerance.
    /// Exits 1 when any value is over it.
    Compare {
        /// The ONNX model.
        model: PathBuf,
        /// Inputs (.npz); default: seeded random inputs.
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// `reference` (the reference backend, the default) or an .npz of values computed
        /// elsewhere, keyed by value name (e.g. ONNX Runtime's outputs).
        #[arg(long, default_value = "reference")]
        against: String,
        /// Largest error allowed, relative to each value's scale (its largest magnitude).
        #[arg(long, default_value_t = 1e-4)]
        tolerance: f64,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Serve models with the KServe v2 / Open Inference Protocol over HTTP (JSON and binary
    /// tensors, as Triton's clients send them) and gRPC, with dynamic batching per model and
    /// Prometheus metrics; SIGTERM finishes the requests received, then stops.
    #[cfg(feature = "serve")]
    Serve {
        /// A model to serve as NAME=PATH (ONNX or .aim; repeatable).
        #[arg(long = "model", value_name = "NAME=PATH", conflicts_with = "config")]
        models: Vec<String>,
        /// A deploy.yml: models (name, path or versions, batching), devices (type x86, arm64
        /// or cuda, weight, fallback, threads) and scheduler (policy latency-aware or
        /// round-robin, batching defaults).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The address to listen on.
        #[arg(long, default_value = "0.0.0.0")]
        host: String,
        /// The inference API's port (0: any free one, printed).
        #[arg(long, default_value_t = 8000)]
        http_port: u16,
        /// The gRPC inference API's port (`inference.GRPCInferenceService`; 0: any free
        /// one, printed).
        #[arg(long, default_value_t = 8001)]
        grpc_port: u16,
        /// The Prometheus metrics' port (0: any free one, printed).
        #[arg(long, default_value_t = 8002)]
        metrics_port: u16,
        /// Threads each model instance runs on (default: the physical core count).
        #[arg(long)]
        threads: Option<usize>,
        /// The most rows one batched run takes, for models whose inputs have a symbolic
        /// leading dim (0: no batching; default 8; deploy.yml's scheduler and models
        /// override it).
        #[arg(long)]
        max_batch_size: Option<usize>,
        /// How long the first request of a batch waits for more, in microseconds (default
        /// 500).
        #[arg(long)]
        max_queue_delay_us: Option<u64>,
        /// The most requests waiting per model; more are refused with 503 (default: no limit).
        #[arg(long)]
        max_queue_size: Option<usize>,
        /// The largest request body taken (bytes, or with a K, M or G suffix).
        #[arg(long, default_value = "64M")]
        max_request_bytes: String,
        /// After SIGTERM or Ctrl-C, how long (seconds) to wait for the requests received to
        /// finish before closing the connections still open (a client that sent half a
        /// request would otherwise keep the server alive).
        #[arg(long, default_value_t = 30.0)]
        shutdown_timeout: f64,
    },
    /// Run ONNX backend test cases (directories with model.onnx and test_data_set_N/).
    TestOnnx {
        /// Case directories, or directories holding them.
        dirs: Vec<PathBuf>,
        /// The backend to test.
        #[arg(long, default_value = "reference")]
        backend: Backend,
        /// Print only failures and the summary.
        #[arg(long, short)]
        quiet: bool,
    },
}

fn summary(t: &aim::Tensor) -> String {
    let v = t.to_f64_vec();
    let shown: Vec<String> = v.iter().take(5).map(|x| format!("{x:.6}")).collect();
    let more = if v.len() > 5 { ", ..." } else { "" };
    if v.is_empty() {
        return format!("{}{:?} (empty)", t.dtype(), t.shape());
    }
    let (mn, mx) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    format!("{}{:?} min {mn:.6} max {mx:.6} mean {mean:.6} [{}{more}]", t.dtype(), t.shape(), shown.join(", "))
}

fn run(
    out: &mut dyn Write,
    model: PathBuf,
    inputs: Option<PathBuf>,
    outputs: Option<PathBuf>,
    opts: aim::Options,
    seed: u64,
) -> Result<()> {
    let m = Model::load_with_options(&model, &opts)?;
    let ins = match inputs {
        Some(p) => npz::read_npz(&p)?,
        None => aim::random_inputs_shaped(m.inputs(), opts.shapes.first().map_or(&[][..], Vec::as_slice), seed)
            .map_err(anyhow::Error::msg)?,
    };
    let outs = m.run(ins).with_context(|| format!("running {}", model.display()))?;
    for (name, t) in &outs {
        writeln!(out, "{name}: {}", summary(t))?;
    }
    if let Some(p) = outputs {
        npz::write_npz(&p, &outs)?;
    }
    Ok(())
}

/// `aim compile`: writes the `.aim` file and says what it holds.
fn compile_cmd(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    cpu: &str,
    shape: &[String],
    passes: &PassArgs,
) -> Result<()> {
    let (half_weights, int4_weights) = parse_weights(&passes.weights)?;
    let opts = aim::Options {
        cpu: cpu.to_string(),
        shapes: parse_shapes(shape)?,
        opt_level: passes.level()?,
        disabled_passes: passes.disable_pass.clone(),
        half_weights,
        int4_weights,
        ..aim::Options::default()
    };
    let t0 = std::time::Instant::now();
    let s = aim::compiled::compile_to_file(model, output, &opts)?;
    writeln!(
        out,
        "{}: {} program ({} nodes) for {}, {:.1} MiB, in {:.0} ms",
        output.display(),
        s.stage,
        s.nodes,
        s.level,
        s.file_bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64() * 1e3
    )?;
    Ok(())
}

/// `aim quantize`'s options from the command line's words.
fn quantize_options(
    mode: &str,
    calibration: Option<PathBuf>,
    method: &str,
    symmetric: bool,
    per_channel: bool,
    exclude: Vec<String>,
    threads: Option<usize>,
) -> Result<aim::quantize::Options> {
    Ok(aim::quantize::Options {
        mode: mode.parse().map_err(anyhow::Error::msg)?,
        calibration,
        method: method.parse().map_err(anyhow::Error::msg)?,
        symmetric,
        per_channel,
        exclude,
        threads,
    })
}

fn quantize_cmd(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    opts: &aim::quantize::Options,
) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let mut progress = |phase: &str, done: usize, total: usize| {
        if tty {
            let filled = (done * 30).checked_div(total).unwrap_or(30);
            eprint!("\r{phase:12} [{}{}] {done}/{total}", "#".repeat(filled), ".".repeat(30 - filled));
            if done == total {
                eprintln!();
            }
        }
    };
    let s = aim::quantize::quantize(model, output, opts, &mut progress)?;
    let mut ops: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for (_, op) in &s.quantized {
        *ops.entry(op.as_str()).or_default() += 1;
    }
    let ops: Vec<String> = ops.iter().map(|(op, k)| format!("{k} {op}")).collect();
    let how = match opts.mode {
        aim::quantize::Mode::Static => format!(
            "static QDQ, {} activations calibrated by {:?} over {} input sets, s8 weights {}",
            if opts.symmetric { "s8 symmetric" } else { "u8 asymmetric" },
            opts.method,
            s.calibration_sets,
            if opts.per_channel { "per channel" } else { "per tensor" }
        ),
        aim::quantize::Mode::Dynamic => {
            format!("dynamic, s8 weights {}", if opts.per_channel { "per channel" } else { "per tensor" })
        }
    };
    writeln!(out, "{}: quantized {} nodes ({}): {how}", output.display(), s.quantized.len(), ops.join(", "))?;
    let (sets, random) = s.accuracy_sets;
    if sets == 0 {
        writeln!(out, "accuracy not measured: the inputs have symbolic dims; pass --calibration DIR with input sets")?;
        return Ok(());
    }
    writeln!(
        out,
        "accuracy against the f32 model over {sets} {}input sets:",
        if random { "seeded random " } else { "calibration " }
    )?;
    writeln!(out, "  {:24} {:>12} {:>14} {:>16}", "output", "max |diff|", "RMS diff / RMS", "top-1 agreement")?;
    for e in &s.accuracy {
        let top1 = e.top1.map_or("-".to_string(), |(a, n)| format!("{a}/{n} ({:.1}%)", 100.0 * a as f64 / n as f64));
        writeln!(out, "  {:24} {:>12.4e} {:>13.3}% {:>16}", e.name, e.max_abs, 100.0 * e.rel_rms, top1)?;
    }
    Ok(())
}

/// `aim compile --target`'s options from its flags.
fn aot_options(
    target: String,
    name: Option<String>,
    linker: Option<String>,
    shape: &[String],
    passes: &PassArgs,
) -> Result<aim::aot::AotOptions> {
    let (half_weights, int4_weights) = parse_weights(&passes.weights)?;
    Ok(aim::aot::AotOptions {
        target,
        name,
        shapes: parse_shapes(shape)?,
        linker,
        optimization: passes.optimization()?,
        half_weights,
        int4_weights,
    })
}

fn compile_so(
    out: &mut dyn Write,
    model: &std::path::Path,
    output: &std::path::Path,
    opts: &aim::aot::AotOptions,
) -> Result<()> {
    let t0 = std::time::Instant::now();
    let s = aim::aot::compile_shared_object(model, output, opts)?;
    writeln!(
        out,
        "{}: {} program{} for {} ({}), weights {}, entry {}, {:.1} MiB, in {:.0} ms",
        output.display(),
        s.programs,
        if s.programs == 1 { "" } else { "s" },
        s.triple,
        s.level,
        if s.prepacked { "prepacked" } else { "packed at load" },
        s.entry,
        s.file_bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64() * 1e3
    )?;
    Ok(())
}

fn info(out: &mut dyn Write, path: PathBuf, verify: bool) -> Result<()> {
    let aim_file = aim::compiled::is_aim_file(&path);
    if verify && !aim_file {
        bail!("--verify checks the checksums of a .aim file; {} is not one", path.display());
    }
    let ir = aim::compiled::import(&path)?;
    // A malformed graph is an error here too (unsupported ops are listed below instead).
    aim_ir::verify(&ir.graph).with_context(|| format!("{}: invalid graph", path.display()))?;
    let mut typed = ir.graph.clone();
    aim_ir::infer::infer_types(&mut typed).with_context(|| format!("{}: type inference", path.display()))?;
    let g = &ir.graph;
    writeln!(out, "model: {}", path.display())?;
    if aim_file {
        let (h, data, verified) = aim::compiled::header(&path, verify)?;
        let target: Vec<String> = h.target.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "aim file: {} program from {} by {} (target {})", h.stage, h.source, h.writer, target.join(" "))?;
        writeln!(out, "data section: {:.1} MiB", data as f64 / (1 << 20) as f64)?;
        if let Some(n) = verified {
            writeln!(out, "checksums: all {n} constants verified")?;
        }
    }
    if !ir.doc.is_empty() {
        writeln!(out, "doc: {}", ir.doc)?;
    }
    for (k, v) in &ir.metadata {
        writeln!(out, "metadata: {k} = {v}")?;
    }
    writeln!(
        out,
        "opset: {}{}",
        ir.opset,
        if ir.producer.is_empty() { String::new() } else { format!(" (producer: {})", ir.producer) }
    )?;
    writeln!(out, "inputs:")?;
    for i in &g.inputs {
        writeln!(out, "  {}: {}", i.name, i.ty)?;
    }
    writeln!(out, "outputs:")?;
    for o in &g.outputs {
        writeln!(out, "  {}: {}", o.name, o.ty)?;
    }
    let weights: usize = g.initializers.values().map(|t| t.bytes().len()).sum();
    writeln!(out, "initializers: {} ({:.1} MiB)", g.initializers.len(), weights as f64 / (1 << 20) as f64)?;
    writeln!(out, "nodes: {}", g.node_count_deep())?;
    writeln!(out, "ops:")?;
    for ((domain, op), nodes) in g.op_uses() {
        let d = if domain.is_empty() { String::new() } else { format!("{domain}:") };
        writeln!(out, "  {:>5}  {d}{op}", nodes.len())?;
    }
    // An optimized `.aim` program's `aim` ops are the cpu backend's own.
    let mut unsupported = aim_runtime::unsupported_ops(g);
    if aim_file {
        unsupported.retain(|op, _| !op.starts_with("aim:"));
    }
    if unsupported.is_empty() {
        writeln!(out, "unsupported ops: none")?;
    } else {
        writeln!(out, "unsupported ops:")?;
        for (op, nodes) in unsupported {
            writeln!(out, "  {op}: {}", nodes.join(", "))?;
        }
    }
    Ok(())
}

/// Peak resident memory of this process in MiB (Linux: VmHWM), or 0 where unknown.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Prints the nodes that took longest and writes a Chrome trace of the median of `runs`
/// profiled runs per node.
fn profile(out: &mut dyn Write, m: &Model, ins: &[(String, aim::Tensor)], trace: &std::path::Path) -> Result<()> {
    let runs: Vec<Vec<aim_runtime::NodeTiming>> =
        (0..5).map(|_| m.run_profiled(ins.to_vec())).collect::<Result<_, _>>()?;
    let first = &runs[0];
    let median_us = |i: usize| {
        let mut v: Vec<f64> = runs.iter().map(|r| r[i].time.as_secs_f64() * 1e6).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let mut events = Vec::new();
    let mut clock = 0.0;
    let mut by_node: Vec<(f64, &aim_runtime::NodeTiming)> = Vec::new();
    for (i, t) in first.iter().enumerate() {
        let us = median_us(i);
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        events.push(format!(
            "{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {clock:.3}, \"dur\": {us:.3}, \"pid\": 1, \"tid\": 1}}",
            esc(&t.node),
            esc(&t.op)
        ));
        clock += us;
        by_node.push((us, t));
    }
    std::fs::write(trace, format!("{{\"traceEvents\": [\n{}\n]}}\n", events.join(",\n")))
        .with_context(|| format!("writing {}", trace.display()))?;
    by_node.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = by_node.iter().map(|x| x.0).sum();
    writeln!(out, "profile (median of 5 runs per node; {total:.0} us in nodes; trace: {}):", trace.display())?;
    let mut per_op: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
    for (us, t) in &by_node {
        let e = per_op.entry(t.op.as_str()).or_default();
        e.0 += us;
        e.1 += 1;
    }
    let mut ops: Vec<_> = per_op.into_iter().collect();
    ops.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    for (op, (us, n)) in ops.iter().take(12) {
        writeln!(out, "  {:>6.1}%  {us:>10.1} us  {n:>4} x {op}", 100.0 * us / total)?;
    }
    writeln!(out, "top nodes:")?;
    for (us, t) in by_node.iter().take(15) {
        writeln!(out, "  {us:>10.1} us  {}  ({})", t.node, t.op)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bench(
    out: &mut dyn Write,
    model: PathBuf,
    inputs: Vec<PathBuf>,
    iters: usize,
    warmup: usize,
    opts: aim::Options,
    json: bool,
    trace: Option<PathBuf>,
) -> Result<()> {
    if iters == 0 {
        bail!("--iters must be at least 1");
    }
    let given: Vec<Vec<(String, aim::Tensor)>> = inputs.iter().map(|p| npz::read_npz(p)).collect::<Result<_, _>>()?;
    // The programs the runs use are compiled at load and counted in the compile time: for a
    // model with symbolic dims, those specialised to the inputs' shapes.
    let mut opts = opts;
    if let (false, true, aim::Backend::Cpu) = (given.is_empty(), opts.shapes.is_empty(), opts.backend) {
        let ir = aim::compiled::import(&model)?;
        if ir.graph.inputs.iter().any(|i| i.ty.concrete_shape().is_none()) {
            opts.shapes =
                given.iter().map(|ins| ins.iter().map(|(n, t)| (n.clone(), t.shape().to_vec())).collect()).collect();
        }
    }
    let t0 = std::time::Instant::now();
    let m = Model::load_with_options(&model, &opts)?;
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    let sets = if given.is_empty() {
        // Random inputs of the first `--shape` signature where dims are symbolic.
        let shaped = opts.shapes.first().map_or(&[][..], Vec::as_slice);
        vec![aim::random_inputs_shaped(m.inputs(), shaped, 0).map_err(anyhow::Error::msg)?]
    } else {
        given
    };
    let ins = &sets[0];
    for k in 0..warmup.max(sets.len()) {
        m.run(sets[k % sets.len()].clone())?;
    }
    let mut times: Vec<f64> = (0..iters)
        .map(|k| {
            let t = std::time::Instant::now();
            m.run(sets[k % sets.len()].clone()).map(|_| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()?;
    times.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let (min, median, p90, max) = (times[0], pick(0.5), pick(0.9), times[times.len() - 1]);
    let threads = m.threads();
    writeln!(out, "{}: {:?} backend, {threads} thread(s)", model.display(), m.backend())?;
    writeln!(out, "compile: {compile_ms:.1} ms")?;
    writeln!(
        out,
        "latency over {iters} runs: min {min:.3} ms, median {median:.3} ms, p90 {p90:.3} ms, max {max:.3} ms"
    )?;
    let rss = peak_rss_mb();
    writeln!(out, "peak RSS: {rss:.1} MiB")?;
    // After the runs: a fast kernel that declined a node's attributes or shapes shows here
    // (`aim info` cannot know without running).
    if let Some((_, kinds)) = m.node_kinds() {
        let reference: Vec<&str> = kinds
            .iter()
            .filter(|(_, k)| *k == aim_runtime::cpu::NodeKind::Reference)
            .map(|(n, _)| n.as_str())
            .collect();
        writeln!(out, "nodes on reference kernels in these runs: {} {}", reference.len(), reference.join(", "))?;
    }
    if let Some(trace) = trace {
        profile(out, &m, ins, &trace)?;
    }
    if json {
        writeln!(
            out,
            "{{\"compile_ms\": {compile_ms:.3}, \"latency_ms\": {{\"min\": {min:.4}, \"median\": {median:.4}, \"p90\": {p90:.4}, \"max\": {max:.4}}}, \"iters\": {iters}, \"threads\": {threads}, \"peak_rss_mb\": {rss:.1}}}"
        )?;
    }
    Ok(())
}

fn info_cmd(
    out: &mut dyn Write,
    model: Option<PathBuf>,
    verify: bool,
    target: bool,
    cpu: &str,
    shape: &[String],
) -> Result<()> {
    if model.is_none() && !target {
        bail!("give a model, --target, or both");
    }
    if target {
        let t = aim_compiler::target::Target::host().with_cpu(cpu)?;
        writeln!(out, "{t}")?;
    }
    if let Some(m) = model {
        info(out, m.clone(), verify)?;
        cpu_info(out, &m, cpu, &parse_shapes(shape)?)?;
    }
    Ok(())
}

/// What the cpu backend makes of a model: fused and compiled nodes, the nodes left to
/// fast or reference kernels, and the memory plan.
fn cpu_info(out: &mut dyn Write, path: &std::path::Path, cpu: &str, shapes: &[aim::InputShapes]) -> Result<()> {
    let opts = aim::Options {
        backend: Backend::Cpu,
        threads: Some(1),
        cpu: cpu.into(),
        shapes: shapes.to_vec(),
        ..aim::Options::default()
    };
    let m = match Model::load_with_options(path, &opts) {
        Ok(m) => m,
        // A --shape the model does not take is the user's mistake; other failures are
        // reported as the cpu backend's state.
        Err(e @ aim::Error::BadOption { .. }) => return Err(e.into()),
        Err(e) => {
            writeln!(out, "cpu backend: not available: {e}")?;
            return Ok(());
        }
    };
    if let Some((sig, Some(_))) = m.specializations().into_iter().next() {
        writeln!(out, "cpu backend: the program specialised to input shapes {sig:?}")?;
    }
    let Some((g, kinds)) = m.node_kinds() else {
        writeln!(out, "cpu backend: not available: the program does not compile")?;
        return Ok(());
    };
    let g = &g;
    let plan = aim_compiler::memory_plan::plan(g);
    let mut by_kind: std::collections::BTreeMap<aim_runtime::cpu::NodeKind, Vec<&str>> = Default::default();
    for (name, kind) in &kinds {
        by_kind.entry(*kind).or_default().push(name);
    }
    writeln!(out, "cpu backend: {} nodes after optimisation (from {})", g.nodes.len(), m.ir().graph.node_count_deep())?;
    for (kind, nodes) in &by_kind {
        let shown: Vec<&str> = nodes.iter().take(8).copied().collect();
        let more = if nodes.len() > 8 { format!(", ... {} more", nodes.len() - 8) } else { String::new() };
        writeln!(out, "  {:>4}  {}: {}{more}", nodes.len(), kind.label(), shown.join(", "))?;
    }
    quantized_report(out, &m.ir().graph, g)?;
    if let Some(how) = m.runs_as() {
        writeln!(out, "runs as: {how}")?;
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let allocated: usize = plan.allocated.iter().map(|a| a.1).sum();
    writeln!(
        out,
        "memory: arena {:.1} MiB holds {:.1} MiB of kernel outputs ({} values, {} in place, {} views); {} values ({:.1} MiB) allocated by library kernels or returned{}",
        mib(plan.arena_bytes),
        mib(plan.placed_bytes),
        plan.slots.iter().filter(|s| s.view_of.is_none()).count(),
        plan.slots.iter().filter(|s| s.in_place_of.is_some()).count(),
        plan.slots.iter().filter(|s| s.view_of.is_some()).count(),
        plan.allocated.len(),
        mib(allocated),
        if plan.dynamic.is_empty() { String::new() } else { format!(", {} of dynamic size", plan.dynamic.len()) }
    )?;
    Ok(())
}

/// For a quantized model: which of its quantized nodes run as integer kernels
/// (`aim:QDense`, `aim:QConv`), which as f32 kernels between a dequantize and a quantize, and which are
/// left to the integer reference kernels.
fn quantized_report(out: &mut dyn Write, imported: &aim_ir::Graph, optimized: &aim_ir::Graph) -> Result<()> {
    let quantized = |op: &str| {
        matches!(
            op,
            "QuantizeLinear"
                | "DequantizeLinear"
                | "DynamicQuantizeLinear"
                | "QLinearConv"
                | "QLinearMatMul"
                | "MatMulInteger"
                | "ConvInteger"
        )
    };
    // Counted by ONNX node: a com.microsoft op expanded at import (QLinearAdd into
    // dequantize, add, quantize) is its one source node.
    let source = |n: &'_ aim_ir::Node| -> String {
        match n.attrs.get(aim_compiler::passes::SOURCES) {
            Some(aim_ir::Attr::Strings(s)) if !s.is_empty() => s[0].clone(),
            _ => n.name.clone(),
        }
    };
    let mut names: Vec<String> =
        imported.nodes.iter().filter(|n| n.domain.is_empty() && quantized(&n.op)).map(source).collect();
    names.sort();
    names.dedup();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    if names.is_empty() {
        return Ok(());
    }
    use aim_ir::schema::Quantized;
    let quantized_as = |n: &aim_ir::Node, q: Quantized| {
        n.domain == "aim" && aim_ir::schema::aim_op(&n.op).is_some_and(|o| o.quantized == q)
    };
    let integer: Vec<&aim_ir::Node> = optimized.nodes.iter().filter(|n| quantized_as(n, Quantized::Integer)).collect();
    let edges = optimized.nodes.iter().filter(|n| quantized_as(n, Quantized::Edge)).count();
    // The quantized nodes inside integer kernels and at the edges of byte regions: those
    // they name as sources, and the activation quantizations every reader of which went
    // into one (fused there).
    // A source names an imported node, or a node a pass made from one (`NAME/...`, as
    // the QOperator ops become quantize-dequantize pairs around f32 ops).
    let mut inside: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for n in optimized.nodes.iter().filter(|n| quantized_as(n, Quantized::Integer) || quantized_as(n, Quantized::Edge))
    {
        if let Some(aim_ir::Attr::Strings(s)) = n.attrs.get(aim_compiler::passes::SOURCES) {
            for src in s {
                let of = |name: &&str| src == name || src.strip_prefix(name).is_some_and(|r| r.starts_with('/'));
                inside.extend(names.iter().copied().filter(|n| of(n)));
            }
        }
    }
    let remaining: std::collections::HashSet<&str> = optimized.nodes.iter().map(|n| n.name.as_str()).collect();
    for d in imported.nodes.iter().filter(|n| n.op == "DynamicQuantizeLinear" && !remaining.contains(n.name.as_str())) {
        let mut readers = imported.nodes.iter().filter(|n| n.inputs.iter().any(|i| d.outputs.contains(i)));
        if readers.all(|r| inside.contains(r.name.as_str()) || r.op == "Mul") {
            inside.insert(d.name.as_str());
        }
    }
    let mut left: Vec<String> = optimized
        .nodes
        .iter()
        .filter(|n| n.domain.is_empty() && quantized(&n.op) && n.op != "DynamicQuantizeLinear")
        .map(source)
        .filter(|s| !inside.contains(s.as_str()))
        .collect();
    left.sort();
    left.dedup();
    let left: Vec<&str> = left.iter().map(|s| s.as_str()).collect();
    let shown: Vec<&str> = left.iter().take(8).copied().collect();
    let mut kinds: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for n in &integer {
        *kinds.entry(n.op.as_str()).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(op, k)| format!("{k} aim:{op}")).collect();
    writeln!(
        out,
        "quantized: {} integer kernels ({}: u8×s8 sums in i32{}) for {} quantized nodes; {} quantized nodes run as f32 kernels between dequantization and quantization; {} left to the integer reference kernels{}{}",
        integer.len(),
        if kinds.is_empty() { "none".to_string() } else { kinds.join(", ") },
        if edges > 0 { format!("; activations kept as bytes NHWC between them, {edges} region edges") } else { String::new() },
        inside.len(),
        names.len().saturating_sub(left.len() + inside.len()),
        left.len(),
        if left.is_empty() { "" } else { ": " },
        shown.join(", ")
    )?;
    Ok(())
}

fn test_onnx(out: &mut dyn Write, dirs: Vec<PathBuf>, backend: Backend, quiet: bool) -> Result<bool> {
    if dirs.is_empty() {
        bail!("give at least one directory of ONNX test cases");
    }
    let cases = conformance::find_cases(&dirs).context("listing test cases")?;
    if cases.is_empty() {
        bail!(
            "no test cases (directories with model.onnx) under {}",
            dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for c in &cases {
        let name = c.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        match conformance::run_case(c, backend) {
            conformance::Outcome::Pass => {
                pass += 1;
                if !quiet {
                    writeln!(out, "{name}: pass")?;
                }
            }
            conformance::Outcome::Fail(r) => {
                fail += 1;
                writeln!(out, "{name}: fail: {r}")?;
            }
            conformance::Outcome::Skipped(r) => {
                skip += 1;
                if !quiet {
                    writeln!(out, "{name}: skipped: {r}")?;
                }
            }
        }
    }
    writeln!(out, "{pass} passed, {fail} failed, {skip} skipped")?;
    Ok(fail == 0)
}

/// `aim compare`: the report, and whether every value is within the tolerance.
fn compare(
    out: &mut dyn Write,
    model: &std::path::Path,
    inputs: Option<PathBuf>,
    against: &str,
    tolerance: f64,
    json: bool,
    opts: &aim::Options,
) -> Result<bool> {
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        bail!("--tolerance {tolerance}: expected a non-negative number");
    }
    let against = match against {
        "reference" => aim::compare::Against::Reference,
        file => {
            let values = npz::read_npz(std::path::Path::new(file))?.into_iter().collect();
            aim::compare::Against::Values { what: file.to_string(), values }
        }
    };
    let ins = match inputs {
        Some(p) => npz::read_npz(&p)?,
        None => {
            let ir = aim::compiled::import(model)?;
            aim::random_inputs(&ir.graph.inputs, 0).map_err(anyhow::Error::msg)?
        }
    };
    let report = aim::compare::compare(model, ins, &against, tolerance, opts)?;
    let name = model.display().to_string();
    if json {
        writeln!(out, "{}", aim::compare::render_json(&report, &name))?;
    } else {
        out.write_all(aim::compare::render_text(&report, &name).as_bytes())?;
    }
    Ok(report.first_over().is_none())
}

/// `1048576`, `1024K` or `1M` in bytes.
fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mul)
        .map_err(|_| anyhow::anyhow!("'{s}' is not a size (bytes, or with a K or M suffix)"))
}

#[allow(clippy::too_many_arguments)]
/// The GPU of `aim explore`'s ptx stage: when `--gpu` is given or the stage is named.
fn gpu_for_explore(
    stages: &[String],
    gpu: Option<&str>,
    allow_tf32: bool,
    half: Option<&str>,
) -> Result<Option<aim_compiler::cuda::GpuTarget>> {
    if gpu.is_none() && !stages.iter().any(|s| s == "ptx") {
        return Ok(None);
    }
    let arch = gpu.unwrap_or("sm_80");
    let t = aim_compiler::cuda::GpuTarget::parse(arch)
        .with_context(|| format!("--gpu {arch}: expected sm_80, sm_86, sm_89 or sm_90"))?;
    let half = match half {
        None => None,
        Some("f16") => Some(aim_compiler::cuda::Half::F16),
        Some("bf16") => Some(aim_compiler::cuda::Half::Bf16),
        Some(h) => bail!("--half {h}: expected f16 or bf16"),
    };
    Ok(Some(t.with_tf32(allow_tf32).with_half(half)))
}

/// `aim explore`'s options from its flags.
fn explore_options(
    passes: bool,
    profile: Option<PathBuf>,
    cpu: String,
    caches: Option<String>,
    shape: &[String],
    gpu: Option<aim_compiler::cuda::GpuTarget>,
) -> Result<aim::explore::Options> {
    let shapes = parse_shapes(shape)?;
    let caches = match caches {
        None => None,
        Some(c) => {
            let v: Vec<usize> = c.split(',').map(parse_size).collect::<Result<_>>()?;
            let [l1, l2, l3] = v[..] else { bail!("--caches takes three sizes: L1D,L2,L3 (got '{c}')") };
            Some([l1, l2, l3])
        }
    };
    Ok(aim::explore::Options { cpu, caches, passes, profile, shapes, gpu, ..Default::default() })
}

fn explore(
    out: &mut dyn Write,
    model: &std::path::Path,
    stages: &[String],
    node: Option<&str>,
    html: Option<PathBuf>,
    opts: &aim::explore::Options,
) -> Result<()> {
    // Refuse an unknown stage before the (slower) work.
    for s in stages {
        if s != "all" && !aim::explore::STAGES.contains(&s.as_str()) {
            bail!("unknown stage '{s}' (expected one of {}, all)", aim::explore::STAGES.join(", "));
        }
    }
    let e = aim::explore::explore(model, opts)?;
    aim::explore::check_request(&e, stages, node)?;
    match html {
        Some(path) => {
            let page = aim::explore::html::render(&e);
            std::fs::write(&path, &page).with_context(|| format!("writing {}", path.display()))?;
            writeln!(out, "wrote {} ({} bytes)", path.display(), page.len())?;
        }
        None => out.write_all(aim::explore::render_text(&e, stages, node, opts.passes).as_bytes())?,
    }
    Ok(())
}

/// An error message as one printable line: control characters (a newline in a quoted
/// name, raw bytes of a file) are escaped, so an error is always exactly one line.
fn one_line(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for c in msg.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(l) = &cli.log {
        match l.parse() {
            Ok(level) => aim::logging::set_level(level),
            Err(e) => return finish(Err(anyhow::anyhow!("--log: {e}"))),
        }
    }
    for lib in &cli.custom_ops {
        if let Err(e) = aim::register_custom_ops_library(lib) {
            return finish(Err(anyhow::anyhow!("--custom-ops: {e}")));
        }
    }
    // A panic is a bug in aim: the user gets one error line, not a panic message and a
    // backtrace (AIM_SHOW_PANICS=1 shows them, for debugging aim).
    if std::env::var_os("AIM_SHOW_PANICS").is_none_or(|v| v == "0") {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let result = std::panic::catch_unwind(|| dispatch(cli)).unwrap_or_else(|p| {
        Err(anyhow::anyhow!(
            "internal error in aim: {} (this is a bug; please report it)",
            aim_runtime::panic_message(&*p)
        ))
    });
    finish(result)
}

/// Runs the command; `Ok(false)` when it ran but found failures (test-onnx, compare).
fn dispatch(cli: Cli) -> Result<bool> {
    let mut out = std::io::stdout().lock();
    match cli.cmd {
        #[cfg(feature = "serve")]
        Cmd::Serve {
            models,
            config,
            host,
            http_port,
            grpc_port,
            metrics_port,
            threads,
            max_batch_size,
            max_queue_delay_us,
            max_queue_size,
            max_request_bytes,
            shutdown_timeout,
        } => {
            use aim::serve::config::{BatchingFlags, ServeConfig};
            if threads.is_some_and(|t| t == 0 || t > aim::MAX_THREADS) {
                bail!("--threads must be between 1 and {}", aim::MAX_THREADS);
            }
            let max_body = aim_ir::limits::parse_bytes(&max_request_bytes).filter(|&n| n > 0).ok_or_else(|| {
                anyhow::anyhow!("--max-request-bytes {max_request_bytes}: expected a size such as 4096, 64M or 1G")
            })?;
            let cfg = match config {
                Some(path) => {
                    if max_batch_size.is_some() || max_queue_delay_us.is_some() || max_queue_size.is_some() {
                        bail!("with --config, batching is set in deploy.yml (scheduler: or per model)");
                    }
                    ServeConfig::from_file(&path, threads)?
                }
                None => {
                    let flags = BatchingFlags { max_batch_size, max_queue_delay_us, max_queue_size };
                    ServeConfig::from_flags(&models, &flags, threads)?
                }
            };
            if !(0.0..=86_400.0).contains(&shutdown_timeout) {
                bail!("--shutdown-timeout {shutdown_timeout}: expected seconds between 0 and 86400");
            }
            let shutdown_timeout = std::time::Duration::from_secs_f64(shutdown_timeout);
            let listen = aim::serve::Listen { host, http_port, grpc_port, metrics_port, max_body, shutdown_timeout };
            aim::serve::serve(cfg, &listen).map(|_| true)
        }
        Cmd::Run { model, inputs, outputs, backend, seed, load } => {
            load.options(backend).and_then(|o| run(&mut out, model, inputs, outputs, o, seed)).map(|_| true)
        }
        Cmd::Bench { model, inputs, iters, warmup, backend, load, json, profile } => load
            .options(backend)
            .and_then(|o| bench(&mut out, model, inputs, iters, warmup, o, json, profile))
            .map(|_| true),
        Cmd::Info { model, verify, target, cpu, shape } => {
            info_cmd(&mut out, model, verify, target, &cpu, &shape).map(|_| true)
        }
        Cmd::Compile {
            model,
            output,
            cpu,
            shape,
            target,
            name,
            linker,
            quantize: Some(mode),
            calibration,
            method,
            symmetric,
            per_channel,
            passes,
        } => {
            // Quantized first, next to the output, then compiled like any model.
            let q = output.with_extension("quantized.onnx");
            let opts = quantize_options(&mode, calibration, &method, symmetric, per_channel, Vec::new(), None);
            let done = opts.and_then(|o| quantize_cmd(&mut out, &model, &q, &o)).and_then(|_| match target {
                Some(_) if cpu != "native" => {
                    Err(anyhow::anyhow!("--cpu caps a .aim file's level; with --target give the level as TRIPLE,LEVEL"))
                }
                Some(t) => {
                    aot_options(t, name, linker, &shape, &passes).and_then(|o| compile_so(&mut out, &q, &output, &o))
                }
                None if name.is_some() || linker.is_some() => {
                    Err(anyhow::anyhow!("--name and --linker are for shared objects (--target)"))
                }
                None => compile_cmd(&mut out, &q, &output, &cpu, &shape, &passes),
            });
            let _ = std::fs::remove_file(&q);
            done.map(|_| true)
        }
        Cmd::Compile { model, output, cpu, shape, target: Some(target), name, linker, passes, .. } => {
            if cpu != "native" {
                Err(anyhow::anyhow!("--cpu caps a .aim file's level; with --target give the level as TRIPLE,LEVEL"))
            } else {
                aot_options(target, name, linker, &shape, &passes)
                    .and_then(|o| compile_so(&mut out, &model, &output, &o))
                    .map(|_| true)
            }
        }
        Cmd::Compile { model, output, cpu, shape, target: None, name, linker, passes, .. } => {
            if name.is_some() || linker.is_some() {
                Err(anyhow::anyhow!("--name and --linker are for shared objects (--target)"))
            } else {
                compile_cmd(&mut out, &model, &output, &cpu, &shape, &passes).map(|_| true)
            }
        }
        Cmd::Quantize {
            model,
            output,
            mode,
            calibration,
            method,
            symmetric,
            asymmetric: _,
            per_channel,
            exclude,
            threads,
        } => {
            let opts = quantize_options(&mode, calibration, &method, symmetric, per_channel, exclude, threads);
            opts.and_then(|o| quantize_cmd(&mut out, &model, &output, &o)).map(|_| true)
        }
        Cmd::Compare { model, inputs, against, tolerance, json, load } => {
            load.options(Backend::Cpu).and_then(|o| compare(&mut out, &model, inputs, &against, tolerance, json, &o))
        }
        Cmd::TestOnnx { dirs, backend, quiet } => test_onnx(&mut out, dirs, backend, quiet),
        Cmd::Explore {
            model,
            stage,
            node,
            passes,
            html,
            profile,
            cpu,
            caches,
            shape,
            gpu,
            allow_tf32,
            half,
            pass_choice,
        } => {
            let gpu = gpu_for_explore(&stage, gpu.as_deref(), allow_tf32, half.as_deref())?;
            let mut opts = explore_options(passes, profile, cpu, caches, &shape, gpu)?;
            opts.optimization = pass_choice.optimization()?;
            (opts.half_weights, opts.int4_weights) = parse_weights(&pass_choice.weights)?;
            explore(&mut out, &model, &stage, node.as_deref(), html, &opts).map(|_| true)
        }
    }
}

/// The exit code for a command's result, printing its error.
fn finish(result: Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        // The reader went away (`aim info m.onnx | head`): stop quietly, as Unix tools do.
        Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}
