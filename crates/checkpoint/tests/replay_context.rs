//! `with_replay_context`: a checkpointed block's recompute (on the helper thread) runs inside
//! the context recorded at its forward, as torch.utils.checkpoint restores the forward's
//! autocast state; without one it runs bare.

mod common;

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use afterburner_checkpoint::{
    CheckpointPolicy, Checkpointed, ReplayContext, enable, with_policy, with_replay_context,
};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use common::*;

thread_local! {
    /// Set while the test's context runs a closure, on whichever thread that is.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether each run of the block (forward, then recompute) was inside the context.
fn runs(context: Option<ReplayContext>) -> Vec<bool> {
    enable::<B>();
    let device = Default::default();
    B::seed(&device, 3);
    let linear: Linear<B> = initialised(LinearConfig::new(4, 4).init(&device));
    let wrapped = Checkpointed::new(linear);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let block = move |l: &Linear<B>, x| {
        log.lock().unwrap().push(INSIDE.get());
        l.forward(x).tanh()
    };
    let x = Tensor::<B, 2>::ones([2, 4], &device).require_grad();
    let forward = || wrapped.forward(x.clone(), block);
    let y = with_policy(CheckpointPolicy::All, || match context {
        Some(context) => with_replay_context(context, forward),
        None => forward(),
    });
    let grads = y.sum().backward();
    assert!(x.grad(&grads).is_some());
    seen.lock().unwrap().clone()
}

#[test]
fn the_recompute_runs_inside_the_forwards_replay_context() {
    let _lock = rng_lock();
    let context: ReplayContext = Arc::new(|f| {
        INSIDE.set(true);
        f();
        INSIDE.set(false);
    });
    assert_eq!(runs(Some(context)), [false, true], "forward, recompute");
    assert_eq!(runs(None), [false, false]);
}
