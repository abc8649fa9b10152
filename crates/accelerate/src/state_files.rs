//! The on-disk side of a saved state: a directory written atomically (temporary sibling,
//! fsync, rename) with a manifest of every file's length and CRC-32, and read back only when
//! every file checks out.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::AccelerateError;

const FORMAT: &str = "afterburner-state-v1";
/// Written last; a directory holding it is a state directory.
pub(crate) const MANIFEST: &str = "manifest.json";

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: String,
    files: Vec<FileEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileEntry {
    name: String,
    bytes: u64,
    crc32: u32,
}

fn unique_sibling(dir: &Path, tag: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!(".{name}.{tag}-{}-{nanos}", std::process::id()))
}

pub(crate) fn write_atomically(
    dir: &Path,
    files: &[(String, Vec<u8>)],
) -> Result<(), AccelerateError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| AccelerateError::io("creating", parent, e))?;
    }
    let tmp = unique_sibling(dir, "tmp");
    let result = (|| {
        fs::create_dir(&tmp).map_err(|e| AccelerateError::io("creating", &tmp, e))?;
        let mut entries = Vec::new();
        for (name, bytes) in files {
            write_synced(&tmp.join(name), bytes)?;
            entries.push(FileEntry {
                name: name.clone(),
                bytes: bytes.len() as u64,
                crc32: crc32fast::hash(bytes),
            });
        }
        let manifest = Manifest {
            format: FORMAT.to_string(),
            files: entries,
        };
        let json =
            serde_json::to_vec_pretty(&manifest).map_err(|e| AccelerateError::InvalidPart {
                part: MANIFEST.into(),
                reason: e.to_string(),
            })?;
        write_synced(&tmp.join(MANIFEST), &json)?;
        let old = unique_sibling(dir, "old");
        let had_old = dir.exists();
        if had_old {
            fs::rename(dir, &old).map_err(|e| AccelerateError::io("moving aside", dir, e))?;
        }
        if let Err(e) = fs::rename(&tmp, dir) {
            if had_old {
                let _ = fs::rename(&old, dir);
            }
            return Err(AccelerateError::io("renaming into place", dir, e));
        }
        if had_old {
            let _ = fs::remove_dir_all(&old);
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), AccelerateError> {
    let mut file = fs::File::create(path).map_err(|e| AccelerateError::io("creating", path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| AccelerateError::io("writing", path, e))
}

/// Reads every file named by the manifest and checks its length and CRC-32.
pub(crate) fn read_verified(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, AccelerateError> {
    let manifest_path = dir.join(MANIFEST);
    let bytes =
        fs::read(&manifest_path).map_err(|e| AccelerateError::io("reading", &manifest_path, e))?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| AccelerateError::corrupt(&manifest_path, e))?;
    if manifest.format != FORMAT {
        return Err(AccelerateError::corrupt(
            &manifest_path,
            format!("format '{}', expected '{FORMAT}'", manifest.format),
        ));
    }
    manifest
        .files
        .into_iter()
        .map(|entry| {
            let path = dir.join(&entry.name);
            let bytes = fs::read(&path).map_err(|e| AccelerateError::io("reading", &path, e))?;
            if bytes.len() as u64 != entry.bytes {
                return Err(AccelerateError::corrupt(
                    &path,
                    format!(
                        "{} bytes, the manifest says {} (truncated?)",
                        bytes.len(),
                        entry.bytes
                    ),
                ));
            }
            if crc32fast::hash(&bytes) != entry.crc32 {
                return Err(AccelerateError::corrupt(&path, "checksum mismatch"));
            }
            Ok((entry.name, bytes))
        })
        .collect()
}
