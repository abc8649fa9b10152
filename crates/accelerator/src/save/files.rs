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
/// Directory name prefix of one rank's part of a sharded state.
pub(crate) const RANK_PREFIX: &str = "rank-";

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

/// A new hidden sibling of `dir` for a save: `.<name>.<tag>-<pid>-<nanos>`.
pub(crate) fn unique_sibling(dir: &Path, tag: &str) -> PathBuf {
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

/// Writes `files` as the state directory `dir`, atomically: into a temporary sibling, then
/// swapped into place ([`swap_into_place`]). A crashed save's leftovers next to `dir` are
/// cleaned first.
pub(crate) fn write_atomically(
    dir: &Path,
    files: &[(String, Vec<u8>)],
) -> Result<(), AccelerateError> {
    let tmp = new_staging_dir(dir)?;
    let result = write_state_files(&tmp, files).and_then(|()| swap_into_place(&tmp, dir));
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// Creates `dir`'s parent, recovers or cleans what a crashed save left next to `dir`, and
/// creates an empty temporary sibling (`.<name>.tmp-<pid>-<nanos>`) to write the new state in.
pub(crate) fn new_staging_dir(dir: &Path) -> Result<PathBuf, AccelerateError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| AccelerateError::io("creating", parent, e))?;
    }
    recover_moved_aside(dir);
    clean_debris(dir);
    let tmp = unique_sibling(dir, "tmp");
    fs::create_dir(&tmp).map_err(|e| AccelerateError::io("creating", &tmp, e))?;
    Ok(tmp)
}

/// Writes `files` and their manifest (last) into the existing empty directory `dir`, each
/// file fsynced.
pub(crate) fn write_state_files(
    dir: &Path,
    files: &[(String, Vec<u8>)],
) -> Result<(), AccelerateError> {
    let mut entries = Vec::new();
    for (name, bytes) in files {
        write_synced(&dir.join(name), bytes)?;
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
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| AccelerateError::InvalidPart {
        part: MANIFEST.into(),
        reason: e.to_string(),
    })?;
    write_synced(&dir.join(MANIFEST), &json)
}

/// Replaces `dir` (absent or a state) by the complete state `tmp`: the previous state is moved
/// aside, `tmp` renamed in, the parent fsynced, then the previous state deleted. A crash at any
/// point leaves either state complete ([`recover_moved_aside`] puts back one moved aside).
pub(crate) fn swap_into_place(tmp: &Path, dir: &Path) -> Result<(), AccelerateError> {
    let old = unique_sibling(dir, "old");
    let had_old = dir.exists();
    if had_old {
        fs::rename(dir, &old).map_err(|e| AccelerateError::io("moving aside", dir, e))?;
    }
    if let Err(e) = fs::rename(tmp, dir) {
        if had_old {
            let _ = fs::rename(&old, dir);
        }
        return Err(AccelerateError::io("renaming into place", dir, e));
    }
    sync_parent(dir);
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
}

/// A crashed save's leftovers next to `dir` with `tag` ("tmp": a state being written,
/// "old": the previous state moved aside): directories named `.<name>.<tag>-<pid>-<nanos>`.
fn debris(dir: &Path, tag: &str) -> Vec<PathBuf> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Vec::new();
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let prefix = format!(".{}.{tag}-", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| {
            let entry_name = entry.file_name().to_string_lossy().into_owned();
            let ids = entry_name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split_once('-'));
            let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            ids.is_some_and(|(pid, nanos)| numeric(pid) && numeric(nanos))
                && entry.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|entry| entry.path())
        .collect();
    found.sort();
    found
}

/// After a crash between moving the previous state aside and renaming the new one in, `dir`
/// is missing and the previous state sits next to it: puts the newest such state back.
pub(crate) fn recover_moved_aside(dir: &Path) {
    if fs::symlink_metadata(dir).is_ok() {
        return;
    }
    let newest = debris(dir, "old")
        .into_iter()
        .filter(|old| is_state_dir(old))
        .max_by_key(|old| {
            old.to_string_lossy()
                .rsplit('-')
                .next()
                .and_then(|n| n.parse::<u128>().ok())
        });
    if let Some(old) = newest
        && fs::rename(&old, dir).is_ok()
    {
        tracing::warn!(state = %dir.display(), "recovered the state a crashed save had moved aside");
        sync_parent(dir);
    }
}

/// Removes a crashed save's leftovers next to `dir`: its temporary directories, and previous
/// states moved aside once `dir` itself is in place (only directories afterburner names so).
fn clean_debris(dir: &Path) {
    for tmp in debris(dir, "tmp")
        .into_iter()
        .filter(|d| holds_only_state_files(d))
    {
        let _ = fs::remove_dir_all(tmp);
    }
    if is_state_dir(dir) {
        // A previous state whose deletion was itself cut short has lost files (its manifest
        // too, maybe): what is left is still only state files.
        for old in debris(dir, "old")
            .into_iter()
            .filter(|d| holds_only_state_files(d))
        {
            let _ = fs::remove_dir_all(old);
        }
    }
}

/// Whether `dir` holds nothing but regular files named like a state's (`*.mpk`, `*.json`),
/// or nothing but rank directories of a sharded state holding only such files.
pub(crate) fn holds_only_state_files(dir: &Path) -> bool {
    only_state_entries(dir, true)
}

fn only_state_entries(dir: &Path, rank_dirs_allowed: bool) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().all(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(kind) = entry.file_type() else {
            return false;
        };
        match kind.is_dir() {
            true => {
                rank_dirs_allowed
                    && is_rank_dir_name(&name)
                    && only_state_entries(&entry.path(), false)
            }
            false => kind.is_file() && (name.ends_with(".mpk") || name.ends_with(".json")),
        }
    })
}

/// Makes the renames in `dir`'s parent durable (a no-op where directories cannot be synced).
fn sync_parent(dir: &Path) {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty())
        && let Ok(handle) = fs::File::open(parent)
    {
        let _ = handle.sync_all();
    }
}

/// Whether `dir` is a state directory afterburner wrote: a real directory (not a symbolic
/// link) whose manifest carries our versioned format tag and names every other file in it.
/// Only such a directory is ever replaced or deleted; a file that merely is called
/// `manifest.json`, or a user's file put inside a state, makes it foreign.
pub(crate) fn is_our_state_dir(dir: &Path) -> bool {
    let real_dir = fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
    let Some(manifest) = real_dir
        .then(|| fs::read(dir.join(MANIFEST)).ok())
        .flatten()
        .and_then(|bytes| serde_json::from_slice::<Manifest>(&bytes).ok())
        .filter(|m| m.format == FORMAT)
    else {
        return false;
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().all(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        name == MANIFEST || manifest.files.iter().any(|f| f.name == name)
    })
}

/// Errors unless `dir` is absent or a state directory afterburner wrote (see
/// [`is_our_state_dir`]); a symbolic link is refused, never replaced.
pub(crate) fn check_replaceable(dir: &Path) -> Result<(), AccelerateError> {
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        return Err(AccelerateError::StateDirIsLink {
            dir: dir.to_path_buf(),
            target: fs::read_link(dir).unwrap_or_default(),
        });
    }
    // A sharded state of ours (e.g. saved under ZeRO-1 before this DDP run) is replaced too.
    match is_our_state_dir(dir) || (meta.is_dir() && holds_only_rank_states(dir)) {
        true => Ok(()),
        false => Err(AccelerateError::NotAStateDir {
            dir: dir.to_path_buf(),
        }),
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), AccelerateError> {
    let mut file = fs::File::create(path).map_err(|e| AccelerateError::io("creating", path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| AccelerateError::io("writing", path, e))
}

/// Reads every file named by the manifest and checks its length and CRC-32.
pub(crate) fn read_verified(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, AccelerateError> {
    recover_moved_aside(dir);
    let manifest_path = dir.join(MANIFEST);
    let bytes = read_regular(&manifest_path, None, MAX_MANIFEST_BYTES)?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| AccelerateError::corrupt(&manifest_path, e))?;
    if manifest.format != FORMAT {
        return Err(AccelerateError::corrupt(
            &manifest_path,
            format!("format '{}', expected '{FORMAT}'", manifest.format),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for entry in &manifest.files {
        if !is_plain_name(&entry.name) || entry.name == MANIFEST {
            return Err(AccelerateError::corrupt(
                &manifest_path,
                format!(
                    "lists '{}', which is not a plain file name inside the state directory",
                    entry.name
                ),
            ));
        }
        if !seen.insert(entry.name.as_str()) {
            return Err(AccelerateError::corrupt(
                &manifest_path,
                format!("lists '{}' twice", entry.name),
            ));
        }
    }
    let listed: u64 = manifest
        .files
        .iter()
        .fold(0u64, |sum, f| sum.saturating_add(f.bytes));
    if let Some(available) = memory_available()
        && listed > available
    {
        return Err(AccelerateError::TooLarge {
            path: manifest_path,
            bytes: listed,
            available,
        });
    }
    manifest
        .files
        .into_iter()
        .map(|entry| {
            let path = dir.join(&entry.name);
            let bytes = read_regular(&path, Some(entry.bytes), u64::MAX)?;
            if crc32fast::hash(&bytes) != entry.crc32 {
                return Err(AccelerateError::corrupt(&path, "checksum mismatch"));
            }
            Ok((entry.name, bytes))
        })
        .collect()
}

/// The memory the system can still give (Linux `MemAvailable`); `None` where unknown.
fn memory_available() -> Option<u64> {
    let info = fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The largest manifest read (a real one is a few hundred bytes per part).
const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// A name with no directory part: not empty, no separator, not `.` or `..`.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && Path::new(name).is_relative()
}

/// Reads `path` only if it is a regular file (not a link, FIFO, device or directory) whose
/// size is `expected` (when given) and at most `limit` bytes, checked before reading: a
/// hostile state cannot make a load hang on a FIFO or read `/dev/zero`.
fn read_regular(
    path: &Path,
    expected: Option<u64>,
    limit: u64,
) -> Result<Vec<u8>, AccelerateError> {
    let meta = fs::symlink_metadata(path).map_err(|e| AccelerateError::io("reading", path, e))?;
    if !meta.file_type().is_file() {
        return Err(AccelerateError::corrupt(
            path,
            "not a regular file (a link, FIFO, device or directory)",
        ));
    }
    let len = meta.len();
    if let Some(expected) = expected
        && len != expected
    {
        return Err(AccelerateError::corrupt(
            path,
            format!("{len} bytes, the manifest says {expected} (truncated?)"),
        ));
    }
    if len > limit {
        return Err(AccelerateError::corrupt(
            path,
            format!("{len} bytes, more than the {limit} a state file may hold"),
        ));
    }
    let bytes = fs::read(path).map_err(|e| AccelerateError::io("reading", path, e))?;
    if bytes.len() as u64 != len {
        return Err(AccelerateError::corrupt(path, "changed while it was read"));
    }
    Ok(bytes)
}

/// Whether `dir` holds nothing but rank directories afterburner wrote (and an older version's
/// leftovers, `.rank-*` directories of state files): a sharded state of ours.
pub(crate) fn holds_only_rank_states(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().all(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        match name.strip_prefix('.') {
            None => is_rank_dir_name(&name) && is_our_state_dir(&entry.path()),
            Some(hidden) => {
                hidden.starts_with(RANK_PREFIX)
                    && entry.file_type().is_ok_and(|t| t.is_dir())
                    && holds_only_state_files(&entry.path())
            }
        }
    })
}

/// Whether `name` is a rank directory's name, `rank-<5 digits>-of-<5 digits>`.
pub(crate) fn is_rank_dir_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(RANK_PREFIX) else {
        return false;
    };
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    rest.split_once("-of-")
        .is_some_and(|(rank, world)| digits(rank) && digits(world))
}

/// Whether `dir` holds a complete afterburner state: a manifest of its own (a replicated or
/// gathered save) or rank directories with manifests (a sharded one).
pub fn is_state_dir(dir: &Path) -> bool {
    if is_our_state_dir(dir) {
        return true;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    let mut ranks = entries
        .flatten()
        .filter(|e| is_rank_dir_name(&e.file_name().to_string_lossy()))
        .peekable();
    ranks.peek().is_some() && ranks.all(|e| is_our_state_dir(&e.path()))
}
