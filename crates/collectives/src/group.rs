//! The process-group interface every engine implements.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use std::sync::Arc;

use crate::decorator::{Decorator, forward_process_group};
use crate::{ParallelError, Quorum};

/// How values are combined across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean over the ranks.
    Mean,
}

/// A group of `world_size` ranks that run the same program and exchange 1-D float tensors
/// (reshape to and from what you need). Every rank must call the same collectives in the same
/// order with matching lengths; a rank that fails makes the others' calls return an error.
///
/// Engines: [`LocalGroup`](crate::LocalGroup) (threads of one process, burn-collective) and
/// `MpiGroup` (processes, feature `mpi`). A GPU engine (NCCL) would implement the same trait.
pub trait ProcessGroup<B: Backend>: Send {
    /// This rank, from 0.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// Combines `tensor` across ranks; every rank gets the result.
    fn all_reduce(&self, tensor: Tensor<B, 1>, op: ReduceOp)
    -> Result<Tensor<B, 1>, ParallelError>;

    /// Rank `root` sends `tensor` (it must be `Some` there and `None` elsewhere); every rank
    /// gets it.
    fn broadcast(
        &self,
        tensor: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError>;

    /// Every rank's `tensor`, in rank order, on every rank (lengths may differ by rank).
    /// Default: [`all_gather_by_broadcasts`] (engines with a native all-gather override it).
    fn all_gather(&self, tensor: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        all_gather_by_broadcasts(self, tensor)
    }

    /// Reduces `tensor` (same length on every rank, a multiple of `world_size`) and returns
    /// this rank's equal chunk of the result. Default: [`reduce_scatter_by_all_reduce`].
    fn reduce_scatter(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        reduce_scatter_by_all_reduce(self, tensor, op)
    }

    /// Returns once every rank has called it. Default: [`barrier_by_all_reduce`].
    fn barrier(&self, device: &B::Device) -> Result<(), ParallelError> {
        barrier_by_all_reduce(self, device)
    }

    /// The quorum of a fault-tolerant group ([`QuorumGroup`](crate::QuorumGroup)), whose
    /// collectives go on over the ranks present; `None` (the default) for a group whose ranks
    /// all fail together.
    fn quorum(&self) -> Option<Arc<dyn Quorum>> {
        None
    }
}

/// An all-gather composed of `world_size` broadcasts (for engines without a native one).
pub fn all_gather_by_broadcasts<B: Backend, G: ProcessGroup<B> + ?Sized>(
    group: &G,
    tensor: Tensor<B, 1>,
) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
    let mut mine = Some(tensor);
    (0..group.world_size())
        .map(|root| {
            let sent = if root == group.rank() {
                mine.take()
            } else {
                None
            };
            group.broadcast(sent, root)
        })
        .collect()
}

/// A reduce-scatter composed of one all-reduce of the whole tensor, each rank keeping its
/// chunk (twice the bytes of a native one).
pub fn reduce_scatter_by_all_reduce<B: Backend, G: ProcessGroup<B> + ?Sized>(
    group: &G,
    tensor: Tensor<B, 1>,
    op: ReduceOp,
) -> Result<Tensor<B, 1>, ParallelError> {
    let [len] = tensor.dims();
    let world = group.world_size();
    if !len.is_multiple_of(world) {
        return Err(ParallelError::Mismatch {
            rank: group.rank(),
            reason: format!("reduce_scatter of {len} values over {world} ranks"),
        });
    }
    let chunk = len / world;
    let start = group.rank() * chunk;
    Ok(group.all_reduce(tensor, op)?.narrow(0, start, chunk))
}

/// A barrier composed of an all-reduce of one value.
pub fn barrier_by_all_reduce<B: Backend, G: ProcessGroup<B> + ?Sized>(
    group: &G,
    device: &B::Device,
) -> Result<(), ParallelError> {
    group
        .all_reduce(Tensor::zeros([1], device), ReduceOp::Sum)
        .map(|_| ())
}

/// A boxed group is a group (so code can hold `Box<dyn ProcessGroup<B>>` of any engine); every
/// call reaches the engine's own implementation.
impl<B: Backend, G: ProcessGroup<B> + ?Sized> Decorator<B> for Box<G> {
    type Inner = G;

    fn with_inner<R>(&self, call: impl FnOnce(&G) -> R) -> R {
        call(self)
    }
}

forward_process_group!(Box, ?Sized);
