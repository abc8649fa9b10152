//! The multi-device side of the [`Accelerator`]: starting ranks, rank queries, evaluation
//! across ranks, and the gradient and parameter exchanges `step` asks for.

use afterburner_parallel::{
    Fsdp, LaunchConfig, Launched, OptimizerSharding, ParallelStrategy, ReduceOp, Traffic,
};
use afterburner_precision::grads::{self, GradSummary};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::data::DataLoaderShard;
use crate::group::{Group, counted};
use crate::{AccelerateError, Accelerator, AcceleratorConfig};

impl<B: AutodiffBackend> Accelerator<B> {
    /// One rank of a data-parallel run over `group` (any engine); [`launch`](Self::launch)
    /// calls it for each in-process worker. Needs a distributed `strategy`. With a
    /// fault-tolerant [`QuorumGroup`](afterburner_parallel::QuorumGroup) (`"local-sgd"` or
    /// `"diloco"`), set up with [`join`](Self::join) so a restarted replica is healed.
    pub fn with_group(
        config: AcceleratorConfig,
        device: B::Device,
        group: Group<B>,
    ) -> Result<Self, AccelerateError> {
        if !config.parallelism.strategy.is_distributed() {
            return Err(AccelerateError::invalid(
                "strategy",
                &config.parallelism.strategy,
                "a multi-device strategy for a multi-device run (see StrategyConfig)",
            ));
        }
        Self::build(config, device, Some(group))
    }

    /// Runs `worker` once per device, each on its own thread with an Accelerator of that rank
    /// (`strategy = "ddp"`, `"zero-1"` or `"fsdp"`), like Fabric's `launch`; returns their results in
    /// rank order. A worker that errors, panics or hangs in a collective makes the others fail
    /// too, within `collective_timeout_s`: never a hang.
    ///
    /// Flex keeps one RNG per process: build the model before `launch` (or on rank 0 only:
    /// `setup` broadcasts rank 0's parameters).
    pub fn launch<R, F>(
        config: AcceleratorConfig,
        devices: Vec<B::Device>,
        worker: F,
    ) -> Result<Vec<R>, AccelerateError>
    where
        R: Send + 'static,
        F: Fn(Accelerator<B>) -> Result<R, AccelerateError> + Send + Sync + 'static,
    {
        // The devices given are the ranks (what `tp_size` divides), whatever `devices` says.
        let config = AcceleratorConfig {
            parallelism: config.parallelism.with_devices(devices.len()),
            ..config
        };
        config.validate()?;
        let timeout = std::time::Duration::from_secs_f64(config.collective_timeout_s);
        let results = afterburner_parallel::launch::<B::InnerBackend, _, AccelerateError, _>(
            devices,
            LaunchConfig { timeout },
            move |group| {
                let device = group.device().clone();
                worker(Self::build(config.clone(), device, Some(Box::new(group)))?)
            },
        )?;
        Ok(results)
    }

    /// Runs `worker` as this process's rank of an MPI job (`mpirun` starts one process per
    /// device, on one machine or several, like a torchrun job), with an Accelerator of that
    /// rank (`strategy = "ddp"`, `"zero-1"` or `"fsdp"`), and returns its result. Feature
    /// `mpi`. Rank and world size come from the MPI environment. A worker that errors or
    /// panics, or a collective waiting longer than `collective_timeout_s`, aborts the whole
    /// job (every process exits with an error). Call it once per process.
    #[cfg(feature = "mpi")]
    pub fn launch_mpi<R, F>(
        config: AcceleratorConfig,
        device: B::Device,
        worker: F,
    ) -> Result<R, AccelerateError>
    where
        F: FnOnce(Accelerator<B>) -> Result<R, AccelerateError>,
    {
        config.validate()?;
        let timeout = std::time::Duration::from_secs_f64(config.collective_timeout_s);
        let result = afterburner_parallel::launch_mpi::<B::InnerBackend, _, AccelerateError, _>(
            device.clone(),
            LaunchConfig { timeout },
            move |group| worker(Self::with_group(config, device, Box::new(group))?),
        )?;
        Ok(result)
    }

    /// Runs `worker` on `config.parallelism.devices` devices, like Fabric's `launch` with `devices=N`: on
    /// one device under `strategy = "single-device"` it runs here with
    /// [`new`](Self::new); otherwise one worker thread per device of
    /// [`local_devices`](afterburner_parallel::local_devices) through
    /// [`launch`](Self::launch). The same code trains on 1 or N devices; results come back in
    /// rank order.
    ///
    /// Started by `afterburner launch` (a [`Launched`] environment), it runs `worker` once,
    /// as this process's rank of the launched run: over the launch's process group (ranks
    /// failing together under DDP, ZeRO-1 and FSDP; a fault-tolerant quorum under Local SGD
    /// and DiLoCo, whose restarted replicas [`join`](Self::join)), on device `LOCAL_RANK`;
    /// `config.parallelism.devices` is then not read, and the result is this rank's alone.
    pub fn run<R, F>(config: AcceleratorConfig, worker: F) -> Result<Vec<R>, AccelerateError>
    where
        R: Send + 'static,
        F: Fn(Accelerator<B>) -> Result<R, AccelerateError> + Send + Sync + 'static,
    {
        if let Some(launched) = Launched::from_env()? {
            return Ok(vec![worker(Self::launched(config, &launched)?)?]);
        }
        config.validate()?;
        if !config.parallelism.strategy.is_distributed() {
            return Ok(vec![worker(Self::new(config, B::Device::default())?)?]);
        }
        let devices =
            afterburner_parallel::local_devices::<B::InnerBackend>(config.parallelism.devices)?;
        Self::launch(config, devices, worker)
    }

    /// Parameter ownership under `strategy = "zero-1"` (after the first optimizer step).
    pub fn optimizer_sharding(&self) -> Option<&OptimizerSharding> {
        self.strategy.optimizer_sharding()
    }

    /// The FSDP state under `strategy = "fsdp"`: units, shard sizes, collective counts.
    pub fn fsdp(&self) -> Option<&Fsdp<B, Group<B>>> {
        self.strategy.fsdp()
    }
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// [`run`](Accelerator::run) with a strategy of your own: `make_strategy` builds each
    /// rank's strategy from that rank's process group (`None` when `config.parallelism.devices` is 1),
    /// on the rank's own thread. The config's `strategy` and its tables are not read; its
    /// `devices` says how many ranks start. Results come back in rank order.
    pub fn run_with<R, F, MS>(
        config: AcceleratorConfig,
        make_strategy: MS,
        worker: F,
    ) -> Result<Vec<R>, AccelerateError>
    where
        R: Send + 'static,
        F: Fn(Accelerator<B, S>) -> Result<R, AccelerateError> + Send + Sync + 'static,
        MS: Fn(Option<Group<B>>) -> Result<S, AccelerateError> + Send + Sync + 'static,
    {
        config.validate_common()?;
        if config.parallelism.devices == 1 {
            let strategy = make_strategy(None)?;
            return Ok(vec![worker(Self::with_strategy(
                config,
                B::Device::default(),
                strategy,
            )?)?]);
        }
        let devices =
            afterburner_parallel::local_devices::<B::InnerBackend>(config.parallelism.devices)?;
        Self::launch_with(config, devices, make_strategy, worker)
    }

    /// [`launch`](Accelerator::launch) with a strategy of your own, built for each rank by
    /// `make_strategy` from that rank's process group (whose traffic the Accelerator counts).
    /// A worker that errors, panics or hangs makes the others fail too, as under `launch`.
    pub fn launch_with<R, F, MS>(
        config: AcceleratorConfig,
        devices: Vec<B::Device>,
        make_strategy: MS,
        worker: F,
    ) -> Result<Vec<R>, AccelerateError>
    where
        R: Send + 'static,
        F: Fn(Accelerator<B, S>) -> Result<R, AccelerateError> + Send + Sync + 'static,
        MS: Fn(Option<Group<B>>) -> Result<S, AccelerateError> + Send + Sync + 'static,
    {
        config.validate_common()?;
        let timeout = std::time::Duration::from_secs_f64(config.collective_timeout_s);
        let results = afterburner_parallel::launch::<B::InnerBackend, _, AccelerateError, _>(
            devices,
            LaunchConfig { timeout },
            move |group| {
                let device = group.device().clone();
                let traffic = Traffic::default();
                let strategy = make_strategy(Some(counted::<B>(Box::new(group), &traffic)))?;
                worker(Self::assemble(config.clone(), device, strategy, traffic)?)
            },
        )?;
        Ok(results)
    }

    /// This process's rank (0 on a single device).
    pub fn rank(&self) -> usize {
        self.strategy.rank()
    }

    /// The number of ranks (1 on a single device).
    pub fn world_size(&self) -> usize {
        self.strategy.world_size()
    }

    /// True on rank 0, the rank that logs and writes files.
    pub fn is_main_process(&self) -> bool {
        self.rank() == 0
    }

    /// Parameter syncs so far: Local SGD's averages, DiLoCo's outer steps (one all-reduce of
    /// the parameters each); 0 under the other strategies.
    pub fn parameter_syncs(&self) -> u64 {
        self.strategy.parameter_syncs()
    }

    /// What this rank sent through collectives so far, every strategy and call included
    /// (gradient all-reduces, parameter syncs, FSDP gathers, metric reductions): calls and
    /// payload bytes in each tensor's dtype. Zero on a single device.
    pub fn traffic(&self) -> &afterburner_parallel::Traffic {
        &self.traffic
    }

    /// Gradient all-reduces so far (one per optimizer step under DDP; 0 on a single device).
    pub fn gradient_all_reduces(&self) -> u64 {
        self.strategy.gradient_all_reduces()
    }

    /// An evaluation loader over any Burn `dataset` and `batcher`: in order, not tracked for
    /// accumulation, and under DDP this rank's shard (every `world_size`-th item, padded by
    /// repeating the first items). Pass the per-item results to
    /// [`gather_for_metrics`](Self::gather_for_metrics).
    pub fn eval_dataloader<I, O, D, Bt>(
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
        DataLoaderShard::new(dataset, batcher, batch_size, self.device.clone())?
            .shard(self.rank(), self.world_size())
    }

    /// Every rank's per-item `values` (this rank's whole [`eval_dataloader`] epoch, in its
    /// order) gathered back into dataset order, with the padding items dropped: the result has
    /// `dataset_len` values on every rank, like Accelerate's `gather_for_metrics`.
    ///
    /// [`eval_dataloader`]: Self::eval_dataloader
    pub fn gather_for_metrics(
        &self,
        values: Tensor<B, 1>,
        dataset_len: usize,
    ) -> Result<Tensor<B, 1>, AccelerateError> {
        let Some(group) = self.strategy.group() else {
            let [len] = values.dims();
            return Ok(values.narrow(0, 0, len.min(dataset_len)));
        };
        let world = group.world_size();
        let parts = group.all_gather(values.inner())?;
        let per_rank = dataset_len.div_ceil(world);
        for (rank, part) in parts.iter().enumerate() {
            let [len] = part.dims();
            if len != per_rank {
                return Err(AccelerateError::RanksDisagree(format!(
                    "gather_for_metrics: rank {rank} gave {len} values; expected {per_rank} \
                     (its whole eval_dataloader epoch for a dataset of {dataset_len})"
                )));
            }
        }
        // Item k of the dataset is item k / world of rank k % world: side by side, row by
        // row, the ranks' values are in dataset order; the padding is at the end.
        let columns = parts
            .into_iter()
            .map(|p| p.reshape([per_rank, 1]))
            .collect();
        let all = Tensor::cat(columns, 1).reshape([per_rank * world]);
        Ok(Tensor::from_inner(all.narrow(0, 0, dataset_len)))
    }

    /// `values` combined element-wise across ranks (`ReduceOp::Sum` or `Mean`), like
    /// Accelerate's `reduce`: for metrics every rank computed over its own shard (a loss sum,
    /// a count of correct answers). On a single device, `values` unchanged.
    pub fn reduce(
        &self,
        values: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, AccelerateError> {
        match self.strategy.group() {
            Some(group) => Ok(Tensor::from_inner(group.all_reduce(values.inner(), op)?)),
            None => Ok(values),
        }
    }

    /// Waits until every rank gets here (a no-op on a single device).
    pub fn barrier(&self) -> Result<(), AccelerateError> {
        match self.strategy.group() {
            Some(group) => Ok(group.barrier(&self.device)?),
            None => Ok(()),
        }
    }

    /// Lets the strategy reduce the pending gradients across ranks, once per cycle (before
    /// any unscaling or clipping, so every rank sees the same gradients).
    pub(crate) fn reduce_pending<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
    ) -> Result<(), AccelerateError> {
        if self.synced {
            return Ok(());
        }
        if let Some(grads) = self.pending.as_mut() {
            self.strategy.reduce_gradients(model, grads)?;
            if let Some(factor) = self.deferred_scale.take() {
                grads::scale::<B, M>(model, grads, factor);
            }
        }
        self.synced = true;
        Ok(())
    }

    /// The summary of the whole model's gradients from this rank's (the strategy sums the
    /// squared norms when ranks hold different parts; with `norm`, it may count them per
    /// parameter, as tensor parallelism does).
    pub(crate) fn summary_over_ranks<M: AutodiffModule<B>>(
        &self,
        model: &M,
        summary: GradSummary,
        norm: bool,
    ) -> Result<GradSummary, AccelerateError> {
        let local = summary.squared_norm;
        let squared_norm = match (norm, self.pending.as_ref()) {
            (true, Some(grads)) => {
                self.strategy
                    .model_squared_norm(model, grads, local, &self.device)?
            }
            _ => self.strategy.global_squared_norm(local, &self.device)?,
        };
        Ok(GradSummary {
            squared_norm,
            tensors: summary.tensors,
        })
    }

    /// The whole model with full parameters: under FSDP gathered from every rank's shards
    /// (every rank must call it; each unit is one all-gather), like Accelerate's
    /// `get_state_dict` / FSDP's full state dict; otherwise a clone. For export, or evaluation
    /// outside [`forward`](Self::forward).
    pub fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, AccelerateError> {
        Ok(self.strategy.full_model(model)?)
    }

    /// Ends training: under `local-sgd` and `diloco`, a last sync when the last period was
    /// cut short, so every rank returns the same model (Accelerate's `LocalSGD` exit);
    /// elsewhere `model` as is. Every rank calls it, after its last `step`.
    pub fn finish<M: AutodiffModule<B>>(&mut self, model: M) -> Result<M, AccelerateError> {
        self.check_data()?;
        if self.pending_micro_batches() > 0 {
            return Err(AccelerateError::CallOrder(format!(
                "finish() with {} micro-batch gradients pending: call step() until the cycle ends",
                self.pending_micro_batches()
            )));
        }
        let steps = self.counters.optimizer_steps;
        if !self.same_on_every_rank(&[steps])? {
            return Err(AccelerateError::RanksDisagree(format!(
                "finish(): the ranks took different numbers of optimizer steps (this one {steps}); \
                 every rank must call it after the same steps"
            )));
        }
        Ok(self.strategy.finish(model, steps)?)
    }
}
