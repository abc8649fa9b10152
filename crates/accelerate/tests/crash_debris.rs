//! Issue 11, finding 7: what a save killed half-way leaves behind is cleaned by the next save,
//! and a state a crash left moved aside (between the two renames) is recovered on load.

mod common;

use std::path::{Path, PathBuf};

use afterburner::demos::models::Vit;
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig};
use burn::optim::SgdConfig;
use common::{B, flatten, params, rng_lock, vit};

fn root(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("afterburner-debris-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn save(dir: &Path, seed: u64) {
    let acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    acc.save_state(dir, &vit(seed), &optim, &0.1).unwrap();
}

fn load(dir: &Path) -> Result<Vit<B>, AccelerateError> {
    let mut acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default())?;
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    Ok(acc.load_state(dir, vit(9), optim, 0.1)?.0)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_next_save_cleans_a_killed_saves_leftovers() {
    let _rng = rng_lock();
    let root = root("clean");
    let state = root.join("state");
    save(&state, 1);
    // What kill -9 leaves: a half-written temporary and a previous state moved aside.
    let tmp = root.join(".state.tmp-4242-17");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("model.mpk"), b"half").unwrap();
    copy_dir(&state, &root.join(".state.old-4242-18"));
    // Not ours by name: left alone.
    std::fs::create_dir_all(root.join(".state.old-notes")).unwrap();
    save(&state, 2);
    assert_eq!(names(&root), vec![".state.old-notes", "state"]);
    assert!(load(&state).is_ok());
    std::fs::remove_dir_all(root).ok();
}

#[test]
fn a_state_moved_aside_by_a_crash_is_recovered_on_load() {
    let _rng = rng_lock();
    let root = root("recover");
    let state = root.join("state");
    save(&state, 3);
    let want = flatten(&params(&load(&state).unwrap()));
    // The crash hit after `state` was moved aside and before the new one was renamed in.
    std::fs::rename(&state, root.join(".state.old-4242-99")).unwrap();
    let loaded = load(&state).unwrap();
    assert_eq!(flatten(&params(&loaded)), want);
    assert_eq!(names(&root), vec!["state"]);
    std::fs::remove_dir_all(root).ok();
}
