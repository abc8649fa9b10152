//! Gradient accumulation: the mean of N micro-batch gradients, one optimizer step per N, a
//! flush at the end of an epoch.

mod common;

use afterburner::{Accelerator, AcceleratorConfig, StepOutcome};
use afterburner_demos::{ImageBatcher, digits};
use burn::optim::SgdConfig;
use common::*;

fn accelerator(steps: usize) -> Accelerator<B> {
    let config = AcceleratorConfig {
        gradient_accumulation_steps: steps,
        ..Default::default()
    };
    Accelerator::new(config, Default::default()).unwrap()
}

const BATCHER: ImageBatcher = ImageBatcher {
    channels: 1,
    height: 8,
    width: 8,
};

/// Trains on `items` with micro-batches of `micro` and `steps` accumulation steps; returns
/// the flattened parameters and the optimizer steps taken.
fn train(micro: usize, steps: usize, n_items: usize) -> (Vec<f32>, Vec<f32>, u64) {
    let mut acc = accelerator(steps);
    let (mut model, mut optim) = acc.setup(vit(9), SgdConfig::new().init()).unwrap();
    let initial = flatten(&params(&model));
    let items = digits::load().unwrap().take(n_items);
    let loader = acc.dataloader(items, BATCHER, micro).unwrap();
    for (i, batch) in loader.epoch(0).enumerate() {
        let logits = acc
            .forward(&model, batch.images.clone(), |m, x| m.forward(x))
            .unwrap();
        acc.backward(cross_entropy(logits, &batch), &model).unwrap();
        let will_step = acc.sync_gradients();
        model = acc.step(model, &mut optim, &mut 0.5).unwrap();
        let stepped = matches!(acc.last_step(), StepOutcome::Stepped { .. });
        assert_eq!(stepped, will_step, "micro-batch {i}");
    }
    (
        initial,
        flatten(&params(&model)),
        acc.counters().optimizer_steps,
    )
}

fn compare(
    name: &str,
    (init_a, a, _): &(Vec<f32>, Vec<f32>, u64),
    (init_b, b, _): &(Vec<f32>, Vec<f32>, u64),
) {
    assert_eq!(init_a, init_b);
    let param_err = max_rel(a, b, 1e-3);
    let update_a: Vec<f32> = a.iter().zip(init_a).map(|(x, y)| x - y).collect();
    let update_b: Vec<f32> = b.iter().zip(init_b).map(|(x, y)| x - y).collect();
    let update_err = rel_l2(&update_a, &update_b);
    println!(
        "{name}: parameters max relative diff {param_err:.2e}, updates relative L2 {update_err:.2e}"
    );
    // Flex's multithreaded gemm (burn-flex's `rayon`, on since the Trainer's burn-train
    // dependency) splits a batch of 32 and four of 8 differently, so single near-zero
    // parameters move by a few 1e-5 relative; the updates as a whole agree to 1e-6.
    assert!(param_err < 1e-4, "{name}: parameters differ by {param_err}");
    assert!(update_err < 1e-4, "{name}: updates differ by {update_err}");
    assert!(update_b.iter().any(|u| *u != 0.0));
}

#[test]
fn four_micro_batches_equal_one_big_batch() {
    let _rng = rng_lock();
    // 3 optimizer steps either way: 12 micro-batches of 8, or 3 batches of 32.
    let accumulated = train(8, 4, 96);
    let big = train(32, 1, 96);
    assert_eq!(accumulated.2, 3, "one optimizer step per 4 micro-batches");
    assert_eq!(big.2, 3);
    compare("accumulate 4 x 8 vs batch 32", &accumulated, &big);
}

#[test]
fn epoch_end_flushes_a_short_cycle_with_its_mean() {
    let _rng = rng_lock();
    // 6 micro-batches of 8 with 4 accumulation steps: a step after 4, a flush after 2 more.
    let accumulated = train(8, 4, 48);
    let reference = train(32, 1, 48); // batches of 32 and 16, same shuffled order
    assert_eq!(accumulated.2, 2);
    assert_eq!(reference.2, 2);
    compare("flush 4 + 2 vs 32 + 16", &accumulated, &reference);
}

#[test]
fn step_before_backward_is_a_usage_error() {
    let _rng = rng_lock();
    let mut acc = accelerator(2);
    let (model, mut optim) = acc.setup(vit(1), SgdConfig::new().init()).unwrap();
    let err = acc
        .step(model, &mut optim, &mut 0.1)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("backward() first"), "{err}");
}

/// A loop that takes each cycle's batches before training them (to count their items, as
/// HF's `num_items_in_batch`) steps once per cycle, like a loop that takes them one at a
/// time: the epoch's end, reached when its last batch is taken, flushes only the last cycle.
#[test]
fn taking_a_cycles_batches_first_steps_once_per_cycle() {
    let _rng = rng_lock();
    let run = |per_take: usize| {
        let mut acc = accelerator(3);
        let (mut model, mut optim) = acc.setup(vit(9), SgdConfig::new().init()).unwrap();
        // 8 batches: cycles of 3, 3 and 2.
        let loader = acc
            .dataloader(digits::load().unwrap().take(64), BATCHER, 8)
            .unwrap();
        let mut epoch = loader.epoch(0);
        loop {
            let taken: Vec<_> = epoch.by_ref().take(per_take).collect();
            if taken.is_empty() {
                break;
            }
            for batch in taken {
                let logits = acc
                    .forward(&model, batch.images.clone(), |m, x| m.forward(x))
                    .unwrap();
                acc.backward(cross_entropy(logits, &batch), &model).unwrap();
                model = acc.step(model, &mut optim, &mut 0.5).unwrap();
            }
        }
        (acc.counters().optimizer_steps, flatten(&params(&model)))
    };
    let (steps, one_by_one) = run(1);
    assert_eq!(steps, 3);
    let (steps, cycle_first) = run(3);
    assert_eq!(
        steps, 3,
        "the last cycle's micro-batches, taken first, must not step one by one"
    );
    assert_eq!(cycle_first, one_by_one);
}
