//! `TrainingArguments`: the Trainer's settings, with HuggingFace's names and defaults.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::checkpoint::CheckpointPolicy;
use crate::precision::Precision;
use serde::{Deserialize, Serialize};

use super::args_file::{parse_json, parse_toml, read_file};
use super::choices::{IntervalStrategy, LossNormalization, OptimizerType, ReportTo, SchedulerType};
use crate::{AccelerateError, AcceleratorConfig, AutocastMode, ParallelismConfig};

/// Everything the [`Trainer`](super::Trainer) needs to know, with the names and defaults of
/// HuggingFace's `TrainingArguments` where HF has the knob. Loads from TOML or JSON
/// ([`from_file`](Self::from_file)), is overridable on the command line
/// ([`from_args`](Self::from_args)); unknown keys and bad values are errors naming the key.
///
/// Each key's doc comment is its description: `--help` shows its first sentence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, documented::DocumentedFields)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingArguments {
    /// Where checkpoints (`checkpoint-<step>/`), the metrics log (`log.jsonl`) and the final
    /// model go. Default "trainer_output".
    pub output_dir: PathBuf,
    /// Train afresh into an `output_dir` that holds another run's checkpoints without the
    /// warning that says so (HF's flag; nothing is deleted either way). Default false.
    pub overwrite_output_dir: bool,
    /// Epochs to train (may be fractional). Default 3.0. Ignored when `max_steps` > 0.
    pub num_train_epochs: f64,
    /// Optimizer steps to train; overrides `num_train_epochs` when > 0. Default -1.
    pub max_steps: i64,
    /// Items per training batch on each device. Default 8.
    pub per_device_train_batch_size: usize,
    /// Items per evaluation batch on each device. Default 8.
    pub per_device_eval_batch_size: usize,
    /// The optimizer: "adamw" (default; HF's "adamw_torch"), "adam" or "sgd". Any other Burn
    /// optimizer (SGD with momentum, a user's own) through
    /// [`Trainer::with_optimizers`](super::Trainer::with_optimizers).
    pub optim: OptimizerType,
    /// Peak learning rate. Default 5e-5.
    pub learning_rate: f64,
    /// Weight decay, applied to every parameter: AdamW's decoupled decay, an L2 penalty for
    /// Adam and SGD (as torch.optim's). Default 0.0.
    pub weight_decay: f64,
    /// Adam's and AdamW's beta1. Default 0.9.
    pub adam_beta1: f64,
    /// Adam's and AdamW's beta2. Default 0.999.
    pub adam_beta2: f64,
    /// Adam's and AdamW's epsilon. Default 1e-8 (Burn's own default is 1e-5).
    pub adam_epsilon: f64,
    /// Clip the global gradient norm to this value; 0 turns clipping off. Default 1.0.
    pub max_grad_norm: f64,
    /// The learning-rate schedule: "linear" (default), "cosine", "constant",
    /// "constant_with_warmup".
    pub lr_scheduler_type: SchedulerType,
    /// Optimizer steps of linear warmup from 0 (below 1: a share of the total steps, as in
    /// transformers 5); wins over `warmup_ratio` when > 0. Default 0.
    pub warmup_steps: f64,
    /// Share of the total optimizer steps used for warmup, in [0, 1] (transformers 4's key).
    /// Default 0.0.
    pub warmup_ratio: f64,
    /// Micro-batches per optimizer step. Default 1.
    pub gradient_accumulation_steps: usize,
    /// How the loss is normalised over an accumulation cycle: "batch-mean" (default: the
    /// mean of the micro-batches' mean losses) or "per-item" (HF's 2024 fix: the loss summed
    /// over every item, token, of the cycle on every rank, divided by their number, so
    /// micro-batches with different item counts give the full batch's gradient; the model
    /// implements [`TrainLoss::train_loss_sum`](super::TrainLoss::train_loss_sum)).
    pub loss_normalization: LossNormalization,
    /// Precision policy (Lightning's spellings: "32-true", "bf16-mixed", "16-mixed",
    /// "bf16-true", "16-true"). Default "32-true"; `bf16` / `fp16` set the mixed ones.
    pub precision: Precision,
    /// HF's flag for bf16 mixed precision (same as `precision = "bf16-mixed"`). Default false.
    pub bf16: bool,
    /// HF's flag for fp16 mixed precision with loss scaling (`precision = "16-mixed"`).
    /// Default false.
    pub fp16: bool,
    /// How the mixed precisions run (afterburner's): "auto" (default: per op on a backend
    /// wrapped as `Autodiff<Autocast<B>>`, a half view otherwise), "op" or "view"; see
    /// docs/precision.md.
    pub autocast: AutocastMode,
    /// Activation checkpointing of the model's `Checkpointed` blocks: false (default), true
    /// (every block), or a policy string ("every-2", "selective", ...).
    pub gradient_checkpointing: CheckpointPolicy,
    /// When to evaluate: "no" (default), "steps" (every `eval_steps`), "epoch".
    /// `evaluation_strategy` is accepted as HF's older name.
    #[serde(alias = "evaluation_strategy")]
    pub eval_strategy: IntervalStrategy,
    /// Evaluate every this many optimizer steps (a value below 1 is a share of the total
    /// steps). Default: `logging_steps`.
    pub eval_steps: Option<f64>,
    /// When to log the training loss: "no", "steps" (default), "epoch".
    pub logging_strategy: IntervalStrategy,
    /// Log every this many optimizer steps (below 1: a share of the total). Default 500.
    pub logging_steps: f64,
    /// Also log after the first optimizer step. Default false.
    pub logging_first_step: bool,
    /// When to save a checkpoint: "no", "steps" (default), "epoch".
    pub save_strategy: IntervalStrategy,
    /// Save every this many optimizer steps (below 1: a share of the total). Default 500.
    pub save_steps: f64,
    /// Keep at most this many checkpoints (the best one is never deleted). Default: all.
    pub save_total_limit: Option<usize>,
    /// Reload the best checkpoint's model at the end of training. Needs the same save and
    /// eval strategies (and, for "steps", `save_steps` a multiple of `eval_steps`).
    /// Default false.
    pub load_best_model_at_end: bool,
    /// The evaluation metric that picks the best checkpoint ("loss", "accuracy", with or
    /// without the "eval_" prefix). Default "loss" when `load_best_model_at_end` is set.
    pub metric_for_best_model: Option<String>,
    /// Whether a larger `metric_for_best_model` is better. Default: false for a loss, true
    /// otherwise.
    pub greater_is_better: Option<bool>,
    /// Seed of the model's RNG streams (dropout, ...) and of the data order. Default 42.
    pub seed: u64,
    /// Seed of the data order alone. Default: `seed`.
    pub data_seed: Option<u64>,
    /// Drop the last incomplete training batch of each epoch. Default false.
    pub dataloader_drop_last: bool,
    /// Batches prepared ahead on a background thread (0: on the training thread). Default 0.
    pub dataloader_num_workers: usize,
    /// No progress bar (the log lines stay). Default false: a bar when standard error is a
    /// terminal.
    pub disable_tqdm: bool,
    /// Where logs go besides `log.jsonl`: "none" (default) or "tensorboard" (or "all"):
    /// TensorBoard event files in `logging_dir`, every logged value under HF's tags
    /// (`train/loss`, `eval/loss`, ...).
    pub report_to: ReportTo,
    /// TensorBoard's directory. Default: `output_dir/runs`.
    pub logging_dir: Option<PathBuf>,
    /// How training is spread over devices: the keys `strategy`, `devices` and `tp_size` of
    /// [`ParallelismConfig`] (flattened: each described there once).
    #[serde(flatten)]
    pub parallelism: ParallelismConfig,
    /// Graceful stop (afterburner's): on SIGTERM or SIGINT the Trainer finishes its optimizer
    /// step, saves a checkpoint and returns `Stopped` (a non-zero exit for a program that
    /// returns the error); resume with `resume_from_checkpoint = "latest"`. Default false.
    pub stop_on_signal: bool,
    /// Continue from a checkpoint: a `checkpoint-<step>` directory, or "latest" for the
    /// newest one in `output_dir`. Default: start afresh.
    pub resume_from_checkpoint: Option<String>,
    /// Stop when the best metric has not improved for this many evaluations (HF's
    /// `EarlyStoppingCallback`). Default: never stop early.
    pub early_stopping_patience: Option<usize>,
    /// How much better than the best a metric must be to count as an improvement. Default 0.
    pub early_stopping_threshold: f64,
}

impl Default for TrainingArguments {
    fn default() -> Self {
        Self {
            output_dir: PathBuf::from("trainer_output"),
            overwrite_output_dir: false,
            num_train_epochs: 3.0,
            max_steps: -1,
            per_device_train_batch_size: 8,
            per_device_eval_batch_size: 8,
            optim: OptimizerType::AdamW,
            learning_rate: 5e-5,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            max_grad_norm: 1.0,
            lr_scheduler_type: SchedulerType::Linear,
            warmup_steps: 0.0,
            warmup_ratio: 0.0,
            gradient_accumulation_steps: 1,
            loss_normalization: LossNormalization::BatchMean,
            precision: Precision::default(),
            autocast: AutocastMode::Auto,
            bf16: false,
            fp16: false,
            gradient_checkpointing: CheckpointPolicy::default(),
            eval_strategy: IntervalStrategy::No,
            eval_steps: None,
            logging_strategy: IntervalStrategy::Steps,
            logging_steps: 500.0,
            logging_first_step: false,
            save_strategy: IntervalStrategy::Steps,
            save_steps: 500.0,
            save_total_limit: None,
            load_best_model_at_end: false,
            metric_for_best_model: None,
            greater_is_better: None,
            seed: 42,
            data_seed: None,
            dataloader_drop_last: false,
            dataloader_num_workers: 0,
            disable_tqdm: false,
            report_to: ReportTo::None,
            logging_dir: None,
            parallelism: ParallelismConfig::default(),
            stop_on_signal: false,
            resume_from_checkpoint: None,
            early_stopping_patience: None,
            early_stopping_threshold: 0.0,
        }
    }
}

impl TrainingArguments {
    /// Reads arguments from a TOML (`.toml`) or JSON (any other extension) file; missing keys
    /// take the defaults.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, AccelerateError> {
        Self::from_value(read_file(path.as_ref())?)
    }

    /// Parses TOML text; missing keys take the defaults.
    pub fn from_toml(text: &str) -> Result<Self, AccelerateError> {
        Self::from_value(parse_toml(text)?)
    }

    /// Parses JSON text; missing keys take the defaults.
    pub fn from_json(text: &str) -> Result<Self, AccelerateError> {
        Self::from_value(parse_json(text)?)
    }

    /// Arguments from a JSON value (an object of keys), then [`validate`](Self::validate)d.
    pub(crate) fn from_value(value: serde_json::Value) -> Result<Self, AccelerateError> {
        // The parallelism keys are read on their own: through serde's flatten an error would
        // lose the key it names.
        let mut value = value;
        let mut parallelism = serde_json::Map::new();
        if let serde_json::Value::Object(map) = &mut value {
            for key in <ParallelismConfig as documented::DocumentedFields>::FIELD_NAMES {
                if let Some(v) = map.remove(*key) {
                    parallelism.insert(key.to_string(), v);
                }
            }
        }
        let mut args: Self = keyed(value)?;
        args.parallelism = keyed(serde_json::Value::Object(parallelism))?;
        args.validate()?;
        Ok(args)
    }

    /// The arguments as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// The arguments as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The precision actually used: `bf16` / `fp16` turn on the mixed modes.
    pub fn effective_precision(&self) -> Precision {
        match (self.bf16, self.fp16) {
            (true, _) => Precision::Bf16Mixed,
            (_, true) => Precision::F16Mixed,
            _ => self.precision,
        }
    }

    /// The metric that picks the best checkpoint, with the "eval_" prefix, when one is used.
    pub fn best_metric_name(&self) -> Option<String> {
        let name = match (&self.metric_for_best_model, self.load_best_model_at_end) {
            (Some(name), _) => name.clone(),
            (None, true) => "loss".to_string(),
            (None, false) if self.early_stopping_patience.is_some() => "loss".to_string(),
            (None, false) => return None,
        };
        Some(match name.starts_with("eval_") {
            true => name,
            false => format!("eval_{name}"),
        })
    }

    /// Whether a larger best-model metric is better (HF: false for a loss, else true).
    pub fn greater_is_better(&self) -> bool {
        self.greater_is_better.unwrap_or_else(|| {
            !matches!(self.best_metric_name().as_deref(), None | Some("eval_loss"))
        })
    }

    /// The Accelerator settings these arguments ask for. In a process started by
    /// `afterburner launch`, `devices` is the launch's number of workers.
    pub fn accelerator_config(&self) -> AcceleratorConfig {
        let base = AcceleratorConfig {
            parallelism: ParallelismConfig::default().with_devices(self.run_devices()),
            ..AcceleratorConfig::default()
        };
        self.apply_to(base)
    }

    /// The devices the run trains on: `devices`, or in a process started by `afterburner
    /// launch` the launch's number of workers.
    fn run_devices(&self) -> usize {
        match crate::parallel::Launched::from_env() {
            Ok(Some(launched)) => launched.world_size,
            _ => self.parallelism.devices,
        }
    }

    /// `base` with every setting these arguments own for training put in (all but
    /// `devices`, which says how many ranks start): the one list of what the arguments
    /// decide in the Accelerator, used to build its config and to check one built elsewhere.
    pub fn apply_to(&self, base: AcceleratorConfig) -> AcceleratorConfig {
        AcceleratorConfig {
            precision: self.effective_precision(),
            autocast: self.autocast,
            gradient_accumulation_steps: self.gradient_accumulation_steps,
            max_grad_norm: (self.max_grad_norm > 0.0).then_some(self.max_grad_norm),
            seed: self.seed,
            gradient_checkpointing: self.gradient_checkpointing,
            parallelism: self
                .parallelism
                .clone()
                .with_devices(base.parallelism.devices),
            stop_on_signal: self.stop_on_signal,
            ..base
        }
    }

    /// TensorBoard's directory: `logging_dir`, or `output_dir/runs`.
    pub fn tensorboard_dir(&self) -> PathBuf {
        self.logging_dir
            .clone()
            .unwrap_or_else(|| self.output_dir.join("runs"))
    }

    /// Checks every value, HF's cross-checks included; the error names the key.
    pub fn validate(&self) -> Result<(), AccelerateError> {
        let bad = |key: &str, value: &dyn fmt::Display, expected: &str| {
            Err(AccelerateError::argument(key, value, expected))
        };
        let positive_finite = |x: f64| x.is_finite() && x > 0.0;
        if !(self.num_train_epochs.is_finite() && self.num_train_epochs >= 0.0) {
            return bad("num_train_epochs", &self.num_train_epochs, "a number >= 0");
        }
        if self.max_steps <= 0 && self.num_train_epochs == 0.0 {
            return bad("num_train_epochs", &0, "> 0 when max_steps is not set");
        }
        for (key, value) in [
            (
                "per_device_train_batch_size",
                self.per_device_train_batch_size,
            ),
            (
                "per_device_eval_batch_size",
                self.per_device_eval_batch_size,
            ),
            (
                "gradient_accumulation_steps",
                self.gradient_accumulation_steps,
            ),
        ] {
            if value == 0 {
                return bad(key, &value, "at least 1");
            }
        }
        // The parallelism the run will have (a launch's workers are its devices).
        let devices = self.run_devices();
        self.parallelism.clone().with_devices(devices).validate()?;
        if !positive_finite(self.learning_rate) {
            return bad("learning_rate", &self.learning_rate, "a finite number > 0");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight_decay", &self.weight_decay, "a finite number >= 0");
        }
        for (key, value) in [
            ("adam_beta1", self.adam_beta1),
            ("adam_beta2", self.adam_beta2),
        ] {
            if !(0.0..1.0).contains(&value) {
                return bad(key, &value, "a number in [0, 1)");
            }
        }
        if !positive_finite(self.adam_epsilon) {
            return bad("adam_epsilon", &self.adam_epsilon, "a finite number > 0");
        }
        if !(self.max_grad_norm.is_finite() && self.max_grad_norm >= 0.0) {
            return bad("max_grad_norm", &self.max_grad_norm, "a finite number >= 0");
        }
        if !(self.warmup_steps.is_finite() && self.warmup_steps >= 0.0)
            || (self.warmup_steps > 1.0 && self.warmup_steps.fract() != 0.0)
        {
            return bad(
                "warmup_steps",
                &self.warmup_steps,
                "a whole number >= 0, or a share of the total steps below 1",
            );
        }
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            return bad("warmup_ratio", &self.warmup_ratio, "a number in [0, 1]");
        }
        if self.bf16 && self.fp16 {
            return bad("bf16", &true, "not together with fp16 = true");
        }
        if (self.bf16 || self.fp16) && self.precision != Precision::default() {
            return bad(
                "precision",
                &self.precision,
                "\"32-true\" (the default) when bf16 or fp16 is set",
            );
        }
        let steps_keys = [
            (
                "logging_steps",
                self.logging_strategy,
                Some(self.logging_steps),
            ),
            ("save_steps", self.save_strategy, Some(self.save_steps)),
            ("eval_steps", self.eval_strategy, self.eval_steps),
        ];
        for (key, strategy, value) in steps_keys {
            if let Some(v) = value
                && strategy == IntervalStrategy::Steps
                && !positive_finite(v)
            {
                return bad(
                    key,
                    &v,
                    "a number > 0 (below 1: a share of the total steps)",
                );
            }
            if let Some(v) = value
                && v > 1.0
                && v.fract() != 0.0
            {
                return bad(key, &v, "a whole number when above 1");
            }
        }
        if self.save_total_limit == Some(0) {
            return bad("save_total_limit", &0, "at least 1 (or unset: keep all)");
        }
        if self.load_best_model_at_end {
            if self.eval_strategy == IntervalStrategy::No {
                return bad(
                    "load_best_model_at_end",
                    &true,
                    "an eval_strategy other than \"no\"",
                );
            }
            if self.eval_strategy != self.save_strategy {
                return bad(
                    "save_strategy",
                    &self.save_strategy,
                    &format!(
                        "the same as eval_strategy (\"{}\") with load_best_model_at_end",
                        self.eval_strategy
                    ),
                );
            }
            let eval_steps = self.eval_steps.unwrap_or(self.logging_steps);
            if self.eval_strategy == IntervalStrategy::Steps
                && eval_steps >= 1.0
                && self.save_steps >= 1.0
                && self.save_steps % eval_steps != 0.0
            {
                return bad(
                    "save_steps",
                    &self.save_steps,
                    &format!("a multiple of eval_steps ({eval_steps}) with load_best_model_at_end"),
                );
            }
        }
        if self.early_stopping_patience.is_some() && self.eval_strategy == IntervalStrategy::No {
            return bad(
                "early_stopping_patience",
                &self.early_stopping_patience.unwrap_or_default(),
                "an eval_strategy other than \"no\"",
            );
        }
        if !(self.early_stopping_threshold.is_finite() && self.early_stopping_threshold >= 0.0) {
            return bad(
                "early_stopping_threshold",
                &self.early_stopping_threshold,
                "a finite number >= 0",
            );
        }
        if let Some(resume) = &self.resume_from_checkpoint
            && resume.trim().is_empty()
        {
            return bad(
                "resume_from_checkpoint",
                &"\"\"",
                "a checkpoint directory or \"latest\"",
            );
        }
        self.accelerator_config().validate()
    }
}

/// `value` as a `T`; an error names the key that is wrong.
fn keyed<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, AccelerateError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let key = e.path().to_string();
        let reason = e.into_inner().to_string();
        AccelerateError::InvalidArgument { key, reason }
    })
}
