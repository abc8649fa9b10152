//! [`StateSaving`]: what a strategy saves and loads, beside the phases of a step
//! ([`ParallelStrategy`](crate::ParallelStrategy), which requires it). A strategy that keeps
//! the single-device state (every rank the same model and optimizer, nothing of its own) takes
//! every default: `impl<B: AutodiffBackend> StateSaving<B> for Mine {}`.
//!
//! Its [`StateLayout`] says which ranks write and what loads; a sharded layout converts its
//! parts to and from the full state with typed values: the model itself and the optimizer's
//! [`OptimizerRecord`], never the bytes of a file format.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use crate::{OptimizerRecord, ParallelError, ParamPositions};

/// Which ranks write a training state, what each holds, and what else loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateLayout {
    /// Every rank holds the same state: rank 0 writes one directory, every rank reads it.
    Replicated,
    /// Every rank holds its own part: each writes and reads its own directory, and the state
    /// loads at the same world size only.
    PerRank,
    /// Every rank holds shards of one full state and writes its own directory (ZeRO-1, FSDP's
    /// sharded state). A full state loads too ([`StateSaving::shard_full_state`],
    /// [`StateSaving::shard_optimizer_record`]), and so does one saved at another world size:
    /// the saved ranks' parts are joined into a full state
    /// ([`StateSaving::join_saved_models`], [`StateSaving::join_saved_optimizer_records`]),
    /// then sharded for this one.
    Sharded,
    /// As [`Sharded`](Self::Sharded), but saved gathered: the ranks' shards become one full
    /// state that rank 0 writes as an ordinary directory
    /// ([`ParallelStrategy::full_model`](crate::ParallelStrategy::full_model),
    /// [`StateSaving::gather_optimizer_record`]); it loads at any world size, and without the
    /// strategy.
    Gathered,
}

impl StateLayout {
    /// Whether a full (ordinary) state, or a sharded one of another world size, loads by
    /// sharding it for this strategy.
    pub fn reshards(self) -> bool {
        matches!(self, Self::Sharded | Self::Gathered)
    }
}

/// What a strategy saves and loads (see the module docs). Every method has the single-device
/// behaviour as its default.
pub trait StateSaving<B: AutodiffBackend> {
    /// Which rank writes what when the training state is saved.
    fn state_layout(&self) -> StateLayout {
        StateLayout::Replicated
    }

    /// Under a resharding load of a state saved by `saved_ranks` ranks: the full model, from
    /// the saved ranks' models as `load(k)` decodes them (rank k's, with the shapes it saved).
    /// Local work. Default: rank 0's (every rank held the full model, as under ZeRO-1).
    fn join_saved_models<M, E>(
        &self,
        saved_ranks: usize,
        mut load: impl FnMut(usize) -> Result<M, E>,
    ) -> Result<M, E>
    where
        M: AutodiffModule<B>,
        E: From<ParallelError>,
    {
        match saved_ranks {
            0 => Err(ParallelError::Record("no saved rank to load".into()).into()),
            _ => load(0),
        }
    }

    /// Under a resharding load: one full optimizer record from the saved ranks' records (each
    /// with the map from its model's parameter ids to positions), keyed by `ids`. Local work.
    /// Default: [`merge_param_states`](crate::merge_param_states) (each parameter's state
    /// held by one rank, as under ZeRO-1).
    fn join_saved_optimizer_records(
        &self,
        records: Vec<(OptimizerRecord, ParamPositions)>,
        ids: &[String],
    ) -> Result<OptimizerRecord, ParallelError> {
        crate::merge_param_states(records, ids)
    }

    /// Under [`StateLayout::Gathered`]: the optimizer record with every per-parameter tensor
    /// gathered to its full shape. Every rank calls it, in the same order. `model` is this
    /// rank's model.
    fn gather_optimizer_record<M: AutodiffModule<B>>(
        &self,
        model: &M,
        record: OptimizerRecord,
        device: &B::Device,
    ) -> Result<OptimizerRecord, ParallelError> {
        let _ = (model, device);
        Ok(record)
    }

    /// The inverse of [`gather_optimizer_record`](Self::gather_optimizer_record), for a
    /// state loaded into `full` (the full model holding the record's parameter ids).
    fn shard_optimizer_record<M: AutodiffModule<B>>(
        &self,
        full: &M,
        record: OptimizerRecord,
    ) -> Result<OptimizerRecord, ParallelError> {
        let _ = full;
        Ok(record)
    }

    /// A full model (every rank the same, e.g. just loaded) in this strategy's form, without
    /// any broadcast.
    fn shard_full_state<M: AutodiffModule<B>>(&self, full: M) -> Result<M, ParallelError> {
        Ok(full)
    }

    /// The strategy's own training state, saved with the model (e.g. DiLoCo's global
    /// parameters and outer momentum); empty when it keeps none.
    fn own_state(&self) -> Result<StrategyState, ParallelError> {
        Ok(StrategyState::default())
    }

    /// Errors unless `state` (from [`own_state`](Self::own_state)) fits this strategy and
    /// model; changes nothing. Called on every rank before anything of a load is applied.
    fn check_own_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
        match state.tensors.is_empty() {
            true => Ok(()),
            false => Err(ParallelError::Record(format!(
                "the state holds {} strategy tensors; this strategy keeps none",
                state.tensors.len(),
            ))),
        }
    }

    /// Restores a state [`check_own_state`](Self::check_own_state) accepted.
    fn load_own_state(&mut self, state: StrategyState) {
        let _ = state;
    }

    /// After a state was loaded into `model`: refresh what the strategy derives from the
    /// parameters.
    fn after_load<M: AutodiffModule<B>>(&mut self, model: &M) -> Result<(), ParallelError> {
        let _ = model;
        Ok(())
    }
}

/// A strategy's own training state: named f32 tensors (flattened) and counters.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StrategyState {
    /// Named tensors, e.g. `("global", values)`.
    pub tensors: Vec<(String, Vec<f32>)>,
    /// Named counters.
    pub counters: Vec<(String, u64)>,
}

impl StrategyState {
    /// Whether there is nothing to save.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty() && self.counters.is_empty()
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&[f32]> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}
