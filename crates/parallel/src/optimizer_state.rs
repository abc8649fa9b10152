//! An optimizer's state averaged across ranks, whatever the optimizer: its record (an
//! [`OptimizerRecord`](crate::OptimizerRecord)) with every per-parameter state tensor replaced by
//! its mean over the ranks ([`mean_param_states`](crate::mean_param_states)), and loaded back.
//! Local SGD's `average_optimizer_state` uses it.

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;

use crate::{OptimizerRecord, ParallelError, ProcessGroup, mean_param_states, param_positions};

/// Replaces `optimizer`'s state by its mean over the ranks of `group` (one all-reduce of every
/// state tensor, plus two small ones checking that every rank holds state for the same
/// parameters). Parameters are matched by their position in `model`, so each rank's model
/// must have the same structure. Every rank calls it, at the same point.
pub fn average_optimizer_state<B, M, O, G>(
    group: &G,
    model: &M,
    optimizer: &mut O,
    device: &B::Device,
) -> Result<(), ParallelError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    G: ProcessGroup<B::InnerBackend> + ?Sized,
{
    let record = OptimizerRecord::of::<B, M, O>(optimizer)?;
    let mean = mean_param_states(group, record, &param_positions(model), device)?;
    *optimizer = mean.load_into::<B, M, O>(optimizer.clone(), device)?;
    Ok(())
}
