//! `report_to = "tensorboard"`: the event files a Trainer run writes, read back by TensorBoard's
//! own reader (the Python `tensorboard` package's `EventAccumulator`), hold every value of
//! `log.jsonl` under HF's tags, also after a resume into the same directory.
//!
//! Runs where Python has the `tensorboard` package (`AFTERBURNER_PYTHON`, else `python3`);
//! skipped with the install line where not, failing instead when `AFTERBURNER_REQUIRE_SUITES`
//! names `tensorboard` (CI).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use afterburner::trainer::{IntervalStrategy, ReportTo, Trainer, TrainingArguments};
use afterburner_demos::{ImageDataset, digits};
use burn::train::metric::AccuracyMetric;
use common::{BATCHER, rng_lock, vit};

/// Each tag's events as (step, value), in the order TensorBoard lists them.
type Scalars = BTreeMap<String, Vec<(u64, f32)>>;

/// Reads a directory's event files with TensorBoard's `EventAccumulator`; prints every
/// scalar tag's events as JSON.
const READER: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;

/// The Python that has the `tensorboard` package, or `None` (the test is then skipped).
fn python_with_tensorboard() -> Option<String> {
    let python = std::env::var("AFTERBURNER_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = Command::new(&python)
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|out| out.status.success());
    if found {
        return Some(python);
    }
    let required = std::env::var("AFTERBURNER_REQUIRE_SUITES").unwrap_or_default();
    assert!(
        !required.split(',').any(|s| s.trim() == "tensorboard"),
        "the tensorboard suite is required (AFTERBURNER_REQUIRE_SUITES) but {python} cannot \
         import tensorboard"
    );
    println!(
        "skipped: {python} has no `tensorboard` package; to run this test: python3 -m pip \
         install tensorboard (or set AFTERBURNER_PYTHON to a Python that has it)"
    );
    None
}

fn read_event_files(python: &str, dir: &Path) -> Scalars {
    let out = Command::new(python)
        .args(["-c", READER])
        .arg(dir)
        .output()
        .expect("run Python");
    assert!(
        out.status.success(),
        "TensorBoard's reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: BTreeMap<String, Vec<(u64, f64)>> =
        serde_json::from_slice(&out.stdout).expect("the reader's JSON");
    parsed
        .into_iter()
        .map(|(tag, events)| {
            let events = events.into_iter().map(|(s, v)| (s, v as f32)).collect();
            (tag, events)
        })
        .collect()
}

/// What TensorBoard should list for `output_dir/log.jsonl`: every value under HF's tag
/// (`eval_x` as `eval/x`, any other as `train/x`, the epoch as `train/epoch`) at its step,
/// as an f32 (TensorBoard's scalar type).
fn expected_from_jsonl(output_dir: &Path) -> Scalars {
    let text = std::fs::read_to_string(output_dir.join("log.jsonl")).unwrap();
    let mut expected = Scalars::new();
    for line in text.lines() {
        let entry: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
        let step = entry["step"].as_u64().unwrap();
        for (name, value) in &entry {
            if name == "step" {
                continue;
            }
            let tag = match name.strip_prefix("eval_") {
                Some(rest) => format!("eval/{rest}"),
                None => format!("train/{name}"),
            };
            let value = value.as_f64().unwrap() as f32;
            expected.entry(tag).or_default().push((step, value));
        }
    }
    expected
}

fn args(name: &str) -> TrainingArguments {
    let output_dir: PathBuf = common::scratch_dir(&format!("tensorboard-{name}"));
    TrainingArguments {
        output_dir,
        num_train_epochs: 2.0,
        per_device_train_batch_size: 4,
        learning_rate: 2e-3,
        logging_strategy: IntervalStrategy::Steps,
        logging_steps: 2.0,
        eval_strategy: IntervalStrategy::Epoch,
        save_strategy: IntervalStrategy::Epoch,
        report_to: ReportTo::TensorBoard,
        ..Default::default()
    }
}

fn run(args: TrainingArguments) {
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[40..64].to_vec(), [1, 8, 8]).unwrap();
    let mut trainer = Trainer::new(vit(5), args, all.take(40), eval, BATCHER)
        .unwrap()
        .with_metrics((AccuracyMetric::new(),));
    trainer.train().unwrap();
}

#[test]
fn tensorboards_reader_lists_every_logged_value_under_hfs_tags() {
    let Some(python) = python_with_tensorboard() else {
        return;
    };
    let _rng = rng_lock();
    let args = args("fresh");
    let (output_dir, logging_dir) = (args.output_dir.clone(), args.tensorboard_dir());
    run(args);
    let read = read_event_files(&python, &logging_dir);
    for tag in [
        "train/loss",
        "train/learning_rate",
        "train/grad_norm",
        "train/epoch",
        "eval/loss",
        "eval/accuracy",
    ] {
        assert!(read.contains_key(tag), "no {tag} in {:?}", read.keys());
    }
    // 10 batches of 4 an epoch, logged every 2 steps: 5 training logs an epoch.
    assert_eq!(read["train/loss"].len(), 10, "{:?}", read["train/loss"]);
    assert_eq!(read["eval/loss"].len(), 2);
    assert_eq!(read, expected_from_jsonl(&output_dir));
}

#[test]
fn a_resumed_run_replaces_what_the_first_logged_past_its_checkpoint() {
    let Some(python) = python_with_tensorboard() else {
        return;
    };
    let _rng = rng_lock();
    let first = args("resume");
    let (output_dir, logging_dir) = (first.output_dir.clone(), first.tensorboard_dir());
    run(first.clone());
    // The same run again from its first epoch's checkpoint (step 10), into the same folders:
    // TensorBoard must list the steps past 10 once, with the resumed run's values.
    let resumed = TrainingArguments {
        resume_from_checkpoint: Some(output_dir.join("checkpoint-10").display().to_string()),
        ..first
    };
    run(resumed);
    let files = std::fs::read_dir(&logging_dir).unwrap().count();
    assert_eq!(files, 2, "one event file per run");
    let read = read_event_files(&python, &logging_dir);
    assert_eq!(read["train/loss"].len(), 10, "{:?}", read["train/loss"]);
    assert_eq!(read, expected_from_jsonl(&output_dir));
}
