//! Issue 11, finding 5: a state directory edited by hand or by an attacker is refused before
//! anything is read outside it, hangs or changes: manifest entries must be plain names of
//! regular files of the listed size, listed once; counters must be ones a run can produce.

mod common;

use std::path::{Path, PathBuf};

use afterburner_accelerator::{AccelerateError, Accelerator, AcceleratorConfig};
use afterburner_demos::models::Vit;
use burn::optim::SgdConfig;
use common::{B, rng_lock, vit};
use serde_json::Value;

fn saved_state(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("afterburner-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    acc.save_state(&dir, &vit(1), &optim, &0.1).unwrap();
    dir
}

fn load(dir: &Path) -> Result<(), AccelerateError> {
    let mut acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default())?;
    let optim = SgdConfig::new().init::<B, Vit<B>>();
    acc.load_state(dir, vit(2), optim, 0.1).map(|_| ())
}

/// Rewrites the manifest's file list with `edit`.
fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut Vec<Value>)) {
    let path = dir.join("manifest.json");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let files = manifest["files"].as_array_mut().unwrap();
    edit(files);
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
}

fn corrupt_message(result: Result<(), AccelerateError>) -> String {
    match result {
        Err(e @ AccelerateError::Corrupt { .. }) => e.to_string(),
        other => panic!("expected a Corrupt error, got {other:?}"),
    }
}

#[test]
fn entries_outside_the_directory_are_refused() {
    let _rng = rng_lock();
    for name in ["../model.mpk", "/etc/passwd", "sub/model.mpk", ".."] {
        let dir = saved_state("outside");
        edit_manifest(&dir, |files| files[0]["name"] = name.into());
        let err = corrupt_message(load(&dir));
        assert!(err.contains("plain file name"), "{name}: {err}");
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_file_listed_twice_is_refused() {
    let _rng = rng_lock();
    let dir = saved_state("twice");
    edit_manifest(&dir, |files| {
        let first = files[0].clone();
        files.push(first);
    });
    assert!(corrupt_message(load(&dir)).contains("twice"));
    std::fs::remove_dir_all(dir).ok();
}

#[cfg(unix)]
#[test]
fn a_fifo_or_a_link_in_place_of_a_file_is_refused_without_reading() {
    let _rng = rng_lock();
    let dir = saved_state("fifo");
    let model = dir.join("model.mpk");
    std::fs::remove_file(&model).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&model).status();
    if made.is_ok_and(|s| s.success()) {
        // Reading a FIFO with no writer would block forever.
        assert!(corrupt_message(load(&dir)).contains("not a regular file"));
        std::fs::remove_file(&model).unwrap();
    }
    std::os::unix::fs::symlink("/dev/zero", &model).unwrap();
    assert!(corrupt_message(load(&dir)).contains("not a regular file"));
    std::fs::remove_dir_all(dir).ok();
}

/// A huge sparse file (4 TiB of holes) listed at its size: refused before any read, naming the
/// memory available, instead of an allocation that aborts the process.
#[test]
fn a_file_larger_than_memory_is_refused_before_reading() {
    let _rng = rng_lock();
    let dir = saved_state("sparse");
    let model = dir.join("model.mpk");
    let huge = 4u64 << 40;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap();
    if file.set_len(huge).is_err() {
        println!("this file system cannot hold a 4 TiB sparse file; skipped");
        return;
    }
    edit_manifest(&dir, |files| {
        let entry = files.iter_mut().find(|f| f["name"] == "model.mpk").unwrap();
        entry["bytes"] = huge.into();
    });
    let err = load(&dir).unwrap_err();
    assert!(
        matches!(err, AccelerateError::TooLarge { bytes, .. } if bytes >= huge),
        "{err}"
    );
    assert!(err.to_string().contains("memory"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn counters_no_run_can_produce_are_refused() {
    let _rng = rng_lock();
    let dir = saved_state("counters");
    let path = dir.join("accelerator.json");
    let mut state: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    state["counters"]["optimizer_steps"] = 1_000_000.into();
    let bytes = serde_json::to_vec(&state).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    // Keep the manifest consistent, as a careful attacker would.
    let crc = crc32(&bytes);
    edit_manifest(&dir, |files| {
        for f in files.iter_mut().filter(|f| f["name"] == "accelerator.json") {
            f["bytes"] = bytes.len().into();
            f["crc32"] = crc.into();
        }
    });
    assert!(corrupt_message(load(&dir)).contains("counters"));
    std::fs::remove_dir_all(dir).ok();
}

/// CRC-32 (IEEE), as the manifest records it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
