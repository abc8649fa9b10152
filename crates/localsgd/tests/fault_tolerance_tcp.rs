//! Fault-tolerant DiLoCo over processes: a lighthouse served over TCP in this test, 3 replica
//! processes (this test binary started again as `replica_process`). Replica 1 is killed with
//! SIGKILL in round 2; the other 2 go on over the 2 present; replica 1 is started again in
//! round 4, healed from a live replica over the wire, and all 3 end on the same parameters.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use afterburner_localsgd::DiLoCo;
use afterburner_parallel::{
    LighthouseServer, ParallelStrategy, QuorumConfig, StateSaving, connect_tcp,
};
use burn::backend::Flex;
use burn::optim::AdamWConfig;

mod replicas;

use replicas::{B, H, Model, ROUNDS, config, global, inner_step, model, values};

/// The bits of `values`, as text (compared exactly).
fn bits(values: &[f32]) -> String {
    values
        .iter()
        .map(|v| format!("{:08x}", v.to_bits()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Appends a line to the replica's report.
fn report(out: &Path, line: &str) {
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .unwrap();
    writeln!(file, "{line}").unwrap();
}

/// A replica process: DiLoCo on the lighthouse at `AB_FT_ADDR` as replica `AB_FT_REPLICA`,
/// reporting to `AB_FT_OUT`; it sleeps at step `AB_FT_PAUSE_AT` (to be killed there) and
/// waits at step `AB_FT_GATE_AT` until the file `AB_FT_GATE` exists.
#[test]
#[ignore = "a replica process of tcp_replicas_survive_a_kill (does nothing without its environment)"]
fn replica_process() {
    let var = |name: &str| std::env::var(name).ok();
    let Some(address) = var("AB_FT_ADDR") else {
        return;
    };
    let id: usize = var("AB_FT_REPLICA").unwrap().parse().unwrap();
    let out = PathBuf::from(var("AB_FT_OUT").unwrap());
    let pause_at: Option<u64> = var("AB_FT_PAUSE_AT").map(|s| s.parse().unwrap());
    let gate_at: Option<u64> = var("AB_FT_GATE_AT").map(|s| s.parse().unwrap());
    let device = Default::default();
    let group = connect_tcp::<Flex>(address, id, &device, Duration::from_secs(10)).unwrap();
    report(&out, "connected");
    let mut diloco = DiLoCo::<B, _>::new(group, config()).unwrap();
    let mut optim = AdamWConfig::new().init::<B, Model>();
    let (mut model, start) = diloco.join(model(id), &mut optim).unwrap();
    report(&out, &format!("joined {start} {}", bits(&values(&model))));
    for step in start + 1..=H * ROUNDS {
        if pause_at == Some(step) {
            report(&out, "paused");
            std::thread::sleep(Duration::from_secs(600));
        }
        if gate_at == Some(step) {
            report(&out, "gate");
            let gate = PathBuf::from(var("AB_FT_GATE").unwrap());
            while !gate.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        model = inner_step(model, &mut optim, id, step);
        model = diloco
            .after_optimizer_step(model, &mut optim, step)
            .unwrap();
        if step % H == 0 {
            let members = diloco.group().unwrap().quorum().unwrap().members();
            let state = diloco.own_state().unwrap();
            let members: Vec<String> = members.iter().map(usize::to_string).collect();
            report(
                &out,
                &format!(
                    "round {} {} {} {}",
                    step / H,
                    members.join(","),
                    bits(&global(&state)),
                    bits(&values(&model))
                ),
            );
        }
    }
    let model = diloco.finish(model, H * ROUNDS).unwrap();
    report(&out, &format!("last {}", bits(&values(&model))));
}

/// Starts replica `id` as a process.
fn spawn(address: &str, id: usize, out: &Path, extra: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["replica_process", "--exact", "--ignored", "--nocapture"])
        .env("AB_FT_ADDR", address)
        .env("AB_FT_REPLICA", id.to_string())
        .env("AB_FT_OUT", out)
        .stdout(Stdio::null()); // libtest's lines; the report file is what counts
    for (name, value) in extra {
        command.env(name, value);
    }
    command.spawn().unwrap()
}

/// The report's lines once one starts with `prefix` (fails after 120 s).
fn wait_for(out: &Path, prefix: &str, children: &mut [Child]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let lines: Vec<String> = fs::read_to_string(out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        if lines.iter().any(|l| l.starts_with(prefix)) {
            return lines;
        }
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            panic!("{} never wrote '{prefix}': {lines:?}", out.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The fields after `prefix` on the line starting with it.
fn line<'a>(lines: &'a [String], prefix: &str) -> Vec<&'a str> {
    let line = lines.iter().find(|l| l.starts_with(prefix)).unwrap();
    line[prefix.len()..].split_whitespace().collect()
}

#[test]
fn tcp_replicas_survive_a_kill_and_heal_a_restarted_one() {
    let quorum = QuorumConfig::new(3)
        .with_timeout(Duration::from_secs(60))
        .with_join_timeout(Duration::from_secs(60));
    let server = LighthouseServer::bind("127.0.0.1:0", quorum).unwrap();
    let address = server.address().to_string();
    let dir = std::env::temp_dir().join(format!("afterburner-ft-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let out = |name: &str| dir.join(name);
    let gate = out("gate");
    let survivor = |id: usize| {
        let extra = [
            ("AB_FT_GATE_AT", "10".to_string()),
            ("AB_FT_GATE", gate.display().to_string()),
        ];
        spawn(&address, id, &out(&format!("replica{id}")), &extra)
    };
    let mut children = vec![survivor(0), survivor(2)];
    let mut doomed = spawn(
        &address,
        1,
        &out("replica1-killed"),
        &[("AB_FT_PAUSE_AT", "5".to_string())],
    );
    // Replica 1 took part in round 1 and sleeps in round 2: kill -9.
    wait_for(&out("replica1-killed"), "paused", &mut children);
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    // The survivors finish rounds 2 and 3 without it and wait in round 4: restart it.
    wait_for(&out("replica0"), "gate", &mut children);
    wait_for(&out("replica2"), "gate", &mut children);
    children.push(spawn(&address, 1, &out("replica1"), &[]));
    wait_for(&out("replica1"), "connected", &mut children);
    fs::write(&gate, "open").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    for child in &mut children {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a replica failed: {status}");
                break;
            }
            assert!(Instant::now() < deadline, "the replicas did not finish");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let reports: Vec<Vec<String>> = ["replica0", "replica2", "replica1"]
        .iter()
        .map(|name| wait_for(&out(name), "last", &mut []))
        .collect();
    let (zero, two, one) = (&reports[0], &reports[1], &reports[2]);
    // Membership per round, as the survivors saw it; their global copies agree bitwise.
    let expected = ["0,1,2", "0,2", "0,2", "0,2", "0,1,2"];
    for (round, members) in expected.iter().enumerate() {
        let prefix = format!("round {} ", round + 1);
        let (a, b) = (line(zero, &prefix), line(two, &prefix));
        assert_eq!(a[0], *members, "round {}", round + 1);
        assert_eq!(b[0], *members, "round {}", round + 1);
        assert_eq!(a[1], b[1], "global copy, round {}", round + 1);
    }
    // Healed after round 4 (step 12) with the donor's parameters, bit for bit.
    let joined = line(one, "joined ");
    assert_eq!(joined[0], "12");
    assert_eq!(
        joined[1],
        line(zero, "round 4 ")[2],
        "parameters after round 4"
    );
    assert_eq!(line(one, "round 5 ")[1], line(zero, "round 5 ")[1]);
    // All three end on the same parameters.
    assert_eq!(line(zero, "last "), line(two, "last "));
    assert_eq!(line(zero, "last "), line(one, "last "));
    drop(server);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_replica_id_or_no_lighthouse_is_a_named_error() {
    let server = LighthouseServer::bind("127.0.0.1:0", QuorumConfig::new(3)).unwrap();
    let device = Default::default();
    let wait = Duration::from_millis(300);
    let error = connect_tcp::<Flex>(server.address(), 7, &device, wait)
        .unwrap_err()
        .to_string();
    assert!(error.contains("replica id"), "{error}");
    let address = server.address();
    drop(server); // stops accepting: nothing answers there any more
    std::thread::sleep(Duration::from_millis(100));
    let error = connect_tcp::<Flex>(address, 0, &device, wait)
        .unwrap_err()
        .to_string();
    assert!(error.contains("lighthouse"), "{error}");
}
