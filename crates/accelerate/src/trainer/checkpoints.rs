//! The Trainer's checkpoint directories: `output_dir/checkpoint-<step>/`, the newest one, and
//! rotation by `save_total_limit` that never deletes the best checkpoint.

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;

use super::TrainerState;
use crate::{AccelerateError, Checkpointer, StateParts};

const PREFIX: &str = "checkpoint-";

/// The directory of the checkpoint at optimizer step `step`.
pub fn checkpoint_dir(output_dir: &Path, step: u64) -> PathBuf {
    output_dir.join(format!("{PREFIX}{step}"))
}

/// Every complete checkpoint `checkpointer` holds in `output_dir` (a `checkpoint-<step>`
/// location holding a saved state; the default store's are directories), oldest step first.
/// Other entries are left alone.
pub fn list_checkpoints(checkpointer: &dyn Checkpointer, output_dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = checkpointer
        .list(output_dir)
        .into_iter()
        .filter_map(|name| {
            let step = name.strip_prefix(PREFIX)?.parse::<u64>().ok()?;
            let dir = output_dir.join(&name);
            checkpointer.is_saved(&dir).then_some((step, dir))
        })
        .collect();
    found.sort();
    found
}

/// The checkpoint `resume_from_checkpoint` names: "latest" (the newest complete checkpoint
/// in `output_dir`) or a directory, as `checkpointer` stores them.
pub fn resolve_checkpoint(
    checkpointer: &dyn Checkpointer,
    output_dir: &Path,
    resume: &str,
) -> Result<PathBuf, AccelerateError> {
    if resume == "latest" {
        return list_checkpoints(checkpointer, output_dir)
            .pop()
            .map(|(_, dir)| dir)
            .ok_or_else(|| {
                AccelerateError::argument(
                    "resume_from_checkpoint",
                    "\"latest\"",
                    format!(
                        "a complete checkpoint-<step> directory in {}, which has none",
                        output_dir.display()
                    ),
                )
            });
    }
    let dir = PathBuf::from(resume);
    match checkpointer.is_saved(&dir) {
        true => Ok(dir),
        false => Err(AccelerateError::argument(
            "resume_from_checkpoint",
            resume,
            "a checkpoint directory holding a saved state, or \"latest\"",
        )),
    }
}

/// The saved best checkpoint `best`, found again when the run folder was copied or moved:
/// the same `checkpoint-<step>` name in `output_dir`, else beside the checkpoint `resumed`
/// from, else `best` as saved.
pub fn relocate_best(
    checkpointer: &dyn Checkpointer,
    best: PathBuf,
    output_dir: &Path,
    resumed: &Path,
) -> PathBuf {
    let Some(name) = best.file_name() else {
        return best;
    };
    let beside_resumed = resumed.parent().map(|folder| folder.join(name));
    [Some(output_dir.join(name)), beside_resumed]
        .into_iter()
        .flatten()
        .find(|candidate| checkpointer.is_saved(candidate))
        .unwrap_or(best)
}

/// The checkpoints to delete so that at most `limit` remain: the oldest ones, never `best`
/// (kept in addition to the newest `limit - 1` when it is older than them) and never the
/// newest.
pub fn checkpoints_to_delete(
    checkpoints: &[(u64, PathBuf)],
    limit: usize,
    best: Option<&Path>,
) -> Vec<PathBuf> {
    let is_best = |dir: &Path| best.is_some_and(|b| same_dir(b, dir));
    let limit = limit.max(1);
    let window = checkpoints.len().saturating_sub(limit);
    let best_older = checkpoints[..window].iter().any(|(_, dir)| is_best(dir));
    let newest_kept = match best_older {
        true => (limit - 1).max(1),
        false => limit,
    };
    let cut = checkpoints.len().saturating_sub(newest_kept);
    checkpoints[..cut]
        .iter()
        .filter(|(_, dir)| !is_best(dir))
        .map(|(_, dir)| dir.clone())
        .collect()
}

/// The checkpoints in `output_dir` other than `best`: what HF's Trainer deletes at the end of
/// training under `save_total_limit = 1`.
pub(crate) fn all_but_best(
    checkpointer: &dyn Checkpointer,
    output_dir: &Path,
    best: &Path,
) -> Vec<PathBuf> {
    list_checkpoints(checkpointer, output_dir)
        .into_iter()
        .filter(|(_, dir)| !same_dir(dir, best))
        .map(|(_, dir)| dir)
        .collect()
}

/// Deletes the checkpoints `dirs`.
pub(crate) fn delete_checkpoints(
    checkpointer: &dyn Checkpointer,
    dirs: Vec<PathBuf>,
) -> Result<(), AccelerateError> {
    dirs.iter().try_for_each(|dir| checkpointer.remove(dir))
}

/// Warns when `output_dir` holds checkpoints already, before a fresh run trains there: its
/// own will mix with them (rotation may delete theirs, "latest" picks the newest of either).
pub(crate) fn warn_of_another_run(checkpointer: &dyn Checkpointer, output_dir: &Path) {
    let found = list_checkpoints(checkpointer, output_dir);
    if let Some((newest, _)) = found.last() {
        tracing::warn!(
            output_dir = %output_dir.display(),
            checkpoints = found.len(),
            newest,
            "output_dir holds checkpoints of another run: this run's will mix with them \
             (save_total_limit may delete them, \"latest\" resumes from the newest of \
             either); resume with resume_from_checkpoint = \"latest\", pick another \
             output_dir, or set overwrite_output_dir to train here anyway"
        );
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || a.file_name()
            .is_some_and(|name| Some(name) == b.file_name())
}

/// The parts of a Trainer checkpoint, in their saved order.
pub(crate) fn checkpoint_parts<'a, B, M, O, L, S>(
    model: &'a mut M,
    optim: &'a mut O,
    schedule: &'a mut L,
    state: &'a mut TrainerState,
) -> StateParts<'a, B, S>
where
    B: AutodiffBackend,
    M: burn::module::AutodiffModule<B> + 'static,
    O: burn::optim::Optimizer<M, B>,
    L: burn::optim::lr_scheduler::LrScheduler,
    S: crate::parallel::ParallelStrategy<B>,
{
    StateParts::new()
        .model("model", model)
        .optimizer::<M, _>("optimizer", optim)
        .scheduler("scheduler", schedule)
        .serde("trainer_state", state)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::FileCheckpointer;

    fn dirs(steps: &[u64]) -> Vec<(u64, PathBuf)> {
        steps
            .iter()
            .map(|s| (*s, checkpoint_dir(Path::new("out"), *s)))
            .collect()
    }

    #[test]
    fn a_copied_run_folder_finds_its_best_checkpoint_again() {
        let root =
            std::env::temp_dir().join(format!("afterburner-relocate-{}", std::process::id()));
        let copy = root.join("copy");
        let best_here = checkpoint_dir(&copy, 20);
        fs::create_dir_all(&best_here).unwrap();
        let manifest = r#"{"format": "afterburner-state-v1", "files": []}"#;
        fs::write(best_here.join("manifest.json"), manifest).unwrap();
        let saved = checkpoint_dir(Path::new("/gone/run"), 20);
        // In the output dir, or beside the checkpoint resumed from.
        let resumed = checkpoint_dir(&copy, 30);
        let files = &FileCheckpointer;
        assert_eq!(
            relocate_best(files, saved.clone(), &copy, &resumed),
            best_here
        );
        assert_eq!(
            relocate_best(files, saved.clone(), &root.join("other"), &resumed),
            best_here
        );
        // Nowhere to be found: as saved.
        let elsewhere = root.join("elsewhere");
        assert_eq!(
            relocate_best(files, saved.clone(), &elsewhere, &elsewhere.join("x")),
            saved
        );
        fs::remove_dir_all(root).ok();
    }

    #[test]
    fn rotation_keeps_the_best_and_the_newest() {
        let all = dirs(&[10, 20, 30, 40]);
        let best = checkpoint_dir(Path::new("out"), 10);
        let gone = checkpoints_to_delete(&all, 2, Some(&best));
        assert_eq!(gone, vec![all[1].1.clone(), all[2].1.clone()]);
        // Without a best, the newest two stay.
        let gone = checkpoints_to_delete(&all, 2, None);
        assert_eq!(gone, vec![all[0].1.clone(), all[1].1.clone()]);
        // A limit of 1 with a best older than the newest keeps both (as HF does).
        let gone = checkpoints_to_delete(&all, 1, Some(&best));
        assert_eq!(gone, vec![all[1].1.clone(), all[2].1.clone()]);
        // The best among the newest: plain rotation.
        let best = checkpoint_dir(Path::new("out"), 40);
        let gone = checkpoints_to_delete(&all, 2, Some(&best));
        assert_eq!(gone, vec![all[0].1.clone(), all[1].1.clone()]);
    }
}
