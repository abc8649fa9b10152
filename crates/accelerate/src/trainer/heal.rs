//! The Trainer in a run `afterburner launch` started: a worker started again under the `all`
//! policy resumes from the newest checkpoint by itself, and a Local SGD or DiLoCo replica is
//! set up through `join`, so a restarted one is healed from a live replica and continues where
//! the live replicas are, or, restarted after the run ended, ends with its final checkpoint
//! (docs/launch.md).

use burn::lr_scheduler::LrScheduler;

use super::{Metrics, TrainSummary, Trainer, TrainerTypes, list_checkpoints, lost_model};
use crate::AccelerateError;
use crate::parallel::{Launched, ParallelError};

impl<T: TrainerTypes> Trainer<T> {
    /// The checkpoint to resume from: `resume_from_checkpoint`, or the newest one in
    /// `output_dir` for a worker `afterburner launch` started again under the `all` policy
    /// (none yet: it starts over, as the run it replaces did).
    pub(super) fn checkpoint_to_resume(&self) -> Option<String> {
        if let Some(resume) = &self.args.resume_from_checkpoint {
            return Some(resume.clone());
        }
        let launched = Launched::from_env().ok().flatten()?;
        // Replicas that heal alone are set up by `join` instead (`join_the_run`).
        let restarted = launched.restart_count > 0 && !self.acc.is_fault_tolerant();
        let newest = list_checkpoints(self.acc.checkpointer(), &self.args.output_dir).pop()?;
        restarted.then(|| {
            tracing::warn!(
                rank = launched.rank,
                restarts = launched.restart_count,
                checkpoint = %newest.1.display(),
                "started again by `afterburner launch`: resuming from the newest checkpoint"
            );
            "latest".to_string()
        })
    }

    /// Sets up a fault-tolerant replica's model and optimizer through `join`. One that joins
    /// a run in progress gets a live replica's model, optimizer and strategy state, and
    /// continues after its step: the step counters, the epoch and batch of its data, the LR
    /// schedule's position; its log says it rejoined. One that asks after the run ended ends
    /// with the run's final checkpoint instead. What happened.
    pub(super) fn join_the_run(&mut self) -> Result<Joined, AccelerateError> {
        let model = self.model.take().ok_or_else(lost_model)?;
        let (model, optim) = match self.acc.join(model.clone(), self.optim.clone()) {
            Err(AccelerateError::Parallel(ParallelError::RunEnded { step, .. })) => {
                return self.end_with_the_run(model, step).map(Joined::RunEnded);
            }
            joined => joined?,
        };
        self.model = Some(model);
        self.optim = optim;
        let step = self.acc.counters().optimizer_steps;
        if step == 0 {
            return Ok(Joined::Fresh);
        }
        let batches = self.train.num_batches();
        self.acc.continue_data_after(step, batches);
        // The Accelerator placed the data; the Trainer's counters follow from that position.
        let (epoch, next_batch) = self.acc.data_position();
        self.state.global_step = step;
        self.state.rejoined_at_steps.push(step);
        self.state.epoch = epoch as f64 + next_batch as f64 / batches.max(1) as f64;
        self.state.batches_total = (epoch * batches + next_batch) as u64;
        for _ in 0..step {
            self.schedule.step();
        }
        let rank = self.acc.rank();
        eprintln!(
            "rank {rank} rejoined the run at step {step} (epoch {epoch}, batch {next_batch}), \
             healed from a live replica"
        );
        let mut note = Metrics::default();
        note.insert("rejoined_rank", rank as f64);
        note.insert("rejoined_at_step", step as f64);
        self.record(note)?;
        Ok(Joined::Healed)
    }

    /// A replica started again after the run ended at `step` (the live replicas finished and
    /// said so): nothing is left to train. It loads the run's final checkpoint (its own part,
    /// or a live replica's when it died before its part was saved) and ends as the live
    /// replicas did, so the caller's evaluation and `save_model` see the run's final model.
    fn end_with_the_run(
        &mut self,
        model: T::Model,
        step: u64,
    ) -> Result<TrainSummary, AccelerateError> {
        let rank = self.acc.rank();
        self.model = Some(self.acc.prepare_alone(model)?);
        let dir = list_checkpoints(self.acc.checkpointer(), &self.args.output_dir)
            .into_iter()
            .find_map(|(saved, dir)| (saved == step).then_some(dir))
            .ok_or_else(|| {
                AccelerateError::Usage(format!(
                    "rank {rank} was started again after the run ended at step {step}, and the \
                     run saved no checkpoint at that step in {} (save_strategy = \"steps\" \
                     saves one at the end): this replica has no final state to end with; the \
                     live replicas' outputs are the run's result",
                    self.args.output_dir.display()
                ))
            })?;
        self.load_checkpoint(&dir)?;
        eprintln!(
            "rank {rank} was started again after the run ended at step {step}: nothing is left \
             to train; it ends with the run's final state ({})",
            dir.display()
        );
        let (loss, batches) = (self.state.loss_total, self.state.batches_total.max(1));
        let mut metrics = Metrics::default();
        metrics.insert("train_loss", loss / batches as f64);
        metrics.insert("epoch", self.state.epoch);
        Ok(TrainSummary {
            global_step: self.state.global_step,
            training_loss: loss / batches as f64,
            metrics,
            best_model_checkpoint: self.state.best_model_checkpoint.clone(),
            stopped_early: false,
        })
    }
}

/// How a fault-tolerant replica entered the run ([`Trainer::join_the_run`]).
pub(super) enum Joined {
    /// With the run (or under a strategy that does not heal).
    Fresh,
    /// Healed from a live replica, at the step it sent its state from.
    Healed,
    /// After the run ended: it holds the run's final state; nothing is left to train.
    RunEnded(TrainSummary),
}
