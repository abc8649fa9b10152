//! [`ParallelStrategy`]: how training is spread over devices. A training loop (the `afterburner`
//! Accelerator, or your own) holds one strategy and asks it at each phase of a step; the
//! strategy owns its state (process group, shard layout, counters).
//!
//! The phases of one optimizer step, in order:
//!
//! 1. [`setup`](ParallelStrategy::setup) once, before training;
//! 2. per micro-batch: the forward pass on [`forward_view`](ParallelStrategy::forward_view), then
//!    `backward`, then [`after_backward`](ParallelStrategy::after_backward);
//! 3. once per optimizer step (never on the accumulating micro-batches, like PyTorch's
//!    `no_sync`): [`reduce_gradients`](ParallelStrategy::reduce_gradients), the global norm through
//!    [`global_squared_norm`](ParallelStrategy::global_squared_norm) when clipping,
//!    [`before_optimizer_step`](ParallelStrategy::before_optimizer_step), the optimizer step, and
//!    [`after_optimizer_step`](ParallelStrategy::after_optimizer_step);
//! 4. saving and loading: the [`StateSaving`] sub-trait (its
//!    [`StateLayout`](crate::StateLayout) says which rank writes what; a sharded strategy
//!    converts its parts to and from the full state).
//!
//! Every method has the single-device behaviour as its default, so a strategy overrides only
//! the phases it changes. The methods are generic over the model type, so the trait is not
//! object safe: a loop that picks a strategy at run time dispatches through an enum.

use afterburner_checkpoint::DerivedParams;
use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::tp::TensorParallelPlan;
use crate::{ParallelError, ProcessGroup, StateSaving};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// The model a forward pass runs on, when a strategy provides one.
pub struct ForwardView<B: AutodiffBackend, M> {
    /// The model to call (e.g. FSDP's lazily gathered view).
    pub model: M,
    /// Parameters built from other tensors during the pass (FSDP's units from their shards):
    /// give them to [`with_derived_params`](afterburner_checkpoint::with_derived_params) so
    /// recomputed blocks gather again instead of keeping the full parameters.
    pub derived: Vec<DerivedParams<B>>,
}

/// How training is spread over devices: asked by the training loop at each phase (see the
/// module docs for the order). Implemented by [`SingleDevice`], [`Ddp`](crate::Ddp),
/// [`Zero1`](crate::Zero1) and [`Fsdp`](crate::Fsdp); another crate adds its own (Local SGD,
/// DiLoCo) by implementing it, with [`StateSaving`] for what it saves (an empty impl where
/// it keeps the single-device state).
pub trait ParallelStrategy<B: AutodiffBackend>: StateSaving<B> {
    /// Whether a replica of this strategy heals alone: one that dies is started again by
    /// itself and healed from a live replica while the others go on (Local SGD, DiLoCo over a
    /// quorum group). False (the default) where every rank must restart together from the
    /// last checkpoint (DDP, ZeRO-1, FSDP, TP). A launched worker declares it at the
    /// rendezvous: `afterburner launch` then restarts a dead replica alone (policy `replica`)
    /// or every worker (`all`), and refuses a worker whose strategy does not fit the policy it
    /// was given. A strategy of your own says so here.
    const HEALS_ALONE: bool = false;

    /// A short name for logs and errors ("single-device", "ddp", ...).
    fn name(&self) -> &'static str;

    /// The ranks' process group; `None` on a single device.
    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        None
    }

    /// This rank (0 on a single device).
    fn rank(&self) -> usize {
        self.group().map_or(0, |g| g.rank())
    }

    /// The number of ranks (1 on a single device).
    fn world_size(&self) -> usize {
        self.group().map_or(1, |g| g.world_size())
    }

    /// This rank's place among the ranks that split the data: what a training loader shards
    /// by (the world rank, but under tensor parallelism the data-parallel one: the ranks of a
    /// tensor-parallel group see the same batches).
    fn data_parallel_rank(&self) -> usize {
        self.rank()
    }

    /// The number of data shards (the world size, but the data-parallel size under tensor
    /// parallelism).
    fn data_parallel_size(&self) -> usize {
        self.world_size()
    }

    /// `model` split by its tensor-parallel plan for this rank, before
    /// [`setup`](Self::setup); unchanged (the default) where the strategy splits no layer.
    fn parallelize<M: TensorParallelPlan<B>>(&self, model: M) -> Result<M, ParallelError> {
        Ok(model)
    }

    /// Puts a model (on this rank's device, every parameter initialised) into the form this
    /// strategy trains: e.g. rank 0's parameters on every rank, or this rank's shards.
    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        Ok(model)
    }

    /// [`setup`](Self::setup) for a run that may be in progress: returns the model and the
    /// step training continues after. `0` after a plain setup; on a replica that joins a
    /// fault-tolerant run ([`Quorum::is_joining`](crate::Quorum::is_joining)), the model,
    /// `optimizer` and strategy state received from a live replica, and the step it had
    /// reached. Default: `setup`, step 0 (strategies without fault tolerance).
    fn join<M, O>(&mut self, model: M, optimizer: &mut O) -> Result<(M, u64), ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let _ = optimizer;
        Ok((self.setup(model)?, 0))
    }

    /// The model one forward pass runs on, with the parameters cast to `compute` when given;
    /// `None` to run on `model` itself (the loop then applies its own precision view). On an
    /// error nothing is left pending for [`after_backward`](Self::after_backward).
    fn forward_view<M: Module<B>>(
        &self,
        model: &M,
        compute: Option<DType>,
    ) -> Result<Option<ForwardView<B, M>>, ParallelError> {
        let _ = (model, compute);
        Ok(None)
    }

    /// After each backward pass, with this rank's new gradients of `model` (`grads`, before
    /// they join the cycle's): completes them where the strategy took them during backward
    /// (DDP's overlap), and reports a collective that failed inside it.
    fn after_backward<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        let _ = (model, grads);
        Ok(())
    }

    /// Whether this strategy reduces the gradients across ranks while backward runs (DDP's
    /// overlap): a rescale of the cycle's gradients before the step
    /// (the Accelerator's `scale_gradients`) is then applied to the reduced gradients, as the
    /// same rescale after the reduction, so the result does not depend on when it ran.
    fn reduces_in_backward(&self) -> bool {
        false
    }

    /// Makes `grads` (this rank's, accumulated over the cycle) the gradients this rank steps
    /// with; once per optimizer step, before any unscaling or clipping.
    fn reduce_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        let _ = (model, grads);
        Ok(())
    }

    /// Whether every rank skips this step, from this rank's `skip` (fp16 gradients that
    /// overflowed). Ranks that reduce their gradients first see the same ones and agree as
    /// they are (the default); a strategy that steps on local gradients (Local SGD) must make
    /// every rank skip together, or the ranks' collectives fall out of step.
    fn agree_on_skip(&self, skip: bool, device: &B::Device) -> Result<bool, ParallelError> {
        let _ = device;
        Ok(skip)
    }

    /// The squared L2 norm of the whole model's gradients from this rank's `local` one (the
    /// same unless ranks hold different parts of the gradients).
    fn global_squared_norm(&self, local: f64, device: &B::Device) -> Result<f64, ParallelError> {
        let _ = device;
        Ok(local)
    }

    /// Whether a step can be decided on the device, with no host read (the Accelerator's
    /// `step_on_device`): every rank reaches the same skip and clip factor from
    /// [`sum_over_parts_on_device`](Self::sum_over_parts_on_device) alone. True for one
    /// device, DDP, ZeRO-1 and FSDP; false by default, where ranks agree through the host
    /// (Local SGD's skip vote, tensor parallelism's norm that counts the copies once).
    fn decides_on_device(&self) -> bool {
        false
    }

    /// A measure of the gradients that adds up over their parts (the squared norm, the sum)
    /// for the whole model, from this rank's `local` one, as a device tensor and with no host
    /// read: `local` itself where every rank holds the same gradients after reduction (the
    /// default), summed by a device all-reduce where ranks hold different parts (FSDP).
    fn sum_over_parts_on_device(
        &self,
        local: Tensor<Inner<B>, 1>,
    ) -> Result<Tensor<Inner<B>, 1>, ParallelError> {
        Ok(local)
    }

    /// The squared L2 norm of the whole model's gradients from this rank's `grads` of
    /// `model`, whose squared norm is `local`: [`global_squared_norm`](Self::global_squared_norm)
    /// (the default) unless a rank holds parts of some parameters and copies of others
    /// (tensor parallelism counts the copies once).
    fn model_squared_norm<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &GradientsParams,
        local: f64,
        device: &B::Device,
    ) -> Result<f64, ParallelError> {
        let _ = (model, grads);
        self.global_squared_norm(local, device)
    }

    /// Just before the optimizer steps, after clipping: e.g. drop the gradients of the
    /// parameters other ranks update.
    fn before_optimizer_step<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) {
        let _ = (model, grads);
    }

    /// Right after `optimizer` stepped, the `step`-th optimizer step of the run (from 1,
    /// restored on resume): e.g. share the new values, refresh buffers, or (Local SGD) average
    /// the replicas, and with them the optimizer's state, every K steps.
    fn after_optimizer_step<M, O>(
        &mut self,
        model: M,
        optimizer: &mut O,
        step: u64,
    ) -> Result<M, ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let _ = (optimizer, step);
        Ok(model)
    }

    /// Gradient all-reduces so far (one per optimizer step under DDP and ZeRO-1); 0 for a
    /// strategy that exchanges no gradients.
    fn gradient_all_reduces(&self) -> u64 {
        0
    }

    /// Parameter syncs so far (Local SGD's averages, DiLoCo's outer steps); 0 for a strategy
    /// that exchanges gradients instead.
    fn parameter_syncs(&self) -> u64 {
        0
    }

    /// Whether each optimizer step uses the mean gradient over the ranks (DDP, ZeRO-1, FSDP:
    /// every rank steps on the same gradients); false when ranks step on their own (Local SGD,
    /// DiLoCo) or on a single device. The Trainer counts a step's items by it.
    fn averages_gradients(&self) -> bool {
        false
    }

    /// At the end of training, after `steps` optimizer steps: e.g. (Local SGD) a last
    /// average when the last period was cut short, so every rank ends with the same model.
    fn finish<M: AutodiffModule<B>>(&mut self, model: M, steps: u64) -> Result<M, ParallelError> {
        let _ = steps;
        Ok(model)
    }

    /// The whole model with full parameters (every rank must call it when it gathers).
    fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, ParallelError> {
        Ok(model.clone())
    }
}

/// One device, no collectives: every phase as in a plain loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SingleDevice;

impl<B: AutodiffBackend> ParallelStrategy<B> for SingleDevice {
    fn name(&self) -> &'static str {
        "single-device"
    }

    fn decides_on_device(&self) -> bool {
        true
    }
}

impl<B: AutodiffBackend> StateSaving<B> for SingleDevice {}
