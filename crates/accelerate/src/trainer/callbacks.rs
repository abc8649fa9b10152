//! Hooks into the Trainer's loop (HF's `TrainerCallback`), and early stopping as one of them.

use std::path::Path;

use super::{LogEntry, Metrics, TrainerState};

/// What a callback asks of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Flow {
    /// Go on.
    #[default]
    Continue,
    /// End training after this step (the final save and log still happen).
    Stop,
}

/// Called by the Trainer at each event, on every rank; every method does nothing by
/// default. A callback that returns [`Flow::Stop`] ends the run on every rank (the ranks
/// agree, so a callback must decide from values that are the same on every rank, like
/// evaluation metrics).
pub trait TrainerCallback: Send {
    /// After each optimizer step.
    fn on_step_end(&mut self, _state: &TrainerState) -> Flow {
        Flow::Continue
    }
    /// After each log line (training loss, learning rate, ...).
    fn on_log(&mut self, _state: &TrainerState, _entry: &LogEntry) {}
    /// After each evaluation, with its metrics.
    fn on_evaluate(&mut self, _state: &TrainerState, _metrics: &Metrics) -> Flow {
        Flow::Continue
    }
    /// After each checkpoint is written.
    fn on_save(&mut self, _state: &TrainerState, _checkpoint: &Path) {}
    /// At the end of training.
    fn on_train_end(&mut self, _state: &TrainerState) {}
    /// Whether `on_step_end` or `on_evaluate` may return [`Flow::Stop`] (default true). On
    /// several ranks the Trainer votes after every step so that all of them stop together,
    /// when any callback may stop: one host read a step (the device waits for it). A callback
    /// that only watches (a logger, a counter) returns false and costs nothing. Register the
    /// same callbacks on every rank.
    fn may_stop(&self) -> bool {
        true
    }
}

/// Stops training when the best-model metric has not improved by more than `threshold` for
/// `patience` evaluations in a row (HF's `EarlyStoppingCallback`). The Trainer adds it when
/// `early_stopping_patience` is set; it reads the count the Trainer keeps in its state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EarlyStopping {
    /// Evaluations without improvement that end the run.
    pub patience: usize,
}

impl TrainerCallback for EarlyStopping {
    fn on_evaluate(&mut self, state: &TrainerState, _metrics: &Metrics) -> Flow {
        match state.evals_without_improvement >= self.patience {
            true => Flow::Stop,
            false => Flow::Continue,
        }
    }
}
