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

/// CUDA toolkits installed under /usr/local (newest name last), plus `CUDA_PATH`.
pub fn toolkits() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::env::var_os("CUDA_PATH")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Ok(entries) = std::fs::read_dir("/usr/local") {
        let mut local: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("cuda"))
            .map(|e| e.path())
            .filter(|p| p.join("include").join("cuda.h").exists())
            .collect();
        local.sort();
        found.extend(local);
    }
    found
}

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
    /// A toolkit root to use as `CUDA_PATH` (the backend compiles kernels with its headers).
    pub cuda_path: Option<PathBuf>,
    /// Directories to add to `LD_LIBRARY_PATH` so the loader finds libcuda and libnvrtc.
    pub add_to_library_path: Vec<PathBuf>,
    /// What could not be found, each with a hint.
    pub missing: Vec<String>,
}

/// Looks for libcuda (the driver), libnvrtc (the run-time compiler) and CUDA's headers.
pub fn libraries() -> CudaLibraries {
    let searched = library_dirs();
    let toolkits = toolkits();
    let toolkit_libs: Vec<PathBuf> = toolkits
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
    for (library, hint) in [
        ("libcuda.so", "the NVIDIA driver (libcuda.so.1)"),
        (
            "libnvrtc.so",
            "CUDA's run-time compiler (libnvrtc, from the CUDA toolkit)",
        ),
    ] {
        if searched.iter().any(|d| holds(d, library)) {
            continue;
        }
        match toolkit_libs.iter().find(|d| holds(d, library)) {
            Some(dir) => add.push(dir.clone()),
            None => missing.push(hint.to_string()),
        }
    }
    if toolkits.is_empty() {
        missing.push("CUDA's headers (a toolkit under /usr/local/cuda*, or set CUDA_PATH)".into());
    }
    CudaLibraries {
        cuda_path: toolkits.last().cloned(),
        add_to_library_path: add,
        missing,
    }
}
