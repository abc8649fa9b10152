//! The Trainer's loop: steps through the Accelerator, then logs, evaluates, saves and stops
//! at HF's points (evaluation itself: evaluate.rs).

use std::path::PathBuf;

use crate::parallel::ParallelStrategy;

use super::TrainerTypes;
use super::checkpoints::{
    all_but_best, checkpoint_dir, checkpoint_parts, checkpoints_to_delete, delete_checkpoints,
    list_checkpoints, relocate_best, warn_of_another_run,
};
use super::curves::write_curves;
use super::heal::Joined;
use super::{
    Flow, IntervalStrategy, LogEntry, LossNormalization, Metrics, TrainLoss, TrainSummary, Trainer,
    TrainerState, lost_model, resolve_checkpoint,
};
use crate::{AccelerateError, StepOutcome};

/// How training goes on after an optimizer step.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StepEnd {
    Continue,
    /// The last step (`max_steps` reached).
    Last,
    /// A callback stopped training.
    Stopped,
}

/// Where in the loop an event happens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum At {
    StepEnd,
    EpochEnd,
}

impl<T: TrainerTypes> Trainer<T> {
    /// Trains for `max_steps` optimizer steps (or `num_train_epochs` epochs), resuming first
    /// when `resume_from_checkpoint` is set; logs, evaluates and saves at the arguments'
    /// points; stops early when a callback asks; reloads the best model at the end when
    /// `load_best_model_at_end` is set. Every rank calls it.
    pub fn train(&mut self) -> Result<TrainSummary, AccelerateError> {
        let mut stopped_early = false;
        let mut done = false;
        let joined = match std::mem::take(&mut self.join_pending) {
            true => self.join_the_run()?,
            false => Joined::Fresh,
        };
        if let Joined::RunEnded(summary) = joined {
            return Ok(summary);
        }
        if matches!(joined, Joined::Healed) {
            // The live replicas sent their state from inside their step and go on from there:
            // the healed replica takes the same path (the step's events, the signal check,
            // the epoch's end when the step ended it or ended training), so it calls the same
            // collectives in the same order.
            let end = self.after_step(0)?;
            stopped_early = end == StepEnd::Stopped;
            done = end != StepEnd::Continue;
            if done || self.acc.data_position().1 == 0 {
                (stopped_early, done) = self.epoch_end(0, stopped_early, done)?;
            }
        }
        let resume = self.checkpoint_to_resume();
        if resume.is_none() {
            self.warn_of_another_run();
        }
        if let Some(resume) = resume {
            let dir = resolve_checkpoint(self.acc.checkpointer(), &self.args.output_dir, &resume)?;
            let planned = self.state.max_steps;
            self.load_checkpoint(&dir)?;
            // The arguments of this run decide its length, as in HF.
            self.state.max_steps = planned;
            // A run folder copied or moved since still finds its best checkpoint.
            self.state.best_model_checkpoint =
                self.state.best_model_checkpoint.take().map(|best| {
                    relocate_best(self.acc.checkpointer(), best, &self.args.output_dir, &dir)
                });
        }
        self.log
            .start(&self.state.log_history, self.state.global_step)?;
        if let Some(gate) = &mut self.gate {
            let done = self.acc.counters().optimizer_steps;
            gate.start(self.state.max_steps as usize, done, self.acc.device());
        }
        self.meter.restart();
        let batches = self.train.num_batches();
        let (start_epoch, start_batch) = self.acc.data_position();
        let items_per_batch = (self.args.per_device_train_batch_size
            * self.acc.strategy().data_parallel_size()) as u64;
        let first_batch = self.state.batches_total;
        let per_item = self.args.loss_normalization == LossNormalization::PerItem;
        let mut cycle_items = 0usize;
        let mut cycle_scale = None;
        done |= self.state.global_step >= self.state.max_steps;
        for epoch in start_epoch..self.epochs {
            if done {
                break;
            }
            let skip = if epoch == start_epoch { start_batch } else { 0 };
            let mut stepped = false;
            let mut epoch_batches = self.train.epoch_from(epoch, skip);
            let mut taken = 0;
            while let Some(batch) = epoch_batches.try_next()? {
                let i = taken;
                taken += 1;
                let model = self.model.take().ok_or_else(lost_model)?;
                let tokens = model.batch_tokens(&batch).map(|t| t as u64);
                self.meter
                    .add(self.args.per_device_train_batch_size as u64, tokens);
                // The loss stays on the device until the next log (no host read here).
                let (loss, divisor) = match per_item {
                    true => {
                        let (sum, items) = model.train_loss_sum(&self.acc, batch)?;
                        // Backward on the sum over about one micro-batch's items: a summed
                        // loss has gradients `items` times the mean's, which fp16's loss
                        // scale would overflow; `normalise_per_item` scales back.
                        let scale = match cycle_scale {
                            Some(scale) => scale,
                            None => *cycle_scale.insert(self.per_item_scale(items)?),
                        };
                        cycle_items += items;
                        (sum.div_scalar(scale), items.max(1) as f64 / scale)
                    }
                    false => (model.train_loss(&self.acc, batch)?, 1.0),
                };
                self.unread.push(loss.clone().inner(), divisor);
                self.state.batches_since_log += 1;
                self.state.batches_total += 1;
                self.acc.backward(loss, &model)?;
                if per_item && self.acc.sync_gradients() {
                    let items = std::mem::take(&mut cycle_items);
                    let scale = cycle_scale.take().unwrap_or(1.0);
                    self.normalise_per_item(&model, items, scale)?;
                }
                let model = match self.gate.as_mut() {
                    // The skip, the clip and the loss scale decided on the device (no read).
                    Some(gate) => {
                        let mut open = |skip| gate.open(skip);
                        let stepped =
                            self.acc
                                .step_on_device(model, &mut self.optim, 0.0, &mut open);
                        gate.close();
                        stepped?
                    }
                    None => self.acc.step(model, &mut self.optim, &mut self.schedule)?,
                };
                self.model = Some(model);
                match self.acc.last_step() {
                    StepOutcome::Accumulating => continue,
                    StepOutcome::Stepped { lr, grad_norm } => {
                        self.last_lr = Some(lr);
                        self.last_grad_norm = grad_norm;
                    }
                    StepOutcome::Deferred => {}
                    _ => self.last_grad_norm = None,
                }
                stepped = true;
                self.state.global_step += 1;
                self.log
                    .progress(self.state.global_step, self.state.max_steps);
                self.state.epoch = epoch as f64 + (skip + i + 1) as f64 / batches as f64;
                let items = (self.state.batches_total - first_batch) * items_per_batch;
                match self.after_step(items)? {
                    StepEnd::Continue => {}
                    end => {
                        stopped_early |= end == StepEnd::Stopped;
                        done = true;
                        break;
                    }
                }
            }
            if stepped {
                let items = (self.state.batches_total - first_batch) * items_per_batch;
                (stopped_early, done) = self.epoch_end(items, stopped_early, done)?;
            }
        }
        self.finish(stopped_early, first_batch, items_per_batch)
    }

    /// What follows every optimizer step (and a replica healed at one, which the live
    /// replicas sent their state from): the step's events, the signal check, and whether
    /// training goes on.
    fn after_step(&mut self, items: u64) -> Result<StepEnd, AccelerateError> {
        let flow = self.events(At::StepEnd, items)?;
        if self.acc.stop_requested()? {
            return Err(self.stop_on_signal());
        }
        Ok(match flow {
            Flow::Stop => StepEnd::Stopped,
            Flow::Continue if self.state.global_step >= self.state.max_steps => StepEnd::Last,
            Flow::Continue => StepEnd::Continue,
        })
    }

    /// The epoch's end (after its last batch, or after the step that ended training): its
    /// events; `(stopped_early, done)` updated.
    fn epoch_end(
        &mut self,
        items: u64,
        stopped_early: bool,
        done: bool,
    ) -> Result<(bool, bool), AccelerateError> {
        match self.events(At::EpochEnd, items)? {
            Flow::Stop => Ok((true, true)),
            Flow::Continue => Ok((stopped_early, done)),
        }
    }

    /// The end of training: Local SGD's last average, a final save under
    /// `save_strategy = "steps"`, the best model back, the summary.
    fn finish(
        &mut self,
        stopped_early: bool,
        first_batch: u64,
        items_per_batch: u64,
    ) -> Result<TrainSummary, AccelerateError> {
        self.read_losses()?;
        let model = self.model.take().ok_or_else(lost_model)?;
        let model = self.acc.finish(model)?;
        // The last update is checked by no later step: a model it poisoned ends the run with
        // a named error rather than an Ok and a NaN model (one host read, once). The model
        // stays with the Trainer, whose saves refuse it.
        let finite = self.acc.check_parameters_finite(&model);
        self.model = Some(model);
        finite?;
        let last_saved = list_checkpoints(self.acc.checkpointer(), &self.args.output_dir)
            .last()
            .map(|(step, _)| *step);
        if self.args.save_strategy == IntervalStrategy::Steps
            && last_saved != Some(self.state.global_step)
        {
            self.save()?;
        }
        if self.args.load_best_model_at_end
            && let Some(best) = self.state.best_model_checkpoint.clone()
        {
            self.load_best_model(&best)?;
        }
        self.keep_only_the_best()?;
        let (loss, _) = self.mean_across_ranks(self.state.loss_total, self.state.batches_total)?;
        let secs = self.log.elapsed().as_secs_f64().max(1e-9);
        let items = (self.state.batches_total - first_batch) * items_per_batch;
        let mut metrics = Metrics::default();
        metrics.insert("train_runtime", secs);
        metrics.insert("train_samples_per_second", items as f64 / secs);
        metrics.insert(
            "train_steps_per_second",
            self.state.global_step as f64 / secs,
        );
        metrics.insert("train_loss", loss);
        if self.acc.world_size() > 1 {
            // What this rank sent through collectives, per optimizer step (afterburner's).
            let steps = self.state.global_step.max(1) as f64;
            metrics.insert(
                "comm_bytes_per_step",
                self.acc.traffic().bytes() as f64 / steps,
            );
            metrics.insert(
                "comm_calls_per_step",
                self.acc.traffic().calls() as f64 / steps,
            );
        }
        metrics.insert("epoch", self.state.epoch);
        // The run's last collective is behind: a replica restarted meanwhile is told the run
        // ended (and ends with the final checkpoint) instead of waiting to be healed. The run
        // itself is complete whatever the lighthouse answers.
        if let Err(e) = self.acc.end_of_run() {
            tracing::warn!("cannot tell the other replicas the run ended: {e}");
        }
        self.record(metrics.clone())?;
        if self.acc.is_main_process() {
            write_curves(&self.args.output_dir, &self.state.log_history)?;
        }
        self.log.finish();
        for callback in &mut self.callbacks {
            callback.on_train_end(&self.state);
        }
        Ok(TrainSummary {
            global_step: self.state.global_step,
            training_loss: loss,
            metrics,
            best_model_checkpoint: self.state.best_model_checkpoint.clone(),
            stopped_early,
        })
    }

    /// Logs, evaluates and saves when the arguments say so at this point (in HF's order),
    /// and asks the callbacks whether to go on; every rank gets the same answer.
    fn events(&mut self, at: At, items: u64) -> Result<Flow, AccelerateError> {
        self.state.last_eval_was_best = false;
        let step = self.state.global_step;
        let total = self.state.max_steps;
        let due = |strategy: IntervalStrategy, every: f64| match (strategy, at) {
            (IntervalStrategy::Steps, At::StepEnd) => step.is_multiple_of(interval(every, total)),
            (IntervalStrategy::Epoch, At::EpochEnd) => true,
            _ => false,
        };
        let mut flow = Flow::Continue;
        if at == At::StepEnd {
            for callback in &mut self.callbacks {
                flow = flow.max(callback.on_step_end(&self.state));
            }
        }
        let first = at == At::StepEnd && self.args.logging_first_step && step == 1;
        if due(self.args.logging_strategy, self.args.logging_steps) || first {
            self.log_training(items)?;
        }
        // Evaluations and saves are left out of the training throughput.
        self.meter.pause();
        let eval_every = self.args.eval_steps.unwrap_or(self.args.logging_steps);
        if due(self.args.eval_strategy, eval_every) {
            let metrics = self.evaluate_and_track()?;
            for callback in &mut self.callbacks {
                flow = flow.max(callback.on_evaluate(&self.state, &metrics));
            }
        }
        if due(self.args.save_strategy, self.args.save_steps) {
            self.save()?;
        }
        self.meter.resume();
        if self.acc.world_size() > 1 && self.callbacks.iter().any(|c| c.may_stop()) {
            let stop = (flow == Flow::Stop) as u64 as f64;
            let (any, _) = self.mean_across_ranks(stop, 1)?;
            flow = if any > 0.0 {
                Flow::Stop
            } else {
                Flow::Continue
            };
        }
        Ok(flow)
    }

    /// One training log line: the mean loss since the last one (across ranks), the learning
    /// rate the last step used, the last gradient norm when clipping.
    fn log_training(&mut self, items: u64) -> Result<(), AccelerateError> {
        self.read_losses()?;
        let (loss, _) =
            self.mean_across_ranks(self.state.loss_since_log, self.state.batches_since_log)?;
        self.state.loss_since_log = 0.0;
        self.state.batches_since_log = 0;
        let mut values = Metrics::default();
        values.insert("loss", loss);
        if let Some(lr) = self.last_lr {
            values.insert("learning_rate", lr);
        }
        if let Some(norm) = self.last_grad_norm.filter(|n| n.is_finite()) {
            values.insert("grad_norm", norm);
        }
        self.add_throughput(&mut values)?;
        let entry = self.record_with(values, Some(items))?;
        for callback in &mut self.callbacks {
            callback.on_log(&self.state, &entry);
        }
        Ok(())
    }

    /// The error ending a run stopped by a signal, after saving a checkpoint (unless this run
    /// just saved this step's).
    fn stop_on_signal(&mut self) -> AccelerateError {
        let step = self.state.global_step;
        let saved = match self.saved_at == Some(step) {
            true => Ok(checkpoint_dir(&self.args.output_dir, step)),
            false => self.save(),
        };
        match saved {
            Ok(dir) => AccelerateError::Stopped {
                step,
                saved: Some(dir),
            },
            Err(e) => e,
        }
    }

    /// Saves `checkpoint-<global_step>/` (model, optimizer, schedule, trainer state and the
    /// Accelerator's own state), then deletes the checkpoints past `save_total_limit`, never
    /// the best one.
    fn save(&mut self) -> Result<PathBuf, AccelerateError> {
        // The saved state holds every loss so far.
        self.read_losses()?;
        let dir = checkpoint_dir(&self.args.output_dir, self.state.global_step);
        if self.state.last_eval_was_best {
            self.state.best_model_checkpoint = Some(dir.clone());
        }
        let model = self.model.as_mut().ok_or_else(lost_model)?;
        let parts = checkpoint_parts(model, &mut self.optim, &mut self.schedule, &mut self.state);
        self.acc.save_parts(&dir, &parts)?;
        drop(parts);
        self.saved_at = Some(self.state.global_step);
        if let Some(limit) = self.args.save_total_limit
            && self.acc.is_main_process()
        {
            let all = list_checkpoints(self.acc.checkpointer(), &self.args.output_dir);
            let best = self.state.best_model_checkpoint.as_deref();
            delete_checkpoints(
                self.acc.checkpointer(),
                checkpoints_to_delete(&all, limit, best),
            )?;
        }
        self.acc.barrier()?;
        for callback in &mut self.callbacks {
            callback.on_save(&self.state, &dir);
        }
        Ok(dir)
    }

    /// Warns (main process) when a fresh run trains into an `output_dir` that holds
    /// checkpoints already, unless `overwrite_output_dir` says it is meant.
    fn warn_of_another_run(&self) {
        let fresh = self.args.resume_from_checkpoint.is_none() && self.state.global_step == 0;
        if fresh && !self.args.overwrite_output_dir && self.acc.is_main_process() {
            warn_of_another_run(self.acc.checkpointer(), &self.args.output_dir);
        }
    }

    /// As HF's Trainer at the end of training: with `save_total_limit = 1` and a best
    /// checkpoint, the newest one (kept so far for resuming) goes and only the best remains.
    fn keep_only_the_best(&mut self) -> Result<(), AccelerateError> {
        let Some(best) = &self.state.best_model_checkpoint else {
            return Ok(());
        };
        if self.args.save_total_limit != Some(1) {
            return Ok(());
        }
        if self.acc.is_main_process() {
            let checkpointer = self.acc.checkpointer();
            delete_checkpoints(
                checkpointer,
                all_but_best(checkpointer, &self.args.output_dir, best),
            )?;
        }
        self.acc.barrier()
    }

    /// Restores model, optimizer, schedule, trainer state and the Accelerator's state.
    pub(super) fn load_checkpoint(&mut self, dir: &std::path::Path) -> Result<(), AccelerateError> {
        let model = self.model.as_mut().ok_or_else(lost_model)?;
        let mut parts =
            checkpoint_parts(model, &mut self.optim, &mut self.schedule, &mut self.state);
        self.acc.load_parts(dir, &mut parts)
    }

    /// Loads only the model of checkpoint `dir` (the rest of the run's state stays).
    fn load_best_model(&mut self, dir: &std::path::Path) -> Result<(), AccelerateError> {
        let mut optim = self.optim.clone();
        let mut schedule = self.schedule.clone();
        let mut state = TrainerState::default();
        let model = self.model.as_mut().ok_or_else(lost_model)?;
        let mut parts = checkpoint_parts(model, &mut optim, &mut schedule, &mut state);
        self.acc.load_parts(dir, &mut parts)
    }

    /// Adds `values` to the log history and the log file.
    pub(super) fn record(&mut self, values: Metrics) -> Result<LogEntry, AccelerateError> {
        self.record_with(values, None)
    }

    fn record_with(
        &mut self,
        values: Metrics,
        items: Option<u64>,
    ) -> Result<LogEntry, AccelerateError> {
        let entry = LogEntry {
            step: self.state.global_step,
            epoch: self.state.epoch,
            values,
        };
        self.log
            .write(&entry, self.state.global_step, self.state.max_steps, items)?;
        self.state.log_history.push(entry.clone());
        Ok(entry)
    }
}

/// Steps between two events of an interval `every` (below 1: a share of `total`).
fn interval(every: f64, total: u64) -> u64 {
    match every < 1.0 {
        true => ((total as f64 * every).ceil() as u64).max(1),
        false => every as u64,
    }
}
