//! The launch itself: serve the rendezvous, start the workers, watch them, restart them by
//! the policy (given, or settled by the workers' strategy at the rendezvous), forward
//! signals, and come back with the exit code.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use afterburner_rendezvous::launched::token;
use afterburner_rendezvous::{
    Engine, Launched, LighthouseServer, RestartPolicy, Settled, ask_restart_policy, launched,
};

use crate::LaunchError;
use crate::args::{EngineChoice, LaunchArgs, PolicyChoice};
use crate::blame::{Blame, blame};
use crate::worker::{Worker, describe, exit_code};

/// How often the workers are looked at.
const POLL: Duration = Duration::from_millis(20);
/// How long the other ranks get to end by themselves after one failed (their collectives fail
/// at once under the `all` policy) before they are killed.
const FAIL_GRACE: Duration = Duration::from_secs(3);
/// How long a launcher of another node waits for node 0's lighthouse when it asks for the
/// settled restart policy.
const ASK_WAIT: Duration = Duration::from_secs(2);
/// How long node 0 retries serving the rendezvous port the last attempt used.
const REBIND: Duration = Duration::from_secs(10);

/// Runs the launch `args` describes and returns the exit code for the launcher: 0 when every
/// worker succeeded, a worker's code when the run was stopped by a signal.
///
/// The restart policy is the one given, or under `auto` the one the workers settle at the
/// rendezvous: each declares its strategy and the policy it needs (`replica` where replicas
/// heal alone), and the lighthouse refuses a worker that does not fit. Until a worker has
/// declared one (a program that never meets the rendezvous) a failure restarts every worker.
pub fn launch(args: &LaunchArgs) -> Result<i32, LaunchError> {
    let given = match args.policy {
        PolicyChoice::Fixed(policy) => Some(policy),
        PolicyChoice::Auto => None,
    };
    let engine = crate::mpi_job::engine(args)?;
    let signals = Signals::catch()?;
    let policy = match given {
        Some(policy) => format!("`{policy}`"),
        None => "`auto` (the workers' strategy settles it)".to_string(),
    };
    eprintln!(
        "afterburner launch: {} worker(s) on this node, {} in all, restart policy {policy}, \
         --max-restarts {}, engine `{engine}`",
        args.nproc,
        args.nproc * args.nnodes,
        args.max_restarts
    );
    let mut launch = Supervisor {
        args,
        given,
        signals,
        address: args.rdzv.clone(),
        restarts: 0,
        restarts_of: vec![0; args.nproc],
        started_after_the_end: vec![false; args.nproc],
        announced: given,
        engine,
    };
    // After the first attempt the last one's port may still be held a moment: serve retries.
    let mut again = false;
    loop {
        let server = serve(args, given, &launch.address, again)?;
        again = true;
        if let Some(server) = &server {
            launch.address = retarget(&launch.address, server);
        }
        let mut workers = match launch.engine {
            Engine::Tcp => start(args, given, &launch.address, &launch.restarts_of)?,
            Engine::Mpi => {
                let job = place(args, given, &launch.address, 0, launch.restarts_of[0]);
                let job = Launched {
                    engine: Engine::Mpi,
                    ..job
                };
                vec![Worker::start_job(crate::mpi_job::command(args, &job)?)?]
            }
        };
        match launch.watch(server.as_ref(), &mut workers)? {
            Watched::Ended(code) => return Ok(code),
            Watched::OnTcp => drop(server),
            Watched::RestartAll => {
                drop(server);
                launch.restarts_of.iter_mut().for_each(|r| *r += 1);
                eprintln!(
                    "afterburner launch: restarting all {} worker(s) (restart {} of {}); they \
                     resume from the last checkpoint",
                    workers.len(),
                    launch.restarts,
                    args.max_restarts
                );
            }
        }
    }
}

/// How one rendezvous of the launch ended.
enum Watched {
    /// The launch is over, with this exit code.
    Ended(i32),
    /// A worker failed under the `all` policy: start every worker again.
    RestartAll,
    /// The workers' strategy heals alone, which mpirun cannot serve: start them again on the
    /// `tcp` engine (not a restart: nothing has trained yet).
    OnTcp,
}

/// The launch's state across its rendezvous.
struct Supervisor<'a> {
    args: &'a LaunchArgs,
    /// The policy given to the launcher (`None`: `auto`).
    given: Option<RestartPolicy>,
    signals: Signals,
    /// The rendezvous address (with the port node 0 actually serves).
    address: String,
    /// Restarts so far (of all workers under `all`, of one under `replica`).
    restarts: u32,
    /// Each local worker's restarts.
    restarts_of: Vec<u32>,
    /// Each local worker was started again after the run ended (to end with its final state;
    /// failing then, it is not started once more).
    started_after_the_end: Vec<bool>,
    /// The policy last printed.
    announced: Option<RestartPolicy>,
    /// The engine the workers run on.
    engine: Engine,
}

impl Supervisor<'_> {
    /// Watches `workers` until the launch ends or every worker must start again; restarts a
    /// dead replica alone under `replica`.
    fn watch(
        &mut self,
        server: Option<&LighthouseServer>,
        workers: &mut [Worker],
    ) -> Result<Watched, LaunchError> {
        let args = self.args;
        let mut finished_early: Option<usize> = None;
        loop {
            if let Some(signal) = self.signals.received() {
                let code = stop(workers, signal, args.stop_timeout, &self.signals);
                return Ok(Watched::Ended(code));
            }
            if let Some(settled) = server.and_then(|s| s.lighthouse().restart_policy()) {
                self.announce(&settled);
                if self.engine == Engine::Mpi && settled.policy == RestartPolicy::Replica {
                    return self.leave_mpi(workers, &settled);
                }
            }
            for local in 0..workers.len() {
                let Some(status) = workers[local].poll()? else {
                    continue;
                };
                if status.success() {
                    finished_early.get_or_insert(workers[local].rank);
                    continue;
                }
                match self.policy(server) {
                    RestartPolicy::Replica => self.restart_alone(server, workers, local, status)?,
                    RestartPolicy::All => {
                        let failed = (workers[local].rank, status);
                        self.stop_all(server, workers, failed, finished_early)?;
                        return Ok(Watched::RestartAll);
                    }
                }
            }
            if workers.iter_mut().all(|w| !w.running()) {
                flush(workers);
                return Ok(Watched::Ended(0));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The policy a failure is handled by: the given one, else the one the workers settled
    /// (node 0 reads its lighthouse, other nodes ask it), else `all`.
    fn policy(&mut self, server: Option<&LighthouseServer>) -> RestartPolicy {
        if let Some(given) = self.given {
            return given;
        }
        let settled = match server {
            Some(server) => server.lighthouse().restart_policy(),
            None => ask_restart_policy(self.address.as_str(), ASK_WAIT, token().as_deref())
                .ok()
                .flatten(),
        };
        match settled {
            Some(settled) => {
                self.announce(&settled);
                settled.policy
            }
            None => RestartPolicy::All,
        }
    }

    /// The workers under mpirun declared a strategy whose replicas heal alone (settled
    /// `replica`): under `--engine auto` they start again on `tcp`; under `--engine mpi`
    /// the launch fails naming why.
    fn leave_mpi(
        &mut self,
        workers: &mut [Worker],
        settled: &Settled,
    ) -> Result<Watched, LaunchError> {
        end_all(workers, Duration::ZERO);
        let why = format!(
            "{} heals alone (restart policy `replica`), which mpirun cannot serve: it stops \
             the whole job when a rank dies",
            settled.by
        );
        if self.args.engine == EngineChoice::Fixed(Engine::Mpi) {
            return Err(LaunchError::Usage(format!(
                "--engine mpi: {why}; use --engine tcp or auto"
            )));
        }
        eprintln!("afterburner launch: {why}; starting the workers again on the tcp engine");
        self.engine = Engine::Tcp;
        Ok(Watched::OnTcp)
    }

    /// Prints the settled policy once (again when it changes).
    fn announce(&mut self, settled: &Settled) {
        if self.announced != Some(settled.policy) {
            self.announced = Some(settled.policy);
            eprintln!(
                "afterburner launch: restart policy `{}`, settled by {}",
                settled.policy, settled.by
            );
        }
    }

    /// The `replica` policy: the dead worker `local` alone is started again (it joins and is
    /// healed from a live replica), up to `--max-restarts` times in all. On one node, a worker
    /// that fails once every other has finished is not started again (no live replica could
    /// heal it): the launch fails naming it. Unless the run had ended (the live replicas
    /// finished training and said so to the lighthouse): then the restarted one is told so and
    /// ends with the run's final state (exiting with an error then, it is not started again:
    /// the launch fails naming it).
    fn restart_alone(
        &mut self,
        server: Option<&LighthouseServer>,
        workers: &mut [Worker],
        local: usize,
        status: std::process::ExitStatus,
    ) -> Result<(), LaunchError> {
        let args = self.args;
        let rank = workers[local].rank;
        let message = format!("rank {rank} {}", describe(status));
        let ended = server.is_some_and(|s| s.lighthouse().ended_at().is_some());
        // Started again to end with the run's final state, it exited with an error (a kill
        // is not its failure: it is started again).
        if ended && self.started_after_the_end[local] && status.code().is_some() {
            let last_output = workers[local].last_output();
            end_all(workers, FAIL_GRACE);
            return Err(LaunchError::FailedAfterTheEnd {
                failure: message,
                last_output,
            });
        }
        if args.nnodes == 1 && !others_running(workers, local) && !ended {
            // Every other replica has finished (or failed for good): a restarted one would
            // find no live replica to heal from and fail again, restart after restart.
            let last_output = workers[local].last_output();
            end_all(workers, FAIL_GRACE);
            return Err(LaunchError::NoLiveReplica {
                failure: message,
                last_output,
            });
        }
        if self.restarts == args.max_restarts {
            let last_output = workers[local].last_output();
            end_all(workers, FAIL_GRACE);
            return Err(LaunchError::RestartsExhausted {
                failure: message,
                max_restarts: args.max_restarts,
                last_output,
            });
        }
        self.restarts += 1;
        self.restarts_of[local] += 1;
        self.started_after_the_end[local] |= ended;
        eprintln!(
            "afterburner launch: {message}; starting it again alone (restart {} of {}): it is \
             healed from a live replica",
            self.restarts, args.max_restarts
        );
        let launched = place(
            args,
            self.given,
            &self.address,
            local,
            self.restarts_of[local],
        );
        workers[local] = Worker::start(&args.program, &launched)?;
        Ok(())
    }

    /// The `all` policy: any failure stops every worker, naming the rank that failed first;
    /// an error once `--max-restarts` are used up, or when a rank had returned early.
    fn stop_all(
        &mut self,
        server: Option<&LighthouseServer>,
        workers: &mut [Worker],
        failure: (usize, std::process::ExitStatus),
        finished_early: Option<usize>,
    ) -> Result<(), LaunchError> {
        let departures = || {
            server
                .map(|server| server.lighthouse().departures())
                .unwrap_or_default()
        };
        let Blame { rank, message } = blame(workers, failure, departures)?;
        eprintln!("afterburner launch: {message}; stopping the other ranks");
        let last_output = workers
            .iter()
            .find(|w| w.rank == rank)
            .map(Worker::last_output)
            .unwrap_or_default();
        end_all(workers, FAIL_GRACE);
        if let Some(early) = finished_early.filter(|early| *early != rank) {
            return Err(LaunchError::ExitedEarly {
                rank: early,
                then: message,
            });
        }
        if self.restarts == self.args.max_restarts {
            return Err(LaunchError::RestartsExhausted {
                failure: message,
                max_restarts: self.args.max_restarts,
                last_output,
            });
        }
        self.restarts += 1;
        Ok(())
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
    given: Option<RestartPolicy>,
    address: &str,
    restart: bool,
) -> Result<Option<LighthouseServer>, LaunchError> {
    if args.node_rank != 0 {
        return Ok(None);
    }
    let config = Launched::quorum_config(args.nproc * args.nnodes, given, args.collective_timeout);
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
    policy: Option<RestartPolicy>,
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
        engine: Engine::Tcp,
    }
}

/// Starts every worker of this node (worker `local` restarted `restarts_of[local]` times).
fn start(
    args: &LaunchArgs,
    policy: Option<RestartPolicy>,
    address: &str,
    restarts_of: &[u32],
) -> Result<Vec<Worker>, LaunchError> {
    (0..args.nproc)
        .map(|local| {
            let launched = place(args, policy, address, local, restarts_of[local]);
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
