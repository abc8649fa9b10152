//! [`TensorParallelMesh`]: training on a `dp x tp` mesh: each layer of the model's plan split
//! over the `tp` ranks of a row, DDP across the `dp` rows (the data sharded over them only).

use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::{Inner, TensorParallel, TensorParallelPlan};
use crate::mesh::mesh_of;
use crate::{
    Ddp, OptimizerRecord, ParallelError, ParallelStrategy, ProcessGroup, ReduceOp, SharedGroup,
    StateLayout, StateSaving, SubGroup,
};

/// The strategy of a run with `tp_size > 1` (see the module docs). Rank `r` of the world sits
/// at row `r / tp` (its data-parallel rank), column `r % tp` (its tensor-parallel rank).
/// A model must be split by its plan ([`parallelize`](ParallelStrategy::parallelize)) before
/// [`setup`](ParallelStrategy::setup). Its state is saved gathered (the whole model, by world
/// rank 0), so it loads at any tp or dp size and on one device.
pub struct TensorParallelMesh<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    world: SharedGroup<G>,
    tp: TensorParallel<SubGroup<Inner<B>, G>>,
    /// DDP over this rank's column; `None` when there is one row.
    data: Option<Ddp<B, SubGroup<Inner<B>, G>>>,
    dp_rank: usize,
    dp_size: usize,
}

impl<B, G> TensorParallelMesh<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    /// `group`'s ranks as a mesh of `tp` columns (the world size must be a multiple).
    pub fn new(
        group: G,
        tp: usize,
        device: burn::tensor::Device<Inner<B>>,
    ) -> Result<Self, ParallelError> {
        let world = SharedGroup::new(group);
        let (dp_group, tp_group) = mesh_of(world.clone(), tp, device)?;
        let (dp_rank, dp_size) = (dp_group.rank(), dp_group.world_size());
        Ok(Self {
            world,
            tp: TensorParallel::new(tp_group),
            data: (dp_size > 1).then(|| Ddp::new(dp_group)),
            dp_rank,
            dp_size,
        })
    }

    /// This rank's tensor-parallel handle (its row's group).
    pub fn tensor_parallel(&self) -> &TensorParallel<SubGroup<Inner<B>, G>> {
        &self.tp
    }
}

impl<B, G> ParallelStrategy<B> for TensorParallelMesh<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    fn name(&self) -> &'static str {
        "ddp x tp"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        Some(&self.world)
    }

    fn data_parallel_rank(&self) -> usize {
        self.dp_rank
    }

    fn data_parallel_size(&self) -> usize {
        self.dp_size
    }

    fn parallelize<M: TensorParallelPlan<B>>(&self, model: M) -> Result<M, ParallelError> {
        if self.tp.has_split() {
            return Err(ParallelError::InvalidConfig {
                field: "model",
                value: "a second model".into(),
                expected: "one model split per Accelerator (its plan's layers are the ones \
                           saved and counted)"
                    .into(),
            });
        }
        // Fresh autodiff leaves for this rank (ranks on threads sharing one graph's lock
        // across a collective would deadlock).
        let device = model.devices().into_iter().next().unwrap_or_default();
        let model = model.fork(&device).parallelize(&self.tp)?;
        if !self.tp.has_split() {
            return Err(no_split_layer());
        }
        Ok(model)
    }

    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        if !self.tp.has_split() {
            return Err(no_split_layer());
        }
        // Remember the split parameters by position: a loaded state brings other ids.
        self.tp.splits_of(&model);
        match &self.data {
            Some(ddp) => ParallelStrategy::<B>::setup(ddp, model),
            None => Ok(model),
        }
    }

    fn after_backward(&self) -> Result<(), ParallelError> {
        self.tp.check()
    }

    fn reduce_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        match &mut self.data {
            Some(ddp) => ddp.reduce_gradients(model, grads),
            None => Ok(()),
        }
    }

    /// The split parameters' squares summed over the row; the replicated ones, alike on
    /// every rank of it, counted once (rank 0's), so every rank gets the same norm (and clips
    /// its copies of the replicated parameters alike).
    fn model_squared_norm<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &GradientsParams,
        local: f64,
        device: &B::Device,
    ) -> Result<f64, ParallelError> {
        let split = self.tp.split_squared_norm(model, grads);
        let replicated = match self.tp.rank() {
            0 => local - split,
            _ => 0.0,
        };
        let parts = Tensor::<Inner<B>, 1>::from_floats([split as f32, replicated as f32], device);
        let sums: Vec<f32> = self
            .tp
            .group_all_reduce(parts, ReduceOp::Sum)?
            .into_data()
            .to_vec()
            .map_err(|e| ParallelError::Record(format!("reading the norm: {e:?}")))?;
        let data_parallel = f64::from(sums[0]) + f64::from(sums[1]);
        match &self.data {
            Some(ddp) => ParallelStrategy::<B>::global_squared_norm(ddp, data_parallel, device),
            None => Ok(data_parallel),
        }
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
        match &mut self.data {
            Some(ddp) => ddp.after_optimizer_step(model, optimizer, step),
            None => Ok(model),
        }
    }

    fn gradient_all_reduces(&self) -> u64 {
        self.data
            .as_ref()
            .map_or(0, |ddp| ParallelStrategy::<B>::gradient_all_reduces(ddp))
    }

    fn averages_gradients(&self) -> bool {
        true
    }

    fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, ParallelError> {
        self.tp.full_model(model)
    }
}

/// Saved gathered: the whole model and optimizer state, written by world rank 0.
impl<B, G> StateSaving<B> for TensorParallelMesh<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    fn state_layout(&self) -> StateLayout {
        StateLayout::Gathered
    }

    fn gather_optimizer_record<M: AutodiffModule<B>>(
        &self,
        model: &M,
        record: OptimizerRecord,
        device: &B::Device,
    ) -> Result<OptimizerRecord, ParallelError> {
        self.tp.gather_optimizer_record(model, record, device)
    }

    fn shard_optimizer_record<M: AutodiffModule<B>>(
        &self,
        full: &M,
        record: OptimizerRecord,
    ) -> Result<OptimizerRecord, ParallelError> {
        self.tp.shard_optimizer_record(full, record)
    }

    fn shard_full_state<M: AutodiffModule<B>>(&self, full: M) -> Result<M, ParallelError> {
        self.tp.shard_model(full)
    }
}

/// A model given to a tensor-parallel run without its plan applied.
fn no_split_layer() -> ParallelError {
    ParallelError::InvalidConfig {
        field: "tp_size",
        value: "> 1".into(),
        expected: "a model split by its tensor-parallel plan (implement TensorParallelPlan and \
                   call Accelerator::parallelize before setup); this model has no split layer"
            .into(),
    }
}
