//! Save and resume the whole training state, atomically and verified.
//!
//! A state directory holds one file per named part ([`StateParts`]) and two of its own:
//! - `<part>.mpk`: a model's, optimizer's or scheduler's Burn record in named MessagePack at
//!   full precision (f32 for the `*-true` modes too; they are cast back on load), or a
//!   [`Stateful`](crate::Stateful) object's bytes;
//! - `accelerator.json`: counters, loss-scaler state, seed, data position;
//! - `manifest.json`, written last: the format tag and each file's length and CRC-32.
//!
//! Saving writes a temporary sibling directory, syncs it and renames it into place, so a crash
//! leaves either the old state or the new one, never a mix. Loading checks the manifest before
//! decoding anything and changes nothing unless every part decodes on every rank
//! (`files`, `parts`). Which rank writes what is the strategy's
//! [`StateLayout`]: one directory written by rank 0, one per rank (`sharded`), or one
//! gathered from every rank's shards and written by rank 0.

use std::path::Path;

use afterburner_parallel::{ParallelStrategy, StateLayout, StrategyState};
use afterburner_precision::{GradScalerState, Precision};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::parts::{
    ACCELERATOR_PART, Mode, STRATEGY_PART, Slot, StateParts, part_file, refuse_nonfinite_models,
};
use crate::accelerator::Counters;
use crate::data::DataProgress;
use crate::{AccelerateError, Accelerator, NonFinitePolicy};

/// The Accelerator's own part.
pub(crate) const ACCELERATOR_FILE: &str = "accelerator.json";
/// The strategy's own state (DiLoCo's global parameters, ...), when it keeps any.
const STRATEGY_FILE: &str = "strategy.mpk";

pub(crate) use super::checkpointer::StateFiles;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AcceleratorState {
    precision: Precision,
    seed: u64,
    pub(crate) counters: Counters,
    scaler: Option<GradScalerState>,
    data: DataProgress,
}

impl AcceleratorState {
    /// Counters a run can produce: every optimizer step, taken or skipped, ends a cycle of at
    /// least one micro-batch.
    fn check(&self) -> Result<(), String> {
        let c = self.counters;
        match c.optimizer_steps.checked_add(c.skipped_steps) {
            Some(steps) if steps <= c.micro_batches => Ok(()),
            _ => Err(format!(
                "counters cannot come from a run: {} optimizer steps and {} skipped steps from \
                 {} micro-batches",
                c.optimizer_steps, c.skipped_steps, c.micro_batches
            )),
        }
    }
}

/// The parts [`Accelerator::save_state`] and [`Accelerator::load_state`] use.
fn classic_parts<'a, B, S, M, O, L>(
    model: &'a mut M,
    optimizer: &'a mut O,
    scheduler: &'a mut L,
) -> StateParts<'a, B, S>
where
    B: AutodiffBackend,
    S: ParallelStrategy<B>,
    M: AutodiffModule<B> + 'static,
    O: Optimizer<M, B>,
    L: LrScheduler,
{
    StateParts::new()
        .model("model", model)
        .optimizer::<M, O>("optimizer", optimizer)
        .scheduler("scheduler", scheduler)
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Saves model, optimizer, LR scheduler, loss scaler, counters, seed and data position to
    /// `dir` (the parts `model`, `optimizer`, `scheduler`; use
    /// [`save_parts`](Self::save_parts) for more), replacing an earlier state there
    /// atomically. Errors in the middle of an accumulation cycle (the pending gradients would
    /// be lost) and if `dir` exists but is not a state directory (it is never overwritten).
    ///
    /// Under DDP, rank 0 writes (every replica is identical) and every rank waits until it has.
    /// Under `zero-1` and sharded `fsdp` each rank holds a different part of the state: every
    /// rank writes its own complete state directory, `dir/rank-<r>-of-<n>`, by a two-phase
    /// commit; it loads at any world size (the saved ranks' parts are merged). Under `fsdp` with `state_dict_type = "full"` the parts are gathered
    /// and rank 0 writes one ordinary state. The call fails on every rank if it failed on any.
    pub fn save_state<M, O, L>(
        &self,
        dir: impl AsRef<Path>,
        model: &M,
        optimizer: &O,
        scheduler: &L,
    ) -> Result<(), AccelerateError>
    where
        M: AutodiffModule<B> + 'static,
        O: Optimizer<M, B>,
        L: LrScheduler,
    {
        let (mut model, mut optimizer, mut scheduler) =
            (model.clone(), optimizer.clone(), scheduler.clone());
        self.save_parts(
            dir,
            &classic_parts(&mut model, &mut optimizer, &mut scheduler),
        )
    }

    /// Restores a state saved by [`save_state`](Self::save_state): returns the model, optimizer
    /// and scheduler and restores this Accelerator's counters, loss scale, RNG stream and data
    /// position. Every file is verified first; on any error nothing is changed. Under `zero-1`
    /// and `fsdp` each rank loads its own part (pass the model `setup` returned); if any
    /// rank cannot, every rank returns an error and none changes.
    pub fn load_state<M, O, L>(
        &mut self,
        dir: impl AsRef<Path>,
        mut model: M,
        mut optimizer: O,
        mut scheduler: L,
    ) -> Result<(M, O, L), AccelerateError>
    where
        M: AutodiffModule<B> + 'static,
        O: Optimizer<M, B>,
        L: LrScheduler,
    {
        self.load_parts(
            dir,
            &mut classic_parts(&mut model, &mut optimizer, &mut scheduler),
        )?;
        Ok((model, optimizer, scheduler))
    }

    /// Saves every part of `parts` (models, optimizers, schedulers, serde values,
    /// [`Stateful`] objects) and the Accelerator's own state to `dir`, like
    /// [`save_state`](Self::save_state) (same atomicity, checks and strategies). Every rank
    /// calls it, with the same parts in the same order.
    ///
    /// [`Stateful`]: crate::Stateful
    pub fn save_parts(
        &self,
        dir: impl AsRef<Path>,
        parts: &StateParts<'_, B, S>,
    ) -> Result<(), AccelerateError> {
        let dir = dir.as_ref();
        self.check_data()?;
        parts.check_names()?;
        // Every rank checks, then they agree: a rank that refuses (pending micro-batches,
        // inf/NaN parameters) stops the save on every rank before any collective runs.
        let ready =
            self.check_not_mid_cycle()
                .and_then(|()| match self.config.nonfinite_gradients {
                    NonFinitePolicy::Apply => Ok(()),
                    _ => refuse_nonfinite_models(dir, parts),
                });
        self.all_ranks_succeeded(&ready, "save_state")?;
        ready?;
        match self.strategy.state_layout() {
            StateLayout::Replicated => {
                let written = match self.is_main_process() {
                    true => self.check_save_target(dir).and_then(|()| {
                        self.checkpointer
                            .write(dir, &self.encode_parts(parts, |_| true)?)
                    }),
                    false => Ok(()),
                };
                self.all_ranks_succeeded(&written, "save_state")?;
                written
            }
            StateLayout::PerRank | StateLayout::Sharded => self.save_rank_part(dir, parts),
            StateLayout::Gathered => {
                // Everything that can fail on one rank alone, before any collective.
                let local = self
                    .check_save_target(dir)
                    .and_then(|()| self.encode_parts(parts, |slot| slot.encodes_locally()));
                self.all_ranks_succeeded(&local, "save_state")?;
                let written = self.gather_parts(parts, local?).and_then(|files| {
                    match self.is_main_process() {
                        true => self.checkpointer.write(dir, &files),
                        false => Ok(()),
                    }
                });
                self.all_ranks_succeeded(&written, "save_state")?;
                written
            }
        }
    }

    /// Every part's gathered bytes from this rank's local ones (`files`, in part order, then
    /// the Accelerator's own). Every rank runs every part's collectives in order, even after
    /// an error on this rank (reported at the end), so none is left waiting.
    fn gather_parts(
        &self,
        parts: &StateParts<'_, B, S>,
        mut files: StateFiles,
    ) -> Result<StateFiles, AccelerateError> {
        let mut first_error = None;
        for ((name, slot), (_, bytes)) in parts.parts.iter().zip(files.iter_mut()) {
            match slot.gather(self, parts, std::mem::take(bytes)) {
                Ok(gathered) => *bytes = gathered,
                Err(e) => {
                    first_error.get_or_insert(named(name, e));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(files),
        }
    }

    /// Restores every part of `parts` in place from a state saved with the same part names,
    /// and this Accelerator's counters, loss scale, RNG stream and data position. A part the
    /// state lacks, or a part of the state not in `parts`, is an error naming it. Nothing
    /// changes unless every part decodes (on every rank). Every rank calls it, under every
    /// strategy (the ranks agree on the outcome), with the same parts in the same order.
    pub fn load_parts(
        &mut self,
        dir: impl AsRef<Path>,
        parts: &mut StateParts<'_, B, S>,
    ) -> Result<(), AccelerateError> {
        let dir = dir.as_ref();
        parts.check_names()?;
        let (source, mode, per_rank, merged_ranks) = self.state_source(dir)?;
        let read = match per_rank && !self.checkpointer.exists(&source) {
            true => Err(self.missing_rank_dir(dir, &source)),
            false => self
                .read_parts(&source, parts)
                .and_then(|read| self.merge_rank_parts(parts, &merged_ranks, read)),
        };
        self.all_ranks_succeeded(&read, "load_state")?;
        let (mut files, state) = read?;
        // Every rank read one save (parts of a failed sharded save, or a stale shared view).
        self.check_same_save(dir, &state)?;
        // Models first: a gathered optimizer is sharded by its loaded model's ids.
        parts.parts.sort_by_key(|(_, slot)| !slot.is_model());
        let prepared = parts
            .parts
            .iter_mut()
            .try_for_each(|(_, slot)| slot.prepare_load(self, mode));
        let staged = prepared
            .and_then(|()| self.stage_parts(&source, mode, parts, &mut files, &state))
            .and_then(|()| self.stage_own_state(&source, &mut files));
        self.all_ranks_succeeded(&staged, "load_state")?;
        let own = staged?;
        for (_, slot) in parts.parts.iter_mut() {
            slot.commit(self, mode)?;
        }
        if let Some(own) = own {
            self.strategy.load_own_state(own);
        }
        self.restore(state)
    }

    /// The strategy's own saved state, decoded and checked (`None` if the save has none).
    fn stage_own_state(
        &self,
        source: &Path,
        files: &mut StateFiles,
    ) -> Result<Option<StrategyState>, AccelerateError> {
        let Some(i) = files.iter().position(|(n, _)| n == STRATEGY_FILE) else {
            return Ok(None);
        };
        let bytes = files.swap_remove(i).1;
        let path = source.join(STRATEGY_FILE);
        // Verified bytes: what does not decode or fit is another strategy's state, not damage.
        let own: StrategyState = rmp_serde::from_slice(&bytes)
            .map_err(|e| AccelerateError::mismatched(&path, "strategy state", e))?;
        self.strategy
            .check_own_state(&own)
            .map_err(|e| AccelerateError::mismatched(&path, "strategy state", e))?;
        Ok(Some(own))
    }

    /// Decodes every part (models first) and checks the loss scaler's state, changing nothing
    /// visible.
    fn stage_parts(
        &self,
        source: &Path,
        mode: Mode,
        parts: &mut StateParts<'_, B, S>,
        files: &mut Vec<(String, Vec<u8>)>,
        state: &AcceleratorState,
    ) -> Result<(), AccelerateError> {
        let models = parts.parts.iter().filter(|(_, s)| s.is_model()).count();
        let (model_parts, other_parts) = parts.parts.split_at_mut(models);
        for (name, slot) in model_parts.iter_mut() {
            let bytes = take_file(files, &part_file(name));
            slot.stage(self, mode, bytes, &source.join(part_file(name)), &[])
                .map_err(|e| named(name, e))?;
        }
        for (name, slot) in other_parts.iter_mut() {
            let bytes = take_file(files, &part_file(name));
            slot.stage(
                self,
                mode,
                bytes,
                &source.join(part_file(name)),
                model_parts,
            )
            .map_err(|e| named(name, e))?;
        }
        Ok(self.precision.check_scaler_state(state.scaler)?)
    }

    /// The verified files of the state at `dir` and the Accelerator's part; errors on a part
    /// `parts` asks for that the state lacks, and on a part of the state `parts` lacks.
    fn read_parts(
        &self,
        dir: &Path,
        parts: &StateParts<'_, B, S>,
    ) -> Result<(StateFiles, AcceleratorState), AccelerateError> {
        let mut files = self.checkpointer.read(dir)?;
        let state_bytes = files
            .iter()
            .position(|(n, _)| n == ACCELERATOR_FILE)
            .map(|i| files.swap_remove(i).1)
            .ok_or_else(|| {
                AccelerateError::corrupt(dir.join(ACCELERATOR_FILE), "missing from the manifest")
            })?;
        let state: AcceleratorState = serde_json::from_slice(&state_bytes)
            .map_err(|e| AccelerateError::corrupt(dir.join(ACCELERATOR_FILE), e))?;
        state
            .check()
            .map_err(|reason| AccelerateError::corrupt(dir.join(ACCELERATOR_FILE), reason))?;
        let saved: Vec<String> = files
            .iter()
            .filter(|(n, _)| n != STRATEGY_FILE)
            .map(|(n, _)| n.strip_suffix(".mpk").unwrap_or(n).to_string())
            .collect();
        let wanted = parts.names();
        if let Some(missing) = wanted.iter().find(|w| !saved.iter().any(|s| s == *w)) {
            return Err(AccelerateError::MissingPart {
                dir: dir.to_path_buf(),
                part: (*missing).to_string(),
                saved,
            });
        }
        if let Some(unknown) = saved.iter().find(|s| !wanted.contains(&s.as_str())) {
            return Err(AccelerateError::UnknownPart {
                dir: dir.to_path_buf(),
                part: unknown.clone(),
                expected: wanted.iter().map(|w| w.to_string()).collect(),
            });
        }
        Ok((files, state))
    }

    /// Every part's file (this rank's values; empty for the parts `encode` skips), and the
    /// Accelerator's own, last. Local work only.
    pub(crate) fn encode_parts(
        &self,
        parts: &StateParts<'_, B, S>,
        encode: impl Fn(&dyn Slot<B, S>) -> bool,
    ) -> Result<StateFiles, AccelerateError> {
        let mut files = Vec::with_capacity(parts.parts.len() + 1);
        for (name, slot) in &parts.parts {
            let bytes = match encode(slot.as_ref()) {
                true => slot.encode(self).map_err(|e| named(name, e))?,
                false => Vec::new(),
            };
            files.push((part_file(name), bytes));
        }
        let state = AcceleratorState {
            precision: self.config.precision,
            seed: self.config.seed,
            counters: self.counters_now(),
            scaler: self.precision.scaler_state(),
            data: *self
                .progress
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        };
        let json = serde_json::to_vec_pretty(&state).map_err(|e| AccelerateError::InvalidPart {
            part: ACCELERATOR_PART.into(),
            reason: e.to_string(),
        })?;
        files.push((ACCELERATOR_FILE.to_string(), json));
        let own = self.strategy.own_state()?;
        if !own.is_empty() {
            let bytes =
                rmp_serde::to_vec_named(&own).map_err(|e| AccelerateError::InvalidPart {
                    part: STRATEGY_PART.into(),
                    reason: e.to_string(),
                })?;
            files.push((STRATEGY_FILE.to_string(), bytes));
        }
        Ok(files)
    }

    /// Errors when saving now would lose pending gradients.
    fn check_not_mid_cycle(&self) -> Result<(), AccelerateError> {
        match self.pending_micro_batches() {
            0 => Ok(()),
            pending => Err(AccelerateError::CallOrder(format!(
                "save_state() in the middle of an accumulation cycle would lose {pending} \
                 pending micro-batch gradients; save right after a step()"
            ))),
        }
    }

    /// Errors when `dir` exists but is not a state directory (it is never replaced then).
    pub(crate) fn check_save_target(&self, dir: &Path) -> Result<(), AccelerateError> {
        self.checkpointer.check_replaceable(dir)
    }

    /// Gives the Accelerator the loaded counters, loss scaler, seed and data position.
    fn restore(&mut self, state: AcceleratorState) -> Result<(), AccelerateError> {
        if state.precision != self.config.precision {
            tracing::warn!(saved = %state.precision, now = %self.config.precision, "resuming under another precision");
        }
        if state.seed != self.config.seed {
            tracing::warn!(
                saved = state.seed,
                now = self.config.seed,
                "resuming with the saved seed"
            );
        }
        // Checked in stage_parts, before any part was committed.
        self.precision.load_scaler_state(state.scaler)?;
        self.config.seed = state.seed;
        self.counters = state.counters;
        self.device_steps = None;
        *self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = state.data;
        self.reseed();
        Ok(())
    }
}

/// `error` with the part's name where it names none.
fn named(part: &str, error: AccelerateError) -> AccelerateError {
    match error {
        AccelerateError::InvalidPart { part: p, reason } if p.is_empty() => {
            AccelerateError::InvalidPart {
                part: part.to_string(),
                reason,
            }
        }
        other => other,
    }
}

/// Takes the bytes of file `name` out of `files` (empty if absent: checked before).
fn take_file(files: &mut Vec<(String, Vec<u8>)>, name: &str) -> Vec<u8> {
    match files.iter().position(|(n, _)| n == name) {
        Some(i) => files.swap_remove(i).1,
        None => Vec::new(),
    }
}
