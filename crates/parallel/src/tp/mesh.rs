//! [`TensorParallelMesh`]: training on a `dp x tp` mesh: each layer of the model's plan split
//! over the `tp` ranks of a row, DDP or FSDP across the `dp` rows (the data sharded over them
//! only).

use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::{Inner, TensorParallel, TensorParallelPlan};
use crate::{
    Ddp, ForwardView, Fsdp, FsdpConfig, OptimizerRecord, ParallelError, ParallelStrategy,
    ProcessGroup, ReduceOp, SharedGroup, StateDictType, StateLayout, StateSaving, SubGroup,
};
use afterburner_collectives::mesh_of;

/// The strategy across a mesh's rows (over this rank's column).
enum DataParallel<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    /// One row: nothing to exchange.
    One,
    /// A whole TP part per row, gradients all-reduced over the column.
    Ddp(Ddp<B, SubGroup<Inner<B>, G>>),
    /// The TP parts sharded over the column.
    Fsdp(Fsdp<B, SubGroup<Inner<B>, G>>),
}

/// `$call` on the data-parallel strategy `$s` (as `&` or `&mut`), `$one` with a single row.
macro_rules! across_rows {
    ($data:expr, $s:ident => $call:expr, $one:expr) => {
        match $data {
            DataParallel::Ddp($s) => $call,
            DataParallel::Fsdp($s) => $call,
            DataParallel::One => $one,
        }
    };
}

/// The strategy of a run with `tp_size > 1` (see the module docs). Rank `r` of the world sits
/// at row `r / tp` (its data-parallel rank), column `r % tp` (its tensor-parallel rank).
/// A model must be split by its plan ([`parallelize`](ParallelStrategy::parallelize)) before
/// [`setup`](ParallelStrategy::setup). Its state is saved gathered (the whole model, by world
/// rank 0), so it loads at any tp or dp size and on one device (or, under FSDP's
/// `state_dict_type = "sharded"`, each rank's own part).
pub struct TensorParallelMesh<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    world: SharedGroup<G>,
    tp: TensorParallel<SubGroup<Inner<B>, G>>,
    /// DDP or FSDP over this rank's column.
    data: DataParallel<B, G>,
    dp_rank: usize,
    dp_size: usize,
    /// Each rank saves its own part (FSDP's `state_dict_type = "sharded"`), instead of the
    /// gathered whole.
    sharded_state: bool,
}

impl<B, G> TensorParallelMesh<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    /// `group`'s ranks as a mesh of `tp` columns (the world size must be a multiple), DDP
    /// across the rows, or FSDP with `fsdp`.
    pub fn new(
        group: G,
        tp: usize,
        device: burn::tensor::Device<Inner<B>>,
        fsdp: Option<FsdpConfig>,
    ) -> Result<Self, ParallelError> {
        let world = SharedGroup::new(group);
        let (dp_group, tp_group) = mesh_of(world.clone(), tp, device)?;
        let (dp_rank, dp_size) = (dp_group.rank(), dp_group.world_size());
        let sharded_state = fsdp
            .as_ref()
            .is_some_and(|c| c.state_dict_type == StateDictType::Sharded);
        let data = match (dp_size, fsdp) {
            (1, _) => DataParallel::One,
            (_, None) => DataParallel::Ddp(Ddp::new(dp_group)),
            (_, Some(config)) => DataParallel::Fsdp(Fsdp::new(SharedGroup::new(dp_group), config)?),
        };
        Ok(Self {
            world,
            tp: TensorParallel::new(tp_group),
            data,
            dp_rank,
            dp_size,
            sharded_state,
        })
    }

    /// The sum over the whole mesh of this rank's `parts` (squared norms): over the row, in
    /// one all-reduce, then over the rows as the data-parallel strategy sums.
    fn over_the_mesh(&self, parts: [f64; 2], device: &B::Device) -> Result<f64, ParallelError> {
        let parts = Tensor::<Inner<B>, 1>::from_floats(parts.map(|p| p as f32), device);
        let sums: Vec<f32> = self
            .tp
            .group_all_reduce(parts, ReduceOp::Sum)?
            .into_data()
            .to_vec()
            .map_err(|e| ParallelError::Record(format!("reading the norm: {e:?}")))?;
        let row = sums.iter().map(|s| f64::from(*s)).sum();
        across_rows!(&self.data, s => ParallelStrategy::<B>::global_squared_norm(s, row, device), Ok(row))
    }

    /// This rank's tensor-parallel handle (its row's group).
    pub fn tensor_parallel(&self) -> &TensorParallel<SubGroup<Inner<B>, G>> {
        &self.tp
    }

    /// This mesh with the DDP across its rows in gradient buckets of at most `cap_mb` MiB
    /// ([`Ddp::with_bucket_cap_mb`]; FSDP rows and a single row have no buckets).
    pub fn with_bucket_cap_mb(mut self, cap_mb: f64) -> Result<Self, ParallelError> {
        self.data = match std::mem::replace(&mut self.data, DataParallel::One) {
            DataParallel::Ddp(ddp) => DataParallel::Ddp(ddp.with_bucket_cap_mb(cap_mb)?),
            other => other,
        };
        Ok(self)
    }
}

impl<B, G> ParallelStrategy<B> for TensorParallelMesh<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    fn name(&self) -> &'static str {
        match self.data {
            DataParallel::Fsdp(_) => "fsdp x tp",
            _ => "ddp x tp",
        }
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
        across_rows!(&self.data, s => ParallelStrategy::<B>::setup(s, model), Ok(model))
    }

    /// Every rank skips if any does: the ranks of a group hold different parts of the
    /// gradients, so one may overflow where another does not.
    fn agree_on_skip(&self, skip: bool, device: &B::Device) -> Result<bool, ParallelError> {
        let world: &dyn ProcessGroup<Inner<B>> = &self.world;
        Ok(crate::ranks_voting_yes(Some(world), skip, device)? > 0)
    }

    fn forward_view<M: burn::module::Module<B>>(
        &self,
        model: &M,
        compute: Option<burn::tensor::DType>,
    ) -> Result<Option<ForwardView<B, M>>, ParallelError> {
        across_rows!(&self.data, s => s.forward_view(model, compute), Ok(None))
    }

    fn after_backward<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        self.tp.check()?;
        // No rank of a row starts its next backward (whose all-reduces hold its autodiff
        // graph's lock) before every rank of it has left this one and Burn's graph cleanup
        // after it: ranks that are threads of one process deadlocked there under FSDP
        // (`Fsdp::finish_backward`).
        if let Some(device) = model.devices().first() {
            self.tp.barrier::<Inner<B>>(device)?;
        }
        across_rows!(&self.data, s => ParallelStrategy::<B>::after_backward(s, model, grads), Ok(()))
    }

    fn reduces_in_backward(&self) -> bool {
        across_rows!(&self.data, s => ParallelStrategy::<B>::reduces_in_backward(s), false)
    }

    fn reduce_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        across_rows!(&mut self.data, s => s.reduce_gradients(model, grads), Ok(()))
    }

    fn global_squared_norm(&self, local: f64, device: &B::Device) -> Result<f64, ParallelError> {
        self.over_the_mesh([local, 0.0], device)
    }

    /// The split parameters' squares summed over the row; the replicated ones, alike on
    /// every rank of it, counted once (rank 0's), so every rank gets the same norm (and clips
    /// its copies of the replicated parameters alike); then over the rows as the
    /// data-parallel strategy sums (FSDP's shards).
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
        self.over_the_mesh([split, replicated], device)
    }

    fn before_optimizer_step<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) {
        across_rows!(&mut self.data, s => s.before_optimizer_step(model, grads), ())
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
        across_rows!(&mut self.data, s => s.after_optimizer_step(model, optimizer, step), Ok(model))
    }

    fn gradient_all_reduces(&self) -> u64 {
        across_rows!(&self.data, s => ParallelStrategy::<B>::gradient_all_reduces(s), 0)
    }

    fn averages_gradients(&self) -> bool {
        true
    }

    /// Gathered over the column first (FSDP's shards into this row's split parts), then
    /// over the row.
    fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, ParallelError> {
        let parts = across_rows!(&self.data, s => ParallelStrategy::<B>::full_model(s, model)?, model.clone());
        self.tp.full_model(&parts)
    }
}

/// Saved gathered (the whole model and optimizer state, written by world rank 0; it loads at
/// any size), or under FSDP's `state_dict_type = "sharded"` each rank's own part (its own
/// directory; it loads at the same sizes).
impl<B, G> StateSaving<B> for TensorParallelMesh<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    fn state_layout(&self) -> StateLayout {
        match self.sharded_state {
            true => StateLayout::PerRank,
            false => StateLayout::Gathered,
        }
    }

    fn gather_optimizer_record<M: AutodiffModule<B>>(
        &self,
        model: &M,
        record: OptimizerRecord,
        device: &B::Device,
    ) -> Result<OptimizerRecord, ParallelError> {
        let parts = across_rows!(
            &self.data,
            s => s.gather_optimizer_record(model, record, device)?,
            record
        );
        self.tp.gather_optimizer_record(model, parts, device)
    }

    fn shard_optimizer_record<M: AutodiffModule<B>>(
        &self,
        full: &M,
        record: OptimizerRecord,
    ) -> Result<OptimizerRecord, ParallelError> {
        let parts = self.tp.shard_optimizer_record(full, record)?;
        across_rows!(&self.data, s => s.shard_optimizer_record(full, parts), Ok(parts))
    }

    fn shard_full_state<M: AutodiffModule<B>>(&self, full: M) -> Result<M, ParallelError> {
        let parts = self.tp.shard_model(full)?;
        across_rows!(&self.data, s => s.shard_full_state(parts), Ok(parts))
    }

    fn after_load<M: AutodiffModule<B>>(&mut self, model: &M) -> Result<(), ParallelError> {
        across_rows!(&mut self.data, s => s.after_load(model), Ok(()))
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
