//! The Trainer's steps decided on the device (its default AdamW, `Accelerator::step_on_device`)
//! train exactly as the same Trainer deciding on the host (the same AdamW and schedule given
//! through `with_optimizers`): the same skipped steps under fp16 overflows, the same loss
//! scale, the same logged losses (and gradient norms), bitwise the same parameters, with and
//! without clipping.

mod common;

use afterburner::precision::GradScalerConfig;
use afterburner::trainer::{
    HfSchedule, IntervalStrategy, Trainer, TrainingArguments, optimizer_from_args,
};
use afterburner::{Accelerator, Autocast};
use afterburner_demos::digits;
use afterburner_demos::models::Vit;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use common::{BATCHER, flat_params, rng_lock, tiny_vit};

type B = Autodiff<Autocast<Flex>>;

const STEPS: usize = 20;

fn args(precision: &str, max_grad_norm: f64, name: &str) -> TrainingArguments {
    TrainingArguments {
        output_dir: common::scratch_dir(name),
        max_steps: STEPS as i64,
        per_device_train_batch_size: 4,
        learning_rate: 1e-3,
        warmup_steps: 3.0,
        weight_decay: 0.01,
        logging_strategy: IntervalStrategy::Steps,
        logging_steps: 5.0,
        eval_strategy: IntervalStrategy::No,
        save_strategy: IntervalStrategy::No,
        max_grad_norm,
        precision: precision.parse().unwrap(),
        ..Default::default()
    }
}

/// What a run ended with: parameters, skipped steps, loss scale, logged losses.
struct Run {
    params: Vec<f32>,
    skipped: u64,
    applied: u64,
    loss_scale: Option<f64>,
    losses: Vec<f64>,
}

/// A 20-step run; `on_host` gives the Trainer the same AdamW and schedule as its own, which
/// makes it decide every step on the host.
fn run(precision: &str, max_grad_norm: f64, log2_scale: i32, on_host: bool) -> Run {
    let _rng = rng_lock();
    <B as Backend>::seed(&Default::default(), 7);
    let model = tiny_vit().init::<B>(&Default::default());
    let name = format!("device-steps-{precision}-{on_host}");
    let args = args(precision, max_grad_norm, &name);
    let mut config = args.accelerator_config();
    config.grad_scaler = GradScalerConfig {
        init_scale: 2f64.powi(log2_scale),
        growth_interval: 4,
        ..Default::default()
    };
    let acc = Accelerator::<B>::new(config, Default::default()).unwrap();
    let all = digits::load().unwrap();
    let trainer = Trainer::on(
        acc,
        model,
        args.clone(),
        all.clone().take(80),
        all.take(8),
        BATCHER,
    )
    .unwrap();
    let (history, model, counters, scale) = match on_host {
        false => {
            let mut trainer = trainer;
            trainer.train().unwrap();
            finished(&trainer)
        }
        true => {
            let warmup = HfSchedule::warmup_from(args.warmup_steps, args.warmup_ratio, STEPS);
            let schedule =
                HfSchedule::new(args.lr_scheduler_type, args.learning_rate, warmup, STEPS);
            let optim = optimizer_from_args::<B, Vit<B>>(&args);
            let mut trainer = trainer.with_optimizers(optim, schedule);
            trainer.train().unwrap();
            finished(&trainer)
        }
    };
    Run {
        params: flat_params(&model),
        skipped: counters.skipped_steps,
        applied: counters.optimizer_steps,
        loss_scale: scale,
        losses: history,
    }
}

type Finished = (Vec<f64>, Vit<B>, afterburner::Counters, Option<f64>);

fn finished<T>(trainer: &Trainer<T>) -> Finished
where
    T: afterburner::trainer::TrainerTypes<Backend = B, Model = Vit<B>>,
{
    let losses = trainer
        .state()
        .log_history
        .iter()
        .filter_map(|e| e.values.get("loss"))
        .collect();
    let acc = trainer.accelerator();
    (
        losses,
        trainer.model().unwrap().clone(),
        acc.counters(),
        acc.loss_scale(),
    )
}

#[test]
fn fp16_overflows_skip_the_same_steps_on_the_device_as_on_the_host_bitwise() {
    // 2^30: the first steps' f16 gradients overflow and are skipped, the scale halves, then
    // steps apply (and grow it every 4).
    let device = run("16-mixed", 0.0, 30, false);
    let host = run("16-mixed", 0.0, 30, true);
    assert!(
        host.skipped > 0,
        "the setting must make skips ({} skipped)",
        host.skipped
    );
    assert!(host.applied > 0);
    assert_eq!(
        (device.skipped, device.applied),
        (host.skipped, host.applied)
    );
    assert_eq!(device.loss_scale, host.loss_scale);
    assert_eq!(device.losses, host.losses);
    assert_eq!(device.params, host.params, "parameters bitwise");
}

#[test]
fn without_skips_the_device_decided_run_is_the_host_decided_one_bitwise() {
    for precision in ["32-true", "bf16-mixed"] {
        let device = run(precision, 0.0, 16, false);
        let host = run(precision, 0.0, 16, true);
        assert_eq!((device.skipped, device.applied), (0, STEPS as u64));
        assert_eq!(device.losses, host.losses, "{precision}");
        assert_eq!(
            device.params, host.params,
            "{precision}: parameters bitwise"
        );
    }
}

#[test]
fn with_clipping_too_where_the_device_computes_in_f64() {
    // The norm and the clip factor are computed in f64 on a device that has it (flex, CUDA),
    // as the host path does: the same bits. (In f32, PyTorch's way, a wgpu device without
    // f64 differs by rounding: 4.6e-6 relative after these 20 steps on flex.)
    for precision in ["32-true", "16-mixed"] {
        let device = run(precision, 1.0, 16, false);
        let host = run(precision, 1.0, 16, true);
        assert_eq!(device.losses, host.losses, "{precision}");
        assert_eq!(
            device.params, host.params,
            "{precision}: parameters bitwise"
        );
    }
}
