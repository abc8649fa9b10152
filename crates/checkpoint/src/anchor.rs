//! The block input: while a [`Checkpointed`](crate::Checkpointed) block reads its parameters
//! (before it runs), its input is this thread's block input. A strategy whose lazy parameters
//! add an autodiff node (DDP's gradient hook) ties that node to it, so Burn's backward runs
//! the node right after the block's own backward instead of at the very end (Burn orders the
//! backward by each node's depth, and a parameter's own depth is 0).

use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::scope::{ByBackend, with_value};

thread_local! {
    static INPUT: ByBackend = RefCell::new(HashMap::new());
}

/// The input of the checkpointed block whose parameters are being read on this thread, on
/// backend `B`; `None` outside such a read.
pub fn block_input<B: Backend>() -> Option<FloatTensor<B>> {
    INPUT.with_borrow(|map| {
        map.get(&TypeId::of::<B>())
            .and_then(|input| input.downcast_ref::<FloatTensor<B>>())
            .cloned()
    })
}

/// Runs `read` (the block reading its parameters) with `input` as the block input.
pub(crate) fn with_block_input<B: Backend, R>(
    input: FloatTensor<B>,
    read: impl FnOnce() -> R,
) -> R {
    with_value::<B, _>(&INPUT, Box::new(input), read)
}
