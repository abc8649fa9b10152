//! The launch itself: serve the rendezvous, start the workers, watch them, restart them by
//! the policy, forward signals, and come back with the exit code.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use afterburner_rendezvous::{Launched, LighthouseServer, RestartPolicy, launched};

use crate::LaunchError;
use crate::args::{LaunchArgs, PolicyChoice};
use crate::blame::{Blame, blame};
use crate::policy::policy_for;
use crate::worker::{Worker, describe, exit_code};

/// How often the workers are looked at.
const POLL: Duration = Duration::from_millis(20);
/// How long the other ranks get to end by themselves after one failed (their collectives fail
/// at once under the `all` policy) before they are killed.
const FAIL_GRACE: Duration = Duration::from_secs(3);
/// How long node 0 retries serving the rendezvous port the last attempt used.
const REBIND: Duration = Duration::from_secs(10);

/// Runs the launch `args` describes and returns the exit code for the launcher: 0 when every
/// worker succeeded, a worker's code when the run was stopped by a signal.
pub fn launch(args: &LaunchArgs) -> Result<i32, LaunchError> {
    let policy = match args.policy {
        PolicyChoice::Fixed(policy) => policy,
        PolicyChoice::Auto => policy_for(args.program.get(1..).unwrap_or_default()),
    };
    let signals = Signals::catch()?;
    eprintln!(
        "afterburner launch: {} worker(s) on this node, {} in all, restart policy `{policy}`, \
         --max-restarts {}",
        args.nproc,
        args.nproc * args.nnodes,
        args.max_restarts
    );
    match policy {
        RestartPolicy::All => restart_all(args, &signals),
        RestartPolicy::Replica => restart_replicas(args, &signals),
    }
}

/// The `all` policy: any failure stops every worker; all start again (their program resumes
/// from the last checkpoint), with a fresh rendezvous, up to `--max-restarts` times.
fn restart_all(args: &LaunchArgs, signals: &Signals) -> Result<i32, LaunchError> {
    let mut address = args.rdzv.clone();
    let mut restart = 0;
    loop {
        let server = serve(args, RestartPolicy::All, &address, restart > 0)?;
        if let Some(server) = &server {
            address = retarget(&address, server);
        }
        let mut workers = start(args, RestartPolicy::All, &address, |_| restart)?;
        let mut finished_early: Option<usize> = None;
        let failure = loop {
            if let Some(signal) = signals.received() {
                return Ok(stop(&mut workers, signal, args.stop_timeout, signals));
            }
            let mut failed = None;
            for worker in &mut workers {
                match worker.poll()? {
                    Some(status) if status.success() => {
                        finished_early.get_or_insert(worker.rank);
                    }
                    Some(status) => {
                        failed = Some((worker.rank, status));
                        break;
                    }
                    None => {}
                }
            }
            if let Some(failed) = failed {
                break failed;
            }
            if workers.iter_mut().all(|w| !w.running()) {
                flush(&mut workers);
                return Ok(0);
            }
            std::thread::sleep(POLL);
        };
        let departures = || {
            server
                .as_ref()
                .map(|server| server.lighthouse().departures())
                .unwrap_or_default()
        };
        let Blame { rank, message } = blame(&mut workers, failure, departures)?;
        eprintln!("afterburner launch: {message}; stopping the other ranks");
        let last_output = workers
            .iter()
            .find(|w| w.rank == rank)
            .map(Worker::last_output)
            .unwrap_or_default();
        end_all(&mut workers, FAIL_GRACE);
        if let Some(early) = finished_early.filter(|early| *early != rank) {
            return Err(LaunchError::ExitedEarly {
                rank: early,
                then: message,
            });
        }
        if restart == args.max_restarts {
            return Err(LaunchError::RestartsExhausted {
                failure: message,
                max_restarts: args.max_restarts,
                last_output,
            });
        }
        drop(server);
        restart += 1;
        eprintln!(
            "afterburner launch: restarting all {} worker(s) (restart {} of {}); they resume \
             from the last checkpoint",
            workers.len(),
            restart,
            args.max_restarts
        );
    }
}

/// The `replica` policy: the lighthouse runs for the whole launch; a dead worker alone is
/// started again (it joins and is healed from a live replica), up to `--max-restarts` times
/// in all; a worker that succeeds is done. On one node, a worker that fails once every other
/// has finished is not started again (no live replica could heal it): the launch fails naming
/// it.
fn restart_replicas(args: &LaunchArgs, signals: &Signals) -> Result<i32, LaunchError> {
    let server = serve(args, RestartPolicy::Replica, &args.rdzv, false)?;
    let address = match &server {
        Some(server) => retarget(&args.rdzv, server),
        None => args.rdzv.clone(),
    };
    let mut restarts_of = vec![0u32; args.nproc];
    let mut workers = start(args, RestartPolicy::Replica, &address, |_| 0)?;
    let mut restarts = 0;
    loop {
        if let Some(signal) = signals.received() {
            return Ok(stop(&mut workers, signal, args.stop_timeout, signals));
        }
        for local in 0..workers.len() {
            let Some(status) = workers[local].poll()? else {
                continue;
            };
            if status.success() {
                continue;
            }
            let rank = workers[local].rank;
            let message = format!("rank {rank} {}", describe(status));
            if args.nnodes == 1 && !others_running(&mut workers, local) {
                // Every other replica has finished (or failed for good): a restarted one
                // would find no live replica to heal from and fail again, restart after
                // restart.
                let last_output = workers[local].last_output();
                end_all(&mut workers, FAIL_GRACE);
                return Err(LaunchError::NoLiveReplica {
                    failure: message,
                    last_output,
                });
            }
            if restarts == args.max_restarts {
                let last_output = workers[local].last_output();
                end_all(&mut workers, FAIL_GRACE);
                return Err(LaunchError::RestartsExhausted {
                    failure: message,
                    max_restarts: args.max_restarts,
                    last_output,
                });
            }
            restarts += 1;
            restarts_of[local] += 1;
            eprintln!(
                "afterburner launch: {message}; starting it again alone (restart {restarts} of \
                 {}): it is healed from a live replica",
                args.max_restarts
            );
            let launched = place(
                args,
                RestartPolicy::Replica,
                &address,
                local,
                restarts_of[local],
            );
            workers[local] = Worker::start(&args.program, &launched)?;
        }
        if workers.iter_mut().all(|w| !w.running()) {
            flush(&mut workers);
            return Ok(0);
        }
        std::thread::sleep(POLL);
    }
}

/// Whether a worker other than `local` still runs (one that can donate its state).
fn others_running(workers: &mut [Worker], local: usize) -> bool {
    (0..workers.len()).any(|other| other != local && workers[other].running())
}

/// Node 0 serves the lighthouse at `address` for the launch's workers (on a restart, retrying
/// a port the last attempt still held); other nodes serve nothing.
fn serve(
    args: &LaunchArgs,
    policy: RestartPolicy,
    address: &str,
    restart: bool,
) -> Result<Option<LighthouseServer>, LaunchError> {
    if args.node_rank != 0 {
        return Ok(None);
    }
    let config = Launched::quorum_config(args.nproc * args.nnodes, policy, args.collective_timeout);
    let deadline = Instant::now() + if restart { REBIND } else { Duration::ZERO };
    loop {
        match LighthouseServer::bind_with_token(address, config, launched::token()) {
            Ok(server) => return Ok(Some(server)),
            Err(e) if Instant::now() >= deadline || !address_in_use(&e.to_string()) => {
                return Err(LaunchError::Rendezvous {
                    address: address.to_string(),
                    reason: match address_in_use(&e.to_string()) {
                        true => format!(
                            "the port is in use (another launch or program holds it: pick \
                             another --rdzv port): {e}"
                        ),
                        false => e.to_string(),
                    },
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn address_in_use(message: &str) -> bool {
    message.contains("in use") || message.contains("AddrInUse")
}

/// `address` with the port the server actually listens on (for `HOST:0`).
fn retarget(address: &str, server: &LighthouseServer) -> String {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    format!("{host}:{}", server.address().port())
}

/// Worker `local` of this node's place in the launch.
fn place(
    args: &LaunchArgs,
    policy: RestartPolicy,
    address: &str,
    local: usize,
    restart_count: u32,
) -> Launched {
    Launched {
        rank: args.node_rank * args.nproc + local,
        world_size: args.nproc * args.nnodes,
        local_rank: local,
        local_world_size: args.nproc,
        node_rank: args.node_rank,
        lighthouse: address.to_string(),
        restart_count,
        policy,
        collective_timeout: args.collective_timeout,
    }
}

/// Starts every worker of this node.
fn start(
    args: &LaunchArgs,
    policy: RestartPolicy,
    address: &str,
    restart_count: impl Fn(usize) -> u32,
) -> Result<Vec<Worker>, LaunchError> {
    (0..args.nproc)
        .map(|local| {
            let launched = place(args, policy, address, local, restart_count(local));
            Worker::start(&args.program, &launched)
        })
        .collect()
}

/// Forwards `signal` to every worker, gives them `timeout` to stop (a graceful-stop save
/// included), kills those still running, and returns the launch's exit code: the first
/// failed worker's, or 0 when all stopped cleanly. A second signal kills at once.
fn stop(workers: &mut [Worker], signal: i32, timeout: Duration, signals: &Signals) -> i32 {
    eprintln!(
        "afterburner launch: signal {signal} received; forwarding it to the workers (a second \
         one kills them)"
    );
    for worker in workers.iter() {
        worker.signal(signal);
    }
    let deadline = Instant::now() + timeout;
    while workers.iter_mut().any(Worker::running) {
        if Instant::now() >= deadline || signals.received().is_some() {
            eprintln!("afterburner launch: killing the workers still running");
            break;
        }
        std::thread::sleep(POLL);
    }
    end_all(workers, Duration::ZERO);
    workers
        .iter()
        .filter_map(|w| w.status)
        .find(|status| !status.success())
        .map_or(0, exit_code)
}

/// Gives the workers still running `grace` to end, then kills them, and reaps them all.
fn end_all(workers: &mut [Worker], grace: Duration) {
    let deadline = Instant::now() + grace;
    while workers.iter_mut().any(Worker::running) && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    for worker in workers.iter_mut() {
        if worker.running() {
            worker.signal(libc::SIGKILL);
        }
    }
    while workers.iter_mut().any(Worker::running) {
        std::thread::sleep(POLL);
    }
    flush(workers);
}

fn flush(workers: &mut [Worker]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    for worker in workers {
        worker.flush_output(deadline);
    }
}

/// SIGINT and SIGTERM, caught for the launch (the last one received, taken once).
struct Signals(Arc<AtomicUsize>);

impl Signals {
    fn catch() -> Result<Self, LaunchError> {
        let last = Arc::new(AtomicUsize::new(0));
        for signal in [libc::SIGINT, libc::SIGTERM] {
            signal_hook::flag::register_usize(signal, last.clone(), signal as usize)
                .map_err(|e| LaunchError::Os(format!("catching signal {signal}: {e}")))?;
        }
        Ok(Self(last))
    }

    /// The signal received since the last look, if any.
    fn received(&self) -> Option<i32> {
        match self.0.swap(0, Ordering::SeqCst) {
            0 => None,
            signal => Some(signal as i32),
        }
    }
}
