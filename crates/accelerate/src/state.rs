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

use afterburner_parallel::{ProcessGroup, ReduceOp};
use afterburner_precision::{GradScalerState, Precision};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use serde::{Deserialize, Serialize};

use crate::accelerator::Counters;
use crate::data::DataProgress;
use crate::{AccelerateError, Accelerator, StateDictType};

const FORMAT: &str = "afterburner-state-v1";
const MANIFEST: &str = "manifest.json";
const MODEL: &str = "model.mpk";
const OPTIMIZER: &str = "optimizer.mpk";
const SCHEDULER: &str = "scheduler.mpk";
const ACCELERATOR: &str = "accelerator.json";
/// Directory name prefix of one rank's part of a sharded state.
const RANK_PREFIX: &str = "rank-";

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
    /// Under `zero-1` and `fsdp` each rank holds a different part of the state: every rank
    /// writes its own complete state directory, `dir/rank-<r>-of-<n>` (the sharded state, one
    /// per rank, loadable at the same world size), and the call fails on every rank if it
    /// failed on any. For the full weights, gather them with
    /// [`full_model`](Self::full_model).
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
        if let (Some(fsdp), StateDictType::Full) = (&self.fsdp, self.config.fsdp_state_dict_type) {
            return self.save_full_state(fsdp, dir.as_ref(), model, optimizer, scheduler);
        }
        if self.is_sharded() {
            let written = self.write_rank_state(dir.as_ref(), model, optimizer, scheduler);
            self.all_ranks_succeeded(&written, "save_state")?;
            if self.is_main_process() {
                remove_other_world_sizes(dir.as_ref(), self.world_size());
            }
            return written;
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
        self.check_save_target(dir)?;
        self.write_encoded(
            dir,
            encode::<B, _>(model.clone().into_record())?,
            encode::<B, _>(optimizer.to_record())?,
            encode::<B, _>(scheduler.to_record::<B>())?,
        )
    }

    /// Errors when saving now would lose pending gradients, or would replace `dir` although
    /// it is not a state directory.
    pub(crate) fn check_save_target(&self, dir: &Path) -> Result<(), AccelerateError> {
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
        Ok(())
    }

    /// Writes a state directory from encoded model, optimizer and scheduler records.
    pub(crate) fn write_encoded(
        &self,
        dir: &Path,
        model: Vec<u8>,
        optimizer: Vec<u8>,
        scheduler: Vec<u8>,
    ) -> Result<(), AccelerateError> {
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
            (MODEL, model),
            (OPTIMIZER, optimizer),
            (SCHEDULER, scheduler),
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
    /// position. Every file is verified first; on any error nothing is changed. Under `zero-1`
    /// and `fsdp` each rank loads its own directory (pass the model `setup` returned); if any
    /// rank cannot, every rank returns an error and none changes.
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
        let full = dir.as_ref().join(MANIFEST).is_file();
        if self.fsdp.is_some() {
            // Every rank must take the same path (each runs collectives).
            if !self.same_on_every_rank(&[f64::from(u8::from(full))])? {
                return Err(AccelerateError::Usage(format!(
                    "load_state: the ranks do not see the same state at {} (a full state on \
                     some, a sharded one on others)",
                    dir.as_ref().display()
                )));
            }
            if full {
                return self.load_full_state(dir.as_ref(), model, optimizer, scheduler);
            }
        }
        if !self.is_sharded() {
            let decoded = self.decode(dir.as_ref())?;
            return Ok(self.apply(decoded, model, optimizer, scheduler));
        }
        let mine = self.rank_dir(dir.as_ref());
        let decoded = match mine.is_dir() {
            true => self.decode(&mine),
            false => Err(missing_rank_dir(dir.as_ref(), &mine, self.world_size())),
        };
        self.all_ranks_succeeded(&decoded, "load_state")?;
        let decoded = decoded?;
        // The parts must come from one save: a save that failed on some rank leaves the
        // others' newer parts next to its older one.
        let c = decoded.state.counters;
        let counters = [c.optimizer_steps, c.skipped_steps, c.micro_batches].map(|v| v as f64);
        if !self.same_on_every_rank(&counters)? {
            return Err(AccelerateError::Usage(format!(
                "load_state: the ranks' parts in {} come from different saves (their step \
                 counters differ); nothing was loaded",
                dir.as_ref().display()
            )));
        }
        let ((model, optimizer, scheduler), saved) =
            self.load_records(decoded, model, optimizer, scheduler);
        if let Some(fsdp) = &self.fsdp {
            fsdp.after_step(&model)?;
        }
        self.restore(saved);
        Ok((model, optimizer, scheduler))
    }

    /// Whether every rank holds a different part of the state (`zero-1`, sharded `fsdp`).
    fn is_sharded(&self) -> bool {
        self.fsdp.is_some() || self.config.strategy == crate::Strategy::Zero1
    }

    fn rank_dir(&self, dir: &Path) -> PathBuf {
        dir.join(format!(
            "{RANK_PREFIX}{:05}-of-{:05}",
            self.rank(),
            self.world_size()
        ))
    }

    /// This rank's part of a sharded save.
    fn write_rank_state<M, O, S>(
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
        if dir.join(MANIFEST).is_file() {
            return Err(AccelerateError::Usage(format!(
                "refusing to write a sharded state into {}: it holds a single-rank state",
                dir.display()
            )));
        }
        if let Ok(entries) = fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !(name.starts_with(RANK_PREFIX) || name.starts_with('.')) {
                    return Err(AccelerateError::Usage(format!(
                        "refusing to write a sharded state into {}: it holds '{name}', which is \
                         not part of an afterburner state",
                        dir.display()
                    )));
                }
            }
        }
        self.write_state(&self.rank_dir(dir), model, optimizer, scheduler)
    }

    /// Tells every rank whether every rank's `result` is Ok; an error on another rank becomes
    /// an error here too.
    pub(crate) fn all_ranks_succeeded<T>(
        &self,
        result: &Result<T, AccelerateError>,
        what: &str,
    ) -> Result<(), AccelerateError> {
        let Some(ddp) = &self.ddp else {
            return Ok(());
        };
        let ok = f32::from(u8::from(result.is_ok()));
        let flags = Tensor::<B::InnerBackend, 1>::from_floats([ok], &self.device);
        let sum = ddp.group().all_reduce(flags, ReduceOp::Sum)?.into_scalar();
        let failed = self.world_size() - sum.elem::<f32>().round() as usize;
        if failed > 0 && result.is_ok() {
            return Err(AccelerateError::Usage(format!(
                "{what} failed on {failed} other rank(s); nothing was changed here"
            )));
        }
        Ok(())
    }

    /// Reads and decodes a state directory without changing anything.
    fn decode<M, O, S>(&self, dir: &Path) -> Result<Decoded<B, M, O, S>, AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        self.decode_with(dir, |_, optimizer| Ok(optimizer))
    }

    /// [`decode`](Self::decode), with the encoded optimizer record passed through
    /// `optimizer_bytes(model_bytes, optimizer_bytes)` first.
    pub(crate) fn decode_with<M, O, S>(
        &self,
        dir: &Path,
        optimizer_bytes: impl FnOnce(&[u8], Vec<u8>) -> Result<Vec<u8>, AccelerateError>,
    ) -> Result<Decoded<B, M, O, S>, AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
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
        let model_bytes = get(MODEL)?;
        let optimizer = optimizer_bytes(&model_bytes, get(OPTIMIZER)?)?;
        let model =
            Recorder::<B>::load(&recorder, model_bytes, &self.device).map_err(decode(MODEL))?;
        let optimizer =
            Recorder::<B>::load(&recorder, optimizer, &self.device).map_err(decode(OPTIMIZER))?;
        let scheduler = Recorder::<B>::load(&recorder, get(SCHEDULER)?, &self.device)
            .map_err(decode(SCHEDULER))?;
        let mut scaler = self.scaler.clone();
        if let (Some(scaler), Some(saved)) = (&mut scaler, state.scaler) {
            scaler.load_state(saved)?;
        }
        Ok(Decoded {
            state,
            scaler,
            model,
            optimizer,
            scheduler,
        })
    }

    /// Applies a decoded state (cannot fail).
    pub(crate) fn apply<M, O, S>(
        &mut self,
        decoded: Decoded<B, M, O, S>,
        model: M,
        optimizer: O,
        scheduler: S,
    ) -> (M, O, S)
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        let (loaded, saved) = self.load_records(decoded, model, optimizer, scheduler);
        self.restore(saved);
        loaded
    }

    /// The model, optimizer and scheduler with the decoded records loaded, and what
    /// [`restore`](Self::restore) then gives the Accelerator (nothing here changes yet).
    pub(crate) fn load_records<M, O, S>(
        &self,
        decoded: Decoded<B, M, O, S>,
        model: M,
        optimizer: O,
        scheduler: S,
    ) -> ((M, O, S), Restored)
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        let Decoded {
            state,
            scaler,
            model: model_record,
            optimizer: optim_record,
            scheduler: sched_record,
        } = decoded;
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
        let model = self.to_param_dtype(model.load_record(model_record));
        let loaded = (
            model,
            optimizer.load_record(optim_record),
            scheduler.load_record::<B>(sched_record),
        );
        (loaded, Restored { state, scaler })
    }

    /// Gives the Accelerator the loaded counters, loss scaler, seed and data position.
    pub(crate) fn restore(&mut self, restored: Restored) {
        let Restored { state, scaler } = restored;
        self.scaler = scaler;
        self.config.seed = state.seed;
        self.counters = state.counters;
        *self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = state.data;
        self.reseed();
    }

    /// Whether every rank passed the same `values` (small integers; two small all-reduces;
    /// true on one device): each rank checks that the sum over ranks is `world` times its own
    /// values, and the ranks then agree on the verdict.
    pub(crate) fn same_on_every_rank(&self, values: &[f64]) -> Result<bool, AccelerateError> {
        let Some(ddp) = &self.ddp else {
            return Ok(true);
        };
        let mine: Vec<f32> = values.iter().map(|v| *v as f32).collect();
        let tensor = Tensor::<B::InnerBackend, 1>::from_floats(mine.as_slice(), &self.device);
        let sums = ddp.group().all_reduce(tensor, ReduceOp::Sum)?;
        let sums = sums.into_data().to_vec::<f32>().unwrap_or_default();
        let world = self.world_size() as f32;
        let agree = sums.len() == mine.len()
            && sums
                .iter()
                .zip(&mine)
                .all(|(sum, v)| (sum - world * v).abs() < 0.5);
        let vote = f32::from(u8::from(agree));
        let vote = Tensor::<B::InnerBackend, 1>::from_floats([vote], &self.device);
        let votes = ddp.group().all_reduce(vote, ReduceOp::Sum)?.into_scalar();
        Ok(votes.elem::<f32>().round() as usize == self.world_size())
    }
}

/// What a load gives the Accelerator once nothing else can fail.
pub(crate) struct Restored {
    state: AcceleratorState,
    scaler: Option<afterburner_precision::GradScaler>,
}

/// Encodes a record the way state files hold it.
pub(crate) fn encode<B: AutodiffBackend, R: burn::record::Record<B>>(
    record: R,
) -> Result<Vec<u8>, AccelerateError> {
    Recorder::<B>::record(&StateRecorder::default(), record, ())
        .map_err(|e| AccelerateError::Usage(format!("encoding state: {e}")))
}

/// Decodes a record the way state files hold it (`path` names it in errors).
pub(crate) fn decode_record<B: AutodiffBackend, R: burn::record::Record<B>>(
    bytes: Vec<u8>,
    device: &B::Device,
    path: &Path,
) -> Result<R, AccelerateError> {
    Recorder::<B>::load(&StateRecorder::default(), bytes, device)
        .map_err(|e| AccelerateError::corrupt(path, e))
}

/// A state read back, not applied yet.
pub(crate) struct Decoded<
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    S: LrScheduler,
> {
    state: AcceleratorState,
    scaler: Option<afterburner_precision::GradScaler>,
    model: M::Record,
    optimizer: O::Record,
    scheduler: S::Record<B>,
}

/// The error for a sharded load whose rank directory is missing, naming what is there.
fn missing_rank_dir(dir: &Path, mine: &Path, world: usize) -> AccelerateError {
    let mut found: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(RANK_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    AccelerateError::Usage(format!(
        "no sharded state for this rank at {} (world size {world}); found: [{}]. A sharded \
         state loads at the world size it was saved with",
        mine.display(),
        found.join(", ")
    ))
}

/// After a sharded save, drops rank directories of other world sizes (older saves).
fn remove_other_world_sizes(dir: &Path, world: usize) {
    let current = format!("-of-{world:05}");
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(RANK_PREFIX) && !name.ends_with(&current) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
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
