//! The fusion suite (`--suite fusion --backend wgpu|cuda`): the same Accelerator training
//! steps on Burn's fused backend (`Fusion<CubeBackend<R>>`, what `burn::backend::Wgpu` and
//! `Cuda` are with xtask's `wgpu` and `cuda` features) and on the unfused one (`CubeBackend<R>`), side by
//! side in one run, under `Autodiff<Autocast<_>>` at 32-true and bf16-mixed per op (16-mixed
//! where the device has no bf16, as lavapipe). Reports ms per step and the unfused / fused time ratio; writes
//! `bench-results/fusion-<backend>.*`.

use std::fmt::Write as _;

use afterburner::{Autocast, AutocastMode, CheckpointPolicy, Precision};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use serde::Serialize;

use super::Options;
use super::checkpoint::{Measured, Model, scenario_autocast};

/// One (model, precision) row.
#[derive(Debug, Clone, Serialize)]
struct Row {
    model: String,
    precision: String,
    fused_ms_per_step: f64,
    unfused_ms_per_step: f64,
    /// Unfused time / fused time: above 1, fusion is faster.
    speed_up: f64,
    fused_final_loss: f64,
    unfused_final_loss: f64,
}

/// Runs the suite: `Fused` and `Unfused` are the two builds of one runtime's backend.
pub fn bench<Fused: Backend, Unfused: Backend>(o: &Options) -> Result<(), String> {
    let models = Model::selected(o)?;
    let device = Fused::Device::default();
    let supported = |p: &Precision| Fused::supports_dtype(&device, p.compute_dtype());
    // 32-true, and one half precision: bf16-mixed, or 16-mixed where the device has no bf16
    // (lavapipe).
    let half = [Precision::Bf16Mixed, Precision::F16Mixed]
        .into_iter()
        .find(supported);
    let precisions: Vec<Precision> = std::iter::once(Precision::Full32).chain(half).collect();
    let total = models.len() * precisions.len() * o.rounds * 2;
    let mut progress = super::progress::Progress::new("fusion", total);
    let mut rows = Vec::new();
    for &model in models {
        for &precision in &precisions {
            let (mut fused, mut unfused): (Option<Measured>, Option<Measured>) = (None, None);
            for round in 0..o.rounds {
                let what = format!("{model:?} {precision} round {}/{}", round + 1, o.rounds);
                progress.next(format!("{what}: fused"));
                let m = step_time::<Fused>(o, model, precision)?;
                fused = Some(Measured::best(fused, m));
                progress.next(format!("{what}: unfused"));
                let m = step_time::<Unfused>(o, model, precision)?;
                unfused = Some(Measured::best(unfused, m));
            }
            let (Some(f), Some(u)) = (fused, unfused) else {
                continue;
            };
            let ms = |m: &Measured| m.time.as_secs_f64() * 1e3 / o.steps as f64;
            rows.push(Row {
                model: model.describe(o),
                precision: precision.to_string(),
                fused_ms_per_step: ms(&f),
                unfused_ms_per_step: ms(&u),
                speed_up: u.time.as_secs_f64() / f.time.as_secs_f64(),
                fused_final_loss: f.final_loss,
                unfused_final_loss: u.final_loss,
            });
        }
    }
    let skipped = match half {
        Some(Precision::Bf16Mixed) => String::new(),
        Some(_) => " The device has no bf16: 16-mixed instead.".to_string(),
        None => " The device has neither bf16 nor f16: 32-true only.".to_string(),
    };
    let mut md = format!(
        "Fused vs unfused, backend `{}`, `Autodiff<Autocast<_>>`, {} timed steps after {} \
         warm-up, best of {} rounds.{skipped}\n\n| model | precision | fused ms/step | unfused \
         ms/step | unfused / fused | final loss fused / unfused |\n|---|---|---|---|---|---|\n",
        o.backend, o.steps, o.warmup, o.rounds
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.2} | {:.4} / {:.4} |",
            r.model,
            r.precision,
            r.fused_ms_per_step,
            r.unfused_ms_per_step,
            r.speed_up,
            r.fused_final_loss,
            r.unfused_final_loss
        );
    }
    super::write_report(o, "fusion", &rows, &md)
}

/// The steps of `model` under `precision` (per op) on `I`.
fn step_time<I: Backend>(
    o: &Options,
    model: Model,
    precision: Precision,
) -> Result<Measured, String> {
    scenario_autocast::<Autodiff<Autocast<I>>>(
        o,
        model,
        CheckpointPolicy::None,
        precision,
        AutocastMode::Auto,
    )
}
