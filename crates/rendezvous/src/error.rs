//! [`RendezvousError`]: what the rendezvous reports.

use thiserror::Error;

/// Errors of the rendezvous (the lighthouse, its wire, the launched environment) and, under
/// the name `ParallelError`, of the process groups and strategies above it
/// (afterburner-collectives and afterburner-parallel re-export this one type): each names the
/// rank or setting involved.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RendezvousError {
    /// A setting out of range.
    #[error("invalid {field} = {value}: expected {expected}")]
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is allowed.
        expected: String,
    },
    /// Another worker failed (returned an error, panicked or timed out), so this one stopped.
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The worker that failed first.
        rank: usize,
        /// Why.
        reason: String,
    },
    /// A collective did not complete within the timeout (a peer hung or never called it).
    #[error("{op} on rank {rank} did not complete within {seconds} s")]
    Timeout {
        /// The collective.
        op: &'static str,
        /// The waiting rank.
        rank: usize,
        /// The timeout.
        seconds: f64,
    },
    /// The collective engine reported an error.
    #[error("{op} on rank {rank}: {reason}")]
    Collective {
        /// The collective.
        op: &'static str,
        /// The calling rank.
        rank: usize,
        /// The engine's message.
        reason: String,
    },
    /// Ranks disagree on the model (a different number or shape of parameters).
    #[error("rank {rank}: {reason}")]
    Mismatch {
        /// The rank that noticed.
        rank: usize,
        /// What differs.
        reason: String,
    },
    /// A replica asked to join a run that had already ended: no live replica will send its
    /// state (the run's final state is what the live replicas saved at `step`).
    #[error(
        "replica {rank} asked to join the run after it ended at step {step}: no live replica is \
         left to heal it, and none is needed (the run's final state is the live replicas')"
    )]
    RunEnded {
        /// The replica that asked to join.
        rank: usize,
        /// The optimizer step the live replicas ended the run at.
        step: u64,
    },
    /// A message or record that does not decode: the wire's frames, a live state in transit, a
    /// saved optimizer record FSDP cannot gather or shard (not Burn's record format, state for
    /// a parameter the model lacks, a non-float state tensor).
    #[error("{0}")]
    Record(String),
}
