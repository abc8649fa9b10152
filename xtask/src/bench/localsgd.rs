//! The localsgd suite: DDP vs Local SGD (K = 8) vs DiLoCo (H = 50) vs Streaming DiLoCo (H = 50,
//! 5 fragments, exchanges overlapped with 5 inner steps; f32 and int8) at the same optimizer
//! steps, on 2 and 4 in-process workers behind a slow link (`SlowLink`: a latency and a
//! bandwidth per collective, as real sleeps): wall time, bytes each rank sent, final training
//! loss and test accuracy on the built-in digits. Writes `bench-results/localsgd-<backend>.*`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use afterburner::localsgd::{DiLoCoConfig, LocalSgdConfig, OuterDtype};
use afterburner::parallel::{LaunchConfig, SlowLink, launch};
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::models::VitConfig;
use afterburner_demos::{ImageDataset, digits};
use burn::backend::Autodiff;
use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::ElementConversion;
use burn::tensor::backend::Backend;
use serde::Serialize;

use super::Options;

/// The link every collective pays for: latency per call and bandwidth.
const LATENCY: Duration = Duration::from_millis(5);
const BYTES_PER_SECOND: f64 = 25e6;

#[derive(Debug, Clone, Serialize)]
struct Row {
    strategy: String,
    workers: usize,
    optimizer_steps: usize,
    seconds: f64,
    mib_sent_per_rank: f64,
    final_loss: f64,
    test_accuracy: f64,
}

/// What one rank measured: bytes sent, its last training loss, the test accuracy.
type RankResult = (u64, f64, f64);

fn run<I: Backend>(
    strategy: &'static str,
    diloco: DiLoCoConfig,
    workers: usize,
    o: &Options,
    train: &ImageDataset,
    test: &ImageDataset,
) -> Result<(f64, RankResult), String>
where
    I::Device: Default,
{
    type Ad<I> = Autodiff<I>;
    let config = AcceleratorConfig::default().with_strategy(
        match strategy
            .parse()
            .map_err(|e: AccelerateError| e.to_string())?
        {
            StrategyConfig::LocalSgd(_) => StrategyConfig::LocalSgd(LocalSgdConfig {
                local_sgd_steps: 8,
                ..Default::default()
            }),
            StrategyConfig::DiLoCo(_) => StrategyConfig::DiLoCo(diloco),
            other => other,
        },
    );
    let device = I::Device::default();
    Ad::<I>::seed(&device, 0);
    let model = VitConfig::new().init::<Ad<I>>(&device);
    let (train, test, steps, batch) = (train.clone(), test.clone(), o.steps as u64, o.batch_size);
    let start = Instant::now();
    let ranks = launch::<I, _, AccelerateError, _>(
        vec![device; workers],
        LaunchConfig::default(),
        move |group| -> Result<RankResult, AccelerateError> {
            let device = group.device().clone();
            let link = SlowLink::new(group, LATENCY, BYTES_PER_SECOND);
            let sent = link.bytes_sent();
            let mut acc =
                Accelerator::<Ad<I>>::with_group(config.clone(), device.clone(), Box::new(link))?;
            let (mut model, mut optim) = acc.setup(model.clone(), AdamWConfig::new().init())?;
            let loader = acc.dataloader(train.clone(), train.batcher(), batch)?;
            let loss_fn = CrossEntropyLossConfig::new().init(&device);
            let mut last = f64::NAN;
            'training: for epoch in 0.. {
                for b in loader.epoch(epoch) {
                    let logits = acc.forward(&model, b.images, |m, x| m.forward(x))?;
                    let loss = loss_fn.forward(logits, b.labels);
                    last = loss.clone().into_scalar().elem::<f64>();
                    acc.backward(loss, &model)?;
                    model = acc.step(model, &mut optim, &mut 2e-3)?;
                    if acc.counters().optimizer_steps == steps {
                        break 'training;
                    }
                }
            }
            let model = acc.finish(model)?;
            let all = test.batcher().batch(test.items().to_vec(), &device);
            let logits = acc.forward(&model, all.images, |m, x| m.forward(x))?;
            let hits = logits.argmax(1).reshape([-1]).equal(all.labels).float();
            let accuracy = hits.mean().into_scalar().elem::<f64>();
            Ok((sent.load(Ordering::Relaxed), last, accuracy))
        },
    )
    .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    Ok((seconds, ranks[0]))
}

/// Runs the suite: `--steps` optimizer steps per run (default 200), `--batch-size` per worker.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String>
where
    I::Device: Default,
{
    let (train, test) = digits::load().map_err(|e| e.to_string())?.split(0.2, 0);
    let mut rows = Vec::new();
    let diloco = DiLoCoConfig {
        sync_every: 50,
        ..Default::default()
    };
    let streaming = |outer_dtype| DiLoCoConfig {
        fragments: 5,
        delay: 5,
        outer_dtype,
        ..diloco.clone()
    };
    let runs = [
        ("ddp", "ddp", diloco.clone()),
        ("local-sgd K=8", "local-sgd", diloco.clone()),
        ("diloco H=50", "diloco", diloco.clone()),
        (
            "streaming H=50 P=5 tau=5 f32",
            "diloco",
            streaming(OuterDtype::F32),
        ),
        (
            "streaming H=50 P=5 tau=5 int8",
            "diloco",
            streaming(OuterDtype::Int8),
        ),
    ];
    let workers_counts = [2, 4];
    let total = workers_counts.len() * runs.len();
    let mut progress = super::progress::Progress::new("localsgd", total);
    for workers in workers_counts {
        for (name, strategy, diloco) in runs.clone() {
            progress.next(format!("{workers} workers: {name}"));
            let (seconds, (sent, loss, accuracy)) =
                run::<I>(strategy, diloco, workers, o, &train, &test)?;
            rows.push(Row {
                strategy: name.into(),
                workers,
                optimizer_steps: o.steps,
                seconds,
                mib_sent_per_rank: sent as f64 / (1 << 20) as f64,
                final_loss: loss,
                test_accuracy: accuracy,
            });
        }
    }
    let mut md = format!(
        "Local SGD and DiLoCo vs DDP, backend `{}`, ViT (demos default) on the digits, AdamW, \
         {} optimizer steps, batch {} per worker, in-process workers behind a slow link \
         ({} ms latency per collective, {:.0} MB/s).\n\n| strategy | workers | wall s | MiB sent \
         per rank | final train loss (rank 0) | test accuracy |\n|---|---|---|---|---|---|\n",
        o.backend,
        o.steps,
        o.batch_size,
        LATENCY.as_millis(),
        BYTES_PER_SECOND / 1e6
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.4} | {:.2}% |",
            r.strategy,
            r.workers,
            r.seconds,
            r.mib_sent_per_rank,
            r.final_loss,
            100.0 * r.test_accuracy
        );
    }
    super::write_report(o, "localsgd", &rows, &md)
}
