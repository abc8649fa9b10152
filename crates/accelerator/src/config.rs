//! The Accelerator's settings, as data (serde) with documented defaults.

use afterburner_checkpoint::CheckpointPolicy;
use afterburner_parallel::spellings;
pub use afterburner_precision::AutocastMode;
use afterburner_precision::{GradScalerConfig, Precision};

use serde::{Deserialize, Serialize};
use serde_with::{DeserializeFromStr, SerializeDisplay};

use crate::{AccelerateError, ParallelismConfig, StrategyConfig};

/// How the [`Accelerator`](crate::Accelerator) trains. Loadable from TOML/JSON; missing fields
/// take the defaults below (Lightning's / Accelerate's where they have one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AcceleratorConfig {
    /// Precision policy: "32-true" (default), "bf16-mixed", "16-mixed", "bf16-true", "16-true".
    pub precision: Precision,
    /// How the mixed precisions run the forward: "op" (per op, as `torch.autocast`: matmul,
    /// Linear and convolutions in half, reductions, exp/log, softmax and layer norm in f32;
    /// needs the backend wrapped as `Autodiff<afterburner::Autocast<B>>`), "view" (every op
    /// of a half copy of the model) or "auto" (default: "op" where the backend has `Autocast`,
    /// "view" otherwise). See docs/precision.md.
    pub autocast: AutocastMode,
    /// Micro-batches per optimizer step; the update uses their mean gradient. Default 1.
    pub gradient_accumulation_steps: usize,
    /// Clip the global gradient norm to this value before each step (after unscaling).
    /// Default: no clipping.
    pub max_grad_norm: Option<f64>,
    /// Seed for the backend RNG (re-derived every optimizer step) and data shuffling.
    /// Default 42.
    pub seed: u64,
    /// Loss-scaler settings, used by "16-mixed" only. Default: PyTorch's.
    pub grad_scaler: GradScalerConfig,
    /// Activation checkpointing of the model's `Checkpointed` blocks: `false` / "none"
    /// (default), `true` / "all", `"every-<k>"`, "selective", or "balanced" (Burn's
    /// `BalancedCheckpointing` backend, which the backend type must then be).
    pub gradient_checkpointing: CheckpointPolicy,
    /// How training is spread over devices ([`ParallelismConfig`], flattened: the keys
    /// `strategy`, `devices` and `tp_size`). The multi-device strategies run through
    /// [`Accelerator::run`](crate::Accelerator::run) or
    /// [`launch`](crate::Accelerator::launch); under `tp_size > 1` call
    /// [`Accelerator::parallelize`](crate::Accelerator::parallelize) before `setup`.
    #[serde(flatten)]
    pub parallelism: ParallelismConfig,
    /// Seconds a collective may wait for the other ranks before the run fails. Default 300.
    pub collective_timeout_s: f64,
    /// What a step whose gradients hold inf or NaN does outside fp16 (whose loss scaler always
    /// skips and backs off): "skip" (default: parameters, optimizer state and LR schedule
    /// untouched, counted in `skipped_steps`), "error" (the step fails with
    /// `NonFinite`, nothing applied) or "apply" (PyTorch's fp32 behaviour: no check, no
    /// cost, the update poisons the weights). Under "skip" and "error", `save_state` also
    /// refuses a model with non-finite parameters.
    pub nonfinite_gradients: NonFinitePolicy,
    /// Where [`save_checkpoint`](crate::Accelerator::save_checkpoint) writes numbered states
    /// and how many it keeps, the `[project]` table (Accelerate's `ProjectConfiguration`).
    pub project: ProjectConfig,
    /// Opt-in graceful stop: a SIGTERM or SIGINT no longer kills the process but makes
    /// [`Accelerator::stop_requested`](crate::Accelerator::stop_requested) true (on every
    /// rank at the same step), so the loop can save and exit; a second SIGINT exits at once
    /// (SIGTERM never does). Building an Accelerator with it clears an earlier request.
    /// The Trainer saves a checkpoint and returns `Stopped`. Default false.
    pub stop_on_signal: bool,
}

/// Numbered, rotated saves (see [`AcceleratorConfig::project`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProjectConfig {
    /// The project directory: checkpoints go to `<dir>/checkpoints/checkpoint_<n>`.
    /// Default: none (`save_checkpoint` then errors).
    pub dir: Option<std::path::PathBuf>,
    /// How many checkpoints to keep, newest first (Accelerate's `total_limit`): older ones are
    /// deleted once a new one is completely written. Default 2, so a complete previous state
    /// always survives the newest (a damaged newest one falls back to it on load).
    pub keep_last: usize,
}

impl Default for ProjectConfig {
    fn default() -> Self {
        Self {
            dir: None,
            keep_last: 2,
        }
    }
}

/// What a step with inf/NaN gradients does (see [`AcceleratorConfig::nonfinite_gradients`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    SerializeDisplay,
    DeserializeFromStr,
    strum::Display,
    strum::EnumString,
    strum::EnumIter,
    strum::EnumMessage,
)]
#[strum(
    serialize_all = "lowercase",
    ascii_case_insensitive,
    parse_err_ty = AccelerateError,
    parse_err_fn = NonFinitePolicy::unknown
)]
pub enum NonFinitePolicy {
    /// Skip the step and count it.
    #[default]
    Skip,
    /// Fail the step.
    Error,
    /// Apply it (no check).
    Apply,
}

impl NonFinitePolicy {
    fn unknown(given: &str) -> AccelerateError {
        let expected = format!("one of: {}", spellings::<Self>());
        AccelerateError::invalid("nonfinite_gradients", given, expected)
    }
}

impl Default for AcceleratorConfig {
    fn default() -> Self {
        Self {
            precision: Precision::default(),
            autocast: AutocastMode::Auto,
            gradient_accumulation_steps: 1,
            max_grad_norm: None,
            seed: 42,
            grad_scaler: GradScalerConfig::default(),
            gradient_checkpointing: CheckpointPolicy::None,
            parallelism: ParallelismConfig::default(),
            collective_timeout_s: 300.0,
            nonfinite_gradients: NonFinitePolicy::Skip,
            project: ProjectConfig::default(),
            stop_on_signal: false,
        }
    }
}

impl AcceleratorConfig {
    /// This config with another strategy (its devices and `tp_size` kept).
    pub fn with_strategy(mut self, strategy: StrategyConfig) -> Self {
        self.parallelism.strategy = strategy;
        self
    }

    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), AccelerateError> {
        self.validate_common()?;
        self.parallelism.validate()
    }

    /// Checks every field but the built-in strategies' (`strategy` and its tables), for an
    /// Accelerator that trains with a strategy of the user's.
    pub(crate) fn validate_common(&self) -> Result<(), AccelerateError> {
        if self.gradient_accumulation_steps == 0 {
            return Err(AccelerateError::invalid(
                "gradient_accumulation_steps",
                0,
                "at least 1",
            ));
        }
        if let Some(norm) = self.max_grad_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            return Err(AccelerateError::invalid(
                "max_grad_norm",
                norm,
                "a finite number > 0, or none",
            ));
        }
        if self.parallelism.devices == 0 {
            return Err(AccelerateError::invalid("devices", 0, "at least 1"));
        }
        // A finite, bounded wait: a Duration cannot hold 1e300 s (and a week is no timeout).
        if !(self.collective_timeout_s > 0.0
            && self.collective_timeout_s <= afterburner_parallel::launched::MAX_TIMEOUT_S)
        {
            return Err(AccelerateError::invalid(
                "collective_timeout_s",
                self.collective_timeout_s,
                "a number of seconds > 0 and at most 604800 (one week)",
            ));
        }
        if self.project.keep_last == 0 {
            return Err(AccelerateError::invalid(
                "project.keep_last",
                0,
                "at least 1 checkpoint (2 or more keep a complete previous one)",
            ));
        }
        self.grad_scaler.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_accumulation_steps_is_named() {
        let c = AcceleratorConfig {
            gradient_accumulation_steps: 0,
            ..Default::default()
        };
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("gradient_accumulation_steps"), "{msg}");
    }

    #[test]
    fn loads_from_json_with_defaults_and_rejects_typos() {
        let c: AcceleratorConfig =
            serde_json::from_str(r#"{"precision": "bf16-mixed", "max_grad_norm": 1.0}"#).unwrap();
        assert_eq!(c.precision, Precision::Bf16Mixed);
        assert_eq!(c.gradient_accumulation_steps, 1);
        let err = serde_json::from_str::<AcceleratorConfig>(r#"{"precision": "bf17"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bf17") && err.contains("bf16-mixed"), "{err}");
        assert!(serde_json::from_str::<AcceleratorConfig>(r#"{"precison": "32"}"#).is_err());
        let c: AcceleratorConfig =
            serde_json::from_str(r#"{"gradient_checkpointing": true}"#).unwrap();
        assert_eq!(c.gradient_checkpointing, CheckpointPolicy::All);
        let err =
            serde_json::from_str::<AcceleratorConfig>(r#"{"gradient_checkpointing": "most"}"#)
                .unwrap_err()
                .to_string();
        assert!(err.contains("most") && err.contains("every-<k>"), "{err}");
        assert!(
            AcceleratorConfig {
                max_grad_norm: Some(-1.0),
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        // Unknown keys inside a nested table are errors too.
        let err = serde_json::from_str::<AcceleratorConfig>(r#"{"grad_scaler": {"init_scal": 8}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("init_scal"), "{err}");
    }

    #[test]
    fn a_huge_or_infinite_timeout_is_named_not_a_panic() {
        for bad in [1e300, f64::INFINITY, f64::NAN, 0.0, -1.0] {
            let c = AcceleratorConfig {
                collective_timeout_s: bad,
                ..Default::default()
            };
            let msg = c.validate().unwrap_err().to_string();
            assert!(msg.contains("collective_timeout_s"), "{bad}: {msg}");
        }
    }
}
