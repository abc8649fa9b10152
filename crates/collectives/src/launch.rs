//! [`launch`]: one worker thread per device, like Lightning Fabric's `launch`.

use std::any::TypeId;
use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use burn::tensor::backend::{Backend, Device, DeviceId};
use burn_collective::{CollectiveConfig, PeerId};

use crate::local::{Health, LocalGroup};
use crate::{Lighthouse, LocalReplicas, ParallelError, QuorumConfig, QuorumGroup};

/// Settings of [`launch`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaunchConfig {
    /// How long a collective may wait for the other ranks before the whole launch fails
    /// (a peer that hangs or never calls). Default 300 s.
    pub timeout: Duration,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(300),
        }
    }
}

/// How often the watchdog looks at the ranks.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(20);

/// Runs `worker` once per device, each on its own thread with a [`LocalGroup`] of rank `i`,
/// and returns their results in rank order.
///
/// If a worker returns an error or panics, the others' collectives fail at once with
/// [`ParallelError::PeerFailed`] (their pending calls are unblocked), and `launch` returns
/// that error. The group's ranks are fixed: a worker that returns successfully while another
/// still calls a collective fails that collective the same way (never a smaller group); a collective that waits longer than `config.timeout` fails the same way with
/// [`ParallelError::Timeout`]. Never a hang: after a failure `launch` waits at most
/// `config.timeout` for the workers to return.
///
/// `B` is the backend the collectives run on: the *inner* backend of an autodiff training
/// backend (`Flex` for `Autodiff<Flex>`). One launch per backend type runs at a time in a
/// process (burn-collective keeps one server per backend); concurrent calls wait their turn.
pub fn launch<B, R, E, F>(
    devices: Vec<B::Device>,
    config: LaunchConfig,
    worker: F,
) -> Result<Vec<R>, ParallelError>
where
    B: Backend,
    R: Send + 'static,
    E: Display,
    F: Fn(LocalGroup<B>) -> Result<R, E> + Send + Sync + 'static,
{
    launch_exchanging(devices, config, worker, false)
}

/// [`launch`] with the ranks exchanging through the host whatever the backend (what ranks
/// sharing a GPU do), so its failure handling is tested on the CPU.
#[cfg(feature = "testing")]
pub fn launch_through_host<B, R, E, F>(
    devices: Vec<B::Device>,
    config: LaunchConfig,
    worker: F,
) -> Result<Vec<R>, ParallelError>
where
    B: Backend,
    R: Send + 'static,
    E: Display,
    F: Fn(LocalGroup<B>) -> Result<R, E> + Send + Sync + 'static,
{
    launch_exchanging(devices, config, worker, true)
}

fn launch_exchanging<B, R, E, F>(
    devices: Vec<B::Device>,
    config: LaunchConfig,
    worker: F,
    host_exchange: bool,
) -> Result<Vec<R>, ParallelError>
where
    B: Backend,
    R: Send + 'static,
    E: Display,
    F: Fn(LocalGroup<B>) -> Result<R, E> + Send + Sync + 'static,
{
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let world = devices.len();
    if world == 0 {
        return Err(ParallelError::InvalidConfig {
            field: "devices",
            value: "[]".into(),
            expected: "at least one device".into(),
        });
    }
    // Ranks sharing a device of an asynchronous backend exchange through the host (see
    // `needs_host_exchange`); every rank of the launch then does, so they meet.
    let on_host = host_exchange
        || devices
            .iter()
            .any(|d| crate::local::needs_host_exchange::<B>(d, &devices));
    let (host, health) = match on_host {
        true => {
            // Strict: a lost rank fails the collective. Its own timeout is longer than the
            // watchdog's, so the watchdog names the late rank first and aborts the rest.
            let strict = QuorumConfig::new(world)
                .with_min_replicas(world)
                .with_timeout(config.timeout * 2);
            let lighthouse = Lighthouse::new(strict)?;
            let aborted = lighthouse.clone();
            let reset = Box::new(move || aborted.abort("another rank failed"));
            (Some(lighthouse), Arc::new(Health::new(world, reset)))
        }
        false => {
            claim_collective_server::<B>()?;
            burn_collective::reset_collective::<B>();
            let reset = Box::new(burn_collective::reset_collective::<B>);
            (None, Arc::new(Health::new(world, reset)))
        }
    };
    let worker = Arc::new(worker);
    let (done_tx, done) = mpsc::channel();
    for (rank, device) in devices.into_iter().enumerate() {
        let (shared, worker, done_tx) = (health.clone(), worker.clone(), done_tx.clone());
        let host = match &host {
            Some(lighthouse) => Some(lighthouse.replica::<B>(rank, &device)?),
            None => None,
        };
        let spawned = thread::Builder::new()
            .name(format!("afterburner-rank-{rank}"))
            .spawn(move || {
                let result = run_worker(rank, world, device, host, &shared, &*worker);
                let _ = done_tx.send((rank, result));
            });
        if let Err(e) = spawned {
            health.fail(ParallelError::PeerFailed {
                rank,
                reason: format!("cannot start its thread: {e}"),
            });
        }
    }
    drop(done_tx);
    collect(world, &health, config.timeout, done)
}

/// The backend types whose burn-collective server runs in this process.
static SERVED_BACKENDS: Mutex<Vec<TypeId>> = Mutex::new(Vec::new());

/// Errors instead of hanging when `B` would need one burn-collective server too many.
///
/// burn-collective serves each backend type from a task that blocks one thread of its tokio
/// runtime for the life of the process (a blocking channel read inside an async task), and the
/// runtime has `TOKIO_WORKER_THREADS` threads or one per core. A launch on one backend type
/// more than that never gets a server: its first collective would wait forever (seen on 2
/// cores: DDP on `Autocast<Flex>`, then fused wgpu, then `Flex`, in one process).
fn claim_collective_server<B: Backend>() -> Result<(), ParallelError> {
    let threads = std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()));
    let mut served = SERVED_BACKENDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    claim(&mut served, TypeId::of::<B>(), threads).map_err(|count| ParallelError::Collective {
        op: "launch",
        rank: 0,
        reason: format!(
            "this process already ran in-process collectives on {count} backend types, as many \
             as burn-collective's runtime has threads ({threads}): a launch on {} would hang. \
             Set TOKIO_WORKER_THREADS to more than the backend types one process uses, before \
             its first launch, or launch each backend in its own process",
            std::any::type_name::<B>()
        ),
    })
}

/// Adds `backend` to `served` unless that would exceed `threads`; errs with the count served.
fn claim(served: &mut Vec<TypeId>, backend: TypeId, threads: usize) -> Result<(), usize> {
    if served.contains(&backend) {
        return Ok(());
    }
    if served.len() >= threads {
        return Err(served.len());
    }
    served.push(backend);
    Ok(())
}

/// Registers the rank, runs the worker, and reports its outcome to the group.
fn run_worker<B, R, E, F>(
    rank: usize,
    world: usize,
    device: B::Device,
    host: Option<QuorumGroup<B>>,
    health: &Arc<Health>,
    worker: &F,
) -> Option<R>
where
    B: Backend,
    E: Display,
    F: Fn(LocalGroup<B>) -> Result<R, E>,
{
    let peer = PeerId(rank as u32);
    let on_collective = host.is_none();
    let config = CollectiveConfig::default().with_num_devices(world);
    if on_collective && let Err(e) = burn_collective::register::<B>(peer, device.clone(), config) {
        health.fail(health.failure().unwrap_or(ParallelError::Collective {
            op: "register",
            rank,
            reason: format!("{e:?}"),
        }));
        return None;
    }
    // This rank stays in the host exchange until the health has recorded how it ended, so a
    // stranded rank gets that (its name and reason), not a bare "fewer ranks".
    let _in_exchange = host.clone();
    let group = LocalGroup::new(rank, world, device, health.clone(), host);
    let outcome = catch_unwind(AssertUnwindSafe(|| worker(group)));
    let failure = match outcome {
        Ok(Ok(value)) => {
            health.returned(rank);
            if health.failure().is_none() && on_collective {
                let _ = burn_collective::finish_collective::<B>(peer);
            }
            return Some(value);
        }
        Ok(Err(e)) => e.to_string(),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            format!("panicked: {message}")
        }
    };
    health.fail(ParallelError::PeerFailed {
        rank,
        reason: failure,
    });
    None
}

/// Waits for the workers (watching for timeouts) and returns their results or the failure.
fn collect<R>(
    world: usize,
    health: &Health,
    timeout: Duration,
    done: mpsc::Receiver<(usize, Option<R>)>,
) -> Result<Vec<R>, ParallelError> {
    let mut results: Vec<Option<R>> = (0..world).map(|_| None).collect();
    let mut finished = 0;
    let mut give_up_at: Option<Instant> = None;
    while finished < world {
        health.check_timeouts(timeout);
        if health.failure().is_some() && give_up_at.is_none() {
            give_up_at = Some(Instant::now() + timeout);
        }
        if give_up_at.is_some_and(|t| Instant::now() > t) {
            break; // a worker is stuck outside any collective: leave it, report the failure
        }
        match done.recv_timeout(WATCHDOG_PERIOD) {
            Ok((rank, result)) => {
                results[rank] = result;
                finished += 1;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    if let Some(failure) = health.failure() {
        return Err(failure);
    }
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| {
            r.ok_or(ParallelError::PeerFailed {
                rank,
                reason: "returned no result".into(),
            })
        })
        .collect()
}

/// The most worker threads [`local_devices`] puts on a backend's single device.
pub const MAX_SHARED_WORKERS: usize = 256;

/// `n` devices of backend `B` for [`launch`], like Lightning's `devices=n`: devices `0..n` of
/// the default device's kind (e.g. the first `n` GPUs). On a backend with a single device (the
/// CPU) the `n` workers share it, at most [`MAX_SHARED_WORKERS`]. Errors when `n` is 0 or more
/// than the backend has.
pub fn local_devices<B: Backend>(n: usize) -> Result<Vec<B::Device>, ParallelError> {
    let invalid = |value: String| ParallelError::InvalidConfig {
        field: "devices",
        value,
        expected: "at least 1 and at most the backend's device count".into(),
    };
    if n == 0 {
        return Err(invalid("0".into()));
    }
    let first = B::Device::default();
    let id = first.to_id();
    let available = B::device_count(id.type_id);
    if available <= 1 {
        // Workers sharing one device are threads: bound them (a typo of 10^6 would otherwise
        // start a million threads).
        if n > MAX_SHARED_WORKERS {
            return Err(invalid(format!(
                "{n} (workers sharing this backend's single device: at most {MAX_SHARED_WORKERS})"
            )));
        }
        return Ok(vec![first; n]);
    }
    if n > available {
        return Err(invalid(format!("{n} (this backend has {available})")));
    }
    Ok((0..n)
        .map(|index| B::Device::from_id(DeviceId::new(id.type_id, index as u16)))
        .collect())
}

#[cfg(test)]
mod device_count_tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn workers_on_one_device_are_bounded() {
        assert_eq!(local_devices::<Flex>(4).unwrap().len(), 4);
        let err = local_devices::<Flex>(1_000_000).unwrap_err().to_string();
        assert!(err.contains("devices") && err.contains("256"), "{err}");
        assert!(local_devices::<Flex>(0).is_err());
    }
}

#[cfg(test)]
mod server_tests {
    use super::*;

    #[test]
    fn a_backend_type_past_the_runtime_threads_is_refused() {
        let mut served = Vec::new();
        let (a, b, c) = (TypeId::of::<u8>(), TypeId::of::<u16>(), TypeId::of::<u32>());
        assert_eq!(claim(&mut served, a, 2), Ok(()));
        assert_eq!(claim(&mut served, b, 2), Ok(()));
        assert_eq!(
            claim(&mut served, a, 2),
            Ok(()),
            "a type already served is fine"
        );
        assert_eq!(claim(&mut served, c, 2), Err(2));
        assert_eq!(claim(&mut served, c, 3), Ok(()));
    }
}
