//! The Trainer's throughput values: every training log has samples/s, the achieved TFLOP/s of
//! the FLOPs `Autocast` counted (the evaluations left out), the MFU against the peak and the
//! peak memory; the run ends with `curves.svg` next to `log.jsonl`.

mod common;

use afterburner::Autocast;
use afterburner::trainer::{IntervalStrategy, Trainer, TrainingArguments};
use afterburner_demos::{ImageBatch, ImageDataset, digits};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::tensor::backend::Backend;
use burn::train::metric::AccuracyMetric;
use common::{BATCHER, rng_lock, tiny_vit};

type B = Autodiff<Autocast<Flex>>;

/// The FLOPs of one training step of `batch` digits (forward and backward), counted.
fn flops_per_step(model: &afterburner_demos::models::Vit<B>, batch: usize) -> u64 {
    let items = digits::load().unwrap().items()[..batch].to_vec();
    let batch: ImageBatch<B> = BATCHER.batch(items, &Default::default());
    let (images, model) = (batch.images, model.clone());
    let (_, flops) = afterburner::count_flops(|| model.forward(images).sum().backward());
    flops
}

#[test]
fn training_logs_carry_throughput_flops_mfu_and_memory() {
    let _rng = rng_lock();
    // A known peak (1 GFLOP/s): the MFU must be the TFLOP/s over it.
    // SAFETY: this test binary has this one test; nothing else reads the environment.
    unsafe { std::env::set_var("AFTERBURNER_PEAK_TFLOPS", "0.001") };
    <B as Backend>::seed(&Default::default(), 7);
    let model = tiny_vit().init::<B>(&Default::default());
    afterburner::precision::materialize_params(&model);
    let per_step = flops_per_step(&model, 4);
    assert!(per_step > 0);
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
    let history = &trainer.state().log_history;
    let logs: Vec<_> = history
        .iter()
        .filter(|e| e.values.get("loss").is_some())
        .collect();
    assert_eq!(logs.len(), 10);
    for entry in logs {
        let value = |name: &str| {
            entry
                .values
                .get(name)
                .unwrap_or_else(|| panic!("no {name} at step {}", entry.step))
        };
        let (samples, tflops) = (value("samples_per_second"), value("tflops"));
        assert!(samples > 0.0 && tflops > 0.0, "{entry:?}");
        // Time cancels out: FLOPs per sample are the counted step's over its 4 samples. An
        // evaluation inside the window (one ran after steps 10 and 20) would add its FLOPs.
        let per_sample = tflops * 1e12 / samples;
        let expected = per_step as f64 / 4.0;
        assert!(
            (per_sample - expected).abs() <= 1e-6 * expected,
            "step {}: {per_sample} FLOPs per sample, counted {expected}",
            entry.step
        );
        assert!((value("mfu") - tflops / 0.001).abs() <= 1e-9 * value("mfu"));
        assert!(value("peak_memory_mib") > 1.0);
        assert!(
            entry.values.get("tokens_per_second").is_none(),
            "images have no tokens"
        );
    }
    let svg = std::fs::read_to_string(output_dir.join("curves.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains(">samples/s<"));
}
