//! The one place the facade knows its strategies: [`AnyStrategy`] is built from the config and
//! forwards every phase to the strategy it holds. The Accelerator only ever talks to it through
//! [`ParallelStrategy`]; adding a strategy means a variant here and a line in each `match`.

use afterburner_localsgd::{DiLoCo, LocalSgd};
use afterburner_parallel::{
    Ddp, ForwardView, Fsdp, OptimizerSharding, ParallelError, ParallelStrategy, ProcessGroup,
    ShardingStrategy, SharedGroup, SingleDevice, StateLayout, StrategyState, Zero1,
};
use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;

use crate::group::Group;
use crate::{AccelerateError, AcceleratorConfig, Strategy};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// The strategy an [`Accelerator`](crate::Accelerator) trains with, as the config's `strategy`
/// picks it.
pub enum AnyStrategy<B: AutodiffBackend> {
    /// `"single-device"`.
    SingleDevice(SingleDevice),
    /// `"ddp"`, and `"fsdp"` with `sharding_strategy = "none"`.
    Ddp(Ddp<B, SharedGroup<Group<B>>>),
    /// `"zero-1"`.
    Zero1(Zero1<B, SharedGroup<Group<B>>>),
    /// `"fsdp"`.
    Fsdp(Fsdp<B, Group<B>>),
    /// `"local-sgd"`.
    LocalSgd(LocalSgd<B, SharedGroup<Group<B>>>),
    /// `"diloco"`.
    DiLoCo(DiLoCo<B, SharedGroup<Group<B>>>),
}

impl<B: AutodiffBackend> AnyStrategy<B> {
    /// The strategy `config` asks for, over `group` (`None` on a single device): what
    /// [`Accelerator::run`](crate::Accelerator::run) builds for each rank.
    pub fn from_config(
        config: &AcceleratorConfig,
        group: Option<Group<B>>,
    ) -> Result<Self, AccelerateError> {
        let Some(group) = group else {
            return Ok(Self::SingleDevice(SingleDevice));
        };
        let group = SharedGroup::new(group);
        Ok(match config.strategy {
            Strategy::SingleDevice => {
                return Err(AccelerateError::invalid(
                    "strategy",
                    config.strategy,
                    "ddp, zero-1, fsdp, local-sgd or diloco for a multi-device run",
                ));
            }
            Strategy::Ddp => Self::Ddp(Ddp::new(group)),
            Strategy::Fsdp if config.fsdp.sharding_strategy == ShardingStrategy::NoShard => {
                Self::Ddp(Ddp::new(group))
            }
            Strategy::Zero1 => Self::Zero1(Zero1::new(group)),
            Strategy::Fsdp => Self::Fsdp(Fsdp::new(group, config.fsdp.clone())?),
            Strategy::LocalSgd => Self::LocalSgd(LocalSgd::new(group, config.local_sgd.clone())?),
            Strategy::DiLoCo => Self::DiLoCo(DiLoCo::new(group, config.diloco.clone())?),
        })
    }

    /// The FSDP state (units, shard sizes, collective counts) under `strategy = "fsdp"`.
    pub fn fsdp(&self) -> Option<&Fsdp<B, Group<B>>> {
        match self {
            Self::Fsdp(fsdp) => Some(fsdp),
            _ => None,
        }
    }

    /// Parameter ownership under `strategy = "zero-1"` (after the first optimizer step).
    pub fn optimizer_sharding(&self) -> Option<&OptimizerSharding> {
        match self {
            Self::Zero1(zero) => zero.sharding(),
            _ => None,
        }
    }

    /// The Local SGD state under `strategy = "local-sgd"` (parameter averages so far).
    pub fn local_sgd(&self) -> Option<&LocalSgd<B, SharedGroup<Group<B>>>> {
        match self {
            Self::LocalSgd(local) => Some(local),
            _ => None,
        }
    }

    /// The DiLoCo state under `strategy = "diloco"` (outer steps so far).
    pub fn diloco(&self) -> Option<&DiLoCo<B, SharedGroup<Group<B>>>> {
        match self {
            Self::DiLoCo(diloco) => Some(diloco),
            _ => None,
        }
    }
}

/// Calls `$call` on the strategy inside `$self`, whichever it is.
macro_rules! dispatch {
    ($self:expr, $s:ident => $call:expr) => {
        match $self {
            AnyStrategy::SingleDevice($s) => $call,
            AnyStrategy::Ddp($s) => $call,
            AnyStrategy::Zero1($s) => $call,
            AnyStrategy::Fsdp($s) => $call,
            AnyStrategy::LocalSgd($s) => $call,
            AnyStrategy::DiLoCo($s) => $call,
        }
    };
}

impl<B: AutodiffBackend> ParallelStrategy<B> for AnyStrategy<B> {
    fn name(&self) -> &'static str {
        dispatch!(self, s => ParallelStrategy::<B>::name(s))
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        dispatch!(self, s => ParallelStrategy::<B>::group(s))
    }

    fn rank(&self) -> usize {
        dispatch!(self, s => ParallelStrategy::<B>::rank(s))
    }

    fn world_size(&self) -> usize {
        dispatch!(self, s => ParallelStrategy::<B>::world_size(s))
    }

    fn agree_on_skip(&self, skip: bool, device: &B::Device) -> Result<bool, ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::agree_on_skip(s, skip, device))
    }

    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::setup(s, model))
    }

    fn join<M, O>(&mut self, model: M, optimizer: &mut O) -> Result<(M, u64), ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        dispatch!(self, s => ParallelStrategy::<B>::join(s, model, optimizer))
    }

    fn forward_view<M: Module<B>>(
        &self,
        model: &M,
        compute: Option<DType>,
    ) -> Result<Option<ForwardView<B, M>>, ParallelError> {
        dispatch!(self, s => s.forward_view(model, compute))
    }

    fn after_backward(&self) -> Result<(), ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::after_backward(s))
    }

    fn reduce_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        dispatch!(self, s => s.reduce_gradients(model, grads))
    }

    fn global_squared_norm(&self, local: f64, device: &B::Device) -> Result<f64, ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::global_squared_norm(s, local, device))
    }

    fn before_optimizer_step<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) {
        dispatch!(self, s => s.before_optimizer_step(model, grads))
    }

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
        dispatch!(self, s => s.after_optimizer_step(model, optimizer, step))
    }

    fn gradient_all_reduces(&self) -> u64 {
        dispatch!(self, s => ParallelStrategy::<B>::gradient_all_reduces(s))
    }

    fn parameter_syncs(&self) -> u64 {
        dispatch!(self, s => ParallelStrategy::<B>::parameter_syncs(s))
    }

    fn averages_gradients(&self) -> bool {
        dispatch!(self, s => ParallelStrategy::<B>::averages_gradients(s))
    }

    fn own_state(&self) -> Result<StrategyState, ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::own_state(s))
    }

    fn check_own_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::check_own_state(s, state))
    }

    fn load_own_state(&mut self, state: StrategyState) {
        dispatch!(self, s => ParallelStrategy::<B>::load_own_state(s, state))
    }

    fn finish<M: AutodiffModule<B>>(&mut self, model: M, steps: u64) -> Result<M, ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::finish(s, model, steps))
    }

    fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::full_model(s, model))
    }

    fn state_layout(&self) -> StateLayout {
        dispatch!(self, s => ParallelStrategy::<B>::state_layout(s))
    }

    fn loads_full_state(&self) -> bool {
        dispatch!(self, s => ParallelStrategy::<B>::loads_full_state(s))
    }

    fn merges_rank_states(&self) -> bool {
        dispatch!(self, s => ParallelStrategy::<B>::merges_rank_states(s))
    }

    fn saved_models_are_shards(&self) -> bool {
        dispatch!(self, s => ParallelStrategy::<B>::saved_models_are_shards(s))
    }

    fn join_saved_models<M: AutodiffModule<B>>(&self, saved: Vec<M>) -> Result<M, ParallelError> {
        dispatch!(self, s => s.join_saved_models(saved))
    }

    fn join_saved_optimizer_records(
        &self,
        records: &[(Vec<u8>, std::collections::HashMap<String, usize>)],
        ids: &[String],
    ) -> Result<Vec<u8>, ParallelError> {
        dispatch!(self, s => ParallelStrategy::<B>::join_saved_optimizer_records(s, records, ids))
    }

    fn gather_optimizer_record<M: AutodiffModule<B>>(
        &self,
        model: &M,
        record: Vec<u8>,
        device: &B::Device,
    ) -> Result<Vec<u8>, ParallelError> {
        dispatch!(self, s => s.gather_optimizer_record(model, record, device))
    }

    fn shard_optimizer_record<M: AutodiffModule<B>>(
        &self,
        full: &M,
        record: Vec<u8>,
    ) -> Result<Vec<u8>, ParallelError> {
        dispatch!(self, s => s.shard_optimizer_record(full, record))
    }

    fn shard_full_state<M: AutodiffModule<B>>(&self, full: M) -> Result<M, ParallelError> {
        dispatch!(self, s => s.shard_full_state(full))
    }

    fn after_load<M: AutodiffModule<B>>(&mut self, model: &M) -> Result<(), ParallelError> {
        dispatch!(self, s => s.after_load(model))
    }
}
