//! Sharded states (`zero-1`, sharded `fsdp`, and the replicas' own states under Local SGD and
//! DiLoCo): every rank saves and loads its own complete state directory,
//! `dir/rank-<r>-of-<n>`, and the ranks agree on every outcome, so none goes on alone after a
//! failure. A save is a two-phase commit: all parts are staged, then `dir` is replaced as a
//! whole. Fault-tolerant replicas commit among those present.

use std::path::{Path, PathBuf};

use afterburner_parallel::{
    Ballot, ParallelStrategy, broadcast_text_from, ranks_voting_yes, same_on_every_rank, vote,
};
use burn::tensor::backend::AutodiffBackend;

use super::Checkpointer;
use super::files::{RANK_PREFIX, is_rank_dir_name};
use super::parts::StateParts;
use super::state::AcceleratorState;
use crate::{AccelerateError, Accelerator};

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Saves a sharded state by a two-phase commit over the checkpointer: the lowest rank
    /// present (the leader; rank 0 unless a fault-tolerant group lost it) stages a fresh
    /// location (a directory next to `dir`); every rank writes its part into it; the ranks
    /// vote; only if every part is written does the leader commit it in place of `dir` (one
    /// rename). A failure on any rank at any point leaves the previous state complete, and
    /// every rank returns an error. The ranks must share the store holding `dir`.
    ///
    /// Among fault-tolerant replicas (Local SGD, DiLoCo over a quorum) the commit is over the
    /// replicas present, as their other collectives: one that dies during the save is left
    /// out of it (a later load gives it a present replica's part, as healing would), and when
    /// the leader dies the lowest replica left takes over the staged save (and commits it if
    /// the leader had not yet), so the survivors' save is never lost to one death.
    pub(crate) fn save_rank_part(
        &self,
        dir: &Path,
        parts: &StateParts<'_, B, S>,
    ) -> Result<(), AccelerateError> {
        let mut leader = self.ballot(true)?.first();
        loop {
            let created = match self.rank() == leader {
                true => self.checkpointer.stage(dir),
                false => Ok(PathBuf::new()),
            };
            let ballot = self.ballot(created.is_ok())?;
            if !ballot.voters.contains(&leader) {
                leader = ballot.first(); // it left before telling where it staged
                continue;
            }
            self.fail_unless_every_voter(&ballot, &created, "save_state")?;
            let created = created?.to_string_lossy().into_owned();
            let text = self.text_from(leader, Some(created.as_str()));
            let ballot = self.ballot(text.is_ok())?;
            if !ballot.voters.contains(&leader) {
                leader = ballot.first();
                continue;
            }
            self.fail_unless_every_voter(&ballot, &text, "save_state")?;
            let staging = PathBuf::from(text?);
            return self.write_and_commit(dir, &staging, leader, parts);
        }
    }

    /// The second phase of [`save_rank_part`](Self::save_rank_part): every rank writes its
    /// part into `staging`, the ranks vote, the leader commits (a leader that left is
    /// replaced by the lowest rank present, which commits what is still staged).
    fn write_and_commit(
        &self,
        dir: &Path,
        staging: &Path,
        mut leader: usize,
        parts: &StateParts<'_, B, S>,
    ) -> Result<(), AccelerateError> {
        let mine = staging.join(self.rank_dir_name());
        let staged = self
            .encode_parts(parts, |_| true)
            .and_then(|files| self.checkpointer.write(&mine, &files));
        let ballot = self.ballot(staged.is_ok())?;
        if ballot.no() > 0 {
            // Every rank has voted, so none is still writing in it.
            if self.rank() == ballot.first() {
                self.checkpointer.discard(staging);
            }
            self.fail_unless_every_voter(&ballot, &staged, "save_state")?;
            return staged;
        }
        if !ballot.voters.contains(&leader) {
            leader = ballot.first();
        }
        loop {
            // A leader that took over commits only what its predecessor left staged.
            let committed = match self.rank() == leader && self.checkpointer.exists(staging) {
                true => self.checkpointer.commit(staging, dir),
                false => Ok(()),
            };
            let ballot = self.ballot(committed.is_ok())?;
            if !ballot.voters.contains(&leader) {
                tracing::warn!(
                    leader,
                    checkpoint = %dir.display(),
                    "the replica committing the save left; the lowest replica present takes over"
                );
                leader = ballot.first();
                continue;
            }
            if committed.is_err() && self.rank() == leader {
                self.checkpointer.discard(staging);
            }
            // A rank that failed already returned its error with the others' vote; the commit
            // outcome still reaches every rank.
            self.fail_unless_every_voter(&ballot, &committed, "save_state")?;
            return committed;
        }
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
        rank_dir_name(self.rank(), self.world_size())
    }

    /// Rank `root`'s `text` (`Some` there, ignored elsewhere) on every rank.
    fn text_from(&self, root: usize, text: Option<&str>) -> Result<String, AccelerateError> {
        Ok(broadcast_text_from(
            self.strategy.group(),
            root,
            text,
            &self.device,
        )?)
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
    /// Among fault-tolerant replicas, over the ranks present (a replica that died is no
    /// failure).
    pub(crate) fn all_ranks_succeeded<T>(
        &self,
        result: &Result<T, AccelerateError>,
        what: &str,
    ) -> Result<(), AccelerateError> {
        let ballot = self.ballot(result.is_ok())?;
        self.fail_unless_every_voter(&ballot, result, what)
    }

    /// The error for this rank when `ballot` holds another rank's no (this rank's own error
    /// is the caller's to return).
    fn fail_unless_every_voter<T>(
        &self,
        ballot: &Ballot,
        result: &Result<T, AccelerateError>,
        what: &str,
    ) -> Result<(), AccelerateError> {
        let failed = ballot.no();
        if failed > 0 && result.is_ok() {
            return Err(AccelerateError::RanksDisagree(format!(
                "{what} failed on {failed} other rank(s); nothing was changed here"
            )));
        }
        Ok(())
    }

    /// Who is present and how many pass `yes` (this rank alone on one device).
    pub(crate) fn ballot(&self, yes: bool) -> Result<Ballot, AccelerateError> {
        Ok(vote(self.strategy.group(), yes, &self.device)?)
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

/// The name of rank `rank`'s directory in a sharded state of `world` ranks,
/// `rank-<r>-of-<n>`.
pub(crate) fn rank_dir_name(rank: usize, world: usize) -> String {
    format!("{RANK_PREFIX}{rank:05}-of-{world:05}")
}
