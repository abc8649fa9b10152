//! Numbered, rotated saves (Accelerate's `automatic_checkpoint_naming` with `total_limit`):
//! `save_checkpoint` writes `<project.dir>/checkpoints/checkpoint_<n>` and keeps the newest
//! `project.keep_last`; `load_checkpoint` loads the newest that loads.

use std::path::{Path, PathBuf};

use afterburner_parallel::ParallelStrategy;
use burn::tensor::backend::AutodiffBackend;

use super::Checkpointer;
use crate::{AccelerateError, Accelerator, StateParts};

/// A checkpoint directory's name prefix.
const PREFIX: &str = "checkpoint_";

/// Checkpoint numbers at or above this are ignored (never written, never deleted).
const MAX_NUMBER: u64 = 1 << 48;

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Saves `parts` like [`save_parts`](Self::save_parts) to the next numbered directory,
    /// `<project.dir>/checkpoints/checkpoint_<n>` (n from 0, one more than the highest there),
    /// then deletes the oldest checkpoints beyond `project.keep_last`: only once the new one
    /// is complete, and only directories afterburner wrote. Returns the new checkpoint's path.
    /// Every rank calls it.
    pub fn save_checkpoint(
        &self,
        parts: &StateParts<'_, B, S>,
    ) -> Result<PathBuf, AccelerateError> {
        let root = self.checkpoints_dir()?;
        let next = numbered(&*self.checkpointer, &root)
            .iter()
            .map(|(n, _)| n + 1)
            .max()
            .unwrap_or(0);
        if !self.same_on_every_rank(&[next])? {
            return Err(AccelerateError::RanksDisagree(format!(
                "save_checkpoint: the ranks see different checkpoints in {} (a shared file \
                 system is needed)",
                root.display()
            )));
        }
        let dir = root.join(format!("{PREFIX}{next}"));
        self.save_parts(&dir, parts)?;
        if self.is_main_process() {
            rotate(&*self.checkpointer, &root, self.config.project.keep_last);
        }
        Ok(dir)
    }

    /// Loads the newest checkpoint of `<project.dir>/checkpoints` into `parts` (like
    /// [`load_parts`](Self::load_parts)) and returns its path; `None` when there is none (a
    /// fresh start). A damaged checkpoint (a file that fails its length or checksum check, or
    /// cannot be read) is set aside with a warning and the next older one is tried; if none
    /// loads, the newest one's error is returned. Any other error is returned at once, the
    /// checkpoint left in place: a model that does not fit, or an intact checkpoint of
    /// another model ([`AccelerateError::Mismatched`]). Every rank calls it.
    pub fn load_checkpoint(
        &mut self,
        parts: &mut StateParts<'_, B, S>,
    ) -> Result<Option<PathBuf>, AccelerateError> {
        let root = self.checkpoints_dir()?;
        let mut found: Vec<(u64, PathBuf)> = numbered(&*self.checkpointer, &root)
            .into_iter()
            .filter(|(_, dir)| self.checkpointer.is_saved(dir))
            .collect();
        found.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
        let newest = found.first().map_or(0, |(n, _)| *n + 1);
        if !self.same_on_every_rank(&[found.len() as u64, newest])? {
            return Err(AccelerateError::RanksDisagree(format!(
                "load_checkpoint: the ranks see different checkpoints in {}",
                root.display()
            )));
        }
        let mut first_error = None;
        let mut damaged: Vec<PathBuf> = Vec::new();
        for (_, dir) in found {
            let error = match self.load_parts(&dir, parts) {
                Ok(()) => {
                    if self.is_main_process() {
                        damaged.iter().for_each(|d| self.checkpointer.set_aside(d));
                    }
                    return Ok(Some(dir));
                }
                Err(e) => e,
            };
            // Only damage (a file that fails its checks or cannot be read) on some rank falls
            // back; any other error (a model that does not fit, memory) is the answer. The
            // ranks vote, so all take the same path.
            let damage = matches!(
                error,
                AccelerateError::Corrupt { .. } | AccelerateError::Io { .. }
            );
            if self.ranks_voting_yes(damage)? == 0 {
                return Err(first_error.unwrap_or(error));
            }
            tracing::warn!(checkpoint = %dir.display(), error = %error, "checkpoint is damaged; trying the previous one");
            damaged.push(dir);
            first_error.get_or_insert(error);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// `<project.dir>/checkpoints`, or the error naming the missing setting.
    fn checkpoints_dir(&self) -> Result<PathBuf, AccelerateError> {
        match &self.config.project.dir {
            Some(dir) => Ok(dir.join("checkpoints")),
            None => Err(AccelerateError::Usage(
                "save_checkpoint / load_checkpoint need the project directory: set \
                 `project.dir` in the AcceleratorConfig ([project] dir = \"...\")"
                    .into(),
            )),
        }
    }
}

/// Every entry of `root` named `checkpoint_<n>`, with its number.
fn numbered(checkpointer: &dyn Checkpointer, root: &Path) -> Vec<(u64, PathBuf)> {
    checkpointer
        .list(root)
        .into_iter()
        .filter_map(|name| {
            let digits = name.strip_prefix(PREFIX)?;
            let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
            // An absurd number is no checkpoint of ours (and would overflow the next one).
            let n = digits
                .parse::<u64>()
                .ok()
                .filter(|n| plain && *n < MAX_NUMBER)?;
            Some((n, root.join(&name)))
        })
        .collect()
}

/// Deletes the complete checkpoints in `root` beyond the newest `keep`, then lets the
/// checkpointer sweep what an interrupted deletion left (the file store renames each aside
/// before deleting it, so a crash never leaves a half-deleted numbered checkpoint).
fn rotate(checkpointer: &dyn Checkpointer, root: &Path, keep: usize) {
    let mut ours: Vec<(u64, PathBuf)> = numbered(checkpointer, root)
        .into_iter()
        .filter(|(_, dir)| checkpointer.is_saved(dir))
        .collect();
    ours.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    for (_, dir) in ours.into_iter().skip(keep) {
        if let Err(e) = checkpointer.remove(&dir) {
            tracing::warn!(checkpoint = %dir.display(), error = %e, "cannot delete an old checkpoint");
        }
    }
    checkpointer.tidy(root);
}
