//! Named state parts: a user's `Stateful` part (a counter and a Vec<f32>) and a second
//! optimizer are saved and restored with the model, bitwise, on one device and on 2 ranks
//! (ZeRO-1 and FSDP one part per rank, FSDP gathered); a missing or an unknown part is an error
//! naming it, and nothing changes.

mod common;

use std::path::PathBuf;

use afterburner_accelerator::{
    AccelerateError, Accelerator, AcceleratorConfig, FsdpConfig, StateDictType, StateParts,
    Stateful, StrategyConfig,
};
use afterburner_demos::digits;
use afterburner_demos::models::Vit;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig};
use burn::tensor::ElementConversion;
use common::*;
use serde::{Deserialize, Serialize};

type Optim = OptimizerAdaptor<AdamW, Vit<B>, B>;

/// A user's own training state, saved as a serde part.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Tally {
    steps: u64,
    losses: Vec<f32>,
}

/// One run's model, its two optimizers (even steps use `fast`, odd steps `slow`), the LR and
/// the tally.
struct Run {
    model: Vit<B>,
    fast: Optim,
    slow: Optim,
    lr: f64,
    tally: Tally,
    best: Best,
}

/// The lowest loss so far, saved through a hand-written `Stateful` (its bits as 4 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Best(f32);

impl Stateful for Best {
    fn to_state_bytes(&self) -> Result<Vec<u8>, String> {
        Ok(self.0.to_le_bytes().to_vec())
    }

    fn with_state_bytes(&self, bytes: &[u8]) -> Result<Self, String> {
        let bytes: [u8; 4] = bytes
            .try_into()
            .map_err(|_| "expected 4 bytes".to_string())?;
        Ok(Best(f32::from_le_bytes(bytes)))
    }
}

impl Run {
    /// From `initial` (built before any worker starts: Flex has one RNG per process).
    fn new(acc: &Accelerator<B>, initial: Vit<B>) -> Result<Self, AccelerateError> {
        let (model, fast) = acc.setup(initial, AdamWConfig::new().init())?;
        let slow = AdamWConfig::new().with_beta_1(0.5).init();
        Ok(Self {
            model,
            fast,
            slow,
            lr: 2e-3,
            tally: Tally::default(),
            best: Best(f32::INFINITY),
        })
    }

    fn parts(&mut self) -> StateParts<'_, B> {
        StateParts::new()
            .model("model", &mut self.model)
            .optimizer::<Vit<B>, _>("optimizer", &mut self.fast)
            .optimizer::<Vit<B>, _>("slow_optimizer", &mut self.slow)
            .scheduler("scheduler", &mut self.lr)
            .serde("tally", &mut self.tally)
            .stateful("best", &mut self.best)
    }

    /// Trains until `until` optimizer steps (48 digits, batches of 8: 6 steps an epoch),
    /// continuing from the Accelerator's data position.
    fn train_until(&mut self, acc: &mut Accelerator<B>, until: u64) -> Result<(), AccelerateError> {
        let items = digits::load()?.take(48);
        let loader = acc.dataloader(items, BATCHER, 8)?;
        let (mut epoch, mut start) = acc.data_position();
        while acc.counters().optimizer_steps < until {
            for batch in loader.epoch_from(epoch, start) {
                let logits = acc.forward(&self.model, batch.images.clone(), |m, x| m.forward(x))?;
                let loss = cross_entropy(logits, &batch);
                let value: f32 = loss.clone().into_scalar().elem();
                self.tally.losses.push(value);
                self.best.0 = self.best.0.min(value);
                acc.backward(loss, &self.model)?;
                let optim = match acc.counters().optimizer_steps % 2 {
                    0 => &mut self.fast,
                    _ => &mut self.slow,
                };
                self.model = acc.step(self.model.clone(), optim, &mut self.lr)?;
                self.tally.steps += 1;
                if acc.counters().optimizer_steps == until {
                    return Ok(());
                }
            }
            (epoch, start) = (epoch + 1, 0);
        }
        Ok(())
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afterburner-parts-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The full parameters and the tally after 8 steps: straight, or 4 steps + `save_parts`, then
/// a fresh Accelerator and run from other weights + `load_parts` + 4 steps.
fn eight_steps(
    config: &AcceleratorConfig,
    world: usize,
    dir: Option<PathBuf>,
) -> Vec<(Vec<f32>, Tally)> {
    let phase = |seed: u64, load: Option<PathBuf>, save: Option<PathBuf>, until: u64| {
        let initial = vit(seed);
        let body = move |mut acc: Accelerator<B>| -> Result<(Vec<f32>, Tally), AccelerateError> {
            let mut run = Run::new(&acc, initial.clone())?;
            if let Some(dir) = &load {
                acc.load_parts(dir, &mut run.parts())?;
                assert_eq!(acc.counters().optimizer_steps, 4);
                assert_eq!(run.tally.steps, 4, "the user's part is restored");
                assert!(run.best.0.is_finite(), "the hand-written part is restored");
            }
            run.train_until(&mut acc, until)?;
            if let Some(dir) = &save {
                acc.save_parts(dir, &run.parts())?;
            }
            Ok((flatten(&params(&acc.full_model(&run.model)?)), run.tally))
        };
        match world {
            1 => vec![body(Accelerator::new(config.clone(), Default::default()).unwrap()).unwrap()],
            _ => Accelerator::<B>::launch(config.clone(), vec![Default::default(); world], body)
                .unwrap(),
        }
    };
    match dir {
        None => phase(8, None, None, 8),
        Some(dir) => {
            phase(8, None, Some(dir.clone()), 4);
            phase(9, Some(dir), None, 8)
        }
    }
}

/// With `from_rank0`, the state held rank 0's `Stateful` parts only (a replicated or gathered
/// layout): every rank resumed with rank 0's tally.
fn assert_bitwise(
    resumed: &[(Vec<f32>, Tally)],
    straight: &[(Vec<f32>, Tally)],
    what: &str,
    from_rank0: bool,
) {
    assert_eq!(resumed.len(), straight.len());
    for (rank, ((got, got_tally), (want, want_tally))) in resumed.iter().zip(straight).enumerate() {
        let differing = got
            .iter()
            .zip(want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differing, 0,
            "{what}, rank {rank}: {differing} values differ"
        );
        assert_eq!(got_tally.steps, 8, "{what}, rank {rank}");
        let saved = if from_rank0 {
            &straight[0].1
        } else {
            want_tally
        };
        assert_eq!(
            got_tally.losses[..4],
            saved.losses[..4],
            "{what}, rank {rank}: saved"
        );
        assert_eq!(
            got_tally.losses[4..],
            want_tally.losses[4..],
            "{what}, rank {rank}"
        );
    }
}

fn distributed(strategy: &'static str, state_dict_type: StateDictType) -> AcceleratorConfig {
    AcceleratorConfig::default().with_strategy(match strategy.parse().unwrap() {
        StrategyConfig::Fsdp(_) => StrategyConfig::Fsdp(FsdpConfig {
            auto_wrap_policy: "TransformerEncoderLayer".parse().unwrap(),
            state_dict_type,
            ..Default::default()
        }),
        other => other,
    })
}

#[test]
fn a_stateful_part_and_a_second_optimizer_resume_bitwise_on_one_device() {
    let _rng = rng_lock();
    let config = AcceleratorConfig::default();
    let dir = temp_dir("single");
    let straight = eight_steps(&config, 1, None);
    let resumed = eight_steps(&config, 1, Some(dir.clone()));
    assert_bitwise(&resumed, &straight, "single device", false);
    for part in [
        "model",
        "optimizer",
        "slow_optimizer",
        "scheduler",
        "tally",
        "best",
    ] {
        assert!(dir.join(format!("{part}.mpk")).is_file(), "{part} saved");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn parts_resume_bitwise_sharded_and_gathered_on_two_ranks() {
    let _rng = rng_lock();
    for (name, config) in [
        ("zero-1", distributed("zero-1", StateDictType::Sharded)),
        ("fsdp", distributed("fsdp", StateDictType::Sharded)),
        ("fsdp-full", distributed("fsdp", StateDictType::Full)),
    ] {
        let dir = temp_dir(name);
        let straight = eight_steps(&config, 2, None);
        let resumed = eight_steps(&config, 2, Some(dir.clone()));
        assert_bitwise(&resumed, &straight, name, name == "fsdp-full");
        let full = dir.join("slow_optimizer.mpk").is_file();
        assert_eq!(
            full,
            name == "fsdp-full",
            "{name}: one gathered state or one per rank"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_missing_or_unknown_part_is_a_named_error_and_changes_nothing() {
    let _rng = rng_lock();
    let dir = temp_dir("names");
    let mut acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let mut run = Run::new(&acc, vit(8)).unwrap();
    run.train_until(&mut acc, 2).unwrap();
    acc.save_parts(&dir, &run.parts()).unwrap();

    let mut fresh_acc =
        Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let mut fresh = Run::new(&fresh_acc, vit(9)).unwrap();
    let before = flatten(&params(&fresh.model));
    // The state holds `slow_optimizer`, `tally` and `best`, which the classic three do not name.
    let Err(err) = fresh_acc.load_state(&dir, fresh.model.clone(), fresh.fast.clone(), fresh.lr)
    else {
        panic!("a state with parts the call does not name must not load");
    };
    assert!(
        matches!(&err, AccelerateError::UnknownPart { part, .. } if ["slow_optimizer", "tally", "best"].contains(&part.as_str())),
        "{err}"
    );
    // A part the state lacks.
    let mut extra = Tally::default();
    let err = fresh_acc
        .load_parts(&dir, &mut fresh.parts().serde("extra", &mut extra))
        .unwrap_err();
    assert!(
        matches!(&err, AccelerateError::MissingPart { part, .. } if part == "extra"),
        "{err}"
    );
    assert!(err.to_string().contains("extra"), "{err}");
    assert_eq!(fresh_acc.counters().optimizer_steps, 0, "nothing applied");
    assert_eq!(fresh.tally, Tally::default(), "nothing applied");
    assert_eq!(flatten(&params(&fresh.model)), before, "nothing applied");
    // Bad names are refused before anything is written.
    let mut other = Tally::default();
    for bad in ["", "a/b", "accelerator", "tally", "Tally"] {
        let err = acc
            .save_parts(&dir, &run.parts().serde(bad, &mut other))
            .unwrap_err();
        assert!(
            matches!(err, AccelerateError::InvalidPart { .. }),
            "{bad}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A part that cannot be encoded on rank 1 (say, a logger that exists on rank 0 only).
struct OnlyOnRank0(usize);

impl Stateful for OnlyOnRank0 {
    fn to_state_bytes(&self) -> Result<Vec<u8>, String> {
        match self.0 {
            0 => Ok(vec![1]),
            rank => Err(format!("nothing to save on rank {rank}")),
        }
    }

    fn with_state_bytes(&self, _bytes: &[u8]) -> Result<Self, String> {
        Ok(OnlyOnRank0(self.0))
    }
}

#[test]
fn a_part_failing_on_one_rank_fails_a_gathered_save_on_every_rank_without_a_hang() {
    let _rng = rng_lock();
    let dir = temp_dir("one-rank-fails");
    let config = AcceleratorConfig {
        collective_timeout_s: 30.0,
        ..distributed("fsdp", StateDictType::Full)
    };
    let initial = vit(8);
    let target = dir.clone();
    let errors = Accelerator::<B>::launch(config, vec![Default::default(); 2], move |mut acc| {
        let mut run = Run::new(&acc, initial.clone())?;
        run.train_until(&mut acc, 1)?;
        let mut local = OnlyOnRank0(acc.rank());
        // The failing part comes before the optimizers, whose gathers are collectives.
        let parts = StateParts::new()
            .model("model", &mut run.model)
            .stateful("logger", &mut local)
            .optimizer::<Vit<B>, _>("optimizer", &mut run.fast);
        let err = acc
            .save_parts(&target, &parts)
            .expect_err("the save must fail");
        // The ranks' collectives are still in step: one more all-reduce works.
        acc.barrier()?;
        Ok(err.to_string())
    })
    .unwrap();
    assert!(errors[1].contains("logger"), "{errors:?}");
    assert!(errors[0].contains("other rank"), "{errors:?}");
    assert!(!dir.exists(), "nothing was written");
}
