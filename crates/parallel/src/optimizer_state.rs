//! An optimizer's state averaged across ranks, whatever the optimizer: its record encoded as
//! Burn's named MessagePack at full precision, every per-parameter state tensor replaced by
//! its mean over the ranks ([`mean_param_states`](crate::mean_param_states)), and loaded back.
//! Local SGD's `average_optimizer_state` uses it.

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;

use crate::{ParallelError, ProcessGroup, mean_param_states, param_ids};

/// How optimizer records are encoded on their way through the collectives.
type Codec = NamedMpkBytesRecorder<FullPrecisionSettings>;

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
    let bytes = Recorder::<B>::record(&Codec::default(), optimizer.to_record(), ())
        .map_err(|e| ParallelError::Record(format!("encoding the optimizer state: {e}")))?;
    let index = param_ids(model)
        .into_iter()
        .enumerate()
        .map(|(position, id)| (id, position))
        .collect();
    let mean = mean_param_states(group, &bytes, &index, device)?;
    let record = Recorder::<B>::load(&Codec::default(), mean, device)
        .map_err(|e| ParallelError::Record(format!("decoding the averaged state: {e}")))?;
    *optimizer = optimizer.clone().load_record(record);
    Ok(())
}
