//! Ranks that fail together (DDP under `afterburner launch`'s restart policy `all`) move their
//! values over the ring, past the lighthouse: when the process serving the lighthouse dies
//! (node 0's launcher), each rank's next collective fails naming the lost lighthouse, instead
//! of training on unsupervised. The lighthouse runs in a process of its own here (this test
//! binary started again as `lighthouse_process`), killed with SIGKILL.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use afterburner_collectives::{
    LighthouseServer, ProcessGroup, QuorumConfig, ReduceOp, connect_tcp,
};
use burn::backend::Flex;
use burn::tensor::Tensor;

/// The collective timeout of the run.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The lighthouse's process: serves a lighthouse for 2 ranks and writes its address to
/// `AB_LIGHTHOUSE_OUT`, then waits to be killed (it ends alone after 2 minutes, should the
/// test fail before it kills it).
#[test]
#[ignore = "the lighthouse process of the test below (does nothing without its environment)"]
fn lighthouse_process() {
    let Some(out) = std::env::var_os("AB_LIGHTHOUSE_OUT") else {
        return;
    };
    let config = QuorumConfig::new(2)
        .with_min_replicas(2)
        .with_timeout(TIMEOUT);
    let server = LighthouseServer::bind("127.0.0.1:0", config).unwrap();
    fs::write(out, server.address().to_string()).unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

/// Starts the lighthouse's process, which writes its address to `out`.
fn lighthouse(out: &PathBuf) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "lighthouse_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("AB_LIGHTHOUSE_OUT", out)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// The address the lighthouse's process wrote to `out`.
fn address(out: &PathBuf) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(address) = fs::read_to_string(out)
            && !address.is_empty()
        {
            return address;
        }
        assert!(
            Instant::now() < deadline,
            "the lighthouse process did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ranks_failing_together_stop_when_their_lighthouses_process_dies() {
    let out = std::env::temp_dir().join(format!(
        "afterburner-lighthouse-loss-{}",
        std::process::id()
    ));
    let _ = fs::remove_file(&out);
    let mut child = lighthouse(&out);
    let address = address(&out);
    let calls = [AtomicU64::new(0), AtomicU64::new(0)];
    // When the lighthouse's process was killed.
    let killed: OnceLock<Instant> = OnceLock::new();
    let results: Vec<(Duration, String)> = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (address, calls, killed) = (address.as_str(), &calls, &killed);
                scope.spawn(move || {
                    let device = Default::default();
                    let group = connect_tcp::<Flex>(address, rank, &device, TIMEOUT)
                        .unwrap()
                        .failing_together();
                    // How long after the kill, and the error (`MAX`: before the kill).
                    let since_kill = || killed.get().map_or(Duration::MAX, Instant::elapsed);
                    loop {
                        let tensor = Tensor::<Flex, 1>::ones([1024], &device);
                        match group.all_reduce(tensor, ReduceOp::Sum) {
                            Ok(_) => calls[rank].fetch_add(1, Ordering::SeqCst),
                            Err(error) => return (since_kill(), error.to_string()),
                        };
                        if killed.get().is_some() && since_kill() > 4 * TIMEOUT {
                            return (since_kill(), "still training".into());
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                })
            })
            .collect();
        // Both ranks are training over the ring: kill the lighthouse's process.
        let deadline = Instant::now() + Duration::from_secs(60);
        while calls.iter().any(|c| c.load(Ordering::SeqCst) < 3) {
            assert!(Instant::now() < deadline, "the ranks never trained");
            std::thread::sleep(Duration::from_millis(10));
        }
        killed.set(Instant::now()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let _ = fs::remove_file(&out);
    for (rank, (after, error)) in results.iter().enumerate() {
        println!("rank {rank}, {after:?} after the kill: {error}");
        assert!(
            error.contains("lighthouse"),
            "rank {rank}: the error names the lighthouse: {error}"
        );
        assert!(
            *after <= TIMEOUT,
            "rank {rank}: stopped {after:?} after the kill (the timeout is {TIMEOUT:?}): {error}"
        );
    }
}
