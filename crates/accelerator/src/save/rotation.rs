//! Numbered, rotated saves (Accelerate's `automatic_checkpoint_naming` with `total_limit`):
//! `save_checkpoint` writes `<project.dir>/checkpoints/checkpoint_<n>` and keeps the newest
//! `project.keep_last`; `load_checkpoint` loads the newest that loads.

use std::fs;
use std::path::{Path, PathBuf};

use afterburner_parallel::ParallelStrategy;
use burn::tensor::backend::AutodiffBackend;

use super::files::is_state_dir;
use super::files::{holds_only_state_files, unique_sibling};
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
        let next = numbered(&root)
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
            rotate(&root, self.config.project.keep_last);
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
        let mut found: Vec<(u64, PathBuf)> = numbered(&root)
            .into_iter()
            .filter(|(_, dir)| is_state_dir(dir))
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
        let mut damaged = Vec::new();
        for (_, dir) in found {
            let error = match self.load_parts(&dir, parts) {
                Ok(()) => {
                    if self.is_main_process() {
                        set_aside(&damaged);
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

/// Renames damaged checkpoints aside (`.checkpoint_<n>.damaged-…`, kept for inspection), so
/// rotation no longer counts them among the ones it keeps.
fn set_aside(damaged: &[PathBuf]) {
    for dir in damaged {
        let aside = unique_sibling(dir, "damaged");
        match fs::rename(dir, &aside) {
            Ok(()) => {
                tracing::warn!(checkpoint = %dir.display(), kept = %aside.display(), "damaged checkpoint set aside")
            }
            Err(e) => {
                tracing::warn!(checkpoint = %dir.display(), error = %e, "cannot set a damaged checkpoint aside")
            }
        }
    }
}

/// Every entry of `root` named `checkpoint_<n>`, with its number.
fn numbered(root: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let digits = name.strip_prefix(PREFIX)?;
            let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
            // An absurd number is no checkpoint of ours (and would overflow the next one).
            let n = digits
                .parse::<u64>()
                .ok()
                .filter(|n| plain && *n < MAX_NUMBER)?;
            Some((n, entry.path()))
        })
        .collect()
}

/// Deletes the checkpoints afterburner wrote in `root` beyond the newest `keep`. Each is first
/// renamed aside (`.checkpoint_<n>.old-…`), so a crash mid-delete never leaves a numbered
/// directory that looks like a damaged checkpoint; such leftovers are swept here too.
fn rotate(root: &Path, keep: usize) {
    let mut ours: Vec<(u64, PathBuf)> = numbered(root)
        .into_iter()
        .filter(|(_, dir)| is_state_dir(dir))
        .collect();
    ours.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    for (_, dir) in ours.into_iter().skip(keep) {
        let aside = unique_sibling(&dir, "old");
        if fs::rename(&dir, &aside).is_ok() {
            let _ = fs::remove_dir_all(&aside);
        }
    }
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let deleted_checkpoint = name
            .strip_prefix('.')
            .and_then(|rest| rest.strip_prefix(PREFIX))
            .and_then(|rest| rest.split_once(".old-"))
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if deleted_checkpoint
            && entry.file_type().is_ok_and(|t| t.is_dir())
            && holds_only_state_files(&entry.path())
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
