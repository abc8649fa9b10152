//! The fault-tolerant side of the [`Accelerator`]: a Local SGD or DiLoCo replica set up by
//! `join`, healed from a live replica when it was restarted (model, optimizer, strategy state,
//! step counter, loss scale), and the data position it continues at.

use std::sync::PoisonError;

use afterburner_parallel::ParallelStrategy;
use afterburner_precision::GradScalerState;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;

use crate::{AccelerateError, Accelerator};

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Whether this Accelerator's replicas are fault tolerant (Local SGD or DiLoCo over a
    /// quorum group): set such a replica up with [`join`](Self::join), which heals one that
    /// was restarted.
    pub fn is_fault_tolerant(&self) -> bool {
        self.strategy
            .group()
            .is_some_and(|group| group.quorum().is_some())
    }

    /// [`setup`](Self::setup) for a replica of a fault-tolerant run (Local SGD or DiLoCo over
    /// a [`QuorumGroup`](afterburner_parallel::QuorumGroup) given to
    /// [`with_group`](Accelerator::with_group); docs/fault-tolerance.md). A replica that
    /// starts with the run is set up as by `setup`. One that joins a run in progress (a
    /// restarted one) receives a live replica's parameters, optimizer state and strategy
    /// state, and its step counter continues from that replica's: continue your loop after
    /// `counters().optimizer_steps`. One that asks after the run ended (the live replicas
    /// called [`end_of_run`](Self::end_of_run)) gets
    /// [`ParallelError::RunEnded`](afterburner_parallel::ParallelError::RunEnded) with the
    /// step: nothing is left to train, the run's final state is its last checkpoint
    /// ([`prepare_alone`](Self::prepare_alone), then `load_parts`). Under any other strategy,
    /// the same as `setup`.
    pub fn join<M, O>(&mut self, model: M, mut optimizer: O) -> Result<(M, O), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let model = self.precision.prepare_model(model.fork(&self.device))?;
        let (model, step) = self.strategy.join(model, &mut optimizer)?;
        if step > 0 {
            self.counters.optimizer_steps = step;
            self.load_attached_state()?;
            self.reseed();
            tracing::info!(step, "joined a run in progress from a live replica's state");
        }
        Ok((model, optimizer))
    }

    /// On a fault-tolerant replica: tells the group it finished training, after its last
    /// collective of the run, so a replica restarted meanwhile is told the run ended (its
    /// [`join`](Self::join) returns [`ParallelError::RunEnded`](afterburner_parallel::ParallelError::RunEnded))
    /// instead of waiting for a live state that will not come. The Trainer calls it at the end
    /// of `train`; a hand-written loop calls it after its last save. Nothing elsewhere.
    pub fn end_of_run(&self) -> Result<(), AccelerateError> {
        if let Some(quorum) = self.strategy.group().and_then(|g| g.quorum()) {
            quorum.end_run(self.counters.optimizer_steps)?;
        }
        Ok(())
    }

    /// For a fault-tolerant replica told the run ended ([`join`](Self::join) returned
    /// [`ParallelError::RunEnded`](afterburner_parallel::ParallelError::RunEnded)): `model` on
    /// this device as the precision prepares it, with no collective, to load the run's final
    /// state into ([`load_parts`](Self::load_parts): the replica is alone now, its collectives
    /// are its own values).
    pub fn prepare_alone<M: AutodiffModule<B>>(&self, model: M) -> Result<M, AccelerateError> {
        Ok(self.precision.prepare_model(model.fork(&self.device))?)
    }

    /// On a fault-tolerant replica: what it sends with its live state to a joiner beyond the
    /// strategy's (the fp16 loss scale, the skipped steps and micro-batches so far), set
    /// before each step's sync.
    pub(crate) fn attach_live_state(&self) {
        let Some(quorum) = self.strategy.group().and_then(|g| g.quorum()) else {
            return;
        };
        let attached = Attached {
            scaler: self.precision.scaler_state(),
            skipped_steps: self.counters.skipped_steps,
            micro_batches: self.counters.micro_batches,
        };
        if let Ok(bytes) = serde_json::to_vec(&attached) {
            quorum.attach(bytes);
        }
    }

    /// On a healed replica: loads what the donor attached (its loss scale, and its counters
    /// beside the step: a state this replica saves later then holds a run's counters).
    fn load_attached_state(&mut self) -> Result<(), AccelerateError> {
        let Some(quorum) = self.strategy.group().and_then(|g| g.quorum()) else {
            return Ok(());
        };
        let bytes = quorum.attached();
        if bytes.is_empty() {
            return Ok(());
        }
        let attached: Attached = serde_json::from_slice(&bytes).map_err(|e| {
            AccelerateError::BadData(format!("the live replica's loss scale and counters: {e}"))
        })?;
        self.precision.load_scaler_state(attached.scaler)?;
        self.counters.skipped_steps = attached.skipped_steps;
        self.counters.micro_batches = attached.micro_batches;
        Ok(())
    }

    /// After a [`join`](Self::join) that healed this replica at optimizer step `step`: moves
    /// the training loader's position to where the live replicas stand, for `batches` batches
    /// per epoch (every replica reads as many; an accumulation cycle ends at each epoch's end),
    /// so the joiner continues at the same epoch and batch of its own shard.
    pub fn continue_data_after(&self, step: u64, batches: usize) {
        let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        let per_cycle = self.config.gradient_accumulation_steps.max(1) as u64;
        let steps_per_epoch = (batches as u64).div_ceil(per_cycle).max(1);
        progress.num_batches = batches;
        progress.epoch = (step / steps_per_epoch) as usize;
        progress.next_batch = ((step % steps_per_epoch) * per_cycle).min(batches as u64) as usize;
    }
}

/// What a live replica attaches to the state it sends a joiner, beyond the strategy's.
#[derive(serde::Serialize, serde::Deserialize)]
struct Attached {
    scaler: Option<GradScalerState>,
    skipped_steps: u64,
    micro_batches: u64,
}
