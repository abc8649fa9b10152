//! What the command line's `--help` says beyond what clap writes from the options: each
//! key's description (the one table of them), the text above the options and the list of
//! strategies below them.

use crate::StrategyConfig;

/// One line per `TrainingArguments` key: what it sets (clap adds the default and, for the four
/// choices, their values from their enums; the other keys with a set of values name them).
const DESCRIPTIONS: &[(&str, &str)] = &[
    (
        "output_dir",
        "directory of checkpoints, log.jsonl and the final model",
    ),
    (
        "overwrite_output_dir",
        "train afresh into an output_dir with checkpoints, no warning",
    ),
    ("num_train_epochs", "epochs to train (may be fractional)"),
    (
        "max_steps",
        "optimizer steps to train; overrides num_train_epochs when > 0",
    ),
    (
        "per_device_train_batch_size",
        "items per training batch on each device",
    ),
    (
        "per_device_eval_batch_size",
        "items per evaluation batch on each device",
    ),
    ("optim", "the optimizer"),
    ("learning_rate", "peak learning rate"),
    (
        "weight_decay",
        "weight decay (AdamW: decoupled; Adam, SGD: L2)",
    ),
    ("adam_beta1", "Adam's and AdamW's beta1"),
    ("adam_beta2", "Adam's and AdamW's beta2"),
    ("adam_epsilon", "Adam's and AdamW's epsilon"),
    (
        "max_grad_norm",
        "clip the global gradient norm to this (0: no clipping)",
    ),
    ("lr_scheduler_type", "learning-rate schedule"),
    (
        "warmup_steps",
        "optimizer steps of linear warmup (below 1: a share of all steps)",
    ),
    (
        "warmup_ratio",
        "share of all optimizer steps used for warmup, in [0, 1]",
    ),
    (
        "gradient_accumulation_steps",
        "micro-batches per optimizer step",
    ),
    ("loss_normalization", "loss over an accumulation cycle"),
    (
        "precision",
        "precision: 32-true, bf16-mixed, 16-mixed, bf16-true, 16-true",
    ),
    ("bf16", "bf16 mixed precision (precision = bf16-mixed)"),
    (
        "fp16",
        "fp16 mixed precision with loss scaling (precision = 16-mixed)",
    ),
    ("autocast", "how the mixed precisions run: auto, op, view"),
    (
        "gradient_checkpointing",
        "activation checkpointing: false, true, every-<k>, selective, balanced",
    ),
    ("eval_strategy", "when to evaluate"),
    (
        "eval_steps",
        "evaluate every this many optimizer steps (below 1: a share)",
    ),
    ("logging_strategy", "when to log the training loss"),
    (
        "logging_steps",
        "log every this many optimizer steps (below 1: a share)",
    ),
    (
        "logging_first_step",
        "also log after the first optimizer step",
    ),
    ("save_strategy", "when to save a checkpoint"),
    (
        "save_steps",
        "save every this many optimizer steps (below 1: a share)",
    ),
    (
        "save_total_limit",
        "keep at most this many checkpoints (the best is kept)",
    ),
    (
        "load_best_model_at_end",
        "reload the best checkpoint's model at the end",
    ),
    (
        "metric_for_best_model",
        "metric that picks the best checkpoint: loss, accuracy, ...",
    ),
    (
        "greater_is_better",
        "whether a larger metric_for_best_model is better: true, false",
    ),
    (
        "seed",
        "seed of the model's RNG streams and of the data order",
    ),
    ("data_seed", "seed of the data order alone"),
    (
        "dataloader_drop_last",
        "drop the last incomplete training batch of each epoch",
    ),
    (
        "dataloader_num_workers",
        "batches prepared ahead on a background thread",
    ),
    ("disable_tqdm", "no progress bar"),
    (
        "report_to",
        "where logs go besides log.jsonl: tensorboard writes event files to logging_dir",
    ),
    (
        "logging_dir",
        "TensorBoard's directory (default: output_dir/runs)",
    ),
    (
        "strategy",
        "how training is spread over devices: a strategy's name (see the strategies below)",
    ),
    ("devices", "devices (worker threads) to train on"),
    (
        "tp_size",
        "tensor parallelism: the model's plan split over this many devices (devices = dp x tp_size, strategy ddp)",
    ),
    (
        "stop_on_signal",
        "on SIGTERM/SIGINT: finish the step, save, stop",
    ),
    (
        "resume_from_checkpoint",
        "continue from a checkpoint-<step> directory, or latest",
    ),
    (
        "early_stopping_patience",
        "stop after this many evaluations without improvement",
    ),
    (
        "early_stopping_threshold",
        "how much better than the best counts as an improvement",
    ),
];

/// What `--help` says first, above the usage line.
pub(super) const ABOUT: &str = "Training arguments: HF's TrainingArguments keys in kebab-case \
     (HF's underscore spellings are taken too: --num_train_epochs 3); a flag may be given alone \
     (--bf16) or with true or false; --config FILE first, the options given override it.";

/// The strategies `--strategy` takes, each with its description: `--help`'s last part (their
/// options are listed above it, under a heading each).
pub(super) fn strategies() -> String {
    let mut lines =
        vec!["Strategies (--strategy NAME; its options as --NAME.OPTION VALUE, above):".into()];
    for name in StrategyConfig::names() {
        let about = StrategyConfig::about(&name).unwrap_or("a registered strategy");
        let about = about.split(". ").next().unwrap_or_default();
        let about = about.split_whitespace().collect::<Vec<_>>().join(" ");
        lines.push(format!("  {name}: {}", about.trim_end_matches('.')));
    }
    lines.join("\n")
}

/// The one-line description of `key` (snake_case).
pub(super) fn description(key: &str) -> Option<&'static str> {
    DESCRIPTIONS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::trainer::TrainingArguments;

    #[test]
    fn every_key_has_a_description_and_every_description_a_key() {
        let keys = match serde_json::to_value(TrainingArguments::default()) {
            Ok(Value::Object(map)) => map,
            _ => panic!("TrainingArguments is a table"),
        };
        for key in keys.keys() {
            assert!(description(key).is_some(), "--help has no line for {key}");
        }
        for (key, _) in DESCRIPTIONS {
            assert!(keys.contains_key(*key), "--help describes {key}, not a key");
        }
    }
}
