//! The PyTorch twins of the focused presets (`xtask/torch/preset_twins.py`), run on the same
//! device by `gpu-check --perf`, and their rows beside afterburner's in the report.
//!
//! TF32: Burn 0.21's CUDA matmuls stage f32 inputs in TF32 on tensor cores whenever a
//! tensor-core kernel is picked, and nothing turns that off (docs/gpu.md); so the twins run
//! with `--tf32 on` on CUDA, the same arithmetic on both sides. On the CPU there is no TF32.

use std::fmt::Write as _;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::Options;
use crate::bench::perf::PERF_PRECISIONS;
use crate::bench::presets::Row;
use crate::bench::torch::python;

/// The twin script, relative to the repository root (where gpu-check runs).
const SCRIPT: &str = "xtask/torch/preset_twins.py";

/// One twin's measurement, as the script prints it (one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TwinRow {
    /// "gpt2-small" or "vit-b16".
    pub model: String,
    /// "32-true" or "bf16-mixed".
    pub precision: String,
    /// Whether the model ran under `torch.compile`.
    #[serde(default)]
    pub compile: bool,
    /// Items per step (sequences or images).
    #[serde(default)]
    pub batch: Option<usize>,
    /// Tokens/s (GPT-2) or images/s (ViT).
    #[serde(default)]
    pub throughput: Option<f64>,
    /// "tokens/s" or "img/s".
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    pub ms_per_step: Option<f64>,
    /// Achieved TFLOP/s (FLOPs as PyTorch's FLOP counter counts them).
    #[serde(default)]
    pub tflops: Option<f64>,
    /// The twin's parameter count (to compare with afterburner's model).
    #[serde(default)]
    pub params: Option<u64>,
    #[serde(default)]
    pub tf32: Option<bool>,
    #[serde(default)]
    pub peak_memory_mib: Option<f64>,
    #[serde(default)]
    pub final_loss: Option<f64>,
    #[serde(default)]
    pub torch: Option<String>,
    /// Why this twin did not run (set here, not by the script).
    #[serde(default)]
    pub error: Option<String>,
}

/// The twins of every focused preset and precision (eager; and compiled with `--compile`).
/// An error when Python or PyTorch is missing (the message says how to install it).
pub fn run(options: &Options) -> Result<Vec<TwinRow>, String> {
    let device = match options.backend.as_str() {
        "cuda" => "cuda",
        _ => "cpu",
    };
    let probe = Command::new(python())
        .args(["-c", "import torch; print(torch.__version__)"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        _ => {
            return Err(format!(
                "PyTorch is not importable by {} here; install it (`pip install torch`) or \
                 point AFTERBURNER_PYTHON at an interpreter that has it",
                python()
            ));
        }
    }
    let mut rows = Vec::new();
    let compiled: &[bool] = if options.compile {
        &[false, true]
    } else {
        &[false]
    };
    for &compile in compiled {
        for (model, batch) in [("gpt2-small", 8), ("vit-b16", 64)] {
            for precision in PERF_PRECISIONS {
                let precision = precision.to_string();
                println!("gpu-check: twin {model} {precision} compile {compile} on {device}");
                rows.push(run_one(
                    model,
                    &precision,
                    batch,
                    compile,
                    device,
                    options.quick,
                ));
            }
        }
    }
    Ok(rows)
}

/// One twin in its own process (a crash or an out-of-memory error stays in its row).
fn run_one(
    model: &str,
    precision: &str,
    batch: usize,
    compile: bool,
    device: &str,
    quick: bool,
) -> TwinRow {
    let mut command = Command::new(python());
    command.arg(SCRIPT).args([
        "--model",
        model,
        "--precision",
        precision,
        "--batch",
        &batch.to_string(),
        "--steps",
        "10",
        "--warmup",
        "3",
        "--device",
        device,
        "--tf32",
        if device == "cuda" { "on" } else { "off" },
    ]);
    if compile {
        command.arg("--compile");
    }
    if quick {
        command.arg("--quick");
    }
    let failed = |error: String| TwinRow {
        model: model.into(),
        precision: precision.into(),
        compile,
        batch: Some(batch),
        throughput: None,
        unit: None,
        ms_per_step: None,
        tflops: None,
        params: None,
        tf32: None,
        peak_memory_mib: None,
        final_loss: None,
        torch: None,
        error: Some(error),
    };
    let out = match command.output() {
        Ok(out) => out,
        Err(e) => return failed(format!("cannot run {} {SCRIPT}: {e}", python())),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    match (out.status.success(), last) {
        (true, Some(line)) => serde_json::from_str::<TwinRow>(line)
            .unwrap_or_else(|e| failed(format!("unreadable output {line:?}: {e}"))),
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
            failed(format!(
                "{SCRIPT} ended with {}: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            ))
        }
    }
}

/// The twins beside afterburner's rows of the same preset and precision.
pub fn markdown(rows: &[Row], twins: &[TwinRow], error: &Option<String>) -> String {
    let mut md = String::from("\n## Beside PyTorch on the same device\n\n");
    if let Some(e) = error {
        let _ = writeln!(md, "twins not run: {e}\n");
        return md;
    }
    md.push_str(
        "| preset | precision | afterburner | PyTorch | mode | afterburner / PyTorch | \
         PyTorch TFLOP/s | PyTorch params | PyTorch peak MiB |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for twin in twins {
        let ours = rows
            .iter()
            .find(|r| r.preset == twin.model && r.precision == twin.precision)
            .and_then(|r| r.throughput);
        let theirs = match (&twin.error, twin.throughput) {
            (Some(e), _) => format!("ERROR: {}", e.replace('|', "/")),
            (None, Some(t)) => format!("{t:.1} {}", twin.unit.as_deref().unwrap_or("")),
            (None, None) => "-".into(),
        };
        let ratio = ours
            .zip(twin.throughput)
            .map_or("-".into(), |(a, b)| format!("{:.2}x", a / b));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {theirs} | {} | {ratio} | {} | {} | {} |",
            twin.model,
            twin.precision,
            ours.map_or("-".into(), |t| format!("{t:.1}")),
            if twin.compile {
                "torch.compile"
            } else {
                "eager"
            },
            twin.tflops.map_or("-".into(), |t| match t < 1.0 {
                true => format!("{t:.4}"),
                false => format!("{t:.1}"),
            }),
            twin.params.map_or("-".into(), |p| p.to_string()),
            twin.peak_memory_mib
                .map_or("-".into(), |m| format!("{m:.0}")),
        );
    }
    md
}
