//! [`OptimizerSharding`]: ZeRO stage 1. Each rank keeps optimizer state only for the
//! parameters it owns; after the step the owners share the new values.

use std::marker::PhantomData;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::ddp::{Flatten, Unflatten};
use crate::{
    Ddp, ForwardView, OptimizerRecord, ParallelError, ParallelStrategy, ProcessGroup, ReduceOp,
    StateLayout, StateSaving, param_positions,
};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Which rank owns (steps) each float parameter, in the model's visit order: parameters go,
/// largest first, to the rank owning the fewest values so far, so each rank holds optimizer
/// state for about `1 / world_size` of the values.
///
/// Use with [`Ddp`](crate::Ddp): after the gradient all-reduce (and any clipping),
/// [`keep_owned`](Self::keep_owned) removes the other ranks' gradients so the optimizer steps
/// (and creates state for) this rank's parameters only; then
/// [`share_params`](Self::share_params) gives every rank the owners' new values in one
/// all-reduce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerSharding {
    owners: Vec<usize>,
    sizes: Vec<usize>,
    rank: usize,
}

impl OptimizerSharding {
    /// Assigns the parameters of `model` to `world_size` ranks (the same on every rank).
    pub fn new<B: AutodiffBackend, M: AutodiffModule<B>>(
        model: &M,
        rank: usize,
        world_size: usize,
    ) -> Self {
        let mut sizes = Sizes(Vec::new());
        model.visit(&mut sizes);
        let sizes = sizes.0;
        let mut by_size: Vec<usize> = (0..sizes.len()).collect();
        by_size.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
        let mut load = vec![0usize; world_size.max(1)];
        let mut owners = vec![0; sizes.len()];
        for i in by_size {
            let (least, _) = load
                .iter()
                .enumerate()
                .min_by_key(|&(r, l)| (*l, r))
                .unwrap_or((0, &0));
            owners[i] = least;
            load[least] += sizes[i];
        }
        Self {
            owners,
            sizes,
            rank,
        }
    }

    /// Values of the parameters this rank owns.
    pub fn owned_values(&self) -> usize {
        self.owners
            .iter()
            .zip(&self.sizes)
            .filter(|&(&o, _)| o == self.rank)
            .map(|(_, s)| s)
            .sum()
    }

    /// Values of all parameters.
    pub fn total_values(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Removes from `grads` the gradients of parameters other ranks own.
    pub fn keep_owned<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) {
        model.visit(&mut DropOthers::<B> {
            grads,
            sharding: self,
            index: 0,
            backend: PhantomData,
        });
    }

    /// Every rank gets each parameter's value from its owner (one all-reduce).
    pub fn share_params<B, M, G>(&self, group: &G, model: M) -> Result<M, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        G: ProcessGroup<Inner<B>>,
    {
        let mut flat = Flatten::<B> {
            keep: Some(self.owners.iter().map(|&o| o == self.rank).collect()),
            ..Default::default()
        };
        model.visit(&mut flat);
        let Some(mine) = flat.concat() else {
            return Ok(model);
        };
        // Every value is nonzero on its owner only: the sum is the owner's value, exactly.
        let values = group.all_reduce(mine, ReduceOp::Sum)?;
        Ok(model.map(&mut Unflatten::<B> {
            values,
            offset: 0,
            backend: PhantomData,
        }))
    }
}

struct Sizes(Vec<usize>);

impl<B: AutodiffBackend> ModuleVisitor<B> for Sizes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.val().shape().num_elements());
    }
}

struct DropOthers<'a, B> {
    grads: &'a mut GradientsParams,
    sharding: &'a OptimizerSharding,
    index: usize,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for DropOthers<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.sharding.owners.get(self.index) != Some(&self.sharding.rank) {
            let _ = self.grads.remove::<Inner<B>, D>(param.id);
        }
        self.index += 1;
    }
}

/// ZeRO stage 1 as a [`ParallelStrategy`]: [`Ddp`] (rank 0's parameters at setup, one gradient
/// all-reduce per optimizer step) where each rank steps, and keeps optimizer state for, only
/// the parameters it owns ([`OptimizerSharding`], set at the first step); the owners share the
/// new values after each step. Each rank's optimizer state differs, so each saves its own part.
pub struct Zero1<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    ddp: Ddp<B, G>,
    sharding: Option<OptimizerSharding>,
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> Zero1<B, G> {
    /// ZeRO-1 over `group`.
    pub fn new(group: G) -> Self {
        Self::from_ddp(Ddp::new(group))
    }

    /// ZeRO-1 over `ddp`, which reduces the gradients as it is set up (its buckets; during
    /// backward under [`Ddp::with_overlap`], the forward pass on this strategy's view).
    pub fn from_ddp(ddp: Ddp<B, G>) -> Self {
        Self {
            ddp,
            sharding: None,
        }
    }

    /// The data parallel part (group, all-reduce count).
    pub fn ddp(&self) -> &Ddp<B, G> {
        &self.ddp
    }

    /// Which rank owns each parameter (after the first optimizer step).
    pub fn sharding(&self) -> Option<&OptimizerSharding> {
        self.sharding.as_ref()
    }
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> ParallelStrategy<B> for Zero1<B, G> {
    fn name(&self) -> &'static str {
        "zero-1"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        Some(self.ddp.group())
    }

    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        self.ddp.setup(model)
    }

    /// DDP's (its hooked view under overlap).
    fn forward_view<M: Module<B>>(
        &self,
        model: &M,
        compute: Option<DType>,
    ) -> Result<Option<ForwardView<B, M>>, ParallelError> {
        self.ddp.forward_view(model, compute)
    }

    /// DDP's (the view's gradients added to the parameters').
    fn after_backward<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        self.ddp.after_backward(model, grads)
    }

    fn reduces_in_backward(&self) -> bool {
        self.ddp.reduces_in_backward()
    }

    fn reduce_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        self.ddp.sync_gradients(model, grads)
    }

    fn before_optimizer_step<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) {
        let group = self.ddp.group();
        let (rank, world) = (group.rank(), group.world_size());
        self.sharding
            .get_or_insert_with(|| OptimizerSharding::new(model, rank, world))
            .keep_owned(model, grads);
    }

    fn after_optimizer_step<M, O>(
        &mut self,
        model: M,
        _optimizer: &mut O,
        _step: u64,
    ) -> Result<M, ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        match &self.sharding {
            Some(sharding) => sharding.share_params(self.ddp.group(), model),
            None => Ok(model),
        }
    }

    fn gradient_all_reduces(&self) -> u64 {
        self.ddp.all_reduce_count()
    }

    fn averages_gradients(&self) -> bool {
        true
    }

    /// Every rank holds the same all-reduced gradients: the same decision from its own.
    fn decides_on_device(&self) -> bool {
        true
    }
}

/// Each rank saves its own part (the optimizer states of the parameters it owns); a full state
/// (saved under DDP, or joined from ZeRO-1 parts of another world size) loads too: every rank
/// keeps the optimizer state of the parameters it owns.
impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> StateSaving<B> for Zero1<B, G> {
    fn state_layout(&self) -> StateLayout {
        StateLayout::Sharded
    }

    fn shard_optimizer_record<M: AutodiffModule<B>>(
        &self,
        full: &M,
        record: OptimizerRecord,
    ) -> Result<OptimizerRecord, ParallelError> {
        let group = self.ddp.group();
        let sharding = OptimizerSharding::new(full, group.rank(), group.world_size());
        record.retain(&param_positions(full), |position| {
            sharding.owners.get(position) == Some(&sharding.rank)
        })
    }
}
