//! Which failure of an attempt to report first: the real cause, not the ranks whose
//! collectives failed because of it. A rank killed by a signal comes first; then a rank the
//! lighthouse dropped for missing a collective's timeout (stopped, stalled or hung); then the
//! ranks in the order they left the lighthouse (the first to go is the first to fail); the
//! order the launcher happened to poll them in decides last.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use afterburner_rendezvous::Departure;

use crate::LaunchError;
use crate::worker::{Worker, describe};

/// How long the launcher keeps looking at the other workers once one failed, so that a rank
/// that died first but was not polled first is seen too.
const SETTLE: Duration = Duration::from_millis(150);

/// The failure to report: the rank it names and the message.
pub(crate) struct Blame {
    /// The rank of the cause.
    pub rank: usize,
    /// "rank 1 was killed by signal 9 (SIGKILL); rank 0 failed after it (exited with code 2)".
    pub message: String,
}

/// Why the attempt failed, from every worker that failed within [`SETTLE`] of the first one
/// seen, `first`, and the lighthouse's `departures` (empty where this node serves none).
pub(crate) fn blame(
    workers: &mut [Worker],
    first: (usize, ExitStatus),
    departures: impl Fn() -> Vec<Departure>,
) -> Result<Blame, LaunchError> {
    let deadline = Instant::now() + SETTLE;
    let mut failed = vec![first];
    loop {
        for worker in workers.iter_mut() {
            if let Some(status) = worker.poll()?
                && !status.success()
                && !failed.iter().any(|(rank, _)| *rank == worker.rank)
            {
                failed.push((worker.rank, status));
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let departures = departures();
    let left_at = |rank: usize| {
        departures
            .iter()
            .position(|d| d.replica == rank)
            .unwrap_or(usize::MAX)
    };
    failed.sort_by_key(|(rank, status)| (status.signal().is_none(), left_at(*rank)));
    let stalled = departures
        .iter()
        .find(|d| d.timed_out && !failed.iter().any(|(rank, _)| *rank == d.replica));
    let mut causes: Vec<String> = failed
        .iter()
        .map(|(rank, status)| format!("{} {}", name(workers, *rank), describe(*status)))
        .collect();
    let mut rank = failed[0].0;
    if let Some(stalled) = stalled
        && failed[0].1.signal().is_none()
    {
        rank = stalled.replica;
        causes.insert(
            0,
            format!(
                "rank {} did not reach a collective in time ({}: it is stopped, stalled or hung; \
                 see --collective-timeout)",
                stalled.replica, stalled.reason
            ),
        );
    }
    // `failed` holds `first`, so there is a cause.
    let mut message = causes.remove(0);
    if !causes.is_empty() {
        message = format!("{message}; then {}", causes.join(", "));
    }
    Ok(Blame { rank, message })
}

/// How messages call the worker of `rank`: `rank N`, or for an `mpirun` job that name with
/// what mpirun said of the rank that ended it (`process rank 2 ... exited on signal 9`).
fn name(workers: &[Worker], rank: usize) -> String {
    let Some(worker) = workers.iter().find(|w| w.rank == rank) else {
        return format!("rank {rank}");
    };
    let noticed = worker
        .last_output()
        .into_iter()
        .find(|line| line.contains("process rank"));
    match (worker.is_job(), noticed) {
        (true, Some(line)) => {
            let said = line.trim_start_matches("[mpirun]").trim();
            format!("{} ({said})", worker.name())
        }
        _ => worker.name(),
    }
}
