//! A small ViT classifier trained by the Trainer: the built-in 8x8 digits by default,
//! CIFAR-10's binary files with `--data cifar10 --data-dir DIR`.
//!
//! ```text
//! cargo run --release --example vit_classify
//! cargo run --release --example vit_classify -- --bf16 --num-train-epochs 10
//! cargo run --release --example vit_classify -- --config run.toml --save-total-limit 1
//! cargo run --release --example vit_classify -- --data cifar10 --data-dir cifar-10-batches-bin
//! ```
//! Every `TrainingArguments` key is an option (`--help` lists them with this example's
//! defaults); checkpoints, `log.jsonl` and the best model (`model.safetensors`) go to
//! `--output-dir` (default `runs/vit_classify`). `--strategy ddp --devices 2` (or zero-1,
//! fsdp, local-sgd, diloco) trains on several devices: the example starts one Trainer per
//! rank itself. It prints the last evaluation's accuracy (the final model) and the best
//! model's, which `load_best_model_at_end` reloads.

#[path = "../minimal/backend.rs"]
mod backend;

use afterburner::trainer::{
    Components, IntervalStrategy, SchedulerType, Trainer, TrainingArguments,
};
use afterburner::weights::Layout;
use afterburner::{AccelerateError, Accelerator};
use afterburner_demos::models::{Vit, VitConfig};
use afterburner_demos::{ImageBatch, ImageItem, cifar10, digits};
use burn::data::dataset::Dataset;
use burn::tensor::backend::AutodiffBackend;
use burn::train::ClassificationOutput;
use burn::train::metric::AccuracyMetric;

use backend::{B, device};

fn main() -> std::process::ExitCode {
    backend::main_with(run)
}

/// This example's defaults: 30 epochs of batch 32 at 2e-3, an evaluation and a checkpoint
/// per epoch, the two newest checkpoints and the best one kept, the best model (by
/// accuracy) reloaded at the end.
fn defaults() -> TrainingArguments {
    TrainingArguments {
        output_dir: "runs/vit_classify".into(),
        num_train_epochs: 30.0,
        per_device_train_batch_size: 32,
        per_device_eval_batch_size: 128,
        learning_rate: 2e-3,
        weight_decay: 1e-4,
        warmup_ratio: 0.05,
        lr_scheduler_type: SchedulerType::Cosine,
        eval_strategy: IntervalStrategy::Epoch,
        save_strategy: IntervalStrategy::Epoch,
        logging_strategy: IntervalStrategy::Epoch,
        save_total_limit: Some(2),
        load_best_model_at_end: true,
        metric_for_best_model: Some("accuracy".into()),
        dataloader_num_workers: 2,
        ..Default::default()
    }
}

/// This example's own options, with their `--help` lines.
const OWN_OPTIONS: &[&str] = &[
    "data: the images: digits (default, built in) or cifar10",
    "data-dir: CIFAR-10's binary folder (cifar-10-batches-bin), for --data cifar10",
];

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (args, own) = defaults().with_args(std::env::args().skip(1), OWN_OPTIONS)?;
    let data = own.get("data").map_or("digits", String::as_str);
    let (train, test, vit) = match data {
        "digits" => {
            let (train, test) = digits::load()?.split(0.2, 0);
            (train, test, VitConfig::new())
        }
        "cifar10" => {
            let dir = own
                .get("data-dir")
                .ok_or("--data cifar10 needs --data-dir DIR (CIFAR-10's binary version)")?;
            let train = cifar10::load(dir, cifar10::Split::Train)?;
            let test = cifar10::load(dir, cifar10::Split::Test)?;
            let vit = VitConfig::new()
                .with_channels(3)
                .with_image_size(32)
                .with_patch_size(4);
            (train, test, vit)
        }
        other => return Err(format!("--data {other}: expected digits or cifar10").into()),
    };
    let length = match args.max_steps {
        steps if steps > 0 => format!("{steps} steps"),
        _ => format!("{} epochs", args.num_train_epochs),
    };
    println!(
        "{data}: {} train / {} test images, {length}, batch {}, {}",
        train.len(),
        test.len(),
        args.per_device_train_batch_size,
        args.effective_precision()
    );
    let batcher = train.batcher();
    let model = vit.with_num_classes(10).init::<B>(&device());
    if !args.parallelism.strategy.is_distributed() {
        let trainer = Trainer::new(model, args, train, test, batcher)?;
        return train_and_report(trainer.with_metrics((AccuracyMetric::new(),)));
    }
    // `--strategy ddp --devices 2` (or zero-1, fsdp, ...): one Trainer per rank, each on its
    // rank's Accelerator; rank 0 prints.
    let config = args.accelerator_config();
    Accelerator::<B>::run(config, move |acc| {
        let trainer = Trainer::on(
            acc,
            model.clone(),
            args.clone(),
            train.clone(),
            test.clone(),
            batcher,
        )?;
        train_and_report(trainer.with_metrics((AccuracyMetric::new(),)))
            .map_err(|e| AccelerateError::Usage(e.to_string()))
    })?;
    Ok(())
}

/// The Trainer of this example (one rank's under a distributed strategy).
type VitTrainer = Trainer<
    Components<B, Vit<B>, ImageItem, ImageBatch<B>, ImageBatch<Inner>, ClassificationOutput<Inner>>,
>;

/// The inner (evaluation) backend.
type Inner = <B as AutodiffBackend>::InnerBackend;

/// Trains, evaluates the best model on the test images and saves it; the main process
/// prints the final and the best model's accuracy.
fn train_and_report(mut trainer: VitTrainer) -> Result<(), Box<dyn std::error::Error>> {
    let summary = trainer.train()?;
    let main = trainer.accelerator().is_main_process();
    let last_eval = trainer
        .state()
        .log_history
        .iter()
        .rev()
        .find_map(|entry| entry.values.get("eval_accuracy"));
    let best = accuracy(&trainer.evaluate()?);
    let saved = trainer.args().output_dir.join("model.safetensors");
    trainer.save_model(&saved, Layout::Burn)?;
    if main {
        println!("{summary}");
        if let Some(last) = last_eval {
            println!("test accuracy (final model): {last:.2}%");
        }
        println!("test accuracy (best model): {best:.2}%");
        println!("model saved to {}", saved.display());
    }
    Ok(())
}

/// burn-train's accuracy is in percent.
fn accuracy(metrics: &afterburner::trainer::Metrics) -> f64 {
    metrics.get("eval_accuracy").unwrap_or(f64::NAN)
}
