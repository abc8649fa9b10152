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

mod ddp;
mod fsdp;
mod heal;
mod optimizer_state;
mod params;
mod record;
mod refuse_quorum;
pub mod rng;
mod sampler;
mod saving;
mod spelled;
mod strategy;
pub mod tp;
mod zero;

// The collectives (and, through them, the rendezvous) under this crate's paths, so that
// `afterburner_parallel::ProcessGroup` and `afterburner::parallel::Lighthouse` stay where
// users found them.
pub use afterburner_collectives::{
    Ballot, Counted, Declaration, Departure, LINK_RATE_VAR, LaunchConfig, Launched, LaunchedGroup,
    Lighthouse, LighthouseServer, LocalGroup, LocalReplicas, MeshGroups, ParallelError,
    ProcessGroup, Quorum, QuorumConfig, QuorumGroup, ReduceOp, RendezvousError, RestartPolicy,
    SharedGroup, SlowLink, SubGroup, Traffic, all_gather_by_broadcasts, barrier_by_all_reduce,
    broadcast_text, broadcast_text_from, connect_tcp, connect_tcp_with_token, launch, launched,
    local_devices, mesh_groups, ranks_voting_yes, reduce_scatter_by_all_reduce, same_on_every_rank,
    vote,
};
#[cfg(feature = "testing")]
pub use afterburner_collectives::{FailAndRestart, ReplicaRun, fail_and_restart};
#[cfg(feature = "mpi")]
pub use afterburner_collectives::{LOOPBACK_MPIRUN_FLAGS, MpiGroup, launch_mpi};
#[cfg(all(feature = "mpi", feature = "testing"))]
pub use afterburner_collectives::{LoopbackRun, run_on_loopback};
#[cfg(feature = "testing")]
pub use afterburner_collectives::{forwarding, launch_through_host};
pub use ddp::{DEFAULT_BUCKET_CAP_MB, Ddp, DdpConfig, broadcast_from_rank0};
pub use fsdp::{AutoWrapPolicy, Fsdp, FsdpConfig, ShardLayout, ShardingStrategy, StateDictType};
pub use heal::{donate_live_state, receive_live_state};
pub use optimizer_state::average_optimizer_state;
pub use params::{flat_params, param_ids, param_positions, with_flat_params};
pub use record::{
    OptimizerRecord, ParamPositions, join_param_shards, mean_param_states, merge_param_states,
};
pub use sampler::{DistributedSampler, shard};
pub use saving::{StateLayout, StateSaving, StrategyState};
pub use spelled::spellings;
pub use strategy::{ForwardView, ParallelStrategy, SingleDevice};
pub use zero::{OptimizerSharding, Zero1};
