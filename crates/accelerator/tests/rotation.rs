//! Issue 11: numbered, rotated saves. `save_checkpoint` keeps the newest `project.keep_last`
//! checkpoints (never deleting a directory it did not write); `load_checkpoint` loads the
//! newest, and falls back to the previous one when the newest is damaged.

mod common;

use std::path::{Path, PathBuf};

use afterburner_accelerator::{
    AccelerateError, Accelerator, AcceleratorConfig, ProjectConfig, StateParts, StrategyConfig,
};
use afterburner_demos::models::Vit;
use burn::optim::SgdConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use common::*;

type Optim = OptimizerAdaptor<burn::optim::Sgd<burn::backend::Flex>, Vit<B>, B>;

fn project(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "afterburner-rotation-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(dir: &Path, keep_last: usize) -> AcceleratorConfig {
    AcceleratorConfig {
        project: ProjectConfig {
            dir: Some(dir.to_path_buf()),
            keep_last,
        },
        ..Default::default()
    }
}

fn parts<'a>(model: &'a mut Vit<B>, optim: &'a mut Optim, epoch: &'a mut u32) -> StateParts<'a, B> {
    StateParts::new()
        .model("model", model)
        .optimizer::<Vit<B>, _>("optimizer", optim)
        .serde("epoch", epoch)
}

#[test]
fn keeps_the_newest_and_falls_back_past_a_damaged_one() {
    let _rng = rng_lock();
    let root = project("keep");
    let checkpoints = root.join("checkpoints");
    // A user's directory that only looks like a checkpoint: never deleted, numbering skips it.
    std::fs::create_dir_all(checkpoints.join("checkpoint_1")).unwrap();
    std::fs::write(checkpoints.join("checkpoint_1").join("notes.txt"), "mine").unwrap();

    let acc = Accelerator::<B>::new(config(&root, 2), Default::default()).unwrap();
    let mut optim: Optim = SgdConfig::new().init();
    let mut saved = Vec::new();
    for seed in 0..4u32 {
        let mut model = vit(20 + u64::from(seed));
        let mut epoch = seed;
        let path = acc
            .save_checkpoint(&parts(&mut model, &mut optim, &mut epoch))
            .unwrap();
        saved.push((path, flatten(&params(&model))));
    }
    let numbers: Vec<String> = saved
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        numbers,
        [
            "checkpoint_2",
            "checkpoint_3",
            "checkpoint_4",
            "checkpoint_5"
        ]
    );
    assert_eq!(
        names(&checkpoints),
        ["checkpoint_1", "checkpoint_4", "checkpoint_5"],
        "the newest 2, and the user's directory"
    );
    assert_eq!(
        std::fs::read_to_string(checkpoints.join("checkpoint_1").join("notes.txt")).unwrap(),
        "mine"
    );

    // The newest loads.
    let load = |expect_epoch: u32| {
        let mut acc = Accelerator::<B>::new(config(&root, 2), Default::default()).unwrap();
        let mut model = vit(99);
        let mut optim: Optim = SgdConfig::new().init();
        let mut epoch = 1000;
        let path = acc
            .load_checkpoint(&mut parts(&mut model, &mut optim, &mut epoch))
            .unwrap()
            .unwrap();
        assert_eq!(epoch, expect_epoch);
        (path, flatten(&params(&model)))
    };
    let (path, params_loaded) = load(3);
    assert_eq!(path, saved[3].0);
    assert!(params_loaded == saved[3].1, "bitwise");

    // Damage the newest: the previous one loads instead, bitwise.
    let file = saved[3].0.join("model.mpk");
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let (path, params_loaded) = load(2);
    assert_eq!(path, saved[2].0);
    assert!(params_loaded == saved[2].1, "bitwise");
    // The damaged one is set aside (kept, hidden), so rotation never counts it as a copy.
    let listed = names(&checkpoints);
    let visible = |names: Vec<String>| -> Vec<String> {
        names.into_iter().filter(|n| !n.starts_with('.')).collect()
    };
    assert_eq!(visible(listed.clone()), ["checkpoint_1", "checkpoint_4"]);
    assert!(
        listed
            .iter()
            .any(|n| n.starts_with(".checkpoint_5.damaged-")),
        "{listed:?}"
    );

    // A model that does not fit is an error, not a reason to fall back to an older one.
    let mut acc = Accelerator::<B>::new(config(&root, 2), Default::default()).unwrap();
    <B as burn::tensor::backend::Backend>::seed(&Default::default(), 5);
    let mut other = tiny_vit().with_d_model(16).init::<B>(&Default::default());
    let mut epoch = 0;
    let err = acc
        .load_checkpoint(&mut parts(&mut other, &mut optim, &mut epoch))
        .unwrap_err();
    assert!(matches!(err, AccelerateError::InvalidPart { .. }), "{err}");
    assert_eq!(
        visible(names(&checkpoints)),
        ["checkpoint_1", "checkpoint_4"]
    );
    std::fs::remove_dir_all(root).ok();
}

#[test]
fn a_fresh_project_loads_nothing_and_settings_are_checked() {
    let _rng = rng_lock();
    let root = project("fresh");
    let mut acc = Accelerator::<B>::new(config(&root, 2), Default::default()).unwrap();
    let mut model = vit(1);
    let mut optim: Optim = SgdConfig::new().init();
    let mut epoch = 0;
    let found = acc
        .load_checkpoint(&mut parts(&mut model, &mut optim, &mut epoch))
        .unwrap();
    assert!(found.is_none());

    let mut plain =
        Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let err = plain
        .load_checkpoint(&mut parts(&mut model, &mut optim, &mut epoch))
        .unwrap_err();
    assert!(err.to_string().contains("project.dir"), "{err}");

    let err = Accelerator::<B>::new(config(&root, 0), Default::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("project.keep_last"), "{err}");
    let err = serde_json::from_str::<AcceleratorConfig>(r#"{"project": {"keep": 3}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("keep"), "{err}");
}

/// Under ZeRO-1 (one directory per rank inside each checkpoint), rotation keeps whole sharded
/// checkpoints and the newest loads on both ranks.
#[test]
fn sharded_checkpoints_rotate_and_load() {
    let _rng = rng_lock();
    let root = project("sharded");
    let initial = vit(5);
    let sharded = AcceleratorConfig {
        parallelism: afterburner_accelerator::ParallelismConfig {
            strategy: StrategyConfig::Zero1(Default::default()),
            devices: 2,
            ..config(&root, 1).parallelism
        },
        ..config(&root, 1)
    };
    let saved = Accelerator::<B>::run(sharded.clone(), move |acc| {
        let (mut model, mut optim) = acc.setup(initial.clone(), SgdConfig::new().init())?;
        let mut last = PathBuf::new();
        for mut epoch in 0..3u32 {
            last = acc.save_checkpoint(&parts(&mut model, &mut optim, &mut epoch))?;
        }
        Ok(last)
    })
    .unwrap();
    assert_eq!(names(&root.join("checkpoints")), ["checkpoint_2"]);
    let other = vit(6);
    let loaded = Accelerator::<B>::run(sharded, move |mut acc| {
        let (mut model, mut optim) = acc.setup(other.clone(), SgdConfig::new().init())?;
        let mut epoch = 9;
        let path = acc.load_checkpoint(&mut parts(&mut model, &mut optim, &mut epoch))?;
        Ok::<_, AccelerateError>((path, epoch))
    })
    .unwrap();
    for (path, epoch) in loaded {
        assert_eq!(path.as_ref(), Some(&saved[0]));
        assert_eq!(epoch, 2);
    }
    std::fs::remove_dir_all(root).ok();
}

/// A model of another type (the checkpoints of another run, or this model before a field was
/// renamed) in the same project.
#[derive(burn::module::Module, Debug)]
struct OtherModel<B: burn::tensor::backend::Backend> {
    renamed: burn::nn::Linear<B>,
}

/// Issue 41: a checkpoint that decodes as another model's is a named error, never damage: no
/// silent fall back to an older checkpoint, nothing renamed aside.
#[test]
fn another_models_checkpoint_is_named_not_damaged_nor_set_aside() {
    let _rng = rng_lock();
    let root = project("other-model");
    let checkpoints = root.join("checkpoints");
    let acc = Accelerator::<B>::new(config(&root, 3), Default::default()).unwrap();
    let mut optim: Optim = SgdConfig::new().init();
    let (mut model, mut epoch) = (vit(7), 1u32);
    acc.save_checkpoint(&parts(&mut model, &mut optim, &mut epoch))
        .unwrap();
    let mut other = OtherModel {
        renamed: burn::nn::LinearConfig::new(4, 2).init::<B>(&Default::default()),
    };
    let mut other_optim = SgdConfig::new().init::<B, OtherModel<B>>();
    let mut other_epoch = 2u32;
    let other_parts = StateParts::new()
        .model("model", &mut other)
        .optimizer::<OtherModel<B>, _>("optimizer", &mut other_optim)
        .serde("epoch", &mut other_epoch);
    let newest = acc.save_checkpoint(&other_parts).unwrap();

    let mut acc = Accelerator::<B>::new(config(&root, 3), Default::default()).unwrap();
    let mut model = vit(8);
    let before = flatten(&params(&model));
    let mut epoch = 1000;
    let err = acc
        .load_checkpoint(&mut parts(&mut model, &mut optim, &mut epoch))
        .unwrap_err();
    assert!(matches!(err, AccelerateError::Mismatched { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("checkpoint_1") && message.contains("model.mpk"),
        "{message}"
    );
    assert!(message.contains("different model"), "{message}");
    assert!(message.contains("missing field"), "{message}");
    assert!(!message.contains("corrupt"), "{message}");
    // Nothing loaded, nothing fallen back to, nothing set aside.
    assert_eq!(epoch, 1000);
    assert!(flatten(&params(&model)) == before);
    assert_eq!(names(&checkpoints), ["checkpoint_0", "checkpoint_1"]);
    assert!(newest.join("model.mpk").exists());
    // load_parts on that directory says the same.
    let err = acc
        .load_parts(&newest, &mut parts(&mut model, &mut optim, &mut epoch))
        .unwrap_err();
    assert!(matches!(err, AccelerateError::Mismatched { .. }), "{err:?}");
    std::fs::remove_dir_all(root).ok();
}
