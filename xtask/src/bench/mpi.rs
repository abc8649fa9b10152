//! The MPI engine's all-reduce time (feature `mpi`): processes on loopback, started with
//! `mpirun` on this very binary (`xtask mpi-all-reduce LEN REPS` is the rank side).

use std::time::{Duration, Instant};

use afterburner::parallel::{LaunchConfig, ProcessGroup, ReduceOp, launch_mpi, run_on_loopback};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// What rank 0 prints: the mean all-reduce time in nanoseconds.
const MARK: &str = "MPI_ALL_REDUCE_NS";

/// Mean time of an all-reduce of `len` f32 between `processes` MPI processes on this machine.
pub fn all_reduce_time(processes: usize, len: usize, reps: usize) -> Result<Duration, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let args = [
        "mpi-all-reduce".to_string(),
        len.to_string(),
        reps.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = run_on_loopback(processes, &exe, &args, &[], Duration::from_secs(300))
        .map_err(|e| format!("cannot start mpirun (install openmpi-bin): {e}"))?;
    if !run.success {
        return Err(format!("the MPI all-reduce job failed:\n{}", run.output));
    }
    let nanos = run
        .output
        .lines()
        .find_map(|l| l.strip_prefix(MARK)?.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no {MARK} line in the job's output:\n{}", run.output))?;
    Ok(Duration::from_nanos(nanos))
}

/// The rank side, under `mpirun`: `LEN REPS`.
pub fn rank(args: &[String]) -> Result<(), String> {
    let number = |i: usize| -> Result<usize, String> {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| "usage: xtask mpi-all-reduce LEN REPS".to_string())
    };
    let (len, reps) = (number(0)?, number(1)?);
    launch_mpi::<Flex, _, String, _>(Default::default(), LaunchConfig::default(), |g| {
        let t = Tensor::<Flex, 1>::ones([len], g.device());
        let err = |e: afterburner::parallel::ParallelError| e.to_string();
        g.all_reduce(t.clone(), ReduceOp::Sum).map_err(err)?; // warm-up
        let start = Instant::now();
        for _ in 0..reps {
            let r = g.all_reduce(t.clone(), ReduceOp::Sum).map_err(err)?;
            Flex::sync(g.device()).ok();
            drop(r);
        }
        if g.rank() == 0 {
            println!("{MARK} {}", (start.elapsed() / reps as u32).as_nanos());
        }
        Ok(())
    })
    .map_err(|e| e.to_string())
}
