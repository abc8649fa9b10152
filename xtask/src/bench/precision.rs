//! The precision suite: the small ViT for a fixed number of steps under each precision, next
//! to the plain Burn loop, in one run. Reports steps/s, ms per step, the host reads and syncs
//! each step makes on all its threads and on its own (counted by `Autocast` in a short second
//! run of the same loop on
//! `Autodiff<Autocast<I>>`: on a GPU each one drains the queue), ratios, peak memory and final
//! loss, and writes `bench-results/precision-<backend>.{json,md}`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use afterburner::trainer::{DeviceAdamW, DeviceAdamWConfig, HfSchedule, SchedulerType};
use afterburner::{
    Accelerator, AcceleratorConfig, Autocast, NonFinitePolicy, Precision, host_reads_counted,
    host_reads_on_this_thread,
};
use afterburner_demos::models::VitConfig;
use afterburner_demos::{ImageBatch, digits};
use burn::backend::Autodiff;
use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::Serialize;

use super::plot::Chart;
use super::{Options, start_timing};
use crate::alloc;

#[derive(Debug, Clone, Serialize)]
struct Row {
    scenario: String,
    precision: String,
    steps_per_s: f64,
    ms_per_step: f64,
    /// Device-to-host reads and syncs per training step, counted through `Autocast` on every
    /// thread of the step (the recompute helper's too).
    host_reads_per_step: f64,
    /// The same, on the step's own thread only.
    host_reads_per_step_on_its_thread: f64,
    /// Throughput relative to the Accelerator at 32-true.
    speed_vs_32_true: f64,
    /// Peak live heap bytes during the timed steps (CPU backends; counting allocator).
    peak_mib: f64,
    final_loss: f64,
}

/// Fixed batches (data loading is not timed).
fn batches<B: AutodiffBackend>(
    o: &Options,
    device: &B::Device,
) -> Result<Vec<ImageBatch<B>>, String> {
    let data = digits::load().map_err(|e| e.to_string())?;
    Ok(data
        .items()
        .chunks_exact(o.batch_size)
        .map(|c| data.batcher().batch(c.to_vec(), device))
        .collect())
}

/// One measured run: (timed duration, peak bytes, final loss, host reads in the timed steps:
/// on every thread of the step, on its own thread).
type Measured = (Duration, usize, f64, (u64, u64));

/// Host reads counted so far: on this thread and its helpers, on this thread alone.
fn reads_now() -> (u64, u64) {
    (host_reads_counted(), host_reads_on_this_thread())
}

/// Host reads since `before` (a [`reads_now`]).
fn reads_since(before: (u64, u64)) -> (u64, u64) {
    let now = reads_now();
    (now.0 - before.0, now.1 - before.1)
}

fn plain<B: AutodiffBackend>(o: &Options, data: &[ImageBatch<B>], device: &B::Device) -> Measured {
    B::seed(device, 0);
    let mut model = VitConfig::new().init::<B>(device);
    let mut optim = AdamWConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut start = Instant::now();
    let mut reads = reads_now();
    let mut last = None;
    for i in 0..o.warmup + o.steps {
        if i == o.warmup {
            start = start_timing::<B>(device);
            reads = reads_now();
        }
        let batch = &data[i % data.len()];
        let loss = loss_fn.forward(model.forward(batch.images.clone()), batch.labels.clone());
        last = Some(loss.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
    // Counted before the sync that ends the timing (a sync counts as a read).
    let reads = reads_since(reads);
    B::sync(device).ok();
    let elapsed = start.elapsed();
    (elapsed, alloc::peak(), read_loss(last), reads)
}

/// The last step's loss, read after the timed steps.
fn read_loss<B: AutodiffBackend>(loss: Option<burn::tensor::Tensor<B, 1>>) -> f64 {
    loss.map_or(f64::NAN, |loss| loss.into_scalar().elem::<f64>())
}

/// How an Accelerator scenario steps: Burn's AdamW through `step` (the host decides skips and
/// clipping), or `DeviceAdamW` (the device decides; no host read per step).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stepper {
    BurnAdamW,
    DeviceAdamW,
}

/// One Accelerator scenario.
type Scenario = (Precision, NonFinitePolicy, Stepper);

fn accelerated<B: AutodiffBackend>(
    o: &Options,
    (precision, guard, stepper): Scenario,
    data: &[ImageBatch<B>],
    device: &B::Device,
) -> Result<Measured, String> {
    let config = AcceleratorConfig {
        precision,
        seed: 0,
        nonfinite_gradients: guard,
        ..Default::default()
    };
    let mut acc = Accelerator::<B>::new(config, device.clone()).map_err(|e| e.to_string())?;
    let model = VitConfig::new().init::<B>(device);
    let (mut model, mut optim) = acc
        .setup(model, AdamWConfig::new().init())
        .map_err(|e| e.to_string())?;
    // The same AdamW (Burn's defaults) at the same constant rate, stepped on the device.
    let constant = HfSchedule::new(SchedulerType::Constant, 1e-3, 0, o.warmup + o.steps);
    let mut on_device = DeviceAdamW::new(DeviceAdamWConfig::default(), constant);
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut lr = 1e-3;
    let mut start = Instant::now();
    let mut reads = reads_now();
    let mut last = None;
    for i in 0..o.warmup + o.steps {
        if i == o.warmup {
            start = start_timing::<B>(device);
            reads = reads_now();
        }
        let batch = &data[i % data.len()];
        let logits = acc
            .forward(&model, batch.images.clone(), |m, x| m.forward(x))
            .map_err(|e| e.to_string())?;
        let loss = loss_fn.forward(logits, batch.labels.clone());
        last = Some(loss.clone());
        acc.backward(loss, &model).map_err(|e| e.to_string())?;
        model = match stepper {
            Stepper::BurnAdamW => acc.step(model, &mut optim, &mut lr),
            Stepper::DeviceAdamW => on_device.step(&mut acc, model),
        }
        .map_err(|e| e.to_string())?;
    }
    // Counted before the sync that ends the timing (a sync counts as a read).
    let reads = reads_since(reads);
    B::sync(device).ok();
    let elapsed = start.elapsed();
    Ok((elapsed, alloc::peak(), read_loss(last), reads))
}

/// Host reads per step of each scenario (index as in `bench`): a few steps of the same loops
/// on `Autodiff<Autocast<I>>`, whose reads `Autocast` counts.
fn reads_per_step<I: Backend>(
    o: &Options,
    precisions: &[Scenario],
) -> Result<Vec<(f64, f64)>, String> {
    type Counted<I> = Autodiff<Autocast<I>>;
    let device = Default::default();
    let data = batches::<Counted<I>>(o, &device)?;
    let short = Options {
        steps: 3,
        warmup: 1,
        ..o.clone()
    };
    let steps = short.steps as f64;
    let per_step = |m: Measured| (m.3.0 as f64 / steps, m.3.1 as f64 / steps);
    let mut reads = vec![per_step(plain::<Counted<I>>(&short, &data, &device))];
    for &setting in precisions {
        let measured = accelerated::<Counted<I>>(&short, setting, &data, &device);
        reads.push(measured.map_or((f64::NAN, f64::NAN), per_step));
    }
    Ok(reads)
}

/// Runs the suite on `Autodiff<I>`.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String> {
    type B<I> = Autodiff<I>;
    let device = Default::default();
    let data = batches::<B<I>>(o, &device)?;
    // The default non-finite guard, 32-true without it ("apply") to show its cost, and the
    // guard decided on the device (DeviceAdamW) to show that side by side.
    let skip = NonFinitePolicy::Skip;
    let burn = Stepper::BurnAdamW;
    let precisions = [
        (Precision::Full32, skip, burn),
        (Precision::Bf16Mixed, skip, burn),
        (Precision::F16Mixed, skip, burn),
        (Precision::Bf16True, skip, burn),
        (Precision::Full32, NonFinitePolicy::Apply, burn),
        (Precision::Full32, skip, Stepper::DeviceAdamW),
    ];
    // scenario 0 = plain Burn; 1.. = Accelerator per precision. Best time over rounds.
    let n = precisions.len() + 1;
    let mut best: Vec<Option<Measured>> = vec![None; n];
    let mut progress = super::progress::Progress::new("precision", o.rounds * n);
    for round in 0..o.rounds {
        for k in 0..n {
            // Alternate the order each round so drift does not favour one scenario.
            let s = if round % 2 == 0 { k } else { n - 1 - k };
            let name = if s == 0 {
                "plain Burn loop".to_string()
            } else {
                format!("Accelerator {}", precisions[s - 1].0)
            };
            progress.next(format!("round {}/{}: {name}", round + 1, o.rounds));
            let m = if s == 0 {
                plain::<B<I>>(o, &data, &device)
            } else {
                match accelerated::<B<I>>(o, precisions[s - 1], &data, &device) {
                    Ok(m) => m,
                    Err(e) => {
                        eprintln!("{}: skipped ({e})", precisions[s - 1].0);
                        continue;
                    }
                }
            };
            best[s] = Some(match best[s] {
                Some(b) if b.0 <= m.0 => (b.0, b.1.max(m.1), b.2, b.3),
                Some(b) => (m.0, b.1.max(m.1), m.2, m.3),
                None => m,
            });
        }
    }
    let reads = reads_per_step::<I>(o, &precisions)?;
    let rate = |m: &Measured| o.steps as f64 / m.0.as_secs_f64();
    let base = best[1].as_ref().map(rate).unwrap_or(f64::NAN);
    let rows: Vec<Row> = best
        .iter()
        .enumerate()
        .filter_map(|(s, m)| {
            let m = m.as_ref()?;
            Some(Row {
                scenario: match s {
                    0 => "plain Burn loop".into(),
                    _ if precisions[s - 1].1 == NonFinitePolicy::Apply => {
                        "Accelerator, no non-finite guard".into()
                    }
                    _ if precisions[s - 1].2 == Stepper::DeviceAdamW => {
                        "Accelerator, DeviceAdamW (skip decided on the device)".into()
                    }
                    _ => "Accelerator".into(),
                },
                precision: match s {
                    0 => "32-true".into(),
                    _ => precisions[s - 1].0.to_string(),
                },
                steps_per_s: rate(m),
                ms_per_step: 1e3 / rate(m),
                host_reads_per_step: reads[s].0,
                host_reads_per_step_on_its_thread: reads[s].1,
                speed_vs_32_true: rate(m) / base,
                peak_mib: m.1 as f64 / (1024.0 * 1024.0),
                final_loss: m.2,
            })
        })
        .collect();
    write_results(o, &rows)
}

fn write_results(o: &Options, rows: &[Row]) -> Result<(), String> {
    let mut md = format!(
        "ViT (d_model 64, 2 blocks, 16 patches) on 8x8 digits, backend `{}`, batch {}, {} timed steps \
         after {} warm-up, best of {} rounds.\n\n\
         | scenario | precision | steps/s | ms/step | host reads/step (on its thread) | speed vs Accelerator 32-true | peak MiB | final loss |\n\
         |---|---|---|---|---|---|---|---|\n",
        o.backend, o.batch_size, o.steps, o.warmup, o.rounds
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {} ({}) | {:.3} | {:.1} | {:.4} |",
            r.scenario,
            r.precision,
            r.steps_per_s,
            r.ms_per_step,
            r.host_reads_per_step,
            r.host_reads_per_step_on_its_thread,
            r.speed_vs_32_true,
            r.peak_mib,
            r.final_loss
        );
    }
    if let (Some(plain), Some(acc)) = (rows.first(), rows.get(1)) {
        let _ = writeln!(
            md,
            "\nAccelerator overhead at 32-true vs the plain loop: {:+.2}% time per step.",
            (plain.steps_per_s / acc.steps_per_s - 1.0) * 100.0
        );
    }
    if let (Some(guarded), Some(unguarded)) = (
        rows.get(1),
        rows.iter().find(|r| r.scenario.contains("guard")),
    ) {
        let _ = writeln!(
            md,
            "The non-finite guard (a finiteness check of the gradients each step) costs {:+.2}% time per step \
             at 32-true.",
            (unguarded.steps_per_s / guarded.steps_per_s - 1.0) * 100.0
        );
    }
    if let (Some(host), Some(device)) = (
        rows.get(1),
        rows.iter().find(|r| r.scenario.contains("DeviceAdamW")),
    ) {
        let _ = writeln!(
            md,
            "Deciding the guard on the device (DeviceAdamW, {} host reads/step vs {}) costs {:+.2}% \
             time per step at 32-true here (a CPU, where a read costs nothing; a GPU's queue no \
             longer drains).",
            device.host_reads_per_step,
            host.host_reads_per_step,
            (host.steps_per_s / device.steps_per_s - 1.0) * 100.0
        );
    }
    let label = |r: &Row| format!("{} {}", r.scenario, r.precision);
    let series = |f: fn(&Row) -> f64| rows.iter().map(|r| (label(r), f(r))).collect();
    let charts = [
        Chart::new(
            "throughput",
            "Small ViT: throughput",
            "steps/s",
            series(|r| r.steps_per_s),
        ),
        Chart::new(
            "memory",
            "Small ViT: peak heap",
            "MiB",
            series(|r| r.peak_mib),
        ),
        Chart::new(
            "loss",
            "Small ViT: final loss",
            "cross-entropy",
            series(|r| r.final_loss),
        ),
    ];
    let md = super::with_charts(o, "precision", &md, &charts)?;
    super::write_report(o, "precision", rows, &md)
}
