//! The autocast suite: op-level autocast next to the half view. Accuracy: bf16-mixed and
//! 16-mixed output and gradient errors against f32 on Burn's `TransformerEncoder` and on the
//! ViT, next to PyTorch's `torch.autocast` on the same weights when PyTorch imports
//! (`autocast_error.rs`). Cost: step time and peak memory of 32-true, bf16-mixed per op and
//! bf16-mixed through the view on the `--models` (default the ViT and the LM built from Burn's
//! layers), on `Autodiff<Autocast<I>>` and per op also on `Autocast<Autodiff<I>>` (the casts
//! recorded by Autodiff). Writes `bench-results/autocast-<backend>.*`.

use std::fmt::Write as _;

use afterburner::{Autocast, AutocastMode, CheckpointPolicy, Precision};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use serde::Serialize;

use super::Options;
use super::autocast_error::{Errors, Net, errors};
use super::checkpoint::{Measured, Model, scenario_autocast};

/// One (model, precision, mode) of the cost table.
#[derive(Debug, Clone, Serialize)]
struct Cost {
    model: String,
    setting: String,
    ms_per_step: f64,
    time_vs_f32: f64,
    /// Achieved TFLOP/s of the model's counted FLOPs per step (those of the 32-true step on
    /// `Autodiff<Autocast<I>>`, where forward and backward are both counted).
    tflops: Option<f64>,
    /// `tflops` over the device's peak in the setting's compute dtype.
    mfu: Option<f64>,
    /// `None` where the backend allocates outside Rust's allocator (tch).
    fwd_bwd_peak_mib: Option<f64>,
    final_loss: f64,
}

#[derive(Serialize)]
struct Report {
    errors: Vec<Errors>,
    cost: Vec<Cost>,
    /// The device's peak TFLOP/s (f32, bf16) MFU is measured against, with where the
    /// figures came from (a GPU's data sheet, or the matmul probe).
    peak_tflops: Vec<(String, f64, String)>,
    /// What counting FLOPs and reading the throughput cost (flop_overhead.rs).
    overhead: Vec<super::flop_overhead::Overhead>,
}

/// Where the `Autocast` layer sits: below Autodiff (`Autodiff<Autocast<I>>`, the casts
/// unrecorded) or above it (`Autocast<Autodiff<I>>`, the casts recorded).
#[derive(Clone, Copy)]
enum Stack {
    Below,
    Above,
}

const SETTINGS: [(&str, Precision, AutocastMode, Stack); 4] = [
    (
        "32-true",
        Precision::Full32,
        AutocastMode::Auto,
        Stack::Below,
    ),
    (
        "bf16-mixed, op (casts below Autodiff)",
        Precision::Bf16Mixed,
        AutocastMode::Op,
        Stack::Below,
    ),
    (
        "bf16-mixed, op (casts recorded)",
        Precision::Bf16Mixed,
        AutocastMode::Op,
        Stack::Above,
    ),
    (
        "bf16-mixed, view",
        Precision::Bf16Mixed,
        AutocastMode::View,
        Stack::Below,
    ),
];

/// Runs the accuracy half, then the cost half.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String> {
    type B<I> = Autodiff<Autocast<I>>;
    let python = match super::torch::check_torch() {
        Ok(_) => Some(super::torch::python()),
        Err(why) => {
            eprintln!("autocast suite: no PyTorch column ({why})");
            None
        }
    };
    let models: &[Model] = match o.models.as_str() {
        "all" => &[Model::Vit, Model::BurnLm],
        _ => Model::selected(o)?,
    };
    let nets = [Net::Encoder, Net::Vit];
    let total = nets.len() * 4
        + models.len() * o.rounds * SETTINGS.len()
        + 2 * super::flop_overhead::rounds(o);
    let mut progress = super::progress::Progress::new("autocast", total);
    let mut report = Report {
        errors: Vec::new(),
        cost: Vec::new(),
        peak_tflops: Vec::new(),
        overhead: Vec::new(),
    };
    for dtype in [burn::tensor::DType::F32, burn::tensor::DType::BF16] {
        if let Some(peak) = afterburner::throughput::peak_flops::<I>(&Default::default(), dtype) {
            let source = format!("{:?}", peak.source);
            let tflops = peak.flops_per_second / 1e12;
            report
                .peak_tflops
                .push((format!("{dtype:?}"), tflops, source));
        }
    }
    for net in nets {
        for precision in ["bf16-mixed", "16-mixed"] {
            progress.next(format!("{net:?} {precision}: errors vs f32"));
            report
                .errors
                .push(errors::<B<I>>(net, precision, python.as_deref())?);
            progress.next(format!(
                "{net:?} {precision}, casts recorded: errors vs f32"
            ));
            let mut recorded = errors::<Autocast<Autodiff<I>>>(net, precision, None)?;
            recorded.precision = format!("{precision}, casts recorded");
            report.errors.push(recorded);
        }
    }
    for &model in models {
        let mut best: [Option<Measured>; SETTINGS.len()] = [None; SETTINGS.len()];
        for round in 0..o.rounds {
            for (k, (name, precision, mode, stack)) in SETTINGS.iter().enumerate() {
                progress.next(format!(
                    "{model:?} round {}/{}: {name}",
                    round + 1,
                    o.rounds
                ));
                let none = CheckpointPolicy::None;
                let m = match stack {
                    Stack::Below => scenario_autocast::<B<I>>(o, model, none, *precision, *mode)?,
                    Stack::Above => scenario_autocast::<Autocast<Autodiff<I>>>(
                        o, model, none, *precision, *mode,
                    )?,
                };
                best[k] = Some(Measured::best(best[k], m));
            }
        }
        let f32_time = best[0].map(|m| m.time.as_secs_f64());
        let model_flops = best[0].map_or(0, |m| m.flops);
        for (m, (name, precision, ..)) in best.iter().zip(SETTINGS) {
            if let Some(m) = m {
                let secs = m.time.as_secs_f64().max(1e-12);
                let achieved = (model_flops > 0).then(|| model_flops as f64 / secs);
                let peak = afterburner::throughput::peak_flops::<I>(
                    &Default::default(),
                    precision.compute_dtype(),
                );
                let mfu = achieved.zip(peak).map(|(a, p)| a / p.flops_per_second);
                report.cost.push(Cost {
                    model: model.describe(o),
                    setting: name.into(),
                    ms_per_step: m.time.as_secs_f64() * 1e3,
                    time_vs_f32: f32_time.map_or(f64::NAN, |t| m.time.as_secs_f64() / t),
                    tflops: achieved.map(|a| a / 1e12),
                    mfu,
                    fwd_bwd_peak_mib: super::heap_is_counted(o)
                        .then(|| m.peak as f64 / (1024.0 * 1024.0)),
                    final_loss: m.final_loss,
                });
            }
        }
    }
    // The first model's steps are the shortest: the most rounds in the least time.
    if let Some(&model) = models.first() {
        let overhead = super::flop_overhead::measure::<I>(o, model, &mut progress)?;
        report.overhead.push(overhead);
    }
    let md = markdown(o, &report);
    super::write_report(o, "autocast", std::slice::from_ref(&report), &md)
}

fn markdown(o: &Options, report: &Report) -> String {
    let mut md = String::from(
        "Errors against f32 (relative L2 of the output, and of all parameter gradients as \
         one vector), same weights and input, inner backend `",
    );
    let _ = write!(
        md,
        "{}`. PyTorch: `torch.autocast(\"cpu\")` on the same weights \
         (xtask/torch/autocast_error.py); its f32 run is checked against ours.\n\n\
         | model | precision | op: output | op: grads | view: output | view: grads | PyTorch: \
         output | PyTorch: grads | PyTorch f32 vs ours |\n|---|---|---|---|---|---|---|---|---|\n",
        o.backend
    );
    for e in &report.errors {
        let torch = |f: fn(&super::autocast_error::TorchErrors) -> f64| {
            e.pytorch
                .as_ref()
                .map_or("n/a".into(), |t| format!("{:.2e}", f(t)))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {} | {} | {} |",
            e.model,
            e.precision,
            e.op_output,
            e.op_grads,
            e.view_output,
            e.view_grads,
            torch(|t| t.output_error),
            torch(|t| t.grad_error),
            torch(|t| t.f32_vs_burn),
        );
    }
    let _ = write!(
        md,
        "\nCost on `Autodiff<Autocast<{}>>` (casts recorded: `Autocast<Autodiff<..>>`), AdamW, no checkpointing, {} timed steps after {} \
         warm-up, best time of {} rounds. Memory: peak live heap during forward + backward.{}\n\n\
         | model | precision, autocast | ms/step | TFLOP/s | MFU | time vs 32-true | fwd+bwd \
         peak MiB | final loss |\n|---|---|---|---|---|---|---|---|\n",
        o.backend,
        o.steps,
        o.warmup,
        o.rounds,
        super::heap_note(o)
    );
    for c in &report.cost {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {} | {:.2}x | {} | {:.6} |",
            c.model,
            c.setting,
            c.ms_per_step,
            c.tflops.map_or("n/a".into(), |t| format!("{t:.3}")),
            c.mfu.map_or("n/a".into(), |m| format!("{:.1}%", m * 100.0)),
            c.time_vs_f32,
            c.fwd_bwd_peak_mib
                .map_or("n/a".into(), |p| format!("{p:.1}")),
            c.final_loss
        );
    }
    let peaks: Vec<String> = report
        .peak_tflops
        .iter()
        .map(|(dtype, tflops, source)| format!("{dtype} {tflops:.3} TFLOP/s ({source})"))
        .collect();
    let _ = write!(
        md,
        "\nTFLOP/s: the FLOPs `Autocast` counted in the 32-true step (matmuls, Linear, \
         convolutions; forward and backward) over each setting's step time. MFU: that over the \
         device's peak in the setting's compute dtype: {}.\n",
        if peaks.is_empty() {
            "unknown".to_string()
        } else {
            peaks.join(", ")
        }
    );
    let _ = write!(
        md,
        "\nWhat the throughput figures cost (32-true, counting on and off alternating, best \
         time of {} rounds; per log: reading a window and the peak memory):\n\n\
         | model | counting ms/step | not counting ms/step | overhead | per log |\n\
         |---|---|---|---|---|\n",
        super::flop_overhead::rounds(o)
    );
    for c in &report.overhead {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:+.2}% | {:.1} us |",
            c.model,
            c.counting_ms_per_step,
            c.not_counting_ms_per_step,
            c.overhead_percent,
            c.per_log_us
        );
    }
    md
}
