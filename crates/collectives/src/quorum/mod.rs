//! Fault-tolerant replica groups: the replicas of Local SGD or DiLoCo go on when one dies and
//! take it back when it restarts (what torchft's lighthouse and quorum give PyTorch).
//!
//! - [`Lighthouse`](crate::Lighthouse): the coordinator. Every collective is a quorum of the replicas present:
//!   a replica that fails, leaves or does not call a collective within
//!   [`QuorumConfig::timeout`](crate::QuorumConfig::timeout) is dropped with a warning, and the collective completes over the
//!   others (a mean divides by the replicas present). A dropped replica's later calls are
//!   refused: it never comes back with stale state.
//! - [`QuorumGroup`]: one replica's [`ProcessGroup`](crate::ProcessGroup), from
//!   [`LocalReplicas::replica`] (threads of one process) or [`connect_tcp`] (processes, to a
//!   [`LighthouseServer`](crate::LighthouseServer)). The lighthouse, its server and wire are afterburner-rendezvous's
//!   (no Burn), re-exported here; the values go over a ring between the members present
//!   (data_plane.rs), not through the lighthouse.
//! - Rejoin: a replica that connects once the run has started is a joiner. Its strategy's
//!   `join` waits for a live replica's state (afterburner-parallel's `receive_live_state`);
//!   the live replicas send it after their next sync (`donate_live_state`), and the joiner
//!   takes part from the next collective on. Once the live replicas have finished training
//!   ([`Quorum::end_run`]) a joiner is told the run ended instead, and is alone from then on.
//!
//! DDP, ZeRO and FSDP refuse a quorum group (afterburner-parallel): their replicas step
//! together on shared gradients or shards, so one lost replica loses state.

mod data_plane;
mod group;
#[cfg(feature = "testing")]
mod scenario;
mod tcp;

pub use group::{LocalReplicas, QuorumGroup};
#[cfg(feature = "testing")]
pub use scenario::{FailAndRestart, ReplicaRun, fail_and_restart};
pub(crate) use tcp::group_of;
pub use tcp::{connect_tcp, connect_tcp_with_token};

use crate::ParallelError;

/// What a fault-tolerant group tells its replica strategy beyond the collectives (see the
/// module docs). [`ProcessGroup::quorum`](crate::ProcessGroup::quorum) returns it, shared.
pub trait Quorum: Send + Sync {
    /// This replica's id.
    fn replica(&self) -> usize;

    /// Whether this replica joins a run in progress and has not received a live state yet
    /// (it may call no collective before [`receive_state`](Self::receive_state)).
    fn is_joining(&self) -> bool;

    /// The replicas present at this replica's last collective.
    fn members(&self) -> Vec<usize>;

    /// Whether a joining replica waits for this replica's state.
    fn state_requested(&self) -> bool;

    /// Sends this replica's state to the replicas waiting to join; they take part from this
    /// replica's next collective on.
    fn send_state(&self, state: Vec<u8>) -> Result<(), ParallelError>;

    /// Sets what this replica sends with its live state beyond the model, optimizer and
    /// strategy (the caller's own, e.g. the Accelerator's fp16 loss scale); on a healed
    /// replica, afterburner-parallel's `receive_live_state` puts there what the donor
    /// attached.
    fn attach(&self, bytes: Vec<u8>);

    /// The bytes [`attach`](Self::attach)ed (empty when none).
    fn attached(&self) -> Vec<u8>;

    /// Tells the group this replica finished training at optimizer `step`, after its last
    /// collective of the run: a replica waiting to join (a restarted one), or joining later,
    /// is told the run ended ([`ParallelError::RunEnded`]) instead of waiting for a state no
    /// live replica will send.
    fn end_run(&self, step: u64) -> Result<(), ParallelError>;

    /// Whether this replica asked to join after the run ended
    /// ([`receive_state`](Self::receive_state) returned [`ParallelError::RunEnded`]): from then
    /// on its collectives combine its own values alone (it is the only replica left), so it
    /// can load the run's final state and end as the others did.
    fn run_ended(&self) -> bool;

    /// On a joining replica: waits for a live replica's state
    /// ([`QuorumConfig::join_timeout`](crate::QuorumConfig::join_timeout)); from then on this replica takes part in collectives.
    fn receive_state(&self) -> Result<Vec<u8>, ParallelError>;
}
