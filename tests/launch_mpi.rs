//! `afterburner launch --engine mpi` driving the ViT example (built with feature `mpi` beside
//! this test): each attempt is one `mpirun` job whose collectives go over Open MPI. A DDP rank
//! SIGKILLed after the first checkpoint makes mpirun stop the job and the launcher start it
//! again; it resumes and ends on the model of an uninterrupted run, bitwise. A strategy whose
//! replicas heal alone is refused by name under `--engine mpi` and moved to the tcp engine
//! under `--engine auto`.
#![cfg(all(unix, feature = "flex", feature = "mpi"))]

use afterburner_launch::{launch, parse_args};

#[allow(dead_code)] // shared with tests/launch.rs, which uses the rest
mod launch_support;

use launch_support::*;

const DDP: &[&str] = &[
    "--strategy",
    "ddp",
    "--max-steps",
    "60",
    "--save-strategy",
    "steps",
    "--save-steps",
    "20",
    "--logging-steps",
    "20",
];

#[test]
fn a_rank_killed_under_mpirun_restarts_the_job_and_it_ends_as_an_uninterrupted_one() {
    let (whole, killed) = (fresh("mpi-whole"), fresh("mpi-killed"));
    assert_eq!(
        launch_vit(&["--engine", "mpi", "--nproc", "4"], DDP, &whole),
        0
    );

    let target = killed.clone();
    let killer = std::thread::spawn(move || {
        // The rank's environment holds torchrun's names under mpirun too.
        let first = [
            "RANK=2".to_string(),
            "AFTERBURNER_ENGINE=mpi".to_string(),
            "AFTERBURNER_RESTART_COUNT=0".to_string(),
        ];
        let checkpoint = target.join("checkpoint-20");
        let killed = kill_when(&target, &first, || checkpoint.exists());
        let again = [
            "RANK=2".to_string(),
            "AFTERBURNER_RESTART_COUNT=1".to_string(),
        ];
        (killed, appears(&target, &again))
    });
    let launcher = ["--engine", "mpi", "--nproc", "4", "--max-restarts", "1"];
    assert_eq!(launch_vit(&launcher, DDP, &killed), 0);
    let (was_killed, restarted) = killer.join().unwrap();
    assert!(was_killed, "no rank-2 worker to kill");
    assert!(restarted, "the job was not started again");
    assert_eq!(
        tensor_bytes(&whole.join("model.safetensors")),
        tensor_bytes(&killed.join("model.safetensors")),
        "the restarted job's model differs from the uninterrupted one's"
    );
    let _ = std::fs::remove_dir_all(whole);
    let _ = std::fs::remove_dir_all(killed);
}

const DILOCO: &[&str] = &[
    "--strategy",
    "diloco",
    "--diloco.sync-every",
    "5",
    "--max-steps",
    "10",
    "--save-strategy",
    "no",
];

#[test]
fn a_strategy_that_heals_alone_is_refused_by_mpi_and_moved_to_tcp_by_auto() {
    let out = fresh("mpi-diloco");
    let vit = example("vit_classify");
    let mut args = vec!["afterburner", "launch", "--engine", "mpi", "--nproc", "2"];
    args.extend(["--", vit.to_str().unwrap()]);
    args.extend(DILOCO);
    args.extend(["--eval-strategy", "no", "--load-best-model-at-end", "false"]);
    args.extend(["--output-dir", out.to_str().unwrap()]);
    let error = launch(&parse_args(args).unwrap()).unwrap_err().to_string();
    assert!(
        error.contains("--engine mpi") && error.contains("heals alone"),
        "{error}"
    );

    assert_eq!(
        launch_vit(&["--engine", "auto", "--nproc", "2"], DILOCO, &out),
        0
    );
    assert!(out.join("model.safetensors").exists());
    let _ = std::fs::remove_dir_all(out);
}

/// ZeRO-1 and FSDP under mpirun train the model the tcp engine trains: bitwise on 2 ranks (a
/// sum of two values is the same in either order; at more ranks MPI's order and the ring's
/// differ, and the models agree within rounding).
#[test]
fn zero1_and_fsdp_under_mpirun_train_what_the_ring_trains() {
    let short = ["--max-steps", "20", "--save-strategy", "no"];
    for strategy in ["zero-1", "fsdp"] {
        let mut trainer = vec!["--strategy", strategy];
        trainer.extend(short);
        let models: Vec<Vec<f32>> = ["tcp", "mpi"]
            .iter()
            .map(|engine| {
                let out = fresh(&format!("{strategy}-{engine}"));
                let launcher = ["--engine", engine, "--nproc", "2"];
                assert_eq!(
                    launch_vit(&launcher, &trainer, &out),
                    0,
                    "{strategy} {engine}"
                );
                let bytes = tensor_bytes(&out.join("model.safetensors"));
                let _ = std::fs::remove_dir_all(out);
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            })
            .collect();
        assert_eq!(models[0].len(), models[1].len());
        let differing = models[0]
            .iter()
            .zip(&models[1])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differing, 0, "{strategy}: tcp and mpi models differ");
    }
}
