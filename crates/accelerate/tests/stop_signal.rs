//! Issue 11: the opt-in graceful stop. With `stop_on_signal`, a SIGTERM no longer kills the
//! process: the Trainer finishes its step, saves a checkpoint and returns `Stopped`, and a
//! resume from "latest" ends where an uninterrupted run ends; under DDP every rank stops at
//! the same step. (One test: the stop request is process-wide and stays set once raised.)

mod common;

use std::path::PathBuf;

use afterburner::trainer::{
    Components, Flow, IntervalStrategy, Trainer, TrainerCallback, TrainerState, TrainingArguments,
    checkpoint_dir,
};
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::models::Vit;
use afterburner_demos::{ImageBatch, ImageDataset, ImageItem, digits};
use burn::backend::Flex;
use burn::optim::SgdConfig;
use burn::train::ClassificationOutput;
use common::{B, BATCHER, cross_entropy, flatten, params, rng_lock, vit};
use signal_hook::consts::SIGTERM;

type DigitsTrainer = Trainer<
    Components<B, Vit<B>, ImageItem, ImageBatch<B>, ImageBatch<Flex>, ClassificationOutput<Flex>>,
>;

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afterburner-stop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn trainer(args: TrainingArguments, seed: u64) -> DigitsTrainer {
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[40..48].to_vec(), [1, 8, 8]).unwrap();
    Trainer::new(vit(seed), args, all.take(40), eval, BATCHER).unwrap()
}

/// Sends this process a SIGTERM after optimizer step `at`, as a cluster's scheduler would.
struct TermAt(u64);

impl TrainerCallback for TermAt {
    fn on_step_end(&mut self, state: &TrainerState) -> Flow {
        if state.global_step == self.0 {
            signal_hook::low_level::raise(SIGTERM).unwrap();
        }
        Flow::Continue
    }
}

#[test]
fn a_sigterm_stops_after_the_step_saves_and_resumes_exactly() {
    let _rng = rng_lock();
    let args = TrainingArguments {
        num_train_epochs: 2.0,
        per_device_train_batch_size: 4,
        learning_rate: 2e-3,
        save_strategy: IntervalStrategy::No,
        eval_strategy: IntervalStrategy::No,
        stop_on_signal: true,
        ..Default::default()
    };
    let straight_args = TrainingArguments {
        output_dir: out_dir("straight"),
        ..args.clone()
    };
    let mut straight = trainer(straight_args.clone(), 3);
    straight.train().unwrap();

    let out = out_dir("stopped");
    let stopped_args = TrainingArguments {
        output_dir: out.clone(),
        ..args.clone()
    };
    let mut stopped = trainer(stopped_args.clone(), 3).with_callback(TermAt(13));
    let err = stopped.train().unwrap_err();
    let want = checkpoint_dir(&out, 13);
    assert!(
        matches!(&err, AccelerateError::Stopped { step: 13, saved: Some(dir) } if *dir == want),
        "{err}"
    );
    assert!(err.to_string().contains("signal"), "{err}");

    let resumed_args = TrainingArguments {
        resume_from_checkpoint: Some("latest".into()),
        stop_on_signal: false,
        ..stopped_args
    };
    let mut resumed = trainer(resumed_args, 77);
    assert_eq!(resumed.train().unwrap().global_step, 20);
    assert_eq!(
        flatten(&params(resumed.model().unwrap())),
        flatten(&params(straight.model().unwrap()))
    );

    // Under DDP every rank answers the same at the same step: rank 1 gets the SIGTERM after
    // its step 3 (a new stop-enabled Accelerator cleared the earlier request).
    let initial = vit(4);
    let config = AcceleratorConfig {
        stop_on_signal: true,
        parallelism: afterburner::ParallelismConfig {
            strategy: StrategyConfig::Ddp(Default::default()),
            devices: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let stops = Accelerator::<B>::run(config, move |mut acc| {
        let (mut model, mut optim) = acc.setup(initial.clone(), SgdConfig::new().init())?;
        let loader = acc.dataloader(digits::load()?.take(32), BATCHER, 4)?;
        for batch in loader.epoch(0) {
            let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
            acc.backward(cross_entropy(logits, &batch), &model)?;
            model = acc.step(model, &mut optim, &mut 0.1)?;
            if acc.rank() == 1 && acc.counters().optimizer_steps == 3 {
                // Twice, as a scheduler and mpirun may deliver it: still a graceful stop.
                signal_hook::low_level::raise(SIGTERM).unwrap();
                signal_hook::low_level::raise(SIGTERM).unwrap();
            }
            if acc.stop_requested()? {
                break;
            }
        }
        Ok(acc.counters().optimizer_steps)
    })
    .unwrap();
    assert_eq!(stops, vec![3, 3]);
    // Without the setting, no stop is ever reported.
    let acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    assert!(!acc.stop_requested().unwrap());
    for dir in [&straight_args.output_dir, &out] {
        std::fs::remove_dir_all(dir).ok();
    }
}
