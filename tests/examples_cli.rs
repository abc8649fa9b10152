//! The examples' command lines as a newcomer meets them: `--help` succeeds and lists each
//! option with its values; bad input is one line naming the option, exit 2.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the example `name` (built by `cargo test` beside this test) with `args`.
fn example(name: &str, args: &[&str]) -> Output {
    let mut dir = std::env::current_exe().expect("the test binary's path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let binary: PathBuf = dir.join("examples").join(name);
    Command::new(&binary)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", binary.display()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_exits_zero_and_describes_each_option_with_its_values() {
    let wanted: [(&str, &[&str]); 4] = [
        (
            "minimal",
            &[
                "--precision",
                "bf16-mixed",
                "--autocast",
                "view",
                "--epochs",
            ],
        ),
        (
            "ddp",
            &["--strategy", "zero-1", "--workers", "--outer-dtype"],
        ),
        (
            "vit_classify",
            &[
                "--precision",
                "bf16-mixed",
                "--autocast",
                "--data <VALUE>",
                "digits (default, built in) or cifar10",
                "--learning-rate",
            ],
        ),
        (
            "lm_char",
            &["--optim", "sgd", "--lr-scheduler-type", "cosine"],
        ),
    ];
    for (name, words) in wanted {
        let out = example(name, &["--help"]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{name} --help: {:?} {}",
            out.status,
            text(&out.stderr)
        );
        for word in words {
            assert!(
                stdout.contains(word),
                "{name} --help lacks {word}:\n{stdout}"
            );
        }
    }
}

#[test]
fn bad_input_is_one_named_error_with_exit_two() {
    let cases: [(&str, &[&str], &str); 6] = [
        ("ddp", &["--workers", "two"], "--workers two"),
        ("minimal", &["--epochs", "0"], "--epochs"),
        ("minimal", &["--precision", "bf16-mixd"], "bf16-mixed"),
        ("minimal", &["--bogus"], "--bogus"),
        (
            "vit_classify",
            &["--learning-rat", "1e-3"],
            "--learning-rate?",
        ),
        (
            "vit_classify",
            &["--learning-rate", "-1"],
            "--learning-rate",
        ),
    ];
    for (name, args, says) in cases {
        let out = example(name, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{name} {args:?} should name {says}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{name} {args:?}: {stderr}");
        assert!(
            !stderr.contains(" { "),
            "{name} {args:?} printed a Debug form: {stderr}"
        );
    }
}

#[test]
fn the_trainer_example_launches_its_ranks_for_a_distributed_strategy() {
    let out_dir = std::env::temp_dir().join(format!("afterburner-vit-ddp-{}", std::process::id()));
    let out = example(
        "vit_classify",
        &[
            "--strategy",
            "ddp",
            "--devices",
            "2",
            "--max-steps",
            "2",
            "--eval-strategy",
            "no",
            "--save-strategy",
            "no",
            "--load-best-model-at-end",
            "false",
            "--output-dir",
            out_dir.to_str().expect("a UTF-8 temp dir"),
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Rank 0 alone prints the summary, with what DDP sent.
    assert_eq!(stdout.matches("trained 2 steps").count(), 1, "{stdout}");
    assert!(stdout.contains("comm_bytes_per_step"), "{stdout}");
    std::fs::remove_dir_all(out_dir).ok();
}

#[test]
fn training_into_another_runs_checkpoints_warns_unless_overwrite_output_dir() {
    let out_dir =
        std::env::temp_dir().join(format!("afterburner-vit-again-{}", std::process::id()));
    let dir = out_dir.to_str().expect("a UTF-8 temp dir");
    let mut args = vec![
        "--max-steps",
        "1",
        "--eval-strategy",
        "no",
        "--save-strategy",
        "steps",
        "--save-steps",
        "1",
        "--load-best-model-at-end",
        "false",
        "--output-dir",
        dir,
    ];
    let first = example("vit_classify", &args);
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(
        !text(&first.stderr).contains("another run"),
        "{}",
        text(&first.stderr)
    );
    let again = example("vit_classify", &args);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("checkpoints of another run"),
        "{}",
        text(&again.stderr)
    );
    args.push("--overwrite-output-dir");
    let meant = example("vit_classify", &args);
    assert!(meant.status.success(), "{}", text(&meant.stderr));
    assert!(
        !text(&meant.stderr).contains("another run"),
        "{}",
        text(&meant.stderr)
    );
    std::fs::remove_dir_all(out_dir).ok();
}

#[test]
fn the_lm_example_trains_with_its_blocks_split_over_two_devices() {
    let out_dir = std::env::temp_dir().join(format!("afterburner-lm-tp-{}", std::process::id()));
    let common = [
        "--max-steps",
        "2",
        "--eval-strategy",
        "no",
        "--save-strategy",
        "no",
        "--output-dir",
        out_dir.to_str().expect("a UTF-8 temp dir"),
    ];
    let tp = ["--strategy", "ddp", "--devices", "2", "--tp-size", "2"];
    let out = example("lm_char", &[&tp[..], &common[..]].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Rank 0 alone prints the summary and the sample (of the model gathered back whole).
    assert_eq!(stdout.matches("trained 2 steps").count(), 1, "{stdout}");
    assert_eq!(stdout.matches("sample (temperature").count(), 1, "{stdout}");
    // A model without a plan (the ViT) is refused by name, not split silently.
    let no_best = ["--load-best-model-at-end", "false"];
    let out = example(
        "vit_classify",
        &[&tp[..], &common[..], &no_best[..]].concat(),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tp_size") && stderr.contains("TensorParallelPlan"),
        "{stderr}"
    );
    std::fs::remove_dir_all(out_dir).ok();
}
