//! Gradients with checkpointing equal those without.

mod common;

use std::num::NonZeroUsize;

use afterburner_checkpoint::{BlockKind, CheckpointPolicy, checkpoint, enable, with_policy};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use common::*;

/// (input gradient, parameter gradients) of one forward + backward.
type Grads = (Vec<f32>, Vec<Option<Vec<f32>>>);

fn run(net: &Net<B>, x: &Tensor<B, 3>, policy: Option<CheckpointPolicy>, seed: u64) -> Grads {
    let device = x.device();
    B::seed(&device, seed);
    afterburner_checkpoint::seed_blocks(seed);
    let x = x.clone().require_grad();
    let y = match policy {
        Some(policy) => with_policy(policy, || net.forward(x.clone())),
        None => net.forward_unwrapped(x.clone()),
    };
    let grads = loss(y).backward();
    (flat(x.grad(&grads).unwrap()), param_grads(net, &grads))
}

fn assert_same(a: &Grads, b: &Grads, tol: f32) -> f32 {
    let input = max_rel(&a.0, &b.0);
    assert!(
        input <= tol,
        "input gradient: max relative error {input} > {tol}"
    );
    input.max(assert_grads_close(&a.1, &b.1, tol))
}

#[test]
fn every_policy_gives_the_plain_gradients() {
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    B::seed(&device, 1);
    let net = Net::<B>::new(4, 8, 0.0, &device);
    let x = input(&device);
    let plain = run(&net, &x, None, 3);
    for policy in [
        CheckpointPolicy::None,
        CheckpointPolicy::All,
        CheckpointPolicy::EveryKth(NonZeroUsize::new(2).unwrap()),
        CheckpointPolicy::Selective,
    ] {
        let err = assert_same(&run(&net, &x, Some(policy), 3), &plain, 1e-6);
        println!("{policy}: max relative error {err:e}");
    }
    // The unused parameter of block 0 gets no gradient in either run.
    assert!(plain.1.iter().any(Option::is_none));
}

#[test]
fn dropout_replays_in_the_recompute() {
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    B::seed(&device, 2);
    let net = Net::<B>::new(3, 8, 0.3, &device);
    let x = input(&device);
    let kept = run(&net, &x, Some(CheckpointPolicy::None), 5);
    let recomputed = run(&net, &x, Some(CheckpointPolicy::All), 5);
    let err = assert_same(&recomputed, &kept, 1e-6);
    println!("dropout 0.3, all vs none: max relative error {err:e}");

    // The test can fail: without the replay the recompute draws other masks.
    let mut unreplayed = Net::<B>::new(3, 8, 0.3, &device);
    unreplayed.blocks = net
        .blocks
        .iter()
        .map(|b| b.clone().without_rng_replay())
        .collect();
    unreplayed.head = net.head.clone();
    let a = run(&unreplayed, &x, Some(CheckpointPolicy::None), 5);
    let b = run(&unreplayed, &x, Some(CheckpointPolicy::All), 5);
    assert!(
        max_rel(&a.0, &b.0) > 1e-3,
        "dropout masks should differ without replay"
    );
}

#[test]
fn data_input_shared_parameters_and_reused_blocks() {
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    B::seed(&device, 4);
    let net = Net::<B>::new(2, 8, 0.0, &device);
    let x = input(&device);
    // The same block applied twice, its fc1 also used outside the block, and an input that
    // needs no gradient (the first block sees plain data).
    let go = |checkpointed: bool| {
        let block = &net.blocks[1];
        let fc1 = block.block.fc1.clone();
        let policy = if checkpointed {
            CheckpointPolicy::All
        } else {
            CheckpointPolicy::None
        };
        let y = with_policy(policy, || {
            let h = block.forward(x.clone(), |m: &common::Mlp<B>, x| m.forward(x));
            let h = block.forward(h, |m: &common::Mlp<B>, x| m.forward(x));
            fc1.forward(h).sum_dim(2)
        });
        let grads = loss(y).backward();
        param_grads(&net, &grads)
    };
    let err = assert_grads_close(&go(true), &go(false), 1e-6);
    println!("reused block: max relative error {err:e}");
}

#[test]
fn parameter_free_checkpoint_matches() {
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    let x = input(&device).require_grad();
    let f = |x: Tensor<B, 3>| burn::tensor::activation::softmax(x.clone() * x.exp(), 2);
    let plain = {
        let grads = loss(f(x.clone())).backward();
        flat(x.grad(&grads).unwrap())
    };
    let wrapped = {
        let y = with_policy(CheckpointPolicy::Selective, || {
            checkpoint(BlockKind::Cheap, x.clone(), f)
        });
        let grads = loss(y).backward();
        flat(x.grad(&grads).unwrap())
    };
    assert!(max_rel(&wrapped, &plain) <= 1e-6);
}

#[test]
fn the_policy_decides_which_blocks_recompute() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    let net = Net::<B>::new(4, 8, 0.0, &device);
    // Forward + recompute calls of the block closures under each policy, 4 blocks.
    let calls_under = |policy: CheckpointPolicy| {
        let calls = Arc::new(AtomicUsize::new(0));
        let x = input(&device).require_grad();
        let y = with_policy(policy, || {
            net.blocks.iter().fold(x.clone(), |x, block| {
                let calls = calls.clone();
                block.forward(x, move |m: &common::Mlp<B>, x| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    m.forward(x)
                })
            })
        });
        let _ = y.sum().backward();
        calls.load(Ordering::SeqCst)
    };
    assert_eq!(calls_under(CheckpointPolicy::None), 4);
    assert_eq!(calls_under(CheckpointPolicy::All), 8);
    assert_eq!(calls_under("every-2".parse().unwrap()), 6);
    // The blocks are `Block`s: `selective` recomputes only `Cheap` parts.
    assert_eq!(calls_under(CheckpointPolicy::Selective), 4);
}

#[test]
fn outside_a_policy_wrappers_are_transparent_even_with_dropout() {
    let _lock = rng_lock();
    enable::<B>();
    let device = Default::default();
    B::seed(&device, 6);
    let net = Net::<B>::new(3, 8, 0.3, &device);
    let x = input(&device);
    let run = |wrapped: bool| {
        B::seed(&device, 9);
        let x = x.clone().require_grad();
        // The wrappers neither checkpoint nor touch the RNG: the same masks as the plain model.
        let y = if wrapped {
            net.forward(x.clone())
        } else {
            net.forward_unwrapped(x.clone())
        };
        let grads = loss(y).backward();
        (flat(x.grad(&grads).unwrap()), param_grads(&net, &grads))
    };
    assert_same(&run(true), &run(false), 0.0);
}
