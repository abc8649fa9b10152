//! How a launch's restart policy is settled: given to the launcher (`--restart-policy`), or
//! declared by its workers at the rendezvous. Each worker says which strategy it runs and the
//! policy that strategy needs ([`Declaration`]); the first declaration settles an open policy,
//! and a worker whose strategy needs the other policy is refused with an error naming both.
//! The launcher reads the settled policy back from the lighthouse
//! ([`Lighthouse::restart_policy`]) and never from the program's command line.

use std::sync::{MutexGuard, PoisonError};

use crate::{Lighthouse, RendezvousError, RestartPolicy};

/// What a worker tells the lighthouse when it connects: the strategy it runs and the restart
/// policy that strategy needs (`replica` when its replicas heal alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// The strategy's name, as configs write it (`"diloco"`).
    pub strategy: String,
    /// The restart policy the strategy needs.
    pub policy: RestartPolicy,
}

/// How a lighthouse settles the restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyRule {
    /// No launch policy: declarations are not checked and `min_replicas` is the config's (a
    /// lighthouse of one's own, threads of one process).
    #[default]
    Unchecked,
    /// The launcher was given this policy: a worker declaring the other is refused.
    Given(RestartPolicy),
    /// The first worker's declaration settles it (`--restart-policy auto`); a later worker
    /// declaring the other is refused.
    FromWorkers,
}

impl From<RestartPolicy> for PolicyRule {
    fn from(policy: RestartPolicy) -> Self {
        Self::Given(policy)
    }
}

/// The restart policy a lighthouse settled, and who settled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The policy.
    pub policy: RestartPolicy,
    /// Who settled it: "the launcher's --restart-policy", or "rank 0's strategy diloco".
    pub by: String,
}

/// The policy as settled so far (a lighthouse holds one).
#[derive(Debug, Default)]
pub(crate) struct Agreement {
    rule: PolicyRule,
    declared: Option<Settled>,
}

impl Agreement {
    pub(crate) fn new(rule: PolicyRule) -> Self {
        Self {
            rule,
            declared: None,
        }
    }

    /// The settled policy: the given one, or the first declaration's.
    pub(crate) fn settled(&self) -> Option<Settled> {
        match self.rule {
            PolicyRule::Unchecked => None,
            PolicyRule::Given(policy) => Some(Settled {
                policy,
                by: "the launcher's --restart-policy".into(),
            }),
            PolicyRule::FromWorkers => self.declared.clone(),
        }
    }

    /// Records `replica`'s declaration: settles an open policy, refuses one that differs.
    pub(crate) fn declare(
        &mut self,
        replica: usize,
        declaration: &Declaration,
    ) -> Result<(), RendezvousError> {
        if self.rule == PolicyRule::Unchecked {
            return Ok(());
        }
        let Some(settled) = self.settled() else {
            tracing::info!(
                replica,
                strategy = declaration.strategy,
                policy = %declaration.policy,
                "the workers' strategy settles the launch's restart policy"
            );
            self.declared = Some(Settled {
                policy: declaration.policy,
                by: format!("rank {replica}'s strategy {}", declaration.strategy),
            });
            return Ok(());
        };
        if settled.policy == declaration.policy {
            return Ok(());
        }
        let (wanted, strategy) = (declaration.policy, &declaration.strategy);
        let fix = match self.rule {
            PolicyRule::Given(_) => format!(
                "start the launch with `afterburner launch --restart-policy {wanted}`, or \
                 `auto` (the default), which takes the policy from the workers' strategy"
            ),
            _ => "every worker of a launch must run the same strategy".into(),
        };
        Err(RendezvousError::Mismatch {
            rank: replica,
            reason: format!(
                "rank {replica} runs strategy {strategy}, whose replicas {}, so it needs restart \
                 policy `{wanted}`; the launch runs restart policy `{}`, settled by {}: {fix}",
                match wanted {
                    RestartPolicy::Replica => "heal alone (one that dies is restarted by itself)",
                    RestartPolicy::All => "must all restart together from the last checkpoint",
                },
                settled.policy,
                settled.by,
            ),
        })
    }

    /// The fewest members a collective may complete with: every replica once the policy is
    /// `all` (a lost rank fails every rank's collective), else `configured`.
    pub(crate) fn min_replicas(&self, configured: usize, replicas: usize) -> usize {
        match self.settled() {
            Some(Settled {
                policy: RestartPolicy::All,
                ..
            }) => replicas,
            _ => configured,
        }
    }
}

impl Lighthouse {
    /// Records what replica `replica` runs ([`Declaration`]): under a launch's policy rule it
    /// settles an open policy, and a strategy that needs the other policy is refused with an
    /// error naming the strategy, both policies and the fix.
    pub fn declare(
        &self,
        replica: usize,
        declaration: &Declaration,
    ) -> Result<(), RendezvousError> {
        self.agreement().declare(replica, declaration)
    }

    /// The restart policy settled so far (`None` while open, or on a lighthouse with no launch
    /// policy).
    pub fn restart_policy(&self) -> Option<Settled> {
        self.agreement().settled()
    }

    pub(crate) fn agreement(&self) -> MutexGuard<'_, Agreement> {
        self.policy.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declaring(strategy: &str, policy: RestartPolicy) -> Declaration {
        Declaration {
            strategy: strategy.into(),
            policy,
        }
    }

    #[test]
    fn the_first_declaration_settles_an_open_policy_and_a_different_one_is_named() {
        let mut agreement = Agreement::new(PolicyRule::FromWorkers);
        assert_eq!(agreement.settled(), None);
        assert_eq!(agreement.min_replicas(1, 3), 1);
        agreement
            .declare(0, &declaring("diloco", RestartPolicy::Replica))
            .unwrap();
        agreement
            .declare(2, &declaring("local-sgd", RestartPolicy::Replica))
            .unwrap();
        let settled = agreement.settled().unwrap();
        assert_eq!(settled.policy, RestartPolicy::Replica);
        assert_eq!(settled.by, "rank 0's strategy diloco");
        let error = agreement
            .declare(1, &declaring("ddp", RestartPolicy::All))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("rank 1 runs strategy ddp")
                && error.contains("settled by rank 0's strategy diloco")
                && error.contains("same strategy"),
            "{error}"
        );
    }

    #[test]
    fn a_given_policy_refuses_a_strategy_that_needs_the_other() {
        let mut agreement = Agreement::new(RestartPolicy::All.into());
        assert_eq!(agreement.min_replicas(1, 4), 4);
        agreement
            .declare(0, &declaring("ddp", RestartPolicy::All))
            .unwrap();
        let error = agreement
            .declare(1, &declaring("diloco", RestartPolicy::Replica))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("diloco")
                && error.contains("heal alone")
                && error.contains("--restart-policy replica"),
            "{error}"
        );
    }

    #[test]
    fn an_unchecked_lighthouse_admits_any_declaration() {
        let mut agreement = Agreement::default();
        agreement
            .declare(0, &declaring("ddp", RestartPolicy::All))
            .unwrap();
        agreement
            .declare(1, &declaring("diloco", RestartPolicy::Replica))
            .unwrap();
        assert_eq!(agreement.settled(), None);
        assert_eq!(agreement.min_replicas(2, 4), 2);
    }
}
