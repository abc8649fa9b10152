//! Resuming a sharded FSDP state at another world size: the saved ranks' chunks of every
//! parameter (and of every element-wise optimizer state tensor) joined back into full tensors,
//! which the load then shards for the new world size.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use super::Fsdp;
use crate::{OptimizerRecord, ParallelError, ParamPositions, ProcessGroup, join_param_shards};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

impl<B, G> Fsdp<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    /// The full model from the sharded models a state saved by `saved.len()` ranks holds
    /// (`saved[k]`, rank k's, as decoded: its parameters are chunks `[1, .., chunk]`): per
    /// parameter, the chunks joined in rank order, cut to the parameter's size and shaped as
    /// this run's layout says; rank 0's parameter ids. Local work.
    pub(crate) fn join_saved_shards<M: AutodiffModule<B>>(
        &self,
        saved: Vec<M>,
    ) -> Result<M, ParallelError> {
        let layout = self.layout_or_err()?;
        let world = saved.len();
        let per_rank: Vec<Vec<Vec<f32>>> = saved.iter().map(param_values).collect();
        if let Some((rank, params)) = per_rank
            .iter()
            .enumerate()
            .find(|(_, params)| params.len() != layout.slots.len())
        {
            return Err(ParallelError::Record(format!(
                "saved rank {rank} holds {} parameters, the model has {}",
                params.len(),
                layout.slots.len()
            )));
        }
        let mut full = Vec::with_capacity(layout.slots.len());
        for (position, slot) in layout.slots.iter().enumerate() {
            // Every saved rank's chunk of this parameter is exactly what FSDP at that world
            // size keeps: a model of other shapes is refused, never cut to fit.
            let chunk = slot.numel.div_ceil(world);
            let mut values = Vec::with_capacity(chunk * world);
            for (rank, params) in per_rank.iter().enumerate() {
                if params[position].len() != chunk {
                    return Err(ParallelError::Record(format!(
                        "parameter {position} (shape {:?}): saved rank {rank} holds {} \
                         values, a shard of it at {world} ranks holds {chunk}",
                        slot.shape,
                        params[position].len()
                    )));
                }
                values.extend_from_slice(&params[position]);
            }
            values.truncate(slot.numel);
            full.push((values, slot.shape.clone()));
        }
        let first = saved
            .into_iter()
            .next()
            .ok_or_else(|| ParallelError::Record("no saved rank to load".into()))?;
        let mut mapper = Joined {
            full: full.into_iter(),
        };
        Ok(first.map(&mut mapper))
    }

    /// One full optimizer record from the records of a state saved by `records.len()` ranks
    /// (each with its model's id-to-position map), keyed by `ids`. Local work.
    pub(crate) fn join_saved_records(
        &self,
        records: Vec<(OptimizerRecord, ParamPositions)>,
        ids: &[String],
    ) -> Result<OptimizerRecord, ParallelError> {
        let layout = self.layout_or_err()?;
        let numels: Vec<usize> = layout.slots.iter().map(|s| s.numel).collect();
        let shapes: Vec<Vec<usize>> = layout.slots.iter().map(|s| s.shape.clone()).collect();
        join_param_shards(records, ids, &numels, &shapes)
    }
}

/// Every float parameter's values (f32), in visit order.
fn param_values<B: AutodiffBackend, M: Module<B>>(model: &M) -> Vec<Vec<f32>> {
    struct Values(Vec<Vec<f32>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().inner().into_data().convert::<f32>();
            self.0.push(data.into_vec::<f32>().unwrap_or_default());
        }
    }
    let mut values = Values(Vec::new());
    model.visit(&mut values);
    values.0
}

/// Replaces each float parameter by the next full (values, shape), in its own dtype.
struct Joined {
    full: std::vec::IntoIter<(Vec<f32>, Vec<usize>)>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Joined {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, value, mapper) = param.consume();
        let Some((values, shape)) = self.full.next() else {
            return Param::from_mapped_value(id, value, mapper);
        };
        let (dtype, device) = (value.dtype(), value.device());
        let require_grad = value.is_require_grad();
        let inner =
            Tensor::<Inner<B>, D>::from_data(TensorData::new(values, shape), &device).cast(dtype);
        let leaf = Tensor::from_inner(inner).set_require_grad(require_grad);
        Param::from_mapped_value(id, leaf, mapper)
    }
}
