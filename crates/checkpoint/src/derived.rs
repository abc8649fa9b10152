//! Derived parameters: parameters computed from other tensors, like FSDP's full parameters
//! gathered from their shards. A checkpointed block whose parameters are derived keeps their
//! *sources* (the shards) instead of their values, builds the values for its forward pass and
//! drops them after, and builds them again in the recompute: the gathered parameters live only
//! while their block runs (PyTorch FSDP's `reshard_after_forward`).

use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::scope::{ByBackend, with_value};

/// Builds a group's parameter values from its sources (called with tracked sources in the
/// recompute, so its ops must be differentiable).
pub type BuildFn<B> = Arc<dyn Fn(Vec<FloatTensor<B>>) -> Vec<FloatTensor<B>> + Send + Sync>;

/// Parameters computed together from the same sources (one FSDP unit: one gather).
#[derive(Clone)]
pub struct DerivedParams<B: Backend> {
    /// The parameters `build` returns, in its order.
    pub ids: Vec<ParamId>,
    /// The tensors they are computed from (tracked: their gradients are what training needs).
    pub sources: Vec<FloatTensor<B>>,
    /// Sources to values.
    pub build: BuildFn<B>,
}

type Groups<B> = HashMap<ParamId, (Arc<DerivedParams<B>>, usize)>;

thread_local! {
    static DERIVED: ByBackend = RefCell::new(HashMap::new());
}

/// Runs `forward` with `groups` declared: checkpointed blocks that recompute and hold one of
/// their parameters keep the group's sources instead of the parameter's value.
pub fn with_derived_params<B: Backend, R>(
    groups: Vec<DerivedParams<B>>,
    forward: impl FnOnce() -> R,
) -> R {
    let mut by_id: Groups<B> = HashMap::new();
    for group in groups {
        let group = Arc::new(group);
        for (position, id) in group.ids.iter().enumerate() {
            by_id.insert(*id, (group.clone(), position));
        }
    }
    with_value::<B, _>(&DERIVED, Box::new(by_id), forward)
}

/// The group parameter `id` belongs to in the current scope, and its position in the group.
pub(crate) fn lookup<B: Backend>(id: ParamId) -> Option<(Arc<DerivedParams<B>>, usize)> {
    DERIVED.with_borrow(|map| {
        map.get(&TypeId::of::<B>())?
            .downcast_ref::<Groups<B>>()?
            .get(&id)
            .cloned()
    })
}
