//! [`SlowLink`]: a process group that makes every collective cost what it would over a slow
//! network (a latency plus the bytes over a bandwidth, as real sleeps), so the wall-time effect
//! of communicating less shows on one machine. For benchmarks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{ParallelError, ProcessGroup, Quorum, ReduceOp};

/// Wraps an engine: before each collective this rank sleeps `latency + bytes / bandwidth`
/// (the bytes of the values it sends, in their dtype) and counts the bytes.
pub struct SlowLink<G> {
    engine: G,
    latency: Duration,
    bytes_per_second: f64,
    sent: Arc<AtomicU64>,
}

impl<G> SlowLink<G> {
    /// `engine` behind a link of `latency` and `bytes_per_second` (> 0).
    pub fn new(engine: G, latency: Duration, bytes_per_second: f64) -> Self {
        Self {
            engine,
            latency,
            bytes_per_second: bytes_per_second.max(1.0),
            sent: Arc::default(),
        }
    }

    /// The bytes this rank sent so far; keep it before boxing the group.
    pub fn bytes_sent(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    fn pay(&self, values: usize, value_bytes: usize) {
        let bytes = (value_bytes * values) as u64;
        self.sent.fetch_add(bytes, Ordering::Relaxed);
        let transfer = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
        std::thread::sleep(self.latency + transfer);
    }
}

fn len<B: Backend>(t: &Tensor<B, 1>) -> usize {
    t.dims()[0]
}

impl<B: Backend, G: ProcessGroup<B>> ProcessGroup<B> for SlowLink<G> {
    fn rank(&self) -> usize {
        self.engine.rank()
    }

    fn world_size(&self) -> usize {
        self.engine.world_size()
    }

    fn all_reduce(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        self.pay(len(&t), t.dtype().size());
        self.engine.all_reduce(t, op)
    }

    fn broadcast(
        &self,
        t: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        self.pay(
            t.as_ref().map_or(0, len),
            t.as_ref().map_or(4, |t| t.dtype().size()),
        );
        self.engine.broadcast(t, root)
    }

    fn all_gather(&self, t: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        self.pay(len(&t), t.dtype().size());
        self.engine.all_gather(t)
    }

    fn reduce_scatter(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        self.pay(len(&t), t.dtype().size());
        self.engine.reduce_scatter(t, op)
    }

    fn barrier(&self, device: &B::Device) -> Result<(), ParallelError> {
        self.pay(0, 4);
        self.engine.barrier(device)
    }

    fn quorum(&self) -> Option<std::sync::Arc<dyn Quorum>> {
        self.engine.quorum()
    }
}
