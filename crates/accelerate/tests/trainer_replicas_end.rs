//! Fault-tolerant DiLoCo replicas under the Trainer at the end of a run, the moment chosen
//! (3 replica threads on a `Lighthouse`; the failed replica starts again while the others wait
//! at a known step, `fail_and_restart`):
//! - healed at the last step (the live replicas send their state from the run's last sync):
//!   the healed replica goes through the same end of training as the live ones (the epoch's
//!   end, the final log, the final save, `finish`), collective for collective, and all three
//!   end on the same parameters;
//! - started again after the last step (the live replicas are in their final save and
//!   finish without a sync to heal it from): it is told the run ended and ends with the run's
//!   final checkpoint, whose save committed among the two replicas present.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use afterburner::localsgd::DiLoCoConfig;
use afterburner::parallel::{
    Lighthouse, LocalReplicas, QuorumConfig, ReplicaRun, fail_and_restart,
};
use afterburner::trainer::TrainingArguments;
use afterburner::trainer::{Flow, IntervalStrategy, Trainer, TrainerCallback, TrainerState};
use afterburner::{AccelerateError, Accelerator, StrategyConfig};
use afterburner_demos::digits;
use burn::optim::AdamWConfig;
use common::*;

/// The run's length: mid-epoch (24 batches per replica and epoch), so the end of training
/// is also an epoch's end event, with the log the arguments put there.
const MAX_STEPS: u64 = 12;

/// Waits at `step`'s end (before its log, evaluation and save) until the failed replica has
/// started again, on the runs `fail_and_restart` pauses; nothing elsewhere. Every replica has
/// it, so every replica's Trainer holds the same callbacks (and so the same collectives).
struct PauseAt {
    step: u64,
    run: Arc<ReplicaRun>,
}

impl TrainerCallback for PauseAt {
    fn on_step_end(&mut self, state: &TrainerState) -> Flow {
        if state.global_step == self.step {
            self.run.pause();
        }
        Flow::Continue
    }
}

fn args(dir: &Path) -> TrainingArguments {
    TrainingArguments {
        output_dir: dir.to_path_buf(),
        max_steps: MAX_STEPS as i64,
        per_device_train_batch_size: 2,
        learning_rate: 1e-3,
        // The final log is the epoch's end event that training's last step triggers.
        logging_strategy: IntervalStrategy::Epoch,
        save_strategy: IntervalStrategy::Steps,
        save_steps: MAX_STEPS as f64,
        eval_strategy: IntervalStrategy::No,
        disable_tqdm: true,
        parallelism: afterburner::ParallelismConfig {
            strategy: StrategyConfig::DiLoCo(DiLoCoConfig {
                sync_every: 3,
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// What one replica run ended with: its final parameters and the steps it rejoined at
/// (`None` for the failed run).
type Ended = Option<(Vec<f32>, Vec<u64>)>;

/// One replica of the run in `dir`: the failing run joins the run and fails at once (it
/// leaves the quorum); every other trains with the Trainer, pausing at `pause_at`.
fn replica(
    lighthouse: &Arc<Lighthouse>,
    run: ReplicaRun,
    dir: &Path,
    model: &afterburner_demos::models::Vit<B>,
    pause_at: u64,
) -> Result<Ended, AccelerateError> {
    let run = Arc::new(run);
    let device = Default::default();
    let group = lighthouse.replica(run.id, &device)?;
    run.connected();
    let args = args(dir);
    let acc = Accelerator::<B>::with_group(args.accelerator_config(), device, Box::new(group))?;
    if run.fails {
        // Takes part in the run's setup, then dies (its group leaves the quorum).
        let mut acc = acc;
        acc.join(model.clone(), AdamWConfig::new().init())?;
        return Ok(None);
    }
    // 144 digits: 48 per replica, 24 batches of 2 per epoch.
    let train = digits::load()?.take(144);
    let eval = digits::load()?.take(8);
    let mut trainer =
        Trainer::on(acc, model.clone(), args, train, eval, BATCHER)?.with_callback(PauseAt {
            step: pause_at,
            run: run.clone(),
        });
    trainer.train()?;
    let params = flatten(&params(trainer.model()?));
    Ok(Some((params, trainer.state().rejoined_at_steps.clone())))
}

/// Runs 3 replicas with replica `failing` failing at the start and started again once the
/// others wait at step `pause_at`'s end; every run's outcome (survivors, failed, restarted).
fn run(name: &str, failing: usize, pause_at: u64) -> (PathBuf, Vec<Ended>, Ended) {
    let _rng = rng_lock();
    let dir = scratch_dir(name);
    let model = vit(7);
    let config = QuorumConfig::new(3).with_timeout(std::time::Duration::from_secs(20));
    let lighthouse = Lighthouse::new(config).unwrap();
    let (l, d) = (lighthouse.clone(), dir.clone());
    let runs = fail_and_restart(3, failing, move |run| {
        replica(&l, run, &d, &model, pause_at).unwrap_or_else(|e| panic!("a replica failed: {e}"))
    });
    assert!(runs.failed.is_none());
    (dir, runs.survivors, runs.restarted)
}

/// The replicas' parts of `checkpoint` that were saved.
fn saved_parts(checkpoint: &Path) -> Vec<String> {
    names(checkpoint)
        .into_iter()
        .filter(|n| n.starts_with("rank-"))
        .collect()
}

#[test]
fn a_replica_healed_at_the_last_step_ends_the_run_with_the_others() {
    let (dir, survivors, restarted) = run("replicas-end-healed-last", 1, MAX_STEPS - 2);
    let (params, rejoined) = restarted.expect("the restarted replica's outcome");
    // The live replicas sent their state from the run's last sync.
    assert_eq!(rejoined, vec![MAX_STEPS]);
    for survivor in &survivors {
        let (survivor, rejoined) = survivor.as_ref().unwrap();
        assert!(rejoined.is_empty());
        assert_eq!(
            survivor, &params,
            "the replicas ended on different parameters"
        );
    }
    // It took part in the final save too.
    let last = dir.join(format!("checkpoint-{MAX_STEPS}"));
    assert_eq!(saved_parts(&last).len(), 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_replica_started_again_after_the_last_step_ends_with_the_final_checkpoint() {
    // Replica 0 (the one that commits a save, and the main process) is the one lost: the two
    // others commit the final save among themselves.
    let (dir, survivors, restarted) = run("replicas-end-after-last", 0, MAX_STEPS);
    let (params, rejoined) = restarted.expect("the restarted replica's outcome");
    assert!(rejoined.is_empty(), "no live replica was left to heal it");
    for survivor in &survivors {
        let (survivor, _) = survivor.as_ref().unwrap();
        assert_eq!(
            survivor, &params,
            "it did not end with the run's final state"
        );
    }
    let last = dir.join(format!("checkpoint-{MAX_STEPS}"));
    assert_eq!(
        saved_parts(&last),
        vec!["rank-00001-of-00003", "rank-00002-of-00003"],
        "the final save committed among the replicas present"
    );
    let _ = std::fs::remove_dir_all(dir);
}
