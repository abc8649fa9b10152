//! Issue 11, findings 3 and 6: a NaN step never reaches the weights (skipped and counted, or
//! an error, in every precision), a poisoned model never replaces a saved state, and a state
//! saved from a model of another shape or depth is refused before anything changes.

mod common;

use std::path::PathBuf;

use afterburner_accelerator::{
    AccelerateError, Accelerator, AcceleratorConfig, NonFinitePolicy, StepOutcome,
};
use afterburner_demos::models::Vit;
use burn::optim::SgdConfig;
use common::{B, cross_entropy, digits_batch, flatten, params, rng_lock, tiny_vit, vit};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "afterburner-nonfinite-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(precision: &str, policy: NonFinitePolicy) -> AcceleratorConfig {
    AcceleratorConfig {
        precision: precision.parse().unwrap(),
        nonfinite_gradients: policy,
        ..Default::default()
    }
}

/// One step on 8 digits; `poison` multiplies the loss by NaN.
fn step(
    acc: &mut Accelerator<B>,
    model: Vit<B>,
    optim: &mut impl burn::optim::Optimizer<Vit<B>, B>,
    poison: bool,
) -> Result<Vit<B>, AccelerateError> {
    let batch = digits_batch(0, 8);
    let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
    let mut loss = cross_entropy(logits, &batch);
    if poison {
        loss = loss.mul_scalar(f64::NAN);
    }
    acc.backward(loss, &model)?;
    acc.step(model, optim, &mut 0.1)
}

#[test]
fn a_nan_step_is_skipped_and_counted_in_every_precision() {
    let _rng = rng_lock();
    for precision in ["32-true", "bf16-mixed", "bf16-true"] {
        let mut acc =
            Accelerator::<B>::new(config(precision, NonFinitePolicy::Skip), Default::default())
                .unwrap();
        let (model, mut optim) = acc.setup(vit(1), SgdConfig::new().init()).unwrap();
        let model = step(&mut acc, model, &mut optim, false).unwrap();
        let before = flatten(&params(&model));
        let model = step(&mut acc, model, &mut optim, true).unwrap();
        assert!(
            matches!(acc.last_step(), StepOutcome::SkippedNonFinite { .. }),
            "{precision}"
        );
        assert_eq!(
            flatten(&params(&model)),
            before,
            "{precision}: the NaN step changed nothing"
        );
        assert_eq!(acc.counters().skipped_steps, 1);
        assert_eq!(acc.counters().optimizer_steps, 1);
        let model = step(&mut acc, model, &mut optim, false).unwrap();
        let after = flatten(&params(&model));
        assert!(
            after.iter().all(|v| v.is_finite()) && after != before,
            "{precision}"
        );
    }
}

#[test]
fn the_error_policy_fails_the_step_and_applies_nothing() {
    let _rng = rng_lock();
    let mut acc = Accelerator::<B>::new(
        config("32-true", NonFinitePolicy::Error),
        Default::default(),
    )
    .unwrap();
    let (model, mut optim) = acc.setup(vit(1), SgdConfig::new().init()).unwrap();
    let before = flatten(&params(&model));
    let kept = model.clone();
    let err = step(&mut acc, model, &mut optim, true).unwrap_err();
    assert!(matches!(err, AccelerateError::NonFinite(_)), "{err}");
    assert!(err.to_string().contains("inf/NaN"), "{err}");
    assert_eq!(flatten(&params(&kept)), before);
    // The next cycle starts clean.
    let model = step(&mut acc, kept, &mut optim, false).unwrap();
    assert!(flatten(&params(&model)).iter().all(|v| v.is_finite()));
}

#[test]
fn a_poisoned_model_never_replaces_a_saved_state() {
    let _rng = rng_lock();
    let dir = temp_dir("save");
    // "apply" is PyTorch's fp32 behaviour: the NaN reaches the weights.
    let mut reckless = Accelerator::<B>::new(
        config("32-true", NonFinitePolicy::Apply),
        Default::default(),
    )
    .unwrap();
    let (model, mut optim) = reckless.setup(vit(1), SgdConfig::new().init()).unwrap();
    let good = step(&mut reckless, model, &mut optim, false).unwrap();
    let poisoned = step(&mut reckless, good.clone(), &mut optim, true).unwrap();
    assert!(flatten(&params(&poisoned)).iter().any(|v| v.is_nan()));
    let careful =
        Accelerator::<B>::new(config("32-true", NonFinitePolicy::Skip), Default::default())
            .unwrap();
    careful.save_state(&dir, &good, &optim, &0.1).unwrap();
    let err = careful
        .save_state(&dir, &poisoned, &optim, &0.1)
        .unwrap_err();
    assert!(matches!(err, AccelerateError::NonFinite(_)), "{err}");
    assert!(err.to_string().contains("model"), "{err}");
    let mut loader =
        Accelerator::<B>::new(config("32-true", NonFinitePolicy::Skip), Default::default())
            .unwrap();
    let (loaded, _, _) = loader.load_state(&dir, vit(2), optim.clone(), 0.1).unwrap();
    assert_eq!(flatten(&params(&loaded)), flatten(&params(&good)));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_state_of_another_shape_or_depth_is_refused_before_anything_changes() {
    let _rng = rng_lock();
    let dir = temp_dir("shapes");
    let acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let saved = vit(1);
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    acc.save_state(&dir, &saved, &optim, &0.1).unwrap();
    let device = Default::default();
    let wider: Vit<B> = tiny_vit().with_d_model(48).init(&device);
    let deeper: Vit<B> = tiny_vit().with_n_layers(3).init(&device);
    for (what, model) in [("wider", wider), ("deeper", deeper)] {
        let before = flatten(&params(&model));
        let mut acc =
            Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
        let kept = model.clone();
        let optim = SgdConfig::new().init::<B, Vit<B>>();
        let Err(err) = acc.load_state(&dir, model, optim, 0.1) else {
            panic!("{what}: a state of another model must not load");
        };
        let err = err.to_string();
        assert!(
            err.contains("do not fit") || err.contains("structure"),
            "{what}: {err}"
        );
        if what == "wider" {
            // Each mismatch names the parameter and both shapes.
            assert!(err.contains("[32") && err.contains("[48"), "{err}");
        }
        assert_eq!(
            flatten(&params(&kept)),
            before,
            "{what}: the model is unchanged"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}
