//! A plain `Trainer::new` program started by `afterburner launch` (its environment set here,
//! in a test binary of its own since the environment is the process's): it trains as its
//! launched rank over the launch's process group, with no launch code of its own. And a
//! launched worker whose strategy does not fit the launch's restart policy is named.

mod common;

use afterburner::parallel::{Launched, LighthouseServer, ParallelStrategy, RestartPolicy};
use afterburner::trainer::{Trainer, TrainingArguments};
use afterburner::{Accelerator, AcceleratorConfig};
use afterburner_demos::digits;
use common::*;
use std::time::Duration;

/// The one worker of a launch served by `server` under `policy`.
fn only_worker(server: &LighthouseServer, policy: RestartPolicy, timeout: Duration) -> Launched {
    Launched {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: 1,
        node_rank: 0,
        lighthouse: server.address().to_string(),
        restart_count: 0,
        policy: Some(policy),
        collective_timeout: timeout,
        engine: Default::default(),
    }
}

#[test]
fn trainer_new_under_a_launcher_trains_over_the_launched_group() {
    let _rng = rng_lock();
    let timeout = Duration::from_secs(30);
    let lighthouse = LighthouseServer::bind(
        "127.0.0.1:0",
        Launched::quorum_config(1, RestartPolicy::All, timeout),
    )
    .unwrap();
    let launched = only_worker(&lighthouse, RestartPolicy::All, timeout);
    for (name, value) in launched.to_vars() {
        // SAFETY: the other test of this binary holds the same lock (`rng_lock`) for its
        // whole run, so no other thread reads the environment meanwhile.
        unsafe { std::env::set_var(name, value) };
    }
    let dir = std::env::temp_dir().join(format!("ab-trainer-launched-{}", std::process::id()));
    let args = TrainingArguments {
        output_dir: dir.clone(),
        max_steps: 4,
        per_device_train_batch_size: 8,
        save_strategy: "no".parse().unwrap(),
        eval_strategy: "no".parse().unwrap(),
        disable_tqdm: true,
        parallelism: afterburner::ParallelismConfig {
            strategy: "ddp".parse().unwrap(),
            ..Default::default()
        },
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

/// Issue 40: a worker of `afterburner launch` whose strategy heals alone (DiLoCo, Local SGD)
/// under the `all` restart policy would lose its healing: a named error at setup saying which
/// policy it needs; under `replica` it sets up.
#[test]
fn a_replica_strategy_under_the_all_restart_policy_is_named() {
    let _rng = rng_lock();
    let timeout = Duration::from_secs(30);
    for (strategy, policy, fits) in [
        ("diloco", RestartPolicy::All, false),
        ("local-sgd", RestartPolicy::All, false),
        ("diloco", RestartPolicy::Replica, true),
    ] {
        let server =
            LighthouseServer::bind("127.0.0.1:0", Launched::quorum_config(1, policy, timeout))
                .unwrap();
        let launched = only_worker(&server, policy, timeout);
        let built = Accelerator::<B>::launched(
            AcceleratorConfig::default().with_strategy(strategy.parse().unwrap()),
            &launched,
        );
        match (built, fits) {
            (Ok(_), true) => {}
            (Err(e), false) => {
                let message = e.to_string();
                assert!(
                    message.contains("--restart-policy replica") && message.contains(strategy),
                    "{message}"
                );
            }
            (Ok(_), false) => panic!("{strategy} under {policy}: no error"),
            (Err(e), true) => panic!("{strategy} under {policy}: {e}"),
        }
    }
}
