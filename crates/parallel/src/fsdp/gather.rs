//! The gather node: a unit's full parameters from every rank's shard, as one autodiff node
//! whose backward reduce-scatters the gradient back to this rank's shard.
//!
//! Forward: `all_gather` of the unit's local buffer (or, under `grad-op`, the unit's replicated
//! values kept since the last step). Backward: the gradient of the full buffer is averaged
//! across ranks with `reduce_scatter` and this rank's piece is kept for the unit, from where
//! the strategy gives it to the shard parameters after backward (it also flows on to the
//! view's leaves, which are not the parameters). A collective that fails cannot return an
//! error from inside Burn's backward: the failure is recorded (see [`Exchange`]), zeros flow on,
//! and the Accelerator reports the error when `backward` returns.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use crate::{ParallelError, ProcessGroup, ReduceOp, SharedGroup};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;
/// Burn's autodiff float primitive on inner backend `I`.
pub(crate) type Tracked<I> = FloatTensor<Autodiff<I>>;

/// Collective counters of an FSDP run.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) all_gathers: AtomicU64,
    pub(crate) reduce_scatters: AtomicU64,
    /// All-reduces (tensor parallelism's).
    pub(crate) all_reduces: AtomicU64,
    /// f32 values this rank sent and received in gathers, reduce-scatters and all-reduces.
    pub(crate) values_moved: AtomicU64,
}

/// The gradients the gather nodes of a backward pass produced: `(unit, this rank's piece of
/// the unit's averaged gradient)`, a `FloatTensor` of the inner backend, taken by the
/// strategy after backward.
pub(crate) type ViewGrads = Arc<Mutex<Vec<(usize, Box<dyn Any + Send>)>>>;

/// What gather nodes share with the [`Fsdp`](super::Fsdp) that made them: the group, the first
/// failure, counters, the gradients of the views.
pub(crate) struct Exchange<G> {
    pub(crate) group: SharedGroup<G>,
    pub(crate) failure: Arc<Mutex<Option<ParallelError>>>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) view_grads: ViewGrads,
}

impl<G> Clone for Exchange<G> {
    fn clone(&self) -> Self {
        Self {
            group: self.group.clone(),
            failure: self.failure.clone(),
            stats: self.stats.clone(),
            view_grads: self.view_grads.clone(),
        }
    }
}

impl<G> Exchange<G> {
    /// Each unit's gradient kept since the last call (summed where a unit was gathered more
    /// than once, a recomputed block), in unit order.
    pub(crate) fn take_view_grads<I: Backend>(&self, units: usize) -> Vec<Option<Tensor<I, 1>>> {
        let kept = std::mem::take(
            &mut *self
                .view_grads
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut summed: Vec<Option<Tensor<I, 1>>> = vec![None; units];
        for (unit, grad) in kept {
            let Ok(grad) = grad.downcast::<FloatTensor<I>>() else {
                continue;
            };
            let grad = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(*grad));
            if let Some(slot) = summed.get_mut(unit) {
                *slot = Some(match slot.take() {
                    Some(sum) => sum.add(grad),
                    None => grad,
                });
            }
        }
        summed
    }
}

impl<G> std::fmt::Debug for Exchange<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exchange")
    }
}

impl<G> Exchange<G> {
    /// Keeps the first failure (later ones are usually its consequences).
    pub(crate) fn record(&self, error: ParallelError) {
        let mut slot = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    /// The recorded failure, if any, cleared.
    pub(crate) fn take_failure(&self) -> Option<ParallelError> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    pub(crate) fn has_failed(&self) -> bool {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

impl<G> Exchange<G> {
    /// Every rank's `local` (f32), concatenated in rank order; zeros after a failure.
    pub(crate) fn all_gather<I: Backend>(&self, local: Tensor<I, 1>) -> Tensor<I, 1>
    where
        G: ProcessGroup<I>,
    {
        let [len] = local.dims();
        let world = self.group.world_size();
        let device = local.device();
        if !self.has_failed() {
            match self.group.all_gather(local.cast(DType::F32)) {
                Ok(parts) => {
                    self.stats.all_gathers.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .values_moved
                        .fetch_add((len * world) as u64, Ordering::Relaxed);
                    return Tensor::cat(parts, 0);
                }
                Err(e) => self.record(e),
            }
        }
        Tensor::zeros([len * world], &device)
    }

    /// The sum of every rank's `values` (reduced in f32, back in their dtype); zeros after a
    /// failure.
    pub(crate) fn all_reduce_sum<I: Backend>(&self, values: Tensor<I, 1>) -> Tensor<I, 1>
    where
        G: ProcessGroup<I>,
    {
        let [len] = values.dims();
        let (dtype, device) = (values.dtype(), values.device());
        if !self.has_failed() {
            match self
                .group
                .all_reduce(values.cast(DType::F32), ReduceOp::Sum)
            {
                Ok(sum) => {
                    self.stats.all_reduces.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .values_moved
                        .fetch_add(len as u64, Ordering::Relaxed);
                    return sum.cast(dtype);
                }
                Err(e) => self.record(e),
            }
        }
        Tensor::<I, 1>::zeros([len], &device).cast(dtype)
    }

    /// This rank's chunk of the mean of every rank's `full` (f32); zeros after a failure.
    fn reduce_scatter<I: Backend>(&self, full: Tensor<I, 1>) -> Tensor<I, 1>
    where
        G: ProcessGroup<I>,
    {
        let [len] = full.dims();
        let world = self.group.world_size();
        let device = full.device();
        if !self.has_failed() {
            match self
                .group
                .reduce_scatter(full.cast(DType::F32), ReduceOp::Mean)
            {
                Ok(mine) => {
                    self.stats.reduce_scatters.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .values_moved
                        .fetch_add(len as u64, Ordering::Relaxed);
                    return mine;
                }
                Err(e) => self.record(e),
            }
        }
        Tensor::zeros([len / world], &device)
    }
}

/// Whether `B` is Burn's `Autodiff<_, _>` (FSDP's gather node needs its internals).
pub(crate) fn is_burn_autodiff<B: AutodiffBackend>() -> bool {
    std::any::TypeId::of::<FloatTensor<B>>() == std::any::TypeId::of::<Tracked<Inner<B>>>()
}

/// The unit's full buffer (rank-major: every rank's local buffer in rank order) from this
/// rank's `local` buffer: gathered now, or `replicated` when given (`grad-op`). Gradients of
/// the result are reduce-scattered in backward and kept in the exchange for `unit` (the
/// strategy gives them to the shard parameters after backward: `local` is made of the view's
/// own leaves, so any gradient the parameters get in the graph is the loss reading the
/// sharded model outside the view).
pub(crate) fn gather<B, G>(
    local: Tensor<B, 1>,
    unit: usize,
    replicated: Option<Tensor<Inner<B>, 1>>,
    exchange: &Exchange<G>,
) -> Tensor<B, 1>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    let dtype = local.dtype();
    let [local_len] = local.dims();
    let full = match replicated {
        Some(values) => values,
        None => exchange.all_gather(local.clone().inner()),
    }
    .cast(dtype);
    let primitive = local.into_primitive().tensor();
    let Some(node) = downcast::<_, Tracked<Inner<B>>>(primitive) else {
        // Not Burn's autodiff: no graph to attach to (Fsdp::new refuses such backends).
        return Tensor::from_inner(full);
    };
    let full = full.into_primitive().tensor();
    let state = GatherState {
        exchange: exchange.clone(),
        unit,
        local_len,
        dtype,
    };
    let out = match GatherNode::<G>(PhantomData)
        .prepare::<NoCheckpointing>([node.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, full),
        OpsKind::UnTracked(prep) => prep.finish(full),
    };
    let out = downcast::<_, FloatTensor<B>>(out).expect("B is Burn's Autodiff (checked above)");
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The backward node of a gather (over group type `G`).
struct GatherNode<G>(PhantomData<fn() -> G>);

impl<G> std::fmt::Debug for GatherNode<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatherNode")
    }
}

struct GatherState<G> {
    exchange: Exchange<G>,
    unit: usize,
    local_len: usize,
    dtype: DType,
}

impl<G> std::fmt::Debug for GatherState<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherState")
            .field("local_len", &self.local_len)
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl<G> Clone for GatherState<G> {
    fn clone(&self) -> Self {
        Self {
            exchange: self.exchange.clone(),
            unit: self.unit,
            local_len: self.local_len,
            dtype: self.dtype,
        }
    }
}

impl<I: Backend, G: ProcessGroup<I> + 'static> Backward<I, 1> for GatherNode<G> {
    type State = GatherState<G>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let full = grads.consume::<I>(&ops.node);
        let [parent] = ops.parents;
        let Some(parent) = parent else { return };
        let state = ops.state;
        let full = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(full));
        let mine = state.exchange.reduce_scatter(full).cast(state.dtype);
        debug_assert_eq!(mine.dims(), [state.local_len]);
        let mine = mine.into_primitive().tensor();
        let kept: Box<dyn Any + Send> = Box::new(mine.clone());
        state
            .exchange
            .view_grads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((state.unit, kept));
        // On to the view's own leaves too (not the parameters): a recomputed block's gradients
        // leave its recompute through them, after this reduce-scatter.
        grads.register::<I>(parent.id, mine);
    }
}

/// `value` as type `U` when `T` is `U`.
pub(crate) fn downcast<T: 'static, U: 'static>(value: T) -> Option<U> {
    let boxed: Box<dyn Any> = Box::new(value);
    boxed.downcast::<U>().ok().map(|b| *b)
}
