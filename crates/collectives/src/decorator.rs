//! [`Decorator`]: a process group that wraps another, sees each collective's outgoing payload
//! and forwards the call (counting traffic, slowing a link, sharing one group). The
//! forwarding itself is written once, in [`forward_process_group!`], for every decorator: a
//! method added to [`ProcessGroup`] is forwarded there or by none (a test compares the macro
//! with the trait), never left to the trait's default in one decorator.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::ProcessGroup;

/// What a collective sends from this rank: its number of values and their size in bytes (no
/// values for a barrier or a broadcast's receivers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outgoing {
    /// Values sent.
    pub values: usize,
    /// Bytes of one value (its dtype's size).
    pub value_bytes: usize,
}

impl Outgoing {
    /// What sending `tensor` (if any) carries.
    pub fn of<B: Backend>(tensor: Option<&Tensor<B, 1>>) -> Self {
        tensor.map_or(Self::default(), |t| Self {
            values: t.dims()[0],
            value_bytes: t.dtype().size(),
        })
    }

    /// Payload bytes.
    pub fn bytes(&self) -> usize {
        self.values * self.value_bytes
    }
}

/// A process group around another: [`forward_process_group!`] implements [`ProcessGroup`] for
/// it, calling [`before`](Self::before) with each collective's payload and then the same
/// method of the inner group through [`with_inner`](Self::with_inner).
pub trait Decorator<B: Backend>: Send {
    /// The group the calls go to.
    type Inner: ProcessGroup<B> + ?Sized;

    /// Runs `call` on the inner group (a shared one locks it for the call).
    fn with_inner<R>(&self, call: impl FnOnce(&Self::Inner) -> R) -> R;

    /// Sees a collective's outgoing payload before it is forwarded (default: nothing).
    fn before(&self, outgoing: Outgoing) {
        let _ = outgoing;
    }
}

/// Implements [`ProcessGroup`] for `Wrapper<G>` (`Wrapper<G>: Decorator<B, Inner = G>`), with
/// `?Sized` for a wrapper of unsized groups: every method of the trait forwarded, each
/// collective's payload shown to [`Decorator::before`] first.
macro_rules! forward_process_group {
    ($wrapper:ident $(, ?$sized:ident)?) => {
        impl<B, G> $crate::ProcessGroup<B> for $wrapper<G>
        where
            B: burn::tensor::backend::Backend,
            G: $crate::ProcessGroup<B> $(+ ?$sized)?,
            $wrapper<G>: $crate::decorator::Decorator<B, Inner = G>,
        {
            fn rank(&self) -> usize {
                self.with_inner(|g| g.rank())
            }

            fn world_size(&self) -> usize {
                self.with_inner(|g| g.world_size())
            }

            fn all_reduce(
                &self,
                tensor: burn::tensor::Tensor<B, 1>,
                op: $crate::ReduceOp,
            ) -> Result<burn::tensor::Tensor<B, 1>, $crate::ParallelError> {
                self.before($crate::decorator::Outgoing::of(Some(&tensor)));
                self.with_inner(|g| g.all_reduce(tensor, op))
            }

            fn broadcast(
                &self,
                tensor: Option<burn::tensor::Tensor<B, 1>>,
                root: usize,
            ) -> Result<burn::tensor::Tensor<B, 1>, $crate::ParallelError> {
                self.before($crate::decorator::Outgoing::of(tensor.as_ref()));
                self.with_inner(|g| g.broadcast(tensor, root))
            }

            fn all_gather(
                &self,
                tensor: burn::tensor::Tensor<B, 1>,
            ) -> Result<Vec<burn::tensor::Tensor<B, 1>>, $crate::ParallelError> {
                self.before($crate::decorator::Outgoing::of(Some(&tensor)));
                self.with_inner(|g| g.all_gather(tensor))
            }

            fn reduce_scatter(
                &self,
                tensor: burn::tensor::Tensor<B, 1>,
                op: $crate::ReduceOp,
            ) -> Result<burn::tensor::Tensor<B, 1>, $crate::ParallelError> {
                self.before($crate::decorator::Outgoing::of(Some(&tensor)));
                self.with_inner(|g| g.reduce_scatter(tensor, op))
            }

            fn barrier(&self, device: &B::Device) -> Result<(), $crate::ParallelError> {
                self.before($crate::decorator::Outgoing::default());
                self.with_inner(|g| g.barrier(device))
            }

            fn quorum(&self) -> Option<std::sync::Arc<dyn $crate::Quorum>> {
                self.with_inner(|g| g.quorum())
            }
        }
    };
}

pub(crate) use forward_process_group;
