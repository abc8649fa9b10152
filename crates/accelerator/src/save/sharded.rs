//! Sharded states (`zero-1`, sharded `fsdp`): every rank saves and loads its own complete state
//! directory, `dir/rank-<r>-of-<n>`, and the ranks agree on every outcome, so none goes on
//! alone after a failure. A save is a two-phase commit: all parts are staged, then `dir` is
//! replaced as a whole.

use std::path::{Path, PathBuf};

use afterburner_parallel::{
    ParallelStrategy, broadcast_text, ranks_voting_yes, same_on_every_rank,
};
use burn::tensor::backend::AutodiffBackend;

use super::Checkpointer;
use super::files::{RANK_PREFIX, is_rank_dir_name};
use super::parts::StateParts;
use super::state::AcceleratorState;
use crate::{AccelerateError, Accelerator};

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Saves a sharded state by a two-phase commit over the checkpointer: rank 0 stages a
    /// fresh location (a directory next to `dir`); every rank writes its part into it; the
    /// ranks vote; only if every part is written does rank 0 commit it in place of `dir` (one
    /// rename). A failure on any rank at any point leaves the previous state complete, and
    /// every rank returns an error. The ranks must share the store holding `dir`.
    pub(crate) fn save_rank_part(
        &self,
        dir: &Path,
        parts: &StateParts<'_, B, S>,
    ) -> Result<(), AccelerateError> {
        let staging = self.agree_on_staging_dir(dir)?;
        let mine = staging.join(self.rank_dir_name());
        let staged = self
            .encode_parts(parts, |_| true)
            .and_then(|files| self.checkpointer.write(&mine, &files));
        let voted = self.all_ranks_succeeded(&staged, "save_state");
        let committed = voted
            .and(staged)
            .and_then(|()| match self.is_main_process() {
                true => self.checkpointer.commit(&staging, dir),
                false => Ok(()),
            });
        if committed.is_err() && self.is_main_process() {
            // Every rank has voted, so none is still writing in it.
            self.checkpointer.discard(&staging);
        }
        // A rank that failed already returned its error with the others' vote; the commit
        // outcome still reaches every rank.
        self.all_ranks_succeeded(&committed, "save_state")?;
        committed
    }

    /// Rank 0 checks `dir` and stages the sharded save; every rank learns the staged location
    /// (or rank 0's error).
    fn agree_on_staging_dir(&self, dir: &Path) -> Result<PathBuf, AccelerateError> {
        let created = match self.is_main_process() {
            true => self.checkpointer.stage(dir),
            false => Ok(PathBuf::new()),
        };
        self.all_ranks_succeeded(&created, "save_state")?;
        let created = created?.to_string_lossy().into_owned();
        let staged = self.broadcast_text(Some(created.as_str()))?;
        Ok(PathBuf::from(staged))
    }

    /// Errors unless the ranks' parts come from one save: a save that failed on some rank
    /// leaves the others' newer parts next to its older one.
    pub(crate) fn check_same_save(
        &self,
        dir: &Path,
        state: &AcceleratorState,
    ) -> Result<(), AccelerateError> {
        let c = state.counters;
        let counters = [c.optimizer_steps, c.skipped_steps, c.micro_batches];
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
        dir.join(self.rank_dir_name())
    }

    /// The name of this rank's directory in a sharded state, `rank-<r>-of-<n>`.
    fn rank_dir_name(&self) -> String {
        format!(
            "{RANK_PREFIX}{:05}-of-{:05}",
            self.rank(),
            self.world_size()
        )
    }

    /// Rank 0's `text` (`Some` there, ignored elsewhere) on every rank.
    fn broadcast_text(&self, text: Option<&str>) -> Result<String, AccelerateError> {
        Ok(broadcast_text(self.strategy.group(), text, &self.device)?)
    }

    /// The error for a sharded load whose rank directory is missing, naming what is there.
    pub(crate) fn missing_rank_dir(&self, dir: &Path, mine: &Path) -> AccelerateError {
        let mut found: Vec<String> = self
            .checkpointer
            .list(dir)
            .into_iter()
            .filter(|n| n.starts_with(RANK_PREFIX))
            .collect();
        found.sort();
        let loads = match self.strategy.state_layout().reshards() {
            true => {
                "A sharded state loads at any world size when it holds one complete save \
                 (rank-00000-of-N to rank-<N-1>-of-N)"
            }
            false => "This strategy's per-rank state loads at the world size that saved it",
        };
        AccelerateError::WrongWorldSize(format!(
            "no sharded state for this rank at {} (world size {}); found: [{}]. {loads}",
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

    /// Whether every rank passed the same `values` (true on one device).
    pub(crate) fn same_on_every_rank(&self, values: &[u64]) -> Result<bool, AccelerateError> {
        Ok(same_on_every_rank(
            self.strategy.group(),
            values,
            &self.device,
        )?)
    }

    /// How many ranks pass `yes` (this rank's vote on one device).
    pub(crate) fn ranks_voting_yes(&self, yes: bool) -> Result<usize, AccelerateError> {
        Ok(ranks_voting_yes(self.strategy.group(), yes, &self.device)?)
    }
}

/// The rank directories of the sharded state in `dir`, in rank order, when they form one
/// complete save (`rank-<r>-of-<n>` for every r below one n); empty otherwise.
pub(crate) fn saved_rank_dirs(checkpointer: &dyn Checkpointer, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(usize, usize, PathBuf)> = checkpointer
        .list(dir)
        .into_iter()
        .filter_map(|name| {
            if !is_rank_dir_name(&name) {
                return None;
            }
            let (rank, world) = name.strip_prefix(RANK_PREFIX)?.split_once("-of-")?;
            Some((world.parse().ok()?, rank.parse().ok()?, dir.join(&name)))
        })
        .collect();
    found.sort();
    let complete = found.first().is_some_and(|(world, _, _)| {
        found.len() == *world
            && found
                .iter()
                .enumerate()
                .all(|(i, (w, rank, _))| w == world && *rank == i)
    });
    match complete {
        true => found.into_iter().map(|(_, _, path)| path).collect(),
        false => Vec::new(),
    }
}
