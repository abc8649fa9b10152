//! [`SlowLink`]: a process group that makes every collective cost what it would over a slow
//! network (a latency plus the bytes over a bandwidth, as real sleeps), so the wall-time effect
//! of communicating less shows on one machine. For benchmarks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use burn::tensor::backend::Backend;

use crate::ProcessGroup;
use crate::decorator::{Decorator, Outgoing, forward_process_group};

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

impl<B: Backend, G: ProcessGroup<B>> Decorator<B> for SlowLink<G> {
    type Inner = G;

    fn with_inner<R>(&self, call: impl FnOnce(&G) -> R) -> R {
        call(&self.engine)
    }

    fn before(&self, outgoing: Outgoing) {
        self.pay(outgoing.values, outgoing.value_bytes);
    }
}

forward_process_group!(SlowLink);
