//! What the Trainer saves with each checkpoint (HF's `trainer_state.json`) and what it
//! reports: logs, evaluation metrics, the end-of-training summary.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Named values, like HF's metric dicts: `{"loss": 0.41, "learning_rate": 1e-3}` or
/// `{"eval_loss": 0.38, "eval_accuracy": 0.91}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics(pub BTreeMap<String, f64>);

impl Metrics {
    /// The value of `name`, when present.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// Sets `name` to `value`.
    pub fn insert(&mut self, name: impl Into<String>, value: f64) {
        self.0.insert(name.into(), value);
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(name, value)| format!("{name} = {}", shown(*value)))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// A value as a log line shows it: counts (bytes, calls, steps) as whole numbers, tiny ones
/// (a learning rate) in scientific notation, the rest to 6 decimals.
fn shown(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else if value != 0.0 && value.abs() < 1e-3 {
        format!("{value:.3e}")
    } else {
        format!("{value:.6}")
    }
}

/// One line of the log history: the optimizer step, the epoch (fractional) and the values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Optimizer steps taken when it was logged.
    pub step: u64,
    /// Epochs done, fractional (1.5: half-way through the second epoch).
    pub epoch: f64,
    /// The values (training: `loss`, `learning_rate`, `grad_norm`; evaluation: `eval_*`).
    pub values: Metrics,
}

/// The Trainer's progress, saved with every checkpoint as the part `trainer_state`, so a
/// resumed run continues its counters, its best model and its log history exactly.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps taken (fp16 steps skipped on overflow included, as HF counts them).
    pub global_step: u64,
    /// Epochs done, fractional.
    pub epoch: f64,
    /// Optimizer steps the run takes in all.
    pub max_steps: u64,
    /// The best value of the best-model metric so far.
    pub best_metric: Option<f64>,
    /// The checkpoint holding the best model so far.
    pub best_model_checkpoint: Option<PathBuf>,
    /// Whether the last evaluation gave a new best (its checkpoint, if saved at the same
    /// step, becomes the best one).
    pub last_eval_was_best: bool,
    /// Evaluations since the best metric last improved (early stopping).
    pub evals_without_improvement: usize,
    /// Sum of the micro-batch losses since the last log, on this rank.
    pub loss_since_log: f64,
    /// Micro-batches since the last log, on this rank.
    pub batches_since_log: u64,
    /// Sum of every micro-batch loss of the run, on this rank (for the final mean).
    pub loss_total: f64,
    /// Micro-batches of the run, on this rank.
    pub batches_total: u64,
    /// Every log and evaluation, in order.
    pub log_history: Vec<LogEntry>,
    /// The steps at which this rank rejoined the run, healed from a live replica (a Local SGD
    /// or DiLoCo replica that `afterburner launch` started again): its checkpoints say so.
    #[serde(default)]
    pub rejoined_at_steps: Vec<u64>,
}

/// What [`Trainer::train`](super::Trainer::train) returns, like HF's `TrainOutput`.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSummary {
    /// Optimizer steps taken.
    pub global_step: u64,
    /// Mean micro-batch loss over the whole run (across ranks).
    pub training_loss: f64,
    /// `train_runtime` (s), `train_samples_per_second`, `train_steps_per_second`, `epoch`.
    pub metrics: Metrics,
    /// The best checkpoint, when a best-model metric was tracked.
    pub best_model_checkpoint: Option<PathBuf>,
    /// Whether early stopping ended the run.
    pub stopped_early: bool,
}

impl fmt::Display for TrainSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trained {} steps, mean loss {:.4}; {}",
            self.global_step, self.training_loss, self.metrics
        )?;
        if let Some(best) = &self.best_model_checkpoint {
            write!(f, "; best checkpoint {}", best.display())?;
        }
        if self.stopped_early {
            f.write_str(" (stopped early)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_print_whole_and_tiny_rates_readable() {
        let mut m = Metrics::default();
        m.insert("comm_bytes_per_step", 414574.0);
        m.insert("learning_rate", 2e-5);
        m.insert("loss", 0.25);
        assert_eq!(
            m.to_string(),
            "comm_bytes_per_step = 414574, learning_rate = 2.000e-5, loss = 0.250000"
        );
    }
}
