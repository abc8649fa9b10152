//! [`Counted`]: a process group that counts what this rank sends: collective calls and payload
//! bytes (each tensor's values in their own dtype), for communication accounting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::backend::Backend;

use crate::ProcessGroup;
use crate::decorator::{Decorator, Outgoing, forward_process_group};

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

    fn count(&self, outgoing: Outgoing) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.bytes
            .fetch_add(outgoing.bytes() as u64, Ordering::Relaxed);
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

impl<B: Backend, G: ProcessGroup<B>> Decorator<B> for Counted<G> {
    type Inner = G;

    fn with_inner<R>(&self, call: impl FnOnce(&G) -> R) -> R {
        call(&self.engine)
    }

    fn before(&self, outgoing: Outgoing) {
        self.traffic.count(outgoing);
    }
}

forward_process_group!(Counted);
