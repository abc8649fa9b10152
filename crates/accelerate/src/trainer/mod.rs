//! The Trainer: HuggingFace's `Trainer` for Burn models. Give it a model, the
//! [`TrainingArguments`], a training and an evaluation dataset and a batcher; it runs every
//! step through the [`Accelerator`], so precision, accumulation, clipping, checkpointing,
//! DDP/FSDP and Local SGD compose, and adds the learning-rate schedule, evaluation with
//! burn-train's metrics, logs, checkpoints (`checkpoint-<step>/`), resume and the best model.
//!
//! The model says how a batch becomes a loss ([`TrainLoss`], through `acc.forward` like a
//! hand-written Accelerator loop) and how an evaluation batch becomes an output for metrics
//! (burn-train's `InferenceStep`, on the model without autodiff, as in a burn-train
//! `Learner`).
//!
//! ```no_run
//! # use afterburner_demos::{digits, ImageBatcher};
//! # use afterburner_demos::models::VitConfig;
//! # use afterburner::trainer::{Trainer, TrainingArguments};
//! # use burn::train::metric::AccuracyMetric;
//! # type B = burn::backend::Autodiff<burn::backend::Flex>;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (train, test) = digits::load()?.split(0.2, 0);
//! let model = VitConfig::new().init::<B>(&Default::default());
//! let args = TrainingArguments::from_args(std::env::args().skip(1))?;
//! let batcher = ImageBatcher { channels: 1, height: 8, width: 8 };
//! let mut trainer = Trainer::new(model, args, train, test, batcher)?
//!     .with_metrics((AccuracyMetric::new(),));
//! println!("{}", trainer.train()?);
//! println!("{}", trainer.evaluate()?);
//! # Ok(())
//! # }
//! ```

mod across_ranks;
mod args;
mod args_file;
mod callbacks;
mod checkpoints;
mod choices;
mod cli;
mod curves;
mod device_adamw;
mod device_gate;
mod evaluate;
pub mod gated;
mod heal;
mod metrics;
mod optim;
mod output;
mod per_item;
mod reads;
mod run;
mod schedule;
mod state;
mod tensorboard;
mod throughput;
mod train_loss;
mod types;
mod unread_losses;

use std::sync::Arc;

use crate::parallel::ParallelStrategy;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;
use burn::train::InferenceStep;
use burn::train::metric::{Adaptor, LossInput};

pub use args::TrainingArguments;
pub use callbacks::{EarlyStopping, Flow, TrainerCallback};
pub use checkpoints::{
    checkpoint_dir, checkpoints_to_delete, list_checkpoints, resolve_checkpoint,
};
pub use choices::{
    IntervalStrategy, LossNormalization, OptimizerType, ReportTo, SchedulerType, UnknownValue,
};
pub use device_adamw::{DeviceAdamW, DeviceAdamWConfig};
pub use metrics::{EvalMetric, MetricSet};
pub use optim::{
    ArgsOptimizer, ArgsState, ArgsStateItem, F16_MIN_EPSILON, HfOptimizer, adam_epsilon,
    optimizer_from_args,
};
pub use schedule::HfSchedule;
pub use state::{LogEntry, Metrics, TrainSummary, TrainerState};
pub use train_loss::TrainLoss;
pub use types::{Components, TrainerAccelerator, TrainerTypes, WithOptimizers};

use crate::data::DataLoaderShard;
use crate::throughput::ThroughputMeter;
use crate::{AccelerateError, Accelerator};
use metrics::ShardOf;
use output::RunLog;

/// The evaluation model of a Trainer: `M` without autodiff.
type EvalModel<B, M> = <M as AutodiffModule<B>>::InnerModule;
/// The evaluation backend of a Trainer.
type Inner<B> = <B as AutodiffBackend>::InnerBackend;
/// The loader of a Trainer's evaluation batches.
type EvalLoader<T> = DataLoaderShard<
    Inner<<T as TrainerTypes>::Backend>,
    <T as TrainerTypes>::Item,
    <T as TrainerTypes>::EvalBatch,
>;

/// HF's `Trainer` for a Burn model, its types bundled in `T` ([`Components`]: the backend, the
/// model, the items and batches, the optimizer and LR scheduler, by default the ones the
/// arguments name ([`HfOptimizer`], [`HfSchedule`]; any Burn optimizer and scheduler through
/// [`with_optimizers`](Self::with_optimizers)), and the strategy, by default the built-in
/// [`AnyStrategy`], or a user's own through [`on`](Self::on) with an Accelerator of that
/// strategy).
pub struct Trainer<T: TrainerTypes> {
    acc: TrainerAccelerator<T>,
    args: TrainingArguments,
    model: Option<T::Model>,
    optim: T::Optimizer,
    schedule: T::Scheduler,
    /// The learning rate of the last optimizer step (logged as `learning_rate`).
    last_lr: Option<f64>,
    train: DataLoaderShard<T::Backend, T::Item, T::TrainBatch>,
    /// This rank's share of the evaluation data (`None` when it has no item).
    eval: Option<EvalLoader<T>>,
    epochs: usize,
    metrics: Vec<Box<dyn EvalMetric<T::EvalOutput>>>,
    callbacks: Vec<Box<dyn TrainerCallback>>,
    state: TrainerState,
    log: RunLog,
    /// The optimizer step this run last saved a checkpoint at.
    saved_at: Option<u64>,
    /// The training losses since they were last read (at a log, a save, the end).
    unread: unread_losses::UnreadLosses<Inner<T::Backend>>,
    /// The default AdamW's steps decided on the device (`None`: the host decides).
    gate: Option<device_gate::TrainerGate<Inner<T::Backend>>>,
    /// The global gradient norm of the last step, when one was computed and read.
    last_grad_norm: Option<f64>,
    /// This rank's samples, tokens, FLOPs and time since the last training log.
    meter: ThroughputMeter,
    /// The device's peak FLOP/s for MFU, once looked up (`Some(None)`: unknown).
    peak_flops: Option<Option<f64>>,
    /// A fault-tolerant replica's model is set up by `join` when training starts.
    join_pending: bool,
}

impl<B, M, I, TB, EB, EO> Trainer<Components<B, M, I, TB, EB, EO>>
where
    B: AutodiffBackend,
    M: TrainLoss<B, TB> + 'static,
    EvalModel<B, M>: InferenceStep<Input = EB, Output = EO>,
    I: Send + Sync + 'static,
    TB: Send + 'static,
    EB: Send + 'static,
    EO: Adaptor<LossInput<Inner<B>>> + 'static,
{
    /// A Trainer on the backend's default device (one device: for several, build each
    /// rank's Trainer with [`on`](Self::on) inside [`Accelerator::run`]). `eval_dataset`
    /// may be empty when `eval_strategy` is "no". In a process started by `afterburner
    /// launch`, it is this process's rank of the launched run, under any strategy
    /// ([`Accelerator::launched`]): a program needs no launch code of its own.
    pub fn new<D, E, Bt>(
        model: M,
        args: TrainingArguments,
        train_dataset: D,
        eval_dataset: E,
        batcher: Bt,
    ) -> Result<Self, AccelerateError>
    where
        D: Dataset<I> + 'static,
        E: Dataset<I> + 'static,
        Bt: Batcher<B, I, TB> + Batcher<Inner<B>, I, EB> + Clone + 'static,
    {
        args.validate()?;
        if let Some(launched) = crate::parallel::Launched::from_env()? {
            // Started by `afterburner launch`: this process's rank of the launched run.
            let acc = Accelerator::launched(args.accelerator_config(), &launched)?;
            return Self::on(acc, model, args, train_dataset, eval_dataset, batcher);
        }
        if args.parallelism.strategy.is_distributed() {
            return Err(AccelerateError::argument(
                "strategy",
                &args.parallelism.strategy,
                "single-device for Trainer::new; for several devices build each rank's \
                 Trainer with Trainer::on inside Accelerator::run(args.accelerator_config(), ..)",
            ));
        }
        let acc = Accelerator::new(args.accelerator_config(), Default::default())?;
        Self::on(acc, model, args, train_dataset, eval_dataset, batcher)
    }
}

impl<B, M, I, TB, EB, EO, S>
    Trainer<Components<B, M, I, TB, EB, EO, HfOptimizer<M, B>, HfSchedule, S>>
where
    B: AutodiffBackend,
    M: TrainLoss<B, TB, S> + 'static,
    EvalModel<B, M>: InferenceStep<Input = EB, Output = EO>,
    I: Send + Sync + 'static,
    TB: Send + 'static,
    EB: Send + 'static,
    EO: Adaptor<LossInput<Inner<B>>> + 'static,
    S: ParallelStrategy<B>,
{
    /// A Trainer on this rank's Accelerator `acc` (from [`Accelerator::run`], `launch` or
    /// `launch_mpi` with `args.accelerator_config()`); every rank builds one and calls
    /// [`train`](Self::train). The training data is sharded like the Accelerator's loaders;
    /// each rank evaluates its share of `eval_dataset` and the metrics are combined exactly.
    pub fn on<D, E, Bt>(
        acc: Accelerator<B, S>,
        model: M,
        args: TrainingArguments,
        train_dataset: D,
        eval_dataset: E,
        batcher: Bt,
    ) -> Result<Self, AccelerateError>
    where
        D: Dataset<I> + 'static,
        E: Dataset<I> + 'static,
        Bt: Batcher<B, I, TB> + Batcher<Inner<B>, I, EB> + Clone + 'static,
    {
        args.validate()?;
        check_same_config(&acc, &args)?;
        if args.eval_strategy != IntervalStrategy::No && eval_dataset.is_empty() {
            return Err(AccelerateError::argument(
                "eval_strategy",
                args.eval_strategy,
                "\"no\" when the evaluation dataset is empty",
            ));
        }
        let gate_cell = gated::GateCell::default();
        let optim = optim::gated_optimizer_from_args::<B, M>(&args, gate_cell.clone());
        // A fault-tolerant replica (Local SGD, DiLoCo over a quorum) is set up by `join` in
        // `train`, with the optimizer it trains with: a restarted one is healed then.
        let join_pending = acc.is_fault_tolerant();
        // Under tensor parallelism (the ranks of a group share their data), the model's plan
        // splits it first.
        let model = match acc.config().parallelism.is_tensor_parallel() {
            true => model.parallelize(&acc)?,
            false => model,
        };
        let model = match join_pending {
            true => model,
            false => acc.setup_model(model)?,
        };
        let mut train = acc
            .dataloader(
                train_dataset,
                batcher.clone(),
                args.per_device_train_batch_size,
            )?
            .drop_last(args.dataloader_drop_last)
            .prefetch(args.dataloader_num_workers);
        if let Some(seed) = args.data_seed {
            train = train.shuffle(seed);
        }
        if train.num_batches() == 0 {
            return Err(AccelerateError::argument(
                "per_device_train_batch_size",
                args.per_device_train_batch_size,
                format!(
                    "at most the {} training items of this rank (no batch to train on)",
                    train.len()
                ),
            ));
        }
        let shard = ShardOf::new(Arc::new(eval_dataset), acc.rank(), acc.world_size());
        let eval = match shard.is_empty() {
            true => None,
            false => Some(
                DataLoaderShard::new(
                    shard,
                    batcher,
                    args.per_device_eval_batch_size,
                    acc.device().clone(),
                )?
                .prefetch(args.dataloader_num_workers),
            ),
        };
        let (max_steps, epochs) = plan(&args, train.num_batches());
        let warmup = HfSchedule::warmup_from(args.warmup_steps, args.warmup_ratio, max_steps);
        let schedule = HfSchedule::new(
            args.lr_scheduler_type,
            args.learning_rate,
            warmup,
            max_steps,
        );
        let gate =
            device_gate::TrainerGate::new(&args, &schedule, gate_cell, acc.can_step_on_device());
        let mut callbacks: Vec<Box<dyn TrainerCallback>> = Vec::new();
        if let Some(patience) = args.early_stopping_patience {
            callbacks.push(Box::new(EarlyStopping { patience }));
        }
        let state = TrainerState {
            max_steps: max_steps as u64,
            ..TrainerState::default()
        };
        let mut log = RunLog::new(&args.output_dir, acc.is_main_process(), !args.disable_tqdm);
        if args.report_to.tensorboard() {
            log = log.with_tensorboard(&args.tensorboard_dir());
        }
        Ok(Self {
            acc,
            args,
            model: Some(model),
            optim,
            schedule,
            last_lr: None,
            train,
            eval,
            epochs,
            metrics: Vec::new(),
            callbacks,
            state,
            log,
            saved_at: None,
            unread: Default::default(),
            gate,
            last_grad_norm: None,
            meter: ThroughputMeter::start(),
            peak_flops: None,
            join_pending,
        })
    }
}

impl<T: TrainerTypes> Trainer<T> {
    /// This Trainer stepping with `optimizer` and `scheduler` instead of the ones the
    /// arguments name, like HF's `Trainer(optimizers=(optimizer, scheduler))`: any Burn
    /// optimizer (`SgdConfig::new().with_momentum(..).init()`, `AdamConfig`, a user's own)
    /// and any Burn `LrScheduler`. The arguments' `optim`, `learning_rate`, the Adam
    /// settings, `weight_decay`, `lr_scheduler_type` and the warmup are then not read (the
    /// step count still is). Call it before training.
    pub fn with_optimizers<O2, L2>(
        self,
        optimizer: O2,
        scheduler: L2,
    ) -> Trainer<WithOptimizers<T, O2, L2>>
    where
        O2: Optimizer<T::Model, T::Backend>,
        L2: LrScheduler,
    {
        Trainer {
            acc: self.acc,
            args: self.args,
            model: self.model,
            optim: optimizer,
            schedule: scheduler,
            last_lr: None,
            train: self.train,
            eval: self.eval,
            epochs: self.epochs,
            metrics: self.metrics,
            callbacks: self.callbacks,
            state: self.state,
            log: self.log,
            saved_at: self.saved_at,
            unread: self.unread,
            // A user's optimizer decides on the host.
            gate: None,
            last_grad_norm: self.last_grad_norm,
            meter: self.meter,
            peak_flops: self.peak_flops,
            join_pending: self.join_pending,
        }
    }

    /// Adds evaluation metrics: one burn-train metric or a tuple of them, e.g.
    /// `(AccuracyMetric::new(), TopKAccuracyMetric::new(2))`; each is reported as
    /// `eval_<name>`. The loss is always reported, as `eval_loss`, per item (HF's way; a
    /// `LossMetric` given here is left out: burn-train's weighs every batch the same).
    pub fn with_metrics(mut self, metrics: impl MetricSet<T::EvalOutput>) -> Self {
        for metric in metrics.into_boxed() {
            let key = metric.key();
            if key == "eval_loss" {
                continue;
            }
            self.metrics.retain(|m| m.key() != key);
            self.metrics.push(metric);
        }
        self
    }

    /// Stores this Trainer's checkpoints with `checkpointer` (its `checkpoint-<step>` saves,
    /// their rotation, `resume_from_checkpoint` and "latest") instead of directories on disk:
    /// [`Accelerator::with_checkpointer`] on its Accelerator. Set it before `train`.
    pub fn with_checkpointer(mut self, checkpointer: impl crate::Checkpointer + 'static) -> Self {
        self.acc = self.acc.with_checkpointer(checkpointer);
        self
    }

    /// Adds a callback, called at every step end, log, evaluation and save.
    pub fn with_callback(mut self, callback: impl TrainerCallback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// The model (the best one after training with `load_best_model_at_end`). Under FSDP
    /// this rank's shard: see [`Accelerator::full_model`].
    pub fn model(&self) -> Result<&T::Model, AccelerateError> {
        self.model.as_ref().ok_or_else(lost_model)
    }

    /// Saves the whole model's parameters as a safetensors file (in PyTorch's layout with
    /// [`Layout::PyTorch`](crate::weights::Layout), for `safetensors.torch.load_file`). Every
    /// rank calls it (FSDP gathers the shards); the main process writes.
    pub fn save_model(
        &self,
        path: impl AsRef<std::path::Path>,
        layout: crate::weights::Layout,
    ) -> Result<(), AccelerateError> {
        let full = self.acc.full_model(self.model()?)?;
        if self.acc.is_main_process() {
            crate::weights::save_safetensors(&full, path, layout)?;
        }
        self.acc.barrier()
    }

    /// The trained model, and the Accelerator that holds its strategy.
    pub fn into_parts(self) -> Result<(T::Model, TrainerAccelerator<T>), AccelerateError> {
        Ok((self.model.ok_or_else(lost_model)?, self.acc))
    }

    /// The Accelerator every step runs through.
    pub fn accelerator(&self) -> &TrainerAccelerator<T> {
        &self.acc
    }

    /// The arguments.
    pub fn args(&self) -> &TrainingArguments {
        &self.args
    }

    /// Counters, best metric and log history so far.
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    /// The learning-rate scheduler.
    pub fn schedule(&self) -> &T::Scheduler {
        &self.schedule
    }
}

/// The error for a model lost to an earlier failed step.
fn lost_model() -> AccelerateError {
    AccelerateError::CallOrder("the Trainer's model was lost to an earlier failed step".into())
}

/// `(optimizer steps, epochs)` of the run, HF's way: `max_steps` when set, else
/// `ceil(num_train_epochs * updates per epoch)`, an epoch being
/// `ceil(batches / gradient_accumulation_steps)` updates.
fn plan(args: &TrainingArguments, batches_per_epoch: usize) -> (usize, usize) {
    let updates_per_epoch = batches_per_epoch
        .div_ceil(args.gradient_accumulation_steps)
        .max(1);
    let max_steps = match args.max_steps > 0 {
        true => args.max_steps as usize,
        false => ((args.num_train_epochs * updates_per_epoch as f64).ceil() as usize).max(1),
    };
    (max_steps, max_steps.div_ceil(updates_per_epoch))
}

/// Errors unless `acc` was built with every setting `args` owns ([`TrainingArguments::apply_to`]
/// changes nothing of its config), naming the first that differs.
fn check_same_config<B: AutodiffBackend, S: ParallelStrategy<B>>(
    acc: &Accelerator<B, S>,
    args: &TrainingArguments,
) -> Result<(), AccelerateError> {
    let have = acc.config();
    let want = args.apply_to(have.clone());
    if want == *have {
        return Ok(());
    }
    let table = |c: &crate::AcceleratorConfig| match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (want, have) = (table(&want), table(have));
    let key = want
        .iter()
        .find(|(key, value)| have.get(*key) != Some(value))
        .map_or("the Accelerator's config".to_string(), |(key, _)| {
            key.clone()
        });
    Err(AccelerateError::argument(
        key,
        "a value the Accelerator was not built with",
        "the Accelerator built from args.accelerator_config()",
    ))
}
