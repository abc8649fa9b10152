//! Which backends can checkpoint: a registry from backend type to its checkpointing function.
//!
//! A wrapped block's `forward` only knows `B: Backend` (models are written that way), but
//! recomputation needs Burn's autodiff internals, which exist only for `Autodiff<_, _>`. Code
//! that knows `B: AutodiffBackend` (the Accelerator, or the user through [`enable`]) registers
//! the function once; a wrapper looks it up by type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;

use crate::autodiff;
use crate::job::Job;

/// A backend's checkpointed call: returns the block output.
pub(crate) type ApplyFn<B> = fn(Job<B>) -> FloatTensor<B>;

type Registry = RwLock<HashMap<TypeId, Box<dyn Any + Send + Sync>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Lets wrapped blocks checkpoint on the autodiff backend `B`. The `afterburner` Accelerator
/// calls it; call it yourself in a plain Burn loop (once, before training).
///
/// Without it, wrappers on `B` run their plain forward and log a warning once.
pub fn enable<B: AutodiffBackend>() {
    let apply: ApplyFn<B> = autodiff::apply::<B>;
    let mut map = registry().write().unwrap_or_else(|e| e.into_inner());
    map.insert(TypeId::of::<B>(), Box::new(apply));
}

/// Whether [`enable`] was called for `B`.
pub fn is_enabled<B: Backend>() -> bool {
    lookup::<B>().is_some()
}

pub(crate) fn lookup<B: Backend>() -> Option<ApplyFn<B>> {
    let map = registry().read().unwrap_or_else(|e| e.into_inner());
    map.get(&TypeId::of::<B>())?
        .downcast_ref::<ApplyFn<B>>()
        .copied()
}
