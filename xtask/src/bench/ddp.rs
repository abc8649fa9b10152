//! The DDP suite: throughput of 1 vs 2 in-process CPU workers at the same global batch (DDP
//! and FSDP), the gradient all-reduce's size and time, values communicated per step, and
//! per-rank training-state bytes for DDP, zero-1 and FSDP next to ZeRO's formulas. Writes
//! `bench-results/ddp-<backend>.{json,md}`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use afterburner::parallel::{AutoWrapPolicy, OptimizerSharding, ShardLayout};
use afterburner::{
    AccelerateError, Accelerator, AcceleratorConfig, CheckpointPolicy, FsdpConfig, StrategyConfig,
};
use afterburner_demos::models::{Vit, VitConfig};
use afterburner_demos::{ImageBatch, digits};
use burn::backend::Autodiff;
use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde::Serialize;

use super::Options;

#[derive(Debug, Clone, Serialize)]
struct Row {
    scenario: String,
    value: f64,
    unit: String,
}

fn vit<B: Backend>(device: &B::Device) -> Vit<B> {
    VitConfig::new()
        .with_d_model(128)
        .with_d_ff(256)
        .with_n_layers(6)
        .init(device)
}

/// The FSDP units of the bench model: one per transformer block, plus the root.
fn fsdp_units() -> AutoWrapPolicy {
    AutoWrapPolicy::Modules(vec!["TransformerEncoderLayer".into()])
}

/// What one timed run measured.
struct Timing {
    /// Mean time per optimizer step (slowest rank).
    step: Duration,
    /// Rank 0's gradient all-reduces per optimizer step.
    all_reduces: f64,
    /// Rank 0's values gathered + reduce-scattered per optimizer step (FSDP).
    fsdp_values: f64,
    /// Median over the timed steps of the process's peak live heap (every worker) during the
    /// step, as rank 0 sees it: steps where the workers' phases happen to coincide or not
    /// do not decide it.
    peak_heap: usize,
}

/// Times `workers` ranks under `strategy` sharing a global batch of `2 x batch_size`.
fn step_time<I: Backend>(
    o: &Options,
    workers: usize,
    strategy: &'static str,
    checkpointing: CheckpointPolicy,
) -> Result<Timing, String> {
    type Ad<I> = Autodiff<I>;
    let device = I::Device::default();
    let config = AcceleratorConfig {
        gradient_checkpointing: checkpointing,
        seed: 0,
        parallelism: afterburner::ParallelismConfig {
            strategy: match strategy
                .parse()
                .map_err(|e: AccelerateError| e.to_string())?
            {
                StrategyConfig::Fsdp(_) => StrategyConfig::Fsdp(FsdpConfig {
                    auto_wrap_policy: fsdp_units(),
                    ..Default::default()
                }),
                other => other,
            },
            ..Default::default()
        },
        ..Default::default()
    };
    I::seed(&device, 0);
    let model = vit::<Ad<I>>(&device);
    let data = digits::load().map_err(|e| e.to_string())?;
    let per_rank = 2 * o.batch_size / workers;
    let (steps, warmup) = (o.steps, o.warmup);
    type Measured = (Duration, f64, f64, usize);
    let run = move |mut acc: Accelerator<Ad<I>>| -> Result<Measured, AccelerateError> {
        let (mut model, mut optim) = acc.setup(model.clone(), AdamWConfig::new().init())?;
        let items = data.items();
        let mine: Vec<_> = afterburner::parallel::shard(
            (0..items.len()).collect(),
            acc.rank(),
            acc.world_size(),
            false,
        );
        let batches: Vec<ImageBatch<Ad<I>>> = mine
            .chunks_exact(per_rank)
            .take(4)
            .map(|c| {
                let c = c.iter().map(|&i| items[i].clone()).collect();
                data.batcher().batch(c, acc.device())
            })
            .collect();
        let loss_fn = CrossEntropyLossConfig::new().init(acc.device());
        let mut start = Instant::now();
        let mut peaks = Vec::with_capacity(steps);
        for i in 0..warmup + steps {
            if i == warmup {
                acc.barrier()?;
                start = Instant::now();
            }
            let measured = i >= warmup && acc.is_main_process();
            if measured {
                crate::alloc::reset_peak();
            }
            let batch = &batches[i % batches.len()];
            let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
            acc.backward(loss_fn.forward(logits, batch.labels.clone()), &model)?;
            model = acc.step(model, &mut optim, &mut 1e-3)?;
            if measured {
                peaks.push(crate::alloc::peak());
            }
        }
        peaks.sort_unstable();
        <Ad<I> as Backend>::sync(acc.device()).ok();
        let steps_taken = acc.counters().optimizer_steps.max(1) as f64;
        let moved = acc.fsdp().map_or(0, |f| f.values_moved()) as f64;
        Ok((
            start.elapsed() / steps as u32,
            acc.gradient_all_reduces() as f64 / steps_taken,
            moved / steps_taken,
            peaks.get(peaks.len() / 2).copied().unwrap_or(0),
        ))
    };
    let times = if workers > 1 {
        // One worker per device where the backend has several (GPUs), else sharing it.
        let devices =
            afterburner::parallel::local_devices::<I>(workers).map_err(|e| e.to_string())?;
        Accelerator::<Ad<I>>::launch(config, devices, run)
    } else {
        Accelerator::<Ad<I>>::new(config, device)
            .and_then(run)
            .map(|t| vec![t])
    }
    .map_err(|e| e.to_string())?;
    let slowest = times.iter().map(|t| t.0).max().unwrap_or_default();
    Ok(Timing {
        step: slowest,
        all_reduces: times.first().map_or(0.0, |t| t.1),
        fsdp_values: times.first().map_or(0.0, |t| t.2),
        peak_heap: times.first().map_or(0, |t| t.3),
    })
}

/// Per-rank bytes of f32 parameters, gradients and AdamW state (two values per parameter) when
/// `world` ranks split the optimizer state as `strategy = "zero-1"` does (`world = 1`: DDP).
fn state_bytes_per_rank<I: Backend>(world: usize) -> usize {
    let model = vit::<Autodiff<I>>(&Default::default());
    let most_owned = (0..world)
        .map(|rank| OptimizerSharding::new(&model, rank, world).owned_values())
        .max()
        .unwrap_or(0);
    let params = model.num_params();
    4 * params + 4 * params + 8 * most_owned
}

/// Per-rank bytes of f32 parameters, gradients and AdamW state under FSDP `full` at `world`
/// ranks (the largest rank: every rank keeps the same padded chunks), from the real layout.
fn fsdp_bytes_per_rank<I: Backend>(world: usize) -> usize {
    let model = vit::<I>(&Default::default());
    let local = ShardLayout::new(&model, &fsdp_units(), 0, world).local_elements();
    16 * local
}

/// Mean time of an all-reduce of `len` f32 across 2 in-process workers.
fn all_reduce_time<I: Backend>(len: usize, reps: usize) -> Result<Duration, String> {
    super::bandwidth::all_reduce_seconds::<I>(2, len, reps).map(Duration::from_secs_f64)
}

/// Runs the suite on the inner backend `I`.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String> {
    let params = vit::<I>(&Default::default()).num_params();
    let tensors = {
        let mut n = 0;
        struct Count<'a>(&'a mut usize);
        impl<B: Backend> burn::module::ModuleVisitor<B> for Count<'_> {
            fn visit_float<const D: usize>(&mut self, _: &burn::module::Param<Tensor<B, D>>) {
                *self.0 += 1;
            }
        }
        vit::<I>(&Default::default()).visit(&mut Count(&mut n));
        n
    };
    // Single device, DDP and FSDP on 2 workers, then both with activation checkpointing
    // (under which FSDP also frees each unit's gathered parameters after its forward); the
    // order alternates between rounds.
    let (none, all) = (CheckpointPolicy::None, CheckpointPolicy::All);
    let runs = [
        (1, "single-device", none),
        (2, "ddp", none),
        (2, "fsdp", none),
        (2, "ddp", all),
        (2, "fsdp", all),
    ];
    let mut best = [Duration::MAX; 5];
    let mut peak = [0usize; 5];
    let (mut all_reduces_per_step, mut fsdp_values) = (f64::NAN, f64::NAN);
    let mut progress = super::progress::Progress::new("ddp", o.rounds * runs.len());
    for round in 0..o.rounds {
        for k in 0..runs.len() {
            let i = if round % 2 == 0 {
                k
            } else {
                runs.len() - 1 - k
            };
            let (workers, strategy, checkpointing) = runs[i];
            progress.next(format!(
                "round {}/{}: {workers} worker(s), {strategy}, checkpointing {checkpointing}",
                round + 1,
                o.rounds
            ));
            let t = step_time::<I>(o, workers, strategy, checkpointing)?;
            best[i] = best[i].min(t.step);
            peak[i] = if round == 0 {
                t.peak_heap
            } else {
                peak[i].min(t.peak_heap)
            };
            match (strategy, checkpointing) {
                ("ddp", CheckpointPolicy::None) => all_reduces_per_step = t.all_reduces,
                ("fsdp", CheckpointPolicy::None) => fsdp_values = t.fsdp_values,
                _ => {}
            }
        }
    }
    let reduce = all_reduce_time::<I>(params + tensors, 20)?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    let bytes_per_step = ((params + tensors) * 4) as f64;
    let rows = vec![
        row("1 worker, batch 2b: ms/step", ms(best[0]), "ms"),
        row("2 workers, batch b each: ms/step", ms(best[1]), "ms"),
        row(
            "2 workers: speed vs 1 worker",
            ms(best[0]) / ms(best[1]),
            "x",
        ),
        row(
            "2 workers, fsdp full (unit per block): ms/step",
            ms(best[2]),
            "ms",
        ),
        row(
            "fsdp full vs ddp, 2 workers: time",
            ms(best[2]) / ms(best[1]),
            "x",
        ),
        row(
            "2 workers, ddp + checkpointing all: ms/step",
            ms(best[3]),
            "ms",
        ),
        row(
            "2 workers, fsdp full + checkpointing all (reshard after forward): ms/step",
            ms(best[4]),
            "ms",
        ),
        row(
            "median per-step peak live heap, 2 workers, ddp",
            mib(peak[1]),
            "MiB",
        ),
        row(
            "median per-step peak live heap, 2 workers, fsdp full",
            mib(peak[2]),
            "MiB",
        ),
        row(
            "median per-step peak live heap, 2 workers, ddp + checkpointing all",
            mib(peak[3]),
            "MiB",
        ),
        row(
            "median per-step peak live heap, 2 workers, fsdp full + checkpointing all",
            mib(peak[4]),
            "MiB",
        ),
        row(
            "gradient all-reduces per optimizer step (counted, 2 workers)",
            all_reduces_per_step,
            "count",
        ),
        row(
            "bytes all-reduced per step (f32 grads + flags)",
            bytes_per_step,
            "B",
        ),
        row(
            "all_reduce of one step's gradients, 2 workers (burn-collective)",
            ms(reduce),
            "ms",
        ),
        row(
            "fsdp full, 2 workers: bytes gathered + reduce-scattered per step (f32, counted)",
            4.0 * fsdp_values,
            "B",
        ),
        row(
            "per-rank f32 params + grads + AdamW state, DDP",
            state_bytes_per_rank::<I>(1) as f64,
            "B",
        ),
        row(
            "same, zero-1 at 2 ranks (largest rank's share)",
            state_bytes_per_rank::<I>(2) as f64,
            "B",
        ),
        row(
            "same, zero-1 at 4 ranks (largest rank's share)",
            state_bytes_per_rank::<I>(4) as f64,
            "B",
        ),
        row(
            "same, fsdp full at 2 ranks (padded shards)",
            fsdp_bytes_per_rank::<I>(2) as f64,
            "B",
        ),
        row(
            "same, fsdp full at 4 ranks (padded shards)",
            fsdp_bytes_per_rank::<I>(4) as f64,
            "B",
        ),
        row(
            "ZeRO formula 16 B/param (DDP; = 4+4+8 in f32 here)",
            16.0 * params as f64,
            "B",
        ),
        row(
            "ZeRO-3 formula 16 B/param / N, N = 2",
            16.0 * params as f64 / 2.0,
            "B",
        ),
        row(
            "ZeRO-3 formula 16 B/param / N, N = 4",
            16.0 * params as f64 / 4.0,
            "B",
        ),
    ];
    let rows = with_mpi_all_reduce(rows, params + tensors)?;
    let rows = with_engines_and_overlap(rows, params + tensors, o)?;
    let rows = with_fsdp_traffic(rows)?;
    let mut md = format!(
        "DDP, backend `{}`, ViT (6 blocks, d_model 128; {params} parameters in {tensors} tensors), \
         AdamW, global batch {}, {} timed steps after {} warm-up, best of {} rounds. Workers are \
         threads of one process sharing the CPU cores.\n\n| measure | value | unit |\n|---|---|---|\n",
        o.backend,
        2 * o.batch_size,
        o.steps,
        o.warmup,
        o.rounds
    );
    for r in &rows {
        // Bytes and counts are whole numbers: no decimals for them.
        let value = match r.unit.as_str() {
            "B" | "count" if r.value.fract() == 0.0 => format!("{:.0}", r.value),
            _ => format!("{:.3}", r.value),
        };
        let _ = writeln!(md, "| {} | {value} | {} |", r.scenario, r.unit);
    }
    super::write_report(o, "ddp", &rows, &md)
}

/// Adds the MPI engine's all-reduce time of `len` values after burn-collective's (feature
/// `mpi`; needs Open MPI).
#[cfg(all(feature = "mpi", feature = "flex"))]
fn with_mpi_all_reduce(mut rows: Vec<Row>, len: usize) -> Result<Vec<Row>, String> {
    let time = super::mpi::all_reduce_time(2, len, 20)?;
    let at = rows
        .iter()
        .position(|r| r.scenario.contains("burn-collective"))
        .map_or(rows.len(), |i| i + 1);
    rows.insert(
        at,
        row(
            "all_reduce of one step's gradients, 2 MPI processes on loopback (Open MPI, TCP)",
            time.as_secs_f64() * 1e3,
            "ms",
        ),
    );
    Ok(rows)
}

/// Without the `mpi` feature there is no MPI row.
#[cfg(not(all(feature = "mpi", feature = "flex")))]
fn with_mpi_all_reduce(rows: Vec<Row>, _len: usize) -> Result<Vec<Row>, String> {
    Ok(rows)
}

/// The rows of the engines between processes and of DDP's overlap (engines.rs, overlap.rs).
#[cfg(feature = "flex")]
fn with_engines_and_overlap(rows: Vec<Row>, len: usize, o: &Options) -> Result<Vec<Row>, String> {
    let mut rows = rows;
    let measured = [
        super::engines::rows(len, o.quick)?,
        super::overlap::rows(o.steps.max(3), o.warmup.max(1))?,
        super::overlap_processes::rows(o.steps.max(5), o.warmup.max(2))?,
    ];
    for (scenario, value, unit) in measured.into_iter().flatten() {
        rows.push(row(&scenario, value, unit));
    }
    Ok(rows)
}

/// These rows need the CPU backend.
#[cfg(not(feature = "flex"))]
fn with_engines_and_overlap(rows: Vec<Row>, _: usize, _: &Options) -> Result<Vec<Row>, String> {
    Ok(rows)
}

/// What the engine receives per FSDP step, by collective, in-process and (feature `mpi`)
/// over MPI: the same values either way.
#[cfg(feature = "flex")]
fn with_fsdp_traffic(mut rows: Vec<Row>) -> Result<Vec<Row>, String> {
    use super::traffic::{self, Traffic};
    let engines: Vec<(&str, Traffic)> = [("in-process", traffic::in_process()?)]
        .into_iter()
        .chain(traffic::over_mpi()?.map(|t| ("MPI", t)))
        .collect();
    let per_step = |v: u64| v as f64 / traffic::STEPS as f64;
    for (engine, t) in engines {
        for (kind, values) in [
            ("all_gather", t.all_gather),
            ("reduce_scatter", t.reduce_scatter),
            ("all_reduce", t.all_reduce),
            ("broadcast", t.broadcast),
        ] {
            rows.push(row(
                &format!(
                    "FSDP step (small ViT, 2 ranks), values rank 0 hands the {engine} engine's \
                     {kind}"
                ),
                per_step(values),
                "values/step",
            ));
        }
    }
    Ok(rows)
}

/// The traffic rows need the CPU backend.
#[cfg(not(feature = "flex"))]
fn with_fsdp_traffic(rows: Vec<Row>) -> Result<Vec<Row>, String> {
    Ok(rows)
}

fn row(scenario: &str, value: f64, unit: &str) -> Row {
    Row {
        scenario: scenario.into(),
        value,
        unit: unit.into(),
    }
}
