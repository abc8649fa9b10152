//! The [`Accelerator`]: precision, accumulation, clipping and stepping around a plain loop.

use std::sync::{Arc, Mutex, PoisonError};

use afterburner_checkpoint::{CheckpointError, CheckpointPolicy};
use afterburner_parallel::tp::TensorParallelPlan;
use afterburner_parallel::{ParallelStrategy, Traffic};
use afterburner_precision::grads::{self, GradSummary};
use afterburner_precision::{Precision, PrecisionPlugin};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::optim::lr_scheduler::LrScheduler;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::data::{DataLoaderShard, DataProgress, FaultSlot};
pub use crate::outcome::{Counters, StepOutcome};
use crate::rng::derive_seed;
use crate::strategy::AnyStrategy;
use crate::{AccelerateError, AcceleratorConfig, Checkpointer, FileCheckpointer, NonFinitePolicy};

/// Domain tag for the per-step backend seeds.
const BACKEND_SEED_DOMAIN: u64 = 0xB0A7;
/// Domain tag for the backend seed after each micro-batch's backward.
const BACKWARD_SEED_DOMAIN: u64 = 0xBAC4;
/// Domain tag for the checkpointed blocks' seed stream.
const BLOCK_SEED_DOMAIN: u64 = 0xB10C;

/// Trains a Burn model with mixed precision, gradient accumulation and global-norm clipping,
/// on one device, from an ordinary loop:
///
/// ```ignore
/// let mut acc = Accelerator::<B>::new(config, device)?;
/// let (mut model, mut optim) = acc.setup(model, optim)?;
/// for batch in acc.dataloader(dataset, batcher, 64)?.epoch(epoch) {
///     let logits = acc.forward(&model, batch.images, |m, x| m.forward(x))?;
///     let loss = CrossEntropyLossConfig::new().init(&device).forward(logits, batch.labels);
///     acc.backward(loss, &model)?;
///     model = acc.step(model, &mut optim, &mut lr)?;
/// }
/// ```
///
/// `S` is the [`ParallelStrategy`]: by default [`AnyStrategy`], the built-in one the config's
/// `strategy` names; a strategy of your own (any type implementing the trait, in your crate)
/// comes in through [`with_strategy`](Self::with_strategy) or [`run_with`](Self::run_with).
pub struct Accelerator<B: AutodiffBackend, S: ParallelStrategy<B> = AnyStrategy<B>> {
    pub(crate) config: AcceleratorConfig,
    pub(crate) device: B::Device,
    /// The precision policy with its loss scaler (beside the strategy: the loop asks both).
    pub(crate) precision: PrecisionPlugin<B>,
    pub(crate) counters: Counters,
    /// This thread's counted FLOPs when the Accelerator was built ([`flops`](Self::flops)
    /// counts from there).
    pub(crate) flops_at_start: u64,
    /// This thread's (and its helpers') counted host reads when the Accelerator was built.
    pub(crate) host_reads_at_start: u64,
    pub(crate) progress: Arc<Mutex<DataProgress>>,
    /// A batch the training loader could not make, for the next call to report.
    pub(crate) data_fault: FaultSlot,
    pub(crate) pending: Option<GradientsParams>,
    pub(crate) micro_in_cycle: usize,
    /// Set once the pending gradients are unscaled (and their norm known).
    pub(crate) unscaled: Option<GradSummary>,
    pub(crate) clipped: bool,
    pub(crate) last: StepOutcome,
    /// How training is spread over devices (single-device, DDP, ZeRO-1, FSDP, a user's).
    pub(crate) strategy: S,
    /// Whether the strategy reduced the pending gradients in this cycle.
    pub(crate) synced: bool,
    /// A rescale of the cycle's gradients left for after their reduction (a strategy that
    /// reduces during backward: `scale_gradients`).
    pub(crate) deferred_scale: Option<f64>,
    /// What this rank sent through collectives.
    pub(crate) traffic: Traffic,
    /// Where saved states are stored (directories on disk by default).
    pub(crate) checkpointer: Arc<dyn Checkpointer>,
    /// Steps [`step_on_device`](Self::step_on_device) decided and nobody read yet.
    pub(crate) device_steps: Option<crate::device_step::DeviceSteps<B::InnerBackend>>,
}

impl<B: AutodiffBackend> Accelerator<B> {
    /// Checks the config and the backend's dtype support, and seeds the backend RNG with
    /// `config.seed` (so a model built next is reproducible).
    pub fn new(config: AcceleratorConfig, device: B::Device) -> Result<Self, AccelerateError> {
        if config.parallelism.strategy.is_distributed() {
            return Err(AccelerateError::invalid(
                "strategy",
                &config.parallelism.strategy,
                "single-device for Accelerator::new; start ddp with Accelerator::launch",
            ));
        }
        Self::build(config, device, None)
    }
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// An Accelerator that trains with `strategy`, a [`ParallelStrategy`] of your own (or a
    /// built-in one built by hand), like Fabric's `Fabric(strategy=MyStrategy())`. The
    /// config's `strategy`, `devices` and strategy tables are not read: the strategy is
    /// yours (build it over the process group of this rank, e.g. inside
    /// [`run_with`](Self::run_with), which also counts its traffic).
    pub fn with_strategy(
        config: AcceleratorConfig,
        device: B::Device,
        strategy: S,
    ) -> Result<Self, AccelerateError> {
        config.validate_common()?;
        Self::assemble(config, device, strategy, Traffic::default())
    }

    /// Checks what does not depend on the strategy and builds the Accelerator around it.
    pub(crate) fn assemble(
        config: AcceleratorConfig,
        device: B::Device,
        strategy: S,
        traffic: Traffic,
    ) -> Result<Self, AccelerateError> {
        let precision = PrecisionPlugin::new(
            config.precision,
            config.autocast,
            config.grad_scaler,
            &device,
        )?;
        if config.gradient_checkpointing == CheckpointPolicy::Balanced
            && !afterburner_checkpoint::is_balanced::<B>()
        {
            return Err(CheckpointError::BalancedNeedsBackend {
                backend: std::any::type_name::<B>().into(),
            }
            .into());
        }
        afterburner_checkpoint::enable::<B>();
        if config.stop_on_signal {
            crate::stop::install()?;
        }
        B::seed(&device, config.seed);
        afterburner_checkpoint::seed_blocks(derive_seed(config.seed, BLOCK_SEED_DOMAIN, 0));
        tracing::info!(
            strategy = strategy.name(),
            precision = %config.precision,
            gradient_checkpointing = %config.gradient_checkpointing,
            backend = B::name(&device),
            "accelerator ready"
        );
        Ok(Self {
            config,
            device,
            precision,
            counters: Counters::default(),
            flops_at_start: afterburner_precision::flops_counted(),
            host_reads_at_start: afterburner_precision::host_reads_counted(),
            progress: Arc::default(),
            data_fault: Arc::default(),
            pending: None,
            micro_in_cycle: 0,
            unscaled: None,
            clipped: false,
            last: StepOutcome::Idle,
            strategy,
            synced: false,
            deferred_scale: None,
            traffic,
            checkpointer: Arc::new(FileCheckpointer),
            device_steps: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> &AcceleratorConfig {
        &self.config
    }

    /// The training device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The precision policy.
    pub fn precision(&self) -> Precision {
        self.precision.precision()
    }

    /// The precision plugin this Accelerator trains with (the policy, the per-op vs view
    /// decision, the loss scaler).
    pub fn precision_plugin(&self) -> &PrecisionPlugin<B> {
        &self.precision
    }

    /// The strategy this Accelerator trains with (built from the config's `strategy`, or
    /// the one given to [`with_strategy`](Self::with_strategy)).
    pub fn strategy(&self) -> &S {
        &self.strategy
    }

    /// Moves the model to the device, initialises every lazy parameter, and for the `*-true`
    /// modes casts it to the half dtype. The optimizer is returned as is: Burn optimizers
    /// create their state from the gradients, so it follows the parameters' dtype (f32 master
    /// state for the mixed modes). Under DDP every rank gets rank 0's parameters; under FSDP
    /// each rank then keeps only its shard of them (see [`full_model`](Self::full_model)).
    pub fn setup<M: AutodiffModule<B>, O>(
        &self,
        model: M,
        optimizer: O,
    ) -> Result<(M, O), AccelerateError> {
        Ok((self.setup_model(model)?, optimizer))
    }

    /// `model` split by its tensor-parallel plan for this rank under `tp_size > 1` (PyTorch's
    /// `parallelize_module`, Accelerate's `tp_size`); unchanged otherwise, so the same code
    /// runs at any `tp_size`. Call it on every rank with the same model, before
    /// [`setup`](Self::setup), which refuses an unsplit model under `tp_size > 1` and moves
    /// the model to this rank's device (the one fork of the model on the way in).
    pub fn parallelize<M: TensorParallelPlan<B>>(&self, model: M) -> Result<M, AccelerateError> {
        Ok(self.strategy.parallelize(model)?)
    }

    /// The model half of [`setup`](Self::setup).
    pub fn setup_model<M: AutodiffModule<B>>(&self, model: M) -> Result<M, AccelerateError> {
        let model = self.precision.prepare_model(model.fork(&self.device))?;
        Ok(self.strategy.setup(model)?)
    }

    /// A training loader over any Burn `dataset` and `batcher` on this device, shuffled from
    /// the config's seed (under DDP, this rank's shard of every epoch), batches prepared
    /// ahead on a background thread. The Accelerator follows its progress: accumulation
    /// flushes at the end of each epoch and the position is saved with
    /// [`save_state`](Self::save_state). A `Vec` of items is a dataset through Burn's
    /// `InMemDataset::new(items)`.
    pub fn dataloader<I, O, D, Bt>(
        &self,
        dataset: D,
        batcher: Bt,
        batch_size: usize,
    ) -> Result<DataLoaderShard<B, I, O>, AccelerateError>
    where
        I: 'static,
        O: Send + 'static,
        D: Dataset<I> + 'static,
        Bt: Batcher<B, I, O> + 'static,
    {
        DataLoaderShard::with_progress(
            dataset,
            batcher,
            batch_size,
            self.device.clone(),
            self.progress.clone(),
            Some(self.data_fault.clone()),
        )?
        .shuffle(self.config.seed)
        .shard(
            self.strategy.data_parallel_rank(),
            self.strategy.data_parallel_size(),
        )
    }

    /// Back-propagates one micro-batch's loss and adds its gradients to the pending ones,
    /// scaled by `1 / gradient_accumulation_steps` (the mean over the cycle) and, for fp16, by
    /// the loss scale. `model` is the model returned by [`setup`](Self::setup).
    pub fn backward<M: AutodiffModule<B>>(
        &mut self,
        loss: Tensor<B, 1>,
        model: &M,
    ) -> Result<(), AccelerateError> {
        self.check_data()?;
        if self.unscaled.is_some() {
            return Err(AccelerateError::CallOrder(
                "backward() after clip_grad_norm() in the same cycle: call step() first".into(),
            ));
        }
        let mut loss = self.precision.scale_loss(loss.cast(DType::F32));
        let steps = self.config.gradient_accumulation_steps;
        if steps > 1 {
            loss = loss.div_scalar(steps as f64);
        }
        let mut new = GradientsParams::from_grads(self.raw_backward(loss), model);
        grads::to_param_dtypes::<B, M>(model, &mut new);
        self.strategy.after_backward(model, &mut new)?;
        // A recompute replays the blocks' random draws and so moves the backend RNG: re-seed
        // so the next micro-batch draws the same with or without checkpointing.
        B::seed(
            &self.device,
            derive_seed(
                self.cycle_seed(BACKWARD_SEED_DOMAIN),
                BACKWARD_SEED_DOMAIN,
                self.micro_in_cycle as u64,
            ),
        );
        if new.is_empty() {
            return Err(AccelerateError::NoGradients(
                "backward(): no gradient reached the model's parameters; compute the loss with \
                 acc.forward(&model, ..) on the model returned by setup() (a model with no parameters \
                 also lands here: Burn's #[derive(Module)] finds them only when the backend \
                 generic is named `B`)"
                    .into(),
            ));
        }
        match &mut self.pending {
            Some(sum) => grads::accumulate::<B, M>(model, sum, new),
            None => self.pending = Some(new),
        }
        self.micro_in_cycle += 1;
        self.counters.micro_batches += 1;
        Ok(())
    }

    /// The error of a batch the training loader could not make, once: a `for` loop over
    /// [`dataloader`](Self::dataloader)'s epoch ends at such a batch, and the next call
    /// returns it (see [`EpochIter`](crate::data::EpochIter)).
    pub(crate) fn check_data(&self) -> Result<(), AccelerateError> {
        let fault = self
            .data_fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match fault {
            Some(message) => Err(AccelerateError::BadData(message)),
            None => Ok(()),
        }
    }

    /// True when the next [`step`](Self::step) will update the parameters: the cycle holds
    /// `gradient_accumulation_steps` micro-batches, or the epoch's last (short) cycle once the
    /// loader handed out its last batch (so a loop that takes a cycle's batches first, as
    /// HF's `num_items_in_batch`, still steps once per cycle).
    pub fn sync_gradients(&self) -> bool {
        let accumulation = self.config.gradient_accumulation_steps;
        let progress = *self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        let last_cycle = match progress.num_batches % accumulation {
            0 => accumulation,
            short => short,
        };
        self.micro_in_cycle >= accumulation
            || (progress.end_of_epoch() && self.micro_in_cycle >= last_cycle)
    }

    /// Ends a micro-batch: when [`sync_gradients`](Self::sync_gradients) is true, unscales,
    /// checks for overflow (fp16: skip the optimizer AND the LR scheduler, back off the scale),
    /// clips to `max_grad_norm`, steps the scheduler and the optimizer; otherwise keeps
    /// accumulating and returns the model unchanged.
    pub fn step<M, O, L>(
        &mut self,
        model: M,
        optimizer: &mut O,
        scheduler: &mut L,
    ) -> Result<M, AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        L: LrScheduler,
    {
        self.check_data()?;
        if self.pending.is_none() {
            return Err(AccelerateError::CallOrder(
                "step() called with no pending gradients: call backward() first".into(),
            ));
        }
        // Steps decided on the device before this one are read first (their counts and the
        // scale they left decide this step's).
        if self.device_steps.is_some() {
            self.settle_device_steps_now();
        }
        if !self.sync_gradients() {
            self.last = StepOutcome::Accumulating;
            return Ok(model);
        }
        let guard = self.config.nonfinite_gradients;
        let want_norm = self.config.max_grad_norm.is_some();
        self.reduce_pending(&model)?;
        let summary = self.unscale_pending(&model, want_norm)?;
        // fp16 and the non-finite guard skip steps (the config is the same on every rank, so
        // every rank takes this branch or none; the strategy makes the ranks agree).
        let overflow = match summary {
            Some(summary) => !summary.is_finite(),
            None if guard != NonFinitePolicy::Apply => !self.pending_all_finite(&model)?,
            None => false,
        };
        let mut grads = self.pending.take().unwrap_or_default();
        let gated = self.precision.skips_overflow();
        let skip = match gated || guard != NonFinitePolicy::Apply {
            true => self.strategy.agree_on_skip(overflow, &self.device)?,
            false => false,
        };
        if skip {
            // Non-finite gradients from a model whose parameters are already inf/NaN (an
            // earlier update with finite gradients poisoned them) would skip every step from
            // here on: a named error instead. One host read, on this rare path only.
            if let Err(poisoned) = self.check_parameters_finite(&model) {
                self.end_cycle();
                return Err(poisoned);
            }
        }
        if skip && !gated {
            let norm = summary.map_or(f64::NAN, |s| s.norm());
            self.end_cycle();
            if guard == NonFinitePolicy::Error {
                return Err(AccelerateError::NonFinite(format!(
                    "step {}: the gradients hold inf/NaN (global norm {norm}); nothing was \
                     applied (nonfinite_gradients = \"error\"; \"skip\" skips such steps)",
                    self.counters.optimizer_steps + 1
                )));
            }
            self.counters.skipped_steps += 1;
            self.last = StepOutcome::SkippedNonFinite { grad_norm: norm };
            tracing::warn!(grad_norm = norm, "non-finite gradients: step skipped");
            return Ok(model);
        }
        if skip {
            self.precision.update(true);
            self.counters.skipped_steps += 1;
            self.last = StepOutcome::SkippedOverflow {
                loss_scale: self.precision.loss_scale().unwrap_or(f64::NAN),
            };
            self.end_cycle();
            return Ok(model);
        }
        if let (Some(max), Some(s), false) = (self.config.max_grad_norm, summary, self.clipped) {
            grads::clip_to_norm::<B, M>(&model, &mut grads, s.norm(), max);
        }
        if summary.is_some_and(|s| !s.is_finite()) {
            tracing::warn!("non-finite gradients without loss scaling; stepping anyway");
        }
        self.strategy.before_optimizer_step(&model, &mut grads);
        let lr = scheduler.step();
        let model = optimizer.step(lr, model, grads);
        let step = self.counters.optimizer_steps + 1;
        self.precision.update(false);
        // A joiner healed at this step's sync continues with the scale after it.
        self.attach_live_state();
        let model = self.strategy.after_optimizer_step(model, optimizer, step)?;
        self.counters.optimizer_steps += 1;
        self.last = StepOutcome::Stepped {
            lr,
            grad_norm: summary.map(|s| s.norm()),
        };
        self.end_cycle();
        Ok(model)
    }

    /// Clears the cycle and re-seeds the backend RNG for the next one, from (seed, cycle).
    pub(crate) fn end_cycle(&mut self) {
        self.synced = false;
        self.deferred_scale = None;
        self.pending = None;
        self.unscaled = None;
        self.clipped = false;
        self.micro_in_cycle = 0;
        self.reseed();
    }

    pub(crate) fn reseed(&self) {
        B::seed(&self.device, self.cycle_seed(BACKEND_SEED_DOMAIN));
        afterburner_checkpoint::seed_blocks(self.cycle_seed(BLOCK_SEED_DOMAIN));
    }

    /// A seed for the current accumulation cycle in `domain`.
    fn cycle_seed(&self, domain: u64) -> u64 {
        let cycle =
            self.counters.optimizer_steps + self.counters.skipped_steps + self.unsettled_steps();
        derive_seed(self.config.seed, domain, cycle)
    }

    /// Micro-batches waiting in the current accumulation cycle.
    pub fn pending_micro_batches(&self) -> usize {
        self.micro_in_cycle
    }

    /// Progress counters (with the steps [`step_on_device`](Self::step_on_device) decided:
    /// a host read while some are not settled).
    pub fn counters(&self) -> Counters {
        self.counters_now()
    }

    /// FLOPs this rank's thread has run through `Autocast` (matmul, Linear, convolutions,
    /// attention; see [`count_flops`](afterburner_precision::count_flops)) since the
    /// Accelerator was built: the training steps' forward and backward, and whatever else
    /// ran on the thread (an evaluation). 0 on a backend without `Autocast`. Not saved with
    /// the state: a resumed run counts from its start.
    pub fn flops(&self) -> u64 {
        afterburner_precision::flops_counted().wrapping_sub(self.flops_at_start)
    }

    /// What the last [`step`](Self::step) did ([`StepOutcome::Deferred`] after
    /// [`step_on_device`](Self::step_on_device)).
    pub fn last_step(&self) -> StepOutcome {
        self.last
    }

    /// The current fp16 loss scale (`None` unless the precision is "16-mixed").
    pub fn loss_scale(&self) -> Option<f64> {
        self.precision.loss_scale()
    }

    /// `(epoch, batch)` where the training loader should continue (after a resume too).
    pub fn data_position(&self) -> (usize, usize) {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .resume_position()
    }
}
