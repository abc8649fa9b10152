//! Softmax as one autodiff node (`nodes.rs` says when it runs): computed in f32 on the inner
//! backend, as autocast runs softmax, keeping for backward only a half copy of its output,
//! which is also the recorded half cast the next half op reads (attention's weights times its
//! values), so the two share one copy.
//!
//! Burn's Autodiff decomposes softmax and saves `exp`'s input (it recomputes `exp` from it) and
//! the division's numerator, in f32 under autocast, beside the half copy the matmul saves: 10
//! bytes a value where the half view keeps 6 (the same in half) and this node 2. The price:
//! the softmax's backward reads its output rounded to half (PyTorch keeps an f32 copy for it),
//! the copy the matmul's backward reads anyway.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorMetadata};

use super::promote;

/// Burn's autodiff float primitive over `I`: a value and its graph node.
type Tracked<I> = FloatTensor<Autodiff<I>>;

/// `softmax(x, dim)` in f32, and its cast to `half` recorded as a cast of it (sharing the
/// half copy the softmax keeps for backward).
pub(super) fn softmax_node<I: Backend>(
    x: Tracked<I>,
    dim: usize,
    half: DType,
) -> (Tracked<I>, Tracked<I>) {
    let x_dtype = x.primitive.dtype();
    let y = I::softmax(promote::cast::<I>(x.primitive, DType::F32), dim);
    let y_half = promote::cast::<I>(y.clone(), half);
    let out = match SoftmaxNode
        .prepare::<NoCheckpointing>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            Saved::<I> {
                y_half: y_half.clone(),
                dim,
                x_dtype,
            },
            y,
        ),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    let cast = match CastNode
        .prepare::<NoCheckpointing>([out.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(DType::F32, y_half),
        OpsKind::UnTracked(prep) => prep.finish(y_half),
    };
    (out, cast)
}

#[derive(Debug)]
struct SoftmaxNode;

/// What the softmax keeps for the backward pass.
#[derive(Debug, Clone)]
struct Saved<I: Backend> {
    y_half: FloatTensor<I>,
    dim: usize,
    x_dtype: DType,
}

impl<I: Backend> Backward<I, 1> for SoftmaxNode {
    type State = Saved<I>;

    /// `dx = y * (g - sum(g * y))` over `dim`, in f32, delivered in the input's dtype.
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<I>(&ops.node);
        let [Some(parent)] = ops.parents else {
            return;
        };
        let Saved {
            y_half,
            dim,
            x_dtype,
        } = ops.state;
        let y = promote::cast::<I>(y_half, DType::F32);
        let grad_y = I::float_mul(promote::cast::<I>(grad, DType::F32), y.clone());
        let sum = I::float_sum_dim(grad_y.clone(), dim);
        let dx = I::float_sub(grad_y, I::float_mul(y, sum));
        grads.register::<I>(parent.id, promote::cast::<I>(dx, x_dtype));
    }
}

/// The recorded cast of the softmax's f32 output to half: its backward hands the gradient on
/// in f32.
#[derive(Debug)]
struct CastNode;

impl<I: Backend> Backward<I, 1> for CastNode {
    type State = DType;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<I>(&ops.node);
        if let [Some(parent)] = ops.parents {
            grads.register::<I>(parent.id, promote::cast::<I>(grad, ops.state));
        }
    }
}
