//! Issue 41, finding 1: a model that becomes inf/NaN through an update whose gradients were
//! finite is caught (a named error at the next step, or at the end of training), and a
//! poisoned model never replaces a good `model.safetensors`. Under 16-true the Trainer raises
//! an epsilon f16 cannot hold.

mod common;

use afterburner::trainer::{
    F16_MIN_EPSILON, IntervalStrategy, OptimizerType, Trainer, TrainingArguments, adam_epsilon,
};
use afterburner::weights::Layout;
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig, NonFinitePolicy, StepOutcome};
use afterburner_demos::models::Vit;
use afterburner_demos::{ImageDataset, digits};
use burn::optim::{AdamWConfig, SgdConfig};
use common::{
    B, BATCHER, DigitsTrainer, cross_entropy, digits_batch, flatten, params, rng_lock, vit,
};

/// A learning rate f32 rounds to infinity: the first update makes the weights inf/NaN from
/// finite gradients.
const POISONING_LR: f64 = 1e39;

fn step(
    acc: &mut Accelerator<B>,
    model: Vit<B>,
    optim: &mut impl burn::optim::Optimizer<Vit<B>, B>,
    lr: f64,
    first: usize,
) -> Result<Vit<B>, AccelerateError> {
    let batch = digits_batch(first, 8);
    let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
    acc.backward(cross_entropy(logits, &batch), &model)?;
    acc.step(model, optim, &mut lr.clone())
}

#[test]
fn an_update_that_poisons_the_model_stops_the_run_at_the_next_step() {
    let _rng = rng_lock();
    for policy in [NonFinitePolicy::Skip, NonFinitePolicy::Error] {
        let config = AcceleratorConfig {
            nonfinite_gradients: policy,
            ..Default::default()
        };
        let mut acc = Accelerator::<B>::new(config, Default::default()).unwrap();
        let (model, mut optim) = acc.setup(vit(1), SgdConfig::new().init()).unwrap();
        let model = step(&mut acc, model, &mut optim, POISONING_LR, 0).unwrap();
        assert!(matches!(acc.last_step(), StepOutcome::Stepped { .. }));
        assert!(
            flatten(&params(&model)).iter().any(|v| !v.is_finite()),
            "premise: the update poisoned the model"
        );
        let err = step(&mut acc, model, &mut optim, 0.1, 8).unwrap_err();
        assert!(matches!(err, AccelerateError::NonFinite(_)), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains("after optimizer step 1")
                && message.contains("parameters hold inf/NaN"),
            "{message}"
        );
        assert_eq!(
            acc.counters().skipped_steps,
            0,
            "{policy:?}: not counted as a skip"
        );
    }
}

#[test]
fn adamw_with_an_epsilon_f16_cannot_hold_is_named_under_16_true() {
    let _rng = rng_lock();
    let config = AcceleratorConfig {
        precision: "16-true".parse().unwrap(),
        ..Default::default()
    };
    let mut acc = Accelerator::<B>::new(config, Default::default()).unwrap();
    let adamw = AdamWConfig::new().with_epsilon(1e-8).init();
    let (mut model, mut optim) = acc.setup(vit(2), adamw).unwrap();
    let mut outcome = Ok(());
    for i in 0..10 {
        match step(&mut acc, model.clone(), &mut optim, 1e-3, 8 * i) {
            Ok(next) => model = next,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    let err = outcome.expect_err("premise: an epsilon of 1e-8 (0 in f16) poisons the model");
    let message = err.to_string();
    assert!(matches!(err, AccelerateError::NonFinite(_)), "{err:?}");
    assert!(
        message.contains("parameters hold inf/NaN") && message.contains("6.1e-5"),
        "{message}"
    );
}

fn trainer(name: &str, edit: impl FnOnce(&mut TrainingArguments)) -> DigitsTrainer {
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[40..64].to_vec(), [1, 8, 8]).unwrap();
    let mut args = TrainingArguments {
        output_dir: common::scratch_dir(&format!("poisoned-{name}")),
        per_device_train_batch_size: 8,
        max_steps: 5,
        eval_strategy: IntervalStrategy::No,
        save_strategy: IntervalStrategy::No,
        load_best_model_at_end: false,
        disable_tqdm: true,
        ..Default::default()
    };
    edit(&mut args);
    let _ = std::fs::remove_dir_all(&args.output_dir);
    Trainer::new(vit(3), args, all.take(40), eval, BATCHER).unwrap()
}

#[test]
fn a_poisoned_trainer_run_fails_by_name_and_never_replaces_a_good_model_file() {
    let _rng = rng_lock();
    let mut good = trainer("good", |_| {});
    good.train().unwrap();
    let file = good.args().output_dir.join("model.safetensors");
    good.save_model(&file, Layout::Burn).unwrap();
    let saved = std::fs::read(&file).unwrap();

    // Poisoned at step 1 of 5: the next step names it.
    let mut poisoned = trainer("bad", |args| {
        args.optim = OptimizerType::Sgd;
        args.learning_rate = POISONING_LR;
        args.warmup_steps = 0.0;
    });
    let err = poisoned.train().unwrap_err();
    assert!(matches!(err, AccelerateError::NonFinite(_)), "{err:?}");
    assert!(err.to_string().contains("after optimizer step 1"), "{err}");
    std::fs::remove_dir_all(&poisoned.args().output_dir).ok();
    // Poisoned by the last step: the end of training names it, and the model the Trainer
    // holds is refused by save_model.
    let mut poisoned = trainer("bad-last", |args| {
        args.optim = OptimizerType::Sgd;
        args.learning_rate = POISONING_LR;
        args.warmup_steps = 0.0;
        args.max_steps = 1;
    });
    let err = poisoned.train().unwrap_err();
    assert!(matches!(err, AccelerateError::NonFinite(_)), "{err:?}");
    let err = poisoned.save_model(&file, Layout::Burn).unwrap_err();
    assert!(matches!(err, AccelerateError::NonFinite(_)), "{err:?}");
    assert!(err.to_string().contains("kept"), "{err}");
    assert!(
        std::fs::read(&file).unwrap() == saved,
        "the good file is untouched"
    );
    // No temporary left beside it.
    let dir = good.args().output_dir.clone();
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
    std::fs::remove_dir_all(dir).ok();
    std::fs::remove_dir_all(&poisoned.args().output_dir).ok();
}

#[test]
fn under_16_true_the_default_adamw_keeps_the_weights_finite() {
    let _rng = rng_lock();
    let mut t = trainer("f16", |args| args.precision = "16-true".parse().unwrap());
    assert_eq!(
        f64::from(adam_epsilon(t.args())),
        F16_MIN_EPSILON as f32 as f64
    );
    t.train().unwrap();
    let (model, _) = t.into_parts().unwrap();
    assert!(flatten(&params(&model)).iter().all(|v| v.is_finite()));
    // Other precisions keep HF's 1e-8.
    let plain = TrainingArguments::default();
    assert_eq!(adam_epsilon(&plain), 1e-8);
}
