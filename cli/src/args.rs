//! The options the subcommands share (loading, passes, shapes) and the subcommands
//! themselves, as clap parses them.

use aim::Backend;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// How a model is loaded and run: the options `run`, `bench` and `compare` share.
#[derive(Args, Clone)]
pub(crate) struct LoadArgs {
    /// Threads (cpu backend; default: the physical core count; at most 1024). The reference
    /// backend runs on one.
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Cap the ISA level for the cpu backend (native, x86-64-v4, x86-64-v3, x86-64-v2,
    /// baseline; also AIM_CPU).
    #[arg(long, env = "AIM_CPU", default_value = "native")]
    pub(crate) cpu: String,
    /// Stop a run that takes longer than this many seconds, with an error.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub(crate) timeout: Option<f64>,
    /// The largest tensor aim may allocate (bytes, or with a K, M or G suffix; default:
    /// AIM_MAX_TENSOR_BYTES, else half the machine's memory).
    #[arg(long, value_name = "BYTES")]
    pub(crate) max_tensor_bytes: Option<String>,
    /// Fit a run's peak resident memory under this size (bytes, or with a K, M or G
    /// suffix; cpu backend): weights read from a .aim file are handed back between uses
    /// as far as needed; a budget that cannot be met is an error with the breakdown.
    #[arg(long, value_name = "BYTES")]
    pub(crate) memory_budget: Option<String>,
    /// Compile a program specialised to this input shape at load (`input=1x3x640x640`);
    /// repeatable: one per input with symbolic dims, a name given again starts another
    /// signature. Other shapes are compiled on first use. Without `--inputs`, the random
    /// inputs take the first signature's shapes.
    #[arg(long, value_name = "NAME=DIMS")]
    pub(crate) shape: Vec<String>,
    /// How many shape-specialised programs to keep (the most recently used; default 8).
    #[arg(long, value_name = "N")]
    pub(crate) shape_cache: Option<usize>,
    /// On the cuda backend, let f32 GEMMs and convolutions use TF32 tensor cores.
    #[arg(long)]
    pub(crate) allow_tf32: bool,
    #[command(flatten)]
    pub(crate) passes: PassArgs,
    /// Bind each worker thread to a core of its own (one per physical core first; the
    /// calling thread is not pinned). Also AIM_PIN_THREADS=cores.
    #[arg(long)]
    pub(crate) pin_threads: bool,
}

/// How the program is compiled: `-O`, `--disable-pass` and `--weights`, for every command
/// that compiles.
#[derive(Args, Clone)]
pub(crate) struct PassArgs {
    /// Optimisation level (cpu backend): 0 runs every node on its reference kernel,
    /// interpreted; 1 adds constant folding, simplification, dead-code elimination and
    /// BatchNormalization folding; 2 fusion, packed-weight, quantized and 4-bit kernels; 3
    /// (the default) blocked layouts and every other pass.
    #[arg(short = 'O', long = "opt-level", value_name = "LEVEL", default_value_t = 3)]
    pub(crate) opt_level: u32,
    /// Do not run this pass of the cpu pipeline (repeatable; `aim explore --passes` lists
    /// them by name).
    #[arg(long = "disable-pass", value_name = "NAME")]
    pub(crate) disable_pass: Vec<String>,
    /// How dense layers (MatMul / Gemm) hold their weights: f32, f16 (half the memory,
    /// widened inside the GEMM; each weight rounded to the nearest f16), or int4 / int4:BLOCK
    /// (an eighth of the memory: 4-bit codes per block of 32, 64 or 128 rows with a scale
    /// and zero point each, as ONNX Runtime's MatMulNBits quantizer writes them; cpu
    /// backend), or int8 (a quarter: symmetric 8-bit codes with a scale per column; cpu
    /// backend). On the cuda backend f16 also covers convolutions and multiplies on f16
    /// tensor cores (a model whose weights are f16 or bf16 gets that without asking).
    #[arg(long, value_name = "f32|f16|int4[:BLOCK]|int8", default_value = "f32")]
    pub(crate) weights: String,
}

impl PassArgs {
    /// The level, checked.
    pub(crate) fn level(&self) -> Result<aim::OptLevel> {
        aim::OptLevel::from_number(self.opt_level)
            .ok_or_else(|| anyhow::anyhow!("-O{}: the levels are 0, 1, 2 and 3", self.opt_level))
    }

    /// The compiler's pass selection.
    pub(crate) fn optimization(&self) -> Result<aim_compiler::passes::Optimization> {
        Ok(aim_compiler::passes::Optimization { level: self.level()?, disabled: self.disable_pass.clone() })
    }
}

/// `--weights`: f16, int4 with its block size, or int8.
pub(crate) fn parse_weights(w: &str) -> Result<aim::WeightChoice> {
    aim::parse_weights(w).map_err(|e| anyhow::anyhow!("--weights {w}: {e}"))
}

/// `--shape` values as signatures: a name given again starts the next one.
pub(crate) fn parse_shapes(given: &[String]) -> Result<Vec<aim::InputShapes>> {
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
    pub(crate) fn options(&self, backend: Backend) -> Result<aim::Options> {
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
        let memory_budget = match &self.memory_budget {
            None => None,
            Some(b) => Some(
                aim_ir::limits::parse_bytes(b)
                    .filter(|&n| n > 0)
                    .ok_or_else(|| anyhow::anyhow!("--memory-budget {b}: expected a size such as 500M or 2G"))?,
            ),
        };
        if memory_budget.is_some() && backend != Backend::Cpu {
            bail!("--memory-budget plans the cpu backend's memory");
        }
        // An unknown --cpu is an error on either backend (the reference one does not use it).
        aim_compiler::target::Target::host().with_cpu(&self.cpu)?;
        if self.shape_cache == Some(0) {
            bail!("--shape-cache must be at least 1");
        }
        let weights = parse_weights(&self.passes.weights)?;
        Ok(aim::Options {
            backend,
            threads: self.threads,
            cpu: self.cpu.clone(),
            timeout,
            max_tensor_bytes,
            shapes: parse_shapes(&self.shape)?,
            shape_cache: self.shape_cache,
            half_weights: weights.half,
            int4_weights: weights.int4,
            int8_weights: weights.int8,
            allow_tf32: self.allow_tf32,
            opt_level: self.passes.level()?,
            disabled_passes: self.passes.disable_pass.clone(),
            pin_threads: self.pin_threads,
            custom_ops: Vec::new(),
            memory_budget,
        })
    }
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
        /// x86-64-v3, x86-64-v4, ...; default the host's) or aarch64-unknown-linux-gnu. With
        /// a .aim output, a package of one program per target: `all`, or a list of
        /// x86_64-unknown-linux-gnu, x86-64-v2, x86-64-v3, x86-64-v4 and
        /// aarch64-unknown-linux-gnu (loading picks the best one the CPU runs).
        #[arg(long, value_name = "TRIPLE[,LEVEL] | all | LIST")]
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

/// `1048576`, `1024K` or `1M` in bytes.
pub(crate) fn parse_size(s: &str) -> Result<usize> {
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
