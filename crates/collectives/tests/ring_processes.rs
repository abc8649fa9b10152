//! The ring between processes: a lighthouse served in this test (the control plane), member
//! processes (this test binary started again as `ring_member`) moving the values between
//! themselves. An all-reduce equals the ring's fixed-order sum bitwise and each member sends
//! 2(n-1)/n of the buffer at n = 2, 3, 4; a member killed with SIGKILL during all-reduces
//! gives every other a named error within the collective timeout.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use afterburner_collectives::{
    LighthouseServer, ProcessGroup, QuorumConfig, ReduceOp, connect_tcp,
};
use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};

/// Member `r`'s values: magnitudes far apart, so the order of a sum shows in its bits.
fn values(r: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            ((i * 7 + r * 13) % 11) as f32 * 10f32.powi((r as i32 * 3 + i as i32) % 9 - 4) + 0.1
        })
        .collect()
}

/// The ring's documented order: chunk `c` of `n` (`c*len/n..(c+1)*len/n`) summed from the
/// member after `c` around to `c`, left to right.
fn fixed_order_sum(all: &[Vec<f32>]) -> Vec<f32> {
    let (n, len) = (all.len(), all[0].len());
    let mut out = vec![0f32; len];
    for c in 0..n {
        for (i, slot) in out
            .iter_mut()
            .enumerate()
            .take((c + 1) * len / n)
            .skip(c * len / n)
        {
            let mut sum = all[(c + 1) % n][i];
            for k in 2..=n {
                sum += all[(c + k) % n][i];
            }
            *slot = sum;
        }
    }
    out
}

/// The same values summed in replica order (a star's order), to show the order matters.
fn replica_order_sum(all: &[Vec<f32>]) -> Vec<f32> {
    (0..all[0].len())
        .map(|i| all[1..].iter().fold(all[0][i], |sum, v| sum + v[i]))
        .collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// A member process: connects to `AB_RING_ADDR` as `AB_RING_REPLICA` and, with `AB_RING_MODE`
/// `sum`, writes its all-reduce's bits and its ring bytes to `AB_RING_OUT`; with `loop`, as a
/// group failing together, all-reduces until a call fails and writes how long that call took
/// and its error.
#[test]
#[ignore = "a member process of the ring tests (does nothing without its environment)"]
fn ring_member() {
    let var = |name: &str| std::env::var(name).ok();
    let Some(address) = var("AB_RING_ADDR") else {
        return;
    };
    let replica: usize = var("AB_RING_REPLICA").unwrap().parse().unwrap();
    let len: usize = var("AB_RING_LEN").unwrap().parse().unwrap();
    let out = PathBuf::from(var("AB_RING_OUT").unwrap());
    let device = Default::default();
    let group = connect_tcp::<Flex>(address, replica, &device, Duration::from_secs(20)).unwrap();
    let tensor =
        || Tensor::<Flex, 1>::from_data(TensorData::new(values(replica, len), [len]), &device);
    if var("AB_RING_MODE").as_deref() == Some("sum") {
        let sum = group.all_reduce(tensor(), ReduceOp::Sum).unwrap();
        let sum: Vec<f32> = sum.into_data().into_vec().unwrap();
        let text: Vec<String> = bits(&sum).iter().map(|b| b.to_string()).collect();
        let report = format!("{}\n{}\n", group.ring_bytes_sent(), text.join(" "));
        fs::write(&out, report).unwrap();
        return;
    }
    let group = group.failing_together();
    for call in 0.. {
        let started = Instant::now();
        if let Err(error) = group.all_reduce(tensor(), ReduceOp::Sum) {
            let ms = started.elapsed().as_millis();
            fs::write(&out, format!("error {ms} {error}\n")).unwrap();
            return;
        }
        fs::write(&out, format!("ok {call}\n")).unwrap();
    }
}

/// Starts member `replica` of the lighthouse at `address`.
fn member(address: &str, replica: usize, len: usize, mode: &str, out: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "ring_member",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("AB_RING_ADDR", address)
        .env("AB_RING_REPLICA", replica.to_string())
        .env("AB_RING_LEN", len.to_string())
        .env("AB_RING_MODE", mode)
        .env("AB_RING_OUT", out)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits for `child` up to `limit`, killing it past that.
fn wait(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    false
}

fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afterburner-ring-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn over_processes_an_all_reduce_is_the_fixed_order_sum_and_sends_2_n_minus_1_over_n() {
    let len = 12 * 500;
    let dir = fresh("sum");
    for n in 2..=4 {
        let server = LighthouseServer::bind("127.0.0.1:0", QuorumConfig::new(n)).unwrap();
        let address = server.address().to_string();
        let outs: Vec<PathBuf> = (0..n).map(|r| dir.join(format!("{n}-{r}"))).collect();
        let mut members: Vec<Child> = (0..n)
            .map(|r| member(&address, r, len, "sum", &outs[r]))
            .collect();
        for (r, child) in members.iter_mut().enumerate() {
            assert!(
                wait(child, Duration::from_secs(60)),
                "member {r} of {n} failed"
            );
        }
        let all: Vec<Vec<f32>> = (0..n).map(|r| values(r, len)).collect();
        let expected = bits(&fixed_order_sum(&all));
        if n > 2 {
            // Two values sum alike either way; from three on, the order shows in the bits.
            assert_ne!(expected, bits(&replica_order_sum(&all)), "the order shows");
        }
        for (r, out) in outs.iter().enumerate() {
            let report = fs::read_to_string(out).unwrap();
            let mut lines = report.lines();
            let sent: u64 = lines.next().unwrap().parse().unwrap();
            let got: Vec<u32> = lines
                .next()
                .unwrap()
                .split(' ')
                .map(|b| b.parse().unwrap())
                .collect();
            assert_eq!(got, expected, "member {r} of {n}");
            let buffer = 4 * len as u64;
            assert_eq!(
                sent,
                2 * (n as u64 - 1) * buffer / n as u64,
                "member {r} of {n}"
            );
        }
    }
}

#[test]
fn a_member_killed_during_all_reduces_gives_every_other_a_named_error_within_the_timeout() {
    let (n, timeout) = (4, Duration::from_secs(5));
    let config = QuorumConfig::new(n)
        .with_timeout(timeout)
        .with_min_replicas(n);
    let server = LighthouseServer::bind("127.0.0.1:0", config).unwrap();
    let address = server.address().to_string();
    let dir = fresh("kill");
    let outs: Vec<PathBuf> = (0..n).map(|r| dir.join(r.to_string())).collect();
    let mut members: Vec<Child> = (0..n)
        .map(|r| member(&address, r, 1 << 18, "loop", &outs[r]))
        .collect();
    // Every member has finished a few all-reduces: the ring runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !outs.iter().all(|out| {
        let calls = fs::read_to_string(out).ok();
        let call = calls.and_then(|s| s.strip_prefix("ok ")?.trim().parse::<u64>().ok());
        call.is_some_and(|c| c >= 3)
    }) {
        assert!(Instant::now() < deadline, "the members did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    members[2].kill().unwrap(); // SIGKILL
    let _ = members[2].wait();
    for r in [0, 1, 3] {
        wait(&mut members[r], Duration::from_secs(30));
        let report = fs::read_to_string(&outs[r]).unwrap();
        let mut words = report.splitn(3, ' ');
        assert_eq!(words.next(), Some("error"), "member {r}: {report}");
        let ms: u128 = words.next().unwrap().parse().unwrap();
        let error = words.next().unwrap();
        assert!(error.contains("replica 2"), "member {r}: {error}");
        assert!(
            ms < timeout.as_millis(),
            "member {r} waited {ms} ms: {error}"
        );
    }
}
