//! Issue 11, finding 7: what a save killed half-way leaves behind is cleaned by the next save,
//! and a state a crash left moved aside (between the two renames) is recovered on load.

mod common;

use std::path::{Path, PathBuf};

use afterburner_accelerator::{AccelerateError, Accelerator, AcceleratorConfig};
use afterburner_demos::models::Vit;
use burn::optim::SgdConfig;
use common::{B, flatten, names, params, rng_lock, vit};

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

/// Where the child process of the fault-injection test saves.
const CHILD_DIR: &str = "AFTERBURNER_KILL_TEST_DIR";

/// The child of [`saves_killed_at_random_points_leave_a_loadable_state`]: saves two models in
/// turn, forever, until it is killed. Does nothing when run on its own.
#[test]
#[ignore = "run by the fault-injection test as a child process"]
fn child_saves_forever() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let models = [vit(1), vit(2)];
    let acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    for i in 0.. {
        acc.save_state(&dir, &models[i % 2], &optim, &0.1).unwrap();
    }
}

/// A process killed with SIGKILL at 25 random points of its saves: after each kill the state
/// loads, as one of the two complete saves, and leftovers never grow past one save's.
#[cfg(unix)]
#[test]
fn saves_killed_at_random_points_leave_a_loadable_state() {
    let _rng = rng_lock();
    let root = root("kill");
    let state = root.join("state");
    save(&state, 1);
    let complete = [flatten(&params(&vit(1))), flatten(&params(&vit(2)))];
    let exe = std::env::current_exe().unwrap();
    let mut draw = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..25 {
        let mut child = std::process::Command::new(&exe)
            .args([
                "child_saves_forever",
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, &state)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        draw ^= draw << 13;
        draw ^= draw >> 7;
        draw ^= draw << 17;
        std::thread::sleep(std::time::Duration::from_millis(150 + draw % 450));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let loaded = load(&state).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let got = flatten(&params(&loaded));
        assert!(
            complete.contains(&got),
            "round {round}: a state no save wrote"
        );
        let leftovers = names(&root).iter().filter(|n| n.starts_with('.')).count();
        assert!(leftovers <= 2, "round {round}: {:?}", names(&root));
    }
    save(&state, 1);
    assert_eq!(names(&root), vec!["state"]);
    std::fs::remove_dir_all(root).ok();
}
