//! Tensor parallelism's two collectives as autodiff nodes (Megatron's `f` and `g`):
//! [`copy_to_ranks`] is the identity forward and an all-reduce (sum) of the gradient backward,
//! [`sum_over_ranks`] an all-reduce (sum) forward and the identity backward. A column-parallel
//! Linear followed by a row-parallel one needs one of each: one all-reduce forward, one
//! backward. A collective failing inside Burn's backward is recorded in the [`Exchange`]
//! (zeros flow on) and reported by [`TensorParallel::check`](super::TensorParallel::check).

use std::marker::PhantomData;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive};

use crate::ProcessGroup;
use crate::fsdp::gather::{Exchange, downcast};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;
/// Burn's autodiff float primitive on inner backend `I`.
type Tracked<I> = FloatTensor<Autodiff<I>>;

/// `x` unchanged; its gradient is summed over the ranks in backward (the input of a
/// column-parallel layer, whose ranks each use all of it).
pub(crate) fn copy_to_ranks<B, G, const D: usize>(
    x: Tensor<B, D>,
    exchange: &Exchange<G>,
) -> Tensor<B, D>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    let value = x.clone().inner();
    attach(x, value, exchange, true)
}

/// The sum of every rank's `x` (the partial outputs of a row-parallel layer, reduced in f32);
/// its gradient reaches `x` unchanged in backward.
pub(crate) fn sum_over_ranks<B, G, const D: usize>(
    x: Tensor<B, D>,
    exchange: &Exchange<G>,
) -> Tensor<B, D>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    let shape = x.shape();
    let flat: Tensor<Inner<B>, 1> = x.clone().inner().reshape([shape.num_elements()]);
    // Summed and kept in f32: a half input's partial products are not rounded twice.
    let value = exchange
        .all_reduce_sum(flat.cast(DType::F32))
        .reshape(shape);
    attach(x, value, exchange, false)
}

/// A node whose value is `value` and whose parent is `x`: backward passes the gradient to `x`,
/// summed over the ranks when `reduce` is set.
fn attach<B, G, const D: usize>(
    x: Tensor<B, D>,
    value: Tensor<Inner<B>, D>,
    exchange: &Exchange<G>,
    reduce: bool,
) -> Tensor<B, D>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    let input_dtype = x.dtype();
    let Some(node) = downcast::<_, Tracked<Inner<B>>>(x.into_primitive().tensor()) else {
        // Not Burn's autodiff: no graph to attach to (TensorParallel::new refuses it).
        return Tensor::from_inner(value);
    };
    let state = TpState {
        exchange: exchange.clone(),
        reduce,
        input_dtype,
    };
    let value = value.into_primitive().tensor();
    let out = match TpNode::<G>(PhantomData)
        .prepare::<NoCheckpointing>([node.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    };
    let out = downcast::<_, FloatTensor<B>>(out).expect("B is Burn's Autodiff (checked above)");
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The backward node of [`copy_to_ranks`] and [`sum_over_ranks`].
struct TpNode<G>(PhantomData<fn() -> G>);

impl<G> std::fmt::Debug for TpNode<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TpNode")
    }
}

struct TpState<G> {
    exchange: Exchange<G>,
    /// Sum the gradient over the ranks (`copy_to_ranks`), or pass it on (`sum_over_ranks`).
    reduce: bool,
    /// The input's dtype, the gradient's on the way back (`sum_over_ranks` outputs f32).
    input_dtype: DType,
}

impl<G> Clone for TpState<G> {
    fn clone(&self) -> Self {
        Self {
            exchange: self.exchange.clone(),
            reduce: self.reduce,
            input_dtype: self.input_dtype,
        }
    }
}

impl<G> std::fmt::Debug for TpState<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpState")
            .field("reduce", &self.reduce)
            .finish()
    }
}

impl<I: Backend, G: ProcessGroup<I> + 'static> Backward<I, 1> for TpNode<G> {
    type State = TpState<G>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<I>(&ops.node);
        let [parent] = ops.parents;
        let Some(parent) = parent else { return };
        let grad = match ops.state.reduce {
            false => I::float_cast(grad, ops.state.input_dtype.into()),
            true => {
                let shape = grad.shape();
                let flat = I::float_reshape(grad, Shape::new([shape.num_elements()]));
                let flat = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(flat));
                let sum = ops.state.exchange.all_reduce_sum(flat);
                I::float_reshape(sum.into_primitive().tensor(), shape)
            }
        };
        grads.register::<I>(parent.id, grad);
    }
}
