//! TensorBoard event files for the Trainer's logs (`report_to = "tensorboard"`): every value of
//! every log entry as a scalar under HF's tags (`TensorBoardCallback`'s `rewrite_logs`):
//! `eval_<name>` as `eval/<name>`, `test_<name>` as `test/<name>`, any other as
//! `train/<name>`, and the epoch as `train/epoch`. Written by the main process only.

mod event_file;

use std::path::{Path, PathBuf};

use super::LogEntry;
use crate::AccelerateError;
use event_file::EventFile;

/// The Trainer's TensorBoard writer: one event file per run in `logging_dir`.
pub(crate) struct TensorBoardLog {
    dir: PathBuf,
    file: Option<EventFile>,
}

impl TensorBoardLog {
    /// A writer into `dir` (nothing is created before [`start`](Self::start)).
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            file: None,
        }
    }

    /// Opens a new event file for a run starting after `global_step` optimizer steps (0, or
    /// the checkpoint's step it resumes from): a session start makes TensorBoard drop what an
    /// earlier run in the same directory logged past that step (all of it on a fresh run), as
    /// `log.jsonl` is rewritten from the checkpoint's history.
    pub(crate) fn start(&mut self, global_step: u64) -> Result<(), AccelerateError> {
        let mut file = EventFile::create(&self.dir)?;
        // TensorBoard drops the earlier events at or past the session start's step.
        file.session_start(if global_step == 0 { 0 } else { global_step + 1 })?;
        tracing::info!(path = %file.path().display(), "TensorBoard event file");
        self.file = Some(file);
        Ok(())
    }

    /// Writes `entry`'s values at its step.
    pub(crate) fn write(&mut self, entry: &LogEntry) -> Result<(), AccelerateError> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        file.scalars(entry.step, &scalars(entry))
    }
}

/// `entry`'s values under their TensorBoard tags, the epoch included (once: a value named
/// `epoch`, as the run's summary logs, stands for it, as in `log.jsonl`).
fn scalars(entry: &LogEntry) -> Vec<(String, f64)> {
    let mut values: Vec<(String, f64)> = entry
        .values
        .0
        .iter()
        .map(|(name, value)| (tag(name), *value))
        .collect();
    if !entry.values.0.contains_key("epoch") {
        values.push(("train/epoch".into(), entry.epoch));
    }
    values
}

/// HF's tag for a logged value's name.
pub(crate) fn tag(name: &str) -> String {
    for prefix in ["eval", "test"] {
        if let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('_')) {
            return format!("{prefix}/{rest}");
        }
    }
    format!("train/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_hfs() {
        assert_eq!(tag("loss"), "train/loss");
        assert_eq!(tag("learning_rate"), "train/learning_rate");
        assert_eq!(tag("eval_loss"), "eval/loss");
        assert_eq!(tag("eval_accuracy"), "eval/accuracy");
        assert_eq!(tag("test_loss"), "test/loss");
        assert_eq!(tag("evaluation"), "train/evaluation");
    }
}
