//! Fault-tolerant DiLoCo through the Accelerator: 3 replica threads on a `Lighthouse`, each an
//! `Accelerator::with_group` over its `QuorumGroup`. Replica 1 fails at step 4; the other 2
//! go on; replica 1 restarts and `join` heals it (parameters bitwise equal to the donor's,
//! step counter continued); all 3 end on the same parameters. DDP over a quorum group is
//! refused with an error that says why.

mod common;

use std::sync::Arc;

use afterburner_accelerator::localsgd::DiLoCoConfig;
use afterburner_accelerator::parallel::{
    Lighthouse, LocalReplicas, QuorumConfig, ReplicaRun, fail_and_restart,
};
use afterburner_accelerator::precision::{GradScalerConfig, GradScalerState};
use afterburner_accelerator::{AccelerateError, Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::digits;
use burn::optim::AdamWConfig;
use common::*;

const STEPS: u64 = 12;

fn config(strategy: &'static str) -> AcceleratorConfig {
    AcceleratorConfig::default().with_strategy(match strategy.parse().unwrap() {
        StrategyConfig::DiLoCo(_) => StrategyConfig::DiLoCo(DiLoCoConfig {
            sync_every: 3,
            ..Default::default()
        }),
        other => other,
    })
}

/// A replica's record: the step it continued after and its parameters then, its parameters
/// after each sync step, its final parameters.
struct Record {
    joined: (u64, Vec<f32>),
    /// The counters right after `join`.
    joined_counters: afterburner_accelerator::Counters,
    synced: Vec<(u64, Vec<f32>)>,
    last: Vec<f32>,
    /// The fp16 loss scale right after `join`, and after each sync step.
    joined_scale: Option<GradScalerState>,
    synced_scales: Vec<(u64, Option<GradScalerState>)>,
}

/// `run`'s replica trains until `STEPS`: a failing run fails at step 4, the replicas that stay
/// up pause at step 7 until the failed one has restarted.
fn replica(
    lighthouse: &Arc<Lighthouse>,
    run: &ReplicaRun,
    config: AcceleratorConfig,
) -> Result<Record, AccelerateError> {
    let id = run.id;
    let device = Default::default();
    let group = lighthouse.replica(id, &device)?;
    run.connected();
    let mut acc = Accelerator::<B>::with_group(config, device, Box::new(group))?;
    let (mut model, mut optim) = acc.join(vit(8), AdamWConfig::new().init())?;
    let start = acc.counters().optimizer_steps;
    let mut record = Record {
        joined: (start, flatten(&params(&model))),
        joined_counters: acc.counters(),
        synced: Vec::new(),
        last: Vec::new(),
        joined_scale: acc.precision_plugin().scaler_state(),
        synced_scales: Vec::new(),
    };
    let loader = acc.dataloader(digits::load()?.take(144), BATCHER, 8)?;
    let batches: Vec<_> = loader.epoch(0).collect();
    for step in start + 1..=STEPS {
        if run.fails && step == 4 {
            return Err(AccelerateError::BadData(
                "the test kills this replica".into(),
            ));
        }
        if step == 7 {
            run.pause();
        }
        let batch = &batches[(step - 1) as usize % batches.len()];
        let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
        acc.backward(cross_entropy(logits, batch), &model)?;
        model = acc.step(model, &mut optim, &mut 1e-3)?;
        if step % 3 == 0 {
            record.synced.push((step, flatten(&params(&model))));
            let scale = acc.precision_plugin().scaler_state();
            record.synced_scales.push((step, scale));
        }
    }
    let model = acc.finish(model)?;
    record.last = flatten(&params(&model));
    Ok(record)
}

#[test]
fn a_failed_replica_rejoins_through_the_accelerator() {
    let _rng = rng_lock();
    let lighthouse = Lighthouse::new(QuorumConfig::new(3)).unwrap();
    let runs = fail_and_restart(3, 1, move |run| {
        replica(&lighthouse, &run, config("diloco"))
    });
    assert!(runs.failed.is_err());
    let survivors: Vec<Record> = runs.survivors.into_iter().map(Result::unwrap).collect();
    let rejoined = runs.restarted.unwrap();
    // Healed right after the round-3 sync (step 9), from replica 0.
    let (start, params) = &rejoined.joined;
    assert_eq!(*start, 9);
    // Its counters are the donor's (a state it saves later holds a run's counters: 9 steps
    // from 9 micro-batches, not from none).
    let counters = rejoined.joined_counters;
    assert_eq!(
        (
            counters.optimizer_steps,
            counters.skipped_steps,
            counters.micro_batches
        ),
        (9, 0, 9)
    );
    let donor = survivors[0].synced.iter().find(|(s, _)| *s == 9).unwrap();
    assert_eq!(params, &donor.1);
    // The survivors agree after every sync, and all three end on the same parameters.
    assert_eq!(survivors[0].synced, survivors[1].synced);
    assert_eq!(survivors[0].last, survivors[1].last);
    assert_eq!(survivors[0].last, rejoined.last);
}

/// Under fp16 the healed replica takes the donor's loss scale (here grown at every finite
/// step, so a fresh scaler's would differ), not a fresh one.
#[test]
fn a_rejoined_replica_takes_the_live_loss_scale() {
    let _rng = rng_lock();
    let lighthouse = Lighthouse::new(QuorumConfig::new(3)).unwrap();
    let fp16 = AcceleratorConfig {
        precision: "16-mixed".parse().unwrap(),
        grad_scaler: GradScalerConfig {
            init_scale: 8.0,
            growth_interval: 1,
            ..Default::default()
        },
        ..config("diloco")
    };
    let runs = fail_and_restart(3, 1, move |run| replica(&lighthouse, &run, fp16.clone()));
    let survivor = runs.survivors.into_iter().next().unwrap().unwrap();
    let rejoined = runs.restarted.unwrap();
    assert_eq!(rejoined.joined.0, 9);
    let (_, live) = survivor
        .synced_scales
        .iter()
        .find(|(s, _)| *s == 9)
        .unwrap();
    let live = live.expect("a loss scaler under 16-mixed");
    assert_ne!(
        live.scale, 8.0,
        "the live scale never moved: the test shows nothing"
    );
    assert_eq!(rejoined.joined_scale, Some(live));
}

#[test]
fn ddp_over_a_quorum_group_is_refused() {
    let _rng = rng_lock();
    let lighthouse = Lighthouse::new(QuorumConfig::new(1)).unwrap();
    let group = lighthouse.replica(0, &Default::default()).unwrap();
    let mut acc =
        Accelerator::<B>::with_group(config("ddp"), Default::default(), Box::new(group)).unwrap();
    let error = acc
        .join(vit(8), AdamWConfig::new().init())
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("not independent"), "{error}");
}
