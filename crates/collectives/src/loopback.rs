//! Test and benchmark helpers (feature `testing`, with `mpi`): run a program as an MPI job of
//! several processes on this machine, over loopback TCP.

use std::time::{Duration, Instant};

use crate::LOOPBACK_MPIRUN_FLAGS;

/// What [`run_on_loopback`] saw.
#[derive(Debug, Clone)]
pub struct LoopbackRun {
    /// Whether `mpirun` exited with success (every rank did).
    pub success: bool,
    /// Everything the ranks and `mpirun` printed (stdout and stderr).
    pub output: String,
    /// How long the job took.
    pub elapsed: Duration,
    /// Whether the job was killed for running past the limit.
    pub timed_out: bool,
}

/// Runs `program args` as an MPI job of `ranks` processes on this machine
/// (`mpirun` with [`LOOPBACK_MPIRUN_FLAGS`]), with `env` added to the ranks' environment;
/// kills it after `limit`. For tests and benchmarks; errors only when `mpirun` cannot start.
pub fn run_on_loopback(
    ranks: usize,
    program: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> std::io::Result<LoopbackRun> {
    use std::process::{Command, Stdio};
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = std::env::temp_dir().join(format!(
        "afterburner-mpirun-{}-{run}.log",
        std::process::id()
    ));
    let out = std::fs::File::create(&log)?;
    let started = Instant::now();
    let mut child = Command::new("mpirun")
        .args(LOOPBACK_MPIRUN_FLAGS)
        .args(["-np", &ranks.to_string()])
        .arg(program)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()?;
    let (status, timed_out) = loop {
        if let Some(status) = child.try_wait()? {
            break (Some(status), false);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    Ok(LoopbackRun {
        success: status.is_some_and(|s| s.success()),
        output,
        elapsed: started.elapsed(),
        timed_out,
    })
}
