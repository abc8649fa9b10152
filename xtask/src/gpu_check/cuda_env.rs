//! Finding NVIDIA GPUs and CUDA's run-time libraries without loading them (so a machine
//! without them gets a clear message, not a panic inside the CUDA backend).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The NVIDIA GPUs this machine shows: `nvidia-smi -L` lines, else the driver's
/// `/proc/driver/nvidia/gpus` entries. Empty when there is none (or no driver).
pub fn gpus() -> Vec<String> {
    if let Ok(out) = Command::new("nvidia-smi").arg("-L").output()
        && out.status.success()
    {
        let listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("GPU "))
            .map(str::to_string)
            .collect();
        if !listed.is_empty() {
            return listed;
        }
    }
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| format!("GPU at PCI {}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default()
}

/// The first GPU's name and the driver version (`nvidia-smi`), when it can tell.
pub fn device_and_driver() -> (Option<String>, Option<String>) {
    let query = Command::new("nvidia-smi")
        .args(["--query-gpu=name,driver_version", "--format=csv,noheader"])
        .output();
    match query {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let first = text.lines().next().unwrap_or("");
            let mut parts = first.split(',').map(|p| p.trim().to_string());
            (parts.next(), parts.next())
        }
        _ => (None, None),
    }
}

/// The CUDA toolkit to use: `CUDA_PATH`, else `/usr/local/cuda` (what Burn's cuda backend
/// looks at by default), else the highest `/usr/local/cuda-<version>`; one with CUDA's
/// headers. Libraries and headers are both taken from it, so their versions match.
pub fn toolkit() -> Option<PathBuf> {
    let has_headers = |p: &Path| p.join("include").join("cuda.h").exists();
    if let Some(path) = std::env::var_os("CUDA_PATH").map(PathBuf::from) {
        return has_headers(&path).then_some(path);
    }
    let default = PathBuf::from(DEFAULT_TOOLKIT);
    if has_headers(&default) {
        return Some(default);
    }
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/local")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let version = name.strip_prefix("cuda-")?;
                    let numbers: Option<Vec<u32>> =
                        version.split('.').map(|n| n.parse().ok()).collect();
                    Some((numbers?, e.path()))
                })
                .filter(|(_, p)| has_headers(p))
                .collect()
        })
        .unwrap_or_default();
    versioned.sort();
    versioned.pop().map(|(_, path)| path)
}

/// Where Burn's cuda backend looks for CUDA when `CUDA_PATH` is unset.
const DEFAULT_TOOLKIT: &str = "/usr/local/cuda";

/// Directories the dynamic loader searches here (`LD_LIBRARY_PATH`, then the usual ones).
fn library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(dir));
    }
    dirs
}

/// Whether a file whose name starts with `prefix` is in `dir`.
fn holds(dir: &Path, prefix: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
    })
}

/// What the CUDA backend loads at run time and where it is, or what is missing.
pub struct CudaLibraries {
    /// A toolkit root to set as `CUDA_PATH` (the backend compiles kernels with its headers);
    /// `None` when `CUDA_PATH` is set already or the toolkit is Burn's default.
    pub cuda_path: Option<PathBuf>,
    /// Directories to add to `LD_LIBRARY_PATH` so the loader finds libcuda and libnvrtc.
    pub add_to_library_path: Vec<PathBuf>,
    /// What could not be found, each with a hint.
    pub missing: Vec<String>,
}

/// Looks for libcuda (the driver), libnvrtc (the run-time compiler) and CUDA's headers.
pub fn libraries() -> CudaLibraries {
    let searched = library_dirs();
    let toolkit = toolkit();
    let toolkit_libs: Vec<PathBuf> = toolkit
        .iter()
        .flat_map(|t| {
            [
                t.join("lib64"),
                t.join("lib"),
                t.join("targets/x86_64-linux/lib"),
            ]
        })
        .collect();
    let mut add = Vec::new();
    let mut missing = Vec::new();
    for (library, hint, from_toolkit) in [
        ("libcuda.so", "the NVIDIA driver (libcuda.so.1)", false),
        (
            "libnvrtc.so",
            "CUDA's run-time compiler (libnvrtc, from the CUDA toolkit)",
            true,
        ),
    ] {
        // The toolkit's own libnvrtc first, so it matches the headers.
        let in_toolkit = toolkit_libs.iter().find(|d| holds(d, library));
        match in_toolkit {
            Some(dir) if from_toolkit => add.push(dir.clone()),
            _ if searched.iter().any(|d| holds(d, library)) => {}
            Some(dir) => add.push(dir.clone()),
            None => missing.push(hint.to_string()),
        }
    }
    if toolkit.is_none() {
        missing.push(
            "CUDA's headers (a toolkit at /usr/local/cuda or /usr/local/cuda-<version>, or set \
             CUDA_PATH)"
                .into(),
        );
    }
    // Burn's backend finds /usr/local/cuda itself; any other toolkit is named by CUDA_PATH.
    let cuda_path = toolkit
        .filter(|t| std::env::var_os("CUDA_PATH").is_none() && t != Path::new(DEFAULT_TOOLKIT));
    CudaLibraries {
        cuda_path,
        add_to_library_path: add,
        missing,
    }
}
