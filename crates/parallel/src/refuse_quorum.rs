//! DDP, ZeRO-1 and FSDP refuse a fault-tolerant quorum group: their replicas step together on
//! shared gradients or shards, so one lost replica loses state; they fail fast instead.

use crate::ParallelError;

/// Errors when `group` is a fault-tolerant one: `strategy` (DDP, ZeRO, FSDP) keeps state that
/// dies with a replica, so it fails fast on an ordinary group instead.
pub(crate) fn refuse_quorum<B, G>(group: &G, strategy: &'static str) -> Result<(), ParallelError>
where
    B: burn::tensor::backend::Backend,
    G: crate::ProcessGroup<B> + ?Sized,
{
    match group.quorum() {
        None => Ok(()),
        Some(_) => Err(ParallelError::InvalidConfig {
            field: "strategy",
            value: format!("{strategy} over a fault-tolerant quorum group"),
            expected: "Local SGD or DiLoCo on a quorum group (DDP, ZeRO-1 and FSDP replicas \
                       are not independent: run them on a LocalGroup or MpiGroup, where a lost \
                       rank fails the job)"
                .into(),
        }),
    }
}
