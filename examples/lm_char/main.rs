//! A small GPT trained by the Trainer on the built-in text (chapters I-IV of Jules Verne's
//! "Around the World in 80 Days", byte by byte), with gradient accumulation, activation
//! checkpointing of every block, bf16 mixed precision and per-item loss normalisation; prints
//! the loss curve and a generated sample.
//!
//! ```text
//! cargo run --release --example lm_char
//! cargo run --release --example lm_char -- --precision 32-true --bf16 false --num-train-epochs 2
//! cargo run --release --example lm_char -- --strategy ddp --devices 2 --tp-size 2
//! ```
//! The last one splits every block over 2 devices (tensor parallelism, the model's plan).
//! Every `TrainingArguments` key is an option (`--help` lists them with this example's
//! defaults); `--prompt TEXT` starts the sample.

#[path = "../minimal/backend.rs"]
mod backend;

use afterburner::trainer::{
    Components, IntervalStrategy, LossNormalization, SchedulerType, Trainer, TrainingArguments,
};
use afterburner::{AccelerateError, Accelerator, CheckpointPolicy};
use afterburner_demos::models::{Transformer, TransformerConfig};
use afterburner_demos::text::{self, TextDataset, TextItem, TokenBatch, TokenBatcher};
use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::train::ClassificationOutput;
use burn::train::metric::{AccuracyMetric, PerplexityMetric};

use backend::{B, device};

/// Bytes the model reads at once.
const SEQ_LEN: usize = 64;

fn main() -> std::process::ExitCode {
    backend::main_with(run)
}

/// This example's defaults: 3 epochs of 2 x 16 windows per step, AdamW 3e-3 with a cosine
/// schedule, bf16 mixed precision, every block checkpointed, an evaluation per epoch.
fn defaults() -> TrainingArguments {
    TrainingArguments {
        output_dir: "runs/lm_char".into(),
        num_train_epochs: 3.0,
        per_device_train_batch_size: 16,
        per_device_eval_batch_size: 32,
        gradient_accumulation_steps: 2,
        loss_normalization: LossNormalization::PerItem,
        learning_rate: 3e-3,
        weight_decay: 0.01,
        warmup_ratio: 0.05,
        lr_scheduler_type: SchedulerType::Cosine,
        bf16: true,
        gradient_checkpointing: CheckpointPolicy::All,
        logging_steps: 25.0,
        eval_strategy: IntervalStrategy::Epoch,
        save_strategy: IntervalStrategy::Epoch,
        save_total_limit: Some(1),
        dataloader_num_workers: 2,
        ..Default::default()
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let own_options = &["prompt: the text the trained model continues (default \"Phileas Fogg\")"];
    let (args, own) = defaults().with_args(std::env::args().skip(1), own_options)?;
    let prompt = own
        .get("prompt")
        .map_or("Phileas Fogg", String::as_str)
        .to_string();
    let (train, test) = TextDataset::new(text::load(), SEQ_LEN, SEQ_LEN / 4)?.split(0.1)?;
    println!(
        "text: {} training / {} test windows of {SEQ_LEN} bytes, {} epochs, {} x {} per step, {}",
        train.len(),
        test.len(),
        args.num_train_epochs,
        args.gradient_accumulation_steps,
        args.per_device_train_batch_size,
        args.effective_precision()
    );
    let config = TransformerConfig::new()
        .with_d_model(128)
        .with_n_layers(4)
        .with_max_seq_len(SEQ_LEN);
    let model = config.init::<B>(&device());
    if !args.parallelism.strategy.is_distributed() {
        let trainer = Trainer::new(model, args, train, test, TokenBatcher)?;
        return train_and_sample(trainer, &prompt);
    }
    // `--strategy ddp --devices 2` (and `--tp-size 2`): one Trainer per rank, each on its
    // rank's Accelerator; rank 0 prints.
    Accelerator::<B>::run(args.accelerator_config(), move |acc| {
        let trainer = Trainer::on(
            acc,
            model.clone(),
            args.clone(),
            train.clone(),
            test.clone(),
            TokenBatcher,
        )?;
        train_and_sample(trainer, &prompt).map_err(|e| AccelerateError::Usage(e.to_string()))
    })?;
    Ok(())
}

/// The inner (evaluation) backend.
type Inner = <B as AutodiffBackend>::InnerBackend;

/// The Trainer of this example (one rank's under a distributed strategy).
type LmTrainer = Trainer<
    Components<
        B,
        Transformer<B>,
        TextItem,
        TokenBatch<B>,
        TokenBatch<Inner>,
        ClassificationOutput<Inner>,
    >,
>;

/// Trains; the main process prints the summary, the loss curve and a sample of the whole
/// model (gathered from the ranks under tensor parallelism or FSDP).
fn train_and_sample(trainer: LmTrainer, prompt: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut trainer = trainer.with_metrics((AccuracyMetric::new(), PerplexityMetric::new()));
    let summary = trainer.train()?;
    let model = trainer.accelerator().full_model(trainer.model()?)?;
    if !trainer.accelerator().is_main_process() {
        return Ok(());
    }
    println!("{summary}");
    println!("loss curve (optimizer step: mean training loss since the last line):");
    for entry in &trainer.state().log_history {
        if let Some(loss) = entry.values.get("loss") {
            println!("  {:>4}: {loss:.3}", entry.step);
        }
        if let Some(loss) = entry.values.get("eval_loss") {
            println!("  {:>4}: eval {loss:.3}", entry.step);
        }
    }
    let sample = text::sample(&model.valid(), prompt, 300, 0.8, SEQ_LEN, 7);
    println!("sample (temperature 0.8):\n{sample}");
    Ok(())
}
