//! The Trainer's throughput values: every training log has samples/s, the achieved TFLOP/s of
//! the FLOPs `Autocast` counted (the evaluations left out), the MFU against the peak and the
//! peak memory, summed or averaged across ranks; the run ends with `curves.svg` next to
//! `log.jsonl`.

mod common;

use afterburner::trainer::{IntervalStrategy, LogEntry, Trainer, TrainingArguments};
use afterburner::{Accelerator, Autocast, StrategyConfig};
use afterburner_demos::models::Vit;
use afterburner_demos::{ImageBatch, ImageDataset, digits};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::tensor::backend::Backend;
use burn::train::metric::AccuracyMetric;
use common::{BATCHER, rng_lock, tiny_vit};

type B = Autodiff<Autocast<Flex>>;

/// The FLOPs of one training step of `batch` digits (forward and backward), counted.
fn flops_per_step(model: &Vit<B>, batch: usize) -> u64 {
    let items = digits::load().unwrap().items()[..batch].to_vec();
    let batch: ImageBatch<B> = BATCHER.batch(items, &Default::default());
    let (images, model) = (batch.images, model.clone());
    let (_, flops) = afterburner::count_flops(|| model.forward(images).sum().backward());
    flops
}

/// The tiny ViT from seed 7 and its FLOPs per training step of 4 digits.
fn model_and_flops_per_step() -> (Vit<B>, u64) {
    <B as Backend>::seed(&Default::default(), 7);
    let model = tiny_vit().init::<B>(&Default::default());
    afterburner::precision::materialize_params(&model);
    let per_step = flops_per_step(&model, 4);
    assert!(per_step > 0);
    (model, per_step)
}

/// A known peak (1 GFLOP/s): the MFU must be the TFLOP/s over it. Set once, before any test
/// of this binary trains.
fn known_peak() {
    static SET: std::sync::Once = std::sync::Once::new();
    // SAFETY: set once, while every test of this binary waits here before it trains.
    SET.call_once(|| unsafe { std::env::set_var("AFTERBURNER_PEAK_TFLOPS", "0.001") });
}

/// Checks a training log's values: `ranks` ranks of 4 samples a step, `per_step` FLOPs a
/// step on each. Time cancels out of the FLOPs per sample: the sum of the ranks'
/// samples/s and the mean of their TFLOP/s give `per_step / 4` whatever each rank's time.
fn check_log(entry: &LogEntry, per_step: u64, ranks: f64) {
    let value = |name: &str| {
        entry
            .values
            .get(name)
            .unwrap_or_else(|| panic!("no {name} at step {}", entry.step))
    };
    let (samples, tflops) = (value("samples_per_second"), value("tflops"));
    assert!(samples > 0.0 && tflops > 0.0, "{entry:?}");
    // An evaluation inside the window (one ran after steps 10 and 20) would add its FLOPs.
    let per_sample = tflops * 1e12 * ranks / samples;
    let expected = per_step as f64 / 4.0;
    assert!(
        (per_sample - expected).abs() <= 1e-5 * expected,
        "step {}: {per_sample} FLOPs per sample, counted {expected}",
        entry.step
    );
    assert!((value("mfu") - tflops / 0.001).abs() <= 1e-5 * value("mfu"));
    assert!(value("peak_memory_mib") > 1.0);
    assert!(
        entry.values.get("tokens_per_second").is_none(),
        "images have no tokens"
    );
}

fn training_logs(history: &[LogEntry]) -> Vec<&LogEntry> {
    history
        .iter()
        .filter(|e| e.values.get("loss").is_some())
        .collect()
}

#[test]
fn across_ranks_rates_add_up_and_tflops_average() {
    known_peak();
    let _rng = rng_lock();
    let (model, per_step) = model_and_flops_per_step();
    let args = TrainingArguments {
        output_dir: common::scratch_dir("trainer-throughput-ddp"),
        max_steps: 6,
        per_device_train_batch_size: 4,
        logging_strategy: IntervalStrategy::Steps,
        logging_steps: 2.0,
        eval_strategy: IntervalStrategy::No,
        save_strategy: IntervalStrategy::No,
        parallelism: afterburner::ParallelismConfig {
            strategy: StrategyConfig::Ddp(Default::default()),
            devices: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let run_args = args.clone();
    let histories = Accelerator::<B>::run(args.accelerator_config(), move |acc| {
        let all = digits::load().unwrap();
        let eval = ImageDataset::new(all.items()[40..64].to_vec(), [1, 8, 8]).unwrap();
        let mut t = Trainer::on(
            acc,
            model.clone(),
            run_args.clone(),
            all.take(40),
            eval,
            BATCHER,
        )?;
        t.train()?;
        Ok(t.state().log_history.clone())
    })
    .unwrap();
    assert_eq!(histories.len(), 2);
    for history in &histories {
        let logs = training_logs(history);
        assert_eq!(logs.len(), 3);
        for entry in logs {
            check_log(entry, per_step, 2.0);
        }
    }
    // Every rank logs the same aggregated values.
    assert_eq!(training_logs(&histories[0]), training_logs(&histories[1]));
}

#[test]
fn training_logs_carry_throughput_flops_mfu_and_memory() {
    known_peak();
    let _rng = rng_lock();
    let (model, per_step) = model_and_flops_per_step();
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[40..64].to_vec(), [1, 8, 8]).unwrap();
    let output_dir = common::scratch_dir("trainer-throughput");
    let args = TrainingArguments {
        output_dir: output_dir.clone(),
        num_train_epochs: 2.0,
        per_device_train_batch_size: 4,
        logging_strategy: IntervalStrategy::Steps,
        logging_steps: 2.0,
        eval_strategy: IntervalStrategy::Epoch,
        save_strategy: IntervalStrategy::No,
        load_best_model_at_end: false,
        ..Default::default()
    };
    let mut trainer = Trainer::new(model, args, all.take(40), eval, BATCHER)
        .unwrap()
        .with_metrics((AccuracyMetric::new(),));
    trainer.train().unwrap();
    let logs = training_logs(&trainer.state().log_history);
    assert_eq!(logs.len(), 10);
    for entry in logs {
        check_log(entry, per_step, 1.0);
    }
    let svg = std::fs::read_to_string(output_dir.join("curves.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains(">samples/s<"));
}

/// `Accelerator::flops` counts what this thread ran through `Autocast` since the Accelerator
/// was built: a training step's forward and backward.
#[test]
fn the_accelerator_counts_its_threads_flops() {
    let _rng = rng_lock();
    let (model, per_step) = model_and_flops_per_step();
    let acc = Accelerator::<B>::new(Default::default(), Default::default()).unwrap();
    assert_eq!(acc.flops(), 0);
    assert_eq!(flops_per_step(&model, 4), per_step);
    assert_eq!(acc.flops(), per_step);
}
