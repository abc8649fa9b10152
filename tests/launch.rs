//! `afterburner launch` driving the ViT example (built by `cargo test` beside this test) as a
//! user would: a DDP worker SIGKILLed mid-run makes the launcher restart both, they resume
//! from the last checkpoint and end on the model of an uninterrupted run, bitwise; a DiLoCo
//! replica SIGKILLed mid-run is started again alone, the Trainer heals it from a live replica,
//! and every replica ends on the same parameters.
#![cfg(all(unix, feature = "flex"))]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use afterburner_launch::{kill_worker, launch, parse_args};

mod launch_support;

use launch_support::*;

const DDP: &[&str] = &[
    "--strategy",
    "ddp",
    "--max-steps",
    "150",
    "--save-strategy",
    "steps",
    "--save-steps",
    "25",
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
    // Replica 1's checkpoint says it rejoined (once), replica 0's that it never did: the
    // Trainer state's `rejoined_at_steps`, a MessagePack array of 1 and of 0 steps.
    let state = |rank: usize| {
        std::fs::read(last.join(format!("rank-{rank:05}-of-00002/trainer_state.mpk"))).unwrap()
    };
    let holds = |bytes: &[u8], wanted: &[u8]| bytes.windows(wanted.len()).any(|w| w == wanted);
    assert!(holds(&state(1), b"rejoined_at_steps\x91"));
    assert!(holds(&state(0), b"rejoined_at_steps\x90"));
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn diloco_over_three_replicas_survives_a_replica_killed_every_second() {
    let out = fresh("chaos");
    let steps = "600";
    let trainer = [
        "--strategy",
        "diloco",
        "--diloco.sync-every",
        "10",
        "--max-steps",
        steps,
        "--save-strategy",
        "steps",
        "--save-steps",
        steps,
    ];
    let target = out.clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished = done.clone();
    // A random live replica is SIGKILLed every second, one down at a time (the next kill waits
    // for its restart and 3 s of healing: with every replica joining at once no live one is
    // left to heal them, docs/launch.md), until the run ends: the last kills land in its last
    // steps, its final save or after it, where the restarted replica ends with the final
    // checkpoint.
    // A new seed each run (AFTERBURNER_CHAOS_SEED replays one), named on any failure.
    let seed = std::env::var("AFTERBURNER_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            nanos | 1
        });
    eprintln!("chaos seed {seed} (AFTERBURNER_CHAOS_SEED={seed} replays its kills)");
    let chaos = std::thread::spawn(move || {
        let mut seed = seed;
        let mut kills = 0;
        while !finished.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1000));
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let rank = seed % 3;
            let who = [format!("RANK={rank}")];
            let pids = workers(&target, &who);
            if let Some(&pid) = pids.first()
                && kill_worker(pid)
            {
                kills += 1;
                // One replica down at a time: wait for its restart, and give it a moment to
                // heal, before the next kill (with every replica joining at once no live one
                // is left to heal them: a limit of the design, docs/launch.md).
                let deadline = Instant::now() + Duration::from_secs(30);
                while workers(&target, &who).first().is_none_or(|p| *p == pid)
                    && Instant::now() < deadline
                    && !finished.load(std::sync::atomic::Ordering::SeqCst)
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                std::thread::sleep(Duration::from_millis(3000));
            }
        }
        kills
    });
    let code = launch_vit(&["--nproc", "3", "--max-restarts", "1000"], &trainer, &out);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let kills = chaos.join().unwrap();
    assert_eq!(code, 0, "chaos seed {seed}: the launcher's exit code");
    assert!(
        kills >= 2,
        "chaos seed {seed}: only {kills} replica(s) killed: the run was too short"
    );
    assert_one_final_model(&out, steps, &format!("chaos seed {seed}"));
    let _ = std::fs::remove_dir_all(out);
}

/// The steps of the fixed-moment DiLoCo runs.
const END: u64 = 200;

/// Whether rank 0 of the run writing to `out` has logged optimizer step `step` (with
/// `--logging-steps 1`, a line per step).
fn logged(out: &Path, step: u64) -> bool {
    let (at, last) = (format!("\"step\":{step},"), format!("\"step\":{step}}}"));
    std::fs::read_to_string(out.join("log.jsonl"))
        .is_ok_and(|text| text.contains(&at) || text.contains(&last))
}

/// DiLoCo over 3 replicas under `afterburner launch` (a sync every 10 steps, `END` steps, a
/// log line every step, one checkpoint at the end; an evaluation at the end with `evaluate`):
/// rank `victim`'s first run is SIGKILLed once `moment` holds for the output folder. The
/// launcher ends with 0, the killed rank was started again, and the run has one final model:
/// every replica's part of the final checkpoint and the model rank 0 saved are bitwise equal.
fn diloco_killed_at(
    name: &str,
    victim: usize,
    evaluate: bool,
    moment: impl Fn(&Path) -> bool + Send + 'static,
) {
    let out = fresh(name);
    let end = END.to_string();
    let mut trainer = vec![
        "--strategy",
        "diloco",
        "--diloco.sync-every",
        "10",
        "--max-steps",
        &end,
        "--save-strategy",
        "steps",
        "--save-steps",
        &end,
        "--logging-strategy",
        "steps",
        "--logging-steps",
        "1",
    ];
    match evaluate {
        true => trainer.extend(["--eval-strategy", "steps", "--eval-steps", &end]),
        false => trainer.extend(["--eval-strategy", "no"]),
    }
    let target = out.clone();
    let killer = std::thread::spawn(move || {
        let first = [
            format!("RANK={victim}"),
            "AFTERBURNER_RESTART_COUNT=0".to_string(),
        ];
        let watched = target.clone();
        let killed = kill_when(&target, &first, move || moment(&watched));
        let again = [
            format!("RANK={victim}"),
            "AFTERBURNER_RESTART_COUNT=1".to_string(),
        ];
        (killed, appears(&target, &again))
    });
    let code = launch_vit_evaluating(&["--nproc", "3", "--max-restarts", "3"], &trainer, &out);
    let (killed, restarted) = killer.join().unwrap();
    assert!(killed, "{name}: no rank {victim} to kill");
    assert_eq!(code, 0, "{name}: the launcher's exit code");
    assert!(restarted, "{name}: rank {victim} was not started again");
    assert_one_final_model(&out, &END.to_string(), name);
    let _ = std::fs::remove_dir_all(out);
}

/// The 3 replicas of the run in `out` ended on one model: every replica's part of the final
/// checkpoint (one that died during that save has none: the others committed it) and the
/// model rank 0 saved are bitwise equal.
fn assert_one_final_model(out: &Path, steps: &str, context: &str) {
    let last = out.join(format!("checkpoint-{steps}"));
    let ranks = saved_ranks(&last);
    assert!(
        ranks.len() >= 2,
        "{context}: the final save holds the parts of {ranks:?}"
    );
    let model = model_params(&out.join("model.safetensors"));
    for rank in ranks {
        assert!(
            saved_params(&last, rank, 3) == model,
            "{context}: replica {rank}'s final part differs from the final model"
        );
    }
}

#[test]
fn diloco_ends_as_one_model_when_rank_0_is_killed_at_the_last_step() {
    diloco_killed_at("end-last-step", 0, false, |out| logged(out, END - 1));
}

#[test]
fn diloco_ends_as_one_model_when_a_replica_is_killed_at_the_step_before_the_last() {
    diloco_killed_at("end-step-before", 1, false, |out| logged(out, END - 2));
}

#[test]
fn diloco_ends_as_one_model_when_rank_0_is_killed_during_the_final_save() {
    // Rank 0 stages the save: it is killed as soon as the staged folder appears.
    let staged = format!(".checkpoint-{END}.");
    diloco_killed_at("end-final-save", 0, false, move |out| {
        std::fs::read_dir(out).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&staged))
        })
    });
}

#[test]
fn diloco_ends_as_one_model_when_a_replica_is_killed_during_the_final_evaluation() {
    // The last step's training log comes right before its evaluation.
    diloco_killed_at("end-final-eval", 2, true, |out| logged(out, END));
}

#[test]
fn diloco_ends_as_one_model_when_a_replica_is_killed_right_after_a_sync() {
    diloco_killed_at("after-sync", 1, false, |out| logged(out, END / 2 + 1));
}

/// Child processes killed when the test ends, passed or not (no stray process).
struct Reaped(Vec<std::process::Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn when_the_lighthouse_dies_every_worker_ends_with_a_named_error() {
    let out = fresh("lighthouse-dies");
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let lighthouse = Command::new(example("lighthouse"))
        .args(["--replicas", "2", "--bind", &address, "--timeout-s", "10"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the lighthouse example, built beside this test");
    let mut lighthouse = Reaped(vec![lighthouse]);
    let mut workers = Reaped(Vec::new());
    let mut errors = Vec::new();
    for rank in 0..2 {
        let place = afterburner::parallel::Launched {
            rank,
            world_size: 2,
            local_rank: rank,
            local_world_size: 2,
            node_rank: 0,
            lighthouse: address.clone(),
            restart_count: 0,
            policy: Some(afterburner::parallel::RestartPolicy::Replica),
            collective_timeout: Duration::from_secs(10),
            engine: Default::default(),
        };
        let mut worker = Command::new(example("vit_classify"))
            .args(["--strategy", "diloco", "--diloco.sync-every", "5"])
            .args(["--max-steps", "100000", "--eval-strategy", "no"])
            .args(["--save-strategy", "no", "--load-best-model-at-end", "false"])
            .args(["--logging-strategy", "steps", "--logging-steps", "10"])
            .args(["--disable-tqdm", "--output-dir"])
            .arg(&out)
            .envs(place.to_vars())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = worker.stderr.take().unwrap();
        errors.push(std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        }));
        workers.0.push(worker);
    }
    wait_for_step(&out, 20);
    lighthouse.0[0].kill().unwrap();
    let killed = Instant::now();
    for (worker, stderr) in workers.0.iter_mut().zip(errors) {
        // Never a hang: each ends within the collective timeout (10 s) and some slack.
        let status = loop {
            if let Some(status) = worker.try_wait().unwrap() {
                break status;
            }
            assert!(killed.elapsed() < Duration::from_secs(40), "a worker hangs");
            std::thread::sleep(Duration::from_millis(20));
        };
        let stderr = stderr.join().unwrap();
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("lighthouse connection"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn two_launchers_on_loopback_make_one_run_equal_to_one_launcher() {
    let (one, two) = (fresh("one-node"), fresh("two-nodes"));
    let short: Vec<&str> = DDP
        .iter()
        .map(|a| if *a == "150" { "40" } else { a })
        .collect();
    assert_eq!(launch_vit(&["--nproc", "2"], &short, &one), 0);
    let port = free_port();
    let rdzv = format!("127.0.0.1:{port}");
    let nodes: Vec<_> = ["0", "1"]
        .into_iter()
        .map(|node| {
            let (rdzv, short, out) = (rdzv.clone(), short.clone(), two.clone());
            std::thread::spawn(move || {
                let launcher = [
                    "--nproc",
                    "1",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    node,
                    "--rdzv",
                    &rdzv,
                ];
                launch_vit(&launcher, &short, &out)
            })
        })
        .collect();
    for node in nodes {
        assert_eq!(node.join().unwrap(), 0);
    }
    assert_eq!(
        tensor_bytes(&one.join("model.safetensors")),
        tensor_bytes(&two.join("model.safetensors"))
    );
    let _ = std::fs::remove_dir_all(one);
    let _ = std::fs::remove_dir_all(two);
}

#[test]
fn sigterm_to_the_launcher_stops_every_worker_with_the_graceful_save() {
    let launcher = built("afterburner");
    assert!(
        launcher.exists(),
        "{} is missing: cargo test --workspace builds it (or cargo build -p afterburner-launch)",
        launcher.display()
    );
    let out = fresh("sigterm");
    let child = Command::new(&launcher)
        .args(["launch", "--nproc", "2", "--"])
        .arg(example("vit_classify"))
        .args([
            "--strategy",
            "ddp",
            "--max-steps",
            "100000",
            "--eval-strategy",
            "no",
        ])
        .args(["--save-strategy", "no", "--load-best-model-at-end", "false"])
        .args(["--logging-strategy", "steps", "--logging-steps", "10"])
        .args(["--stop-on-signal", "true", "--disable-tqdm", "--output-dir"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut child = Reaped(vec![child]);
    wait_for_step(&out, 20);
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    assert!(sent.is_ok_and(|s| s.success()));
    let child = child.0.pop().unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The Trainer's graceful stop saves, then ends with its error (exit 2), on both ranks.
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("signal 15 received; forwarding it"),
        "{stderr}"
    );
    for rank in 0..2 {
        let line = format!("[rank {rank}] error: training stopped by a signal at step");
        assert!(stderr.contains(&line), "{stderr}");
    }
    let saved = afterburner::trainer::list_checkpoints(&afterburner::FileCheckpointer, &out);
    assert_eq!(saved.len(), 1, "one graceful-stop checkpoint: {saved:?}");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn the_launcher_runs_tensor_parallel_workers_and_restarts_them_together() {
    // lm_char's blocks split over 2 processes (`--tp-size 2`, the ranks meeting at the
    // launcher): 8 steps, a checkpoint every 2; rank 1 killed once the first is written: both
    // restart (policy `all`, from `--strategy ddp`), resume from the newest and finish.
    let out = fresh("tp");
    let lm = example("lm_char");
    let trainer = [
        "--strategy",
        "ddp",
        "--tp-size",
        "2",
        "--max-steps",
        "8",
        "--save-steps",
        "2",
        "--save-strategy",
        "steps",
        "--eval-strategy",
        "no",
        "--precision",
        "32-true",
        "--bf16",
        "false",
        "--gradient-checkpointing",
        "false",
        "--disable-tqdm",
        "--per-device-train-batch-size",
        "4",
    ];
    let mut args = vec![
        "afterburner",
        "launch",
        "--nproc",
        "2",
        "--max-restarts",
        "1",
    ];
    args.extend(["--", lm.to_str().unwrap()]);
    args.extend(trainer);
    args.extend(["--output-dir", out.to_str().unwrap()]);
    let args = parse_args(args).expect("the launcher's arguments");
    let killer = {
        let out = out.clone();
        std::thread::spawn(move || {
            let checkpoint = out.join("checkpoint-2");
            let first = [
                "RANK=1".to_string(),
                "AFTERBURNER_RESTART_COUNT=0".to_string(),
            ];
            kill_when(&out, &first, || checkpoint.exists())
        })
    };
    let code = launch(&args).unwrap_or_else(|e| panic!("the launch failed: {e}"));
    assert_eq!(code, 0, "the launcher's exit code");
    assert!(killer.join().unwrap(), "rank 1 was killed once");
    assert!(
        out.join("checkpoint-8").is_dir(),
        "the run finished after the restart"
    );
    std::fs::remove_dir_all(&out).ok();
}
