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
//! decoding anything and changes nothing unless every file is intact (`state_files`).
//! Data parallel variants: one such directory per rank (`sharded_state`) and FSDP's gathered
//! full state (`full_state`).

use std::path::Path;

use afterburner_parallel::{StateLayout, TrainingStrategy};
use afterburner_precision::{GradScalerState, Precision};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::accelerator::Counters;
use crate::data::DataProgress;
use crate::state_files::{MANIFEST, read_verified, write_atomically};
use crate::{AccelerateError, Accelerator};

const MODEL: &str = "model.mpk";
const OPTIMIZER: &str = "optimizer.mpk";
const SCHEDULER: &str = "scheduler.mpk";
const ACCELERATOR: &str = "accelerator.json";

type StateRecorder = NamedMpkBytesRecorder<FullPrecisionSettings>;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AcceleratorState {
    precision: Precision,
    seed: u64,
    pub(crate) counters: Counters,
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
        let dir = dir.as_ref();
        match self.strategy.state_layout() {
            StateLayout::Gathered => self.save_full_state(dir, model, optimizer, scheduler),
            StateLayout::PerRank => self.save_sharded_state(dir, model, optimizer, scheduler),
            StateLayout::Replicated => {
                let written = if self.is_main_process() {
                    self.write_state(dir, model, optimizer, scheduler)
                } else {
                    Ok(())
                };
                self.barrier()?;
                written
            }
        }
    }

    pub(crate) fn write_state<M, O, S>(
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
        let dir = dir.as_ref();
        if self.strategy.state_layout() == StateLayout::Replicated {
            let decoded = self.decode(dir)?;
            return Ok(self.apply(decoded, model, optimizer, scheduler));
        }
        if self.strategy.loads_full_state() {
            let full = dir.join(MANIFEST).is_file();
            // Every rank must take the same path (each runs collectives).
            if !self.same_on_every_rank(&[f64::from(u8::from(full))])? {
                return Err(AccelerateError::Usage(format!(
                    "load_state: the ranks do not see the same state at {} (a full state on \
                     some, a sharded one on others)",
                    dir.display()
                )));
            }
            if full {
                return self.load_full_state(dir, model, optimizer, scheduler);
            }
        }
        self.load_sharded_state(dir, model, optimizer, scheduler)
    }

    /// Reads and decodes a state directory without changing anything.
    pub(crate) fn decode<M, O, S>(&self, dir: &Path) -> Result<Decoded<B, M, O, S>, AccelerateError>
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
    pub(crate) state: AcceleratorState,
    scaler: Option<afterburner_precision::GradScaler>,
    model: M::Record,
    optimizer: O::Record,
    scheduler: S::Record<B>,
}
