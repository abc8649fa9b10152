//! Collectives for [Burn](https://burn.dev): [`ProcessGroup`] (rank, world size, all-reduce,
//! broadcast, all-gather, reduce-scatter, barrier over 1-D tensors) and its engines, with no
//! training strategy in it (afterburner-parallel builds DDP, ZeRO-1, FSDP and tensor
//! parallelism over these).
//!
//! - Engines: [`LocalGroup`] + [`launch`] (one worker thread per device, collectives by
//!   `burn-collective`, a failure record and a watchdog so a failing or hanging worker makes
//!   every other one return an error); `MpiGroup` + `launch_mpi` (feature `mpi`: one rank per
//!   process under `mpirun`); [`QuorumGroup`] (a fault-tolerant replica group: membership from
//!   afterburner-rendezvous's [`Lighthouse`], values over a TCP ring between the members
//!   (ring/), on threads through [`LocalReplicas`] or over TCP through [`connect_tcp`];
//!   [`LaunchedGroup::connect`] for a worker of `afterburner launch`).
//! - Decorators: [`Counted`] (the values a rank sends, [`Traffic`]), [`SharedGroup`] (one group
//!   shared by several users), [`SlowLink`] (a simulated link for benchmarks), and a boxed
//!   group; each says what it does before a call (decorator.rs's `Decorator`) and gets every
//!   method forwarded from one macro, `forward_process_group!`, checked against the trait.
//! - Sub-groups: [`mesh_groups`] gives each rank of a `dp x tp` mesh its two [`SubGroup`]s.
//! - Votes: [`vote`], [`same_on_every_rank`], [`ranks_voting_yes`], [`broadcast_text`].
//! - [`ParallelError`]: what all of it reports (afterburner-parallel's error too).

#![warn(missing_docs)]

mod counted;
mod decorator;
#[cfg(any(test, feature = "testing"))]
pub mod forwarding;
mod group;
mod launch;
mod launched_group;
mod local;
#[cfg(all(feature = "mpi", feature = "testing"))]
mod loopback;
mod mesh_groups;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "mpi")]
mod mpi_joined;
mod quorum;
mod ring;
mod shared;
mod slow_link;
mod votes;

/// The one error type of the rendezvous, the collectives and the strategies, under the name
/// these crates have always used.
pub use afterburner_rendezvous::RendezvousError as ParallelError;
pub use afterburner_rendezvous::{
    self as rendezvous, Declaration, Departure, Launched, Lighthouse, LighthouseServer,
    QuorumConfig, RendezvousError, RestartPolicy, launched,
};
pub use counted::{Counted, Traffic};
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
pub use mesh_groups::{MeshGroups, SubGroup, mesh_groups, mesh_of};
#[cfg(feature = "mpi")]
pub use mpi::{LOOPBACK_MPIRUN_FLAGS, MpiGroup, launch_mpi};
#[cfg(feature = "testing")]
pub use quorum::{FailAndRestart, ReplicaRun, fail_and_restart};
pub use quorum::{LocalReplicas, Quorum, QuorumGroup, connect_tcp, connect_tcp_with_token};
pub use ring::LINK_RATE_VAR;
pub use shared::SharedGroup;
pub use slow_link::SlowLink;
pub use votes::{
    Ballot, broadcast_text, broadcast_text_from, ranks_voting_yes, same_on_every_rank, vote,
};
