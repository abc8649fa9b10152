//! A device's peak dense FLOP/s, the denominator of MFU: from a table of common NVIDIA GPUs
//! (their data sheets' dense figures, no sparsity) on a CUDA device, and otherwise (the CPU,
//! wgpu, a GPU not in the table) measured once by a short matmul probe on the backend itself
//! and cached (in the process, and in `$XDG_CACHE_HOME/afterburner/peak-flops.json` or
//! `~/.cache/...`, so later runs skip the probe). `AFTERBURNER_PEAK_TFLOPS` overrides both.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};

/// Environment variable that sets the peak (TFLOP/s) instead of the table or the probe.
const PEAK_ENV: &str = "AFTERBURNER_PEAK_TFLOPS";

/// Dense peak TFLOP/s of common GPUs: (name as `nvidia-smi` writes it, 16-bit tensor cores
/// (bf16/fp16 with fp32 accumulation), fp32). More specific names come first.
const GPU_PEAKS: &[(&str, f64, f64)] = &[
    ("H200", 989.4, 66.9),
    ("H100 PCIe", 756.5, 51.2),
    ("H100 NVL", 835.5, 60.0),
    ("H100", 989.4, 66.9),
    ("GH200", 989.4, 66.9),
    ("A100", 312.0, 19.5),
    ("L40S", 362.1, 91.6),
    ("L40", 181.0, 90.5),
    ("L4", 121.0, 30.3),
    ("A10G", 70.0, 31.2),
    ("A10", 125.0, 31.2),
    ("RTX 4090", 165.2, 82.6),
    ("RTX 3090", 71.0, 35.6),
    ("V100", 125.0, 15.7),
];

/// Where a peak figure came from.
#[derive(Debug, Clone, PartialEq)]
pub enum PeakSource {
    /// The data sheet of the named GPU.
    Table(String),
    /// A matmul probe on this backend and device (now or in an earlier run).
    Measured,
    /// `AFTERBURNER_PEAK_TFLOPS`.
    Environment,
}

/// A device's peak dense FLOP/s for one dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct PeakFlops {
    /// Floating-point operations per second.
    pub flops_per_second: f64,
    /// Where the figure came from.
    pub source: PeakSource,
}

/// The table's peak for a GPU named `name` (as `nvidia-smi` writes it) in `dtype` (16-bit
/// floats: the tensor cores' figure; anything else: fp32).
pub fn peak_from_table(name: &str, dtype: DType) -> Option<PeakFlops> {
    let (gpu, half, single) = GPU_PEAKS.iter().find(|(gpu, ..)| name.contains(gpu))?;
    let tflops = match dtype {
        DType::BF16 | DType::F16 => half,
        _ => single,
    };
    Some(PeakFlops {
        flops_per_second: tflops * 1e12,
        source: PeakSource::Table(gpu.to_string()),
    })
}

/// The peak FLOP/s of `device` in `dtype`: `AFTERBURNER_PEAK_TFLOPS`, the table for a CUDA
/// device `nvidia-smi` names, else a matmul probe (measured once per backend, device, dtype
/// and thread count, then cached). `None` when the probe cannot run in `dtype`.
pub fn peak_flops<B: Backend>(device: &B::Device, dtype: DType) -> Option<PeakFlops> {
    if let Some(tflops) = std::env::var(PEAK_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
    {
        return Some(PeakFlops {
            flops_per_second: tflops * 1e12,
            source: PeakSource::Environment,
        });
    }
    let backend = B::name(device);
    if backend.to_ascii_lowercase().contains("cuda")
        && let Some(peak) = gpu_name(device_index(device)).and_then(|n| peak_from_table(&n, dtype))
    {
        return Some(peak);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let key = format!("{backend} {device:?} {dtype:?} threads={threads}");
    static MEASURED: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());
    let mut measured = MEASURED.lock().unwrap_or_else(|e| e.into_inner());
    let flops_per_second = match measured.get(&key) {
        Some(value) => *value,
        None => {
            let value = read_cache(&key).or_else(|| {
                let value = probe::<B>(device, dtype)?;
                write_cache(&key, value);
                Some(value)
            })?;
            measured.insert(key, value);
            value
        }
    };
    Some(PeakFlops {
        flops_per_second,
        source: PeakSource::Measured,
    })
}

/// The best FLOP/s of a few `1024 x 1024` matmuls in `dtype` on `device` (after one warm-up,
/// each waited for).
fn probe<B: Backend>(device: &B::Device, dtype: DType) -> Option<f64> {
    if !B::supports_dtype(device, dtype) {
        return None;
    }
    let n = 1024;
    let random = || Tensor::<B, 2>::random([n, n], Distribution::Default, device).cast(dtype);
    let (a, b) = (random(), random());
    let mut best = f64::INFINITY;
    for round in 0..4 {
        let started = Instant::now();
        let product = a.clone().matmul(b.clone());
        B::sync(device).ok()?;
        drop(product);
        if round > 0 {
            best = best.min(started.elapsed().as_secs_f64());
        }
    }
    let flops = 2.0 * (n * n * n) as f64;
    let value = flops / best.max(1e-9);
    tracing::info!(
        gflops = value / 1e9,
        ?dtype,
        "measured this device's peak matmul FLOP/s (for MFU)"
    );
    Some(value)
}

/// The index of a device whose debug form ends in a number (`Cuda(1)`, `CudaDevice { index: 1 }`).
fn device_index(device: &impl std::fmt::Debug) -> usize {
    let text = format!("{device:?}");
    let digits: String = text
        .chars()
        .rev()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits
        .chars()
        .rev()
        .collect::<String>()
        .parse()
        .unwrap_or(0)
}

/// The name `nvidia-smi` gives GPU `index`, when it runs.
fn gpu_name(index: usize) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader", "-i"])
        .arg(index.to_string())
        .output()
        .ok()?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !name.is_empty()).then_some(name)
}

/// The probe's cache file.
fn cache_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("afterburner").join("peak-flops.json"))
}

fn read_cache(key: &str) -> Option<f64> {
    let text = std::fs::read_to_string(cache_file()?).ok()?;
    let map: BTreeMap<String, f64> = serde_json::from_str(&text).ok()?;
    map.get(key).copied().filter(|v| v.is_finite() && *v > 0.0)
}

/// Adds `key`'s figure to the cache file (best effort: a cache that cannot be written only
/// means probing again next run).
fn write_cache(key: &str, value: f64) {
    let Some(path) = cache_file() else { return };
    let mut map: BTreeMap<String, f64> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    map.insert(key.to_string(), value);
    let Ok(text) = serde_json::to_string_pretty(&map) else {
        return;
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("json.{}", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_knows_common_gpus_by_their_names() {
        let h200 = peak_from_table("NVIDIA H200", DType::BF16).unwrap();
        assert_eq!(h200.flops_per_second, 989.4e12);
        assert_eq!(h200.source, PeakSource::Table("H200".into()));
        let pcie = peak_from_table("NVIDIA H100 PCIe", DType::F32).unwrap();
        assert_eq!(pcie.flops_per_second, 51.2e12);
        let a100 = peak_from_table("NVIDIA A100-SXM4-80GB", DType::F16).unwrap();
        assert_eq!(a100.flops_per_second, 312e12);
        assert!(peak_from_table("NVIDIA GeForce RTX 4090", DType::BF16).is_some());
        assert!(peak_from_table("NVIDIA L40S", DType::BF16).is_some());
        assert!(peak_from_table("Some CPU", DType::F32).is_none());
        assert_eq!(device_index(&"Cuda(3)"), 3);
        assert_eq!(device_index(&"Cpu"), 0);
    }
}
