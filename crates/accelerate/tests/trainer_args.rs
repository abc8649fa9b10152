//! TrainingArguments: HF's defaults, files, the command line, named errors; the LR schedules
//! against HF's formulas.

use afterburner::trainer::{HfSchedule, IntervalStrategy, SchedulerType, TrainingArguments};
use afterburner::{AccelerateError, Precision};
use burn::optim::lr_scheduler::LrScheduler;

#[test]
fn defaults_are_hf_defaults() {
    let a = TrainingArguments::default();
    assert_eq!(a.num_train_epochs, 3.0);
    assert_eq!(a.max_steps, -1);
    assert_eq!(a.per_device_train_batch_size, 8);
    assert_eq!(a.per_device_eval_batch_size, 8);
    assert_eq!(a.learning_rate, 5e-5);
    assert_eq!(a.weight_decay, 0.0);
    assert_eq!(
        (a.adam_beta1, a.adam_beta2, a.adam_epsilon),
        (0.9, 0.999, 1e-8)
    );
    assert_eq!(a.max_grad_norm, 1.0);
    assert_eq!(a.lr_scheduler_type, SchedulerType::Linear);
    assert_eq!((a.warmup_steps, a.warmup_ratio), (0.0, 0.0));
    assert_eq!(a.gradient_accumulation_steps, 1);
    assert_eq!(a.effective_precision(), Precision::Full32);
    assert!(!a.bf16 && !a.fp16);
    assert_eq!(a.eval_strategy, IntervalStrategy::No);
    assert_eq!(a.eval_steps, None);
    assert_eq!(a.logging_strategy, IntervalStrategy::Steps);
    assert_eq!(a.logging_steps, 500.0);
    assert!(!a.logging_first_step);
    assert_eq!(a.save_strategy, IntervalStrategy::Steps);
    assert_eq!(a.save_steps, 500.0);
    assert_eq!(a.save_total_limit, None);
    assert!(!a.load_best_model_at_end);
    assert_eq!(a.metric_for_best_model, None);
    assert_eq!(a.seed, 42);
    assert_eq!(a.data_seed, None);
    assert!(!a.dataloader_drop_last);
    assert_eq!(a.dataloader_num_workers, 0);
    assert_eq!(a.resume_from_checkpoint, None);
    a.validate().unwrap();
    // HF: with load_best_model_at_end the metric defaults to the loss, lower is better.
    let best = TrainingArguments {
        load_best_model_at_end: true,
        eval_strategy: IntervalStrategy::Steps,
        ..Default::default()
    };
    assert_eq!(best.best_metric_name().as_deref(), Some("eval_loss"));
    assert!(!best.greater_is_better());
    let accuracy = TrainingArguments {
        metric_for_best_model: Some("accuracy".into()),
        ..best
    };
    assert!(accuracy.greater_is_better());
}

#[test]
fn toml_and_json_round_trip() {
    let args = TrainingArguments {
        num_train_epochs: 2.5,
        lr_scheduler_type: SchedulerType::ConstantWithWarmup,
        eval_strategy: IntervalStrategy::Epoch,
        save_strategy: IntervalStrategy::Epoch,
        load_best_model_at_end: true,
        save_total_limit: Some(2),
        precision: Precision::Bf16Mixed,
        ..Default::default()
    };
    assert_eq!(TrainingArguments::from_toml(&args.to_toml()).unwrap(), args);
    assert_eq!(TrainingArguments::from_json(&args.to_json()).unwrap(), args);
    // HF's older key is accepted.
    let old = TrainingArguments::from_toml("evaluation_strategy = \"epoch\"").unwrap();
    assert_eq!(old.eval_strategy, IntervalStrategy::Epoch);
}

fn error_of(result: Result<TrainingArguments, afterburner::AccelerateError>) -> String {
    result.expect_err("should be an error").to_string()
}

#[test]
fn unknown_keys_and_bad_values_name_the_key() {
    let unknown = error_of(TrainingArguments::from_toml("learnin_rate = 1e-3"));
    assert!(unknown.contains("learnin_rate"), "{unknown}");
    let bad = error_of(TrainingArguments::from_json(
        r#"{"lr_scheduler_type": "cosine-ish"}"#,
    ));
    assert!(
        bad.contains("lr_scheduler_type") && bad.contains("cosine-ish"),
        "{bad}"
    );
    let bad = error_of(TrainingArguments::from_toml(
        "save_strategy = \"sometimes\"",
    ));
    assert!(bad.contains("save_strategy"), "{bad}");
    let typed = error_of(TrainingArguments::from_toml(
        "per_device_train_batch_size = \"8\"",
    ));
    assert!(typed.contains("per_device_train_batch_size"), "{typed}");
    let zero = error_of(TrainingArguments::from_toml(
        "gradient_accumulation_steps = 0",
    ));
    assert!(zero.contains("gradient_accumulation_steps"), "{zero}");
    let both = error_of(TrainingArguments::from_toml("bf16 = true\nfp16 = true"));
    assert!(both.contains("bf16"), "{both}");
    // HF: load_best_model_at_end needs the same save and eval strategies...
    let mismatch = error_of(TrainingArguments::from_toml(
        "load_best_model_at_end = true\neval_strategy = \"epoch\"",
    ));
    assert!(mismatch.contains("save_strategy"), "{mismatch}");
    // ... and save_steps a multiple of eval_steps.
    let steps = error_of(TrainingArguments::from_toml(
        "load_best_model_at_end = true\neval_strategy = \"steps\"\neval_steps = 30\nsave_steps = 50",
    ));
    assert!(steps.contains("save_steps"), "{steps}");
}

#[test]
fn the_command_line_overrides_a_file() {
    let dir = std::env::temp_dir().join(format!("afterburner-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("run.toml");
    std::fs::write(&file, "num_train_epochs = 10.0\nlearning_rate = 1e-3\n").unwrap();
    let args = TrainingArguments::from_args([
        "--config",
        file.to_str().unwrap(),
        "--num-train-epochs",
        "3",
        "--bf16",
        "--lr-scheduler-type=cosine",
        "--save-total-limit",
        "2",
    ])
    .unwrap();
    assert_eq!(args.num_train_epochs, 3.0);
    assert_eq!(args.learning_rate, 1e-3);
    assert!(args.bf16);
    assert_eq!(args.effective_precision(), Precision::Bf16Mixed);
    assert_eq!(args.lr_scheduler_type, SchedulerType::Cosine);
    assert_eq!(args.save_total_limit, Some(2));
    // A program's own defaults, then the file, then the options; its own options come back.
    let program = TrainingArguments {
        num_train_epochs: 30.0,
        warmup_steps: 7.0,
        ..Default::default()
    };
    let (args, own) = program
        .with_args(
            [
                "--data",
                "cifar10",
                "--config",
                file.to_str().unwrap(),
                "--seed",
                "7",
            ],
            &["data"],
        )
        .unwrap();
    assert_eq!(own.get("data").map(String::as_str), Some("cifar10"));
    assert_eq!(
        (args.num_train_epochs, args.warmup_steps, args.seed),
        (10.0, 7.0, 7)
    );
    let unknown = TrainingArguments::from_args(["--num-epochs", "3"]).unwrap_err();
    assert!(unknown.to_string().contains("--num-epochs"), "{unknown}");
    let typed = TrainingArguments::from_args(["--learning-rate", "fast"]).unwrap_err();
    assert!(typed.to_string().contains("--learning-rate"), "{typed}");
    let help = TrainingArguments::from_args(["--help"]).unwrap_err();
    assert!(help.to_string().contains("--per-device-train-batch-size"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn command_line_errors_name_the_option_as_typed_and_suggest_the_nearest() {
    // A value out of range names the option the user typed, not the struct field.
    let range = TrainingArguments::from_args(["--learning-rate", "-1"]).unwrap_err();
    assert!(range.to_string().contains("'--learning-rate'"), "{range}");
    let zero = TrainingArguments::from_args(["--per-device-train-batch-size", "0"]).unwrap_err();
    assert!(
        zero.to_string().contains("'--per-device-train-batch-size'"),
        "{zero}"
    );
    // A typo gets the nearest option; a stranger gets none.
    let typo = TrainingArguments::from_args(["--learning-rat", "1e-3"]).unwrap_err();
    assert!(typo.to_string().contains("--learning-rate?"), "{typo}");
    let stranger = TrainingArguments::from_args(["--colour", "red"]).unwrap_err();
    assert!(stranger.to_string().contains("see --help"), "{stranger}");
    // --help is its own variant (a program prints it and exits 0), with a line per option
    // giving its values.
    let help = TrainingArguments::from_args(["--help"]).unwrap_err();
    let AccelerateError::Help(text) = help else {
        panic!("--help: {help}")
    };
    let line = |option: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(option))
            .unwrap_or_else(|| panic!("no line for {option}:\n{text}"))
            .to_string()
    };
    assert!(line("--precision").contains("bf16-mixed"), "{text}");
    assert!(line("--autocast").contains("view"), "{text}");
    assert!(line("--optim").contains("sgd"), "{text}");
    assert!(
        line("--learning-rate").contains("[default: 0.00005]"),
        "{text}"
    );
    // HF's underscore spellings parse too.
    let args = TrainingArguments::from_args(["--num_train_epochs", "2", "--bf16=false"]).unwrap();
    assert_eq!((args.num_train_epochs, args.bf16), (2.0, false));
}

#[test]
fn nan_in_a_toml_file_is_named_not_a_type_error() {
    for value in ["nan", "inf", "-inf"] {
        let err = error_of(TrainingArguments::from_toml(&format!(
            "max_grad_norm = {value}"
        )));
        assert!(
            err.contains("max_grad_norm") && err.contains("NaN and inf are not allowed"),
            "{value}: {err}"
        );
    }
}

/// Issue 41: nan in a strategy's table is named too (JSON would read it as null: a type
/// error, or an option silently unset).
#[test]
fn nan_in_a_nested_toml_table_is_named() {
    for (key, text) in [
        (
            "strategy.diloco.outer_lr",
            "[strategy.diloco]\nouter_lr = nan\n",
        ),
        (
            "strategy.diloco.mixing",
            "[strategy.diloco]\nmixing = nan\n",
        ),
        (
            "strategy.diloco.mixing",
            "[strategy.diloco]\nmixing = -inf\n",
        ),
    ] {
        let err = error_of(TrainingArguments::from_toml(text));
        assert!(
            err.contains(key) && err.contains("NaN and inf are not allowed"),
            "{text}: {err}"
        );
    }
}

/// Issue 41: a JSON argument file is one object whose keys appear once.
#[test]
fn a_json_file_repeating_a_key_or_holding_an_array_is_named() {
    let twice = error_of(TrainingArguments::from_json(
        r#"{"learning_rate": 1e-3, "learning_rate": 5e-5}"#,
    ));
    assert!(
        twice.contains("learning_rate") && twice.contains("twice"),
        "{twice}"
    );
    let nested = error_of(TrainingArguments::from_json(
        r#"{"strategy": {"diloco": {"outer_lr": 0.7, "outer_lr": 0.5}}}"#,
    ));
    assert!(
        nested.contains("outer_lr") && nested.contains("twice"),
        "{nested}"
    );
    for (text, kind) in [(r#"["runs/x"]"#, "an array"), ("3", "a number")] {
        let err = error_of(TrainingArguments::from_json(text));
        assert!(
            err.contains("one JSON object") && err.contains(kind),
            "{text}: {err}"
        );
    }
    let dir = std::env::temp_dir().join(format!("ab-args-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("args.json");
    std::fs::write(&file, r#"["runs/x"]"#).unwrap();
    let err = error_of(TrainingArguments::from_file(&file));
    assert!(err.contains("one JSON object"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

/// HF's `get_scheduler` lambdas, written out: lr(k) = base * factor(k).
fn hf_factor(kind: SchedulerType, k: f64, warmup: f64, total: f64) -> f64 {
    if kind != SchedulerType::Constant && k < warmup {
        return k / warmup.max(1.0);
    }
    match kind {
        SchedulerType::Linear => ((total - k) / (total - warmup).max(1.0)).max(0.0),
        SchedulerType::Cosine => {
            let progress = (k - warmup) / (total - warmup).max(1.0);
            (0.5 * (1.0 + (std::f64::consts::PI * 0.5 * 2.0 * progress).cos())).max(0.0)
        }
        _ => 1.0,
    }
}

#[test]
fn learning_rates_follow_hf_formulas() {
    // Hand-computed points, warmup 2 of 10 steps, base 1.0.
    let linear = HfSchedule::new(SchedulerType::Linear, 1.0, 2, 10);
    assert_eq!(linear.lr_at(0), 0.0);
    assert_eq!(linear.lr_at(1), 0.5);
    assert_eq!(linear.lr_at(2), 1.0);
    assert_eq!(linear.lr_at(6), 0.5);
    assert_eq!(linear.lr_at(10), 0.0);
    let cosine = HfSchedule::new(SchedulerType::Cosine, 1.0, 2, 10);
    assert!((cosine.lr_at(6) - 0.5).abs() < 1e-12);
    assert_eq!(
        HfSchedule::new(SchedulerType::Constant, 1.0, 2, 10).lr_at(0),
        1.0
    );
    assert_eq!(
        HfSchedule::new(SchedulerType::ConstantWithWarmup, 1.0, 4, 10).lr_at(1),
        0.25
    );
    // Every type, every step, stepping as the Accelerator does.
    for kind in [
        SchedulerType::Linear,
        SchedulerType::Cosine,
        SchedulerType::Constant,
        SchedulerType::ConstantWithWarmup,
    ] {
        let warmup = HfSchedule::warmup_from(0.0, 0.1, 25);
        assert_eq!(warmup, 3, "ceil(25 * 0.1)");
        assert_eq!(
            HfSchedule::warmup_from(0.1, 0.0, 25),
            3,
            "transformers 5: a share"
        );
        assert_eq!(HfSchedule::warmup_from(4.0, 0.1, 25), 4);
        let mut schedule = HfSchedule::new(kind, 3e-4, warmup, 25);
        for k in 0..25 {
            let want = 3e-4 * hf_factor(kind, k as f64, 3.0, 25.0);
            let got = schedule.step();
            assert!(
                (got - want).abs() < 1e-15,
                "{kind} step {k}: {got} vs {want}"
            );
        }
    }
}

/// The same schedules as transformers 5.24's `get_scheduler` stepped by PyTorch, recorded by
/// `tests/fixtures/make_hf_schedules.py`.
#[test]
fn learning_rates_equal_transformers_get_scheduler() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/hf_schedules.json"
    );
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (base, warmup, total) = (
        hf["base_lr"].as_f64().unwrap(),
        hf["warmup"].as_u64().unwrap() as usize,
        hf["total"].as_u64().unwrap() as usize,
    );
    for (name, lrs) in hf["schedules"].as_object().unwrap() {
        let kind: SchedulerType = name.parse().unwrap();
        let mut schedule = HfSchedule::new(kind, base, warmup, total);
        for (k, want) in lrs.as_array().unwrap().iter().enumerate() {
            let (got, want) = (schedule.step(), want.as_f64().unwrap());
            assert!(
                (got - want).abs() <= 1e-12 * base,
                "{name} step {k}: {got} vs HF's {want}"
            );
        }
    }
}

/// Every shared key's default equals transformers 5.24's, as recorded by
/// `tests/fixtures/make_hf_defaults.py` (numbers compared as numbers: HF's 500 is our 500.0).
#[test]
fn defaults_equal_transformers_training_arguments() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/hf_defaults.json"
    );
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ours = serde_json::to_value(TrainingArguments::default()).unwrap();
    for (key, want) in hf["defaults"].as_object().unwrap() {
        let got = &ours[key];
        let same = match (got.as_f64(), want.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => got == want,
        };
        assert!(same, "{key}: ours {got}, transformers {want}");
    }
}

/// `autocast` (afterburner's) reaches the Accelerator's config; a bad value names the key.
#[test]
fn autocast_is_an_argument() {
    let args = TrainingArguments::from_args(["--bf16", "--autocast", "view"]).unwrap();
    assert_eq!(
        args.accelerator_config().autocast,
        afterburner::AutocastMode::View
    );
    assert_eq!(
        TrainingArguments::default().accelerator_config().autocast,
        afterburner::AutocastMode::Auto
    );
    let bad = TrainingArguments::from_toml("autocast = \"per-op\"\n")
        .unwrap_err()
        .to_string();
    assert!(bad.contains("autocast") && bad.contains("per-op"), "{bad}");
}
