use afterburner_rendezvous::RendezvousError;
use thiserror::Error;

/// Errors of the parallel crate; each names the rank or setting involved.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ParallelError {
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
    /// A saved optimizer record FSDP cannot gather or shard (not Burn's record format, state
    /// for a parameter the model lacks, a non-float state tensor).
    #[error("{0}")]
    Record(String),
}

impl From<RendezvousError> for ParallelError {
    /// The variant of the same name: the rendezvous reports in this crate's terms.
    fn from(error: RendezvousError) -> Self {
        match error {
            RendezvousError::InvalidConfig {
                field,
                value,
                expected,
            } => Self::InvalidConfig {
                field,
                value,
                expected,
            },
            RendezvousError::PeerFailed { rank, reason } => Self::PeerFailed { rank, reason },
            RendezvousError::Timeout { op, rank, seconds } => Self::Timeout { op, rank, seconds },
            RendezvousError::Collective { op, rank, reason } => {
                Self::Collective { op, rank, reason }
            }
            RendezvousError::Mismatch { rank, reason } => Self::Mismatch { rank, reason },
            RendezvousError::Record(reason) => Self::Record(reason),
        }
    }
}
