//! Where a load reads from: the state itself, this rank's part of a sharded one, or, for a
//! sharded state saved at another world size, every saved rank's part merged (ZeRO-1's
//! optimizer records, FSDP's shards).

use std::path::{Path, PathBuf};

use afterburner_parallel::{ParallelStrategy, StateLayout};
use burn::tensor::backend::AutodiffBackend;

use super::parts::{Mode, StateParts, part_file};
use super::sharded::{rank_dir_name, saved_rank_dirs};
use super::state::{ACCELERATOR_FILE, AcceleratorState, StateFiles};
use crate::{AccelerateError, Accelerator};

/// Where a load reads: the directory, the mode, whether it is this rank's part of a sharded
/// state, and the saved ranks to merge (see `Accelerator::state_source`).
pub(crate) type StateSource = (PathBuf, Mode, bool, Vec<PathBuf>);

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Where this rank reads a state from, whether it is a gathered (full) one, whether it
    /// is this rank's own part of a sharded one, and the saved ranks' directories to merge
    /// when a sharded state of another world size loads into a resharding layout (ZeRO-1,
    /// FSDP; empty otherwise). Every rank takes the same path.
    pub(crate) fn state_source(&self, dir: &Path) -> Result<StateSource, AccelerateError> {
        let layout = self.strategy.state_layout();
        if layout == StateLayout::Replicated {
            return Ok((dir.to_path_buf(), Mode::Local, false, Vec::new()));
        }
        let mine = self.rank_dir(dir);
        if !layout.reshards() {
            return Ok((
                self.own_or_present_part(dir, mine),
                Mode::Local,
                true,
                Vec::new(),
            ));
        }
        let full = self.checkpointer.holds_state(dir);
        // Every rank must take the same path (each runs collectives).
        if !self.same_on_every_rank(&[u64::from(full)])? {
            return Err(AccelerateError::RanksDisagree(format!(
                "load_state: the ranks do not see the same state at {} (a full state on \
                 some, a sharded one on others)",
                dir.display()
            )));
        }
        if full {
            return Ok((dir.to_path_buf(), Mode::Gathered, false, Vec::new()));
        }
        let saved = match self.checkpointer.exists(&mine) {
            true => Vec::new(),
            false => saved_rank_dirs(&*self.checkpointer, dir),
        };
        if !self.same_on_every_rank(&[saved.len() as u64])? {
            return Err(AccelerateError::RanksDisagree(format!(
                "load_state: the ranks do not see the same sharded state at {}",
                dir.display()
            )));
        }
        match saved.first() {
            Some(rank_0) => Ok((rank_0.clone(), Mode::Gathered, false, saved)),
            None => Ok((mine, Mode::Local, true, Vec::new())),
        }
    }

    /// Under a merged load (`ranks` not empty): `read` (rank 0's files) with each optimizer
    /// part's bytes merged from every saved rank, after checking every rank's part comes
    /// from the same save.
    pub(crate) fn merge_rank_parts(
        &self,
        parts: &StateParts<'_, B, S>,
        ranks: &[PathBuf],
        (mut files, state): (StateFiles, AcceleratorState),
    ) -> Result<(StateFiles, AcceleratorState), AccelerateError> {
        if ranks.is_empty() {
            return Ok((files, state));
        }
        // One saved rank's files in memory at a time: each part reads what it needs.
        for dir in ranks {
            let rank_files = self.checkpointer.read(dir)?;
            let same_save = rank_files
                .iter()
                .find(|(n, _)| n == ACCELERATOR_FILE)
                .and_then(|(_, bytes)| serde_json::from_slice::<AcceleratorState>(bytes).ok())
                .is_some_and(|s| s.counters == state.counters);
            if !same_save {
                return Err(AccelerateError::corrupt(
                    dir.join(ACCELERATOR_FILE),
                    "this rank's part is not from the same save as rank 0's",
                ));
            }
        }
        for (name, slot) in &parts.parts {
            if let Some(bytes) = slot.merge_ranks(self, parts, name, ranks)? {
                let file = part_file(name);
                if let Some(entry) = files.iter_mut().find(|(n, _)| *n == file) {
                    entry.1 = bytes;
                }
            }
        }
        tracing::info!(
            saved_ranks = ranks.len(),
            world_size = self.world_size(),
            "merged a sharded state saved at another world size"
        );
        Ok((files, state))
    }

    /// This rank's part of a per-rank state, or, for a fault-tolerant replica whose part is
    /// missing (it died during the save, which committed among the replicas present), the
    /// lowest saved replica's part: what healing would have given it.
    fn own_or_present_part(&self, dir: &Path, mine: PathBuf) -> PathBuf {
        if !self.is_fault_tolerant() || self.checkpointer.exists(&mine) {
            return mine;
        }
        let world = self.world_size();
        let present = (0..world)
            .map(|rank| dir.join(rank_dir_name(rank, world)))
            .find(|part| self.checkpointer.exists(part));
        match present {
            Some(part) => {
                tracing::warn!(
                    rank = self.rank(),
                    checkpoint = %dir.display(),
                    from = %part.display(),
                    "this replica's part is missing from the checkpoint (it left during the \
                     save): loading a present replica's part, as healing would"
                );
                part
            }
            None => mine,
        }
    }
}
