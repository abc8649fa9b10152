//! Tensor parallelism through the Accelerator (`tp_size`, the demo transformer's plan): tp 2
//! and dp 2 x tp 2 train as one device (gradient accumulation, clipping with the norm over the
//! split parameters counted once, AdamW); a model without its plan applied is a named error;
//! a state saved at tp 4 loads at tp 2 and on one device exactly (the state written again is
//! the same) and a resumed run ends bitwise where the uninterrupted one did.

mod common;

use std::path::PathBuf;

use afterburner::parallel::{OptimizerRecord, flat_params};
use afterburner::trainer::TrainLoss;
use afterburner::{
    AccelerateError, Accelerator, AcceleratorConfig, FsdpConfig, StateDictType, StrategyConfig,
};
use afterburner_demos::models::{Transformer, TransformerConfig};
use afterburner_demos::text::{self, TextDataset, TokenBatcher};
use burn::backend::{Autodiff, Flex};
use burn::data::dataset::{Dataset, InMemDataset};
use burn::optim::AdamWConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use common::{norm_relative, relative};

type B = Autodiff<Flex>;
const LR: f64 = 1e-3;
/// Items per epoch: 8 optimizer steps of 2 micro-batches of 4 items (over every data shard).
const ITEMS: usize = 64;

/// Flex keeps one RNG per process, which the Accelerator seeds every step: one test at a time.
fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    RNG.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A 2-block transformer over bytes (d 16, 4 heads), every lazy parameter initialised.
fn model(seed: u64) -> Transformer<B> {
    let device = Default::default();
    <B as Backend>::seed(&device, seed);
    let model = TransformerConfig::new()
        .with_d_model(16)
        .with_n_heads(4)
        .with_n_layers(2)
        .with_max_seq_len(8)
        .init::<B>(&device);
    let _ = model.forward(Tensor::<B, 2, Int>::zeros([1, 8], &device));
    model
}

fn items() -> InMemDataset<text::TextItem> {
    let all = TextDataset::new(text::load(), 8, 8).unwrap();
    InMemDataset::new((0..ITEMS).filter_map(|i| all.get(i)).collect())
}

/// `devices` ranks at `tp_size` (DDP across the groups), accumulating 2 micro-batches and
/// clipping to 0.5.
fn config(devices: usize, tp_size: usize) -> AcceleratorConfig {
    AcceleratorConfig {
        gradient_accumulation_steps: 2,
        max_grad_norm: Some(0.5),
        parallelism: afterburner::ParallelismConfig {
            strategy: match devices {
                1 => StrategyConfig::SingleDevice,
                _ => StrategyConfig::Ddp(Default::default()),
            },
            devices,
            tp_size,
        },
        ..Default::default()
    }
}

/// Per rank: the whole model's parameters after optionally loading `load`, training the
/// epochs of `epochs` and optionally saving to `save`.
fn run(
    config: AcceleratorConfig,
    load: Option<PathBuf>,
    save: Option<PathBuf>,
    epochs: std::ops::Range<usize>,
) -> Vec<Vec<f32>> {
    let initial = model(3);
    // 4 items a micro-batch over the data shards: the same items a step at any dp.
    let batch = 4 / (config.parallelism.devices / config.parallelism.tp_size);
    Accelerator::<B>::run(config, move |mut acc| {
        let model = acc.parallelize(initial.clone())?;
        let (mut model, mut optim) = acc.setup(model, AdamWConfig::new().init())?;
        if let Some(dir) = &load {
            (model, optim, _) = acc.load_state(dir, model, optim, LR)?;
        }
        let loader = acc.dataloader(items(), TokenBatcher, batch)?;
        let mut lr = LR;
        for epoch in epochs.clone() {
            for batch in loader.epoch(epoch) {
                let loss = model.train_loss(&acc, batch)?;
                acc.backward(loss, &model)?;
                model = acc.step(model, &mut optim, &mut lr)?;
            }
        }
        if let Some(dir) = &save {
            acc.save_state(dir, &model, &optim, &LR)?;
        }
        let whole = acc.full_model(&model)?;
        Ok(flat_params::<B, _>(&whole)
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap())
    })
    .unwrap()
}

/// [`config`] with FSDP (full shard) across the tensor-parallel groups, saving `state` as
/// `state_dict_type`.
fn fsdp(devices: usize, tp_size: usize, state: StateDictType) -> AcceleratorConfig {
    config(devices, tp_size).with_strategy(StrategyConfig::Fsdp(FsdpConfig {
        state_dict_type: state,
        ..Default::default()
    }))
}

#[test]
fn tp_2_and_dp_2_by_tp_2_train_as_one_device() {
    let _rng = rng_lock();
    let one = run(config(1, 1), None, None, 0..1).remove(0);
    for (devices, tp, config) in [
        (2, 2, config(2, 2)),
        (4, 2, config(4, 2)),
        (4, 2, fsdp(4, 2, StateDictType::Full)),
    ] {
        let strategy = config.parallelism.strategy.name().to_string();
        let ranks = run(config, None, None, 0..1);
        // Every rank ends with the same model: the replicated parameters' copies stay equal
        // (every rank of a group clips by the same norm).
        assert!(
            ranks.iter().all(|p| *p == ranks[0]),
            "the ranks' models differ"
        );
        for (rank, params) in ranks.iter().enumerate() {
            let error = relative(params, &one);
            println!(
                "{devices} devices at tp {tp} ({strategy}), rank {rank}: {error:e} from one device"
            );
            assert!(
                error < 1e-6,
                "{devices} devices at tp {tp}, rank {rank}: the parameters differ from one \
                 device's by {error:e} (relative)"
            );
        }
    }
}

#[test]
fn a_model_without_its_plan_applied_is_a_named_error() {
    let _rng = rng_lock();
    let initial = model(3);
    let error = Accelerator::<B>::run(config(2, 2), move |acc| {
        acc.setup_model(initial.clone())?;
        Ok(())
    })
    .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("tp_size"), "{message}");
    assert!(message.contains("TensorParallelPlan"), "{message}");
    // A size that does not divide the devices, and another strategy, are named too.
    let odd = config(4, 3).validate().unwrap_err().to_string();
    assert!(
        odd.contains("tp_size") && odd.contains("a divisor of devices (4)"),
        "{odd}"
    );
    let zero = config(4, 2).with_strategy(StrategyConfig::Zero1(Default::default()));
    let zero = zero.validate().unwrap_err().to_string();
    assert!(
        zero.contains("tp_size") && zero.contains("\"fsdp\""),
        "{zero}"
    );
}

/// A state's model file, and its optimizer's state values parameter by parameter (the
/// record's map order is a hash map's, so its bytes may differ for the same state).
fn state_files(dir: &std::path::Path) -> (Vec<u8>, Vec<String>, Vec<f32>) {
    let model = std::fs::read(dir.join("model.mpk")).unwrap();
    let optimizer = std::fs::read(dir.join("optimizer.mpk")).unwrap();
    let record = OptimizerRecord::from_bytes(&optimizer).unwrap();
    let ids = record.param_ids();
    let positions = ids
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, id)| (id, i))
        .collect();
    (model, ids, record.values(&positions).unwrap())
}

#[test]
fn a_state_saved_at_tp_4_loads_at_tp_2_and_on_one_device_exactly() -> Result<(), AccelerateError> {
    let _rng = rng_lock();
    let root = std::env::temp_dir().join(format!("afterburner-tp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (at_4, at_2, at_1) = (root.join("tp4"), root.join("tp2"), root.join("one"));
    let saved = run(config(4, 4), None, Some(at_4.clone()), 0..1);
    assert!(at_4.join("manifest.json").is_file(), "one ordinary state");

    // Loaded at tp 2 and on one device and saved again at once: the same model bytes and the
    // same AdamW moments, so every value went through the split and back exactly.
    let loaded_2 = run(config(2, 2), Some(at_4.clone()), Some(at_2.clone()), 1..1);
    let loaded_1 = run(config(1, 1), Some(at_4.clone()), Some(at_1.clone()), 1..1);
    assert_eq!(loaded_2[0], saved[0]);
    assert_eq!(loaded_1[0], saved[0]);
    let saved_files = state_files(&at_4);
    // Every parameter has its moments: 12 per block, 6 outside.
    assert!(saved_files.1.len() == 2 * 12 + 6 && !saved_files.2.is_empty());
    assert!(
        state_files(&at_2) == saved_files,
        "tp 4 -> tp 2 -> file: another state"
    );
    assert!(
        state_files(&at_1) == saved_files,
        "tp 4 -> one device -> file: another state"
    );

    // FSDP across the groups (dp 2 x tp 2) loads it exactly too, and saves it again whole.
    let at_fsdp = root.join("fsdp");
    let loaded_fsdp = run(
        fsdp(4, 2, StateDictType::Full),
        Some(at_4.clone()),
        Some(at_fsdp.clone()),
        1..1,
    );
    assert!(loaded_fsdp.iter().all(|p| *p == saved[0]));
    assert!(
        state_files(&at_fsdp) == saved_files,
        "tp 4 -> fsdp x tp 2 -> file: another state"
    );

    // Resumed at tp 2: bitwise the uninterrupted tp 2 run over the same two epochs.
    let straight = run(config(2, 2), None, None, 0..2);
    let first = root.join("first");
    run(config(2, 2), None, Some(first.clone()), 0..1);
    let resumed = run(config(2, 2), Some(first), None, 1..2);
    assert!(
        resumed == straight,
        "resumed differs from uninterrupted by {:e} (relative)",
        relative(&resumed[0], &straight[0])
    );
    // From tp 4's state, the second epoch at tp 2 and on one device agree.
    let from_4_at_2 = run(config(2, 2), Some(at_4.clone()), None, 1..2);
    let from_4_at_1 = run(config(1, 1), Some(at_4), None, 1..2);
    let error = relative(&from_4_at_2[0], &from_4_at_1[0]);
    assert!(error < 1e-6, "{error:e}");
    std::fs::remove_dir_all(&root).unwrap();
    Ok(())
}

#[test]
fn bf16_mixed_as_a_half_view_composes() {
    let _rng = rng_lock();
    let half = |devices, tp| AcceleratorConfig {
        precision: "bf16-mixed".parse().unwrap(),
        ..config(devices, tp)
    };
    let full = run(config(1, 1), None, None, 0..1).remove(0);
    let one = run(half(1, 1), None, None, 0..1).remove(0);
    let own = norm_relative(&one, &full);
    // Tensor parallelism alone stays within bf16's own difference; with DDP (dp 2 x tp 2)
    // the data-parallel mean adds its own rounding, so within twice that.
    for (devices, tp, bound) in [(2, 2, 1.0), (4, 4, 1.0), (4, 2, 2.0)] {
        let ranks = run(half(devices, tp), None, None, 0..1);
        let error = norm_relative(&ranks[0], &one);
        println!(
            "bf16-mixed view, {devices} devices at tp {tp}: {error:e} from one device; bf16 from 32-true {own:e}"
        );
        assert!(
            error <= bound * own,
            "{devices} devices at tp {tp}: {error:e} from one device at bf16-mixed, more than \
             {bound} x bf16-mixed from 32-true ({own:e})"
        );
    }
}

#[test]
fn a_sharded_tp_state_resumes_bitwise_at_its_sizes() {
    let _rng = rng_lock();
    let sharded = |devices, tp| fsdp(devices, tp, StateDictType::Sharded);
    let root = std::env::temp_dir().join(format!("afterburner-tp-sharded-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // tp 2 alone (each rank its split part), and dp 2 x tp 2 (FSDP's shards of them).
    for (devices, tp) in [(2, 2), (4, 2)] {
        let dir = root.join(format!("{devices}-{tp}"));
        let straight = run(sharded(devices, tp), None, None, 0..2);
        run(sharded(devices, tp), None, Some(dir.clone()), 0..1);
        for rank in 0..devices {
            let own = dir.join(format!("rank-{rank:05}-of-{devices:05}"));
            assert!(own.join("manifest.json").is_file(), "{}", own.display());
        }
        let resumed = run(sharded(devices, tp), Some(dir), None, 1..2);
        assert!(
            resumed == straight,
            "{devices} devices at tp {tp}: resumed differs from uninterrupted by {:e}",
            relative(&resumed[0], &straight[0])
        );
    }
    // Its own parts load at the sizes that wrote them only: another is a named error.
    let (initial, dir) = (model(3), root.join("4-2"));
    let error = Accelerator::<B>::run(sharded(2, 2), move |mut acc| {
        let model = acc.parallelize(initial.clone())?;
        let (model, optim) = acc.setup(model, AdamWConfig::new().init())?;
        acc.load_state(&dir, model, optim, LR)?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("loads at the world size that saved it"),
        "{error}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}
