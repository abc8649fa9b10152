//! Local SGD and DiLoCo through the Accelerator on 2 CPU workers: K = 1 Local SGD with SGD
//! trains like DDP; with K > 1 the replicas are bitwise equal right after every average and
//! differ between, with one all-reduce per average; DiLoCo with outer lr 1 and no momentum is
//! Local SGD; a DiLoCo run saved in the middle of a round resumes bitwise.

mod common;

use std::path::PathBuf;

use afterburner_accelerator::localsgd::{DiLoCoConfig, LocalSgdConfig};
use afterburner_accelerator::{AccelerateError, Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::digits;
use afterburner_demos::models::Vit;
use burn::optim::{AdamWConfig, Optimizer, SgdConfig};
use common::*;

/// Per rank: the full parameters after every optimizer step, and the syncs counted.
type Trace = Vec<(Vec<Vec<f32>>, u64)>;

fn config(strategy: &'static str) -> AcceleratorConfig {
    AcceleratorConfig::default().with_strategy(match strategy.parse().unwrap() {
        StrategyConfig::LocalSgd(_) => StrategyConfig::LocalSgd(LocalSgdConfig {
            local_sgd_steps: 3,
            ..Default::default()
        }),
        StrategyConfig::DiLoCo(_) => StrategyConfig::DiLoCo(diloco_every_3()),
        other => other,
    })
}

/// DiLoCo with an outer step every 3 inner steps.
fn diloco_every_3() -> DiLoCoConfig {
    DiLoCoConfig {
        sync_every: 3,
        ..Default::default()
    }
}

/// Number of syncs (parameter averages, outer steps, or gradient all-reduces) so far.
fn syncs(acc: &Accelerator<B>) -> u64 {
    acc.parameter_syncs() + acc.gradient_all_reduces()
}

/// Trains 2 workers with SGD for `steps` optimizer steps (48 digits, batches of 8).
fn trace(config: AcceleratorConfig, steps: u64) -> Trace {
    let initial = vit(8);
    Accelerator::<B>::launch(config, vec![Default::default(); 2], move |mut acc| {
        let (mut model, mut optim) = acc.setup(initial.clone(), SgdConfig::new().init())?;
        let loader = acc.dataloader(digits::load()?.take(48), BATCHER, 8)?;
        let mut after_each = Vec::new();
        for epoch in 0.. {
            for batch in loader.epoch(epoch) {
                let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
                acc.backward(cross_entropy(logits, &batch), &model)?;
                model = acc.step(model, &mut optim, &mut 0.1)?;
                after_each.push(flatten(&params(&model)));
                if acc.counters().optimizer_steps == steps {
                    return Ok((after_each, syncs(&acc)));
                }
            }
        }
        unreachable!()
    })
    .unwrap()
}

#[test]
fn local_sgd_with_k_1_trains_like_ddp() {
    let _rng = rng_lock();
    let ddp = trace(config("ddp"), 6);
    let local = trace(
        config("local-sgd").with_strategy(StrategyConfig::LocalSgd(LocalSgdConfig {
            local_sgd_steps: 1,
            ..Default::default()
        })),
        6,
    );
    for rank in 0..2 {
        let (got, want) = (local[rank].0.last().unwrap(), ddp[rank].0.last().unwrap());
        let diff = max_rel(got, want, 1e-3);
        assert!(diff < 1e-5, "rank {rank}: max rel diff {diff:e}");
    }
    assert_eq!(local[0].1, 6, "one average per step");
}

#[test]
fn local_sgd_replicas_meet_at_every_average_and_differ_between() {
    let _rng = rng_lock();
    let ranks = trace(config("local-sgd"), 7);
    let (a, b) = (&ranks[0].0, &ranks[1].0);
    for step in 1..=7 {
        let equal = a[step - 1] == b[step - 1];
        assert_eq!(
            equal,
            step % 3 == 0,
            "after step {step}: replicas equal = {equal}"
        );
    }
    assert_eq!(ranks[0].1, 2, "one all-reduce per average (steps 3 and 6)");
}

#[test]
fn finish_syncs_a_period_cut_short() {
    let _rng = rng_lock();
    for strategy in ["local-sgd", "diloco"] {
        let initial = vit(8);
        let ranks = Accelerator::<B>::launch(
            config(strategy),
            vec![Default::default(); 2],
            move |mut acc| {
                let (mut model, mut optim) = acc.setup(initial.clone(), SgdConfig::new().init())?;
                let loader = acc.dataloader(digits::load()?.take(64), BATCHER, 8)?;
                for batch in loader.epoch(0) {
                    let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
                    acc.backward(cross_entropy(logits, &batch), &model)?;
                    model = acc.step(model, &mut optim, &mut 0.1)?;
                }
                // 4 steps (32 digits per rank): synced at 3, step 4 is local.
                let before = flatten(&params(&model));
                let model = acc.finish(model)?;
                Ok((before, flatten(&params(&model)), syncs(&acc)))
            },
        )
        .unwrap();
        assert_ne!(ranks[0].0, ranks[1].0, "{strategy}: apart before finish");
        assert_eq!(ranks[0].1, ranks[1].1, "{strategy}: equal after finish");
        assert_eq!(
            ranks[0].2, 2,
            "{strategy}: the sync at step 3 and the final one"
        );
    }
}

#[test]
fn diloco_with_outer_lr_1_and_no_momentum_is_local_sgd() {
    let _rng = rng_lock();
    let local = trace(config("local-sgd"), 6);
    let diloco = trace(
        config("diloco").with_strategy(StrategyConfig::DiLoCo(DiLoCoConfig {
            sync_every: 3,
            outer_lr: 1.0,
            outer_momentum: 0.0,
            nesterov: false,
            ..Default::default()
        })),
        6,
    );
    for rank in 0..2 {
        let (got, want) = (
            diloco[rank].0.last().unwrap(),
            local[rank].0.last().unwrap(),
        );
        let diff = max_rel(got, want, 1e-3);
        assert!(diff < 1e-5, "rank {rank}: max rel diff {diff:e}");
    }
    assert_eq!(diloco[0].1, 2);
    // With the paper's outer optimizer (lr 0.7, Nesterov 0.9) the trajectory differs.
    let nesterov = trace(config("diloco"), 6);
    assert_ne!(nesterov[0].0.last(), local[0].0.last());
}

/// Trains (lr 1e-3, 48 digits, batches of 8) from the Accelerator's data position until
/// optimizer step `until`.
fn train_until<O: burn::optim::Optimizer<Vit<B>, B>>(
    acc: &mut Accelerator<B>,
    mut model: Vit<B>,
    optim: &mut O,
    until: u64,
) -> Result<Vit<B>, AccelerateError> {
    let loader = acc.dataloader(digits::load()?.take(48), BATCHER, 8)?;
    let (mut epoch, mut start) = acc.data_position();
    while acc.counters().optimizer_steps < until {
        for batch in loader.epoch_from(epoch, start) {
            let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
            acc.backward(cross_entropy(logits, &batch), &model)?;
            model = acc.step(model, optim, &mut 1e-3)?;
            if acc.counters().optimizer_steps == until {
                return Ok(model);
            }
        }
        (epoch, start) = (epoch + 1, 0);
    }
    Ok(model)
}

/// DiLoCo (`diloco`, AdamW inside) for 7 steps: straight, or saved after step 4 (after one
/// outer step with momentum) and resumed by new Accelerators.
fn diloco_seven_steps(diloco: DiLoCoConfig, dir: Option<PathBuf>) -> Vec<Vec<f32>> {
    let run = |load: Option<PathBuf>, save: Option<PathBuf>, until: u64, seed: u64| {
        let initial = vit(seed);
        Accelerator::<B>::launch(
            config("diloco").with_strategy(StrategyConfig::DiLoCo(diloco.clone())),
            vec![Default::default(); 2],
            move |mut acc| -> Result<Vec<f32>, AccelerateError> {
                let (mut model, mut optim) =
                    acc.setup(initial.clone(), AdamWConfig::new().init())?;
                if let Some(dir) = &load {
                    (model, optim, _) = acc.load_state(dir, model, optim, 1e-3)?;
                    assert_eq!(acc.strategy().diloco().unwrap().syncs(), 1);
                }
                model = train_until(&mut acc, model, &mut optim, until)?;
                if let Some(dir) = &save {
                    acc.save_state(dir, &model, &optim, &1e-3)?;
                }
                Ok(flatten(&params(&model)))
            },
        )
        .unwrap()
    };
    match dir {
        None => run(None, None, 7, 8),
        Some(dir) => {
            run(None, Some(dir.clone()), 4, 8);
            run(Some(dir), None, 7, 9)
        }
    }
}

/// Payload bytes rank 0 sent during 6 optimizer steps (after setup's broadcast), and the
/// parameter count.
fn bytes_in_six_steps(config: AcceleratorConfig) -> (u64, u64) {
    let initial = vit(8);
    let values = flatten(&params(&initial)).len() as u64;
    let sent = Accelerator::<B>::launch(config, vec![Default::default(); 2], move |mut acc| {
        let (mut model, mut optim) = acc.setup(initial.clone(), SgdConfig::new().init())?;
        let before = acc.traffic().bytes();
        let loader = acc.dataloader(digits::load()?.take(96), BATCHER, 8)?;
        for batch in loader.epoch(0).take(6) {
            let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
            acc.backward(cross_entropy(logits, &batch), &model)?;
            model = acc.step(model, &mut optim, &mut 0.1)?;
        }
        Ok(acc.traffic().bytes() - before)
    })
    .unwrap();
    (sent[0], values)
}

/// Every rank's AdamW state after each of 6 steps under Local SGD K = 3 (as JSON, so maps
/// compare whatever their order).
fn optimizer_states(average: bool) -> Vec<Vec<serde_json::Value>> {
    use burn::record::{FullPrecisionSettings, Record};
    let initial = vit(8);
    let config = config("local-sgd").with_strategy(StrategyConfig::LocalSgd(LocalSgdConfig {
        local_sgd_steps: 3,
        average_optimizer_state: average,
    }));
    Accelerator::<B>::launch(config, vec![Default::default(); 2], move |mut acc| {
        let (mut model, mut optim) = acc.setup(initial.clone(), AdamWConfig::new().init())?;
        let loader = acc.dataloader(digits::load()?.take(96), BATCHER, 8)?;
        let mut states = Vec::new();
        for batch in loader.epoch(0).take(6) {
            let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
            acc.backward(cross_entropy(logits, &batch), &model)?;
            model = acc.step(model, &mut optim, &mut 1e-3)?;
            let item = optim.to_record().into_item::<FullPrecisionSettings>();
            states.push(serde_json::to_value(item).unwrap());
        }
        Ok(states)
    })
    .unwrap()
}

#[test]
fn local_sgd_can_average_the_optimizer_state_too() {
    let _rng = rng_lock();
    let averaged = optimizer_states(true);
    let own = optimizer_states(false);
    for step in 0..6 {
        let after_average = step == 2 || step == 5;
        assert_eq!(
            averaged[0][step] == averaged[1][step],
            after_average,
            "averaged states: step {}",
            step + 1
        );
        assert_ne!(own[0][step], own[1][step], "own states: step {}", step + 1);
    }
}

/// Streaming DiLoCo with fragments made of whole transformer blocks (strided over the
/// fragments, as the paper strides layers): it trains, each exchange sends one fragment, and
/// a block type the model lacks is an error naming the setting.
#[test]
fn streaming_fragments_can_be_whole_blocks() {
    let _rng = rng_lock();
    let blocks = |units: &str| {
        config("diloco").with_strategy(StrategyConfig::DiLoCo(DiLoCoConfig {
            sync_every: 2,
            fragments: 2,
            fragment_units: units.parse().unwrap(),
            ..Default::default()
        }))
    };
    let (sent, values) = bytes_in_six_steps(blocks("TransformerEncoderLayer"));
    let votes = 6 * 4;
    // 6 exchanges (one per step), each one fragment: together 3 times the model.
    assert_eq!(sent - votes, 3 * 4 * values, "{sent}");
    let initial = vit(8);
    let err = Accelerator::<B>::launch(blocks("Block"), vec![Default::default(); 2], move |acc| {
        acc.setup(initial.clone(), SgdConfig::new().init::<B, Vit<B>>())
            .map(|_| ())
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("diloco.fragment_units") && err.contains("TransformerEncoderLayer"),
        "{err}"
    );
}

#[test]
fn traffic_counts_the_bytes_each_strategy_sends() {
    let _rng = rng_lock();
    // DDP: every step's gradients (f32), plus a few values a step (one per parameter tensor
    // for the clipping norm).
    let (ddp, values) = bytes_in_six_steps(config("ddp"));
    assert!(
        ddp >= 6 * 4 * values && ddp < 6 * 4 * (values + 64),
        "{ddp}"
    );
    // Local SGD K = 3 and DiLoCo H = 3: the parameters twice, and each step the ranks'
    // one-value vote on skipping a non-finite step.
    let votes = 6 * 4;
    let (local, _) = bytes_in_six_steps(config("local-sgd"));
    assert_eq!(local, 2 * 4 * values + votes);
    let (diloco, _) = bytes_in_six_steps(config("diloco"));
    assert_eq!(diloco, 2 * 4 * values + votes);
    // bf16 outer gradients: half.
    let half = config("diloco").with_strategy(StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: 3,
        outer_dtype: afterburner_accelerator::localsgd::OuterDtype::Bf16,
        ..Default::default()
    }));
    assert_eq!(bytes_in_six_steps(half).0, 2 * 2 * values + votes);
}

#[test]
fn diloco_saved_mid_round_resumes_bitwise() {
    // H = 3: saved at step 4, mid-round.
    resumes_bitwise(diloco_every_3(), "diloco");
}

#[test]
fn streaming_diloco_saved_with_an_exchange_in_flight_resumes_bitwise() {
    // 2 fragments every 2 steps, applied 1 step later: at step 4 fragment 1's outer gradient
    // is exchanged and not yet applied when the state is saved.
    let streaming = DiLoCoConfig {
        sync_every: 4,
        fragments: 2,
        delay: 1,
        mixing: Some(0.5),
        ..Default::default()
    };
    resumes_bitwise(streaming, "streaming");
}

fn resumes_bitwise(diloco: DiLoCoConfig, name: &str) {
    let _rng = rng_lock();
    let dir = std::env::temp_dir().join(format!("afterburner-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let straight = diloco_seven_steps(diloco.clone(), None);
    let resumed = diloco_seven_steps(diloco, Some(dir.clone()));
    for rank in 0..2 {
        let differing = straight[rank]
            .iter()
            .zip(&resumed[rank])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differing, 0, "rank {rank}: {differing} values differ");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn local_sgd_settings_parse_and_name_bad_values() {
    let c: AcceleratorConfig =
        serde_json::from_str(r#"{"strategy": {"diloco": {"sync_every": 50, "outer_lr": 0.5}}}"#)
            .unwrap();
    let StrategyConfig::DiLoCo(diloco) = &c.parallelism.strategy else {
        panic!("{:?}", c.parallelism.strategy)
    };
    assert_eq!((diloco.sync_every, diloco.outer_momentum), (50, 0.9));
    let c: AcceleratorConfig = toml::from_str("[strategy.local-sgd]\nlocal_sgd_steps = 4").unwrap();
    assert!(
        matches!(c.parallelism.strategy, StrategyConfig::LocalSgd(l) if l.local_sgd_steps == 4)
    );
    let bad = config("local-sgd").with_strategy(StrategyConfig::LocalSgd(LocalSgdConfig {
        local_sgd_steps: 0,
        ..Default::default()
    }));
    let err = bad.validate().unwrap_err().to_string();
    assert!(err.contains("local_sgd.local_sgd_steps"), "{err}");
}

/// Trains from a saved state under `config` until step 6 (2 workers, AdamW); returns rank 0's
/// parameters and syncs.
fn continue_to_six(config: AcceleratorConfig, dir: PathBuf) -> (Vec<f32>, u64) {
    let initial = vit(9); // other weights: the loaded state must replace them
    let ranks = Accelerator::<B>::launch(config, vec![Default::default(); 2], move |mut acc| {
        let (model, optim) = acc.setup(initial.clone(), AdamWConfig::new().init())?;
        let (mut model, mut optim, _) = acc.load_state(&dir, model, optim, 1e-3)?;
        model = train_until(&mut acc, model, &mut optim, 6)?;
        Ok((flatten(&params(&model)), acc.parameter_syncs()))
    })
    .unwrap();
    ranks[0].clone()
}

#[test]
fn diloco_continues_a_local_sgd_save_from_the_loaded_weights() {
    let _rng = rng_lock();
    let dir = std::env::temp_dir().join(format!("afterburner-lsgd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // 4 steps of Local SGD (K = 3), saved mid-period.
    let initial = vit(8);
    let target = dir.clone();
    Accelerator::<B>::launch(
        config("local-sgd"),
        vec![Default::default(); 2],
        move |mut acc| {
            let (mut model, mut optim) = acc.setup(initial.clone(), AdamWConfig::new().init())?;
            let loader = acc.dataloader(digits::load()?.take(48), BATCHER, 8)?;
            for batch in loader.epoch(0).chain(loader.epoch(1)).take(4) {
                let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
                acc.backward(cross_entropy(logits, &batch), &model)?;
                model = acc.step(model, &mut optim, &mut 1e-3)?;
            }
            acc.save_state(&target, &model, &optim, &1e-3)
        },
    )
    .unwrap();
    // Continued by Local SGD (its average count restored) and by DiLoCo with outer lr 1 and
    // no momentum: the same step 6 only if DiLoCo's global copy is the loaded model.
    let (local, local_syncs) = continue_to_six(config("local-sgd"), dir.clone());
    let plain_diloco = config("diloco").with_strategy(StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: 3,
        outer_lr: 1.0,
        outer_momentum: 0.0,
        nesterov: false,
        ..Default::default()
    }));
    let (diloco, _) = continue_to_six(plain_diloco, dir.clone());
    assert_eq!(
        local_syncs, 2,
        "Local SGD's average count is saved and restored"
    );
    let diff = max_rel(&diloco, &local, 1e-3);
    assert!(diff < 1e-5, "max rel diff {diff:e}");
    let _ = std::fs::remove_dir_all(&dir);
}
