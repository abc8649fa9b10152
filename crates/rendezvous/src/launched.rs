//! [`Launched`]: what a launcher (`afterburner launch`, crate afterburner-launch) tells each
//! worker process through its environment, as torchrun does: the rank, the world size, where
//! the group meets, how many times the worker was restarted and which restart policy runs.
//! The Accelerator reads it, so a launched program needs no launch code of its own.

use std::time::Duration;

use crate::engine::ENGINE;
use crate::{Engine, PolicyRule, QuorumConfig, RendezvousError};

/// The global rank of this worker (torchrun's name).
pub const RANK: &str = "RANK";
/// The number of workers in all (torchrun's name).
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// This worker's rank among the workers of its node (torchrun's name).
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// The number of workers on this node (torchrun's name).
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// This node's rank among the nodes (torchrun's `GROUP_RANK`).
pub const NODE_RANK: &str = "NODE_RANK";
/// The host of the rendezvous (torchrun's name; informative).
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// The port of the rendezvous (torchrun's name; informative).
pub const MASTER_PORT: &str = "MASTER_PORT";
/// `HOST:PORT` of the lighthouse the workers' process group meets at: its presence means
/// "launched" to the Accelerator.
pub const LIGHTHOUSE: &str = "AFTERBURNER_LIGHTHOUSE";
/// How many times this worker was started again after a failure (torchrun's
/// `TORCHELASTIC_RESTART_COUNT`): 0 on the first start.
pub const RESTART_COUNT: &str = "AFTERBURNER_RESTART_COUNT";
/// The launch's `--max-restarts`.
pub const MAX_RESTARTS: &str = "AFTERBURNER_MAX_RESTARTS";
/// The restart policy the launcher was given, [`RestartPolicy`]'s spelling, or `auto` when
/// the workers' strategy settles it at the rendezvous.
pub const RESTART_POLICY: &str = "AFTERBURNER_RESTART_POLICY";
/// [`RESTART_POLICY`]'s value when the workers' strategy settles the policy.
pub const AUTO: &str = "auto";
/// Seconds a collective waits for a late rank before it fails (or, under the replica
/// policy, drops it).
pub const COLLECTIVE_TIMEOUT_S: &str = "AFTERBURNER_COLLECTIVE_TIMEOUT_S";

/// A shared secret every rank presents to the lighthouse (set it in the environment of every
/// launcher; the workers inherit it): a connection without it is refused. Unset: any
/// connection is admitted.
pub const TOKEN: &str = "AFTERBURNER_TOKEN";

/// The longest timeout accepted anywhere (a collective's, a graceful stop's): one week. A
/// `Duration` cannot hold 1e300 s, and a week is no timeout.
pub const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

/// `seconds` as a timeout: `None` unless it is a number > 0 and at most [`MAX_TIMEOUT_S`].
pub fn timeout(seconds: f64) -> Option<Duration> {
    match seconds > 0.0 && seconds <= MAX_TIMEOUT_S {
        true => Duration::try_from_secs_f64(seconds).ok(),
        false => None,
    }
}

/// The [`TOKEN`] of this process's environment (`None` when unset or empty).
pub fn token() -> Option<String> {
    std::env::var(TOKEN).ok().filter(|t| !t.is_empty())
}

/// What a launcher does when a worker dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartPolicy {
    /// Stop every worker and start them all again; they resume from the last committed
    /// checkpoint (torchrun's elastic semantics). For ranks that share gradients or shards
    /// (DDP, ZeRO-1, FSDP): a lost rank fails every rank's collective.
    #[default]
    All,
    /// Start only the dead worker again; it is healed from a live replica while the others
    /// go on (Local SGD, DiLoCo over the quorum group).
    Replica,
}

impl RestartPolicy {
    /// Each policy with its spelling, once (parse and print; any ASCII case parses).
    pub const SPELLINGS: [(RestartPolicy, &'static str); 2] = [
        (RestartPolicy::All, "all"),
        (RestartPolicy::Replica, "replica"),
    ];
}

impl std::fmt::Display for RestartPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let spelling = Self::SPELLINGS
            .iter()
            .find(|(policy, _)| policy == self)
            .map_or("all", |(_, spelling)| spelling);
        f.write_str(spelling)
    }
}

impl std::str::FromStr for RestartPolicy {
    type Err = RendezvousError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::SPELLINGS
            .iter()
            .find(|(_, spelling)| spelling.eq_ignore_ascii_case(text.trim()))
            .map(|(policy, _)| *policy)
            .ok_or_else(|| RendezvousError::InvalidConfig {
                field: RESTART_POLICY,
                value: text.to_string(),
                expected: "all or replica".into(),
            })
    }
}

/// This worker's place in a launched run, read from its environment ([`from_env`]).
///
/// [`from_env`]: Self::from_env
#[derive(Debug, Clone, PartialEq)]
pub struct Launched {
    /// The global rank.
    pub rank: usize,
    /// The number of workers in all.
    pub world_size: usize,
    /// The rank on this node (the device index on a multi-GPU node).
    pub local_rank: usize,
    /// The workers on this node.
    pub local_world_size: usize,
    /// This node's rank.
    pub node_rank: usize,
    /// `HOST:PORT` of the lighthouse.
    pub lighthouse: String,
    /// Restarts of this worker so far.
    pub restart_count: u32,
    /// The restart policy the launcher was given (`None`: `auto`, the workers' strategy
    /// settles it at the rendezvous, each worker declaring what it runs).
    pub policy: Option<RestartPolicy>,
    /// How long a collective waits for a late rank.
    pub collective_timeout: Duration,
    /// What started the workers and moves their values: under [`Engine::Mpi`] the rank and
    /// sizes are Open MPI's variables (`OMPI_COMM_WORLD_RANK`, ...), not torchrun's.
    pub engine: Engine,
}

impl Launched {
    /// This process's place in a launched run, or `None` when it was not launched (no
    /// [`LIGHTHOUSE`] variable). A variable that is missing or malformed in a launched process
    /// is an error naming it.
    pub fn from_env() -> Result<Option<Self>, RendezvousError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables (tests).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, RendezvousError> {
        let Some(lighthouse) = var(LIGHTHOUSE) else {
            return Ok(None);
        };
        let engine = match var(ENGINE) {
            None => Engine::Tcp,
            Some(value) => value.parse()?,
        };
        // Under mpirun the per-rank values are Open MPI's variables.
        let number = |name: &'static str| -> Result<u64, RendezvousError> {
            let name = engine.place_variable(name);
            let value = var(name).ok_or_else(|| invalid(name, "unset".into()))?;
            value.trim().parse().map_err(|_| invalid(name, value))
        };
        let set = |name: &'static str| var(engine.place_variable(name)).is_some();
        let policy = match var(RESTART_POLICY) {
            None => None,
            Some(value) if value.trim().eq_ignore_ascii_case(AUTO) => None,
            Some(value) => Some(value.parse()?),
        };
        let collective_timeout = match var(COLLECTIVE_TIMEOUT_S) {
            None => Duration::from_secs(300),
            Some(value) => match value.trim().parse::<f64>().ok().and_then(timeout) {
                Some(timeout) => timeout,
                None => {
                    return Err(RendezvousError::InvalidConfig {
                        field: COLLECTIVE_TIMEOUT_S,
                        value,
                        expected: "a number of seconds > 0 and at most 604800 (one week)".into(),
                    });
                }
            },
        };
        let launched = Self {
            rank: number(RANK)? as usize,
            world_size: number(WORLD_SIZE)? as usize,
            local_rank: if set(LOCAL_RANK) {
                number(LOCAL_RANK)?
            } else {
                0
            } as usize,
            local_world_size: if set(LOCAL_WORLD_SIZE) {
                number(LOCAL_WORLD_SIZE)?
            } else {
                1
            } as usize,
            node_rank: if set(NODE_RANK) {
                number(NODE_RANK)?
            } else {
                0
            } as usize,
            lighthouse,
            restart_count: var(RESTART_COUNT).map_or(Ok(0), |_| number(RESTART_COUNT))? as u32,
            policy,
            collective_timeout,
            engine,
        };
        if engine == Engine::Mpi
            && let Some(given) = var(WORLD_SIZE)
            && given.trim() != launched.world_size.to_string()
        {
            return Err(invalid(
                WORLD_SIZE,
                format!(
                    "{given}, while mpirun started {} ranks ({})",
                    launched.world_size,
                    engine.place_variable(WORLD_SIZE)
                ),
            ));
        }
        if launched.local_world_size == 0 || launched.local_rank >= launched.local_world_size {
            return Err(invalid(
                LOCAL_WORLD_SIZE,
                format!(
                    "{} (LOCAL_RANK {})",
                    launched.local_world_size, launched.local_rank
                ),
            ));
        }
        if launched.world_size == 0 || launched.rank >= launched.world_size {
            return Err(invalid(
                RANK,
                format!("{} of WORLD_SIZE {}", launched.rank, launched.world_size),
            ));
        }
        Ok(Some(launched))
    }

    /// The variables that give a worker this place (what the launcher sets). Under
    /// [`Engine::Mpi`] the ranks are `mpirun`'s to give: only what every rank shares is
    /// written (no `RANK`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `NODE_RANK`).
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let (host, port) = self
            .lighthouse
            .rsplit_once(':')
            .unwrap_or((self.lighthouse.as_str(), ""));
        let mut vars = match self.engine {
            Engine::Tcp => vec![
                (RANK, self.rank.to_string()),
                (LOCAL_RANK, self.local_rank.to_string()),
                (LOCAL_WORLD_SIZE, self.local_world_size.to_string()),
                (NODE_RANK, self.node_rank.to_string()),
            ],
            Engine::Mpi => Vec::new(),
        };
        vars.extend([
            (ENGINE, self.engine.to_string()),
            (WORLD_SIZE, self.world_size.to_string()),
            (MASTER_ADDR, host.to_string()),
            (MASTER_PORT, port.to_string()),
            (LIGHTHOUSE, self.lighthouse.clone()),
            (RESTART_COUNT, self.restart_count.to_string()),
            (
                RESTART_POLICY,
                self.policy.map_or(AUTO.to_string(), |p| p.to_string()),
            ),
            (
                COLLECTIVE_TIMEOUT_S,
                self.collective_timeout.as_secs_f64().to_string(),
            ),
        ]);
        vars
    }

    /// The lighthouse settings a launcher serves for `world_size` workers: the restart policy
    /// `given` to the launcher (`Some`, e.g. `--restart-policy all`), or settled by the first
    /// worker's declaration (`None`, `auto`). Under [`RestartPolicy::All`] every rank is
    /// required (a lost one fails every rank's collective); under [`RestartPolicy::Replica`]
    /// the others go on.
    pub fn quorum_config(
        world_size: usize,
        given: impl Into<Option<RestartPolicy>>,
        collective_timeout: Duration,
    ) -> QuorumConfig {
        let rule = match given.into() {
            Some(policy) => PolicyRule::Given(policy),
            None => PolicyRule::FromWorkers,
        };
        QuorumConfig::new(world_size)
            .with_timeout(collective_timeout)
            .with_restart(rule)
    }
}

fn invalid(field: &'static str, value: String) -> RendezvousError {
    RendezvousError::InvalidConfig {
        field,
        value,
        expected: "what `afterburner launch` sets (a number; RANK below WORLD_SIZE, LOCAL_RANK \
                   below LOCAL_WORLD_SIZE, both sizes at least 1)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn a_process_not_launched_reads_none() {
        assert_eq!(Launched::from_vars(vars(&[("RANK", "1")])), Ok(None));
    }

    #[test]
    fn what_the_launcher_writes_reads_back() {
        let launched = Launched {
            rank: 3,
            world_size: 4,
            local_rank: 1,
            local_world_size: 2,
            node_rank: 1,
            lighthouse: "10.0.0.1:29500".into(),
            restart_count: 2,
            policy: Some(RestartPolicy::Replica),
            collective_timeout: Duration::from_secs(30),
            engine: Engine::Tcp,
        };
        let written = launched.to_vars();
        let pairs: Vec<(&str, &str)> = written.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert!(pairs.contains(&(MASTER_ADDR, "10.0.0.1")));
        assert!(pairs.contains(&(MASTER_PORT, "29500")));
        assert_eq!(
            Launched::from_vars(vars(&pairs)),
            Ok(Some(launched.clone()))
        );
        // `auto`: the workers' strategy settles the policy.
        let auto = Launched {
            policy: None,
            ..launched
        };
        let written = auto.to_vars();
        let pairs: Vec<(&str, &str)> = written.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert!(pairs.contains(&(RESTART_POLICY, "auto")));
        assert_eq!(Launched::from_vars(vars(&pairs)), Ok(Some(auto)));
    }

    /// Issue 41: values no launcher writes are named errors, never a panic or a setting the
    /// user did not give.
    #[test]
    fn an_absurd_timeout_or_local_size_is_named() {
        let base = [(LIGHTHOUSE, "127.0.0.1:1"), (RANK, "0"), (WORLD_SIZE, "2")];
        for timeout in ["1e300", "inf", "0", "-3", "nan", "604801"] {
            let mut pairs = base.to_vec();
            pairs.push((COLLECTIVE_TIMEOUT_S, timeout));
            let error = Launched::from_vars(vars(&pairs)).unwrap_err().to_string();
            assert!(
                error.contains(COLLECTIVE_TIMEOUT_S) && error.contains("one week"),
                "{timeout}: {error}"
            );
        }
        for (local_rank, local_size) in [("0", "0"), ("2", "2")] {
            let mut pairs = base.to_vec();
            pairs.extend([(LOCAL_RANK, local_rank), (LOCAL_WORLD_SIZE, local_size)]);
            let error = Launched::from_vars(vars(&pairs)).unwrap_err().to_string();
            assert!(error.contains(LOCAL_WORLD_SIZE), "{error}");
            assert!(!error.contains("devices"), "{error}");
        }
        assert_eq!(timeout(604800.0), Some(Duration::from_secs(604800)));
        assert_eq!(timeout(1e300), None);
    }

    /// Under `mpirun` the rank and sizes are Open MPI's; the launcher writes none of them.
    #[test]
    fn a_rank_started_by_mpirun_reads_open_mpis_variables() {
        use crate::engine::{MPI_LOCAL_RANK, MPI_LOCAL_SIZE, MPI_RANK, MPI_WORLD_SIZE};
        let job = Launched {
            rank: 0,
            world_size: 4,
            local_rank: 0,
            local_world_size: 1,
            node_rank: 0,
            lighthouse: "127.0.0.1:29500".into(),
            restart_count: 1,
            policy: None,
            collective_timeout: Duration::from_secs(30),
            engine: Engine::Mpi,
        };
        let written = job.to_vars();
        let names: Vec<&str> = written.iter().map(|(k, _)| *k).collect();
        for per_rank in [RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK] {
            assert!(!names.contains(&per_rank), "{per_rank} written for mpirun");
        }
        let mut pairs: Vec<(&str, &str)> = written.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pairs.extend([
            (MPI_RANK, "3"),
            (MPI_WORLD_SIZE, "4"),
            (MPI_LOCAL_RANK, "1"),
            (MPI_LOCAL_SIZE, "2"),
        ]);
        let read = Launched::from_vars(vars(&pairs)).unwrap().unwrap();
        assert_eq!(
            (
                read.rank,
                read.world_size,
                read.local_rank,
                read.local_world_size
            ),
            (3, 4, 1, 2)
        );
        assert_eq!((read.engine, read.restart_count), (Engine::Mpi, 1));
        // Outside mpirun, or with another job's size, the variable is named.
        let outside: Vec<(&str, &str)> = written.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let error = Launched::from_vars(vars(&outside)).unwrap_err().to_string();
        assert!(error.contains(MPI_RANK), "{error}");
        pairs.retain(|(k, _)| *k != MPI_WORLD_SIZE);
        pairs.push((MPI_WORLD_SIZE, "8"));
        let error = Launched::from_vars(vars(&pairs)).unwrap_err().to_string();
        assert!(error.contains("mpirun started 8 ranks"), "{error}");
    }

    #[test]
    fn a_malformed_variable_is_named() {
        let error = Launched::from_vars(vars(&[
            (LIGHTHOUSE, "127.0.0.1:1"),
            (RANK, "two"),
            (WORLD_SIZE, "2"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(error.contains("RANK = two"), "{error}");
        let error = Launched::from_vars(vars(&[
            (LIGHTHOUSE, "127.0.0.1:1"),
            (RANK, "2"),
            (WORLD_SIZE, "2"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(error.contains("2 of WORLD_SIZE 2"), "{error}");
        let error = Launched::from_vars(vars(&[
            (LIGHTHOUSE, "127.0.0.1:1"),
            (RANK, "0"),
            (WORLD_SIZE, "2"),
            (RESTART_POLICY, "some"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(error.contains("all or replica"), "{error}");
    }
}
