//! Misuse and edge cases fail cleanly: plain forward where checkpointing cannot apply, a panic
//! in the recompute propagates instead of hanging.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use afterburner_checkpoint::{
    Balanced, CheckpointPolicy, Checkpointed, enable, is_balanced, with_policy,
};
use burn::backend::Flex;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use common::*;

#[test]
fn without_autodiff_the_block_simply_runs() {
    let _lock = rng_lock();
    let device = Default::default();
    let linear: Linear<Flex> = initialised(LinearConfig::new(8, 8).init(&device));
    let wrapped = Checkpointed::new(linear.clone());
    let x = Tensor::<Flex, 2>::ones([2, 8], &device);
    let y = wrapped.forward(x.clone(), |l: &Linear<Flex>, x| l.forward(x).tanh());
    y.into_data()
        .assert_eq(&linear.forward(x).tanh().into_data(), true);
}

#[test]
fn a_captured_tracked_tensor_falls_back_to_the_plain_forward() {
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    B::seed(&device, 8);
    let linear: Linear<B> = initialised(LinearConfig::new(8, 8).init(&device));
    let scale = Tensor::<B, 2>::full([1, 8], 0.5, &device).require_grad();
    let x = Tensor::<B, 2>::ones([2, 8], &device).require_grad();
    let grads_of = |wrapped: bool| {
        let captured = scale.clone();
        let f = move |l: &Linear<B>, x| l.forward(x) * captured.clone();
        let y = if wrapped {
            let block = Checkpointed::new(linear.clone());
            with_policy(CheckpointPolicy::All, || block.forward(x.clone(), f))
        } else {
            f(&linear, x.clone())
        };
        let grads = y.sum().backward();
        (
            flat(scale.grad(&grads).unwrap()),
            flat(linear.weight.val().grad(&grads).unwrap()),
        )
    };
    let (plain, wrapped) = (grads_of(false), grads_of(true));
    assert_eq!(plain, wrapped);
}

#[test]
fn a_backend_not_enabled_runs_plain_with_correct_gradients() {
    let _lock = rng_lock();
    // Balanced<Flex> is never passed to `enable` in this test binary.
    type Bal = Balanced<Flex>;
    assert!(is_balanced::<Bal>() && !is_balanced::<B>());
    assert!(!afterburner_checkpoint::is_enabled::<Bal>());
    let device = Default::default();
    let linear: Linear<Bal> = initialised(LinearConfig::new(8, 8).init(&device));
    let x = Tensor::<Bal, 2>::ones([2, 8], &device).require_grad();
    let block = Checkpointed::new(linear.clone());
    let y = with_policy(CheckpointPolicy::All, || {
        block.forward(x.clone(), |l: &Linear<Bal>, x| l.forward(x))
    });
    let grads = y.sum().backward();
    assert!(linear.weight.val().grad(&grads).is_some());
    assert!(x.grad(&grads).is_some());
}

#[test]
fn a_panic_in_the_recompute_reaches_the_caller() {
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    let linear: Linear<B> = initialised(LinearConfig::new(8, 8).init(&device));
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let x = Tensor::<B, 2>::ones([2, 8], &device).require_grad();
    let y = with_policy(CheckpointPolicy::All, || {
        Checkpointed::new(linear).forward(x.clone(), move |l: &Linear<B>, x| {
            if counter.fetch_add(1, Ordering::SeqCst) == 1 {
                panic!("block failed while recomputing");
            }
            l.forward(x)
        })
    });
    let result = catch_unwind(AssertUnwindSafe(|| y.sum().backward()));
    let Err(payload) = result else {
        panic!("the backward should fail")
    };
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(
        message.contains("block failed while recomputing"),
        "{message}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
