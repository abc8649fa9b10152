//! FSDP as a [`ParallelStrategy`]: shards at setup, gathers per forward pass, a global gradient norm
//! over the shards, and sharded or gathered training states.

use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Tensor};

use super::{Fsdp, StateDictType};
use crate::ddp::broadcast_from_rank0;
use crate::{
    ForwardView, OptimizerRecord, ParallelError, ParallelStrategy, ParamPositions, ProcessGroup,
    ReduceOp, StateLayout, StateSaving,
};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

impl<B, G> Fsdp<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    /// Each parameter's layout index by its serialized `ParamId` (how records name them).
    fn indices_by_id<M: Module<B>>(&self, model: &M) -> ParamPositions {
        self.param_indices(model)
            .into_iter()
            .map(|(id, index)| (id.serialize(), index))
            .collect()
    }

    /// Whether every rank passes `ok` (one small all-reduce).
    fn all_ok(&self, ok: bool, device: &B::Device) -> Result<bool, ParallelError> {
        let group = self.group();
        let vote = Tensor::<Inner<B>, 1>::from_floats([f32::from(u8::from(ok))], device);
        let votes = group.all_reduce(vote, ReduceOp::Sum)?.into_scalar();
        Ok(votes.elem::<f32>().round() as usize == group.world_size())
    }
}

impl<B, G> ParallelStrategy<B> for Fsdp<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    fn name(&self) -> &'static str {
        "fsdp"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        Some(Fsdp::group(self))
    }

    /// Rank 0's parameters on every rank, then this rank's shards.
    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        let model = broadcast_from_rank0(Fsdp::group(self), model)?;
        self.shard(model)
    }

    fn forward_view<M: Module<B>>(
        &self,
        model: &M,
        compute: Option<DType>,
    ) -> Result<Option<ForwardView<B, M>>, ParallelError> {
        match self.view_with_units(model, compute) {
            Ok((model, derived)) => Ok(Some(ForwardView { model, derived })),
            Err(e) => {
                // Returned here: not kept for the next backward's check.
                let _ = self.check();
                Err(e)
            }
        }
    }

    /// [`Fsdp::finish_backward`].
    fn after_backward<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        self.finish_backward(model, grads)
    }

    // `reduce_gradients`: nothing to do, each backward pass reduce-scattered to the shards.

    /// Each rank's gradients are a disjoint shard: the global squared norm is the sum of the
    /// ranks' (one small all-reduce).
    fn global_squared_norm(&self, local: f64, device: &B::Device) -> Result<f64, ParallelError> {
        let mine = Tensor::<Inner<B>, 1>::from_floats([local as f32], device);
        let total = Fsdp::group(self).all_reduce(mine, ReduceOp::Sum)?;
        Ok(total.into_scalar().elem::<f64>())
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
        self.after_step(&model)?;
        Ok(model)
    }

    fn averages_gradients(&self) -> bool {
        true
    }

    fn decides_on_device(&self) -> bool {
        true
    }

    /// The shards' measures summed by one all-reduce on the device (in f32, as
    /// [`global_squared_norm`](ParallelStrategy::global_squared_norm) sums them).
    fn sum_over_parts_on_device(
        &self,
        local: Tensor<Inner<B>, 1>,
    ) -> Result<Tensor<Inner<B>, 1>, ParallelError> {
        let dtype = local.dtype();
        let total = Fsdp::group(self).all_reduce(local.cast(DType::F32), ReduceOp::Sum)?;
        Ok(total.cast(dtype))
    }

    fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, ParallelError> {
        Fsdp::full_model(self, model)
    }
}

/// A sharded state (each rank its shards) or a gathered one (rank 0 writes the full state);
/// either loads at any world size.
impl<B, G> StateSaving<B> for Fsdp<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    fn state_layout(&self) -> StateLayout {
        match self.config().state_dict_type {
            StateDictType::Sharded => StateLayout::Sharded,
            StateDictType::Full => StateLayout::Gathered,
        }
    }

    /// The saved ranks' chunks are joined into full tensors (then sharded for this world size).
    fn join_saved_models<M, E>(
        &self,
        saved_ranks: usize,
        load: impl FnMut(usize) -> Result<M, E>,
    ) -> Result<M, E>
    where
        M: AutodiffModule<B>,
        E: From<ParallelError>,
    {
        let saved = (0..saved_ranks).map(load).collect::<Result<Vec<M>, E>>()?;
        Ok(self.join_saved_shards(saved)?)
    }

    fn join_saved_optimizer_records(
        &self,
        records: Vec<(OptimizerRecord, ParamPositions)>,
        ids: &[String],
    ) -> Result<OptimizerRecord, ParallelError> {
        self.join_saved_records(records, ids)
    }

    /// Every state tensor of an element-wise optimizer is shaped like its parameter's shard:
    /// each is gathered like the parameter (one all-gather each, in layout order, the same on
    /// every rank whatever their `ParamId`s). Errors on every rank, before any gather, if the
    /// record holds state for a parameter some rank's model lacks.
    fn gather_optimizer_record<M: AutodiffModule<B>>(
        &self,
        model: &M,
        record: OptimizerRecord,
        device: &B::Device,
    ) -> Result<OptimizerRecord, ParallelError> {
        let ids = self.indices_by_id(model);
        let checked = record.check_params(&ids);
        if !self.all_ok(checked.is_ok(), device)? {
            checked?;
            return Err(ParallelError::Record(
                "optimizer record: another rank's record does not match its model".into(),
            ));
        }
        record.map_tensors(&ids, |index, values, _| {
            self.gather_values(index, values, device)
        })
    }

    fn shard_optimizer_record<M: AutodiffModule<B>>(
        &self,
        full: &M,
        record: OptimizerRecord,
    ) -> Result<OptimizerRecord, ParallelError> {
        let ids = self.indices_by_id(full);
        record.map_tensors(&ids, |index, values, _| self.shard_values(index, values))
    }

    fn shard_full_state<M: AutodiffModule<B>>(&self, full: M) -> Result<M, ParallelError> {
        self.shard(full)
    }

    fn after_load<M: AutodiffModule<B>>(&mut self, model: &M) -> Result<(), ParallelError> {
        self.after_step(model)
    }
}
