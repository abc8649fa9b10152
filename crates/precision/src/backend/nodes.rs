//! LayerNorm and softmax as one autodiff node each, and one half cast per activation per scope,
//! under op-level autocast when `Autocast` sits above Burn's Autodiff (`Autocast<Autodiff<I>>`,
//! the casts recorded).
//!
//! Autodiff decomposes `layer_norm` into basic ops, each saving its operands: autocast runs it
//! in f32, so the centred input and the normalised output are saved as two f32 copies of the
//! activation (the half view saves the same two in half). As one node (`layer_norm_node.rs`)
//! it saves only its input. Softmax, decomposed, saves `exp`'s input and output in f32; as one
//! node (`softmax_node.rs`) it saves a half copy of its output, which is also the cached cast
//! the next half op reads.
//!
//! A recorded cast is saved by the half op that reads it; attention's query, key and value
//! projections each cast the same LayerNorm output, so the scope caches casts of tracked tensors
//! (PyTorch's autocast caches the casts of its weights) and they share one half copy.
//!
//! `Autocast<B>`'s ops are generic over `B: Backend` and cannot name Autodiff's node API, so
//! the node and the cache are reached through a registry keyed by the float primitive's type,
//! filled by [`record_autocast_nodes`] where the autodiff backend is known
//! (`PrecisionPlugin::new`).

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::{OnceLock, PoisonError, RwLock};

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorMetadata};

use super::layer_norm_node::layer_norm_node;
use super::promote;
use super::softmax_node::softmax_node;

/// Burn's autodiff float primitive over `I`: a value and its graph node.
type Tracked<I> = FloatTensor<Autodiff<I>>;
/// A float primitive of a type the registry knows.
type Erased = Box<dyn Any + Send>;

/// The nodes registered for one autodiff float primitive type.
#[derive(Clone, Copy)]
struct Nodes {
    layer_norm: fn(Erased, Erased, Erased, f64) -> Erased,
    /// Softmax in f32 over a dim, and its half cast (in the given dtype), sharing one copy.
    softmax: fn(Erased, usize, DType) -> (Erased, Erased),
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
    remember(key, Box::new(cast.clone()));
    cast
}

/// Keeps `cast` as this scope's cast for `key`, forgetting the oldest beyond the bound.
fn remember(key: CastKey, cast: Box<dyn Any>) {
    CASTS.with(|casts| {
        let mut casts = casts.borrow_mut();
        if casts.len() == CACHED_CASTS {
            casts.pop_front();
        }
        casts.push_back((key, cast));
    });
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
/// saves only its input and softmax as one that saves a half copy of its output, and cast each
/// tracked tensor once per scope (this module's docs).
/// Without it that backend computes the same values, keeping more for backward. Does nothing
/// for other backends.
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
                softmax: erased_softmax::<B::InnerBackend>,
                tracked_id: tracked_id::<B::InnerBackend>,
            },
        );
}

/// A layer norm's input, gamma and beta.
pub(super) type NormOperands<B> = (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>);

/// Whether `x` may go through a node that computes in f32: an f64 tensor keeps its width, as
/// autocast leaves f64 ops alone.
fn narrows_to_f32<B: Backend>(x: &FloatTensor<B>) -> bool {
    x.dtype() != DType::F64
}

/// LayerNorm in f32 as one node, when `B`'s float primitive is a registered autodiff one, the
/// input is not f64 and the norm has a bias; `Err` gives the operands back otherwise.
pub(super) fn layer_norm<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    epsilon: f64,
) -> Result<FloatTensor<B>, NormOperands<B>> {
    let nodes = nodes::<B>().filter(|_| narrows_to_f32::<B>(&x));
    let (Some(nodes), Some(beta)) = (nodes, beta.clone()) else {
        return Err((x, gamma, beta));
    };
    let out = (nodes.layer_norm)(Box::new(x), Box::new(gamma), Box::new(beta), epsilon);
    Ok(*out
        .downcast::<FloatTensor<B>>()
        .expect("the registry maps a type to its own nodes"))
}

/// Softmax in f32 as one node keeping a half copy (`half`) of its output, which becomes this
/// scope's cached cast of the output, when `B`'s float primitive is a registered autodiff one
/// and `x` is tracked and not f64; `Err` gives `x` back otherwise.
pub(super) fn softmax<B: Backend>(
    x: FloatTensor<B>,
    dim: usize,
    half: DType,
) -> Result<FloatTensor<B>, FloatTensor<B>> {
    let tracked = |nodes: &Nodes| (nodes.tracked_id)(&x).is_some() && narrows_to_f32::<B>(&x);
    let Some(nodes) = nodes::<B>().filter(tracked) else {
        return Err(x);
    };
    let (out, cast) = (nodes.softmax)(Box::new(x), dim, half);
    let out = *out
        .downcast::<FloatTensor<B>>()
        .expect("the registry maps a type to its own nodes");
    if let Some(id) = (nodes.tracked_id)(&out) {
        remember((TypeId::of::<FloatTensor<B>>(), id, half), cast);
    }
    Ok(out)
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

fn erased_softmax<I: Backend>(x: Erased, dim: usize, half: DType) -> (Erased, Erased) {
    let x: Tracked<I> = *x
        .downcast()
        .expect("the registry maps a type to its own nodes");
    let (out, cast) = softmax_node::<I>(x, dim, half);
    (Box::new(out), Box::new(cast))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Autocast, autocast_ops};
    use burn::backend::Flex;
    use burn::tensor::{Tensor, TensorMetadata};

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

    #[test]
    fn f64_tensors_keep_their_width_and_skip_the_f32_nodes() {
        record_autocast_nodes::<Above>();
        let device = Default::default();
        let x = Tensor::<Above, 2>::ones([2, 4], &device)
            .cast(DType::F64)
            .require_grad();
        let norm = burn::nn::LayerNormConfig::new(4).init::<Above>(&device);
        let (normed, weights) = autocast_ops(DType::BF16, || {
            (
                norm.forward(x.clone()),
                burn::tensor::activation::softmax(x.clone(), 1),
            )
        });
        assert_eq!(normed.dtype(), DType::F64, "layer norm of an f64 input");
        assert_eq!(weights.dtype(), DType::F64, "softmax of an f64 input");
    }
}
