//! [`Counted`]: a process group that counts what this rank sends: collective calls and payload
//! bytes (each tensor's values in their own dtype), for communication accounting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{ParallelError, ProcessGroup, Quorum, ReduceOp};

/// Collective calls and payload bytes so far, shared between a [`Counted`] group and whoever
/// reports them.
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    calls: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl Traffic {
    /// Collective calls this rank made.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Payload bytes this rank passed to collectives (what it contributes, not the engine's
    /// own traffic: a ring all-reduce moves about twice that over the wire).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn count<B: Backend>(&self, tensor: Option<&Tensor<B, 1>>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = tensor {
            let bytes = t.dims()[0] * t.dtype().size();
            self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }
}

/// `engine`, counting every collective into a [`Traffic`].
pub struct Counted<G> {
    engine: G,
    traffic: Traffic,
}

impl<G> Counted<G> {
    /// `engine`, counted into `traffic`.
    pub fn new(engine: G, traffic: Traffic) -> Self {
        Self { engine, traffic }
    }
}

impl<B: Backend, G: ProcessGroup<B>> ProcessGroup<B> for Counted<G> {
    fn rank(&self) -> usize {
        self.engine.rank()
    }

    fn world_size(&self) -> usize {
        self.engine.world_size()
    }

    fn all_reduce(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        self.traffic.count(Some(&t));
        self.engine.all_reduce(t, op)
    }

    fn broadcast(
        &self,
        t: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        self.traffic.count(t.as_ref());
        self.engine.broadcast(t, root)
    }

    fn all_gather(&self, t: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        self.traffic.count(Some(&t));
        self.engine.all_gather(t)
    }

    fn reduce_scatter(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        self.traffic.count(Some(&t));
        self.engine.reduce_scatter(t, op)
    }

    fn barrier(&self, device: &B::Device) -> Result<(), ParallelError> {
        self.traffic.count::<B>(None);
        self.engine.barrier(device)
    }

    fn quorum(&self) -> Option<std::sync::Arc<dyn Quorum>> {
        self.engine.quorum()
    }
}
