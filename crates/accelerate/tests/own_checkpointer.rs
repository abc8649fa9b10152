//! Saving as a value (issue 40): a user's own checkpointer, an in-memory store here, through
//! the Accelerator and the Trainer. A run saved every few steps, "killed" (everything dropped
//! but the store) and resumed in a fresh Accelerator or Trainer ends bitwise equal to the
//! uninterrupted run; rotation, "latest" and the two-phase commit of a sharded save (FSDP
//! over two ranks) go through the store, and nothing is written on disk.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use afterburner::trainer::{
    Flow, IntervalStrategy, Trainer, TrainerCallback, TrainerState, TrainingArguments,
    list_checkpoints,
};
use afterburner::{
    AccelerateError, Accelerator, AcceleratorConfig, Checkpointer, ProjectConfig, StateFiles,
    StateParts,
};
use afterburner_demos::models::Vit;
use afterburner_demos::{ImageDataset, digits};
use burn::optim::SgdConfig;
use burn::optim::lr_scheduler::constant::ConstantLr;
use common::*;

/// States kept in memory, by location; clones share the store.
#[derive(Clone, Default)]
struct InMemory {
    states: Arc<Mutex<BTreeMap<PathBuf, StateFiles>>>,
    writes: Arc<AtomicU64>,
}

impl InMemory {
    fn states(&self) -> std::sync::MutexGuard<'_, BTreeMap<PathBuf, StateFiles>> {
        self.states.lock().unwrap()
    }

    /// Every stored location at or under `location`.
    fn under(&self, location: &Path) -> Vec<PathBuf> {
        let states = self.states();
        states
            .keys()
            .filter(|k| k.starts_with(location))
            .cloned()
            .collect()
    }
}

impl Checkpointer for InMemory {
    fn write(&self, location: &Path, files: &[(String, Vec<u8>)]) -> Result<(), AccelerateError> {
        let mut states = self.states();
        states.retain(|k, _| !k.starts_with(location));
        states.insert(location.to_path_buf(), files.to_vec());
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn read(&self, location: &Path) -> Result<StateFiles, AccelerateError> {
        self.states().get(location).cloned().ok_or_else(|| {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no state stored");
            AccelerateError::io("reading", location, missing)
        })
    }

    fn exists(&self, location: &Path) -> bool {
        !self.under(location).is_empty()
    }

    fn holds_state(&self, location: &Path) -> bool {
        self.states().contains_key(location)
    }

    fn is_saved(&self, location: &Path) -> bool {
        self.holds_state(location)
            || self
                .list(location)
                .iter()
                .all(|rank| rank.starts_with("rank-") && self.holds_state(&location.join(rank)))
                && !self.list(location).is_empty()
    }

    fn list(&self, location: &Path) -> Vec<String> {
        let mut names: Vec<String> = self
            .under(location)
            .iter()
            .filter_map(|k| k.strip_prefix(location).ok()?.components().next())
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        names.dedup();
        names
    }

    fn check_replaceable(&self, _location: &Path) -> Result<(), AccelerateError> {
        Ok(())
    }

    fn stage(&self, location: &Path) -> Result<PathBuf, AccelerateError> {
        let n = self.writes.load(Ordering::SeqCst);
        Ok(location.with_extension(format!("staged-{n}")))
    }

    fn commit(&self, staged: &Path, location: &Path) -> Result<(), AccelerateError> {
        let mut states = self.states();
        states.retain(|k, _| !k.starts_with(location));
        let moved: Vec<PathBuf> = states
            .keys()
            .filter(|k| k.starts_with(staged))
            .cloned()
            .collect();
        for key in moved {
            let files = states.remove(&key).unwrap();
            let rest = key.strip_prefix(staged).unwrap();
            states.insert(location.join(rest), files);
        }
        Ok(())
    }

    fn discard(&self, staged: &Path) {
        self.states().retain(|k, _| !k.starts_with(staged));
    }

    fn remove(&self, location: &Path) -> Result<(), AccelerateError> {
        self.states().retain(|k, _| !k.starts_with(location));
        Ok(())
    }
}

/// A root that exists only in the store.
fn virtual_root(name: &str) -> PathBuf {
    let root = PathBuf::from(format!(
        "/afterburner-in-memory/{name}-{}",
        std::process::id()
    ));
    assert!(!root.exists());
    root
}

fn config(root: &Path) -> AcceleratorConfig {
    AcceleratorConfig {
        precision: "16-mixed".parse().unwrap(),
        gradient_accumulation_steps: 2,
        project: ProjectConfig {
            dir: Some(root.to_path_buf()),
            keep_last: 2,
        },
        ..Default::default()
    }
}

/// Trains the tiny ViT until `until` optimizer steps, saving a numbered checkpoint every 2
/// steps; stops early ("killed") after `kill_at` steps, unsaved past its last checkpoint.
fn train(acc: &mut Accelerator<B>, mut model: Vit<B>, until: u64, kill_at: u64) -> Vit<B> {
    let mut optim = SgdConfig::new().init();
    let mut lr = 0.05;
    let resumed = acc
        .load_checkpoint(&mut StateParts::new().model("model", &mut model))
        .unwrap();
    let _ = resumed;
    let loader = acc
        .dataloader(digits::load().unwrap().take(64), BATCHER, 8)
        .unwrap();
    let (mut epoch, mut start) = acc.data_position();
    loop {
        for batch in loader.epoch_from(epoch, start) {
            let logits = acc
                .forward(&model, batch.images.clone(), |m, x| m.forward(x))
                .unwrap();
            acc.backward(cross_entropy(logits, &batch), &model).unwrap();
            model = acc.step(model, &mut optim, &mut lr).unwrap();
            let step = acc.counters().optimizer_steps;
            if acc.pending_micro_batches() > 0 {
                continue;
            }
            if step.is_multiple_of(2) {
                acc.save_checkpoint(&StateParts::new().model("model", &mut model.clone()))
                    .unwrap();
            }
            if step == until || step == kill_at {
                return model;
            }
        }
        (epoch, start) = (epoch + 1, 0);
    }
}

#[test]
fn an_in_memory_checkpointer_saves_kills_and_resumes_bitwise_through_the_accelerator() {
    let _rng = rng_lock();
    let straight_root = virtual_root("straight");
    let store = InMemory::default();
    let mut acc = Accelerator::<B>::new(config(&straight_root), Default::default())
        .unwrap()
        .with_checkpointer(store.clone());
    let model = acc.setup_model(vit(3)).unwrap();
    let straight = train(&mut acc, model, 12, u64::MAX);

    let root = virtual_root("killed");
    let store = InMemory::default();
    let mut acc = Accelerator::<B>::new(config(&root), Default::default())
        .unwrap()
        .with_checkpointer(store.clone());
    let model = acc.setup_model(vit(3)).unwrap();
    train(&mut acc, model, 12, 7);
    drop(acc); // killed after step 7: its last checkpoint is step 6's (checkpoint_2)
    let checkpoints = store.list(&root.join("checkpoints"));
    assert_eq!(
        checkpoints,
        ["checkpoint_1", "checkpoint_2"],
        "keep_last = 2"
    );
    let mut acc = Accelerator::<B>::new(config(&root), Default::default())
        .unwrap()
        .with_checkpointer(store.clone());
    // Other initial weights: everything comes from the store.
    let model = acc.setup_model(vit(99)).unwrap();
    let resumed = train(&mut acc, model, 12, u64::MAX);
    assert_eq!(flatten(&params(&resumed)), flatten(&params(&straight)));
    assert!(store.writes.load(Ordering::SeqCst) > 0);
    assert!(!root.exists() && !straight_root.exists(), "nothing on disk");
}

#[test]
fn a_sharded_save_commits_through_the_users_store() {
    let _rng = rng_lock();
    let root = virtual_root("fsdp");
    let store = InMemory::default();
    let config = AcceleratorConfig {
        parallelism: afterburner::ParallelismConfig {
            strategy: "fsdp".parse().unwrap(),
            devices: 2,
            ..config(&root).parallelism
        },
        ..config(&root)
    };
    let model = vit(5);
    let shared = store.clone();
    let saved = Accelerator::<B>::run(config.clone(), move |acc| {
        let acc = acc.with_checkpointer(shared.clone());
        let model = acc.setup_model(model.clone())?;
        acc.save_state(
            root.join("state"),
            &model,
            &SgdConfig::new().init::<B, Vit<B>>(),
            &ConstantLr::from(0.1),
        )?;
        Ok(flatten(&params(&acc.full_model(&model)?)))
    })
    .unwrap();
    let root = virtual_root("fsdp");
    let ranks = store.list(&root.join("state"));
    assert_eq!(ranks, ["rank-00000-of-00002", "rank-00001-of-00002"]);
    assert!(store.is_saved(&root.join("state")));
    let shared = store.clone();
    let loaded = Accelerator::<B>::run(config, move |mut acc| {
        acc = acc.with_checkpointer(shared.clone());
        let model = acc.setup_model(vit(77))?;
        let (model, _, _) = acc.load_state(
            root.join("state"),
            model,
            SgdConfig::new().init::<B, Vit<B>>(),
            ConstantLr::from(0.1),
        )?;
        Ok(flatten(&params(&acc.full_model(&model)?)))
    })
    .unwrap();
    assert_eq!(loaded, saved);
    assert!(!virtual_root("fsdp").exists(), "nothing on disk");
}

/// Stops the process's training at step `at` as a kill would: no save, no end of training.
struct KillAt(u64);

impl TrainerCallback for KillAt {
    fn on_step_end(&mut self, state: &TrainerState) -> Flow {
        if state.global_step == self.0 {
            panic!("killed at step {}", self.0);
        }
        Flow::Continue
    }
}

fn trainer_args(output_dir: &Path) -> TrainingArguments {
    TrainingArguments {
        output_dir: output_dir.to_path_buf(),
        max_steps: 10,
        per_device_train_batch_size: 4,
        learning_rate: 2e-3,
        save_strategy: IntervalStrategy::Steps,
        save_steps: 3.0,
        save_total_limit: Some(2),
        logging_steps: 1.0,
        ..Default::default()
    }
}

fn digits_trainer(args: TrainingArguments, seed: u64, store: &InMemory) -> DigitsTrainer {
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[40..48].to_vec(), [1, 8, 8]).unwrap();
    Trainer::new(vit(seed), args, all.take(40), eval, BATCHER)
        .unwrap()
        .with_checkpointer(store.clone())
}

#[test]
fn an_in_memory_checkpointer_saves_kills_and_resumes_bitwise_through_the_trainer() {
    let _rng = rng_lock();
    // The logs go to the output directory on disk, the checkpoints to the store.
    let out = scratch_dir("own-checkpointer-straight");
    let store = InMemory::default();
    let mut straight = digits_trainer(trainer_args(&out), 4, &store);
    straight.train().unwrap();
    let straight = flatten(&params(straight.model().unwrap()));

    std::fs::remove_dir_all(&out).ok();
    let out = scratch_dir("own-checkpointer-killed");
    let store = InMemory::default();
    let killed = digits_trainer(trainer_args(&out), 4, &store).with_callback(KillAt(8));
    let mut killed = std::panic::AssertUnwindSafe(killed);
    let died = std::panic::catch_unwind(move || killed.train());
    assert!(died.is_err(), "the run was killed");
    let steps: Vec<u64> = list_checkpoints(&store, &out)
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(steps, [3, 6], "save_total_limit = 2");
    let resume = TrainingArguments {
        resume_from_checkpoint: Some("latest".into()),
        ..trainer_args(&out)
    };
    let mut resumed = digits_trainer(resume, 99, &store);
    let summary = resumed.train().unwrap();
    assert_eq!(summary.global_step, 10);
    assert_eq!(flatten(&params(resumed.model().unwrap())), straight);
    let steps: Vec<u64> = list_checkpoints(&store, &out)
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(steps, [9, 10], "the final save too, as HF");
    assert!(!out.join("checkpoint-9").exists(), "no checkpoint on disk");
    let _ = std::fs::remove_dir_all(&out);
}
