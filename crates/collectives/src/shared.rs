//! [`SharedGroup`]: one process group used from several places (the Accelerator, DDP, the
//! backward nodes FSDP adds to the autodiff graph).

use std::sync::{Arc, Mutex, PoisonError};

use burn::tensor::backend::Backend;

use crate::ProcessGroup;
use crate::decorator::{Decorator, forward_process_group};

/// A cloneable handle on a process group: every clone calls the same group (one call at a
/// time). FSDP needs it because its gather nodes keep the group for the backward pass.
pub struct SharedGroup<G>(Arc<Mutex<G>>);

impl<G> SharedGroup<G> {
    /// Shares `group`.
    pub fn new(group: G) -> Self {
        Self(Arc::new(Mutex::new(group)))
    }

    /// Runs `call` on the shared group (one user at a time).
    pub fn with<T>(&self, call: impl FnOnce(&G) -> T) -> T {
        call(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<G> Clone for SharedGroup<G> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<G> std::fmt::Debug for SharedGroup<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedGroup")
    }
}

impl<B: Backend, G: ProcessGroup<B>> Decorator<B> for SharedGroup<G> {
    type Inner = G;

    fn with_inner<R>(&self, call: impl FnOnce(&G) -> R) -> R {
        self.with(call)
    }
}

forward_process_group!(SharedGroup);
