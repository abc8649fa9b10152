//! [`Checkpointer`]: where and how saved states are stored, a value the Accelerator holds and
//! a user can replace (Fabric's `Strategy.checkpoint_io`, burn-train's checkpointers).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use afterburner_parallel::ParallelStrategy;
use burn::tensor::backend::AutodiffBackend;

use crate::{AccelerateError, Accelerator};

/// The files of one saved state: (file name, bytes), the Accelerator's own part among them.
pub type StateFiles = Vec<(String, Vec<u8>)>;

/// Where and how the Accelerator's saved states are stored. The Accelerator encodes every
/// part, agrees with the other ranks and decides which rank writes what (one state, one per
/// rank, or one gathered); a checkpointer stores and returns the files of a state at a
/// *location*, a path that names it (a directory for the default [`FileCheckpointer`], a key
/// for a store of one's own: nothing on disk need exist). Numbered checkpoints
/// (`save_checkpoint`, the Trainer's `checkpoint-<step>`) are locations inside a root, found
/// again with [`list`](Self::list).
///
/// A sharded save (`zero-1`, sharded `fsdp`) is a two-phase commit over the checkpointer:
/// rank 0 [`stage`](Self::stage)s a fresh location, every rank [`write`](Self::write)s its
/// state at `<staged>/rank-<r>-of-<n>`, and once every rank has, rank 0
/// [`commit`](Self::commit)s the staged location in place of the target in one step (or
/// [`discard`](Self::discard)s it). Under several processes, every rank must reach the same
/// store (a shared file system for files).
///
/// Set one with [`Accelerator::with_checkpointer`](crate::Accelerator::with_checkpointer) (the
/// Trainer's `with_checkpointer` forwards to it).
pub trait Checkpointer: Send + Sync {
    /// Stores `files` as the state at `location`, replacing the state there atomically: a
    /// later read sees the previous state or this one, whole, whatever fails in between.
    fn write(&self, location: &Path, files: &[(String, Vec<u8>)]) -> Result<(), AccelerateError>;

    /// The files of the state at `location`, verified: a damaged file is
    /// [`AccelerateError::Corrupt`], an unreadable one [`AccelerateError::Io`] (a load then
    /// falls back to an older checkpoint).
    fn read(&self, location: &Path) -> Result<StateFiles, AccelerateError>;

    /// Whether anything is stored at `location` (a state, a sharded one, or something else).
    fn exists(&self, location: &Path) -> bool;

    /// Whether a state (not a sharded one) was written at `location`; [`read`](Self::read)
    /// verifies it.
    fn holds_state(&self, location: &Path) -> bool;

    /// Whether `location` holds a complete saved state: one state, or a sharded one (every
    /// rank's state, each complete).
    fn is_saved(&self, location: &Path) -> bool;

    /// The names of the locations directly inside `location` (numbered checkpoints in a root,
    /// the ranks' states of a sharded one), in no particular order; none when it holds none.
    fn list(&self, location: &Path) -> Vec<String>;

    /// Errors unless a save may replace `location`: absent, or a state (whole or sharded) this
    /// checkpointer wrote. What else is there is never replaced.
    fn check_replaceable(&self, location: &Path) -> Result<(), AccelerateError>;

    /// Checks that a sharded save may replace `location` and returns a fresh, empty location
    /// beside it for the ranks' states.
    fn stage(&self, location: &Path) -> Result<PathBuf, AccelerateError>;

    /// Replaces `location` by the complete staged state `staged`, in one step.
    fn commit(&self, staged: &Path, location: &Path) -> Result<(), AccelerateError>;

    /// Drops a staged state that will not be committed.
    fn discard(&self, staged: &Path);

    /// Deletes the state at `location` (rotation, the Trainer's `save_total_limit`).
    fn remove(&self, location: &Path) -> Result<(), AccelerateError>;

    /// Takes the damaged state at `location` out of the way of later loads, keeping it for
    /// inspection where the store can (default: deleted, with a warning).
    fn set_aside(&self, location: &Path) {
        match self.remove(location) {
            Ok(()) => {
                tracing::warn!(checkpoint = %location.display(), "damaged checkpoint deleted")
            }
            Err(e) => {
                tracing::warn!(checkpoint = %location.display(), error = %e, "cannot delete a damaged checkpoint")
            }
        }
    }

    /// Removes what interrupted saves or deletions left inside `root` (default: nothing).
    fn tidy(&self, root: &Path) {
        let _ = root;
    }
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// This Accelerator, storing its saved states with `checkpointer` (every save and load:
    /// `save_state`, `save_parts`, `save_checkpoint` and their loads, the Trainer's
    /// checkpoints) instead of the default [`FileCheckpointer`](crate::FileCheckpointer). Give
    /// every rank the same store.
    pub fn with_checkpointer(mut self, checkpointer: impl Checkpointer + 'static) -> Self {
        self.checkpointer = Arc::new(checkpointer);
        self
    }

    /// Where this Accelerator stores its saved states.
    pub fn checkpointer(&self) -> &dyn Checkpointer {
        &*self.checkpointer
    }
}
