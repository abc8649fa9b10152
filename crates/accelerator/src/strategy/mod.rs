//! How training is spread over devices, as the facade knows it: [`StrategyConfig`] (the
//! config's value, a name and the chosen strategy's options), [`AnyStrategy`] (the strategy
//! it builds, forwarding every phase of [`ParallelStrategy`]), and strategies of the user's
//! chosen by name ([`NamedStrategy`], [`register_strategy`]). The built-in strategies are
//! listed once, in built_in.rs.

#[macro_use]
mod macros;
#[macro_use]
mod forward;
mod built_in;
mod config;
mod named;

use afterburner_localsgd::{DiLoCo, LocalSgd};
use afterburner_parallel::tp::TensorParallelMesh;
use afterburner_parallel::{Fsdp, OptimizerSharding, ShardingStrategy, SharedGroup, SingleDevice};
use burn::tensor::backend::AutodiffBackend;

use crate::group::Group;
use crate::{AccelerateError, AcceleratorConfig};

pub(crate) use built_in::BUILT_IN;
pub use built_in::{AnyStrategy, StrategyConfig};
pub use named::{NamedStrategy, NoStrategy, RegisteredConfig, register_strategy};

/// A built-in strategy's entry in the one list: what the parser, its errors and `--help` use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BuiltIn {
    /// The name configs write (`"zero-1"`).
    pub name: &'static str,
    /// Other spellings accepted (`"zero1"`).
    pub aliases: &'static [&'static str],
    /// Its description (the variant's doc comment).
    pub about: &'static str,
}

impl<B: AutodiffBackend, U: NamedStrategy<B>> AnyStrategy<B, U> {
    /// The strategy `config` asks for, over `group` (`None` on a single device) on this
    /// rank's `device`: what [`Accelerator::run`](crate::Accelerator::run) builds for each
    /// rank. A registered strategy's name builds `U`; `tp_size > 1` a
    /// [`TensorParallelMesh`] (DDP or FSDP across the tensor-parallel groups).
    pub fn from_config(
        config: &AcceleratorConfig,
        group: Option<Group<B>>,
        device: &B::Device,
    ) -> Result<Self, AccelerateError> {
        config.parallelism.strategy.validate()?;
        if config.parallelism.is_tensor_parallel() {
            let group = group.ok_or_else(|| {
                AccelerateError::invalid(
                    "tp_size",
                    config.parallelism.tp_size,
                    "1 on a single device",
                )
            })?;
            let fsdp = match &config.parallelism.strategy {
                StrategyConfig::Fsdp(fsdp)
                    if fsdp.sharding_strategy != ShardingStrategy::NoShard =>
                {
                    Some(fsdp.clone())
                }
                _ => None,
            };
            // The rows' DDP takes `bucket_cap_mb`; it reduces after backward (the mesh has
            // no hooked view).
            let bucket_cap_mb = match &config.parallelism.strategy {
                StrategyConfig::Ddp(ddp) => ddp.bucket_cap_mb,
                _ => afterburner_parallel::DEFAULT_BUCKET_CAP_MB,
            };
            let mesh =
                TensorParallelMesh::new(group, config.parallelism.tp_size, device.clone(), fsdp)?;
            return Ok(Self::TensorParallel(
                mesh.with_bucket_cap_mb(bucket_cap_mb)?,
            ));
        }
        match (group, &config.parallelism.strategy) {
            (None, StrategyConfig::Registered(registered)) => {
                Ok(Self::User(named::build_user::<B, U>(registered, None)?))
            }
            (None, _) => Ok(Self::SingleDevice(SingleDevice)),
            (Some(group), strategy) => {
                built_in::build(strategy, group, config.gradient_accumulation_steps == 1)
            }
        }
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

    /// The mesh under `tp_size > 1` (its tensor-parallel handle: collectives, values sent).
    pub fn tensor_parallel(&self) -> Option<&TensorParallelMesh<B, Group<B>>> {
        match self {
            Self::TensorParallel(mesh) => Some(mesh),
            _ => None,
        }
    }

    /// The user's strategy, when the config chose it by its registered name.
    pub fn user(&self) -> Option<&U> {
        match self {
            Self::User(user) => Some(user),
            _ => None,
        }
    }
}
