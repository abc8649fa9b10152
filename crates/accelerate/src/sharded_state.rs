//! Sharded states (`zero-1`, sharded `fsdp`): every rank saves and loads its own complete state
//! directory, `dir/rank-<r>-of-<n>`, and the ranks agree on every outcome, so none goes on
//! alone after a failure.

use std::fs;
use std::path::{Path, PathBuf};

use afterburner_parallel::{ReduceOp, TrainingStrategy};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};

use crate::parts::StateParts;
use crate::state::AcceleratorState;
use crate::state_files::{MANIFEST, is_our_state_dir, write_atomically};
use crate::{AccelerateError, Accelerator};

/// Directory name prefix of one rank's part of a sharded state.
const RANK_PREFIX: &str = "rank-";

impl<B: AutodiffBackend> Accelerator<B> {
    /// Every rank writes its part; the call fails on every rank if it failed on any.
    pub(crate) fn save_rank_part(
        &self,
        dir: &Path,
        parts: &StateParts<'_, B>,
    ) -> Result<(), AccelerateError> {
        let written = self.check_sharded_target(dir).and_then(|()| {
            let mine = self.rank_dir(dir);
            self.check_save_target(&mine)?;
            write_atomically(&mine, &self.encode_parts(parts, |_| true)?)
        });
        self.all_ranks_succeeded(&written, "save_state")?;
        if self.is_main_process() {
            remove_other_world_sizes(dir, self.world_size());
        }
        written
    }

    /// Errors unless the ranks' parts come from one save: a save that failed on some rank
    /// leaves the others' newer parts next to its older one.
    pub(crate) fn check_same_save(
        &self,
        dir: &Path,
        state: &AcceleratorState,
    ) -> Result<(), AccelerateError> {
        let c = state.counters;
        let counters = [c.optimizer_steps, c.skipped_steps, c.micro_batches].map(|v| v as f64);
        if !self.same_on_every_rank(&counters)? {
            return Err(AccelerateError::RanksDisagree(format!(
                "load_state: the ranks' parts in {} come from different saves (their step \
                 counters differ); nothing was loaded",
                dir.display()
            )));
        }
        Ok(())
    }

    /// This rank's directory of a sharded state.
    pub(crate) fn rank_dir(&self, dir: &Path) -> PathBuf {
        dir.join(format!(
            "{RANK_PREFIX}{:05}-of-{:05}",
            self.rank(),
            self.world_size()
        ))
    }

    /// Errors unless `dir` is absent, or a real directory holding only rank directories
    /// afterburner wrote (and hidden entries, e.g. a save's temporary siblings, left alone).
    fn check_sharded_target(&self, dir: &Path) -> Result<(), AccelerateError> {
        let Ok(meta) = fs::symlink_metadata(dir) else {
            return Ok(());
        };
        let foreign = || AccelerateError::NotAStateDir {
            dir: dir.to_path_buf(),
        };
        if meta.file_type().is_symlink() {
            return Err(AccelerateError::StateDirIsLink {
                dir: dir.to_path_buf(),
                target: fs::read_link(dir).unwrap_or_default(),
            });
        }
        if !meta.is_dir() || dir.join(MANIFEST).exists() {
            return Err(foreign());
        }
        let entries = fs::read_dir(dir).map_err(|e| AccelerateError::io("reading", dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = is_rank_dir_name(&name) && is_our_state_dir(&entry.path());
            if !(ours || name.starts_with('.')) {
                return Err(foreign());
            }
        }
        Ok(())
    }

    /// The error for a sharded load whose rank directory is missing, naming what is there.
    pub(crate) fn missing_rank_dir(&self, dir: &Path, mine: &Path) -> AccelerateError {
        let mut found: Vec<String> = fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(RANK_PREFIX))
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        AccelerateError::WrongWorldSize(format!(
            "no sharded state for this rank at {} (world size {}); found: [{}]. A sharded \
             state loads at the world size it was saved with",
            mine.display(),
            self.world_size(),
            found.join(", ")
        ))
    }

    /// Tells every rank whether every rank's `result` is Ok; an error on another rank becomes
    /// an error here too.
    pub(crate) fn all_ranks_succeeded<T>(
        &self,
        result: &Result<T, AccelerateError>,
        what: &str,
    ) -> Result<(), AccelerateError> {
        let failed = self.world_size() - self.ranks_voting_yes(result.is_ok())?;
        if failed > 0 && result.is_ok() {
            return Err(AccelerateError::RanksDisagree(format!(
                "{what} failed on {failed} other rank(s); nothing was changed here"
            )));
        }
        Ok(())
    }

    /// Whether every rank passed the same `values` (small integers; two small all-reduces;
    /// true on one device): each rank checks that the sum over ranks is `world` times its own
    /// values, and the ranks then agree on the verdict.
    pub(crate) fn same_on_every_rank(&self, values: &[f64]) -> Result<bool, AccelerateError> {
        let Some(group) = self.strategy.group() else {
            return Ok(true);
        };
        let mine: Vec<f32> = values.iter().map(|v| *v as f32).collect();
        let tensor = Tensor::<B::InnerBackend, 1>::from_floats(mine.as_slice(), &self.device);
        let sums = group.all_reduce(tensor, ReduceOp::Sum)?;
        let sums = sums.into_data().to_vec::<f32>().unwrap_or_default();
        let world = self.world_size() as f32;
        let agree = sums.len() == mine.len()
            && sums
                .iter()
                .zip(&mine)
                .all(|(sum, v)| (sum - world * v).abs() < 0.5);
        Ok(self.ranks_voting_yes(agree)? == self.world_size())
    }

    /// How many ranks pass `yes` (one small all-reduce; this rank's vote on one device).
    fn ranks_voting_yes(&self, yes: bool) -> Result<usize, AccelerateError> {
        let Some(group) = self.strategy.group() else {
            return Ok(usize::from(yes));
        };
        let vote =
            Tensor::<B::InnerBackend, 1>::from_floats([f32::from(u8::from(yes))], &self.device);
        let votes = group.all_reduce(vote, ReduceOp::Sum)?.into_scalar();
        Ok(votes.elem::<f32>().round() as usize)
    }
}

/// After a sharded save, drops rank directories of other world sizes (older saves): only
/// directories named and written as afterburner rank states.
fn remove_other_world_sizes(dir: &Path, world: usize) {
    let current = format!("-of-{world:05}");
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_rank_dir_name(&name)
                && !name.ends_with(&current)
                && is_our_state_dir(&entry.path())
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Whether `name` is a rank directory's name, `rank-<5 digits>-of-<5 digits>`.
fn is_rank_dir_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(RANK_PREFIX) else {
        return false;
    };
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    rest.split_once("-of-")
        .is_some_and(|(rank, world)| digits(rank) && digits(world))
}

/// Whether `dir` holds a complete afterburner state: a manifest of its own (a replicated or
/// gathered save) or rank directories with manifests (a sharded one).
pub(crate) fn is_state_dir(dir: &Path) -> bool {
    if is_our_state_dir(dir) {
        return true;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    let mut ranks = entries
        .flatten()
        .filter(|e| is_rank_dir_name(&e.file_name().to_string_lossy()))
        .peekable();
    ranks.peek().is_some() && ranks.all(|e| is_our_state_dir(&e.path()))
}
