//! The `aim` command line: the arguments as clap parses them (`args`), one module per
//! subcommand (`run`, `bench`, `compile`, `quantize`, `info`, `test_onnx`, `compare`,
//! `explore`; `aim serve` is the library's `aim::serve`), and here the dispatch, the
//! logging and custom-op setup every command shares, and the exit status.

use aim::Backend;
use anyhow::{bail, Result};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

mod args;
mod bench;
mod compare;
mod compile;
mod explore;
mod info;
mod quantize;
mod run;
mod test_onnx;

use args::{parse_weights, Cmd};

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
            load.options(backend).and_then(|o| run::run(&mut out, model, inputs, outputs, o, seed)).map(|_| true)
        }
        Cmd::Bench { model, inputs, iters, warmup, backend, load, json, profile } => load
            .options(backend)
            .and_then(|o| bench::bench(&mut out, model, inputs, iters, warmup, o, json, profile))
            .map(|_| true),
        Cmd::Info { model, verify, target, cpu, shape } => {
            info::info_cmd(&mut out, model, verify, target, &cpu, &shape).map(|_| true)
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
            let opts =
                quantize::quantize_options(&mode, calibration, &method, symmetric, per_channel, Vec::new(), None);
            let done = opts
                .and_then(|o| quantize::quantize_cmd(&mut out, &model, &q, &o))
                .and_then(|_| compile::compile_any(&mut out, &q, &output, &cpu, &shape, target, name, linker, &passes));
            let _ = std::fs::remove_file(&q);
            done.map(|_| true)
        }
        Cmd::Compile { model, output, cpu, shape, target, name, linker, passes, .. } => {
            compile::compile_any(&mut out, &model, &output, &cpu, &shape, target, name, linker, &passes).map(|_| true)
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
            let opts =
                quantize::quantize_options(&mode, calibration, &method, symmetric, per_channel, exclude, threads);
            opts.and_then(|o| quantize::quantize_cmd(&mut out, &model, &output, &o)).map(|_| true)
        }
        Cmd::Compare { model, inputs, against, tolerance, json, load } => load
            .options(Backend::Cpu)
            .and_then(|o| compare::compare(&mut out, &model, inputs, &against, tolerance, json, &o)),
        Cmd::TestOnnx { dirs, backend, quiet } => test_onnx::test_onnx(&mut out, dirs, backend, quiet),
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
            let gpu = explore::gpu_for_explore(&stage, gpu.as_deref(), allow_tf32, half.as_deref())?;
            let mut opts = explore::explore_options(passes, profile, cpu, caches, &shape, gpu)?;
            opts.optimization = pass_choice.optimization()?;
            let weights = parse_weights(&pass_choice.weights)?;
            (opts.half_weights, opts.int4_weights, opts.int8_weights) = (weights.half, weights.int4, weights.int8);
            explore::explore(&mut out, &model, &stage, node.as_deref(), html, &opts).map(|_| true)
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
