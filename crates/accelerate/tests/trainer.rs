//! The Trainer: equal to the hand-written Accelerator loop, events at the right optimizer
//! steps, exact resume, rotation that keeps the best checkpoint, early stopping, DDP.

mod common;

use std::path::{Path, PathBuf};

use afterburner::trainer::{
    HfSchedule, IntervalStrategy, SchedulerType, TrainLoss, Trainer, TrainingArguments,
    checkpoint_dir, list_checkpoints,
};
use afterburner::{Accelerator, FileCheckpointer, StrategyConfig};
use afterburner_demos::{ImageDataset, digits};
use burn::optim::AdamWConfig;
use burn::train::metric::AccuracyMetric;
use common::{B, BATCHER, DigitsTrainer, flatten, params, rng_lock, vit};

fn temp_dir(name: &str) -> PathBuf {
    common::scratch_dir(&format!("trainer-{name}"))
}

/// 40 training digits (10 batches of 4) and 24 evaluation digits.
fn data() -> (ImageDataset, ImageDataset) {
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[40..64].to_vec(), [1, 8, 8]).unwrap();
    (all.take(40), eval)
}

/// Small, quick arguments: batch 4, accumulation 2, warmup, clipping, no saves.
fn small_args(name: &str) -> TrainingArguments {
    TrainingArguments {
        output_dir: temp_dir(name),
        num_train_epochs: 2.0,
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 5,
        learning_rate: 2e-3,
        weight_decay: 0.01,
        gradient_accumulation_steps: 2,
        warmup_steps: 2.0,
        lr_scheduler_type: SchedulerType::Cosine,
        save_strategy: IntervalStrategy::No,
        logging_steps: 1.0,
        ..Default::default()
    }
}

fn trainer(args: TrainingArguments, seed: u64) -> DigitsTrainer {
    let (train, eval) = data();
    Trainer::new(vit(seed), args, train, eval, BATCHER)
        .unwrap()
        .with_metrics((AccuracyMetric::new(),))
}

fn model_params(trainer: &DigitsTrainer) -> Vec<f32> {
    flatten(&params(trainer.model().unwrap()))
}

/// The same run written by hand on the Accelerator.
fn hand_loop(args: &TrainingArguments, seed: u64) -> Vec<f32> {
    let mut acc = Accelerator::<B>::new(args.accelerator_config(), Default::default()).unwrap();
    let model = acc.setup_model(vit(seed)).unwrap();
    let mut optim = AdamWConfig::new()
        .with_beta_1(args.adam_beta1 as f32)
        .with_beta_2(args.adam_beta2 as f32)
        .with_epsilon(args.adam_epsilon as f32)
        .with_weight_decay(args.weight_decay as f32)
        .init();
    let loader = acc
        .dataloader(data().0, BATCHER, args.per_device_train_batch_size)
        .unwrap()
        .prefetch(0);
    // 10 batches, accumulation 2: 5 steps an epoch, 10 in all.
    let mut schedule = HfSchedule::new(args.lr_scheduler_type, args.learning_rate, 2, 10);
    let mut model = model;
    for epoch in 0..2 {
        for batch in loader.epoch(epoch) {
            let loss = model.train_loss(&acc, batch).unwrap();
            acc.backward(loss, &model).unwrap();
            model = acc.step(model, &mut optim, &mut schedule).unwrap();
        }
    }
    assert_eq!(acc.counters().optimizer_steps, 10);
    flatten(&params(&model))
}

#[test]
fn the_trainer_equals_the_hand_written_loop_bitwise() {
    let _rng = rng_lock();
    for precision in ["32-true", "16-mixed"] {
        let args = TrainingArguments {
            precision: precision.parse().unwrap(),
            eval_strategy: IntervalStrategy::Epoch,
            ..small_args("equal")
        };
        let mut t = trainer(args.clone(), 3);
        let summary = t.train().unwrap();
        assert_eq!(summary.global_step, 10);
        assert_eq!(model_params(&t), hand_loop(&args, 3), "{precision}");
    }
}

#[test]
fn events_fire_at_the_right_optimizer_steps_under_accumulation_4() {
    let _rng = rng_lock();
    // 10 batches, accumulation 4: 3 optimizer steps an epoch (the last one flushes 2
    // micro-batches), 4 epochs = 12 steps.
    let args = TrainingArguments {
        gradient_accumulation_steps: 4,
        num_train_epochs: 4.0,
        logging_steps: 2.0,
        logging_first_step: true,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(3.0),
        save_strategy: IntervalStrategy::Steps,
        save_steps: 5.0,
        ..small_args("events")
    };
    let out = args.output_dir.clone();
    let mut t = trainer(args, 4);
    let summary = t.train().unwrap();
    assert_eq!(summary.global_step, 12);
    let steps_with = |key: &str| -> Vec<u64> {
        t.state()
            .log_history
            .iter()
            .filter(|e| e.values.get(key).is_some())
            .map(|e| e.step)
            .collect()
    };
    assert_eq!(steps_with("loss"), vec![1, 2, 4, 6, 8, 10, 12]);
    assert_eq!(steps_with("eval_accuracy"), vec![3, 6, 9, 12]);
    let saved: Vec<u64> = list_checkpoints(&FileCheckpointer, &out)
        .iter()
        .map(|(s, _)| *s)
        .collect();
    // Every 5 steps, and the last step (HF saves at the end under "steps").
    assert_eq!(saved, vec![5, 10, 12]);
    // The learning rate logged is the one the step used.
    let lr_at_4 = t.state().log_history.iter().find(|e| e.step == 4).unwrap();
    let want = HfSchedule::new(SchedulerType::Cosine, 2e-3, 2, 12).lr_at(3);
    assert_eq!(lr_at_4.values.get("learning_rate"), Some(want));
    // The JSONL log holds the same entries.
    let lines = std::fs::read_to_string(out.join("log.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), t.state().log_history.len());
    std::fs::remove_dir_all(out).ok();
}

/// A label the model has no class for is an error naming it, not a panic inside Burn's loss.
#[test]
fn a_label_beyond_the_models_classes_is_a_named_error() {
    let _rng = rng_lock();
    let (train, eval) = data();
    let mut items = train.items().to_vec();
    items[5].label = 12;
    let train = ImageDataset::new(items, [1, 8, 8]).unwrap();
    let args = small_args("labels");
    let mut trainer: DigitsTrainer =
        Trainer::new(vit(1), args.clone(), train, eval, BATCHER).unwrap();
    let err = trainer.train().unwrap_err().to_string();
    assert!(
        err.contains("labels") && err.contains("12") && err.contains("10 classes"),
        "{err}"
    );
    std::fs::remove_dir_all(&args.output_dir).ok();
}

#[test]
fn a_resume_in_the_middle_of_epoch_2_continues_exactly() {
    let _rng = rng_lock();
    let args = TrainingArguments {
        save_strategy: IntervalStrategy::Steps,
        save_steps: 1.0,
        eval_strategy: IntervalStrategy::Epoch,
        ..small_args("resume-a")
    };
    let mut straight = trainer(args.clone(), 5);
    straight.train().unwrap();
    // 5 steps an epoch: checkpoint 7 is in the middle of epoch 2.
    let middle = checkpoint_dir(&args.output_dir, 7);
    let resumed_args = TrainingArguments {
        output_dir: temp_dir("resume-b"),
        resume_from_checkpoint: Some(middle.display().to_string()),
        ..args.clone()
    };
    // Other initial weights: everything must come from the checkpoint.
    let mut resumed = trainer(resumed_args.clone(), 99);
    resumed.train().unwrap();
    assert_eq!(model_params(&resumed), model_params(&straight));
    let losses = |t: &DigitsTrainer| -> Vec<(u64, f64)> {
        t.state()
            .log_history
            .iter()
            .filter_map(|e| Some((e.step, e.values.get("loss")?)))
            .collect()
    };
    assert_eq!(losses(&resumed), losses(&straight));
    assert_eq!(losses(&straight).len(), 10);
    // "latest" finds the newest checkpoint of an output directory.
    let latest = TrainingArguments {
        output_dir: args.output_dir.clone(),
        resume_from_checkpoint: Some("latest".into()),
        ..args.clone()
    };
    let mut done = trainer(latest, 7);
    let summary = done.train().unwrap();
    assert_eq!(summary.global_step, 10);
    assert_eq!(model_params(&done), model_params(&straight));
    for dir in [&args.output_dir, &resumed_args.output_dir] {
        std::fs::remove_dir_all(dir).ok();
    }
}

/// `(step, value)` of every evaluation's `key` in the trainer's history.
fn history(t: &DigitsTrainer, key: &str) -> Vec<(u64, f64)> {
    t.state()
        .log_history
        .iter()
        .filter_map(|e| Some((e.step, e.values.get(key)?)))
        .collect()
}

/// An evaluation and a checkpoint every 2 steps, at most `limit` checkpoints kept, the best
/// model reloaded at the end.
fn best_kept(name: &str, limit: usize) -> TrainingArguments {
    TrainingArguments {
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(2.0),
        save_strategy: IntervalStrategy::Steps,
        save_steps: 2.0,
        save_total_limit: Some(limit),
        load_best_model_at_end: true,
        ..small_args(name)
    }
}

#[test]
fn rotation_keeps_the_best_checkpoint_and_the_newest() {
    let _rng = rng_lock();
    let args = best_kept("rotation", 2);
    let out = args.output_dir.clone();
    let mut t = trainer(args, 6);
    let summary = t.train().unwrap();
    // On these 40 digits the evaluation loss is lowest at the first evaluation (the test's
    // premise: the best checkpoint is the oldest).
    let losses = history(&t, "eval_loss");
    let (best_step, _) = losses
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert_eq!(best_step, 2, "premise: {losses:?}");
    let best = checkpoint_dir(&out, 2);
    assert_eq!(
        summary.best_model_checkpoint.as_deref(),
        Some(best.as_path())
    );
    let kept: Vec<u64> = list_checkpoints(&FileCheckpointer, &out)
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(kept, vec![2, 10]);
    // load_best_model_at_end: the model is the best checkpoint's, not the last one.
    let mut check = trainer(
        TrainingArguments {
            output_dir: temp_dir("rotation-check"),
            resume_from_checkpoint: Some(best.display().to_string()),
            max_steps: 2,
            ..small_args("rotation-check")
        },
        8,
    );
    check.train().unwrap();
    assert_eq!(model_params(&t), model_params(&check));
    // The final model as safetensors loads back with the same values.
    let file = out.join("model.safetensors");
    t.save_model(&file, afterburner::weights::Layout::Burn)
        .unwrap();
    let loaded = afterburner::weights::LoadWeights::from_file(&file)
        .into_model(vit(12))
        .unwrap();
    assert_eq!(flatten(&params(&loaded)), model_params(&t));
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn a_limit_of_one_ends_with_only_the_best_checkpoint_as_hf() {
    let _rng = rng_lock();
    let args = best_kept("limit-one", 1);
    let out = args.output_dir.clone();
    let mut t = trainer(args, 6);
    let summary = t.train().unwrap();
    // The same run as the rotation test: the best is the first evaluation's checkpoint.
    assert_eq!(
        summary.best_model_checkpoint.as_deref(),
        Some(checkpoint_dir(&out, 2).as_path())
    );
    let kept: Vec<u64> = list_checkpoints(&FileCheckpointer, &out)
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(kept, vec![2], "HF keeps only the best at the end");
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn early_stopping_stops_where_hfs_rule_says() {
    let _rng = rng_lock();
    let args = TrainingArguments {
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(1.0),
        metric_for_best_model: Some("loss".into()),
        ..small_args("early")
    };
    // Without early stopping: every evaluation's loss.
    let mut full = trainer(args.clone(), 9);
    full.train().unwrap();
    let losses = history(&full, "eval_loss");
    // HF's EarlyStoppingCallback: patience 2, threshold 0.
    let (mut best, mut waited, mut stop_at) = (f64::INFINITY, 0, None);
    for (step, loss) in &losses {
        match *loss < best {
            true => (best, waited) = (*loss, 0),
            false => waited += 1,
        }
        if waited >= 2 {
            stop_at = Some(*step);
            break;
        }
    }
    let stop_at = stop_at.expect("premise: the loss stops improving within 10 steps");
    let mut early = trainer(
        TrainingArguments {
            early_stopping_patience: Some(2),
            ..args
        },
        9,
    );
    let summary = early.train().unwrap();
    assert!(summary.stopped_early);
    assert_eq!(summary.global_step, stop_at);
}

#[test]
fn bad_settings_are_named_errors() {
    let _rng = rng_lock();
    let (train, eval) = data();
    let unknown_metric = TrainingArguments {
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(1.0),
        metric_for_best_model: Some("f1".into()),
        ..small_args("bad")
    };
    let err = Trainer::new(vit(1), unknown_metric, train, eval, BATCHER)
        .unwrap()
        .train()
        .unwrap_err();
    assert!(err.to_string().contains("metric_for_best_model"), "{err}");
    let (train, _) = data();
    let no_eval_data = TrainingArguments {
        eval_strategy: IntervalStrategy::Epoch,
        ..small_args("bad")
    };
    let err = match Trainer::new(
        vit(1),
        no_eval_data,
        train,
        ImageDataset::new(vec![], [1, 8, 8]).unwrap(),
        BATCHER,
    ) {
        Ok(_) => panic!("an empty eval dataset with eval_strategy = epoch must be an error"),
        Err(e) => e,
    };
    assert!(err.to_string().contains("eval_strategy"), "{err}");
    let err = trainer_missing_checkpoint();
    assert!(err.contains("resume_from_checkpoint"), "{err}");
}

fn trainer_missing_checkpoint() -> String {
    let args = TrainingArguments {
        resume_from_checkpoint: Some("latest".into()),
        ..small_args("nothing-saved")
    };
    trainer(args, 1).train().unwrap_err().to_string()
}

/// Evaluation on two ranks (each its share, no padded duplicates) equals evaluation on one,
/// and DDP training through the Trainer leaves both ranks with the same model.
#[test]
fn ddp_trainer_evaluates_every_item_once() {
    let _rng = rng_lock();
    let single = {
        let mut t = trainer(small_args("ddp-single"), 11);
        t.evaluate().unwrap()
    };
    let args = TrainingArguments {
        max_steps: 3,
        parallelism: afterburner::ParallelismConfig {
            strategy: StrategyConfig::Ddp(Default::default()),
            devices: 2,
            ..small_args("ddp").parallelism
        },
        ..small_args("ddp")
    };
    let model = vit(11);
    let run_args = args.clone();
    let results = Accelerator::<B>::run(args.accelerator_config(), move |acc| {
        let (train, eval) = data();
        let mut t = Trainer::on(acc, model.clone(), run_args.clone(), train, eval, BATCHER)?
            .with_metrics((AccuracyMetric::new(),));
        let before = t.evaluate()?;
        t.train()?;
        Ok((before, flatten(&params(t.model()?))))
    })
    .unwrap();
    // 24 items on 2 ranks: 12 each; combined by count they are the single-device metrics.
    for (metrics, _) in &results {
        let (a, b) = (
            metrics.get("eval_loss").unwrap(),
            single.get("eval_loss").unwrap(),
        );
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        assert_eq!(metrics.get("eval_accuracy"), single.get("eval_accuracy"));
    }
    assert_eq!(results[0].1, results[1].1);
    let _ = Path::new(&args.output_dir);
}
