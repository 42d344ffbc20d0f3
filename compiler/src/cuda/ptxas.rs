//! Checking generated PTX with NVIDIA's assembler, `ptxas`, without a GPU: it compiles a
//! module for an architecture and reports each kernel's registers and spills (`-v`). The
//! tests run every generated kernel through it for sm_80 and sm_90; ptxas comes from the
//! `nvidia-cuda-nvcc-cu12` PyPI package (no CUDA toolkit needed).

use std::path::PathBuf;
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
pub fn check(ptxas: &std::path::Path, module: &str, sm: u32, dir: &std::path::Path) -> Result<Report, String> {
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
