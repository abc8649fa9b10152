//! Issue 11, finding 2: a sharded save (ZeRO-1, sharded FSDP) is a two-phase commit. When one
//! rank fails in the middle of a save, after the other has written its part, every rank gets
//! an error and the previous state still loads, bitwise; no staging directory is left behind.

mod common;

use std::path::{Path, PathBuf};

use afterburner_accelerator::{
    AccelerateError, Accelerator, AcceleratorConfig, FsdpConfig, StateDictType, StateParts,
    Stateful, StrategyConfig,
};
use afterburner_demos::digits;
use afterburner_demos::models::Vit;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig};
use common::*;

type Optim = OptimizerAdaptor<AdamW, Vit<B>, B>;

/// A user's part whose serialisation fails on the rank named by `fail_on`.
#[derive(Debug, Clone, Copy)]
struct Flaky {
    rank: usize,
    fail_on: Option<usize>,
}

impl Stateful for Flaky {
    fn to_state_bytes(&self) -> Result<Vec<u8>, String> {
        match self.fail_on == Some(self.rank) {
            true => Err(format!("disk quota exceeded on rank {}", self.rank)),
            false => Ok(vec![7]),
        }
    }

    fn with_state_bytes(&self, _bytes: &[u8]) -> Result<Self, String> {
        Ok(*self)
    }
}

fn config(strategy: &'static str) -> AcceleratorConfig {
    AcceleratorConfig {
        parallelism: afterburner_accelerator::ParallelismConfig {
            strategy: match strategy.parse().unwrap() {
                StrategyConfig::Fsdp(_) => StrategyConfig::Fsdp(FsdpConfig {
                    state_dict_type: StateDictType::Sharded,
                    ..Default::default()
                }),
                other => other,
            },
            devices: 2,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn parts<'a>(
    model: &'a mut Vit<B>,
    optim: &'a mut Optim,
    flaky: &'a mut Flaky,
) -> StateParts<'a, B> {
    StateParts::new()
        .model("model", model)
        .optimizer::<Vit<B>, _>("optimizer", optim)
        .stateful("flaky", flaky)
}

/// Trains `steps` optimizer steps of 8 digits per rank.
fn train(
    acc: &mut Accelerator<B>,
    mut model: Vit<B>,
    optim: &mut Optim,
    steps: usize,
) -> Result<Vit<B>, AccelerateError> {
    let loader = acc.dataloader(digits::load()?.take(96), BATCHER, 8)?;
    for batch in loader.epoch(0).take(steps) {
        let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
        acc.backward(cross_entropy(logits, &batch), &model)?;
        model = acc.step(model, optim, &mut 1e-3)?;
    }
    Ok(model)
}

/// Entries next to `dir` whose name starts with `.<dir name>.` (a save's staging or
/// moved-aside directories).
fn leftovers(dir: &Path) -> Vec<String> {
    let prefix = format!(".{}.", dir.file_name().unwrap().to_string_lossy());
    std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn one_rank_fails_mid_save(strategy: &'static str, name: &str) {
    let root =
        std::env::temp_dir().join(format!("afterburner-commit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir: PathBuf = root.join("state");
    let (first, other) = (vit(11), vit(12));

    let target = dir.clone();
    let saved = Accelerator::<B>::run(config(strategy), move |mut acc| {
        let (model, mut optim) = acc.setup(first.clone(), AdamWConfig::new().init())?;
        let mut model = train(&mut acc, model, &mut optim, 3)?;
        let mut flaky = Flaky {
            rank: acc.rank(),
            fail_on: None,
        };
        acc.save_parts(&target, &parts(&mut model, &mut optim, &mut flaky))?;
        let good = flatten(&params(&acc.full_model(&model)?));
        // Two more steps, then a save that fails on rank 1 after rank 0 wrote its part.
        let mut model = train(&mut acc, model, &mut optim, 2)?;
        flaky.fail_on = Some(1);
        let failed = acc.save_parts(&target, &parts(&mut model, &mut optim, &mut flaky));
        Ok((good, failed.map_err(|e| e.to_string())))
    })
    .unwrap();
    for (rank, (_, failed)) in saved.iter().enumerate() {
        let err = failed.as_ref().unwrap_err();
        let named = match rank {
            1 => err.contains("flaky") && err.contains("disk quota"),
            _ => err.contains("1 other rank"),
        };
        assert!(named, "rank {rank}: {err}");
    }
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));

    let source = dir.clone();
    let loaded = Accelerator::<B>::run(config(strategy), move |mut acc| {
        let (mut model, mut optim) = acc.setup(other.clone(), AdamWConfig::new().init())?;
        let mut flaky = Flaky {
            rank: acc.rank(),
            fail_on: None,
        };
        acc.load_parts(&source, &mut parts(&mut model, &mut optim, &mut flaky))?;
        Ok((
            flatten(&params(&acc.full_model(&model)?)),
            acc.counters().optimizer_steps,
        ))
    })
    .unwrap();
    for (rank, (params, steps)) in loaded.iter().enumerate() {
        assert_eq!(
            *steps, 3,
            "rank {rank}: the state of the last complete save"
        );
        assert!(
            params == &saved[rank].0,
            "rank {rank}: parameters not bitwise equal"
        );
    }
    std::fs::remove_dir_all(root).ok();
}

#[test]
fn zero_1_one_rank_failing_mid_save_keeps_the_previous_state() {
    let _rng = rng_lock();
    one_rank_fails_mid_save("zero-1", "zero1");
}

#[test]
fn sharded_fsdp_one_rank_failing_mid_save_keeps_the_previous_state() {
    let _rng = rng_lock();
    one_rank_fails_mid_save("fsdp", "fsdp");
}
