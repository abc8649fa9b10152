//! Training spread over devices for [Burn](https://burn.dev): process groups and their
//! engines, and the strategies over them (DDP, ZeRO-1, FSDP, tensor parallelism), with the
//! optimizer records, sampler and seeds they share. Where processes meet (the launched
//! environment, the lighthouse) is afterburner-rendezvous's, without Burn; it is re-exported
//! here.
//!
//! - [`ProcessGroup`]: rank, world size and collectives (all_reduce, broadcast, all_gather,
//!   reduce_scatter, barrier) over 1-D tensors; engines implement it.
//! - [`LocalGroup`] + [`launch`]: the in-process engine, one worker thread per device,
//!   collectives by `burn-collective`, with a failure record and a watchdog so a failing or
//!   hanging worker makes every other one return an error instead of blocking forever.
//! - [`Ddp`]: rank 0's parameters at setup, one gradient all-reduce per optimizer step.
//! - [`OptimizerSharding`]: ZeRO stage 1 on top of DDP, optimizer state split across ranks.
//! - [`Fsdp`]: fully sharded data parallel (ZeRO-3 `full`, ZeRO-2 `grad-op`): parameters,
//!   gradients and optimizer state kept as per-rank shards, units gathered per forward pass.
//! - [`DistributedSampler`]: disjoint, shuffled per-rank shards, in batches; [`rng`]: its
//!   generator (SplitMix64), also the source of the Accelerator's seeds.
//!
//! The `afterburner` Accelerator uses these for `strategy = "ddp"` (`Accelerator::launch`).
//! - `MpiGroup` + `launch_mpi` (feature `mpi`): one rank per process over MPI, started by
//!   `mpirun` on one machine or several; a failing rank aborts the whole job.
//! - [`Lighthouse`] + [`QuorumGroup`]: fault-tolerant replica groups for Local SGD and DiLoCo
//!   (threads, or processes over TCP with [`LighthouseServer`] and [`connect_tcp`]): a replica
//!   that dies is dropped and the others go on; a restarted one is healed from a live one.
//!   The lighthouse, its TCP server and the launched environment ([`launched`], [`Launched`])
//!   are afterburner-rendezvous's (no Burn), re-exported here; this crate adds the tensors
//!   ([`QuorumGroup`], [`LocalReplicas`], [`LaunchedGroup`]).
//!
//! ## Alone, in a plain Burn loop
//!
//! DDP on 2 worker threads with `launch`, `Ddp` and `DistributedSampler` in an ordinary Burn
//! loop, without the `afterburner` facade (`examples/ddp_loop.rs`, run as this doctest;
//! `cargo run -p afterburner-parallel --example ddp_loop`):
//!
//! ```
#![doc = include_str!("../examples/ddp_loop.rs")]
//! ```

#![warn(missing_docs)]

mod counted;
mod ddp;
mod error;
#[cfg(any(test, feature = "testing"))]
pub mod forwarding;
mod fsdp;
mod group;
mod launch;
mod launched_group;
mod local;
#[cfg(all(feature = "mpi", feature = "testing"))]
mod loopback;
mod mesh;
#[cfg(feature = "mpi")]
mod mpi;
mod optimizer_state;
mod params;
mod quorum;
mod record;
pub mod rng;
mod sampler;
mod saving;
mod shared;
mod slow_link;
mod spelled;
mod strategy;
pub mod tp;
mod votes;
mod zero;

pub use afterburner_rendezvous::launched;
pub use afterburner_rendezvous::{Launched, RendezvousError, RestartPolicy};
pub use counted::{Counted, Traffic};
pub use ddp::{Ddp, broadcast_from_rank0};
pub use error::ParallelError;
pub use fsdp::{AutoWrapPolicy, Fsdp, FsdpConfig, ShardLayout, ShardingStrategy, StateDictType};
pub use group::{
    ProcessGroup, ReduceOp, all_gather_by_broadcasts, barrier_by_all_reduce,
    reduce_scatter_by_all_reduce,
};
#[cfg(feature = "testing")]
pub use launch::launch_through_host;
pub use launch::{LaunchConfig, launch, local_devices};
pub use launched_group::LaunchedGroup;
pub use local::LocalGroup;
#[cfg(all(feature = "mpi", feature = "testing"))]
pub use loopback::{LoopbackRun, run_on_loopback};
pub use mesh::{MeshGroups, SubGroup, mesh_groups};
#[cfg(feature = "mpi")]
pub use mpi::{LOOPBACK_MPIRUN_FLAGS, MpiGroup, launch_mpi};
pub use optimizer_state::average_optimizer_state;
pub use params::{flat_params, param_ids, param_positions, with_flat_params};
pub use quorum::{
    Departure, Lighthouse, LighthouseServer, LocalReplicas, Quorum, QuorumConfig, QuorumGroup,
    connect_tcp, connect_tcp_with_token, donate_live_state, receive_live_state,
};
#[cfg(feature = "testing")]
pub use quorum::{FailAndRestart, ReplicaRun, fail_and_restart};
pub use record::{
    OptimizerRecord, ParamPositions, join_param_shards, mean_param_states, merge_param_states,
};
pub use sampler::{DistributedSampler, shard};
pub use saving::{StateLayout, StateSaving, StrategyState};
pub use shared::SharedGroup;
pub use slow_link::SlowLink;
pub use spelled::spellings;
pub use strategy::{ForwardView, ParallelStrategy, SingleDevice};
pub use votes::{broadcast_text, ranks_voting_yes, same_on_every_rank};
pub use zero::{OptimizerSharding, Zero1};
