//! [`LaunchError`]: what stops a launch, each naming what is wrong.

use thiserror::Error;

/// Why a launch failed.
#[derive(Debug, Error)]
pub enum LaunchError {
    /// The command line is wrong (clap's message: the option, the value, what is allowed).
    #[error("{0}")]
    Usage(String),
    /// The program could not be started.
    #[error("cannot start `{program}`: {reason}")]
    Program {
        /// The program as given.
        program: String,
        /// Why (not found, not executable, ...).
        reason: String,
    },
    /// The rendezvous (the lighthouse) could not be served.
    #[error("cannot serve the rendezvous on {address}: {reason}")]
    Rendezvous {
        /// The address asked for.
        address: String,
        /// Why (e.g. the port is in use).
        reason: String,
    },
    /// Under the `all` policy a worker exited successfully while the others still ran and
    /// then failed: its ranks needed it until the end.
    #[error(
        "rank {rank} exited with success while the other ranks still ran, and then {then}; \
         under the `all` restart policy (DDP, ZeRO-1, FSDP) every rank takes part until the \
         last collective: a worker must not return early"
    )]
    ExitedEarly {
        /// The rank that returned early.
        rank: usize,
        /// What happened to the others.
        then: String,
    },
    /// Under the `replica` policy a worker failed after every other replica of this launch had
    /// finished: a restart would find no live replica to heal it from.
    #[error(
        "{failure} after every other replica had finished: no live replica is left to heal it \
         from, so it is not started again (the others' results stand; its last state is its \
         newest checkpoint){}",
        last_lines(.last_output)
    )]
    NoLiveReplica {
        /// The failure.
        failure: String,
        /// The failed worker's last lines of output.
        last_output: Vec<String>,
    },
    /// Under the `replica` policy a worker started again after the run ended (to end with the
    /// run's final state) failed at that.
    #[error(
        "{failure}: it was started again after the run ended, to end with the run's final \
         checkpoint, and failed (the other replicas' results stand){}",
        last_lines(.last_output)
    )]
    FailedAfterTheEnd {
        /// The failure.
        failure: String,
        /// The failed worker's last lines of output.
        last_output: Vec<String>,
    },
    /// A worker failed after `--max-restarts` restarts.
    #[error(
        "{failure} and --max-restarts {max_restarts} is used up{}",
        last_lines(.last_output)
    )]
    RestartsExhausted {
        /// The last failure.
        failure: String,
        /// The launch's `--max-restarts`.
        max_restarts: u32,
        /// The failed worker's last lines of output.
        last_output: Vec<String>,
    },
    /// Starting or watching processes failed in the operating system.
    #[error("{0}")]
    Os(String),
}

fn last_lines(lines: &[String]) -> String {
    match lines.is_empty() {
        true => String::new(),
        false => format!("; its last output:\n  {}", lines.join("\n  ")),
    }
}
