//! The tp suite: tensor parallelism next to FSDP on the demo transformer (d 128, 4 heads, 4
//! blocks, 256 tokens of vocabulary, batch 8 x 64 tokens), 2 ranks each on in-process
//! threads: values each rank sends per optimizer step (f32), parameters each rank holds, and
//! time per step. Writes `bench-results/tp-<backend>.*`.

use std::fmt::Write as _;
use std::time::Instant;

use afterburner::parallel::local_devices;
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::models::{Transformer, TransformerConfig};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::optim::AdamWConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use serde::Serialize;

use super::Options;

type B = Autodiff<Flex>;
const RANKS: usize = 2;
const LR: f64 = 1e-3;

#[derive(Debug, Clone, Serialize)]
struct Row {
    strategy: String,
    ranks: usize,
    /// f32 values one rank sent through collectives per optimizer step.
    values_sent_per_step: u64,
    /// Parameters one rank holds (rank 0).
    params_per_rank: usize,
    /// Parameters one rank holds at its peak (FSDP's gathered unit on top of its shard).
    peak_params_per_rank: usize,
    ms_per_step: f64,
}

fn model_and_tokens() -> (Transformer<B>, Tensor<B, 2, Int>) {
    let device = Default::default();
    <Flex as Backend>::seed(&Default::default(), 0);
    let config = TransformerConfig::new()
        .with_d_model(128)
        .with_n_layers(4)
        .with_max_seq_len(64);
    let model = config.init::<B>(&device);
    let tokens = Tensor::<B, 2>::random([8, 64], Distribution::Uniform(0.0, 256.0), &device).int();
    // Every lazily initialised parameter read once, before the ranks clone the model.
    let _ = model.forward(tokens.clone());
    (model, tokens)
}

fn loss(logits: Tensor<B, 3>) -> Tensor<B, 1> {
    (logits.clone() * logits).mean()
}

/// Runs the suite (on flex, whatever `--backend` says).
pub fn bench(o: &Options) -> Result<(), String> {
    let steps = o.steps.max(1);
    let (model, tokens) = model_and_tokens();
    let full = model.num_params();
    let mut rows = vec![
        tensor_parallel(&model, &tokens, steps)?,
        fsdp(&model, &tokens, steps)?,
    ];
    rows.sort_by(|a, b| a.strategy.cmp(&b.strategy));
    let mut md = format!(
        "Tensor parallelism next to FSDP, {RANKS} ranks on in-process threads (flex), the demo \
         transformer (d 128, 4 blocks, {full} parameters), batch 8 x 64 tokens, AdamW, \
         {steps} optimizer steps, the mean step after the first. Memory per rank: the training \
         state it keeps (parameters, gradients and AdamW's two moments, f32: 16 bytes a \
         parameter) and the parameters it holds at its peak (FSDP's gathered unit on top of \
         its shard).\n\n| strategy | f32 values sent per step per rank | MiB | parameters \
         per rank | share of the model | training state MiB per rank | peak parameters per \
         rank | ms per step |\n|---|---|---|---|---|---|---|---|\n"
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {} | {:.1}% | {:.2} | {} | {:.1} |",
            r.strategy,
            r.values_sent_per_step,
            r.values_sent_per_step as f64 * 4.0 / (1 << 20) as f64,
            r.params_per_rank,
            100.0 * r.params_per_rank as f64 / full as f64,
            r.params_per_rank as f64 * 16.0 / (1 << 20) as f64,
            r.peak_params_per_rank,
            r.ms_per_step,
        );
    }
    super::write_report(o, "tp", &rows, &md)
}

fn tensor_parallel(
    model: &Transformer<B>,
    tokens: &Tensor<B, 2, Int>,
    steps: usize,
) -> Result<Row, String> {
    let (model, tokens) = (model.clone(), tokens.clone());
    let config = AcceleratorConfig {
        parallelism: afterburner::ParallelismConfig {
            strategy: StrategyConfig::Ddp(Default::default()),
            tp_size: RANKS,
            devices: RANKS,
        },
        ..Default::default()
    };
    let devices = local_devices::<Flex>(RANKS).map_err(|e| e.to_string())?;
    let ranks = Accelerator::<B>::launch(config, devices, move |mut acc| {
        let model = acc.parallelize(model.clone())?;
        let mut model = acc.setup_model(model)?;
        let params = model.num_params();
        let mut optim = AdamWConfig::new().init();
        let tp_sent = |acc: &Accelerator<B>| {
            acc.strategy()
                .tensor_parallel()
                .map_or(0, |mesh| mesh.tensor_parallel().values_sent())
        };
        let (mut started, mut first_sent) = (Instant::now(), 0);
        for step in 0..=steps {
            if step == 1 {
                (started, first_sent) = (Instant::now(), tp_sent(&acc));
            }
            let logits = acc.forward(&model, tokens.clone(), |m, t| m.forward(t))?;
            acc.backward(loss(logits), &model)?;
            model = acc.step(model, &mut optim, &mut LR.clone())?;
        }
        let ms = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
        let sent = (tp_sent(&acc) - first_sent) / steps as u64;
        Ok::<_, AccelerateError>((sent, params, ms))
    })
    .map_err(|e| e.to_string())?;
    let (sent, params, ms) = ranks[0];
    Ok(Row {
        strategy: "tensor parallel (tp_size 2, the demo's plan)".into(),
        ranks: RANKS,
        values_sent_per_step: sent,
        params_per_rank: params,
        peak_params_per_rank: params,
        ms_per_step: ms,
    })
}

fn fsdp(model: &Transformer<B>, tokens: &Tensor<B, 2, Int>, steps: usize) -> Result<Row, String> {
    let full = model.num_params();
    let (model, tokens) = (model.clone(), tokens.clone());
    let config =
        AcceleratorConfig::default().with_strategy(StrategyConfig::Fsdp(Default::default()));
    let devices = local_devices::<Flex>(RANKS).map_err(|e| e.to_string())?;
    let ranks = Accelerator::<B>::launch(config, devices, move |mut acc| {
        let mut model = acc.setup_model(model.clone())?;
        let params = model.num_params();
        let mut optim = AdamWConfig::new().init();
        let (mut started, mut first_sent) = (Instant::now(), 0);
        let fsdp_sent = |acc: &Accelerator<B>| acc.fsdp().map_or(0, |f| f.values_moved());
        for step in 0..=steps {
            if step == 1 {
                (started, first_sent) = (Instant::now(), fsdp_sent(&acc));
            }
            let logits = acc.forward(&model, tokens.clone(), |m, t| m.forward(t))?;
            acc.backward(loss(logits), &model)?;
            model = acc.step(model, &mut optim, &mut LR.clone())?;
        }
        let ms = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
        let sent = (fsdp_sent(&acc) - first_sent) / steps as u64;
        Ok::<_, AccelerateError>((sent, params, ms))
    })
    .map_err(|e| e.to_string())?;
    let (sent, params, ms) = ranks[0];
    Ok(Row {
        strategy: "FSDP (full shard, one unit)".into(),
        ranks: RANKS,
        values_sent_per_step: sent,
        params_per_rank: params,
        // The one unit (the whole model) is gathered for the forward and again for backward.
        peak_params_per_rank: full,
        ms_per_step: ms,
    })
}
