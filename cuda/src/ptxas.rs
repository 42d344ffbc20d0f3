//! Checking generated PTX with NVIDIA's assembler, `ptxas`, without a GPU: it compiles a
//! module for an architecture and reports each kernel's registers and spills (`-v`). The
//! tests run every generated kernel through it for sm_80 and sm_90; ptxas comes from the
//! `nvidia-cuda-nvcc-cu12` PyPI package (no CUDA toolkit needed).

use std::path::{Path, PathBuf};
use std::process::Command;

/// ptxas: `$PTXAS`, else on `PATH`, else inside the `nvidia-cuda-nvcc-cu12` Python package.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Some(p.into());
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some("ptxas".into());
    }
    let py = Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], 'bin', 'ptxas'))",
        ])
        .output()
        .ok()?;
    let p = String::from_utf8(py.stdout).ok()?.trim().to_string();
    (py.status.success() && std::path::Path::new(&p).exists()).then(|| p.into())
}

/// What ptxas said of a module.
#[derive(Clone, Debug)]
pub struct Report {
    /// Its `-v` log.
    pub log: String,
    /// Kernels whose report line shows spill stores or loads.
    pub spills: Vec<String>,
    /// Kernels reported.
    pub kernels: usize,
}

/// Assembles `module` for `sm_<sm>` with `ptxas` (a file under `dir`); an error carries
/// ptxas's log.
pub fn check(ptxas: &Path, module: &str, sm: u32, dir: &Path) -> Result<Report, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let src = dir.join(format!("module_sm{sm}.ptx"));
    std::fs::write(&src, module).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas)
        .args(["-v", &format!("-arch=sm_{sm}"), "-o"])
        .arg(dir.join(format!("module_sm{sm}.cubin")))
        .arg(&src)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("ptxas sm_{sm} failed:\n{log}"));
    }
    // "ptxas info    : Compiling entry function 'NAME' for 'sm_80'" is followed by its
    // "... bytes stack frame, N bytes spill stores, M bytes spill loads".
    let (mut current, mut spills, mut kernels) = (String::new(), Vec::new(), 0);
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().unwrap_or("").to_string();
            kernels += 1;
        } else if line.contains("spill") && !line.contains("0 bytes spill stores, 0 bytes spill loads") {
            spills.push(current.clone());
        }
    }
    Ok(Report { log, spills, kernels })
}

/// Kernels per module in [`check_kernels`]: ptxas takes much longer per kernel on a module
/// of thousands than on a few small ones, and the modules can then run side by side.
const KERNELS_PER_MODULE: usize = 64;

/// Assembles `kernels` (each a `.entry` text, names distinct) for every architecture in
/// `sms`, as modules of at most [`KERNELS_PER_MODULE`] kernels (and at least one module per
/// core) run by as many ptxas processes at a time as the machine has cores (files under
/// `dir`). Returns one report per architecture, the modules' logs joined, or the first
/// error, with ptxas's log.
pub fn check_kernels(ptxas: &Path, kernels: &[String], sms: &[u32], dir: &Path) -> Result<Vec<Report>, String> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Enough modules for every core, of at most KERNELS_PER_MODULE kernels.
    let per = (kernels.len() * sms.len()).div_ceil(cores).clamp(1, KERNELS_PER_MODULE);
    let jobs: Vec<(usize, usize, &[String])> =
        (0..sms.len()).flat_map(|a| kernels.chunks(per).enumerate().map(move |(c, ks)| (a, c, ks))).collect();
    let workers = cores.min(jobs.len()).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(a, c, ks)) = jobs.get(j) else { break };
                let sm = sms[a];
                let texts: Vec<&str> = ks.iter().map(String::as_str).collect();
                let module = aim_runtime::cuda::module(sm, &texts);
                let r = check(ptxas, &module, sm, &dir.join(format!("part{c}")));
                results.lock().unwrap_or_else(|e| e.into_inner()).push((a, c, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|&(a, c, _)| (a, c));
    let mut reports: Vec<Report> =
        sms.iter().map(|_| Report { log: String::new(), spills: Vec::new(), kernels: 0 }).collect();
    for (a, _, r) in results {
        let r = r?;
        let into = &mut reports[a];
        into.log.push_str(&r.log);
        into.spills.extend(r.spills);
        into.kernels += r.kernels;
    }
    Ok(reports)
}
