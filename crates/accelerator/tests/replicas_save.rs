//! A save among fault-tolerant DiLoCo replicas that one of them dies during: the save commits
//! among the replicas present (3 replica threads on a `Lighthouse`; the dying replica's
//! checkpointer panics at the chosen phase, so its thread unwinds and its group leaves the
//! quorum, as a killed process's connection closes). Whether the dead one is the replica that
//! stages and commits (replica 0) or another, the survivors' save returns Ok and the checkpoint
//! holds their parts; a later load gives the missing replica a present replica's part.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use afterburner_accelerator::localsgd::DiLoCoConfig;
use afterburner_accelerator::parallel::{Lighthouse, LocalReplicas, QuorumConfig};
use afterburner_accelerator::{
    AccelerateError, Accelerator, AcceleratorConfig, Checkpointer, FileCheckpointer, StateFiles,
    StrategyConfig,
};
use afterburner_demos::digits;
use burn::optim::AdamWConfig;
use common::*;

/// Where the dying replica's checkpointer panics.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    /// Writing its own part into the staged save.
    Write,
    /// Committing the staged save (only the replica that commits gets there).
    Commit,
}

/// The default checkpointer, except that it panics at `phase` (the replica dies there).
struct DiesAt(Phase);

impl Checkpointer for DiesAt {
    fn write(&self, location: &Path, files: &[(String, Vec<u8>)]) -> Result<(), AccelerateError> {
        assert!(self.0 != Phase::Write, "the test kills this replica");
        FileCheckpointer.write(location, files)
    }
    fn read(&self, location: &Path) -> Result<StateFiles, AccelerateError> {
        FileCheckpointer.read(location)
    }
    fn exists(&self, location: &Path) -> bool {
        FileCheckpointer.exists(location)
    }
    fn holds_state(&self, location: &Path) -> bool {
        FileCheckpointer.holds_state(location)
    }
    fn is_saved(&self, location: &Path) -> bool {
        FileCheckpointer.is_saved(location)
    }
    fn list(&self, location: &Path) -> Vec<String> {
        FileCheckpointer.list(location)
    }
    fn check_replaceable(&self, location: &Path) -> Result<(), AccelerateError> {
        FileCheckpointer.check_replaceable(location)
    }
    fn stage(&self, location: &Path) -> Result<PathBuf, AccelerateError> {
        FileCheckpointer.stage(location)
    }
    fn commit(&self, staged: &Path, location: &Path) -> Result<(), AccelerateError> {
        assert!(self.0 != Phase::Commit, "the test kills this replica");
        FileCheckpointer.commit(staged, location)
    }
    fn discard(&self, staged: &Path) {
        FileCheckpointer.discard(staged)
    }
    fn remove(&self, location: &Path) -> Result<(), AccelerateError> {
        FileCheckpointer.remove(location)
    }
}

fn config() -> AcceleratorConfig {
    AcceleratorConfig::default().with_strategy(StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: 3,
        ..Default::default()
    }))
}

/// Replica `id` trains 3 steps (one sync) and saves to `dir`; the replica `dying` dies at
/// `phase` of the save. Its parameters when it saved.
fn replica(
    lighthouse: &Arc<Lighthouse>,
    id: usize,
    dir: &Path,
    dying: (usize, Phase),
) -> Result<Vec<f32>, AccelerateError> {
    let device = Default::default();
    let group = lighthouse.replica(id, &device)?;
    let mut acc = Accelerator::<B>::with_group(config(), device, Box::new(group))?;
    if id == dying.0 {
        acc = acc.with_checkpointer(DiesAt(dying.1));
    }
    let (mut model, mut optim) = acc.join(vit_of_the_test(), AdamWConfig::new().init())?;
    let loader = acc.dataloader(digits::load()?.take(48), BATCHER, 4)?;
    for batch in loader.epoch(0).take(3) {
        let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
        acc.backward(cross_entropy(logits, &batch), &model)?;
        model = acc.step(model, &mut optim, &mut 1e-3)?;
    }
    acc.save_state(dir, &model, &optim, &1e-3)?;
    Ok(flatten(&params(&model)))
}

/// A replica's starting model (DiLoCo's setup gives every replica replica 0's).
fn vit_of_the_test() -> afterburner_demos::models::Vit<B> {
    tiny_vit().init::<B>(&Default::default())
}

/// Runs the 3 replicas; each one's outcome (the dying one's thread panicked: `None`).
fn save_with_a_death(name: &str, dying: (usize, Phase)) -> (PathBuf, Vec<Option<Vec<f32>>>) {
    let _rng = rng_lock();
    let dir = scratch_dir(name).join("state");
    let lighthouse = Lighthouse::new(QuorumConfig::new(3)).unwrap();
    let threads: Vec<_> = (0..3)
        .map(|id| {
            let (lighthouse, dir) = (lighthouse.clone(), dir.clone());
            std::thread::spawn(move || replica(&lighthouse, id, &dir, dying))
        })
        .collect();
    let outcomes = threads
        .into_iter()
        .enumerate()
        .map(|(id, thread)| match thread.join() {
            Ok(result) => Some(result.unwrap_or_else(|e| panic!("replica {id} failed: {e}"))),
            Err(_) => None,
        })
        .collect();
    (dir, outcomes)
}

fn parts(dir: &Path) -> Vec<String> {
    names(dir)
}

#[test]
fn the_replica_that_commits_dies_while_writing_and_the_others_commit() {
    let (dir, outcomes) = save_with_a_death("replicas-save-leader-write", (0, Phase::Write));
    assert!(outcomes[0].is_none(), "replica 0 was to die");
    assert_eq!(
        outcomes[1], outcomes[2],
        "synced replicas hold the same parameters"
    );
    assert!(FileCheckpointer.is_saved(&dir));
    assert_eq!(
        parts(&dir),
        vec!["rank-00001-of-00003", "rank-00002-of-00003"]
    );
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn the_replica_that_commits_dies_before_committing_and_the_next_commits() {
    let (dir, outcomes) = save_with_a_death("replicas-save-leader-commit", (0, Phase::Commit));
    assert!(outcomes[0].is_none(), "replica 0 was to die");
    assert!(outcomes[1].is_some() && outcomes[2].is_some());
    // Replica 0 had written its part before it died: the save holds all three.
    assert!(FileCheckpointer.is_saved(&dir));
    assert_eq!(parts(&dir).len(), 3);
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn a_replica_dies_while_writing_and_later_loads_a_present_part() {
    let (dir, outcomes) = save_with_a_death("replicas-save-other-write", (2, Phase::Write));
    assert!(outcomes[2].is_none(), "replica 2 was to die");
    let saved = outcomes[0].clone().unwrap();
    assert_eq!(
        parts(&dir),
        vec!["rank-00000-of-00003", "rank-00001-of-00003"]
    );
    // The three load it again: replica 2 gets replica 0's part, as healing would give it.
    let _rng = rng_lock();
    let lighthouse = Lighthouse::new(QuorumConfig::new(3)).unwrap();
    let threads: Vec<_> = (0..3)
        .map(|id| {
            let (lighthouse, dir) = (lighthouse.clone(), dir.clone());
            std::thread::spawn(move || -> Result<Vec<f32>, AccelerateError> {
                let device = Default::default();
                let group = lighthouse.replica(id, &device)?;
                let mut acc = Accelerator::<B>::with_group(config(), device, Box::new(group))?;
                let (model, optim) = acc.join(vit_of_the_test(), AdamWConfig::new().init())?;
                let (model, _, _) = acc.load_state(&dir, model, optim, 1e-3)?;
                Ok(flatten(&params(&model)))
            })
        })
        .collect();
    for thread in threads {
        assert_eq!(thread.join().unwrap().unwrap(), saved);
    }
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}
