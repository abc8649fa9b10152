//! Host reads on the training step path: every read of a device value on the host drains a
//! GPU's queue, so the Trainer reads its training values (the running loss, the gradient norm,
//! the skipped steps) once per log and never between two logs, and a hand-written Accelerator
//! loop reads nothing per step. Counted by `Autocast` (`afterburner::count_host_reads`).

mod common;

use std::sync::{Arc, Mutex};

use afterburner::trainer::{
    DeviceAdamW, DeviceAdamWConfig, HfSchedule, IntervalStrategy, LogEntry, SchedulerType, Trainer,
    TrainerCallback, TrainerState,
};
use afterburner::trainer::{Flow, TrainingArguments};
use afterburner::{Accelerator, AcceleratorConfig, Autocast, NonFinitePolicy, host_reads_counted};
use afterburner_demos::{ImageBatch, digits};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::backend::Backend;
use common::{BATCHER, rng_lock, tiny_vit};

type B = Autodiff<Autocast<Flex>>;

/// What the callback saw: the thread's host reads at each step's end and at each log.
#[derive(Default)]
struct Seen {
    at_step_end: Vec<(u64, u64)>,
    at_log: Vec<(u64, u64)>,
}

#[derive(Clone, Default)]
struct ReadCounter(Arc<Mutex<Seen>>);

impl TrainerCallback for ReadCounter {
    fn on_step_end(&mut self, state: &TrainerState) -> Flow {
        let mut seen = self.0.lock().unwrap();
        seen.at_step_end
            .push((state.global_step, host_reads_counted()));
        Flow::Continue
    }

    fn on_log(&mut self, state: &TrainerState, _entry: &LogEntry) {
        let mut seen = self.0.lock().unwrap();
        seen.at_log.push((state.global_step, host_reads_counted()));
    }

    /// It only watches: no vote across ranks after each step.
    fn may_stop(&self) -> bool {
        false
    }
}

/// Host reads between consecutive step ends (index k: from step k+1's end to step k+2's)
/// and from step 20's end to its log, for a 20-step run logging every 10, on one device.
fn reads_per_step(precision: &str, max_grad_norm: f64) -> (Vec<u64>, u64) {
    reads_per_step_on(precision, max_grad_norm, None).remove(0)
}

/// [`reads_per_step`] of every rank, on 2 in-process ranks under `strategy` when given.
fn reads_per_step_on(
    precision: &str,
    max_grad_norm: f64,
    strategy: Option<&str>,
) -> Vec<(Vec<u64>, u64)> {
    let _rng = rng_lock();
    <B as Backend>::seed(&Default::default(), 7);
    let model = tiny_vit().init::<B>(&Default::default());
    let name = format!("host-reads-{precision}-{}", strategy.unwrap_or("one"));
    let args = TrainingArguments {
        output_dir: common::scratch_dir(&name),
        max_steps: 20,
        per_device_train_batch_size: 4,
        logging_strategy: IntervalStrategy::Steps,
        logging_steps: 10.0,
        eval_strategy: IntervalStrategy::No,
        save_strategy: IntervalStrategy::No,
        max_grad_norm,
        precision: precision.parse().unwrap(),
        parallelism: afterburner::ParallelismConfig {
            strategy: strategy.unwrap_or("single-device").parse().unwrap(),
            devices: if strategy.is_some() { 2 } else { 1 },
            ..Default::default()
        },
        disable_tqdm: true,
        ..Default::default()
    };
    // 20 steps of one epoch on every rank.
    let items = 80 * args.parallelism.devices;
    let config = args.accelerator_config();
    let train = move |acc: Option<Accelerator<B>>| {
        let all = digits::load().unwrap();
        let (train, eval) = (all.clone().take(items), all.take(8));
        let counter = ReadCounter::default();
        let trainer = match acc {
            None => Trainer::new(model.clone(), args.clone(), train, eval, BATCHER),
            Some(acc) => Trainer::on(acc, model.clone(), args.clone(), train, eval, BATCHER),
        };
        let mut trainer = trainer.unwrap().with_callback(counter.clone());
        trainer.train().unwrap();
        let seen = counter.0.lock().unwrap();
        assert_eq!(seen.at_step_end.len(), 20);
        let between: Vec<u64> = seen
            .at_step_end
            .windows(2)
            .map(|w| w[1].1 - w[0].1)
            .collect();
        let last_log = seen.at_log.last().unwrap();
        assert_eq!(last_log.0, 20);
        (between, last_log.1 - seen.at_step_end[19].1)
    };
    match strategy {
        None => vec![train(None)],
        Some(_) => Accelerator::<B>::run(config, move |acc| Ok(train(Some(acc)))).unwrap(),
    }
}

/// The one read per optimizer step a hand-written loop's `step` makes under the non-finite
/// guard (or with `max_grad_norm`): the skip is decided on the host. The Trainer's default
/// AdamW decides it on the device (`Accelerator::step_on_device`) and reads nothing.
const GUARD_READS_PER_STEP: u64 = 1;

#[test]
fn the_trainer_reads_its_training_values_once_per_log() {
    for precision in ["32-true", "bf16-mixed", "16-mixed"] {
        for max_grad_norm in [0.0, 1.0] {
            let (between, at_last_log) = reads_per_step(precision, max_grad_norm);
            let expected: Vec<u64> = (2..=20).map(|step| u64::from(step == 11)).collect();
            // Steps 2..=20: nothing but the log of step 10 (read after step 10's end, so
            // counted towards step 11).
            assert_eq!(
                between, expected,
                "{precision}, max_grad_norm {max_grad_norm}: host reads from one step's end to \
                 the next"
            );
            assert_eq!(at_last_log, 1, "{precision}: the log of step 20 reads once");
            assert_eq!(
                between.iter().sum::<u64>() + at_last_log,
                2,
                "20 steps, 2 logs"
            );
        }
    }
}

/// Reads at a log on several ranks: the losses and what the steps did (as on one device),
/// then the loss's and the throughput's sums across ranks.
const READS_PER_LOG_ON_RANKS: u64 = 3;

/// On 2 ranks under DDP and FSDP the ranks decide the skip, the clip and fp16's loss scale
/// alike on the device (FSDP: one all-reduce of a device tensor): the Trainer's default AdamW
/// reads nothing between logs (a callback that may stop the run adds a vote a step).
#[test]
fn ddp_and_fsdp_ranks_read_nothing_between_logs() {
    for strategy in ["ddp", "fsdp"] {
        for precision in ["32-true", "bf16-mixed", "16-mixed"] {
            for (rank, (between, at_last_log)) in reads_per_step_on(precision, 1.0, Some(strategy))
                .into_iter()
                .enumerate()
            {
                // The log after steps that fp16 skipped (an overflow) also checks the
                // parameters: a read more, and under FSDP an all-reduce more.
                let at_log = |reads: u64| match precision {
                    "16-mixed" => {
                        (READS_PER_LOG_ON_RANKS..=READS_PER_LOG_ON_RANKS + 2).contains(&reads)
                    }
                    _ => reads == READS_PER_LOG_ON_RANKS,
                };
                let steady: Vec<u64> = (0..between.len())
                    .filter(|k| *k != 9)
                    .map(|k| between[k])
                    .collect();
                assert_eq!(
                    steady,
                    vec![0; 18],
                    "{strategy} rank {rank}, {precision}: host reads between steps, but for the \
                     log of step 10: {between:?}"
                );
                assert!(
                    at_log(between[9]) && at_log(at_last_log),
                    "{strategy} rank {rank}, {precision}: reads at the logs {} and {at_last_log}",
                    between[9]
                );
            }
        }
    }
}

/// How a hand-written loop steps: Burn's AdamW through `step` under a non-finite policy, or
/// `DeviceAdamW` (the default policy, decided on the device).
#[derive(Clone, Copy)]
enum Stepper {
    Burn(NonFinitePolicy),
    Device,
}

/// Host reads of each of 6 steps of a hand-written Accelerator loop on the tiny ViT (AdamW at
/// the same linear schedule either way, of 6 steps), and its parameters after them.
fn hand_loop(
    precision: &str,
    max_grad_norm: Option<f64>,
    stepper: Stepper,
) -> (Vec<u64>, Vec<f32>) {
    let linear = HfSchedule::new(SchedulerType::Linear, 1e-3, 2, 6);
    hand_loop_over(precision, max_grad_norm, stepper, linear)
}

/// [`hand_loop`] at the rates of `schedule` (one of fewer than 6 steps is stepped past its
/// end).
fn hand_loop_over(
    precision: &str,
    max_grad_norm: Option<f64>,
    stepper: Stepper,
    schedule: HfSchedule,
) -> (Vec<u64>, Vec<f32>) {
    let _rng = rng_lock();
    let device = Default::default();
    let config = AcceleratorConfig {
        precision: precision.parse().unwrap(),
        nonfinite_gradients: match stepper {
            Stepper::Burn(guard) => guard,
            Stepper::Device => NonFinitePolicy::Skip,
        },
        max_grad_norm,
        seed: 7,
        ..Default::default()
    };
    let mut acc = Accelerator::<B>::new(config, device).unwrap();
    let mut model = acc.setup_model(tiny_vit().init::<B>(&device)).unwrap();
    let schedule = || schedule.clone();
    let mut on_device = DeviceAdamW::new(DeviceAdamWConfig::default(), schedule());
    let mut burns = AdamWConfig::new().init();
    let mut host_schedule = schedule();
    let items = digits::load().unwrap().items()[..24].to_vec();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut reads = Vec::new();
    for chunk in items.chunks(4) {
        let batch: ImageBatch<B> = BATCHER.batch(chunk.to_vec(), &device);
        let before = acc.host_reads();
        let logits = acc
            .forward(&model, batch.images, |m, x| m.forward(x))
            .unwrap();
        let loss = loss_fn.forward(logits, batch.labels);
        acc.backward(loss, &model).unwrap();
        model = match stepper {
            Stepper::Device => on_device.step(&mut acc, model).unwrap(),
            Stepper::Burn(_) => acc.step(model, &mut burns, &mut host_schedule).unwrap(),
        };
        reads.push(acc.host_reads() - before);
    }
    if let Stepper::Device = stepper {
        let settled = on_device.settle(&mut acc);
        assert_eq!((settled.applied, settled.skipped), (6, 0));
    }
    assert_eq!(acc.counters().optimizer_steps, 6);
    (reads, common::flat_params(&model))
}

#[test]
fn a_hand_written_loop_reads_nothing_per_step_without_the_guard() {
    for precision in ["32-true", "bf16-mixed", "bf16-true"] {
        let (reads, _) = hand_loop(precision, None, Stepper::Burn(NonFinitePolicy::Apply));
        assert_eq!(reads, vec![0; 6], "{precision}: nothing read on the host");
    }
    // The guard's decision and the clipping norm are the reads left: one a step.
    let (reads, _) = hand_loop("32-true", None, Stepper::Burn(NonFinitePolicy::Skip));
    assert_eq!(reads, vec![GUARD_READS_PER_STEP; 6]);
    let (reads, _) = hand_loop(
        "bf16-mixed",
        Some(1.0),
        Stepper::Burn(NonFinitePolicy::Skip),
    );
    assert_eq!(reads, vec![GUARD_READS_PER_STEP; 6]);
}

#[test]
fn a_hand_written_loop_with_device_adamw_reads_nothing_and_equals_burns_adamw() {
    for precision in ["32-true", "bf16-mixed", "16-mixed"] {
        for clip in [None, Some(1.0)] {
            let (reads, params) = hand_loop(precision, clip, Stepper::Device);
            assert_eq!(
                reads,
                vec![0; 6],
                "{precision}, clip {clip:?}: no host read"
            );
            let (_, burns) = hand_loop(precision, clip, Stepper::Burn(NonFinitePolicy::Skip));
            assert_eq!(
                params, burns,
                "{precision}, clip {clip:?}: Burn's AdamW bitwise"
            );
        }
    }
}

/// A loop that steps past its schedule's end (a 3-step schedule stepped 6 times) gets the
/// schedule's rates there, as Burn's AdamW with the same schedule does: no panic, and no read
/// past the device's tables (an out-of-bounds read on CUDA).
#[test]
fn device_adamw_stepped_past_its_schedule_equals_burns_adamw() {
    // Cosine: its rate rises again past the end, so every step moves the parameters.
    let short = || HfSchedule::new(SchedulerType::Cosine, 1e-3, 1, 3);
    let (reads, params) = hand_loop_over("32-true", None, Stepper::Device, short());
    assert_eq!(reads, vec![0; 6]);
    let burn = Stepper::Burn(NonFinitePolicy::Skip);
    let (_, burns) = hand_loop_over("32-true", None, burn, short());
    assert_eq!(
        params, burns,
        "Burn's AdamW at the schedule's rates, bitwise"
    );
}
