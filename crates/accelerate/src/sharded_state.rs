//! Sharded states (`zero-1`, sharded `fsdp`): every rank saves and loads its own complete state
//! directory, `dir/rank-<r>-of-<n>`, and the ranks agree on every outcome, so none goes on
//! alone after a failure.

use std::fs;
use std::path::{Path, PathBuf};

use afterburner_parallel::{ReduceOp, TrainingStrategy};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};

use crate::state_files::MANIFEST;
use crate::{AccelerateError, Accelerator};

/// Directory name prefix of one rank's part of a sharded state.
const RANK_PREFIX: &str = "rank-";

impl<B: AutodiffBackend> Accelerator<B> {
    /// Every rank writes its part; the call fails on every rank if it failed on any.
    pub(crate) fn save_sharded_state<M, O, S>(
        &self,
        dir: &Path,
        model: &M,
        optimizer: &O,
        scheduler: &S,
    ) -> Result<(), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        let written = self.write_rank_state(dir, model, optimizer, scheduler);
        self.all_ranks_succeeded(&written, "save_state")?;
        if self.is_main_process() {
            remove_other_world_sizes(dir, self.world_size());
        }
        written
    }

    /// Every rank loads its part; nothing changes unless every part is intact and all come
    /// from the same save.
    pub(crate) fn load_sharded_state<M, O, S>(
        &mut self,
        dir: &Path,
        model: M,
        optimizer: O,
        scheduler: S,
    ) -> Result<(M, O, S), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        let mine = self.rank_dir(dir);
        let decoded = match mine.is_dir() {
            true => self.decode(&mine),
            false => Err(missing_rank_dir(dir, &mine, self.world_size())),
        };
        self.all_ranks_succeeded(&decoded, "load_state")?;
        let decoded = decoded?;
        // The parts must come from one save: a save that failed on some rank leaves the
        // others' newer parts next to its older one.
        let c = decoded.state.counters;
        let counters = [c.optimizer_steps, c.skipped_steps, c.micro_batches].map(|v| v as f64);
        if !self.same_on_every_rank(&counters)? {
            return Err(AccelerateError::Usage(format!(
                "load_state: the ranks' parts in {} come from different saves (their step \
                 counters differ); nothing was loaded",
                dir.display()
            )));
        }
        let ((model, optimizer, scheduler), saved) =
            self.load_records(decoded, model, optimizer, scheduler);
        self.strategy.after_load(&model)?;
        self.restore(saved);
        Ok((model, optimizer, scheduler))
    }

    fn rank_dir(&self, dir: &Path) -> PathBuf {
        dir.join(format!(
            "{RANK_PREFIX}{:05}-of-{:05}",
            self.rank(),
            self.world_size()
        ))
    }

    /// This rank's part of a sharded save.
    fn write_rank_state<M, O, S>(
        &self,
        dir: &Path,
        model: &M,
        optimizer: &O,
        scheduler: &S,
    ) -> Result<(), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        if dir.join(MANIFEST).is_file() {
            return Err(AccelerateError::Usage(format!(
                "refusing to write a sharded state into {}: it holds a single-rank state",
                dir.display()
            )));
        }
        if let Ok(entries) = fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !(name.starts_with(RANK_PREFIX) || name.starts_with('.')) {
                    return Err(AccelerateError::Usage(format!(
                        "refusing to write a sharded state into {}: it holds '{name}', which is \
                         not part of an afterburner state",
                        dir.display()
                    )));
                }
            }
        }
        self.write_state(&self.rank_dir(dir), model, optimizer, scheduler)
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
            return Err(AccelerateError::Usage(format!(
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

/// The error for a sharded load whose rank directory is missing, naming what is there.
fn missing_rank_dir(dir: &Path, mine: &Path, world: usize) -> AccelerateError {
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
    AccelerateError::Usage(format!(
        "no sharded state for this rank at {} (world size {world}); found: [{}]. A sharded \
         state loads at the world size it was saved with",
        mine.display(),
        found.join(", ")
    ))
}

/// After a sharded save, drops rank directories of other world sizes (older saves).
fn remove_other_world_sizes(dir: &Path, world: usize) {
    let current = format!("-of-{world:05}");
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(RANK_PREFIX) && !name.ends_with(&current) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}
