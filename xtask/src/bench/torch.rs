//! `cargo xtask bench --torch`: the checkpoint suite's models (the 12-block transformer and the
//! 6-block ViT) on afterburner and on their PyTorch twins (xtask/torch/twins.py) in one run,
//! alternating per round: step time and peak live heap during forward + backward measured the
//! same way on both sides (the counting allocator here; a preloaded counting shim,
//! xtask/torch/heapcount.c, built with `cc`, for the Python process), with ratio columns
//! afterburner / PyTorch. Needs `python3 -c "import torch"` to work (or `AFTERBURNER_PYTHON`
//! naming an interpreter that has torch).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use afterburner::{Autocast, CheckpointPolicy, Precision};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::Options;
use super::checkpoint::{Measured, Model, scenario};
use super::plot::Chart;

const PRECISIONS: [Precision; 2] = [Precision::Full32, Precision::Bf16Mixed];
const POLICIES: [&str; 2] = ["none", "all"];

/// One scenario on both sides.
#[derive(Debug, Clone, Serialize)]
struct Row {
    model: String,
    precision: String,
    checkpointing: String,
    afterburner_ms: f64,
    pytorch_ms: f64,
    time_ratio: f64,
    /// `None` where the backend allocates outside Rust's allocator (tch).
    afterburner_peak_mib: Option<f64>,
    pytorch_peak_mib: Option<f64>,
    peak_ratio: Option<f64>,
    afterburner_loss: f64,
    pytorch_loss: f64,
}

/// What twins.py prints.
#[derive(Debug, Clone, Deserialize)]
struct TorchRun {
    ms_per_step: f64,
    fwd_bwd_peak_bytes: Option<f64>,
    final_loss: f64,
    threads: usize,
}

/// The Python interpreter to use.
pub(crate) fn python() -> String {
    std::env::var("AFTERBURNER_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Checks that PyTorch imports; the error says how to install it.
pub(super) fn check_torch() -> Result<String, String> {
    let out = Command::new(python())
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .map_err(|e| format!("--torch: cannot run {}: {e}", python()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "--torch needs PyTorch: `{} -c \"import torch\"` failed. Install it in a venv \
             (python3 -m venv .venv && .venv/bin/pip install torch) and run with \
             AFTERBURNER_PYTHON=.venv/bin/python",
            python()
        ))
    }
}

/// Builds the heap-counting preload shim with `cc`; `None` (no PyTorch memory column) when
/// no C compiler is there.
fn build_shim() -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("torch/heapcount.c");
    let out = std::env::temp_dir().join(format!("afterburner-heapcount-{}.so", std::process::id()));
    let built = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&source)
        .status();
    match built {
        Ok(s) if s.success() => Some(out),
        _ => {
            eprintln!(
                "--torch: could not build {} with cc: no PyTorch memory figures",
                source.display()
            );
            None
        }
    }
}

fn torch_run(
    o: &Options,
    model: Model,
    precision: Precision,
    policy: &str,
    shim: Option<&Path>,
) -> Result<TorchRun, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("torch/twins.py");
    let mut command = Command::new(python());
    command.arg(&script).args([
        "--model",
        match model {
            // Same shapes and structure as the demo transformer (pre-norm, causal).
            Model::Transformer | Model::BurnLm => "transformer",
            Model::Vit => "vit",
        },
        "--precision",
        precision.as_str(),
        "--checkpoint",
        policy,
        "--batch",
        &o.batch_size.to_string(),
        "--steps",
        &o.steps.to_string(),
        "--warmup",
        &o.warmup.to_string(),
    ]);
    if let Some(shim) = shim {
        command.env("LD_PRELOAD", shim);
    }
    let out = command
        .output()
        .map_err(|e| format!("running twins.py: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "twins.py failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("twins.py printed {line:?}: {e}"))
}

/// Runs both sides on the inner backend `I`.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String> {
    let version = check_torch()?;
    let shim = build_shim();
    let models = Model::selected(o)?;
    let mut rows = Vec::new();
    let mut threads = 0;
    let total = models.len() * PRECISIONS.len() * POLICIES.len() * o.rounds;
    let mut progress = super::progress::Progress::new("torch", total);
    for &model in models {
        for precision in PRECISIONS {
            for policy in POLICIES {
                let parsed: CheckpointPolicy = policy.parse().map_err(|e| format!("{e}"))?;
                let (mut ours, mut theirs): (Option<Measured>, Option<TorchRun>) = (None, None);
                for round in 0..o.rounds {
                    progress.next(format!(
                        "{model:?} {precision} checkpointing {policy}: round {}/{} (both sides)",
                        round + 1,
                        o.rounds
                    ));
                    // Alternate which side goes first, so drift favours neither.
                    let mut run_ours = || -> Result<(), String> {
                        let m = scenario::<Autodiff<Autocast<I>>>(o, model, parsed, precision)?;
                        ours = Some(Measured::best(ours, m));
                        Ok(())
                    };
                    let mut run_theirs = || -> Result<(), String> {
                        let t = torch_run(o, model, precision, policy, shim.as_deref())?;
                        threads = t.threads;
                        if theirs
                            .as_ref()
                            .is_none_or(|b| t.ms_per_step < b.ms_per_step)
                        {
                            theirs = Some(t);
                        }
                        Ok(())
                    };
                    if round % 2 == 0 {
                        run_ours()?;
                        run_theirs()?;
                    } else {
                        run_theirs()?;
                        run_ours()?;
                    }
                }
                let (Some(ours), Some(theirs)) = (ours, theirs) else {
                    return Err("--rounds must be at least 1".into());
                };
                rows.push(row(o, model, precision, policy, &ours, &theirs));
            }
        }
    }
    if let Some(shim) = &shim {
        let _ = std::fs::remove_file(shim);
    }
    let md = markdown(o, &rows, &version, threads);
    let md = super::with_charts(o, "torch", &md, &charts(&rows))?;
    super::write_report(o, "torch", &rows, &md)
}

fn row(
    o: &Options,
    model: Model,
    precision: Precision,
    policy: &str,
    ours: &Measured,
    theirs: &TorchRun,
) -> Row {
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let peak = theirs.fwd_bwd_peak_bytes.map(mib);
    let ours_peak = super::heap_is_counted(o).then(|| mib(ours.peak as f64));
    Row {
        model: model.describe(o),
        precision: precision.to_string(),
        checkpointing: policy.into(),
        afterburner_ms: ms(ours.time),
        pytorch_ms: theirs.ms_per_step,
        time_ratio: ms(ours.time) / theirs.ms_per_step,
        afterburner_peak_mib: ours_peak,
        pytorch_peak_mib: peak,
        peak_ratio: ours_peak.zip(peak).map(|(ours, theirs)| ours / theirs),
        afterburner_loss: ours.final_loss,
        pytorch_loss: theirs.final_loss,
    }
}

/// Time and peak heap, afterburner next to PyTorch, per scenario.
fn charts(rows: &[Row]) -> Vec<Chart> {
    let label = |r: &Row, side: &str| {
        let model = if r.model.contains("ViT") {
            "ViT"
        } else {
            "transformer"
        };
        format!("{model} {} ckpt {} {side}", r.precision, r.checkpointing)
    };
    let pairs = |ours: fn(&Row) -> f64, theirs: fn(&Row) -> f64| {
        rows.iter()
            .flat_map(|r| {
                [
                    (label(r, "afterburner"), ours(r)),
                    (label(r, "PyTorch"), theirs(r)),
                ]
            })
            .collect()
    };
    vec![
        Chart::new(
            "time",
            "Step time",
            "ms",
            pairs(|r| r.afterburner_ms, |r| r.pytorch_ms),
        ),
        Chart::new(
            "memory",
            "Peak heap during forward + backward",
            "MiB",
            pairs(
                |r| r.afterburner_peak_mib.unwrap_or(f64::NAN),
                |r| r.pytorch_peak_mib.unwrap_or(f64::NAN),
            ),
        ),
    ]
}

fn markdown(o: &Options, rows: &[Row], version: &str, threads: usize) -> String {
    let mut md = format!(
        "afterburner (backend `{}`) next to PyTorch {version} ({threads} threads) on twin models, \
         AdamW, {} timed steps after {} warm-up, best time of {} rounds (sides alternating). \
         Peak: live heap bytes during forward + backward above those live at the step's start \
         (a counting allocator; for PyTorch a preloaded counting malloc). Ratios are afterburner \
         / PyTorch. Losses differ: the twins start from other random weights.{}\n",
        o.backend,
        o.steps,
        o.warmup,
        o.rounds,
        super::heap_note(o)
    );
    let mut model = String::new();
    for r in rows {
        if r.model != model {
            model = r.model.clone();
            let _ = write!(
                md,
                "\n{model}\n\n\
                 | precision | checkpointing | afterburner ms | PyTorch ms | time ratio | afterburner peak MiB | PyTorch peak MiB | peak ratio |\n\
                 |---|---|---|---|---|---|---|---|\n"
            );
        }
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.0} | {:.2}x | {} | {} | {} |",
            r.precision,
            r.checkpointing,
            r.afterburner_ms,
            r.pytorch_ms,
            r.time_ratio,
            r.afterburner_peak_mib
                .map_or("n/a".into(), |p| format!("{p:.1}")),
            r.pytorch_peak_mib.map_or("-".into(), |p| format!("{p:.1}")),
            r.peak_ratio.map_or("-".into(), |p| format!("{p:.2}x")),
        );
    }
    md
}
