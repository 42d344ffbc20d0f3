//! What `aim serve` serves: `deploy.yml` (models, devices, scheduler) or the command line's
//! `--model NAME=PATH` flags, checked and resolved before the server starts — an unknown key
//! or a bad value is one error naming it.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The server's whole configuration, resolved.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The models, each with its versions and batching.
    pub models: Vec<ModelConfig>,
    /// Every device named, with where its traffic goes.
    pub devices: Vec<Device>,
    /// How requests are spread over the devices that serve.
    pub policy: Policy,
    /// Custom-op libraries to register before the models load (`custom_ops:`, paths from
    /// the deploy file's directory; `--custom-ops` registers its own first).
    pub custom_ops: Vec<PathBuf>,
}

/// One model: its versions (ascending) and how its requests are batched.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// The name clients use in `/v2/models/{name}`.
    pub name: String,
    /// `(version, file)`, ascending; the last is what a request without a version gets.
    pub versions: Vec<(u64, PathBuf)>,
    /// Dynamic batching, with Triton's fields.
    pub batching: Batching,
    /// How its dense layers hold their weights (`weights:`, as `aim run --weights`): f16,
    /// int4 and its block size, or int8.
    pub weights: crate::WeightChoice,
    /// The peak resident memory each of its cpu instances must fit in (`memory_budget:`,
    /// as `aim run --memory-budget`; bytes).
    pub memory_budget: Option<usize>,
}

/// Dynamic batching for one model, with Triton's semantics.
#[derive(Debug, Clone, PartialEq)]
pub struct Batching {
    /// The most rows one run takes; 0: no batching (every request runs alone).
    pub max_batch_size: usize,
    /// Batch sizes to run as soon as they are reached, without waiting out the delay.
    pub preferred_batch_size: Vec<usize>,
    /// How long the first request of a batch waits for others.
    pub max_queue_delay: Duration,
    /// The most requests waiting; one more is refused (503). 0: no limit.
    pub max_queue_size: usize,
    /// How long a request may wait in the queue when it sets no `timeout` itself; `None`:
    /// no limit.
    pub default_timeout: Option<Duration>,
    /// Whether `max_batch_size` was written for this model (a model that cannot be batched
    /// is then an error; a default from `scheduler:` just turns batching off for it).
    pub explicit: bool,
}

/// The kind of a device in `deploy.yml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// An x86-64 CPU: aim's cpu backend.
    X86,
    /// An AArch64 CPU: aim's cpu backend.
    Arm64,
    /// An NVIDIA GPU, served by the cuda backend where this host has one (and the build
    /// has the `cuda` feature); elsewhere its traffic goes to its fallback.
    Cuda,
}

impl DeviceKind {
    /// Its name in `deploy.yml`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::X86 => "x86",
            DeviceKind::Arm64 => "arm64",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// A device, resolved: whether it serves on this host, or which device takes its traffic.
#[derive(Debug, Clone)]
pub struct Device {
    /// Its name in `deploy.yml` (`cpu` for the default device).
    pub name: String,
    /// Its kind.
    pub kind: DeviceKind,
    /// Its share of the traffic, relative to the other devices'.
    pub weight: u32,
    /// The threads each model instance on it runs with (`None`: aim's default).
    pub threads: Option<usize>,
    /// The device that runs its traffic: itself when it can serve here.
    pub serves_on: String,
    /// Why it does not serve here, when it does not.
    pub unavailable: Option<String>,
}

/// How the scheduler spreads batches over devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// One queue per model: whichever device is free first takes the next batch (so the
    /// faster or idler device serves more).
    LatencyAware,
    /// Requests dealt to the devices in turn, in proportion to their weights (smooth
    /// weighted round-robin), each device with its own queue.
    RoundRobin,
}

impl Policy {
    /// Its name in `deploy.yml`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::LatencyAware => "latency-aware",
            Policy::RoundRobin => "round-robin",
        }
    }
}

/// `deploy.yml`, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployFile {
    models: Vec<ModelEntry>,
    #[serde(default)]
    devices: Vec<DeviceEntry>,
    #[serde(default)]
    scheduler: SchedulerEntry,
    #[serde(default)]
    custom_ops: Vec<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    name: String,
    path: Option<PathBuf>,
    versions: Option<Vec<VersionEntry>>,
    max_batch_size: Option<usize>,
    preferred_batch_size: Option<Vec<usize>>,
    max_queue_delay_microseconds: Option<u64>,
    max_queue_size: Option<usize>,
    default_timeout_microseconds: Option<u64>,
    weights: Option<String>,
    memory_budget: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionEntry {
    version: u64,
    path: PathBuf,
}

/// The batching fields, in `scheduler:` (defaults) and in a model (overrides).
#[derive(Default, Clone)]
struct BatchingEntry {
    max_batch_size: Option<usize>,
    preferred_batch_size: Option<Vec<usize>>,
    max_queue_delay_microseconds: Option<u64>,
    max_queue_size: Option<usize>,
    default_timeout_microseconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceEntry {
    name: String,
    #[serde(rename = "type")]
    kind: DeviceKind,
    #[serde(default = "one")]
    weight: u32,
    fallback: Option<String>,
    threads: Option<usize>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SchedulerEntry {
    policy: Option<Policy>,
    max_batch_size: Option<usize>,
    preferred_batch_size: Option<Vec<usize>>,
    max_queue_delay_microseconds: Option<u64>,
    max_queue_size: Option<usize>,
    default_timeout_microseconds: Option<u64>,
}

/// The batching fields of a model entry or of `scheduler:` (serde cannot flatten them into
/// both and still refuse unknown keys).
macro_rules! batching_entry {
    ($e:expr) => {
        BatchingEntry {
            max_batch_size: $e.max_batch_size,
            preferred_batch_size: $e.preferred_batch_size.clone(),
            max_queue_delay_microseconds: $e.max_queue_delay_microseconds,
            max_queue_size: $e.max_queue_size,
            default_timeout_microseconds: $e.default_timeout_microseconds,
        }
    };
}

/// Batching defaults when neither the command line nor `deploy.yml` says: up to 8 rows,
/// waiting at most 500 us for them (Triton's own default delay is 0; a small one lets
/// concurrent clients meet in a batch).
pub const DEFAULT_MAX_BATCH: usize = 8;
/// See [`DEFAULT_MAX_BATCH`].
pub const DEFAULT_DELAY_US: u64 = 500;

/// The command line's batching flags: defaults for every model.
#[derive(Debug, Clone, Default)]
pub struct BatchingFlags {
    /// `--max-batch-size`.
    pub max_batch_size: Option<usize>,
    /// `--max-queue-delay-us`.
    pub max_queue_delay_us: Option<u64>,
    /// `--max-queue-size`.
    pub max_queue_size: Option<usize>,
}

impl ServeConfig {
    /// The configuration for `--model NAME=PATH` flags: one cpu device, latency-aware.
    pub fn from_flags(models: &[String], flags: &BatchingFlags, threads: Option<usize>) -> Result<ServeConfig> {
        let mut out = Vec::new();
        for m in models {
            let Some((name, path)) = m.split_once('=') else {
                bail!("--model {m}: expected NAME=PATH, e.g. --model resnet50=resnet50.onnx")
            };
            check_name(name).with_context(|| format!("--model {m}"))?;
            if out.iter().any(|c: &ModelConfig| c.name == name) {
                bail!("--model {m}: the name '{name}' is given twice");
            }
            let entry = BatchingEntry {
                max_batch_size: flags.max_batch_size,
                max_queue_delay_microseconds: flags.max_queue_delay_us,
                max_queue_size: flags.max_queue_size,
                ..BatchingEntry::default()
            };
            let batching = batching(&BatchingEntry::default(), &entry).with_context(|| format!("--model {m}"))?;
            out.push(ModelConfig {
                name: name.to_string(),
                versions: vec![(1, PathBuf::from(path))],
                batching,
                weights: crate::WeightChoice::default(),
                memory_budget: None,
            });
        }
        if out.is_empty() {
            bail!("aim serve needs --model NAME=PATH (repeatable) or --config deploy.yml");
        }
        Ok(ServeConfig {
            models: out,
            devices: vec![host_device(threads)],
            policy: Policy::LatencyAware,
            custom_ops: Vec::new(),
        })
    }

    /// Reads and checks `deploy.yml`; relative model paths are taken from its directory.
    /// `threads` is the default for devices that set none.
    pub fn from_file(path: &Path, threads: Option<usize>) -> Result<ServeConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        ServeConfig::from_yaml(&text, base, threads).with_context(|| format!("{}", path.display()))
    }

    /// Parses `deploy.yml` text (see [`ServeConfig::from_file`]).
    pub fn from_yaml(text: &str, base: &Path, threads: Option<usize>) -> Result<ServeConfig> {
        let file: DeployFile = serde_yaml_ng::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        if file.models.is_empty() {
            bail!("models: no model listed");
        }
        let mut models: Vec<ModelConfig> = Vec::new();
        for (i, m) in file.models.iter().enumerate() {
            let at = format!("models[{i}] ({})", m.name);
            check_name(&m.name).with_context(|| at.clone())?;
            if models.iter().any(|c| c.name == m.name) {
                bail!("{at}: the name is listed twice");
            }
            let mut versions = match (&m.path, &m.versions) {
                (Some(p), None) => vec![(1, base.join(p))],
                (None, Some(v)) if !v.is_empty() => v.iter().map(|v| (v.version, base.join(&v.path))).collect(),
                (None, Some(_)) => bail!("{at}.versions: empty"),
                (Some(_), Some(_)) => bail!("{at}: give either path or versions, not both"),
                (None, None) => bail!("{at}: missing path (or versions)"),
            };
            versions.sort_by_key(|v| v.0);
            if let Some(w) = versions.windows(2).find(|w| w[0].0 == w[1].0) {
                bail!("{at}.versions: version {} is listed twice", w[0].0);
            }
            let batching =
                batching(&batching_entry!(file.scheduler), &batching_entry!(m)).with_context(|| at.clone())?;
            let w = m.weights.as_deref().unwrap_or("f32");
            let weights = crate::parse_weights(w).map_err(|e| anyhow::anyhow!("{at}.weights: '{w}': {e}"))?;
            let memory_budget =
                match &m.memory_budget {
                    None => None,
                    Some(b) => Some(aim_ir::limits::parse_bytes(b).filter(|&n| n > 0).ok_or_else(|| {
                        anyhow::anyhow!("{at}.memory_budget: '{b}' is not a size such as 500M or 2G")
                    })?),
                };
            models.push(ModelConfig { name: m.name.clone(), versions, batching, weights, memory_budget });
        }
        let devices = resolve_devices(&file.devices, threads)?;
        Ok(ServeConfig {
            models,
            devices,
            policy: file.scheduler.policy.unwrap_or(Policy::LatencyAware),
            custom_ops: file.custom_ops.iter().map(|p| base.join(p)).collect(),
        })
    }

    /// The devices that run models here (those whose traffic is their own).
    pub fn serving_devices(&self) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter(|d| d.unavailable.is_none())
    }

    /// Each serving device's share of the traffic: its weight plus the weights of the
    /// devices that fall back to it.
    pub fn traffic_weight(&self, serving: &str) -> u32 {
        self.devices.iter().filter(|d| d.serves_on == serving).map(|d| d.weight).sum()
    }
}

/// A model or device name: what fits in a URL path segment unescaped.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        bail!("name '{name}': expected letters, digits, '_', '.' or '-'");
    }
    Ok(())
}

/// A model's batching: its own fields over the scheduler's defaults over aim's.
fn batching(defaults: &BatchingEntry, own: &BatchingEntry) -> Result<Batching> {
    let explicit = own.max_batch_size.is_some();
    let max_batch_size = own.max_batch_size.or(defaults.max_batch_size).unwrap_or(DEFAULT_MAX_BATCH);
    let preferred = own.preferred_batch_size.clone().or(defaults.preferred_batch_size.clone()).unwrap_or_default();
    if let Some(p) = preferred.iter().find(|&&p| p == 0 || p > max_batch_size.max(1)) {
        bail!("preferred_batch_size: {p} is not between 1 and max_batch_size ({max_batch_size})");
    }
    let delay = own.max_queue_delay_microseconds.or(defaults.max_queue_delay_microseconds).unwrap_or(DEFAULT_DELAY_US);
    if delay > 10_000_000 {
        bail!("max_queue_delay_microseconds: {delay} is over 10 s");
    }
    let timeout = own.default_timeout_microseconds.or(defaults.default_timeout_microseconds).filter(|&t| t > 0);
    Ok(Batching {
        max_batch_size,
        preferred_batch_size: preferred,
        max_queue_delay: Duration::from_micros(delay),
        max_queue_size: own.max_queue_size.or(defaults.max_queue_size).unwrap_or(0),
        default_timeout: timeout.map(Duration::from_micros),
        explicit,
    })
}

/// The device aim serves on when none is listed: this host's CPU.
fn host_device(threads: Option<usize>) -> Device {
    let kind = if cfg!(target_arch = "aarch64") { DeviceKind::Arm64 } else { DeviceKind::X86 };
    Device { name: "cpu".into(), kind, weight: 1, threads, serves_on: "cpu".into(), unavailable: None }
}

/// Why a device of this kind cannot serve on this host, if it cannot.
fn unavailable(kind: DeviceKind) -> Option<String> {
    match kind {
        DeviceKind::X86 if cfg!(target_arch = "x86_64") => None,
        DeviceKind::Arm64 if cfg!(target_arch = "aarch64") => None,
        DeviceKind::X86 | DeviceKind::Arm64 => Some(format!("this host is {}", std::env::consts::ARCH)),
        // Opening the GPU loads the driver and creates a context: probed once per process.
        DeviceKind::Cuda => {
            static PROBE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
            PROBE.get_or_init(|| crate::gpu::device().err()).clone()
        }
    }
}

/// Checks the devices and follows each fallback chain to a device that serves here.
fn resolve_devices(entries: &[DeviceEntry], threads: Option<usize>) -> Result<Vec<Device>> {
    if entries.is_empty() {
        return Ok(vec![host_device(threads)]);
    }
    for (i, d) in entries.iter().enumerate() {
        check_name(&d.name).with_context(|| format!("devices[{i}]"))?;
        if entries[..i].iter().any(|e| e.name == d.name) {
            bail!("devices[{i}]: the name '{}' is listed twice", d.name);
        }
        if d.weight == 0 {
            bail!("devices[{i}] ({}).weight: must be at least 1", d.name);
        }
        if d.threads == Some(0) || d.threads.is_some_and(|t| t > crate::MAX_THREADS) {
            bail!("devices[{i}] ({}).threads: must be between 1 and {}", d.name, crate::MAX_THREADS);
        }
        if let Some(f) = &d.fallback {
            if !entries.iter().any(|e| &e.name == f) {
                bail!("devices[{i}] ({}).fallback: no device is named '{f}'", d.name);
            }
        }
    }
    let mut out = Vec::new();
    for d in entries {
        let why = unavailable(d.kind);
        let mut at = d;
        let mut seen = vec![d.name.as_str()];
        while unavailable(at.kind).is_some() {
            let Some(f) = &at.fallback else {
                bail!(
                    "devices: '{}' cannot serve here ({}) and {} no fallback",
                    at.name,
                    unavailable(at.kind).unwrap_or_default(),
                    if at.name == d.name {
                        "has".to_string()
                    } else {
                        format!("its fallback chain from '{}' has", d.name)
                    }
                );
            };
            if seen.contains(&f.as_str()) {
                bail!("devices: the fallbacks of '{}' go round in a circle ({} -> {f})", d.name, seen.join(" -> "));
            }
            seen.push(f);
            at = entries.iter().find(|e| &e.name == f).expect("checked above");
        }
        out.push(Device {
            name: d.name.clone(),
            kind: d.kind,
            weight: d.weight,
            threads: at.threads.or(threads),
            serves_on: at.name.clone(),
            unavailable: why,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeConfig> {
        ServeConfig::from_yaml(text, Path::new("/m"), None)
    }

    #[test]
    fn a_full_deploy_file_resolves() {
        let c = parse(
            "models:\n  - name: r\n    versions:\n      - {version: 2, path: r2.onnx}\n      - {version: 1, path: r1.onnx}\n    max_batch_size: 4\n  - name: m\n    path: m.onnx\ndevices:\n  - {name: gpu0, type: cuda, weight: 3, fallback: cpu0}\n  - {name: cpu0, type: x86, threads: 2}\n  - {name: arm, type: arm64, fallback: cpu0}\nscheduler:\n  policy: round-robin\n  max_batch_size: 16\n  max_queue_delay_microseconds: 100\n",
        )
        .unwrap();
        assert_eq!(c.policy, Policy::RoundRobin);
        assert!(c.custom_ops.is_empty());
        assert_eq!(c.models[0].weights, crate::WeightChoice::default());
        let int4 = parse("models:\n  - {name: a, path: a.onnx, weights: 'int4:64'}\n").unwrap();
        assert_eq!(int4.models[0].weights, crate::WeightChoice { int4: Some(64), ..Default::default() });
        let int8 = parse("models:\n  - {name: a, path: a.onnx, weights: int8}\n").unwrap();
        assert!(int8.models[0].weights.int8);
        assert_eq!(c.models[0].memory_budget, None);
        let budget = parse("models:\n  - {name: a, path: a.onnx, memory_budget: 300M}\n").unwrap();
        assert_eq!(budget.models[0].memory_budget, Some(300 << 20));
        let e = parse("models:\n  - {name: a, path: a.onnx, memory_budget: lots}\n").unwrap_err();
        assert!(format!("{e:#}").contains("memory_budget: 'lots' is not a size"), "{e:#}");
        let with_ops = parse("models:\n  - {name: a, path: a.onnx}\ncustom_ops: [lib/libops.so]\n").unwrap();
        assert_eq!(with_ops.custom_ops, vec![PathBuf::from("/m/lib/libops.so")]);
        assert_eq!(c.models[0].versions, vec![(1, PathBuf::from("/m/r1.onnx")), (2, PathBuf::from("/m/r2.onnx"))]);
        assert_eq!(c.models[0].batching.max_batch_size, 4);
        assert!(c.models[0].batching.explicit);
        assert_eq!(c.models[1].batching.max_batch_size, 16);
        assert!(!c.models[1].batching.explicit);
        assert_eq!(c.models[1].batching.max_queue_delay, Duration::from_micros(100));
        // On a host with an NVIDIA GPU the cuda device serves itself.
        if cfg!(target_arch = "x86_64") && c.devices[0].unavailable.is_some() {
            let gpu = &c.devices[0];
            assert_eq!(gpu.serves_on, "cpu0");
            assert_eq!(gpu.threads, Some(2));
            let why = gpu.unavailable.as_deref().unwrap();
            assert!(why.contains("NVIDIA") || why.contains("GPU") || why.contains("cuda backend"), "{why}");
            assert_eq!(c.serving_devices().count(), 1);
            assert_eq!(c.traffic_weight("cpu0"), 5);
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = |t: &str| format!("{:#}", parse(t).unwrap_err());
        assert!(err("models:\n  - name: a\n    path: a.onnx\n    max_batch: 3\n").contains("max_batch"));
        assert!(err("models: []\nschedular: {}\n").contains("schedular"));
        assert!(err("models:\n  - {name: a, path: a.onnx}\ndevices:\n  - {name: t, type: tpu}\n").contains("tpu"));
        assert!(err("models:\n  - {name: a, path: a.onnx}\nscheduler: {policy: fastest}\n").contains("fastest"));
        assert!(
            err("models:\n  - {name: a, path: a.onnx}\ndevices:\n  - {name: g, type: cuda}\n").contains("no fallback")
        );
        assert!(err("models:\n  - {name: a, path: a.onnx}\ndevices:\n  - {name: g, type: cuda, fallback: h}\n")
            .contains("no device is named 'h'"));
        assert!(err(
            "models:\n  - {name: a, path: a.onnx}\ndevices:\n  - {name: g, type: cuda, fallback: h}\n  - {name: h, type: cuda, fallback: g}\n"
        )
        .contains("circle"));
        assert!(
            err("models:\n  - {name: a, path: a.onnx, preferred_batch_size: [9]}\n").contains("preferred_batch_size")
        );
        assert!(err("models:\n  - {name: 'a/b', path: a.onnx}\n").contains("a/b"));
        assert!(err("models:\n  - {name: a}\n").contains("missing path"));
        assert!(err("models:\n  - {name: a, path: a.onnx, weights: int3}\n").contains("int3"));
        assert!(err("models:\n  - {name: a, path: a.onnx}\n  - {name: a, path: b.onnx}\n").contains("twice"));
        assert!(err("models:\n  - {name: a, path: a.onnx}\ndevices:\n  - {name: c, type: x86, weight: 0}\n")
            .contains("weight"));
    }

    #[test]
    fn model_flags_need_a_name_and_a_path() {
        let f = BatchingFlags::default();
        let c = ServeConfig::from_flags(&["a=x.onnx".into()], &f, Some(2)).unwrap();
        assert_eq!(c.models[0].batching.max_batch_size, DEFAULT_MAX_BATCH);
        assert_eq!(c.devices[0].threads, Some(2));
        assert!(ServeConfig::from_flags(&["x.onnx".into()], &f, None).is_err());
        assert!(ServeConfig::from_flags(&[], &f, None).is_err());
        let off = BatchingFlags { max_batch_size: Some(0), ..f };
        assert_eq!(
            ServeConfig::from_flags(&["a=x.onnx".into()], &off, None).unwrap().models[0].batching.max_batch_size,
            0
        );
    }
}
