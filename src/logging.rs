//! What aim does, as it does it: `AIM_LOG=info|debug|trace` (or `--log`, or
//! [`set_level`]) writes lines to stderr, or to the file `AIM_LOG_FILE` names (appended).
//!
//! - `info`: each model load's phases with their times (import, checks, passes, code
//!   generation, memory plan, weight packing), and each program compiled for a new input
//!   shape;
//! - `debug`: also every pass with its time, and every run: each node's kernel, output
//!   shapes and time, then the run's total (the profile without a separate command; runs
//!   take the profiled path, which times each node);
//! - `trace`: also each node's input shapes, and each run's inputs and outputs.
//!
//! Off by default; a line costs nothing when its level is off (one atomic load).

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// How much is logged; each level includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Nothing (the default).
    Off = 0,
    /// Load phases and compiles, with times.
    Info = 1,
    /// Also passes, and every node of every run.
    Debug = 2,
    /// Also shapes of every node's inputs and of each run's inputs and outputs.
    Trace = 3,
}

impl std::str::FromStr for LogLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<LogLevel, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "off" | "none" | "0" => Ok(LogLevel::Off),
            "info" => Ok(LogLevel::Info),
            "debug" => Ok(LogLevel::Debug),
            "trace" => Ok(LogLevel::Trace),
            _ => Err(format!("'{s}' is not a log level (off, info, debug or trace)")),
        }
    }
}

impl LogLevel {
    fn name(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// Not read from `AIM_LOG` yet.
const UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

/// The level: set by [`set_level`], else read once from `AIM_LOG` (a value that is not a
/// level is said once on stderr, and logging stays off).
pub fn level() -> LogLevel {
    match LEVEL.load(Ordering::Relaxed) {
        UNSET => {
            let l = match std::env::var("AIM_LOG") {
                Err(_) => LogLevel::Off,
                Ok(v) => v.parse().unwrap_or_else(|e| {
                    eprintln!("aim: AIM_LOG: {e}; logging stays off");
                    LogLevel::Off
                }),
            };
            // Another thread may have set it meanwhile: its choice stands.
            let _ = LEVEL.compare_exchange(UNSET, l as u8, Ordering::Relaxed, Ordering::Relaxed);
            level()
        }
        1 => LogLevel::Info,
        2 => LogLevel::Debug,
        3 => LogLevel::Trace,
        _ => LogLevel::Off,
    }
}

/// Sets the level for the whole process (over `AIM_LOG`).
pub fn set_level(l: LogLevel) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

/// Whether lines of level `l` are written.
pub fn enabled(l: LogLevel) -> bool {
    l != LogLevel::Off && level() >= l
}

/// Where lines go, and the clock their times count from.
struct Sink {
    out: Mutex<Box<dyn Write + Send>>,
    start: Instant,
}

fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| {
        let out: Box<dyn Write + Send> = match std::env::var_os("AIM_LOG_FILE") {
            Some(p) => match std::fs::OpenOptions::new().create(true).append(true).open(&p) {
                Ok(f) => Box::new(f),
                Err(e) => {
                    eprintln!("aim: AIM_LOG_FILE {}: {e}; logging to stderr", std::path::Path::new(&p).display());
                    Box::new(std::io::stderr())
                }
            },
            None => Box::new(std::io::stderr()),
        };
        Sink { out: Mutex::new(out), start: Instant::now() }
    })
}

/// Writes one line at level `l` (when enabled): `aim[debug +1.234s] text`. Write errors
/// are dropped: logging never fails a load or a run.
pub fn write(l: LogLevel, text: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let s = sink();
    let line = format!("aim[{} +{:.3}s] {text}\n", l.name(), s.start.elapsed().as_secs_f64());
    let mut out = s.out.lock().unwrap_or_else(|e| e.into_inner());
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

/// Logs at a level: `log!(Info, "{path}: imported")`.
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        if $crate::logging::enabled($crate::logging::LogLevel::$level) {
            $crate::logging::write($crate::logging::LogLevel::$level, format_args!($($arg)*));
        }
    };
}
pub(crate) use log;

/// Milliseconds since `t`, for log lines.
pub(crate) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// `f32[1,3,224,224]`.
pub(crate) fn shape_text(t: &aim_ir::Tensor) -> String {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", t.dtype(), dims.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("DEBUG".parse::<LogLevel>(), Ok(LogLevel::Debug));
        assert_eq!("".parse::<LogLevel>(), Ok(LogLevel::Off));
        assert!("loud".parse::<LogLevel>().unwrap_err().contains("off, info, debug or trace"));
        assert!(LogLevel::Trace > LogLevel::Debug && LogLevel::Debug > LogLevel::Info);
    }
}
