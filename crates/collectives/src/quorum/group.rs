//! [`QuorumGroup`]: one replica's handle on a fault-tolerant group, a [`ProcessGroup`] whose
//! collectives are over the replicas present: who is present comes from a [`Lighthouse`] (in
//! this process or over TCP: both a [`Coordinator`]), the values go over a ring between them
//! (data_plane.rs).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use afterburner_rendezvous::{Coordinator, Lighthouse, Op, Reply, Session};

use super::Quorum;
use super::data_plane::{self, DataPlane, RingOp};
use crate::{ParallelError, ProcessGroup, ReduceOp, reduce_scatter_by_all_reduce};

/// The part of a replica's handle its clones share; leaves the group when the last goes.
pub(super) struct Handle {
    pub(super) coordinator: Arc<dyn Coordinator>,
    pub(super) session: Session,
    pub(super) replicas: usize,
    /// The number of lighthouse rounds this replica has called (the next one's number).
    pub(super) seq: AtomicU64,
    /// Still to be healed: no collective before [`Quorum::receive_state`].
    joining: AtomicBool,
    /// A joiner waits for this replica's state.
    donate: AtomicBool,
    /// It asked to join after the run ended: its collectives are its own values alone.
    ended: AtomicBool,
    members: Mutex<Vec<usize>>,
    /// What this replica sends with its live state, or, once healed, what it received.
    attachment: Mutex<Vec<u8>>,
    /// The ring to the peers; its lock makes one collective at a time (clones may call from
    /// two threads).
    plane: Mutex<DataPlane>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let reason = match std::thread::panicking() {
            true => "its worker panicked",
            false => "its handle was dropped (the worker finished or failed)",
        };
        if std::thread::panicking() {
            tracing::warn!(replica = self.session.replica, "{reason}");
        }
        self.coordinator.leave(&self.session, reason);
    }
}

/// One replica of a fault-tolerant group: a [`ProcessGroup`] whose collectives combine the
/// replicas present. A replica that fails, leaves or times out is dropped with a warning and
/// the others go on: `Mean` divides by the replicas present, `all_gather` returns theirs.
/// `rank()` is the replica id and `world_size()` the configured number of replicas, so data
/// shards stay the same whoever is present. Cloning shares the handle (DiLoCo's background
/// exchange); the replica leaves the group when its last clone is dropped.
///
/// Made by [`LocalReplicas::replica`] (threads of one process) or
/// [`connect_tcp`](super::connect_tcp) (processes). Use it with the replica strategies (Local
/// SGD, DiLoCo), whose `join` heals a replica that joins a run in progress; DDP, ZeRO and FSDP
/// refuse it (their replicas are not independent).
pub struct QuorumGroup<B: Backend> {
    handle: Arc<Handle>,
    device: B::Device,
    /// The ranks fail together ([`failing_together`](QuorumGroup::failing_together)).
    together: bool,
    /// Every value goes through the lighthouse ([`through_lighthouse`](QuorumGroup::through_lighthouse)).
    star: bool,
}

impl<B: Backend> Clone for QuorumGroup<B> {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.clone(),
            device: self.device.clone(),
            together: self.together,
            star: self.star,
        }
    }
}

impl<B: Backend> std::fmt::Debug for QuorumGroup<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumGroup")
            .field("replica", &self.handle.session.replica)
            .field("replicas", &self.handle.replicas)
            .finish()
    }
}

/// Replicas of a [`Lighthouse`] on threads of its own process, each a [`QuorumGroup`]
/// (the lighthouse is afterburner-rendezvous's and knows no tensors; this adds them).
pub trait LocalReplicas {
    /// Admits replica `replica` (below `config.replicas`) on `device`: a founding member if
    /// the run has not finished its first collective, else a replica that joins it (its
    /// strategy's `join` heals it first). An earlier handle of the same replica is dropped
    /// from the group.
    fn replica<B: Backend>(
        &self,
        replica: usize,
        device: &B::Device,
    ) -> Result<QuorumGroup<B>, ParallelError>;
}

impl LocalReplicas for Arc<Lighthouse> {
    fn replica<B: Backend>(
        &self,
        replica: usize,
        device: &B::Device,
    ) -> Result<QuorumGroup<B>, ParallelError> {
        let session = self.connect(replica)?;
        let (replicas, timeout) = (self.config().replicas, self.config().timeout);
        QuorumGroup::new(self.clone(), session, replicas, timeout, device)
    }
}

impl<B: Backend> QuorumGroup<B> {
    /// `session`'s group, listening for its ring peers (the collective `timeout` bounds each
    /// ring exchange).
    pub(crate) fn new(
        coordinator: Arc<dyn Coordinator>,
        session: Session,
        replicas: usize,
        timeout: std::time::Duration,
        device: &B::Device,
    ) -> Result<Self, ParallelError> {
        let plane = DataPlane::open(&coordinator, &session, timeout)?;
        Ok(Self {
            handle: Arc::new(Handle {
                coordinator,
                joining: AtomicBool::new(session.joining),
                session,
                replicas,
                seq: AtomicU64::new(0),
                donate: AtomicBool::new(false),
                ended: AtomicBool::new(false),
                members: Mutex::new(Vec::new()),
                attachment: Mutex::new(Vec::new()),
                plane: Mutex::new(plane),
            }),
            device: device.clone(),
            together: false,
            star: false,
        })
    }

    /// Value bytes this replica sent to its peers over the ring so far (the data plane; the
    /// lighthouse's small control rounds and frame headers are not counted).
    pub fn ring_bytes_sent(&self) -> u64 {
        data_plane::lock(&self.handle.plane).bytes_sent()
    }

    /// This group as one whose ranks fail together, for DDP, ZeRO-1 and FSDP over processes
    /// (what `afterburner launch` gives them): it reports no quorum, so those strategies
    /// accept it. Serve its lighthouse with `min_replicas` equal to the replicas, so that a
    /// lost rank fails every rank's collective instead of being left out.
    pub fn failing_together(mut self) -> Self {
        self.together = true;
        self
    }

    /// This group with every value sent through the lighthouse (a star: each replica sends and
    /// receives its buffer, the lighthouse moves one per replica) instead of the ring between
    /// the members: the data path before the ring, kept for side-by-side benchmarks.
    pub fn through_lighthouse(mut self) -> Self {
        self.star = true;
        self
    }

    /// One collective over the ring: `tensor`'s values out, the results back as tensors.
    fn call(
        &self,
        op: RingOp,
        tensor: Option<Tensor<B, 1>>,
    ) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        let handle = &self.handle;
        let replica = handle.session.replica;
        if handle.joining.load(Ordering::SeqCst) {
            return Err(ParallelError::Collective {
                op: "collective",
                rank: replica,
                reason: format!(
                    "replica {replica} joins a run in progress: it must receive a live state \
                     (the strategy's join) before any collective"
                ),
            });
        }
        let dtype = tensor.as_ref().map_or(DType::F32, |t| t.dtype());
        let values = tensor.map(host).transpose()?;
        let mut plane = data_plane::lock(&handle.plane);
        let results = match (handle.ended.load(Ordering::SeqCst), self.star) {
            (true, _) => alone(replica, op, values)?,
            (false, true) => handle.through_lighthouse(op, values)?,
            (false, false) => handle.over_ring(&mut plane, op, values, self.together)?,
        };
        Ok(results
            .into_iter()
            .map(|v| {
                let len = v.len();
                Tensor::<B, 1>::from_data(TensorData::new(v, [len]), &self.device).cast(dtype)
            })
            .collect())
    }

    fn one(&self, op: RingOp, tensor: Option<Tensor<B, 1>>) -> Result<Tensor<B, 1>, ParallelError> {
        self.call(op, tensor)?
            .pop()
            .ok_or_else(|| ParallelError::Collective {
                op: "collective",
                rank: self.handle.session.replica,
                reason: "the ring returned no values".into(),
            })
    }
}

impl Handle {
    /// One round with the lighthouse (the caller holds the data plane): who is present, and
    /// whether a joiner waits for this replica's state.
    pub(super) fn round(&self, op: Op, values: Option<Vec<f32>>) -> Result<Reply, ParallelError> {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let reply = self
            .coordinator
            .collective(&self.session, seq, op, values)?;
        if reply.donate {
            self.donate.store(true, Ordering::SeqCst);
        }
        *self.members.lock().unwrap_or_else(PoisonError::into_inner) = reply.members.clone();
        Ok(reply)
    }

    /// One collective with its values through the lighthouse (see
    /// [`QuorumGroup::through_lighthouse`]).
    fn through_lighthouse(
        &self,
        op: RingOp,
        values: Option<Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>, ParallelError> {
        let op = match op {
            RingOp::AllReduce { mean: false } => Op::Sum,
            RingOp::AllReduce { mean: true } => Op::Mean,
            RingOp::Broadcast(root) => Op::Broadcast(root),
            RingOp::Gather => Op::Gather,
            RingOp::ReduceScatter { .. } => unreachable!("composed of an all-reduce"),
        };
        Ok(self.round(op, values)?.values)
    }
}

/// A collective of `replica` as the only replica left (after the run ended): its own values.
fn alone(
    replica: usize,
    op: RingOp,
    values: Option<Vec<f32>>,
) -> Result<Vec<Vec<f32>>, ParallelError> {
    match (op, values) {
        (RingOp::Broadcast(root), None) if root != replica => Err(ParallelError::Collective {
            op: "broadcast",
            rank: replica,
            reason: format!(
                "the run ended: replica {root}, the broadcast's root, is gone, and replica \
                 {replica} is the only one left"
            ),
        }),
        (_, values) => Ok(vec![values.unwrap_or_default()]),
    }
}

/// A tensor's values as f32 on the host.
fn host<B: Backend>(tensor: Tensor<B, 1>) -> Result<Vec<f32>, ParallelError> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| ParallelError::Record(format!("a collective's values: {e:?}")))
}

impl<B: Backend> ProcessGroup<B> for QuorumGroup<B> {
    fn rank(&self) -> usize {
        self.handle.session.replica
    }

    fn world_size(&self) -> usize {
        self.handle.replicas
    }

    fn all_reduce(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let mean = op == ReduceOp::Mean;
        self.one(RingOp::AllReduce { mean }, Some(tensor))
    }

    fn broadcast(
        &self,
        tensor: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        self.one(RingOp::Broadcast(root), tensor)
    }

    /// The values of the replicas present, in replica order.
    fn all_gather(&self, tensor: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        self.call(RingOp::Gather, Some(tensor))
    }

    /// Over the ring where the ranks fail together (every rank present, each keeping its
    /// chunk); a fault-tolerant group reduces the whole tensor over the replicas present.
    fn reduce_scatter(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        if !self.together || self.star {
            return reduce_scatter_by_all_reduce(self, tensor, op);
        }
        let [len] = tensor.dims();
        if !len.is_multiple_of(self.handle.replicas) {
            return reduce_scatter_by_all_reduce(self, tensor, op); // names the mismatch
        }
        let mean = op == ReduceOp::Mean;
        self.one(RingOp::ReduceScatter { mean }, Some(tensor))
    }

    fn quorum(&self) -> Option<Arc<dyn Quorum>> {
        match self.together {
            true => None,
            false => Some(self.handle.clone()),
        }
    }
}

impl Quorum for Handle {
    fn replica(&self) -> usize {
        self.session.replica
    }

    fn is_joining(&self) -> bool {
        self.joining.load(Ordering::SeqCst)
    }

    fn members(&self) -> Vec<usize> {
        self.members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn state_requested(&self) -> bool {
        self.donate.load(Ordering::SeqCst)
    }

    fn send_state(&self, state: Vec<u8>) -> Result<(), ParallelError> {
        let _one_at_a_time = data_plane::lock(&self.plane);
        let next_seq = self.seq.load(Ordering::SeqCst);
        self.coordinator
            .send_state(&self.session, next_seq, state)?;
        self.donate.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn attach(&self, bytes: Vec<u8>) {
        *self
            .attachment
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = bytes;
    }

    fn attached(&self) -> Vec<u8> {
        self.attachment
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn end_run(&self, step: u64) -> Result<(), ParallelError> {
        if self.ended.load(Ordering::SeqCst) {
            return Ok(()); // it ended alone: nobody to tell
        }
        let _one_at_a_time = data_plane::lock(&self.plane);
        self.coordinator.end_run(&self.session, step)
    }

    fn run_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    fn receive_state(&self) -> Result<Vec<u8>, ParallelError> {
        let replica = self.session.replica;
        if !self.joining.load(Ordering::SeqCst) {
            return Err(ParallelError::Collective {
                op: "receive_state",
                rank: replica,
                reason: format!("replica {replica} is a member already (it did not join late)"),
            });
        }
        let donation = match self.coordinator.receive_state(&self.session) {
            Err(ended @ ParallelError::RunEnded { .. }) => {
                self.ended.store(true, Ordering::SeqCst);
                self.joining.store(false, Ordering::SeqCst);
                *self.members.lock().unwrap_or_else(PoisonError::into_inner) = vec![replica];
                return Err(ended);
            }
            other => other?,
        };
        self.seq.store(donation.next_seq, Ordering::SeqCst);
        self.joining.store(false, Ordering::SeqCst);
        Ok(Arc::try_unwrap(donation.bytes).unwrap_or_else(|shared| (*shared).clone()))
    }
}
