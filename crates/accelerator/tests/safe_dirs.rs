//! Issue 11, finding 4: `save_state` never deletes what it did not write. A directory is a
//! state only by our versioned manifest listing every file in it; symbolic links are refused;
//! a sharded save deletes only rank directories it wrote.

mod common;

use std::path::{Path, PathBuf};

use afterburner_accelerator::{AccelerateError, Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::models::Vit;
use burn::optim::SgdConfig;
use common::{B, rng_lock, vit};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afterburner-safe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn save(dir: &Path) -> Result<(), AccelerateError> {
    let acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default())?;
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    acc.save_state(dir, &vit(1), &optim, &0.1)
}

#[test]
fn a_users_file_named_manifest_json_is_not_a_state() {
    let _rng = rng_lock();
    let dir = temp_dir("manifest");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manifest.json"), "{\"my\": \"notes\"}").unwrap();
    std::fs::write(dir.join("thesis.tex"), "precious").unwrap();
    let err = save(&dir).unwrap_err();
    assert!(matches!(err, AccelerateError::NotAStateDir { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("thesis.tex")).unwrap(),
        "precious"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_users_file_inside_a_state_keeps_the_state_from_being_replaced() {
    let _rng = rng_lock();
    let dir = temp_dir("inside");
    save(&dir).unwrap();
    save(&dir).unwrap(); // our own state is replaced
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let err = save(&dir).unwrap_err();
    assert!(matches!(err, AccelerateError::NotAStateDir { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "mine"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[cfg(unix)]
#[test]
fn a_symbolic_link_is_refused_not_replaced() {
    let _rng = rng_lock();
    let target = temp_dir("link-target");
    save(&target).unwrap();
    let link = temp_dir("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = save(&link).unwrap_err();
    assert!(
        matches!(err, AccelerateError::StateDirIsLink { .. }),
        "{err}"
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // The state it points to still loads.
    let mut acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    assert!(acc.load_state(&target, vit(2), optim, 0.1).is_ok());
    std::fs::remove_file(link).ok();
    std::fs::remove_dir_all(target).ok();
}

/// ZeRO-1 saves one directory per rank; a user's `rank-notes` directory next to them is not a
/// rank state: the save refuses and the directory survives.
#[test]
fn a_sharded_save_deletes_only_rank_states_it_wrote() {
    let _rng = rng_lock();
    let dir = temp_dir("sharded");
    std::fs::create_dir_all(dir.join("rank-notes")).unwrap();
    std::fs::write(dir.join("rank-notes").join("todo.txt"), "keep").unwrap();
    let config = AcceleratorConfig {
        parallelism: afterburner_accelerator::ParallelismConfig {
            strategy: StrategyConfig::Zero1(Default::default()),
            devices: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let model = vit(1);
    let target = dir.clone();
    let results = Accelerator::<B>::run(config, move |acc| {
        let (model, optim) = acc.setup(model.clone(), SgdConfig::new().init())?;
        Ok(acc.save_state(&target, &model, &optim, &0.1).is_err())
    })
    .unwrap();
    assert_eq!(results, vec![true, true], "every rank's save fails");
    assert_eq!(
        std::fs::read_to_string(dir.join("rank-notes").join("todo.txt")).unwrap(),
        "keep"
    );
    std::fs::remove_dir_all(dir).ok();
}
