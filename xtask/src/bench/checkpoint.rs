//! The checkpointing suite: step time and peak memory with activation checkpointing off, on
//! every block, on every 2nd block, selective, and Burn's `BalancedCheckpointing`, on the
//! 12-block transformer and on a 6-block ViT. Writes `bench-results/checkpoint-<backend>.*`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use afterburner::checkpoint::Balanced;
use afterburner::{
    AccelerateError, Accelerator, AcceleratorConfig, AutocastMode, CheckpointPolicy, Precision,
};
use afterburner_demos::models::{TransformerConfig, VitConfig};
use afterburner_demos::{ImageBatch, digits};
use burn::data::dataloader::batcher::Batcher;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, ElementConversion, Int, Tensor};
use serde::Serialize;

use super::Options;
use super::burn_lm::BurnLm;
use super::plot::Chart;
use crate::alloc;

const POLICIES: [&str; 5] = ["none", "all", "every-2", "selective", "balanced"];
const SEQ_LEN: usize = 64;

#[derive(Debug, Clone, Copy)]
pub(super) enum Model {
    Transformer,
    Vit,
    /// The transformer's shapes built from Burn's own layers (the Linear suite's model).
    BurnLm,
}

impl Model {
    /// The models `--models` names.
    pub(super) fn selected(o: &Options) -> Result<&'static [Model], String> {
        match o.models.as_str() {
            "all" => Ok(&[Model::Transformer, Model::Vit]),
            "transformer" => Ok(&[Model::Transformer]),
            "vit" => Ok(&[Model::Vit]),
            "burn-lm" => Ok(&[Model::BurnLm]),
            other => Err(format!(
                "unknown --models '{other}'; valid: transformer, vit, burn-lm, all"
            )),
        }
    }

    pub(super) fn describe(self, o: &Options) -> String {
        match self {
            Model::Transformer => format!(
                "12-block transformer (d_model 256, 4 heads, MLP 1024, vocab 256), batch {} x {SEQ_LEN} tokens",
                o.batch_size
            ),
            Model::Vit => format!(
                "ViT (6 blocks, d_model 128, MLP 256, 16 patches) on 8x8 digits, batch {}",
                2 * o.batch_size
            ),
            Model::BurnLm => format!(
                "12-block LM of Burn's TransformerEncoder (d_model 256, 4 heads, MLP 1024, vocab 256), batch {} x {SEQ_LEN} tokens",
                o.batch_size
            ),
        }
    }
}

/// One scenario's figures over its timed steps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Measured {
    pub(super) time: Duration,
    /// Peak live bytes during forward + backward above the live bytes at its start.
    pub(super) peak: usize,
    /// Bytes of one f32 gradient per parameter (part of `peak`, not an activation).
    pub(super) grad_bytes: usize,
    pub(super) final_loss: f64,
    /// FLOPs `Autocast` counted per timed step (0 without `Autocast` in the stack).
    pub(super) flops: u64,
}

impl Measured {
    /// The faster of `so_far` and `m`, with the higher of their peaks (the best time and the
    /// worst memory over rounds).
    pub(super) fn best(so_far: Option<Measured>, m: Measured) -> Measured {
        match so_far {
            Some(b) if b.time <= m.time => Measured {
                peak: b.peak.max(m.peak),
                ..b
            },
            Some(b) => Measured {
                peak: b.peak.max(m.peak),
                ..m
            },
            None => m,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    model: String,
    policy: String,
    ms_per_step: f64,
    time_vs_off: f64,
    fwd_bwd_peak_mib: f64,
    activation_peak_mib: f64,
    activation_vs_off: f64,
    final_loss: f64,
}

/// Runs the suite on the inner backend `I` (`Autodiff<I>`, and `Balanced<I>` for "balanced").
pub fn bench<I: Backend>(o: &Options) -> Result<(), String> {
    let models = Model::selected(o)?;
    let mut rows = Vec::new();
    let total = models.len() * o.rounds * POLICIES.len();
    let mut progress = super::progress::Progress::new("checkpoint", total);
    for &model in models {
        let mut best: Vec<Option<Measured>> = vec![None; POLICIES.len()];
        for round in 0..o.rounds {
            for k in 0..POLICIES.len() {
                // Alternate the order each round so drift does not favour one scenario.
                let s = if round % 2 == 0 {
                    k
                } else {
                    POLICIES.len() - 1 - k
                };
                let policy: CheckpointPolicy = POLICIES[s].parse().map_err(|e| format!("{e}"))?;
                progress.next(format!(
                    "{model:?} round {}/{}: {policy}",
                    round + 1,
                    o.rounds
                ));
                let m = if policy == CheckpointPolicy::Balanced {
                    scenario::<Balanced<I>>(o, model, policy, Precision::Full32)?
                } else {
                    scenario::<burn::backend::Autodiff<I>>(o, model, policy, Precision::Full32)?
                };
                best[s] = Some(Measured::best(best[s], m));
            }
        }
        rows.extend(table(o, model, &best));
    }
    write_results(o, &rows)
}

/// One model under one checkpointing policy and precision: `o.steps` timed steps after
/// `o.warmup`.
pub(super) fn scenario<B: AutodiffBackend>(
    o: &Options,
    model: Model,
    policy: CheckpointPolicy,
    precision: Precision,
) -> Result<Measured, String> {
    scenario_autocast::<B>(o, model, policy, precision, AutocastMode::Auto)
}

/// [`scenario`] with the mixed precisions' autocast mode (op-level or the half view).
pub(super) fn scenario_autocast<B: AutodiffBackend>(
    o: &Options,
    model: Model,
    policy: CheckpointPolicy,
    precision: Precision,
    autocast: AutocastMode,
) -> Result<Measured, String> {
    let device = B::Device::default();
    let config = AcceleratorConfig {
        precision,
        autocast,
        gradient_checkpointing: policy,
        seed: 0,
        ..Default::default()
    };
    let acc = Accelerator::<B>::new(config, device.clone()).map_err(|e| e.to_string())?;
    match model {
        Model::Transformer | Model::BurnLm => {
            let tokens: Vec<Tensor<B, 2, Int>> = (0..2)
                .map(|_| {
                    Tensor::<B, 2>::random(
                        [o.batch_size, SEQ_LEN + 1],
                        Distribution::Uniform(0.0, 256.0),
                        &device,
                    )
                    .int()
                })
                .collect();
            let loss_fn = CrossEntropyLossConfig::new().init(&device);
            let n = o.batch_size * SEQ_LEN;
            let split = move |i: usize| {
                let batch = &tokens[i % tokens.len()];
                let inputs = batch.clone().slice([0..o.batch_size, 0..SEQ_LEN]);
                let targets = batch.clone().slice([0..o.batch_size, 1..SEQ_LEN + 1]);
                (inputs, targets.reshape([n]))
            };
            if let Model::BurnLm = model {
                let net = BurnLm::<B>::new(&device);
                return measure(o, acc, net, |acc, net, i| {
                    let (inputs, targets) = split(i);
                    let logits = acc.forward(net, inputs, |m, x| m.forward(x))?;
                    Ok(loss_fn.forward(logits.reshape([n, 256]), targets))
                });
            }
            let net = TransformerConfig::new().init::<B>(&device);
            measure(o, acc, net, |acc, net, i| {
                let (inputs, targets) = split(i);
                let logits = acc.forward(net, inputs, |m, x| m.forward(x))?;
                Ok(loss_fn.forward(logits.reshape([n, 256]), targets))
            })
        }
        Model::Vit => {
            let net = VitConfig::new()
                .with_d_model(128)
                .with_d_ff(256)
                .with_n_layers(6)
                .init::<B>(&device);
            let data = digits::load().map_err(|e| e.to_string())?;
            let batches: Vec<ImageBatch<B>> = data
                .items()
                .chunks_exact(2 * o.batch_size)
                .take(4)
                .map(|c| data.batcher().batch(c.to_vec(), &device))
                .collect();
            let loss_fn = CrossEntropyLossConfig::new().init(&device);
            measure(o, acc, net, |acc, net, i| {
                let batch = &batches[i % batches.len()];
                let logits = acc.forward(net, batch.images.clone(), |m, x| m.forward(x))?;
                Ok(loss_fn.forward(logits, batch.labels.clone()))
            })
        }
    }
}

/// Trains `warmup + steps` steps (AdamW) and measures the timed ones.
fn measure<B, M, F>(
    o: &Options,
    mut acc: Accelerator<B>,
    model: M,
    mut loss_of: F,
) -> Result<Measured, String>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    F: FnMut(&Accelerator<B>, &M, usize) -> Result<Tensor<B, 1>, AccelerateError>,
{
    let device = acc.device().clone();
    let (mut model, mut optim) = acc
        .setup(model, AdamWConfig::new().init())
        .map_err(|e| e.to_string())?;
    let grad_bytes = model.num_params() * 4;
    let mut lr = 1e-4;
    let (mut time, mut peak, mut final_loss) = (Duration::ZERO, 0, f64::NAN);
    let mut flops = 0u64;
    for i in 0..o.warmup + o.steps {
        B::sync(&device).ok();
        let flops_before = afterburner::flops_counted();
        let live = alloc::live();
        alloc::reset_peak();
        let start = Instant::now();
        let loss = loss_of(&acc, &model, i).map_err(|e| e.to_string())?;
        let last = i + 1 == o.warmup + o.steps;
        let loss_value = last.then(|| loss.clone());
        acc.backward(loss, &model).map_err(|e| e.to_string())?;
        B::sync(&device).ok();
        let step_peak = alloc::peak().saturating_sub(live);
        model = acc
            .step(model, &mut optim, &mut lr)
            .map_err(|e| e.to_string())?;
        B::sync(&device).ok();
        if i >= o.warmup {
            time += start.elapsed();
            peak = peak.max(step_peak);
            flops += afterburner::flops_counted().wrapping_sub(flops_before);
        }
        if let Some(loss) = loss_value {
            final_loss = loss.into_scalar().elem::<f64>();
        }
    }
    Ok(Measured {
        time: time / o.steps as u32,
        peak,
        grad_bytes,
        final_loss,
        flops: flops / o.steps.max(1) as u64,
    })
}

fn table(o: &Options, model: Model, best: &[Option<Measured>]) -> Vec<Row> {
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let activation = |m: &Measured| m.peak.saturating_sub(m.grad_bytes);
    let off = best[0];
    best.iter()
        .zip(POLICIES)
        .filter_map(|(m, policy)| {
            let m = m.as_ref()?;
            Some(Row {
                model: model.describe(o),
                policy: policy.into(),
                ms_per_step: m.time.as_secs_f64() * 1e3,
                time_vs_off: off.map_or(f64::NAN, |b| m.time.as_secs_f64() / b.time.as_secs_f64()),
                fwd_bwd_peak_mib: mib(m.peak),
                activation_peak_mib: mib(activation(m)),
                activation_vs_off: off.map_or(f64::NAN, |b| {
                    activation(m) as f64 / activation(&b).max(1) as f64
                }),
                final_loss: m.final_loss,
            })
        })
        .collect()
}

fn write_results(o: &Options, rows: &[Row]) -> Result<(), String> {
    let mut md = format!(
        "Activation checkpointing, backend `{}`, f32, AdamW, {} timed steps after {} warm-up, \
         best time of {} rounds. Memory: live heap bytes from a counting allocator during \
         forward + backward, above those live at the step's start (CPU backends only); the \
         activation peak is that minus one f32 gradient per parameter.\n",
        o.backend, o.steps, o.warmup, o.rounds
    );
    let mut model = String::new();
    for r in rows {
        if r.model != model {
            model = r.model.clone();
            let _ = write!(
                md,
                "\n{model}\n\n\
                 | policy | ms/step | time vs off | fwd+bwd peak MiB | activation peak MiB | activation vs off | final loss |\n\
                 |---|---|---|---|---|---|---|\n"
            );
        }
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.2}x | {:.1} | {:.1} | {:.2}x | {:.4} |",
            r.policy,
            r.ms_per_step,
            r.time_vs_off,
            r.fwd_bwd_peak_mib,
            r.activation_peak_mib,
            r.activation_vs_off,
            r.final_loss
        );
    }
    let mut charts = Vec::new();
    for (key, model) in [("transformer", "12-block"), ("vit", "ViT")] {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.model.contains(model)).collect();
        if mine.is_empty() {
            continue;
        }
        let series = |f: fn(&Row) -> f64| mine.iter().map(|r| (r.policy.clone(), f(r))).collect();
        charts.push(Chart::new(
            &format!("{key}-time"),
            &format!("{model}: step time"),
            "ms",
            series(|r| r.ms_per_step),
        ));
        charts.push(Chart::new(
            &format!("{key}-memory"),
            &format!("{model}: activation peak"),
            "MiB",
            series(|r| r.activation_peak_mib),
        ));
        charts.push(Chart::new(
            &format!("{key}-loss"),
            &format!("{model}: final loss"),
            "cross-entropy",
            series(|r| r.final_loss),
        ));
    }
    let md = super::with_charts(o, "checkpoint", &md, &charts)?;
    super::write_report(o, "checkpoint", rows, &md)
}
