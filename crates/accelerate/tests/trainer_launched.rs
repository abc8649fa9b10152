//! A plain `Trainer::new` program started by `afterburner launch` (its environment set here,
//! in a test binary of its own since the environment is the process's): it trains as its
//! launched rank over the launch's process group, with no launch code of its own.

mod common;

use afterburner::parallel::{Launched, LighthouseServer, ParallelStrategy, RestartPolicy};
use afterburner::trainer::{Trainer, TrainingArguments};
use afterburner_demos::digits;
use common::*;
use std::time::Duration;

#[test]
fn trainer_new_under_a_launcher_trains_over_the_launched_group() {
    let _rng = rng_lock();
    let timeout = Duration::from_secs(30);
    let lighthouse = LighthouseServer::bind(
        "127.0.0.1:0",
        Launched::quorum_config(1, RestartPolicy::All, timeout),
    )
    .unwrap();
    let launched = Launched {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: 1,
        node_rank: 0,
        lighthouse: lighthouse.address().to_string(),
        restart_count: 0,
        policy: RestartPolicy::All,
        collective_timeout: timeout,
    };
    for (name, value) in launched.to_vars() {
        // SAFETY: this test binary has this one test, so no other thread reads the environment.
        unsafe { std::env::set_var(name, value) };
    }
    let dir = std::env::temp_dir().join(format!("ab-trainer-launched-{}", std::process::id()));
    let args = TrainingArguments {
        output_dir: dir.clone(),
        max_steps: 4,
        per_device_train_batch_size: 8,
        save_strategy: "no".parse().unwrap(),
        eval_strategy: "no".parse().unwrap(),
        strategy: "ddp".parse().unwrap(),
        disable_tqdm: true,
        ..Default::default()
    };
    let (train, eval) = digits::load().unwrap().take(64).split(0.25, 0);
    let batcher = train.batcher();
    let mut trainer = Trainer::new(vit(8), args, train, eval, batcher).unwrap();
    trainer.train().unwrap();
    assert_eq!(trainer.state().global_step, 4);
    // DDP over the launched group: a gradient all-reduce per step went through it.
    let acc = trainer.accelerator();
    assert_eq!(acc.strategy().name(), "ddp");
    assert_eq!(acc.gradient_all_reduces(), 4);
    assert!(acc.traffic().bytes() > 0);
    let _ = std::fs::remove_dir_all(dir);
}
