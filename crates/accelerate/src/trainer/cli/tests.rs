//! The command line through clap: `--help` shows every key with its description and default,
//! the strategies and their options; HF's underscore spellings and today's kebab ones parse;
//! errors name the option as typed, the value, what is allowed and the nearest name.

use serde_json::Value;

use super::as_map;
use crate::trainer::{IntervalStrategy, OptimizerType, TrainingArguments};
use crate::{AccelerateError, StrategyConfig};

fn help(extra: &[&str]) -> String {
    match TrainingArguments::default().with_args(["--help"], extra) {
        Err(AccelerateError::Help(text)) => text,
        other => panic!("--help gave {other:?}"),
    }
}

fn error(args: &[&str]) -> String {
    let err = TrainingArguments::from_args(args.iter().copied()).expect_err("an error");
    assert!(
        matches!(err, AccelerateError::InvalidArgument { .. }),
        "{err:?}"
    );
    err.to_string()
}

/// The line of `text` that starts with `option`.
fn line<'a>(text: &'a str, option: &str) -> &'a str {
    let found = text.lines().find(|l| {
        let l = l.trim_start();
        l.starts_with(option) && l[option.len()..].starts_with([' ', ','])
    });
    found.unwrap_or_else(|| panic!("no line for {option}:\n{text}"))
}

#[test]
fn help_lists_every_key_with_its_description_and_default() {
    let text = help(&["data: digits (default) or cifar10"]);
    for (key, default) in as_map(&TrainingArguments::default()) {
        let line = line(&text, &format!("--{}", key.replace('_', "-")));
        // The first sentence of the key's doc comment: its one description.
        let description = super::help::description(&key).expect("described");
        assert!(line.contains(&description), "{key}: {line}");
        let default = match default {
            Value::Null => "unset".to_string(),
            Value::String(s) => s,
            other => other.to_string(),
        };
        assert!(line.contains(&format!("[default: {default}]")), "{line}");
    }
    assert!(line(&text, "--optim").contains("[possible values: adamw, adam, sgd]"));
    assert!(line(&text, "--eval-strategy").contains("[alias: --evaluation-strategy]"));
    assert!(line(&text, "--bf16").contains("--bf16 [<BOOL>]"));
    assert!(line(&text, "--config").contains("TOML or JSON"));
    assert!(line(&text, "--data").contains("digits (default) or cifar10"));
    assert!(
        text.contains("--num_train_epochs"),
        "the underscore spellings are said"
    );
}

#[test]
fn help_lists_every_strategy_and_its_options() {
    let text = help(&[]);
    for name in StrategyConfig::names() {
        assert!(
            text.contains(&format!("\n  {name}: ")),
            "{name} missing:\n{text}"
        );
    }
    for (option, default) in [
        ("--diloco.sync-every", "500"),
        ("--local-sgd.local-sgd-steps", "8"),
        ("--fsdp.sharding-strategy", "full"),
    ] {
        let line = line(&text, option);
        assert!(line.contains(&format!("[default: {default}]")), "{line}");
    }
    assert!(text.contains("Options of strategy diloco (with --strategy diloco):"));
    // Every option of every built-in strategy has its description (its field's doc comment).
    for name in StrategyConfig::names() {
        let config = StrategyConfig::from_name(&name).unwrap();
        if matches!(config, StrategyConfig::Registered(_)) {
            continue;
        }
        for key in config.options().unwrap_or_default().keys() {
            let about = config.option_about(key);
            assert!(
                about.is_some_and(|a| !a.is_empty()),
                "{name}.{key} has no description"
            );
            let line = line(&text, &format!("--{name}.{}", key.replace('_', "-")));
            let described = line
                .split_once('>')
                .map(|(_, rest)| rest.trim())
                .unwrap_or("");
            assert!(!described.starts_with("[default"), "{name}.{key}: {line}");
        }
    }
    let line = line(&text, "--diloco.sync-every");
    assert!(
        line.contains("Inner optimizer steps between two outer steps"),
        "{line}"
    );
}

#[test]
fn underscore_and_kebab_spellings_and_flags_parse() {
    let args = TrainingArguments::from_args([
        "--num_train_epochs",
        "2",
        "--per_device_train_batch_size=4",
        "--evaluation_strategy",
        "EPOCH",
        "--save-strategy",
        "epoch",
        "--optim",
        "adamw_torch",
        "--logging-first-step",
        "--dataloader_drop_last",
        "false",
        "--disable-tqdm=true",
        "--max-steps",
        "-1",
    ])
    .unwrap();
    assert_eq!(args.num_train_epochs, 2.0);
    assert_eq!(args.per_device_train_batch_size, 4);
    assert_eq!(args.eval_strategy, IntervalStrategy::Epoch);
    assert_eq!(args.optim, OptimizerType::AdamW);
    assert!(args.logging_first_step && !args.dataloader_drop_last && args.disable_tqdm);
    // The later of two wins, as in HF's argparse.
    let args = TrainingArguments::from_args(["--seed", "1", "--seed=2"]).unwrap();
    assert_eq!(args.seed, 2);
    // A strategy's options in both spellings, the strategy in any of its own.
    let args =
        TrainingArguments::from_args(["--strategy", "localsgd", "--localsgd.local_sgd_steps", "3"])
            .unwrap();
    let options = args.parallelism.strategy.options().unwrap_or_default();
    assert_eq!(options.get("local_sgd_steps"), Some(&Value::from(3)));
}

#[test]
fn errors_name_the_option_as_typed_the_value_and_what_is_allowed() {
    assert_eq!(
        error(&["--num-train-epoch", "2"]),
        "invalid training argument '--num-train-epoch': unknown option; did you mean \
         --num-train-epochs? (see --help)"
    );
    // The suggestion in the spelling typed; none into a strategy's options for a plain name.
    let err = error(&["--learning_rat", "1"]);
    assert!(err.contains("did you mean --learning_rate?"), "{err}");
    let err = error(&["--outputdir", "runs"]);
    assert!(err.contains("did you mean --output-dir?"), "{err}");
    let err = error(&["--colour", "red"]);
    assert!(!err.contains("did you mean"), "{err}");
    let err = error(&["--optim", "adamw-toch"]);
    assert!(
        err.contains("'--optim'")
            && err.contains(
                "'adamw-toch' is not one of: adamw (adamw_torch, adamw-torch), adam, sgd"
            )
            && err.contains("did you mean adamw?"),
        "{err}"
    );
    let err = error(&["--lr_scheduler_type", "cosin"]);
    assert!(
        err.contains("'--lr_scheduler_type'") && err.contains("did you mean cosine?"),
        "{err}"
    );
    let err = error(&["--bf16", "yes"]);
    assert!(
        err.contains("'--bf16'") && err.contains("'yes' is not one of: true, false"),
        "{err}"
    );
    let err = error(&["--num_train_epochs", "many"]);
    assert!(err.contains("'--num_train_epochs'") && err.contains("many given, expected a number"));
    let err = error(&["--seed"]);
    assert!(
        err.contains("'--seed'") && err.contains("nothing given, expected a value"),
        "{err}"
    );
    let err = error(&["3"]);
    assert!(err.contains("'3'") && err.contains("a bare word"), "{err}");
    let err = error(&["--output-dir", "-runs"]);
    assert!(
        err.contains("'-runs'") && err.contains("--key=-value"),
        "{err}"
    );
    let err = error(&["--max_steps", "5", "--num_train_epochs", "-1"]);
    assert!(err.contains("'--num_train_epochs'"), "{err}");
}

#[test]
fn a_program_option_named_as_the_command_lines_own_is_refused() {
    for name in ["config", "help", "a.b", "", "x y"] {
        let err = TrainingArguments::default()
            .with_args(["--seed", "1"], &[name])
            .unwrap_err();
        assert!(err.to_string().contains("own option"), "{name}: {err}");
    }
    // One named as a key is the program's.
    let (args, own) = TrainingArguments::default()
        .with_args(["--seed", "1"], &["seed: the program's"])
        .unwrap();
    assert_eq!(
        (args.seed, own.get("seed").map(String::as_str)),
        (42, Some("1"))
    );
}

#[test]
fn report_to_and_logging_dir_parse_and_a_wrong_name_is_named() {
    let args = TrainingArguments::from_args(["--report-to", "tensorboard", "--logging-dir", "tb"])
        .unwrap();
    assert!(args.report_to.tensorboard());
    assert_eq!(args.tensorboard_dir(), std::path::Path::new("tb"));
    let args = TrainingArguments::from_args(["--report_to", "none"]).unwrap();
    assert!(!args.report_to.tensorboard());
    let err = error(&["--report-to", "wandb"]);
    assert!(
        err.contains("wandb") && err.contains("tensorboard"),
        "{err}"
    );
}
