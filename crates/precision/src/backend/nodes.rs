//! LayerNorm as one autodiff node, and one half cast per activation per scope, under op-level
//! autocast when `Autocast` sits above Burn's Autodiff (`Autocast<Autodiff<I>>`, the casts
//! recorded).
//!
//! Autodiff decomposes `layer_norm` into basic ops, each saving its operands: autocast runs it
//! in f32, so the centred input and the normalised output are saved as two f32 copies of the
//! activation (the half view saves the same two in half). As one node it saves only its input
//! and recomputes the statistics in the backward pass, as PyTorch's fused layer norm does
//! (which also keeps the per-row mean and 1/std).
//!
//! A recorded cast is saved by the half op that reads it; attention's query, key and value
//! projections each cast the same LayerNorm output, so the scope caches casts of tracked tensors
//! (PyTorch's autocast caches the casts of its weights) and they share one half copy.
//!
//! `Autocast<B>`'s ops are generic over `B: Backend` and cannot name Autodiff's node API, so
//! the node is reached through a registry keyed by the float primitive's type, filled by
//! [`record_autocast_nodes`] where the autodiff backend is known (`PrecisionPlugin::new`).

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::{OnceLock, PoisonError, RwLock};

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};

use super::promote;

/// Burn's autodiff float primitive over `I`: a value and its graph node.
type Tracked<I> = FloatTensor<Autodiff<I>>;
/// A float primitive of a type the registry knows.
type Erased = Box<dyn Any + Send>;

/// The nodes registered for one autodiff float primitive type.
#[derive(Clone, Copy)]
struct Nodes {
    layer_norm: fn(Erased, Erased, Erased, f64) -> Erased,
    /// The graph node id of a tensor that requires a gradient, `None` for one that does not.
    tracked_id: fn(&dyn Any) -> Option<u64>,
}

/// Nodes for `FloatTensor<B>`, when registered.
fn nodes<B: Backend>() -> Option<Nodes> {
    registry()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&TypeId::of::<FloatTensor<B>>())
        .copied()
}

/// A cached cast's key: the primitive type, the graph node id of the tensor cast, the dtype.
type CastKey = (TypeId, u64, DType);

/// How many recent casts a scope keeps: enough for the reads of one activation that follow
/// each other (query, key, value), and a bound on what a scope left open for many steps holds.
const CACHED_CASTS: usize = 16;

thread_local! {
    /// The most recent half casts of tracked tensors in this thread's current autocast scope,
    /// oldest first.
    static CASTS: RefCell<VecDeque<(CastKey, Box<dyn Any>)>> = const { RefCell::new(VecDeque::new()) };
}

/// `tensor` cast to `dtype`; for a tracked tensor of a registered type, the cast made recently
/// in the same scope when there is one, so an activation read by several half ops (attention's
/// query, key and value projections) is cast, and saved for backward, once. Untracked tensors
/// (inference, checkpointed blocks' forward) are not cached, so the cache holds nothing the
/// graph would not.
pub(super) fn cached_cast<B: Backend>(tensor: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    let id = nodes::<B>().and_then(|nodes| (nodes.tracked_id)(&tensor));
    let Some(id) = id else {
        return promote::cast::<B>(tensor, dtype);
    };
    let key = (TypeId::of::<FloatTensor<B>>(), id, dtype);
    let hit = CASTS.with(|casts| {
        casts
            .borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, cast)| cast.downcast_ref::<FloatTensor<B>>().cloned())
    });
    if let Some(cast) = hit {
        return cast;
    }
    let cast = promote::cast::<B>(tensor, dtype);
    CASTS.with(|casts| {
        let mut casts = casts.borrow_mut();
        if casts.len() == CACHED_CASTS {
            casts.pop_front();
        }
        casts.push_back((key, Box::new(cast.clone())));
    });
    cast
}

/// Forgets this thread's cached casts (its outermost autocast scope ended).
pub(super) fn clear_cached_casts() {
    CASTS.with(|casts| casts.borrow_mut().clear());
}

fn registry() -> &'static RwLock<HashMap<TypeId, Nodes>> {
    static REGISTRY: OnceLock<RwLock<HashMap<TypeId, Nodes>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Lets op-level autocast on `Autocast<Autodiff<I>>` run LayerNorm as one autodiff node that
/// saves only its input (this module's docs). Does nothing for other backends.
/// `PrecisionPlugin::new` (and so the Accelerator) calls it; a plain loop on that backend calls
/// it once before training.
pub fn record_autocast_nodes<B: AutodiffBackend>() {
    if TypeId::of::<FloatTensor<B>>() != TypeId::of::<Tracked<B::InnerBackend>>() {
        return;
    }
    registry()
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(
            TypeId::of::<FloatTensor<B>>(),
            Nodes {
                layer_norm: erased_layer_norm::<B::InnerBackend>,
                tracked_id: tracked_id::<B::InnerBackend>,
            },
        );
}

/// A layer norm's input, gamma and beta.
pub(super) type NormOperands<B> = (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>);

/// LayerNorm in f32 as one node, when `B`'s float primitive is a registered autodiff one and
/// the norm has a bias; `Err` gives the operands back otherwise.
pub(super) fn layer_norm<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    epsilon: f64,
) -> Result<FloatTensor<B>, NormOperands<B>> {
    let (Some(nodes), Some(beta)) = (nodes::<B>(), beta.clone()) else {
        return Err((x, gamma, beta));
    };
    let out = (nodes.layer_norm)(Box::new(x), Box::new(gamma), Box::new(beta), epsilon);
    Ok(*out
        .downcast::<FloatTensor<B>>()
        .expect("the registry maps a type to its own nodes"))
}

fn tracked_id<I: Backend>(tensor: &dyn Any) -> Option<u64> {
    let tensor = tensor.downcast_ref::<Tracked<I>>()?;
    tensor.is_tracked().then_some(tensor.node.id.value)
}

fn erased_layer_norm<I: Backend>(x: Erased, gamma: Erased, beta: Erased, epsilon: f64) -> Erased {
    let take = |t: Erased| -> Tracked<I> {
        *t.downcast()
            .expect("the registry maps a type to its own nodes")
    };
    Box::new(layer_norm_node::<I>(
        take(x),
        take(gamma),
        take(beta),
        epsilon,
    ))
}

/// The node: the output computed on `I` in f32, the input, gamma and epsilon kept for the
/// backward pass.
fn layer_norm_node<I: Backend>(
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
    let dxhat = I::float_mul(grad.clone(), broadcast_param::<I>(gamma, &xhat));
    let mean_dxhat = I::float_mean_dim(dxhat.clone(), last);
    let mean_dxhat_xhat = I::float_mean_dim(I::float_mul(dxhat.clone(), xhat.clone()), last);
    let dx = I::float_mul(
        I::float_sub(
            I::float_sub(dxhat, mean_dxhat),
            I::float_mul(xhat.clone(), mean_dxhat_xhat),
        ),
        rstd,
    );
    let row_sum = |t: FloatTensor<I>| {
        let t = I::float_reshape(t, Shape::new([rows, width]));
        I::float_reshape(I::float_sum_dim(t, 0), Shape::new([width]))
    };
    let dgamma = row_sum(I::float_mul(grad.clone(), xhat));
    let dbeta = row_sum(grad);
    (
        promote::cast::<I>(dx, x_dtype),
        promote::cast::<I>(dgamma, gamma_dtype),
        promote::cast::<I>(dbeta, beta_dtype),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Autocast, autocast_ops};
    use burn::backend::Flex;
    use burn::tensor::Tensor;

    type Above = Autocast<Autodiff<Flex>>;

    fn cached() -> usize {
        CASTS.with(|casts| casts.borrow().len())
    }

    #[test]
    fn a_scope_casts_a_tracked_tensor_once_and_keeps_a_bounded_number() {
        record_autocast_nodes::<Above>();
        let device = Default::default();
        let tracked = || {
            Tensor::<Above, 1>::ones([4], &device)
                .require_grad()
                .into_primitive()
                .tensor()
        };
        autocast_ops(DType::BF16, || {
            let x = tracked();
            let first = cached_cast::<Autodiff<Flex>>(x.clone(), DType::BF16);
            let again = cached_cast::<Autodiff<Flex>>(x.clone(), DType::BF16);
            assert_eq!(first.node.id, again.node.id, "one cast node, shared");
            assert_eq!(first.dtype(), DType::BF16);
            let untracked = Tensor::<Above, 1>::ones([4], &device)
                .into_primitive()
                .tensor();
            let (a, b) = (
                cached_cast::<Autodiff<Flex>>(untracked.clone(), DType::BF16),
                cached_cast::<Autodiff<Flex>>(untracked, DType::BF16),
            );
            assert_ne!(a.node.id, b.node.id, "untracked tensors are not cached");
            for _ in 0..3 * CACHED_CASTS {
                cached_cast::<Autodiff<Flex>>(tracked(), DType::BF16);
            }
            assert_eq!(
                cached(),
                CACHED_CASTS,
                "a scope keeps the most recent casts only"
            );
        });
        assert_eq!(cached(), 0, "the scope's end forgets them");
    }
}
