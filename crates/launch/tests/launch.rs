//! `afterburner launch` as a user runs it, with small shell programs as workers: the
//! environment each worker gets, the rank prefix, both restart policies, signals, and bad
//! input named with no stray process left.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn launcher() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_afterburner"));
    command.arg("launch");
    command
}

fn run(args: &[&str]) -> Output {
    launcher()
        .args(args)
        .output()
        .expect("running the launcher")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A worker: `sh -c SCRIPT`.
fn sh(script: &str) -> Vec<&str> {
    vec!["--", "sh", "-c", script]
}

#[test]
fn each_worker_gets_its_place_and_its_output_is_prefixed() {
    let mut args = vec!["--nproc", "3"];
    args.extend(sh(
        "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK of $LOCAL_WORLD_SIZE \
         restarts=$AFTERBURNER_RESTART_COUNT policy=$AFTERBURNER_RESTART_POLICY \
         lighthouse=$AFTERBURNER_LIGHTHOUSE master=$MASTER_ADDR:$MASTER_PORT\"",
    ));
    let out = run(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for rank in 0..3 {
        let line = stdout
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "[rank {rank}] rank={rank} world=3 local={rank} of 3"
                ))
            })
            .unwrap_or_else(|| panic!("no line of rank {rank} in {stdout}"));
        assert!(
            line.contains("restarts=0 policy=auto lighthouse=127.0.0.1:"),
            "{line}"
        );
        let lighthouse = line
            .split("lighthouse=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        assert!(line.ends_with(&format!("master={lighthouse}")), "{line}");
    }
}

#[test]
fn under_the_all_policy_a_death_restarts_every_worker() {
    // Rank 1 kills itself on the first start; rank 0 would run for a minute: it is stopped,
    // and both start again with restart count 1.
    let mut args = vec!["--nproc", "2", "--max-restarts", "2"];
    args.extend(sh("echo \"start $AFTERBURNER_RESTART_COUNT\"; \
         if [ \"$AFTERBURNER_RESTART_COUNT\" = 0 ]; then \
           if [ \"$RANK\" = 1 ]; then kill -9 $$; else sleep 60; fi; fi"));
    let started = Instant::now();
    let out = run(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("[rank {rank}] start 0")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("[rank {rank}] start 1")),
            "{stdout}"
        );
    }
    assert!(
        stderr.contains("rank 1 was killed by signal 9 (SIGKILL)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("restarting all 2 worker(s) (restart 1 of 2)"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "rank 0 was not stopped"
    );
}

#[test]
fn under_the_replica_policy_only_the_dead_worker_starts_again() {
    let mut args = vec![
        "--nproc",
        "2",
        "--max-restarts",
        "1",
        "--restart-policy",
        "replica",
    ];
    args.extend(sh(
        "echo \"start $AFTERBURNER_RESTART_COUNT policy $AFTERBURNER_RESTART_POLICY\"; \
         if [ \"$RANK\" = 1 ] && [ \"$AFTERBURNER_RESTART_COUNT\" = 0 ]; then exit 7; fi; \
         sleep 1",
    ));
    let out = run(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.matches("[rank 0] start").count(), 1, "{stdout}");
    assert!(
        stdout.contains("[rank 0] start 0 policy replica"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[rank 1] start 1 policy replica"),
        "{stdout}"
    );
    assert!(
        stderr.contains("rank 1 exited with code 7; starting it again alone"),
        "{stderr}"
    );
}

#[test]
fn under_the_replica_policy_a_failure_after_the_others_finished_is_not_restarted() {
    // Rank 0 finishes at once; rank 1 fails a second later: no live replica could heal it.
    let mut args = vec![
        "--nproc",
        "2",
        "--max-restarts",
        "5",
        "--restart-policy",
        "replica",
    ];
    args.extend(sh(
        "if [ \"$RANK\" = 1 ]; then sleep 1; echo dying >&2; exit 7; fi",
    ));
    let out = run(&args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rank 1 exited with code 7 after every other replica had finished"),
        "{stderr}"
    );
    assert!(
        stderr.contains("dying"),
        "its last output is shown: {stderr}"
    );
    assert!(!stderr.contains("starting it again"), "{stderr}");
}

/// The launcher never reads the program's command line: under `auto` the workers declare
/// their strategy at the rendezvous (tests/launch_policy.rs at the workspace root drives real
/// workers), and a program that never meets it (this script, whatever its arguments say) is
/// restarted as a whole.
#[test]
fn auto_is_left_to_the_workers_not_read_from_the_programs_arguments() {
    let mut args = vec!["--nproc", "2", "--max-restarts", "1"];
    args.extend(sh(
        "echo \"policy $AFTERBURNER_RESTART_POLICY restart $AFTERBURNER_RESTART_COUNT\"; \
         if [ \"$AFTERBURNER_RESTART_COUNT\" = 0 ]; then \
           if [ \"$RANK\" = 1 ]; then exit 5; fi; sleep 10; \
         fi",
    ));
    args.extend(["launched", "--strategy", "diloco"]);
    let out = run(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    for rank in 0..2 {
        for restart in 0..2 {
            let line = format!("[rank {rank}] policy auto restart {restart}");
            assert!(stdout.contains(&line), "{line}: {stdout}");
        }
    }
    assert!(
        stderr.contains("restarting all 2 worker(s) (restart 1 of 1)"),
        "{stderr}"
    );
}

#[test]
fn used_up_restarts_fail_with_the_last_error_shown() {
    let mut args = vec!["--nproc", "2", "--max-restarts", "1"];
    args.extend(sh("echo \"disk full on rank $RANK\" >&2; exit 3"));
    let out = run(&args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--max-restarts 1 is used up"), "{stderr}");
    assert!(stderr.contains("exited with code 3"), "{stderr}");
    assert!(
        stderr.contains("its last output:\n  disk full on rank"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("restarting all").count(), 1, "{stderr}");
}

#[test]
fn a_worker_returning_early_under_the_all_policy_is_named() {
    let mut args = vec!["--nproc", "2", "--max-restarts", "3"];
    args.extend(sh("if [ \"$RANK\" = 1 ]; then sleep 1; exit 4; fi"));
    let out = run(&args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rank 0 exited with success while the other ranks still ran, and then rank 1 exited with code 4"),
        "{stderr}"
    );
    assert!(!stderr.contains("restarting"), "{stderr}");
}

#[test]
fn bad_input_is_named() {
    let out = run(&["--nproc", "2", "--", "no-such-program-afterburner"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot start `no-such-program-afterburner`: no such program"),
        "{stderr}"
    );

    let out = run(&["--nproc", "0", "--", "true"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--nproc"), "{stderr}");

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let rdzv = taken.local_addr().unwrap().to_string();
    let out = run(&["--rdzv", &rdzv, "--", "true"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot serve the rendezvous on {rdzv}")),
        "{stderr}"
    );
    assert!(stderr.contains("the port is in use"), "{stderr}");

    let out = run(&["--nnodes", "2", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--rdzv HOST:PORT is needed"));

    let out = run(&["--nproc", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("PROGRAM"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 41: a timeout no `Duration` holds is a named usage error, never a panic.
#[test]
fn an_absurd_timeout_is_named() {
    for option in ["--collective-timeout", "--stop-timeout"] {
        for value in ["1e300", "inf", "0"] {
            let out = run(&[option, value, "--", "true"]);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{option} {value}: {stderr}");
            assert!(
                stderr.contains(option) && stderr.contains("one week"),
                "{option} {value}: {stderr}"
            );
        }
    }
}

#[test]
fn sigterm_is_forwarded_and_the_workers_stop_cleanly() {
    let dir = std::env::temp_dir().join(format!("ab-launch-term-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("stopped");
    let script = format!(
        "trap 'echo stopped > {}.$RANK; exit 0' TERM; echo ready; \
         while true; do sleep 0.05; done",
        marker.display()
    );
    let mut child = launcher()
        .args(["--nproc", "2", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling the launcher this test started.
    unsafe { libc_kill(child.id() as i32, 15) };
    let out = wait_with_timeout(&mut child, Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("signal 15 received"), "{stderr}");
    for rank in 0..2 {
        assert!(
            dir.join(format!("stopped.{rank}")).exists(),
            "rank {rank} did not trap it"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

fn wait_with_timeout(child: &mut std::process::Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the launcher did not stop");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status: child.wait().unwrap(),
        stdout,
        stderr,
    }
}
