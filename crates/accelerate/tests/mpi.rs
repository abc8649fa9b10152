//! `Accelerator::launch_mpi` across 2 processes on loopback (`mpirun`), under `ddp` and `fsdp`:
//! the same parameters as the single-device Accelerator on the double batch. Each job runs this
//! test binary, filtered to this test, as its ranks (OMPI_COMM_WORLD_RANK is then set).
#![cfg(feature = "mpi")]

mod common;

use std::time::Duration;

use afterburner::parallel::run_on_loopback;
use afterburner::{Accelerator, AcceleratorConfig, CheckpointPolicy, FsdpConfig, Strategy};
use common::*;

const TEST: &str = "two_processes_train_like_one_device_under_ddp_and_fsdp";

fn config(strategy: Strategy) -> AcceleratorConfig {
    AcceleratorConfig {
        strategy,
        gradient_accumulation_steps: 2,
        max_grad_norm: Some(1.0),
        fsdp: FsdpConfig {
            auto_wrap_policy: "TransformerEncoderLayer".parse().unwrap(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// One rank: trains with `strategy` over MPI, then (every rank) the single-device reference.
fn rank(strategy: Strategy) {
    // Rank 1 starts from other weights: setup must give it rank 0's.
    let rank: u64 = std::env::var("OMPI_COMM_WORLD_RANK")
        .unwrap()
        .parse()
        .unwrap();
    let model = vit(5 + rank);
    // FSDP runs with checkpointing, so units are gathered again in the recompute, on the
    // recompute's helper thread (MPI is initialised for serialized calls from any thread).
    let mut distributed = config(strategy);
    if strategy == Strategy::Fsdp {
        distributed.gradient_checkpointing = CheckpointPolicy::All;
    }
    let (mine, steps, rank) =
        Accelerator::<B>::launch_mpi(distributed, Default::default(), move |mut acc| {
            let (params, steps, _) = train_96_digits(&mut acc, model, 8)?;
            Ok((params, steps, acc.rank()))
        })
        .unwrap();
    let mut single =
        Accelerator::<B>::new(config(Strategy::SingleDevice), Default::default()).unwrap();
    let (reference, _, _) = train_96_digits(&mut single, vit(5), 16).unwrap();
    let err = max_rel(&mine, &reference, 1e-3);
    println!("MPI {strategy} rank {rank}: {steps} steps, vs one device {err:e}");
    assert!(steps == 3 && err <= 1e-5, "{err}");
    println!("MPI-{strategy}-RANK-{rank}-MATCHES");
}

#[test]
fn two_processes_train_like_one_device_under_ddp_and_fsdp() {
    if let Ok(strategy) = std::env::var("AFTERBURNER_MPI_MODE") {
        return rank(strategy.parse().unwrap());
    }
    for strategy in ["ddp", "fsdp"] {
        let run = run_on_loopback(
            2,
            &std::env::current_exe().unwrap(),
            &[TEST, "--exact", "--nocapture", "--test-threads=1"],
            &[("AFTERBURNER_MPI_MODE", strategy)],
            Duration::from_secs(300),
        )
        .expect("mpirun not found: install openmpi-bin (see README)");
        println!("{}", run.output);
        assert!(run.success && !run.timed_out, "{strategy}:\n{}", run.output);
        for rank in 0..2 {
            let mark = format!("MPI-{strategy}-RANK-{rank}-MATCHES");
            assert!(run.output.contains(&mark), "{strategy}:\n{}", run.output);
        }
    }
}
