//! [`SharedGroup`]: one process group used from several places (the Accelerator, DDP, the
//! backward nodes FSDP adds to the autodiff graph).

use std::sync::{Arc, Mutex, PoisonError};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{ParallelError, ProcessGroup, Quorum, ReduceOp};

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

impl<B: Backend, G: ProcessGroup<B>> ProcessGroup<B> for SharedGroup<G> {
    fn rank(&self) -> usize {
        self.with(|g| g.rank())
    }

    fn world_size(&self) -> usize {
        self.with(|g| g.world_size())
    }

    fn all_reduce(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        self.with(|g| g.all_reduce(tensor, op))
    }

    fn broadcast(
        &self,
        tensor: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        self.with(|g| g.broadcast(tensor, root))
    }

    fn all_gather(&self, tensor: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        self.with(|g| g.all_gather(tensor))
    }

    fn reduce_scatter(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        self.with(|g| g.reduce_scatter(tensor, op))
    }

    fn barrier(&self, device: &B::Device) -> Result<(), ParallelError> {
        self.with(|g| g.barrier(device))
    }

    fn quorum(&self) -> Option<Arc<dyn Quorum>> {
        self.with(|g| g.quorum())
    }
}
