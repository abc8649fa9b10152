//! Save and resume the whole training state, atomically and verified.
//!
//! A state directory holds:
//! - `model.mpk`, `optimizer.mpk`, `scheduler.mpk`: Burn records in named MessagePack at full
//!   precision (f32 for the `*-true` modes too; they are cast back on load);
//! - `accelerator.json`: counters, loss-scaler state, seed, data position;
//! - `manifest.json`, written last: the format tag and each file's length and CRC-32.
//!
//! Saving writes a temporary sibling directory, syncs it and renames it into place, so a crash
//! leaves either the old state or the new one, never a mix. Loading checks the manifest before
//! decoding anything and changes nothing unless every file is intact.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use afterburner_precision::{GradScalerState, Precision};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::accelerator::Counters;
use crate::data::DataProgress;
use crate::{AccelerateError, Accelerator};

const FORMAT: &str = "afterburner-state-v1";
const MANIFEST: &str = "manifest.json";
const MODEL: &str = "model.mpk";
const OPTIMIZER: &str = "optimizer.mpk";
const SCHEDULER: &str = "scheduler.mpk";
const ACCELERATOR: &str = "accelerator.json";

type StateRecorder = NamedMpkBytesRecorder<FullPrecisionSettings>;

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

#[derive(Debug, Serialize, Deserialize)]
struct AcceleratorState {
    precision: Precision,
    seed: u64,
    counters: Counters,
    scaler: Option<GradScalerState>,
    data: DataProgress,
}

impl<B: AutodiffBackend> Accelerator<B> {
    /// Saves model, optimizer, LR scheduler, loss scaler, counters, seed and data position to
    /// `dir`, replacing an earlier state there atomically. Errors in the middle of an
    /// accumulation cycle (the pending gradients would be lost) and if `dir` exists but is not
    /// a state directory (it is never overwritten then).
    ///
    /// Under DDP, rank 0 writes (every replica is identical) and every rank waits until it has.
    /// Under zero-1 it is refused (each rank holds part of the optimizer state).
    pub fn save_state<M, O, S>(
        &self,
        dir: impl AsRef<Path>,
        model: &M,
        optimizer: &O,
        scheduler: &S,
    ) -> Result<(), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        if self.fsdp.is_some() {
            return Err(AccelerateError::Usage(
                "save_state() under strategy fsdp is not supported yet: parameters and \
                 optimizer state are split across ranks; save the gathered weights with \
                 full_model() for now"
                    .into(),
            ));
        }
        if self.config.strategy == crate::Strategy::Zero1 {
            return Err(AccelerateError::Usage(
                "save_state() under strategy zero-1 is not supported yet: the optimizer state \
                 is split across ranks and a save would keep rank 0's part only; use ddp to \
                 save resumable states"
                    .into(),
            ));
        }
        let written = if self.is_main_process() {
            self.write_state(dir.as_ref(), model, optimizer, scheduler)
        } else {
            Ok(())
        };
        self.barrier()?;
        written
    }

    fn write_state<M, O, S>(
        &self,
        dir: &Path,
        model: &M,
        optimizer: &O,
        scheduler: &S,
    ) -> Result<(), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        if self.pending_micro_batches() > 0 {
            return Err(AccelerateError::Usage(format!(
                "save_state() in the middle of an accumulation cycle would lose {} pending \
                 micro-batch gradients; save right after a step()",
                self.pending_micro_batches()
            )));
        }
        if dir.exists() && !dir.join(MANIFEST).is_file() {
            return Err(AccelerateError::Usage(format!(
                "refusing to replace {}: it exists and is not an afterburner state directory",
                dir.display()
            )));
        }
        let recorder = StateRecorder::default();
        let encode =
            |e: burn::record::RecorderError| AccelerateError::Usage(format!("encoding state: {e}"));
        let state = AcceleratorState {
            precision: self.config.precision,
            seed: self.config.seed,
            counters: self.counters,
            scaler: self.scaler.as_ref().map(|s| s.state()),
            data: *self
                .progress
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        };
        let files: [(&str, Vec<u8>); 4] = [
            (
                MODEL,
                Recorder::<B>::record(&recorder, model.clone().into_record(), ())
                    .map_err(encode)?,
            ),
            (
                OPTIMIZER,
                Recorder::<B>::record(&recorder, optimizer.to_record(), ()).map_err(encode)?,
            ),
            (
                SCHEDULER,
                Recorder::<B>::record(&recorder, scheduler.to_record::<B>(), ()).map_err(encode)?,
            ),
            (
                ACCELERATOR,
                serde_json::to_vec_pretty(&state)
                    .map_err(|e| AccelerateError::Usage(e.to_string()))?,
            ),
        ];
        write_atomically(dir, &files)
    }

    /// Restores a state saved by [`save_state`](Self::save_state): returns the model, optimizer
    /// and scheduler and restores this Accelerator's counters, loss scale, RNG stream and data
    /// position. Every file is verified first; on any error nothing is changed.
    pub fn load_state<M, O, S>(
        &mut self,
        dir: impl AsRef<Path>,
        model: M,
        optimizer: O,
        scheduler: S,
    ) -> Result<(M, O, S), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        let dir = dir.as_ref();
        let files = read_verified(dir)?;
        let get = |name: &str| -> Result<Vec<u8>, AccelerateError> {
            files
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, b)| b.clone())
                .ok_or_else(|| {
                    AccelerateError::corrupt(dir.join(name), "missing from the manifest")
                })
        };
        let state: AcceleratorState = serde_json::from_slice(&get(ACCELERATOR)?)
            .map_err(|e| AccelerateError::corrupt(dir.join(ACCELERATOR), e))?;
        let recorder = StateRecorder::default();
        let decode = |name: &str| {
            let path = dir.join(name);
            move |e: burn::record::RecorderError| AccelerateError::corrupt(path, e)
        };
        let model_record =
            Recorder::<B>::load(&recorder, get(MODEL)?, &self.device).map_err(decode(MODEL))?;
        let optim_record = Recorder::<B>::load(&recorder, get(OPTIMIZER)?, &self.device)
            .map_err(decode(OPTIMIZER))?;
        let sched_record = Recorder::<B>::load(&recorder, get(SCHEDULER)?, &self.device)
            .map_err(decode(SCHEDULER))?;
        let mut scaler = self.scaler.clone();
        if let (Some(scaler), Some(saved)) = (&mut scaler, state.scaler) {
            scaler.load_state(saved)?;
        }
        if state.precision != self.config.precision {
            tracing::warn!(saved = %state.precision, now = %self.config.precision, "resuming under another precision");
        }
        if state.seed != self.config.seed {
            tracing::warn!(
                saved = state.seed,
                now = self.config.seed,
                "resuming with the saved seed"
            );
        }

        // Everything decoded: now apply.
        let model = self.to_param_dtype(model.load_record(model_record));
        self.scaler = scaler;
        self.config.seed = state.seed;
        self.counters = state.counters;
        *self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = state.data;
        self.reseed();
        Ok((
            model,
            optimizer.load_record(optim_record),
            scheduler.load_record::<B>(sched_record),
        ))
    }
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

fn write_atomically(dir: &Path, files: &[(&str, Vec<u8>)]) -> Result<(), AccelerateError> {
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
                name: (*name).to_string(),
                bytes: bytes.len() as u64,
                crc32: crc32fast::hash(bytes),
            });
        }
        let manifest = Manifest {
            format: FORMAT.to_string(),
            files: entries,
        };
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| AccelerateError::Usage(e.to_string()))?;
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
fn read_verified(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, AccelerateError> {
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
