//! The Trainer in a run `afterburner launch` started: a worker started again under the `all`
//! policy resumes from the newest checkpoint by itself, and a Local SGD or DiLoCo replica is
//! set up through `join`, so a restarted one is healed from a live replica and continues where
//! the live replicas are (docs/launch.md).

use burn::lr_scheduler::LrScheduler;

use super::{Metrics, Trainer, TrainerTypes, list_checkpoints, lost_model};
use crate::AccelerateError;
use crate::parallel::Launched;

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
    /// schedule's position; its log says it rejoined. Whether it was healed so.
    pub(super) fn join_the_run(&mut self) -> Result<bool, AccelerateError> {
        let model = self.model.take().ok_or_else(lost_model)?;
        let (model, optim) = self.acc.join(model, self.optim.clone())?;
        self.model = Some(model);
        self.optim = optim;
        let step = self.acc.counters().optimizer_steps;
        if step == 0 {
            return Ok(false);
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
        Ok(true)
    }
}
