//! Issue 41, findings 3 and 4: when a launched DDP run fails, the launcher names the real
//! cause first: the rank killed by a signal, with the signal's name, before the ranks whose
//! collectives failed because of it (20 times each: rank 1, rank 0, a random rank of 3), and a
//! stopped rank that missed a collective, with the timeout it missed.
#![cfg(all(unix, feature = "flex"))]

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use afterburner_launch::{LaunchError, kill_worker, launch, parse_args};

#[allow(dead_code)]
mod launch_support;

use launch_support::*;

/// `afterburner launch --nproc N --max-restarts 0 [extra] -- vit_classify` (DDP, a long run
/// logging every step) in this process; its error.
fn failing_launch(nproc: usize, extra: &[&str], out: &Path) -> LaunchError {
    let vit = example("vit_classify");
    let nproc = nproc.to_string();
    let mut args = vec![
        "afterburner",
        "launch",
        "--nproc",
        &nproc,
        "--max-restarts",
        "0",
    ];
    args.extend(extra);
    args.extend(["--", vit.to_str().unwrap(), "--strategy", "ddp"]);
    args.extend(["--max-steps", "100000"]);
    args.extend(["--logging-strategy", "steps", "--logging-steps", "1"]);
    args.extend(["--save-strategy", "no", "--eval-strategy", "no"]);
    args.extend(["--load-best-model-at-end", "false", "--disable-tqdm"]);
    args.extend(["--per-device-train-batch-size", "4"]);
    args.extend(["--output-dir", out.to_str().unwrap()]);
    let args = parse_args(args).expect("the launcher's arguments");
    launch(&args).expect_err("the launch must fail: a worker is killed and no restart is left")
}

/// Sends `signal` to the worker of rank `rank` of the run writing to `out` once the run has
/// logged step 2 (every rank past the rendezvous, training); whether it found that one
/// worker. Otherwise it kills every worker of the run, so that the launch ends anyway.
fn signal_when_training(out: &Path, rank: usize, signal: &str) -> bool {
    let log = out.join("log.jsonl");
    let deadline = Instant::now() + Duration::from_secs(120);
    let logged_step_2 = |t: String| t.contains("\"step\":2,") || t.contains("\"step\":2}");
    while !std::fs::read_to_string(&log).is_ok_and(logged_step_2) {
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pids = workers(out, &[format!("RANK={rank}")]);
    if let [pid] = pids[..] {
        return Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
    }
    for pid in workers(out, &[]) {
        kill_worker(pid);
    }
    false
}

/// The launches of the two tests one at a time (two multi-worker runs on a 2-core machine
/// would slow each other down).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A small deterministic sequence of ranks below `n` (no RNG crate needed).
fn some_rank(trial: u64, n: usize) -> usize {
    ((trial
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        >> 33)
        % n as u64) as usize
}

#[test]
fn a_sigkilled_rank_is_named_with_its_signal_every_time() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut trials: Vec<(usize, usize)> = vec![(2, 1); 20];
    trials.extend([(2, 0); 20]);
    trials.extend((0..20).map(|t| (3, some_rank(t, 3))));
    for (trial, (nproc, rank)) in trials.into_iter().enumerate() {
        let out = fresh(&format!("blame-kill-{trial}"));
        let target = out.clone();
        let killer = std::thread::spawn(move || signal_when_training(&target, rank, "-KILL"));
        let err = failing_launch(nproc, &["--collective-timeout", "30"], &out);
        assert!(
            killer.join().unwrap(),
            "trial {trial}: rank {rank} was not killed"
        );
        let message = err.to_string();
        let cause = format!("rank {rank} was killed by signal 9 (SIGKILL)");
        assert!(
            message.starts_with(&cause),
            "trial {trial} (rank {rank} of {nproc} killed): {message}"
        );
        assert!(
            matches!(err, LaunchError::RestartsExhausted { .. }),
            "trial {trial}: {err:?}"
        );
        let _ = std::fs::remove_dir_all(out);
    }
}

#[test]
fn a_stopped_rank_is_named_with_the_timeout_it_missed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = fresh("blame-stop");
    let target = out.clone();
    let stopper = std::thread::spawn(move || signal_when_training(&target, 1, "-STOP"));
    let err = failing_launch(2, &["--collective-timeout", "3"], &out);
    assert!(stopper.join().unwrap(), "rank 1 was not stopped");
    let message = err.to_string();
    assert!(
        message.starts_with("rank 1 did not reach a collective in time")
            && message.contains("within 3 s")
            && message.contains("then rank 0 exited with code"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(out);
}
