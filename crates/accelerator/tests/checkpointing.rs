//! Activation checkpointing through the Accelerator: training with `gradient_checkpointing`
//! on equals training with it off, under mixed precision, accumulation and dropout.

mod common;

use afterburner_accelerator::{
    AccelerateError, Accelerator, AcceleratorConfig, CheckpointPolicy, Precision,
};
use afterburner_demos::models::TransformerConfig;
use afterburner_demos::{ImageBatcher, digits};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::{Distribution, Int, Tensor};
use common::*;

/// Trains the tiny ViT (dropout 0.1) for 3 optimizer steps of 2 micro-batches; returns the
/// flattened parameters.
fn train_vit(precision: Precision, policy: CheckpointPolicy) -> Vec<f32> {
    let config = AcceleratorConfig {
        precision,
        gradient_accumulation_steps: 2,
        max_grad_norm: Some(1.0),
        gradient_checkpointing: policy,
        ..Default::default()
    };
    let mut acc = Accelerator::<B>::new(config, Default::default()).unwrap();
    <B as burn::tensor::backend::Backend>::seed(&Default::default(), 21);
    let model = tiny_vit().with_dropout(0.1).init::<B>(&Default::default());
    let (mut model, mut optim) = acc.setup(model, AdamWConfig::new().init()).unwrap();
    let batcher = ImageBatcher {
        channels: 1,
        height: 8,
        width: 8,
    };
    let items = digits::load().unwrap().take(96);
    let loader = acc.dataloader(items, batcher, 16).unwrap();
    for batch in loader.epoch(0) {
        let logits = acc
            .forward(&model, batch.images.clone(), |m, x| m.forward(x))
            .unwrap();
        acc.backward(cross_entropy(logits, &batch), &model).unwrap();
        model = acc.step(model, &mut optim, &mut 1e-3).unwrap();
    }
    assert_eq!(acc.counters().optimizer_steps, 3);
    flatten(&params(&model))
}

#[test]
fn vit_training_is_identical_with_checkpointing_on_and_off() {
    let _rng = rng_lock();
    for precision in [Precision::Full32, Precision::Bf16Mixed] {
        let off = train_vit(precision, CheckpointPolicy::None);
        let on = train_vit(precision, CheckpointPolicy::All);
        let err = max_rel(&on, &off, 1e-3);
        println!("{precision}: parameters after 3 steps, all vs none: max relative diff {err:e}");
        assert!(err <= 1e-6, "{precision}: {err}");
        // The test can fail: dropout makes different seeds give different parameters.
        assert_ne!(on, train_vit_other_seed(precision));
    }
}

fn train_vit_other_seed(precision: Precision) -> Vec<f32> {
    let config = AcceleratorConfig {
        precision,
        seed: 7,
        gradient_accumulation_steps: 2,
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    let mut acc = Accelerator::<B>::new(config, Default::default()).unwrap();
    <B as burn::tensor::backend::Backend>::seed(&Default::default(), 21);
    let model = tiny_vit().with_dropout(0.1).init::<B>(&Default::default());
    let (mut model, mut optim) = acc.setup(model, AdamWConfig::new().init()).unwrap();
    let batch = digits_batch(0, 16);
    for _ in 0..6 {
        let logits = acc
            .forward(&model, batch.images.clone(), |m, x| m.forward(x))
            .unwrap();
        acc.backward(cross_entropy(logits, &batch), &model).unwrap();
        model = acc.step(model, &mut optim, &mut 1e-3).unwrap();
    }
    flatten(&params(&model))
}

#[test]
fn transformer_gradients_match_under_every_policy() {
    let _rng = rng_lock();
    let device = Default::default();
    let grads_under = |policy: CheckpointPolicy| {
        let config = AcceleratorConfig {
            gradient_checkpointing: policy,
            ..Default::default()
        };
        let acc = Accelerator::<B>::new(config, device).unwrap();
        <B as burn::tensor::backend::Backend>::seed(&device, 5);
        let model = TransformerConfig::new()
            .with_d_model(16)
            .with_n_heads(2)
            .with_n_layers(4)
            .with_vocab_size(13)
            .with_max_seq_len(6)
            .init::<B>(&device);
        let model = acc.setup_model(model).unwrap();
        let tokens: Tensor<B, 2, Int> =
            Tensor::<B, 2>::random([3, 6], Distribution::Uniform(0.0, 13.0), &device).int();
        let logits = acc
            .forward(&model, (), |m, ()| m.forward(tokens.clone()))
            .unwrap();
        let loss = CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits.reshape([18, 13]), tokens.reshape([18]));
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
        grads_of(&model, &grads)
    };
    let off = grads_under(CheckpointPolicy::None);
    for policy in ["all", "every-2", "selective"] {
        let got = grads_under(policy.parse().unwrap());
        // Per parameter: largest |difference| over largest |gradient|.
        let err = got
            .iter()
            .zip(&off)
            .map(|(a, b)| {
                let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
                a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
            })
            .fold(0f32, f32::max);
        println!("transformer, {policy} vs none: gradients max relative error {err:e}");
        assert!(err <= 1e-6, "{policy}: {err}");
    }
}

#[test]
fn balanced_policy_needs_the_balanced_backend() {
    let _rng = rng_lock();
    let config = AcceleratorConfig {
        gradient_checkpointing: CheckpointPolicy::Balanced,
        ..Default::default()
    };
    let err = Accelerator::<B>::new(config.clone(), Default::default())
        .err()
        .expect("Autodiff<Flex> is not BalancedCheckpointing");
    assert!(matches!(err, AccelerateError::Checkpoint(_)));
    assert!(err.to_string().contains("BalancedCheckpointing"), "{err}");
    type Bal = afterburner_accelerator::checkpoint::Balanced<burn::backend::Flex>;
    assert!(Accelerator::<Bal>::new(config, Default::default()).is_ok());
}
