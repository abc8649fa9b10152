//! The faults suite: DiLoCo (H = 50) on 4 in-process workers over a fault-tolerant quorum
//! group (a `Lighthouse`), behind the localsgd suite's slow link, twice: without faults, and
//! with worker 3 failing in round 2 and restarting in round 3 (healed from a live worker,
//! back in the outer steps from round 4). Wall time, bytes worker 0 sent, the rounds each run
//! had all 4 workers, final training loss and test accuracy on the built-in digits. Writes
//! `bench-results/faults-<backend>.*`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use afterburner::localsgd::DiLoCoConfig;
use afterburner::parallel::{Lighthouse, LocalReplicas, ProcessGroup, QuorumConfig, SlowLink};
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

/// The link every collective pays for (the localsgd suite's).
const LATENCY: Duration = Duration::from_millis(5);
const BYTES_PER_SECOND: f64 = 25e6;
const WORKERS: usize = 4;
/// Inner steps per round.
const H: u64 = 50;

#[derive(Debug, Clone, Serialize)]
struct Row {
    run: String,
    /// Which of the runs of this scenario (from 1).
    repeat: usize,
    workers: usize,
    optimizer_steps: usize,
    seconds: f64,
    mib_sent_worker0: f64,
    /// Outer steps worker 0 took with every worker present.
    full_rounds: usize,
    /// Outer steps worker 0 took in all.
    rounds: usize,
    /// The step the restarted worker continued after (0 without a fault).
    rejoined_after_step: u64,
    /// The live state a worker sent the restarted one (parameters, AdamW state, DiLoCo's).
    mib_live_state: f64,
    final_loss: f64,
    test_accuracy: f64,
}

/// What a worker measured: bytes sent, members per round, the step it started after, its last
/// training loss, the test accuracy.
struct WorkerResult {
    sent: u64,
    members: Vec<usize>,
    start: u64,
    loss: f64,
    accuracy: f64,
}

/// When worker 3 fails and when it comes back: (fail at step, restart once worker 0 passed
/// this step).
type Fault = (u64, u64);

struct Shared<I: Backend> {
    lighthouse: Arc<Lighthouse>,
    model: afterburner_demos::models::Vit<Autodiff<I>>,
    train: ImageDataset,
    test: ImageDataset,
    steps: u64,
    batch: usize,
    /// Worker 0's optimizer steps so far (when to restart the failed worker).
    progress: AtomicU64,
}

fn worker<I: Backend>(
    shared: &Shared<I>,
    id: usize,
    fail_at: Option<u64>,
) -> Result<WorkerResult, AccelerateError>
where
    I::Device: Default,
{
    type Ad<I> = Autodiff<I>;
    let config = AcceleratorConfig::default().with_strategy(StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: H as usize,
        ..Default::default()
    }));
    let device = I::Device::default();
    let group = shared.lighthouse.replica::<I>(id, &device)?;
    let quorum = group.quorum();
    let link = SlowLink::new(group, LATENCY, BYTES_PER_SECOND);
    let sent = link.bytes_sent();
    let mut acc = Accelerator::<Ad<I>>::with_group(config, device.clone(), Box::new(link))?;
    let (mut model, mut optim) = acc.join(shared.model.clone(), AdamWConfig::new().init())?;
    let start = acc.counters().optimizer_steps;
    let loader = acc.dataloader(shared.train.clone(), shared.train.batcher(), shared.batch)?;
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (mut last, mut members, mut seen) = (f64::NAN, Vec::new(), 0u64);
    'training: for epoch in 0.. {
        for b in loader.epoch(epoch) {
            seen += 1;
            if seen <= start {
                continue; // a restarted worker continues where the live ones are
            }
            if fail_at == Some(seen) {
                return Err(AccelerateError::BadData(
                    "worker 3 fails (the bench)".into(),
                ));
            }
            let logits = acc.forward(&model, b.images, |m, x| m.forward(x))?;
            let loss = loss_fn.forward(logits, b.labels);
            last = loss.clone().into_scalar().elem::<f64>();
            acc.backward(loss, &model)?;
            model = acc.step(model, &mut optim, &mut 2e-3)?;
            let step = acc.counters().optimizer_steps;
            if id == 0 {
                shared.progress.store(step, Ordering::SeqCst);
            }
            if step.is_multiple_of(H) {
                members.push(quorum.as_ref().map_or(0, |q| q.members().len()));
            }
            if step == shared.steps {
                break 'training;
            }
        }
    }
    let model = acc.finish(model)?;
    let all = shared
        .test
        .batcher()
        .batch(shared.test.items().to_vec(), &device);
    let logits = acc.forward(&model, all.images, |m, x| m.forward(x))?;
    let hits = logits.argmax(1).reshape([-1]).equal(all.labels).float();
    Ok(WorkerResult {
        sent: sent.load(Ordering::Relaxed),
        members,
        start,
        loss: last,
        accuracy: hits.mean().into_scalar().elem::<f64>(),
    })
}

/// One run: 4 workers, and with `fault` worker 3 failing and restarting. Returns the wall
/// time, worker 0's result and the step the restarted worker continued after.
fn run<I: Backend>(
    o: &Options,
    train: &ImageDataset,
    test: &ImageDataset,
    fault: Option<Fault>,
) -> Result<(f64, WorkerResult, u64, u64), String>
where
    I::Device: Default,
{
    let device = I::Device::default();
    Autodiff::<I>::seed(&device, 0);
    let quorum = QuorumConfig::new(WORKERS).with_join_timeout(Duration::from_secs(3600));
    let shared = Arc::new(Shared::<I> {
        lighthouse: Lighthouse::new(quorum).map_err(|e| e.to_string())?,
        model: VitConfig::new().init::<Autodiff<I>>(&device),
        train: train.clone(),
        test: test.clone(),
        steps: o.steps as u64,
        batch: o.batch_size,
        progress: AtomicU64::new(0),
    });
    let start = Instant::now();
    let mut workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let shared = shared.clone();
            let fail_at = fault.filter(|_| id == WORKERS - 1).map(|(at, _)| at);
            std::thread::spawn(move || worker(&shared, id, fail_at))
        })
        .collect();
    let mut rejoined_after = 0;
    if let Some((_, restart_after)) = fault {
        let failing = workers.pop().ok_or("no workers")?;
        if failing.join().map_err(|_| "worker 3 panicked")?.is_ok() {
            return Err("worker 3 was to fail but finished".into());
        }
        // Restarted once worker 0 is past `restart_after`.
        while shared.progress.load(Ordering::SeqCst) < restart_after {
            std::thread::sleep(Duration::from_millis(20));
        }
        let shared = shared.clone();
        workers.push(std::thread::spawn(move || {
            worker(&shared, WORKERS - 1, None)
        }));
    }
    let mut results = Vec::new();
    for (id, handle) in workers.into_iter().enumerate() {
        let result = handle.join().map_err(|_| format!("worker {id} panicked"))?;
        results.push(result.map_err(|e| format!("worker {id}: {e}"))?);
    }
    if fault.is_some() {
        rejoined_after = results.last().map_or(0, |r| r.start);
    }
    let seconds = start.elapsed().as_secs_f64();
    let first = results.into_iter().next().ok_or("no worker finished")?;
    Ok((
        seconds,
        first,
        rejoined_after,
        shared.lighthouse.healing_bytes(),
    ))
}

/// Runs the suite: `--steps` optimizer steps per run (default 200), `--batch-size` per worker.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String>
where
    I::Device: Default,
{
    let (train, test) = digits::load().map_err(|e| e.to_string())?.split(0.2, 0);
    let steps = o.steps as u64;
    // At 200 steps: fails at step 61 (round 2), restarts past step 110 (round 3).
    let fault = (steps * 3 / 10 + 1, steps * 11 / 20);
    let runs = [
        ("no fault", None),
        ("worker 3 fails, restarts", Some(fault)),
    ];
    let repeats = o.rounds.max(1);
    let mut progress = super::progress::Progress::new("faults", runs.len() * repeats);
    let mut rows = Vec::new();
    for repeat in 1..=repeats {
        for (name, fault) in runs {
            progress.next(format!("{name}, run {repeat} of {repeats}"));
            let (seconds, first, rejoined, healing) = run::<I>(o, &train, &test, fault)?;
            rows.push(Row {
                run: name.into(),
                repeat,
                workers: WORKERS,
                optimizer_steps: o.steps,
                seconds,
                mib_sent_worker0: first.sent as f64 / (1 << 20) as f64,
                full_rounds: first.members.iter().filter(|m| **m == WORKERS).count(),
                rounds: first.members.len(),
                rejoined_after_step: rejoined,
                mib_live_state: healing as f64 / (1 << 20) as f64,
                final_loss: first.loss,
                test_accuracy: first.accuracy,
            });
        }
    }
    let mut md = format!(
        "Fault-tolerant DiLoCo (H = {H}) on {WORKERS} in-process workers over a lighthouse, \
         backend `{}`, ViT (demos default) on the digits, AdamW, {} optimizer steps, batch {} \
         per worker, behind a slow link ({} ms latency per collective, {:.0} MB/s), each run \
         {repeats} times (the worker threads share the backend's RNG, so runs differ). The \
         fault: worker 3 fails at step {}, restarts once worker 0 passed step {} and is healed \
         from a live worker. The workers share this machine's cores, so a run with a worker \
         down steps faster here: compare its wall time with care.\n\n| run | wall s (mean) | \
         MiB sent (worker 0) | rounds with all {WORKERS} | rejoined after step | live state \
         sent, MiB | test accuracy, mean (min-max) |\n|---|---|---|---|---|---|---|\n",
        o.backend,
        o.steps,
        o.batch_size,
        LATENCY.as_millis(),
        BYTES_PER_SECOND / 1e6,
        fault.0,
        fault.1,
    );
    for (name, _) in runs {
        let of: Vec<&Row> = rows.iter().filter(|r| r.run == name).collect();
        let mean = |f: fn(&Row) -> f64| of.iter().map(|r| f(r)).sum::<f64>() / of.len() as f64;
        let accuracy =
            |pick: fn(f64, f64) -> f64| of.iter().map(|r| r.test_accuracy).fold(f64::NAN, pick);
        let last = of[of.len() - 1];
        let rejoined = match last.rejoined_after_step {
            0 => "-".to_string(),
            step => step.to_string(),
        };
        let _ = writeln!(
            md,
            "| {name} | {:.2} | {:.2} | {} of {} | {rejoined} | {:.2} | {:.2}% ({:.2}-{:.2}%) |",
            mean(|r| r.seconds),
            last.mib_sent_worker0,
            last.full_rounds,
            last.rounds,
            last.mib_live_state,
            100.0 * mean(|r| r.test_accuracy),
            100.0 * accuracy(f64::min),
            100.0 * accuracy(f64::max),
        );
    }
    super::write_report(o, "faults", &rows, &md)
}
