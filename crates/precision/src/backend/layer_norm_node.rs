//! LayerNorm as one autodiff node (`nodes.rs` says when it runs): the output computed on the
//! inner backend in f32, only the input kept for backward, the statistics recomputed there.
//! Burn's Autodiff decomposes `layer_norm` into basic ops that save the centred input and the
//! normalised output; PyTorch's fused layer norm saves the input and per-row mean and 1/std.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};

use super::promote;

/// Burn's autodiff float primitive over `I`: a value and its graph node.
type Tracked<I> = FloatTensor<Autodiff<I>>;

/// The node: the output computed on `I` in f32, the input, gamma and epsilon kept for the
/// backward pass.
pub(super) fn layer_norm_node<I: Backend>(
    x: Tracked<I>,
    gamma: Tracked<I>,
    beta: Tracked<I>,
    epsilon: f64,
) -> Tracked<I> {
    let out = forward::<I>(
        x.primitive.clone(),
        gamma.primitive.clone(),
        beta.primitive.clone(),
        epsilon,
    );
    let prep = LayerNormNode
        .prepare::<NoCheckpointing>([x.node.clone(), gamma.node.clone(), beta.node.clone()])
        .compute_bound()
        .stateful();
    match prep {
        OpsKind::Tracked(prep) => prep.finish(
            Saved::<I> {
                x: x.primitive,
                gamma: gamma.primitive,
                beta_dtype: beta.primitive.dtype(),
                epsilon,
            },
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

#[derive(Debug)]
struct LayerNormNode;

/// What the node keeps for the backward pass.
#[derive(Debug, Clone)]
struct Saved<I: Backend> {
    x: FloatTensor<I>,
    gamma: FloatTensor<I>,
    beta_dtype: DType,
    epsilon: f64,
}

impl<I: Backend> Backward<I, 3> for LayerNormNode {
    type State = Saved<I>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<I>(&ops.node);
        let [x_node, gamma_node, beta_node] = ops.parents;
        let s = ops.state;
        let (dx, dgamma, dbeta) = backward::<I>(s.x, s.gamma, s.beta_dtype, grad, s.epsilon);
        for (node, grad) in [(x_node, dx), (gamma_node, dgamma), (beta_node, dbeta)] {
            if let Some(node) = node {
                grads.register::<I>(node.id, grad);
            }
        }
    }
}

/// `x` in f32, normalised over its last dim, and 1/std per row (kept dims).
fn normalise<I: Backend>(x: FloatTensor<I>, epsilon: f64) -> (FloatTensor<I>, FloatTensor<I>) {
    let x = promote::cast::<I>(x, DType::F32);
    let last = x.shape().num_dims() - 1;
    let mean = I::float_mean_dim(x.clone(), last);
    let centred = I::float_sub(x, mean);
    let var = I::float_mean_dim(I::float_mul(centred.clone(), centred.clone()), last);
    let rstd = I::float_recip(I::float_sqrt(I::float_add_scalar(var, epsilon.into())));
    (I::float_mul(centred, rstd.clone()), rstd)
}

/// A `[d]` parameter in f32, shaped to broadcast against `like`'s last dim.
fn broadcast_param<I: Backend>(param: FloatTensor<I>, like: &FloatTensor<I>) -> FloatTensor<I> {
    let dims = like.shape().num_dims();
    let mut shape = vec![1; dims];
    shape[dims - 1] = like.shape()[dims - 1];
    I::float_reshape(promote::cast::<I>(param, DType::F32), Shape::from(shape))
}

/// `normalise(x) * gamma + beta`, in f32.
fn forward<I: Backend>(
    x: FloatTensor<I>,
    gamma: FloatTensor<I>,
    beta: FloatTensor<I>,
    epsilon: f64,
) -> FloatTensor<I> {
    let (xhat, _) = normalise::<I>(x, epsilon);
    let gamma = broadcast_param::<I>(gamma, &xhat);
    let beta = broadcast_param::<I>(beta, &xhat);
    I::float_add(I::float_mul(xhat, gamma), beta)
}

/// The gradients of x, gamma and beta (each in its tensor's dtype) from the output's:
/// `dx = rstd * (g*gamma - mean(g*gamma) - xhat * mean(g*gamma*xhat))`, `dgamma = sum(g*xhat)`,
/// `dbeta = sum(g)` over every row.
fn backward<I: Backend>(
    x: FloatTensor<I>,
    gamma: FloatTensor<I>,
    beta_dtype: DType,
    grad: FloatTensor<I>,
    epsilon: f64,
) -> (FloatTensor<I>, FloatTensor<I>, FloatTensor<I>) {
    let (x_dtype, gamma_dtype) = (x.dtype(), gamma.dtype());
    let (xhat, rstd) = normalise::<I>(x, epsilon);
    let grad = promote::cast::<I>(grad, DType::F32);
    let last = xhat.shape().num_dims() - 1;
    let width = xhat.shape()[last];
    let rows = xhat.shape().num_elements() / width;
    let row_sum = |t: FloatTensor<I>| {
        let t = I::float_reshape(t, Shape::new([rows, width]));
        I::float_reshape(I::float_sum_dim(t, 0), Shape::new([width]))
    };
    // The parameters' gradients first, so that `grad` is consumed by `dxhat` instead of living
    // beside it: one row-sized f32 tensor fewer at this backward's peak.
    let dgamma = row_sum(I::float_mul(grad.clone(), xhat.clone()));
    let dbeta = row_sum(grad.clone());
    let dxhat = I::float_mul(grad, broadcast_param::<I>(gamma, &xhat));
    let mean_dxhat = I::float_mean_dim(dxhat.clone(), last);
    let mean_dxhat_xhat = I::float_mean_dim(I::float_mul(dxhat.clone(), xhat.clone()), last);
    let centred_dxhat = I::float_sub(dxhat, mean_dxhat);
    let dx = I::float_mul(
        I::float_sub(centred_dxhat, I::float_mul(xhat, mean_dxhat_xhat)),
        rstd,
    );
    (
        promote::cast::<I>(dx, x_dtype),
        promote::cast::<I>(dgamma, gamma_dtype),
        promote::cast::<I>(dbeta, beta_dtype),
    )
}
