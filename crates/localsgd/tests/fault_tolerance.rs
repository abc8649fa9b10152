//! Fault-tolerant DiLoCo over in-process replica threads (a `Lighthouse`): one of 3 replicas
//! dies in round 2, the other 2 go on with outer steps over the 2 present (checked against an
//! outer optimizer fed by hand), the dead one restarts in round 4 and is healed with state
//! bitwise equal to the live replicas', then all 3 end on the same parameters. Also: a replica
//! that comes back after being dropped is refused, never averaged in; Local SGD heals too; DDP
//! refuses a quorum group.

use std::sync::Arc;
use std::time::Duration;

use afterburner_localsgd::{DiLoCo, LocalSgd, LocalSgdConfig, OuterSgd};
use afterburner_parallel::{
    Ddp, Lighthouse, LocalReplicas, ParallelError, ParallelStrategy, ProcessGroup, QuorumConfig,
    ReduceOp, ReplicaRun, StateSaving, StrategyState, fail_and_restart,
};
use burn::backend::Flex;
use burn::optim::AdamWConfig;
use burn::tensor::Tensor;

mod replicas;

use replicas::{B, H, Model, ROUNDS, config, global, inner_step, model, values};

/// What one replica saw at each round: (round, members, local params before the sync,
/// global before, global after).
type Round = (u64, Vec<usize>, Vec<f32>, Vec<f32>, Vec<f32>);

struct Replica {
    rounds: Vec<Round>,
    /// The step it started after, and its state right after `join`.
    joined: (u64, Vec<f32>, StrategyState),
    /// Its state right after each sync step: step -> (params, DiLoCo state).
    after: Vec<(u64, Vec<f32>, StrategyState)>,
    last: Vec<f32>,
}

/// Runs `run`'s replica until step `H * ROUNDS`: a failing run dies at step 5 (round 2), the
/// replicas that stay up pause at step 10 (round 4) until the failed one has restarted.
fn run(lighthouse: &Arc<Lighthouse>, run: &ReplicaRun) -> Result<Replica, ParallelError> {
    let id = run.id;
    let device = Default::default();
    let group = lighthouse.replica::<Flex>(id, &device)?;
    run.connected();
    let mut diloco = DiLoCo::<B, _>::new(group, config())?;
    let mut optim = AdamWConfig::new().init::<B, Model>();
    let (mut model, start) = diloco.join(model(id), &mut optim)?;
    let mut replica = Replica {
        rounds: Vec::new(),
        joined: (start, values(&model), diloco.own_state()?),
        after: Vec::new(),
        last: Vec::new(),
    };
    for step in start + 1..=H * ROUNDS {
        if run.fails && step == 5 {
            return Err(ParallelError::PeerFailed {
                rank: id,
                reason: "killed by the test".into(),
            });
        }
        if step == 10 {
            run.pause();
        }
        model = inner_step(model, &mut optim, id, step);
        let before = (values(&model), global(&diloco.own_state()?));
        model = diloco.after_optimizer_step(model, &mut optim, step)?;
        if step % H == 0 {
            let quorum = diloco.group().unwrap().quorum().unwrap();
            let after = diloco.own_state()?;
            replica.rounds.push((
                step / H,
                quorum.members(),
                before.0,
                before.1,
                global(&after),
            ));
            replica.after.push((step, values(&model), after));
        }
    }
    let model = diloco.finish(model, H * ROUNDS)?;
    replica.last = values(&model);
    Ok(replica)
}

#[test]
fn a_dead_replica_is_dropped_and_healed_when_it_restarts() {
    let quorum = QuorumConfig::new(3).with_join_timeout(Duration::from_secs(60));
    let lighthouse = Lighthouse::new(quorum).unwrap();
    // Replica 1 dies at step 5 (round 2) and restarts, with a fresh model and optimizer,
    // once replicas 0 and 2 wait at step 10 (round 4).
    let runs = {
        let lighthouse = lighthouse.clone();
        fail_and_restart(3, 1, move |replica| run(&lighthouse, &replica))
    };
    assert!(
        matches!(runs.failed, Err(ParallelError::PeerFailed { .. })),
        "{:?}",
        runs.failed.err()
    );
    let survivors: Vec<Replica> = runs.survivors.into_iter().map(Result::unwrap).collect();
    let rejoined = runs.restarted.unwrap();

    // Membership per round, as each survivor saw it.
    for survivor in &survivors {
        let members: Vec<Vec<usize>> = survivor.rounds.iter().map(|r| r.1.clone()).collect();
        assert_eq!(
            members,
            vec![
                vec![0, 1, 2],
                vec![0, 2],
                vec![0, 2],
                vec![0, 2],
                vec![0, 1, 2]
            ]
        );
    }
    // The outer steps equal an outer optimizer fed by hand with the mean pseudo-gradient of
    // the replicas present: 3 in round 1, the 2 survivors in rounds 2-4, 3 again in round 5.
    let config = config();
    let mut outer = OuterSgd::<Flex>::new(config.outer_lr, config.outer_momentum, config.nesterov);
    let device = Default::default();
    // The local parameters each replica present synced in `round`, in replica order.
    let round_locals = |round: u64| -> Vec<Vec<f32>> {
        let mut locals: Vec<Vec<f32>> = survivors
            .iter()
            .map(|s| s.rounds[round as usize - 1].2.clone())
            .collect();
        if let Some(r) = rejoined.rounds.iter().find(|r| r.0 == round) {
            locals.insert(1, r.2.clone());
        }
        locals
    };
    for round in 2..=ROUNDS {
        let (_, _, _, global_before, global_after) =
            survivors[0].rounds[round as usize - 1].clone();
        if round == 2 {
            // The reference starts from the outer momentum the run had after round 1.
            let after1 = &survivors[0].after[0].2;
            outer.buffer = after1
                .tensor("outer_momentum")
                .map(|b| Tensor::from_floats(b, &device));
        }
        let locals = round_locals(round);
        assert_eq!(
            locals.len(),
            if round == 5 { 3 } else { 2 },
            "round {round}"
        );
        let n = global_before.len();
        let mean: Vec<f32> = (0..n)
            .map(|i| {
                let sum: f32 = locals.iter().map(|l| global_before[i] - l[i]).sum();
                sum / locals.len() as f32
            })
            .collect();
        let want = outer.step(
            Tensor::from_floats(global_before.as_slice(), &device),
            Tensor::from_floats(mean.as_slice(), &device),
        );
        let want = want.into_data().to_vec::<f32>().unwrap();
        for (i, (got, want)) in global_after.iter().zip(&want).enumerate() {
            assert!(
                (got - want).abs() < 1e-6,
                "round {round} value {i}: {got} vs {want}"
            );
        }
        // Both survivors hold the same global copy.
        assert_eq!(
            survivors[1].rounds[round as usize - 1].4,
            global_after,
            "round {round}"
        );
    }
    // Healed in round 4: the rejoined replica continues after step 12 with exactly the state
    // the donor (replica 0, the lowest live one) had right after that sync.
    let (start, params, state) = &rejoined.joined;
    assert_eq!(*start, 12);
    let donor = survivors[0].after.iter().find(|a| a.0 == 12).unwrap();
    assert_eq!(params, &donor.1, "parameters");
    assert_eq!(
        state, &donor.2,
        "DiLoCo state (global copy, outer momentum, syncs)"
    );
    // All three finish on the same parameters.
    assert_eq!(survivors[0].last, survivors[1].last);
    assert_eq!(survivors[0].last, rejoined.last);
}

#[test]
fn a_replica_dropped_for_a_timeout_is_refused_not_averaged_in() {
    let lighthouse =
        Lighthouse::new(QuorumConfig::new(2).with_timeout(Duration::from_millis(300))).unwrap();
    let device = Default::default();
    let (group, slow_group) = (
        lighthouse.replica::<Flex>(0, &device).unwrap(),
        lighthouse.replica::<Flex>(1, &device).unwrap(),
    );
    let slow = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500)); // hangs past the timeout
        slow_group.all_reduce(Tensor::from_floats([100.0], &device), ReduceOp::Mean)
    });
    let mean = group
        .all_reduce(Tensor::from_floats([2.0], &device), ReduceOp::Mean)
        .unwrap();
    assert_eq!(mean.into_data().to_vec::<f32>().unwrap(), vec![2.0]);
    assert_eq!(group.quorum().unwrap().members(), vec![0]);
    let refused = slow.join().unwrap().unwrap_err().to_string();
    assert!(
        refused.contains("dropped from the quorum") && refused.contains("stale"),
        "{refused}"
    );
    // The next collective is over replica 0 alone.
    let mean = group
        .all_reduce(Tensor::from_floats([4.0], &device), ReduceOp::Mean)
        .unwrap();
    assert_eq!(mean.into_data().to_vec::<f32>().unwrap(), vec![4.0]);
}

#[test]
fn local_sgd_heals_a_restarted_replica() {
    let quorum = QuorumConfig::new(2).with_join_timeout(Duration::from_secs(20));
    let lighthouse = Lighthouse::new(quorum).unwrap();
    let config = LocalSgdConfig {
        local_sgd_steps: 2,
        ..Default::default()
    };
    // Replica 1 dies at step 3; replica 0 waits at step 5 until it has restarted.
    let runs = fail_and_restart(2, 1, move |run| -> Result<_, ParallelError> {
        let (id, steps) = (run.id, 8);
        let group = lighthouse.replica::<Flex>(id, &Default::default())?;
        run.connected();
        let mut local = LocalSgd::<B, _>::new(group, config.clone())?;
        let mut optim = AdamWConfig::new().init::<B, Model>();
        let (mut model, start) = local.join(model(id), &mut optim)?;
        let joined = values(&model);
        for step in start + 1..=steps {
            if run.fails && step == 3 {
                return Err(ParallelError::Record("killed".into()));
            }
            if step == 5 {
                run.pause();
            }
            model = inner_step(model, &mut optim, id, step);
            model = local.after_optimizer_step(model, &mut optim, step)?;
        }
        Ok((start, joined, values(&local.finish(model, steps)?)))
    });
    assert!(runs.failed.is_err());
    let (_, _, last0) = runs.survivors.into_iter().next().unwrap().unwrap();
    let (start, joined, last1) = runs.restarted.unwrap();
    assert_eq!(
        start, 6,
        "healed right after the first average once it connected"
    );
    assert_eq!(joined.len(), 10);
    assert_eq!(last0, last1, "both end on the average");
}

#[test]
fn ddp_refuses_a_quorum_group() {
    let lighthouse = Lighthouse::new(QuorumConfig::new(1)).unwrap();
    let group = lighthouse.replica::<Flex>(0, &Default::default()).unwrap();
    let ddp = Ddp::<B, _>::new(group);
    let error = ParallelStrategy::<B>::setup(&ddp, model(0))
        .unwrap_err()
        .to_string();
    assert!(error.contains("not independent"), "{error}");
}

#[test]
fn bad_quorum_settings_are_named() {
    let error = Lighthouse::new(QuorumConfig::new(2).with_min_replicas(3))
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("quorum.min_replicas"), "{error}");
    let lighthouse = Lighthouse::new(QuorumConfig::new(2)).unwrap();
    let error = lighthouse
        .replica::<Flex>(5, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("replica id"), "{error}");
}

/// Streaming DiLoCo (2 fragments, each exchange applied 1 step later): replica 1 dies, the
/// other 2 go on, replica 1 restarts and is healed with the donor's state, the exchange still
/// in flight included; all 3 end on the same parameters.
#[test]
fn streaming_diloco_heals_with_the_exchange_in_flight() {
    let streaming = afterburner_localsgd::DiLoCoConfig {
        sync_every: 4,
        fragments: 2,
        delay: 1,
        ..config()
    };
    const STEPS: u64 = 20;
    let lighthouse = Lighthouse::new(QuorumConfig::new(3)).unwrap();
    type Outcome = Result<
        (
            (u64, Vec<f32>, StrategyState),
            Vec<(u64, Vec<f32>, StrategyState)>,
            Vec<f32>,
        ),
        ParallelError,
    >;
    // Replica 1 dies at step 5 and restarts once the others wait at step 10.
    let runs = fail_and_restart(3, 1, move |run| -> Outcome {
        let id = run.id;
        let group = lighthouse.replica::<Flex>(id, &Default::default())?;
        run.connected();
        let mut diloco = DiLoCo::<B, _>::new(group, streaming.clone())?;
        let mut optim = AdamWConfig::new().init::<B, Model>();
        let (mut model, start) = diloco.join(model(id), &mut optim)?;
        let joined = (start, values(&model), diloco.own_state()?);
        let mut after = Vec::new();
        for step in start + 1..=STEPS {
            if run.fails && step == 5 {
                return Err(ParallelError::Record("killed by the test".into()));
            }
            if step == 10 {
                run.pause();
            }
            model = inner_step(model, &mut optim, id, step);
            model = diloco.after_optimizer_step(model, &mut optim, step)?;
            if step % 2 == 0 {
                after.push((step, values(&model), diloco.own_state()?));
            }
        }
        let last = values(&diloco.finish(model, STEPS)?);
        Ok((joined, after, last))
    });
    assert!(runs.failed.is_err());
    let survivors: Vec<_> = runs.survivors.into_iter().map(Result::unwrap).collect();
    let (joined, _, last) = runs.restarted.unwrap();
    let (step, params, state) = joined;
    // The exchange of step 10 runs in the background: the donor may see the request at
    // step 10 or only at step 12.
    assert!(
        step == 10 || step == 12,
        "healed after an exchange step, got {step}"
    );
    let donor = survivors[0].1.iter().find(|a| a.0 == step).unwrap();
    assert_eq!(params, donor.1, "parameters");
    assert_eq!(
        state, donor.2,
        "DiLoCo state, the pending exchange included"
    );
    assert!(
        state.tensor("pending_gradient").is_some(),
        "an exchange was in flight when the state was sent"
    );
    assert_eq!(survivors[0].2, survivors[1].2);
    assert_eq!(survivors[0].2, last);
}
