//! The MPI engine across processes on loopback: 2 processes started by `mpirun` train together
//! and match single-process training; a rank that fails mid-step ends the whole job with an
//! error, within seconds. Each test starts `mpirun` on this test binary, filtered to itself;
//! under `mpirun` (OMPI_COMM_WORLD_RANK set) the same test runs as one rank.
#![cfg(feature = "mpi")]

mod common;

use std::time::Duration;

use afterburner_parallel::{
    Ddp, LaunchConfig, ProcessGroup, ReduceOp, launch_mpi, run_on_loopback,
};
use burn::backend::Flex;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use common::mlp::*;
use common::*;

fn is_rank() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_RANK").is_some()
}

/// Runs `test` of this binary on `n` ranks under `mpirun` (`mode` reaches the ranks in
/// `AFTERBURNER_MPI_MODE`); returns whether the job succeeded, its output, and how long it
/// took. Fails the test if the job outlives `limit` (a hang).
fn mpirun(test: &str, n: usize, mode: &str, limit: Duration) -> (bool, String, Duration) {
    let _one_job_at_a_time = rng_lock();
    let run = run_on_loopback(
        n,
        &std::env::current_exe().unwrap(),
        &[test, "--exact", "--nocapture", "--test-threads=1"],
        &[("AFTERBURNER_MPI_MODE", mode)],
        limit,
    )
    .expect("mpirun not found: install openmpi-bin (see README)");
    assert!(
        !run.timed_out,
        "the MPI job ran past {limit:?}: a hang\n{}",
        run.output
    );
    (run.success, run.output, run.elapsed)
}

/// One rank: DDP over MPI on this rank's half of every batch; rank 0 also trains the
/// single-process reference and compares.
fn train_rank() {
    let result =
        launch_mpi::<Flex, _, String, _>(Default::default(), LaunchConfig::default(), |group| {
            let rank = group.rank();
            assert_eq!(group.world_size(), 2);
            // Rank 1 starts from other weights: setup must give it rank 0's.
            let initial = Mlp::<B>::new(1 + 999 * rank as u64, &Default::default());
            let mut ddp = Ddp::<B, _>::new(group);
            let mut model = ddp.setup(initial).map_err(|e| e.to_string())?;
            let mut optim = SgdConfig::new().init();
            for step in &data() {
                let l = loss(&model, step, rank * BATCH, BATCH, 1.0);
                let mut grads = GradientsParams::from_grads(l.backward(), &model);
                ddp.sync_gradients(&model, &mut grads)
                    .map_err(|e| e.to_string())?;
                model = optim.step(0.1, model, grads);
            }
            let mine = params(&model);
            // Every rank holds the same parameters: the sum over ranks is 2x this rank's.
            let t = Tensor::<Flex, 1>::from_floats(mine.as_slice(), &Default::default());
            let sum = ddp
                .group()
                .all_reduce(t, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            let sum: Vec<f32> = sum.into_data().to_vec().unwrap();
            let twice: Vec<f32> = mine.iter().map(|v| 2.0 * v).collect();
            let replicas = max_rel(&sum, &twice);
            let reference = max_rel(&mine, &single_device());
            Ok((rank, reference, replicas))
        })
        .unwrap();
    let (rank, reference, replicas) = result;
    println!("MPI rank {rank}: vs single process {reference:e}, replicas {replicas:e}");
    assert!(reference <= 1e-5 && replicas == 0.0);
    println!("MPI-RANK-{rank}-MATCHES");
}

#[test]
fn two_processes_train_together_and_match_one_process() {
    if is_rank() {
        return train_rank();
    }
    let (ok, output, took) = mpirun(
        "two_processes_train_together_and_match_one_process",
        2,
        "",
        Duration::from_secs(120),
    );
    println!("{output}");
    assert!(ok, "the MPI job failed:\n{output}");
    for rank in 0..2 {
        assert!(
            output.contains(&format!("MPI-RANK-{rank}-MATCHES")),
            "{output}"
        );
    }
    println!("2 MPI processes: {took:?}");
}

/// One rank of a job whose rank 1 fails in the middle of its second step.
fn fail_rank() {
    let _ = launch_mpi::<Flex, _, String, _>(
        Default::default(),
        LaunchConfig {
            timeout: Duration::from_secs(60),
        },
        |group| {
            let rank = group.rank();
            let mut ddp = Ddp::<B, _>::new(group);
            let mut model = ddp
                .setup(Mlp::<B>::new(1, &Default::default()))
                .map_err(|e| e.to_string())?;
            let mut optim = SgdConfig::new().init();
            for (i, step) in data().iter().enumerate() {
                let l = loss(&model, step, rank * BATCH, BATCH, 1.0);
                let mut grads = GradientsParams::from_grads(l.backward(), &model);
                if i == 1 && rank == 1 {
                    return Err("rank 1 lost its data".to_string());
                }
                ddp.sync_gradients(&model, &mut grads)
                    .map_err(|e| e.to_string())?;
                model = optim.step(0.1, model, grads);
            }
            Ok(())
        },
    );
    println!("MPI-RANK-FINISHED (must not happen)");
}

#[test]
fn a_rank_failing_mid_step_ends_the_whole_job_with_an_error() {
    if is_rank() {
        return fail_rank();
    }
    let (ok, output, took) = mpirun(
        "a_rank_failing_mid_step_ends_the_whole_job_with_an_error",
        2,
        "",
        Duration::from_secs(60),
    );
    println!("{output}\njob ended after {took:?}");
    assert!(!ok, "the job must fail");
    assert!(output.contains("rank 1 lost its data"), "{output}");
    assert!(!output.contains("MPI-RANK-FINISHED"), "{output}");
    // Rank 0 waits in the all-reduce only until rank 1's abort reaches it: seconds, far below
    // the 60 s collective timeout.
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// One rank of a job whose rank 1 panics (`mode = "panic"`) or stops calling collectives
/// (`"hang"`, caught by the 2 s collective timeout) after setup.
fn misbehaving_rank(mode: &str) {
    let _ = launch_mpi::<Flex, _, String, _>(
        Default::default(),
        LaunchConfig {
            timeout: Duration::from_secs(2),
        },
        |group| {
            let rank = group.rank();
            let ddp = Ddp::<B, _>::new(group);
            let _model = ddp
                .setup(Mlp::<B>::new(1, &Default::default()))
                .map_err(|e| e.to_string())?;
            if rank == 1 {
                match mode {
                    "panic" => panic!("rank 1 panicked on purpose"),
                    _ => loop {
                        std::thread::sleep(Duration::from_secs(1));
                    },
                }
            }
            ddp.group()
                .barrier(&Default::default())
                .map_err(|e| e.to_string())?;
            Ok(())
        },
    );
    println!("MPI-RANK-FINISHED (must not happen)");
}

#[test]
fn a_panicking_or_hung_rank_ends_the_whole_job_within_seconds() {
    if is_rank() {
        let mode = std::env::var("AFTERBURNER_MPI_MODE").unwrap_or_default();
        return misbehaving_rank(&mode);
    }
    for (mode, expect) in [
        ("panic", "rank 1 panicked on purpose"),
        ("hang", "did not complete within 2 s"),
    ] {
        let (ok, output, took) = mpirun(
            "a_panicking_or_hung_rank_ends_the_whole_job_within_seconds",
            2,
            mode,
            Duration::from_secs(60),
        );
        println!("{mode}: job ended after {took:?}");
        assert!(!ok, "{mode}: the job must fail:\n{output}");
        assert!(output.contains(expect), "{mode}:\n{output}");
        assert!(!output.contains("MPI-RANK-FINISHED"), "{mode}:\n{output}");
        assert!(took < Duration::from_secs(20), "{mode}: {took:?}");
    }
}

/// One rank moving buffers longer than one MPI call may carry (the limit lowered to 3
/// elements, as a stand-in for 2^31): every collective must still give the exact result.
fn pieces_rank() {
    let result =
        launch_mpi::<Flex, _, String, _>(Default::default(), LaunchConfig::default(), |group| {
            let group = group.with_max_count(3);
            let (rank, device) = (group.rank(), *group.device());
            let err = |e: afterburner_parallel::ParallelError| e.to_string();
            let values =
                |n: usize, base: f32| -> Vec<f32> { (0..n).map(|i| base + i as f32).collect() };
            let t = |v: &[f32]| Tensor::<Flex, 1>::from_floats(v, &device);
            let read = |t: Tensor<Flex, 1>| t.into_data().to_vec::<f32>().unwrap();
            // all_reduce of 10 values: 4 pieces.
            let mine = values(10, 100.0 * rank as f32);
            let sum = read(group.all_reduce(t(&mine), ReduceOp::Sum).map_err(err)?);
            let want: Vec<f32> = (0..10).map(|i| 100.0 + 2.0 * i as f32).collect();
            assert_eq!(sum, want, "all_reduce");
            // broadcast of 8 values from rank 1.
            let sent = (rank == 1).then(|| t(&values(8, 7.0)));
            assert_eq!(read(group.broadcast(sent, 1).map_err(err)?), values(8, 7.0));
            // all_gather of 5 and 4 values (9 in all, over the limit).
            let mine = values(5 - rank, 10.0 * rank as f32);
            let all: Vec<Vec<f32>> = group
                .all_gather(t(&mine))
                .map_err(err)?
                .into_iter()
                .map(read)
                .collect();
            assert_eq!(all, vec![values(5, 0.0), values(4, 10.0)], "all_gather");
            // reduce_scatter of 8 values: each rank gets its 4 of the sum.
            let mine = values(8, rank as f32);
            let part = read(group.reduce_scatter(t(&mine), ReduceOp::Sum).map_err(err)?);
            let sum: Vec<f32> = (0..8).map(|i| 1.0 + 2.0 * i as f32).collect();
            assert_eq!(part, sum[rank * 4..rank * 4 + 4].to_vec(), "reduce_scatter");
            Ok(rank)
        })
        .unwrap();
    println!("MPI-RANK-{result}-PIECES-EXACT");
}

#[test]
fn buffers_longer_than_one_mpi_call_go_in_exact_pieces() {
    if is_rank() {
        return pieces_rank();
    }
    let (ok, output, _) = mpirun(
        "buffers_longer_than_one_mpi_call_go_in_exact_pieces",
        2,
        "",
        Duration::from_secs(120),
    );
    assert!(ok, "the MPI job failed:\n{output}");
    for rank in 0..2 {
        assert!(
            output.contains(&format!("MPI-RANK-{rank}-PIECES-EXACT")),
            "{output}"
        );
    }
}
