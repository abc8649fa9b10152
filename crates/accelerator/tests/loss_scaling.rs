//! 16-mixed dynamic loss scaling: overflow skips the step (and the LR scheduler), halves the
//! scale and leaves no NaN; the scale grows after the interval.

mod common;

use afterburner_accelerator::precision::GradScalerConfig;
use afterburner_accelerator::{Accelerator, AcceleratorConfig, StepOutcome};
use burn::optim::AdamConfig;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::Backend;
use common::*;

/// A constant LR that counts how often it was stepped.
#[derive(Clone)]
struct CountingLr(usize);

impl LrScheduler for CountingLr {
    type Record<B: Backend> = usize;
    fn step(&mut self) -> f64 {
        self.0 += 1;
        1e-3
    }
    fn to_record<B: Backend>(&self) -> usize {
        self.0
    }
    fn load_record<B: Backend>(self, record: usize) -> Self {
        Self(record)
    }
}

fn f16_accelerator(growth_interval: u32) -> Accelerator<B> {
    let config = AcceleratorConfig {
        precision: "16-mixed".parse().unwrap(),
        grad_scaler: GradScalerConfig {
            growth_interval,
            ..Default::default()
        },
        ..Default::default()
    };
    Accelerator::new(config, Default::default()).unwrap()
}

#[test]
fn overflow_skips_step_and_scheduler_and_halves_scale() {
    let _rng = rng_lock();
    let mut acc = f16_accelerator(2000);
    let (mut model, mut optim) = acc.setup(vit(2), AdamConfig::new().init()).unwrap();
    let mut lr = CountingLr(0);
    let batch = digits_batch(0, 16);
    assert_eq!(acc.loss_scale(), Some(65536.0));

    // A loss so large that loss * scale overflows f16 in the backward pass.
    let before = flatten(&params(&model));
    let logits = acc
        .forward(&model, batch.images.clone(), |m, x| m.forward(x))
        .unwrap();
    let huge = cross_entropy(logits, &batch).mul_scalar(1e30);
    acc.backward(huge, &model).unwrap();
    model = acc.step(model, &mut optim, &mut lr).unwrap();
    assert_eq!(
        acc.last_step(),
        StepOutcome::SkippedOverflow {
            loss_scale: 32768.0
        }
    );
    assert_eq!(acc.loss_scale(), Some(32768.0));
    assert_eq!(lr.0, 0, "the LR scheduler must not step on a skipped step");
    assert_eq!(acc.counters().skipped_steps, 1);
    assert_eq!(acc.counters().optimizer_steps, 0);
    let after = flatten(&params(&model));
    assert_eq!(before, after, "parameters unchanged");
    assert!(
        after.iter().all(|v| v.is_finite()),
        "no NaN/inf in parameters"
    );

    // A normal step afterwards works and is finite.
    let logits = acc
        .forward(&model, batch.images.clone(), |m, x| m.forward(x))
        .unwrap();
    acc.backward(cross_entropy(logits, &batch), &model).unwrap();
    model = acc.step(model, &mut optim, &mut lr).unwrap();
    assert!(matches!(acc.last_step(), StepOutcome::Stepped { .. }));
    assert_eq!(lr.0, 1);
    let stepped = flatten(&params(&model));
    assert_ne!(stepped, after);
    assert!(stepped.iter().all(|v| v.is_finite()));
}

#[test]
fn scale_grows_after_the_interval() {
    let _rng = rng_lock();
    let mut acc = f16_accelerator(3);
    let (mut model, mut optim) = acc.setup(vit(2), AdamConfig::new().init()).unwrap();
    let batch = digits_batch(0, 8);
    for step in 1..=3 {
        let logits = acc
            .forward(&model, batch.images.clone(), |m, x| m.forward(x))
            .unwrap();
        acc.backward(cross_entropy(logits, &batch), &model).unwrap();
        model = acc.step(model, &mut optim, &mut 1e-3).unwrap();
        let expected = if step < 3 { 65536.0 } else { 131072.0 };
        assert_eq!(acc.loss_scale(), Some(expected), "after step {step}");
    }
}
