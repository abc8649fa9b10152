//! Save and resume: 10 steps straight equal 5 steps + save_state + load_state (in a fresh
//! Accelerator, model and optimizer) + 5 steps, bitwise. Corrupt states are errors.

mod common;

use std::path::{Path, PathBuf};

use afterburner_accelerator::{AccelerateError, Accelerator, AcceleratorConfig};
use afterburner_demos::models::Vit;
use afterburner_demos::{ImageBatcher, digits};
use burn::optim::Adam;
use burn::optim::AdamConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::lr_scheduler::linear::{LinearLrScheduler, LinearLrSchedulerConfig};
use common::*;

type Optim = OptimizerAdaptor<Adam, Vit<B>, B>;

const BATCHER: ImageBatcher = ImageBatcher {
    channels: 1,
    height: 8,
    width: 8,
};

fn config() -> AcceleratorConfig {
    AcceleratorConfig {
        precision: "16-mixed".parse().unwrap(),
        gradient_accumulation_steps: 2,
        max_grad_norm: Some(1.0),
        seed: 1234,
        ..Default::default()
    }
}

struct Run {
    acc: Accelerator<B>,
    model: Vit<B>,
    optim: Optim,
    lr: LinearLrScheduler,
}

/// A fresh run: model with dropout (so the RNG stream matters) from `model_seed`.
fn fresh(model_seed: u64) -> Run {
    let acc = Accelerator::new(config(), Default::default()).unwrap();
    <B as burn::tensor::backend::Backend>::seed(&Default::default(), model_seed);
    let model = tiny_vit().with_dropout(0.1).init::<B>(&Default::default());
    let (model, optim) = acc.setup(model, AdamConfig::new().init()).unwrap();
    let lr = LinearLrSchedulerConfig::new(1e-2, 1e-3, 10).init().unwrap();
    Run {
        acc,
        model,
        optim,
        lr,
    }
}

/// Trains until `until` optimizer steps, continuing from the Accelerator's data position.
fn train_until(run: &mut Run, until: u64) {
    let items = digits::load().unwrap().take(160);
    let loader = run.acc.dataloader(items, BATCHER, 16).unwrap(); // 10 batches = 5 steps per epoch
    let (mut epoch, mut start) = run.acc.data_position();
    while run.acc.counters().optimizer_steps < until {
        for batch in loader.epoch_from(epoch, start) {
            let logits = run
                .acc
                .forward(&run.model, batch.images.clone(), |m, x| m.forward(x))
                .unwrap();
            run.acc
                .backward(cross_entropy(logits, &batch), &run.model)
                .unwrap();
            run.model = run
                .acc
                .step(run.model.clone(), &mut run.optim, &mut run.lr)
                .unwrap();
            if run.acc.pending_micro_batches() == 0 && run.acc.counters().optimizer_steps == until {
                return;
            }
        }
        (epoch, start) = (epoch + 1, 0);
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afterburner-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn saved_after_5(dir: &Path) -> Run {
    let mut run = fresh(5);
    train_until(&mut run, 5);
    run.acc
        .save_state(dir, &run.model, &run.optim, &run.lr)
        .unwrap();
    run
}

#[test]
fn ten_steps_equal_five_save_load_five_bitwise() {
    let _rng = rng_lock();
    let mut straight = fresh(5);
    train_until(&mut straight, 10);
    let expected = params(&straight.model);

    let dir = temp_dir("resume").join("state");
    drop(saved_after_5(&dir));
    let mut resumed = fresh(77); // other weights: load_state must replace them
    let (model, optim, lr) = resumed
        .acc
        .load_state(
            &dir,
            resumed.model.clone(),
            resumed.optim.clone(),
            resumed.lr,
        )
        .unwrap();
    (resumed.model, resumed.optim, resumed.lr) = (model, optim, lr);
    assert_eq!(resumed.acc.counters().optimizer_steps, 5);
    assert_eq!(resumed.acc.data_position(), (1, 0));
    train_until(&mut resumed, 10);

    assert_eq!(resumed.acc.counters(), straight.acc.counters());
    assert_eq!(resumed.acc.loss_scale(), straight.acc.loss_scale());
    let got = params(&resumed.model);
    let (got, expected) = (flatten(&got), flatten(&expected));
    let differing = got
        .iter()
        .zip(&expected)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differing,
        0,
        "{differing} of {} parameter values differ after resume (max rel {:.2e})",
        got.len(),
        max_rel(&got, &expected, 1e-6)
    );
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

fn load_err(dir: &Path) -> AccelerateError {
    let mut run = fresh(8);
    run.acc
        .load_state(dir, run.model.clone(), run.optim.clone(), run.lr)
        .err()
        .expect("loading a damaged state must fail")
}

#[test]
fn corrupt_or_truncated_state_is_an_error_and_changes_nothing() {
    let _rng = rng_lock();
    let root = temp_dir("corrupt");
    let dir = root.join("state");
    let run = saved_after_5(&dir);

    // Truncated model file.
    let model_file = dir.join("model.mpk");
    let bytes = std::fs::read(&model_file).unwrap();
    std::fs::write(&model_file, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(&dir).to_string();
    assert!(
        err.contains("model.mpk") && err.contains("truncated"),
        "{err}"
    );

    // Same length, one flipped byte.
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0xFF;
    std::fs::write(&model_file, &flipped).unwrap();
    let err = load_err(&dir).to_string();
    assert!(err.contains("checksum"), "{err}");

    // Garbage manifest, missing directory.
    let manifest = std::fs::read(dir.join("manifest.json")).unwrap();
    std::fs::write(dir.join("manifest.json"), b"{not json").unwrap();
    assert!(matches!(load_err(&dir), AccelerateError::Corrupt { .. }));
    // Without a manifest of ours the directory is not provably a state: never replaced.
    let refused = run.acc.save_state(&dir, &run.model, &run.optim, &run.lr);
    assert!(matches!(refused, Err(AccelerateError::NotAStateDir { .. })));
    std::fs::write(dir.join("manifest.json"), manifest).unwrap();
    assert!(matches!(
        load_err(&root.join("missing")),
        AccelerateError::Io { .. }
    ));

    // A failed load leaves the accelerator as it was.
    let mut fresh_run = fresh(8);
    let _ = fresh_run.acc.load_state(
        &dir,
        fresh_run.model.clone(),
        fresh_run.optim.clone(),
        fresh_run.lr,
    );
    assert_eq!(fresh_run.acc.counters().optimizer_steps, 0);

    // Saving again over the damaged state (a flipped byte) replaces it atomically and loads
    // fine.
    run.acc
        .save_state(&dir, &run.model, &run.optim, &run.lr)
        .unwrap();
    let mut ok = fresh(8);
    ok.acc
        .load_state(&dir, ok.model.clone(), ok.optim.clone(), ok.lr)
        .unwrap();
    assert_eq!(ok.acc.counters().optimizer_steps, 5);

    // A directory that is not a state directory is never overwritten.
    let other = root.join("precious");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"keep me").unwrap();
    let err = run
        .acc
        .save_state(&other, &run.model, &run.optim, &run.lr)
        .unwrap_err()
        .to_string();
    assert!(err.contains("refusing"), "{err}");
    assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"keep me");
    let _ = std::fs::remove_dir_all(&root);
}
