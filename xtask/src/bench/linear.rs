//! The Linear suite: models built from Burn's own layers trained on `Autodiff<I>` and on
//! `Autodiff<Autocast<I>>`, which runs every Linear on the 2-D view of its input. Step time,
//! peak memory and the final loss side by side. Models (`--models`, default `burn-lm` and
//! `vit`): the 12-block LM built from Burn's `TransformerEncoder`, the ViT built from Burn's
//! `TransformerEncoderLayer`, and, as a control, the demo transformer (its Linears are 2-D already). Writes `bench-results/linear-<backend>.*`.

use std::fmt::Write as _;

use afterburner::{Autocast, CheckpointPolicy, Precision};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use serde::Serialize;

use super::Options;
use super::checkpoint::{Measured, Model, scenario};

#[derive(Debug, Clone, Serialize)]
struct Row {
    model: String,
    backend: String,
    ms_per_step: f64,
    time_vs_plain: f64,
    /// `None` where the backend allocates outside Rust's allocator (tch).
    fwd_bwd_peak_mib: Option<f64>,
    final_loss: f64,
}

/// Runs both stacks on every model `--models` names, alternating their order each round.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String> {
    let mut rows = Vec::new();
    let models: &[Model] = match o.models.as_str() {
        "all" => &[Model::BurnLm, Model::Vit],
        _ => Model::selected(o)?,
    };
    let mut progress = super::progress::Progress::new("linear", models.len() * o.rounds * 2);
    for &model in models {
        let mut best: [Option<Measured>; 2] = [None, None];
        for round in 0..o.rounds {
            for k in 0..2 {
                let which = if round % 2 == 0 { k } else { 1 - k };
                let stack = ["Autodiff<I>", "Autodiff<Autocast<I>>"][which];
                progress.next(format!(
                    "{model:?} round {}/{}: {stack}",
                    round + 1,
                    o.rounds
                ));
                let m = if which == 0 {
                    scenario::<Autodiff<I>>(o, model, CheckpointPolicy::None, Precision::Full32)?
                } else {
                    let none = CheckpointPolicy::None;
                    scenario::<Autodiff<Autocast<I>>>(o, model, none, Precision::Full32)?
                };
                best[which] = Some(Measured::best(best[which], m));
            }
        }
        let plain = best[0].map(|m| m.time.as_secs_f64());
        for (m, stack) in best.iter().zip(["Autodiff<I>", "Autodiff<Autocast<I>>"]) {
            if let Some(m) = m {
                rows.push(Row {
                    model: model.describe(o),
                    backend: stack.into(),
                    ms_per_step: m.time.as_secs_f64() * 1e3,
                    time_vs_plain: plain.map_or(f64::NAN, |p| m.time.as_secs_f64() / p),
                    fwd_bwd_peak_mib: super::heap_is_counted(o)
                        .then(|| m.peak as f64 / (1024.0 * 1024.0)),
                    final_loss: m.final_loss,
                });
            }
        }
    }
    let mut md = format!(
        "Burn's layers with and without `Autocast` (Linear on the 2-D view), inner backend \
         `{}`, f32, AdamW, no checkpointing, {} timed steps after {} warm-up, best time of {} \
         rounds. Memory: peak live heap during forward + backward (CPU backends only).{}\n\n\
         | model | stack | ms/step | time vs Autodiff<I> | fwd+bwd peak MiB | final loss |\n\
         |---|---|---|---|---|---|\n",
        o.backend,
        o.steps,
        o.warmup,
        o.rounds,
        super::heap_note(o)
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | `{}` | {:.0} | {:.2}x | {} | {:.6} |",
            r.model,
            r.backend,
            r.ms_per_step,
            r.time_vs_plain,
            r.fwd_bwd_peak_mib
                .map_or("n/a".into(), |p| format!("{p:.1}")),
            r.final_loss
        );
    }
    super::write_report(o, "linear", &rows, &md)
}
