//! `afterburner launch` driving the ViT example (built by `cargo test` beside this test) as a
//! user would: a DDP worker SIGKILLed mid-run makes the launcher restart both, they resume
//! from the last checkpoint and end on the model of an uninterrupted run, bitwise; a DiLoCo
//! replica SIGKILLed mid-run is started again alone, the Trainer heals it from a live replica,
//! and every replica ends on the same parameters.
#![cfg(all(unix, feature = "flex"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use afterburner::parallel::flat_params;
use afterburner_demos::models::{Vit, VitConfig};
use afterburner_launch::{launch, parse_args};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};

type B = Autodiff<Flex>;

/// The example `name`, built beside this test.
fn example(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().expect("the test binary's path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("examples").join(name)
}

/// A fresh folder for one run.
fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ab-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `afterburner launch LAUNCHER_ARGS -- vit_classify TRAINER_ARGS --output-dir OUT`, in
/// this process; the launcher's exit code.
fn launch_vit(launcher: &[&str], trainer: &[&str], out: &Path) -> i32 {
    let vit = example("vit_classify");
    let mut args = vec!["afterburner", "launch"];
    args.extend(launcher);
    args.extend(["--", vit.to_str().unwrap()]);
    args.extend(trainer);
    args.extend(["--output-dir", out.to_str().unwrap(), "--disable-tqdm"]);
    let args = parse_args(args).expect("the launcher's arguments");
    launch(&args).unwrap_or_else(|e| panic!("the launch failed: {e}"))
}

/// The pids of the live workers of the run writing to `out` whose environment holds every
/// one of `vars` (`RANK=1`, ...).
fn workers(out: &Path, vars: &[String]) -> Vec<u32> {
    let needle = out.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let read =
                |file: &str| std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&read("cmdline")).replace('\0', " ");
            let environ = read("environ");
            let environ: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            cmdline.contains(&needle) && vars.iter().all(|v| environ.contains(&v.as_bytes()))
        })
        .collect()
}

/// SIGKILLs the workers of `out` with `vars` once `ready` holds (polling for at most 5 min);
/// whether it killed one.
fn kill_when(out: &Path, vars: &[String], ready: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !ready() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pids = workers(out, vars);
    for pid in &pids {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    !pids.is_empty()
}

/// Whether a worker of `out` with `vars` shows up within a minute.
fn appears(out: &Path, vars: &[String]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if !workers(out, vars).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// The tensor bytes of a safetensors file (its header's metadata map is unordered).
fn tensor_bytes(file: &Path) -> Vec<u8> {
    let bytes = std::fs::read(file).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header..].to_vec()
}

/// The parameters rank `rank` of `world` saved in `checkpoint`.
fn saved_params(checkpoint: &Path, rank: usize, world: usize) -> Vec<f32> {
    let device = Default::default();
    let file = checkpoint
        .join(format!("rank-{rank:05}-of-{world:05}"))
        .join("model.mpk");
    let model: Vit<B> = VitConfig::new()
        .with_num_classes(10)
        .init::<B>(&device)
        .load_file(
            file,
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            &device,
        )
        .expect("the replica's saved model");
    flat_params::<B, _>(&model)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

const DDP: &[&str] = &[
    "--strategy",
    "ddp",
    "--max-steps",
    "150",
    "--save-strategy",
    "steps",
    "--save-steps",
    "25",
    "--eval-strategy",
    "no",
    "--per-device-train-batch-size",
    "16",
    "--load-best-model-at-end",
    "false",
    "--logging-steps",
    "25",
];

#[test]
fn a_killed_ddp_worker_restarts_both_and_the_run_ends_as_an_uninterrupted_one() {
    let (whole, killed) = (fresh("ddp-whole"), fresh("ddp-killed"));
    assert_eq!(launch_vit(&["--nproc", "2"], DDP, &whole), 0);

    let target = killed.clone();
    let killer = std::thread::spawn(move || {
        let first = [
            "RANK=1".to_string(),
            "AFTERBURNER_RESTART_COUNT=0".to_string(),
        ];
        let checkpoint = target.join("checkpoint-75");
        let killed = kill_when(&target, &first, || checkpoint.exists());
        let again = [
            "RANK=1".to_string(),
            "AFTERBURNER_RESTART_COUNT=1".to_string(),
        ];
        (killed, appears(&target, &again))
    });
    assert_eq!(
        launch_vit(&["--nproc", "2", "--max-restarts", "2"], DDP, &killed),
        0
    );
    let (was_killed, restarted) = killer.join().unwrap();
    assert!(was_killed, "no rank-1 worker to kill");
    assert!(restarted, "rank 1 was not started again");
    assert_eq!(
        tensor_bytes(&whole.join("model.safetensors")),
        tensor_bytes(&killed.join("model.safetensors")),
        "the restarted run's model differs from the uninterrupted one's"
    );
    let _ = std::fs::remove_dir_all(whole);
    let _ = std::fs::remove_dir_all(killed);
}

#[test]
fn a_killed_diloco_replica_is_started_alone_healed_and_ends_equal() {
    let out = fresh("diloco");
    let trainer = [
        "--strategy",
        "diloco",
        "--diloco.sync-every",
        "10",
        "--max-steps",
        "200",
        "--save-strategy",
        "steps",
        "--save-steps",
        "200",
        "--eval-strategy",
        "no",
        "--per-device-train-batch-size",
        "16",
        "--load-best-model-at-end",
        "false",
        "--logging-strategy",
        "steps",
        "--logging-steps",
        "10",
    ];
    let target = out.clone();
    let killer = std::thread::spawn(move || {
        let log = target.join("log.jsonl");
        let first = [
            "RANK=1".to_string(),
            "AFTERBURNER_RESTART_COUNT=0".to_string(),
        ];
        // Killed once rank 0 has logged step 50.
        let killed = kill_when(&target, &first, || {
            std::fs::read_to_string(&log).is_ok_and(|text| text.contains("\"step\":50"))
        });
        let again = [
            "RANK=1".to_string(),
            "AFTERBURNER_RESTART_COUNT=1".to_string(),
        ];
        (killed, appears(&target, &again))
    });
    assert_eq!(
        launch_vit(&["--nproc", "2", "--max-restarts", "1"], &trainer, &out),
        0
    );
    let (was_killed, restarted) = killer.join().unwrap();
    assert!(was_killed, "no replica 1 to kill");
    assert!(restarted, "replica 1 was not started again");
    let log = std::fs::read_to_string(out.join("log.jsonl")).unwrap();
    assert!(
        !log.contains("rejoined_rank\":0"),
        "replica 0 never left: {log}"
    );
    let last = out.join("checkpoint-200");
    assert_eq!(saved_params(&last, 0, 2), saved_params(&last, 1, 2));
    let _ = std::fs::remove_dir_all(out);
}
