//! The in-process engine: one worker thread per device, collectives by burn-collective, with
//! the failure handling burn-collective lacks (a shared failure record and a watchdog).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_collective::{CollectiveError, PeerId, ReduceOperation};

use crate::{ParallelError, ProcessGroup, QuorumGroup, ReduceOp};

/// What the workers of one launch share: the first failure, and where each rank is (for the
/// watchdog and for fixed membership).
pub(crate) struct Health {
    failure: Mutex<Option<ParallelError>>,
    ranks: Mutex<Vec<RankState>>,
    /// Unblocks every rank waiting in a collective (burn-collective's reset).
    reset: Box<dyn Fn() + Send + Sync>,
}

/// Where one rank is, as far as the group is concerned.
#[derive(Debug, Clone, Copy, Default)]
struct RankState {
    /// Collectives it has entered (every rank calls the same ones in the same order, so the
    /// n-th call of one rank meets the n-th call of every other).
    calls: u64,
    /// The collective it waits in, and since when.
    waiting: Option<(Instant, &'static str)>,
    /// Its worker returned successfully: it enters no more collectives.
    returned: bool,
}

impl Health {
    pub(crate) fn new(world_size: usize, reset: Box<dyn Fn() + Send + Sync>) -> Self {
        Self {
            failure: Mutex::new(None),
            ranks: Mutex::new(vec![RankState::default(); world_size]),
            reset,
        }
    }

    /// Records `error` if it is the first failure, and unblocks every waiting rank.
    pub(crate) fn fail(&self, error: ParallelError) {
        {
            let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
            if failure.is_some() {
                return;
            }
            tracing::error!("{error}");
            *failure = Some(error);
        }
        (self.reset)();
    }

    /// The first failure, if any.
    pub(crate) fn failure(&self) -> Option<ParallelError> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn ranks(&self) -> std::sync::MutexGuard<'_, Vec<RankState>> {
        self.ranks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks `rank` as entering collective `op`, unless a rank that returned will never make
    /// the matching call: then the collective fails (the group never goes on with fewer ranks).
    fn enter(&self, rank: usize, op: &'static str) -> Result<(), ParallelError> {
        let gone = {
            let mut ranks = self.ranks();
            let call = ranks[rank].calls;
            match ranks.iter().position(|r| r.returned && r.calls <= call) {
                Some(gone) => gone,
                None => {
                    ranks[rank].calls += 1;
                    ranks[rank].waiting = Some((Instant::now(), op));
                    return Ok(());
                }
            }
        };
        let error = returned_early(gone, rank, op);
        self.fail(error.clone());
        Err(self.failure().unwrap_or(error))
    }

    /// Marks `rank` as back in its own code.
    fn leave(&self, rank: usize) {
        self.ranks()[rank].waiting = None;
    }

    /// Marks `rank`'s worker as returned. If another rank waits in a collective this rank never
    /// called, that collective cannot complete with the full group: the launch fails (naming
    /// `rank`) rather than letting burn-collective finish it with fewer ranks.
    pub(crate) fn returned(&self, rank: usize) {
        let stranded = {
            let mut ranks = self.ranks();
            ranks[rank].returned = true;
            let calls = ranks[rank].calls;
            ranks
                .iter()
                .enumerate()
                .find_map(|(other, r)| match r.waiting {
                    // Its own collective still running on another thread (a background
                    // exchange) is stranded too: its peers would finish it without it.
                    Some((_, op)) if r.calls > calls || other == rank => Some((other, op)),
                    _ => None,
                })
        };
        if let Some((other, op)) = stranded {
            self.fail(returned_early(rank, other, op));
        }
    }

    /// Fails the launch if a rank has waited in a collective longer than `timeout`.
    pub(crate) fn check_timeouts(&self, timeout: Duration) {
        let overdue =
            self.ranks()
                .iter()
                .enumerate()
                .find_map(|(rank, state)| match state.waiting {
                    Some((since, op)) if since.elapsed() > timeout => Some((rank, op)),
                    _ => None,
                });
        if let Some((rank, op)) = overdue {
            self.fail(ParallelError::Timeout {
                op,
                rank,
                seconds: timeout.as_secs_f64(),
            });
        }
    }
}

/// The error when rank `gone` returned while rank `waiting` needed it in collective `op`.
fn returned_early(gone: usize, waiting: usize, op: &'static str) -> ParallelError {
    ParallelError::PeerFailed {
        rank: gone,
        reason: format!(
            "its worker returned while rank {waiting} still called {op} (every rank must call \
             the same collectives; the group never continues with fewer ranks)"
        ),
    }
}

/// One rank of an in-process group; made by [`launch`](crate::launch) for each worker.
pub struct LocalGroup<B: Backend> {
    rank: usize,
    world_size: usize,
    device: B::Device,
    health: Arc<Health>,
    /// The exchange through the host, where ranks share a device of an asynchronous backend
    /// (see [`needs_host_exchange`]); `None`: burn-collective.
    host: Option<QuorumGroup<B>>,
}

/// Whether ranks on `device` must exchange through the host: when another rank runs on the
/// same device of an asynchronous (GPU) backend. burn-collective hands every rank the same
/// device tensor, which each rank's thread then reads on its own stream: on wgpu (lavapipe)
/// FSDP's gathers then read values another rank's stream changed (FSDP differed from DDP by a
/// factor of 20-40; xtask's backend suite, `fsdp_equals_ddp`), and with Burn's fusion a rank
/// reading another rank's tensor failed inside burn-fusion (`CallError`, 2 runs in 5 of the
/// suite's DDP on fused wgpu). Through the host each rank reads and writes only its own
/// tensors. Ranks on distinct devices get their own copies from burn-collective, and Burn's
/// CPU backends (flex, ndarray) run each op to completion, so neither needs it.
pub(crate) fn needs_host_exchange<B: Backend>(device: &B::Device, devices: &[B::Device]) -> bool {
    if devices.iter().filter(|d| *d == device).count() < 2 {
        return false;
    }
    let backend = std::any::type_name::<B>().to_ascii_lowercase();
    !["flex", "ndarray"].iter().any(|cpu| backend.contains(cpu))
}

impl<B: Backend> LocalGroup<B> {
    pub(crate) fn new(
        rank: usize,
        world_size: usize,
        device: B::Device,
        health: Arc<Health>,
        host: Option<QuorumGroup<B>>,
    ) -> Self {
        Self {
            rank,
            world_size,
            device,
            health,
            host,
        }
    }

    /// This worker's device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Runs one collective (burn-collective's or the host exchange's): refuses if the group
    /// already failed or lost a rank, marks it for the watchdog, and turns an error into the
    /// group's failure when there is one.
    fn run<T>(
        &self,
        op: &'static str,
        call: impl FnOnce() -> Result<T, ParallelError>,
    ) -> Result<T, ParallelError> {
        if let Some(failure) = self.health.failure() {
            return Err(failure);
        }
        self.health.enter(self.rank, op)?;
        let result = call();
        self.health.leave(self.rank);
        result.map_err(|e| self.health.failure().unwrap_or(e))
    }

    /// burn-collective's error in `op`, as this rank's.
    fn engine_error(&self, op: &'static str, error: CollectiveError) -> ParallelError {
        ParallelError::Collective {
            op,
            rank: self.rank,
            reason: format!("{error:?}"),
        }
    }

    fn peer(&self) -> PeerId {
        PeerId(self.rank as u32)
    }
}

fn primitive<B: Backend>(tensor: Tensor<B, 1>) -> B::FloatTensorPrimitive {
    tensor.into_primitive().tensor()
}

fn tensor<B: Backend>(primitive: B::FloatTensorPrimitive) -> Tensor<B, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

impl<B: Backend> ProcessGroup<B> for LocalGroup<B> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        if let Some(host) = &self.host {
            return self.run("all_reduce", || host.all_reduce(t, op));
        }
        let op = match op {
            ReduceOp::Sum => ReduceOperation::Sum,
            ReduceOp::Mean => ReduceOperation::Mean,
        };
        self.run("all_reduce", || {
            burn_collective::all_reduce::<B>(self.peer(), primitive(t), op)
                .map_err(|e| self.engine_error("all_reduce", e))
        })
        .map(tensor)
    }

    fn broadcast(
        &self,
        t: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        if t.is_some() != (root == self.rank) {
            return Err(ParallelError::Mismatch {
                rank: self.rank,
                reason: format!("broadcast from rank {root}: only the root passes a tensor"),
            });
        }
        if let Some(host) = &self.host {
            return self.run("broadcast", || host.broadcast(t, root));
        }
        self.run("broadcast", || {
            burn_collective::broadcast::<B>(self.peer(), t.map(primitive))
                .map_err(|e| self.engine_error("broadcast", e))
        })
        .map(tensor)
    }

    /// On the host exchange, one gather of every rank's values (burn-collective has no
    /// all-gather: the default composes broadcasts).
    fn all_gather(&self, t: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        match &self.host {
            Some(host) => self.run("all_gather", || host.all_gather(t)),
            None => crate::all_gather_by_broadcasts(self, t),
        }
    }
}
