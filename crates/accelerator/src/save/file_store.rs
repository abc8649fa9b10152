//! [`FileCheckpointer`]: the default [`Checkpointer`], states as directories on disk (files.rs
//! does the atomic writes, the manifest, the verified reads and the crash debris).

use std::fs;
use std::path::{Path, PathBuf};

use super::Checkpointer;
use super::checkpointer::StateFiles;
use super::files::{
    MANIFEST, check_replaceable, holds_only_rank_states, holds_only_state_files, is_our_state_dir,
    is_state_dir, new_staging_dir, read_verified, recover_moved_aside, swap_into_place,
    unique_sibling, write_atomically,
};
use crate::AccelerateError;

/// States as directories: one file per part and a `manifest.json` of every file's length and
/// CRC-32 written last; each save goes to a temporary sibling directory, fsynced, renamed into
/// place (a crash leaves the old state or the new one, and the next save or load recovers or
/// sweeps what it left); a sharded state is `rank-<r>-of-<n>` directories inside one. Only
/// directories it wrote are ever replaced or deleted; a damaged checkpoint is renamed aside
/// (`.<name>.damaged-…`), kept for inspection.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileCheckpointer;

impl Checkpointer for FileCheckpointer {
    fn write(&self, location: &Path, files: &[(String, Vec<u8>)]) -> Result<(), AccelerateError> {
        write_atomically(location, files)
    }

    fn read(&self, location: &Path) -> Result<StateFiles, AccelerateError> {
        read_verified(location)
    }

    fn exists(&self, location: &Path) -> bool {
        recover_moved_aside(location);
        location.is_dir()
    }

    fn holds_state(&self, location: &Path) -> bool {
        recover_moved_aside(location);
        location.join(MANIFEST).is_file()
    }

    fn is_saved(&self, location: &Path) -> bool {
        is_state_dir(location)
    }

    fn list(&self, location: &Path) -> Vec<String> {
        let Ok(entries) = fs::read_dir(location) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect()
    }

    fn check_replaceable(&self, location: &Path) -> Result<(), AccelerateError> {
        check_replaceable(location)
    }

    /// Checks `location` is absent, or a real directory holding only a state of ours (whole,
    /// or rank directories, with an older version's `.rank-*` leftovers): the whole directory
    /// is replaced, so it must hold nothing of the user's. Then creates the staging directory.
    fn stage(&self, location: &Path) -> Result<PathBuf, AccelerateError> {
        if let Ok(meta) = fs::symlink_metadata(location) {
            if meta.file_type().is_symlink() {
                return Err(AccelerateError::StateDirIsLink {
                    dir: location.to_path_buf(),
                    target: fs::read_link(location).unwrap_or_default(),
                });
            }
            // A full state of ours (e.g. saved under DDP before this ZeRO-1 run) is replaced.
            let ours = is_our_state_dir(location) || holds_only_rank_states(location);
            if !(meta.is_dir() && ours) {
                return Err(AccelerateError::NotAStateDir {
                    dir: location.to_path_buf(),
                });
            }
        }
        new_staging_dir(location)
    }

    fn commit(&self, staged: &Path, location: &Path) -> Result<(), AccelerateError> {
        swap_into_place(staged, location)
    }

    fn discard(&self, staged: &Path) {
        let _ = fs::remove_dir_all(staged);
    }

    /// Renames the directory aside (`.<name>.old-…`) first, so a crash mid-delete never leaves
    /// a directory that looks like a damaged checkpoint ([`tidy`](Checkpointer::tidy) sweeps
    /// such leftovers).
    fn remove(&self, location: &Path) -> Result<(), AccelerateError> {
        let aside = unique_sibling(location, "old");
        fs::rename(location, &aside)
            .and_then(|()| fs::remove_dir_all(&aside))
            .map_err(|e| AccelerateError::io("deleting", location, e))
    }

    /// Renames the damaged checkpoint aside (`.<name>.damaged-…`, kept for inspection), so
    /// rotation no longer counts it among the ones it keeps.
    fn set_aside(&self, location: &Path) {
        let aside = unique_sibling(location, "damaged");
        match fs::rename(location, &aside) {
            Ok(()) => {
                tracing::warn!(checkpoint = %location.display(), kept = %aside.display(), "damaged checkpoint set aside")
            }
            Err(e) => {
                tracing::warn!(checkpoint = %location.display(), error = %e, "cannot set a damaged checkpoint aside")
            }
        }
    }

    /// Sweeps what a deletion cut short left in `root`: hidden `.<name>.old-<pid>-<nanos>`
    /// directories holding only state files.
    fn tidy(&self, root: &Path) {
        let Ok(entries) = fs::read_dir(root) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            let deleted = name
                .strip_prefix('.')
                .and_then(|rest| rest.rsplit_once(".old-"))
                .and_then(|(_, ids)| ids.split_once('-'))
                .is_some_and(|(pid, nanos)| numeric(pid) && numeric(nanos));
            if deleted
                && entry.file_type().is_ok_and(|t| t.is_dir())
                && holds_only_state_files(&entry.path())
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}
