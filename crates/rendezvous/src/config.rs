//! [`QuorumConfig`]: the settings of a fault-tolerant replica group.

use std::time::Duration;

use crate::{PolicyRule, RendezvousError};

/// The settings of a fault-tolerant replica group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuorumConfig {
    /// The replicas the run starts with (ids `0..replicas`).
    pub replicas: usize,
    /// How long a collective waits for a member that has not called it yet (counted from the
    /// first member's call); then the member is dropped and the collective completes without it.
    pub timeout: Duration,
    /// How long a joining replica waits for a live replica's state.
    pub join_timeout: Duration,
    /// The fewest members a collective may complete with; fewer fail it on every member
    /// (every replica, whatever this says, once the restart policy is `all`).
    pub min_replicas: usize,
    /// How the restart policy of a launch is settled (unchecked by default).
    pub restart: PolicyRule,
}

impl QuorumConfig {
    /// `replicas` replicas, a 60 s collective timeout, 10 min to be healed, at least 1 member,
    /// no launch restart policy.
    pub fn new(replicas: usize) -> Self {
        Self {
            replicas,
            timeout: Duration::from_secs(60),
            join_timeout: Duration::from_secs(600),
            min_replicas: 1,
            restart: PolicyRule::Unchecked,
        }
    }

    /// This config with another collective timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// This config with another join timeout.
    pub fn with_join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// This config with another minimum membership.
    pub fn with_min_replicas(mut self, min_replicas: usize) -> Self {
        self.min_replicas = min_replicas;
        self
    }

    /// This config with a launch's restart policy rule: given to the launcher, or settled by
    /// the workers' declarations.
    pub fn with_restart(mut self, restart: impl Into<PolicyRule>) -> Self {
        self.restart = restart.into();
        self
    }

    pub(crate) fn validate(&self) -> Result<(), RendezvousError> {
        if self.replicas == 0 {
            return Err(invalid("quorum.replicas", "0", "at least 1 replica"));
        }
        if self.min_replicas == 0 || self.min_replicas > self.replicas {
            return Err(invalid(
                "quorum.min_replicas",
                &self.min_replicas.to_string(),
                "between 1 and the number of replicas",
            ));
        }
        if self.timeout.is_zero() || self.join_timeout.is_zero() {
            return Err(invalid("quorum.timeout", "0 s", "a positive duration"));
        }
        Ok(())
    }
}

pub(crate) fn invalid(field: &'static str, value: &str, expected: &str) -> RendezvousError {
    RendezvousError::InvalidConfig {
        field,
        value: value.to_string(),
        expected: expected.into(),
    }
}
