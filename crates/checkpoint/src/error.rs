use thiserror::Error;

/// Errors of the checkpoint crate: each names the bad value and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CheckpointError {
    /// A policy string that is not one of the known spellings.
    #[error(
        "unknown checkpoint policy '{given}'; valid values: none, all, every-<k> (k >= 1, \
         e.g. every-2), selective, balanced (or true = all, false = none)"
    )]
    UnknownPolicy {
        /// What the user wrote.
        given: String,
    },
    /// The `balanced` policy was asked for on a backend that is not Burn's
    /// `Autodiff<_, BalancedCheckpointing>`.
    #[error(
        "checkpoint policy 'balanced' is Burn's BalancedCheckpointing, chosen by the backend type: \
         train on Autodiff<_, BalancedCheckpointing> (afterburner_checkpoint::Balanced<B>), not \
         '{backend}'"
    )]
    BalancedNeedsBackend {
        /// The backend in use.
        backend: String,
    },
}
