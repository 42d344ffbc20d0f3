//! The target description: what the CPU aim runs on can do, read once at load time with
//! CPUID (raw-cpuid) and the OS, and capped on request (`--cpu x86-64-v3`) so that the lower
//! code paths can be tested on a bigger machine. Every later pass reads this one value:
//! vector width, register count, cache sizes and core count come from here, not constants.

use aim_kernels::gemm::IsaKind;

use std::fmt;

/// Instruction-set features aim's code generation and microkernels care about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub sse41: bool,
    pub sse42: bool,
    pub avx: bool,
    pub avx2: bool,
    pub fma: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512dq: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
    pub avx512bf16: bool,
    pub neon: bool,
    /// AArch64 FEAT_DotProd (`sdot`): what the integer kernels need on NEON.
    pub dotprod: bool,
}

impl Features {
    /// The features every CPU of `level` has (x86-64's psABI levels; NEON on AArch64):
    /// what a target for a level names when it is not this machine's CPU.
    pub fn guaranteed_by(level: Level) -> Features {
        let v2 = level >= Level::X86V2 && level != Level::Neon;
        let v3 = level >= Level::X86V3 && level != Level::Neon;
        let v4 = level == Level::X86V4;
        Features {
            sse41: v2,
            sse42: v2,
            avx: v3,
            avx2: v3,
            fma: v3,
            avx512f: v4,
            avx512bw: v4,
            avx512dq: v4,
            avx512vl: v4,
            neon: level == Level::Neon,
            ..Features::default()
        }
    }
}

/// The ISA tiers aim has kernels for, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// No SIMD aim relies on: portable code only.
    Baseline,
    /// x86-64-v2: SSE4.1/4.2 (Cranelift's 128-bit vectors).
    X86V2,
    /// x86-64-v3: AVX2 and FMA, 256-bit vectors.
    X86V3,
    /// x86-64-v4: AVX-512 F/BW/DQ/VL, 512-bit vectors.
    X86V4,
    /// AArch64 with NEON, 128-bit vectors.
    Neon,
}

impl Level {
    /// Every level, lowest first within each architecture.
    pub const ALL: [Level; 5] = [Level::Baseline, Level::X86V2, Level::X86V3, Level::X86V4, Level::Neon];

    /// The level [`Level::name`] names (how `.aim` files record it).
    pub fn named(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The name `--cpu` takes for this level.
    pub fn name(self) -> &'static str {
        match self {
            Level::Baseline => "baseline",
            Level::X86V2 => "x86-64-v2",
            Level::X86V3 => "x86-64-v3",
            Level::X86V4 => "x86-64-v4",
            Level::Neon => "aarch64-neon",
        }
    }

    /// Bytes in one vector register of this level.
    pub fn vector_bytes(self) -> usize {
        match self {
            Level::X86V4 => 64,
            Level::X86V3 => 32,
            Level::X86V2 | Level::Neon => 16,
            Level::Baseline => 4,
        }
    }

    /// Architectural vector registers of this level (16 on SSE/AVX2, 32 on AVX-512 and NEON).
    pub fn vector_registers(self) -> usize {
        match self {
            Level::X86V4 | Level::Neon => 32,
            _ => 16,
        }
    }
}

/// Why a `--cpu` value was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("unknown --cpu '{0}' (expected native, x86-64-v4, x86-64-v3, x86-64-v2 or baseline)")]
pub struct UnknownCpu(pub String);

/// The machine aim compiles for.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// `x86_64`, `aarch64`, ...
    pub arch: &'static str,
    /// CPU vendor (`GenuineIntel`, `AuthenticAMD`), or empty when unknown.
    pub vendor: String,
    /// CPU brand string, or empty when unknown.
    pub brand: String,
    /// Usable features (detected by CPUID and enabled by the OS, then capped).
    pub features: Features,
    /// The ISA tier the features add up to.
    pub level: Level,
    /// L1 data cache per core, bytes.
    pub l1d: usize,
    /// L2 cache per core, bytes.
    pub l2: usize,
    /// L3 cache, bytes (0 when there is none).
    pub l3: usize,
    /// Physical cores (the default thread count).
    pub physical_cores: usize,
    /// Logical processors.
    pub logical_cores: usize,
    /// What capped the level, if anything (`--cpu x86-64-v3`).
    pub capped_to: Option<Level>,
    /// Whether dense layers keep their weights as f16 (`--weights f16`): a choice of the
    /// user's that travels with the target the program is compiled for, like `capped_to`.
    pub half_weights: bool,
    /// Which passes run (`-O` level, `--disable-pass`): the user's choice too.
    pub optimization: crate::passes::Optimization,
    /// Whether dense layers' f32 weights are quantized to 4 bits in blocks of this many
    /// rows (`--weights int4`): the user's choice too.
    pub int4_weights: Option<usize>,
    /// Whether dense layers' f32 weights are quantized to 8 bits per column (`--weights
    /// int8`): the user's choice too.
    pub int8_weights: bool,
    /// The peak resident memory (bytes) the program must fit in at run time, where the
    /// user set one (`--memory-budget`): the facade plans which weights read from the
    /// model file are handed back between uses (`aim::budget`). It changes no arithmetic.
    pub memory_budget: Option<usize>,
    /// Whether the CPU runs a 512-bit multiply-add as two 256-bit halves (AMD Zen 4), so
    /// that AVX-512 does no more arithmetic per cycle than AVX2: what the blocked layout
    /// weighs against the padding a 16-channel block adds (`passes::layout::Blocks`).
    pub split_512: bool,
}

fn level_of(f: &Features, arch: &str) -> Level {
    if arch == "aarch64" && f.neon {
        Level::Neon
    } else if f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx2 && f.fma {
        Level::X86V4
    } else if f.avx2 && f.fma && f.avx {
        Level::X86V3
    } else if f.sse41 && f.sse42 {
        Level::X86V2
    } else {
        Level::Baseline
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_x86(t: &mut Target) {
    use raw_cpuid::{CacheType, CpuId};
    let id = CpuId::new();
    t.vendor = id.get_vendor_info().map(|v| v.as_str().to_string()).unwrap_or_default();
    t.brand = id.get_processor_brand_string().map(|b| b.as_str().trim().to_string()).unwrap_or_default();
    let f = &mut t.features;
    if let Some(fi) = id.get_feature_info() {
        // AMD's family 19h (Zen 3 and Zen 4; only Zen 4 has AVX-512) splits 512-bit
        // operations in two; family 1Ah (Zen 5) has a 512-bit datapath in its desktop and
        // server parts. Intel's AVX-512 cores are taken at full width.
        t.split_512 = t.vendor == "AuthenticAMD" && fi.family_id() == 0x19;
        f.sse41 = fi.has_sse41();
        f.sse42 = fi.has_sse42();
        f.avx = fi.has_avx();
        f.fma = fi.has_fma();
    }
    if let Some(e) = id.get_extended_feature_info() {
        f.avx2 = e.has_avx2();
        f.avx512f = e.has_avx512f();
        f.avx512bw = e.has_avx512bw();
        f.avx512dq = e.has_avx512dq();
        f.avx512vl = e.has_avx512vl();
        f.avx512vnni = e.has_avx512vnni();
        f.avx512bf16 = e.has_avx512_bf16();
    }
    // CPUID says what the core has; the OS must also save the wider registers (XCR0).
    f.avx &= std::arch::is_x86_feature_detected!("avx");
    f.avx2 &= std::arch::is_x86_feature_detected!("avx2");
    f.fma &= std::arch::is_x86_feature_detected!("fma");
    let os512 = std::arch::is_x86_feature_detected!("avx512f");
    for b in [&mut f.avx512f, &mut f.avx512bw, &mut f.avx512dq, &mut f.avx512vl, &mut f.avx512vnni, &mut f.avx512bf16] {
        *b &= os512;
    }
    if let Some(caches) = id.get_cache_parameters() {
        for c in caches {
            let size = c.associativity() * c.physical_line_partitions() * c.coherency_line_size() * c.sets();
            match (c.level(), c.cache_type()) {
                (1, CacheType::Data) | (1, CacheType::Unified) => t.l1d = size,
                (2, _) => t.l2 = size,
                (3, _) => t.l3 = size,
                _ => {}
            }
        }
    }
    if t.l1d == 0 {
        if let Some(l1) = id.get_l1_cache_and_tlb_info() {
            t.l1d = l1.dcache_size() as usize * 1024;
        }
    }
    if t.l2 == 0 || t.l3 == 0 {
        if let Some(l) = id.get_l2_l3_cache_and_tlb_info() {
            if t.l2 == 0 {
                t.l2 = l.l2cache_size() as usize * 1024;
            }
            if t.l3 == 0 {
                t.l3 = l.l3cache_size() as usize * 512 * 1024;
            }
        }
    }
}

impl Target {
    /// Detects the host.
    pub fn host() -> Target {
        let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let mut t = Target {
            arch: std::env::consts::ARCH,
            vendor: String::new(),
            brand: String::new(),
            features: Features::default(),
            level: Level::Baseline,
            l1d: 0,
            l2: 0,
            l3: 0,
            physical_cores: aim_runtime::pool::physical_cores(logical),
            logical_cores: logical,
            capped_to: None,
            half_weights: false,
            optimization: Default::default(),
            int4_weights: None,
            int8_weights: false,
            memory_budget: None,
            split_512: false,
        };
        #[cfg(target_arch = "x86_64")]
        detect_x86(&mut t);
        #[cfg(target_arch = "aarch64")]
        {
            t.features.neon = std::arch::is_aarch64_feature_detected!("neon");
            t.features.dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
        }
        // Sizes CPUID did not report: the common values, so tiling still has numbers.
        if t.l1d == 0 {
            t.l1d = 32 * 1024;
        }
        if t.l2 == 0 {
            t.l2 = 256 * 1024;
        }
        t.level = level_of(&t.features, t.arch);
        t
    }

    /// The host capped by a `--cpu` value (`native` leaves it as is). Capping never adds
    /// features the host lacks.
    pub fn with_cpu(mut self, cpu: &str) -> Result<Target, UnknownCpu> {
        let cap = match cpu {
            "native" | "" => return Ok(self),
            // NEON is every AArch64 CPU's level: naming it caps nothing.
            "aarch64-neon" | "neon" if self.arch == "aarch64" => return Ok(self),
            "x86-64-v4" => Level::X86V4,
            "x86-64-v3" => Level::X86V3,
            "x86-64-v2" => Level::X86V2,
            "baseline" | "x86-64" => Level::Baseline,
            other => return Err(UnknownCpu(other.to_string())),
        };
        let f = &mut self.features;
        if cap < Level::X86V4 {
            self.split_512 = false;
            f.avx512f = false;
            f.avx512bw = false;
            f.avx512dq = false;
            f.avx512vl = false;
            f.avx512vnni = false;
            f.avx512bf16 = false;
        }
        if cap < Level::X86V3 {
            f.avx = false;
            f.avx2 = false;
            f.fma = false;
        }
        if cap < Level::X86V2 {
            f.sse41 = false;
            f.sse42 = false;
            f.neon = false;
            f.dotprod = false;
        }
        self.level = level_of(&self.features, self.arch);
        self.capped_to = Some(cap);
        Ok(self)
    }

    /// The machine code compiled ahead of time runs on: architecture `arch` (`x86_64`,
    /// `aarch64`) at ISA level `cpu` (`native` or empty: the host's level when `arch` is the
    /// host's, else `x86-64-v3` or `aarch64-neon`). Where `arch` is the host's, the host's
    /// caches and, when it has them, features; otherwise the level's features and common
    /// cache sizes (32 KiB L1d, 1 MiB L2).
    pub fn for_arch(arch: &str, cpu: &str) -> Result<Target, UnknownCpu> {
        let host = Target::host();
        let native = matches!(cpu, "native" | "");
        let level = match (arch, cpu) {
            ("x86_64", "native" | "") if host.arch == "x86_64" => return Ok(host),
            ("x86_64", "native" | "") => Level::X86V3,
            ("x86_64", "x86-64-v4") => Level::X86V4,
            ("x86_64", "x86-64-v3") => Level::X86V3,
            ("x86_64", "x86-64-v2") => Level::X86V2,
            ("x86_64", "baseline" | "x86-64") => Level::Baseline,
            ("aarch64", "native" | "" | "aarch64-neon" | "neon") => Level::Neon,
            ("aarch64", "baseline") => Level::Baseline,
            (_, other) => return Err(UnknownCpu(if native { arch.to_string() } else { other.to_string() })),
        };
        if host.arch == arch {
            let capped = host.clone().with_cpu(level.name())?;
            if capped.level == level || arch == "aarch64" {
                return Ok(capped);
            }
        }
        let features = Features::guaranteed_by(level);
        let same = host.arch == arch;
        Ok(Target {
            arch: if arch == "aarch64" { "aarch64" } else { "x86_64" },
            vendor: String::new(),
            brand: String::new(),
            features,
            level,
            l1d: if same { host.l1d } else { 32 << 10 },
            l2: if same { host.l2 } else { 1 << 20 },
            l3: if same { host.l3 } else { 0 },
            physical_cores: 1,
            logical_cores: 1,
            capped_to: Some(level),
            half_weights: false,
            optimization: Default::default(),
            int4_weights: None,
            int8_weights: false,
            memory_budget: None,
            split_512: false,
        })
    }

    /// The host, capped by the `AIM_CPU` environment variable when it is set.
    pub fn from_env() -> Result<Target, UnknownCpu> {
        let t = Target::host();
        match std::env::var("AIM_CPU") {
            Ok(cpu) => t.with_cpu(&cpu),
            Err(_) => Ok(t),
        }
    }
}

impl Target {
    /// The GEMM microkernel family for this target.
    pub fn gemm_isa(&self) -> aim_kernels::gemm::Isa {
        use aim_kernels::gemm::Isa;
        // The level is the host's, possibly capped; `Isa::new` checks the CPU once more.
        let kind = match self.level {
            Level::X86V4 => IsaKind::Avx512,
            Level::X86V3 => IsaKind::Avx2,
            Level::Neon => IsaKind::Neon,
            _ => IsaKind::Portable,
        };
        Isa::new(kind)
            .or_else(|| Isa::new(IsaKind::Avx2).filter(|_| self.level == Level::X86V4))
            .unwrap_or(Isa::PORTABLE)
    }

    /// The microkernel family code for this target uses, whether or not this machine has it
    /// (what decides layouts such as the blocked convolutions' channel block).
    pub fn isa_kind(&self) -> IsaKind {
        match self.level {
            Level::X86V4 => IsaKind::Avx512,
            Level::X86V3 => IsaKind::Avx2,
            Level::Neon => IsaKind::Neon,
            _ => IsaKind::Portable,
        }
    }

    /// Whether this machine can run code compiled for this target (what packing the weights
    /// ahead of time needs).
    pub fn runs_here(&self) -> bool {
        self.arch == std::env::consts::ARCH
            && aim_kernels::gemm::Isa::new(self.isa_kind()).is_some()
            && aim_runtime::embedded::host_supports(self.level.name())
    }

    /// This target with other cache sizes (bytes): to plan for another machine, or to make
    /// schedules that read the same on every machine (`aim explore --caches`).
    pub fn with_caches(mut self, l1d: usize, l2: usize, l3: usize) -> Target {
        self.l1d = l1d;
        self.l2 = l2;
        self.l3 = l3;
        self
    }

    /// GEMM cache blocking from this target's L1 and L2 sizes.
    pub fn gemm_blocking(&self) -> aim_kernels::gemm::Blocking {
        aim_kernels::gemm::Blocking::for_caches(self.gemm_isa(), self.l1d, self.l2)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kib = |b: usize| if b >= 1 << 20 { format!("{} MiB", b >> 20) } else { format!("{} KiB", b >> 10) };
        writeln!(f, "arch: {}", self.arch)?;
        if !self.vendor.is_empty() {
            writeln!(f, "cpu: {} ({})", self.brand, self.vendor)?;
        }
        let x = &self.features;
        let names = [
            ("sse4.1", x.sse41),
            ("sse4.2", x.sse42),
            ("avx", x.avx),
            ("avx2", x.avx2),
            ("fma", x.fma),
            ("avx512f", x.avx512f),
            ("avx512bw", x.avx512bw),
            ("avx512dq", x.avx512dq),
            ("avx512vl", x.avx512vl),
            ("avx512vnni", x.avx512vnni),
            ("avx512bf16", x.avx512bf16),
            ("neon", x.neon),
            ("dotprod", x.dotprod),
        ];
        let on: Vec<&str> = names.iter().filter(|(_, b)| *b).map(|(n, _)| *n).collect();
        writeln!(f, "features: {}", if on.is_empty() { "none".to_string() } else { on.join(" ") })?;
        write!(
            f,
            "level: {} ({}-byte vectors, {} vector registers)",
            self.level.name(),
            self.level.vector_bytes(),
            self.level.vector_registers()
        )?;
        if let Some(c) = self.capped_to {
            write!(f, ", capped by --cpu {}", c.name())?;
        }
        if self.split_512 && self.level == Level::X86V4 {
            write!(f, "; 512-bit operations run as two 256-bit halves")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "caches: L1d {}, L2 {}, L3 {}",
            kib(self.l1d),
            kib(self.l2),
            if self.l3 == 0 { "none".into() } else { kib(self.l3) }
        )?;
        write!(f, "cores: {} physical, {} logical", self.physical_cores, self.logical_cores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capping_only_removes_features() {
        let host = Target::host();
        for cpu in ["x86-64-v4", "x86-64-v3", "x86-64-v2", "baseline"] {
            let t = host.clone().with_cpu(cpu).unwrap();
            assert!(t.level <= host.level.max(Level::Baseline) || host.arch != "x86_64");
            let cap = match cpu {
                "x86-64-v4" => Level::X86V4,
                "x86-64-v3" => Level::X86V3,
                "x86-64-v2" => Level::X86V2,
                _ => Level::Baseline,
            };
            if host.arch == "x86_64" {
                assert!(t.level <= cap, "{cpu}: {:?}", t.level);
            }
        }
        assert!(host.clone().with_cpu("pentium").is_err());
        assert_eq!(host.clone().with_cpu("native").unwrap(), host);
    }

    #[test]
    fn host_has_sane_numbers() {
        let t = Target::host();
        assert!(t.l1d >= 4096 && t.l2 >= t.l1d, "{t}");
        assert!(t.physical_cores >= 1 && t.physical_cores <= t.logical_cores, "{t}");
    }
}
