//! The built-in strategies, listed once. Adding one takes three edits here: a row in the list
//! below (its name, spellings, options type and strategy type), an arm in [`build`] and an arm
//! in [`validate`] (both matches are exhaustive, so the compiler asks for them). The config's
//! parser, its error messages, the `--help` text, [`AnyStrategy`](super::AnyStrategy) and its
//! forwarding of every phase all come from the row.

use afterburner_localsgd::{DiLoCo, DiLoCoConfig, LocalSgd, LocalSgdConfig};
use afterburner_parallel::{
    Ddp, DdpConfig, Fsdp, FsdpConfig, ShardingStrategy, SharedGroup, SingleDevice, Zero1,
};
use burn::tensor::backend::AutodiffBackend;

use super::{NamedStrategy, NoStrategy};
use crate::AccelerateError;
use crate::group::Group;

built_in_strategies! {
    /// One device, no collectives (the default).
    SingleDevice = "single-device" | "single_device" | "single" => SingleDevice;
    /// Distributed data parallel: a whole replica per device, gradients all-reduced (mean)
    /// once per optimizer step, rank 0's parameters broadcast at setup.
    /// Options: `bucket_cap_mb`, `overlap` ([`DdpConfig`]).
    Ddp(DdpConfig) = "ddp" => Ddp<B, SharedGroup<Group<B>>>;
    /// ZeRO stage 1: DDP, and each rank keeps optimizer state only for the parameters it
    /// owns (about 1 / world size of them); owners share new values after each step.
    /// Options: DDP's ([`DdpConfig`]).
    Zero1(DdpConfig) = "zero-1" | "zero1" | "zero_1" => Zero1<B, SharedGroup<Group<B>>>;
    /// Fully sharded data parallel: each rank keeps 1 / world size of every parameter, its
    /// gradient and its optimizer state; units are gathered for each forward pass.
    Fsdp(FsdpConfig) = "fsdp" => Fsdp<B, Group<B>>;
    /// Local SGD: ranks step alone and average their parameters every `local_sgd_steps`
    /// optimizer steps.
    LocalSgd(LocalSgdConfig) = "local-sgd" | "local_sgd" | "localsgd" => LocalSgd<B, SharedGroup<Group<B>>>;
    /// DiLoCo: ranks step alone; every `sync_every` steps an outer Nesterov step on the
    /// averaged parameter change (Streaming DiLoCo with `fragments`).
    DiLoCo(DiLoCoConfig) = "diloco" => DiLoCo<B, SharedGroup<Group<B>>>;
}

/// One rank's strategy for `config` over its process `group`; DDP (and ZeRO-1) reduces its
/// gradients during backward when `overlap` (one micro-batch per optimizer step) and its
/// options allow.
pub(super) fn build<B: AutodiffBackend, U: NamedStrategy<B>>(
    config: &StrategyConfig,
    group: Group<B>,
    overlap: bool,
) -> Result<AnyStrategy<B, U>, AccelerateError> {
    let ddp = |group, options: &DdpConfig| -> Result<_, AccelerateError> {
        let ddp = Ddp::new(SharedGroup::new(group)).with_bucket_cap_mb(options.bucket_cap_mb)?;
        Ok(match overlap && options.overlap {
            true => ddp.with_overlap()?,
            false => ddp,
        })
    };
    Ok(match config {
        StrategyConfig::SingleDevice => {
            return Err(AccelerateError::invalid(
                "strategy",
                config,
                "a multi-device strategy for a multi-device run (see --help or docs/parallel.md)",
            ));
        }
        StrategyConfig::Ddp(options) => AnyStrategy::Ddp(ddp(group, options)?),
        StrategyConfig::Zero1(options) => AnyStrategy::Zero1(Zero1::from_ddp(ddp(group, options)?)),
        StrategyConfig::Fsdp(fsdp) if fsdp.sharding_strategy == ShardingStrategy::NoShard => {
            AnyStrategy::Ddp(ddp(group, &DdpConfig::default())?)
        }
        StrategyConfig::Fsdp(fsdp) => {
            AnyStrategy::Fsdp(Fsdp::new(SharedGroup::new(group), fsdp.clone())?)
        }
        StrategyConfig::LocalSgd(local) => {
            AnyStrategy::LocalSgd(LocalSgd::new(SharedGroup::new(group), local.clone())?)
        }
        StrategyConfig::DiLoCo(diloco) => {
            AnyStrategy::DiLoCo(DiLoCo::new(SharedGroup::new(group), diloco.clone())?)
        }
        StrategyConfig::Registered(registered) => {
            AnyStrategy::User(super::named::build_user::<B, U>(registered, Some(group))?)
        }
    })
}

/// Checks the options of `config`, naming the first bad one.
pub(super) fn validate(config: &StrategyConfig) -> Result<(), AccelerateError> {
    match config {
        StrategyConfig::SingleDevice | StrategyConfig::Fsdp(_) | StrategyConfig::Registered(_) => {
            Ok(())
        }
        StrategyConfig::Ddp(options) | StrategyConfig::Zero1(options) => Ok(options.validate()?),
        StrategyConfig::LocalSgd(local) => Ok(local.validate()?),
        StrategyConfig::DiLoCo(diloco) => Ok(diloco.validate()?),
    }
}
