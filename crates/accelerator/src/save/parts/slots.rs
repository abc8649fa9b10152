//! The slots behind each kind of part: how a model, an optimizer, a scheduler or a value
//! encodes, stages a load (decodes, changing nothing) and commits it.

use std::any::Any;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use afterburner_parallel::{OptimizerRecord, ParallelStrategy, param_ids, param_positions};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::checks::{has_nonfinite, load_checked, load_structure};
use super::{Mode, Part, Slot, StateParts, Stateful, part_file, rank_files};
use crate::save::codec::{decode_record, encode};
use crate::{AccelerateError, Accelerator};

/// An encoding error (the part's name is added by the caller).
fn encoding_failed(reason: String) -> AccelerateError {
    AccelerateError::InvalidPart {
        part: String::new(),
        reason: format!("encoding: {reason}"),
    }
}

pub(super) struct ModelSlot<'a, M> {
    model: &'a mut M,
    /// Under a gathered load: the full-shaped model first, then with the record loaded.
    staged: Option<M>,
}

impl<'a, M> ModelSlot<'a, M> {
    pub(super) fn new(model: &'a mut M) -> Self {
        Self {
            model,
            staged: None,
        }
    }
}

impl<B, S, M> Slot<B, S> for ModelSlot<'_, M>
where
    B: AutodiffBackend,
    S: ParallelStrategy<B>,
    M: AutodiffModule<B> + 'static,
{
    fn encode(&self, _acc: &Accelerator<B, S>) -> Result<Vec<u8>, AccelerateError> {
        encode::<B, _>(self.model.clone().into_record())
    }

    /// The full model (a collective), encoded by the rank that writes.
    fn gather(
        &self,
        acc: &Accelerator<B, S>,
        _parts: &StateParts<'_, B, S>,
        _local: Vec<u8>,
    ) -> Result<Vec<u8>, AccelerateError> {
        let full = acc.strategy.full_model(&*self.model)?;
        match acc.is_main_process() {
            true => encode::<B, _>(full.into_record()),
            false => Ok(Vec::new()),
        }
    }

    /// Under a gathered save the model is encoded from its full form only.
    fn encodes_locally(&self) -> bool {
        false
    }

    fn prepare_load(&mut self, acc: &Accelerator<B, S>, mode: Mode) -> Result<(), AccelerateError> {
        if mode == Mode::Gathered {
            self.staged = Some(acc.strategy.full_model(&*self.model)?);
        }
        Ok(())
    }

    fn stage(
        &mut self,
        acc: &Accelerator<B, S>,
        _mode: Mode,
        bytes: Vec<u8>,
        path: &Path,
        _models: &[Part<'_, B, S>],
    ) -> Result<(), AccelerateError> {
        let record = decode_record::<B, M::Record>(bytes, &acc.device, path, "model")?;
        let template = self.staged.take().unwrap_or_else(|| self.model.clone());
        self.staged = Some(load_checked(&template, record)?);
        Ok(())
    }

    fn commit(&mut self, acc: &mut Accelerator<B, S>, mode: Mode) -> Result<(), AccelerateError> {
        let Some(loaded) = self.staged.take() else {
            return Ok(());
        };
        let loaded = acc.precision.to_param_dtype(loaded);
        let loaded = match mode {
            Mode::Local => loaded,
            Mode::Gathered => acc.strategy.shard_full_state(loaded)?,
        };
        acc.strategy.after_load(&loaded)?;
        *self.model = loaded;
        Ok(())
    }

    fn model(&self) -> Option<&dyn Any> {
        Some(&*self.model)
    }

    fn has_nonfinite(&self) -> bool {
        has_nonfinite(&*self.model)
    }

    fn staged_model(&self) -> Option<&dyn Any> {
        self.staged.as_ref().map(|m| m as &dyn Any)
    }

    fn is_model(&self) -> bool {
        true
    }

    /// Under a merged load: the full model the strategy joins from the saved ranks' models
    /// (FSDP: every rank's shards; by default rank 0's copy, the only one decoded), encoded.
    fn merge_ranks(
        &self,
        acc: &Accelerator<B, S>,
        _parts: &StateParts<'_, B, S>,
        name: &str,
        ranks: &[PathBuf],
    ) -> Result<Option<Vec<u8>>, AccelerateError> {
        let file = part_file(name);
        let load = |rank: usize| -> Result<M, AccelerateError> {
            let dir = &ranks[rank];
            let [bytes] = rank_files(&*acc.checkpointer, dir, [&file])?;
            let record =
                decode_record::<B, M::Record>(bytes, &acc.device, &dir.join(&file), "model")?;
            load_structure(&*self.model, record)
        };
        let full = acc.strategy.join_saved_models(ranks.len(), load)?;
        Ok(Some(encode::<B, _>(full.into_record())?))
    }
}

pub(super) struct OptimizerSlot<'a, M, O: Optimizer<M, B>, B: AutodiffBackend>
where
    M: AutodiffModule<B>,
{
    optimizer: &'a mut O,
    staged: Option<O::Record>,
    model: PhantomData<M>,
}

impl<'a, B, M, O> OptimizerSlot<'a, M, O, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + 'static,
    O: Optimizer<M, B>,
{
    pub(super) fn new(optimizer: &'a mut O) -> Self {
        Self {
            optimizer,
            staged: None,
            model: PhantomData,
        }
    }

    fn no_model() -> AccelerateError {
        AccelerateError::InvalidPart {
            part: std::any::type_name::<O>().into(),
            reason: format!(
                "a full (gathered) state saves an optimizer with its model: add the {} as a \
                 model part",
                std::any::type_name::<M>()
            ),
        }
    }
}

impl<B, S, M, O> Slot<B, S> for OptimizerSlot<'_, M, O, B>
where
    B: AutodiffBackend,
    S: ParallelStrategy<B>,
    M: AutodiffModule<B> + 'static,
    O: Optimizer<M, B>,
{
    fn encode(&self, _acc: &Accelerator<B, S>) -> Result<Vec<u8>, AccelerateError> {
        encode::<B, _>(self.optimizer.to_record())
    }

    fn gather(
        &self,
        acc: &Accelerator<B, S>,
        parts: &StateParts<'_, B, S>,
        local: Vec<u8>,
    ) -> Result<Vec<u8>, AccelerateError> {
        let model = parts.model_of::<M>().ok_or_else(Self::no_model)?;
        let local = OptimizerRecord::from_bytes(&local)?;
        Ok(acc
            .strategy
            .gather_optimizer_record(model, local, &acc.device)?
            .to_bytes()?)
    }

    fn stage(
        &mut self,
        acc: &Accelerator<B, S>,
        mode: Mode,
        bytes: Vec<u8>,
        path: &Path,
        models: &[Part<'_, B, S>],
    ) -> Result<(), AccelerateError> {
        let bytes = match mode {
            Mode::Local => bytes,
            Mode::Gathered => {
                // The record names parameters by the ids of the model just loaded.
                let full = models
                    .iter()
                    .find_map(|(_, slot)| slot.staged_model()?.downcast_ref::<M>())
                    .ok_or_else(Self::no_model)?;
                let record = OptimizerRecord::from_bytes(&bytes)
                    .map_err(|e| AccelerateError::mismatched(path, "optimizer state", e))?;
                acc.strategy
                    .shard_optimizer_record(full, record)?
                    .to_bytes()?
            }
        };
        self.staged = Some(decode_record::<B, O::Record>(
            bytes,
            &acc.device,
            path,
            "optimizer state",
        )?);
        Ok(())
    }

    fn commit(&mut self, _acc: &mut Accelerator<B, S>, _mode: Mode) -> Result<(), AccelerateError> {
        if let Some(record) = self.staged.take() {
            *self.optimizer = self.optimizer.clone().load_record(record);
        }
        Ok(())
    }

    /// Every saved rank's optimizer states in one record, keyed by the parameter ids of rank
    /// 0's model (the one a merged load stages): each rank's record is re-keyed through its
    /// own saved model, whose ids may differ. One saved rank in memory at a time.
    fn merge_ranks(
        &self,
        acc: &Accelerator<B, S>,
        parts: &StateParts<'_, B, S>,
        name: &str,
        ranks: &[PathBuf],
    ) -> Result<Option<Vec<u8>>, AccelerateError> {
        let (model_name, template) = parts
            .parts
            .iter()
            .find_map(|(n, s)| Some((n, s.model()?.downcast_ref::<M>()?)))
            .ok_or_else(Self::no_model)?;
        let (model_file, own_file) = (part_file(model_name), part_file(name));
        let mut records = Vec::with_capacity(ranks.len());
        let mut ids_of_rank_0 = None;
        for dir in ranks {
            let [model, own] = rank_files(&*acc.checkpointer, dir, [&model_file, &own_file])?;
            let path = dir.join(&model_file);
            let record = decode_record::<B, M::Record>(model, &acc.device, &path, "model")?;
            let saved_model = load_structure(template, record)?;
            let own = OptimizerRecord::from_bytes(&own).map_err(|e| {
                AccelerateError::mismatched(dir.join(&own_file), "optimizer state", e)
            })?;
            records.push((own, param_positions(&saved_model)));
            ids_of_rank_0.get_or_insert_with(|| param_ids(&saved_model));
        }
        let ids = ids_of_rank_0.unwrap_or_default();
        let joined = acc.strategy.join_saved_optimizer_records(records, &ids)?;
        Ok(Some(joined.to_bytes()?))
    }
}

pub(super) struct SchedulerSlot<'a, L: LrScheduler, B: AutodiffBackend> {
    scheduler: &'a mut L,
    staged: Option<L::Record<B>>,
}

impl<'a, B: AutodiffBackend, L: LrScheduler> SchedulerSlot<'a, L, B> {
    pub(super) fn new(scheduler: &'a mut L) -> Self {
        Self {
            scheduler,
            staged: None,
        }
    }
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>, L: LrScheduler> Slot<B, S>
    for SchedulerSlot<'_, L, B>
{
    fn encode(&self, _acc: &Accelerator<B, S>) -> Result<Vec<u8>, AccelerateError> {
        encode::<B, _>(self.scheduler.to_record::<B>())
    }

    fn stage(
        &mut self,
        acc: &Accelerator<B, S>,
        _mode: Mode,
        bytes: Vec<u8>,
        path: &Path,
        _models: &[Part<'_, B, S>],
    ) -> Result<(), AccelerateError> {
        self.staged = Some(decode_record::<B, L::Record<B>>(
            bytes,
            &acc.device,
            path,
            "LR scheduler state",
        )?);
        Ok(())
    }

    fn commit(&mut self, _acc: &mut Accelerator<B, S>, _mode: Mode) -> Result<(), AccelerateError> {
        if let Some(record) = self.staged.take() {
            *self.scheduler = self.scheduler.clone().load_record::<B>(record);
        }
        Ok(())
    }
}

/// A value saved through a pair of conversions to and from bytes: a serde value (named
/// MessagePack: exact floats, NaN included) or a [`Stateful`] object.
pub(super) struct ValueSlot<'a, T> {
    value: &'a mut T,
    staged: Option<T>,
    to_bytes: fn(&T) -> Result<Vec<u8>, String>,
    /// The value with the bytes loaded, from the current one (a new value: nothing changes
    /// until commit).
    from_bytes: fn(&T, &[u8]) -> Result<T, String>,
}

impl<'a, T: Serialize + DeserializeOwned> ValueSlot<'a, T> {
    pub(super) fn serde(value: &'a mut T) -> Self {
        Self {
            value,
            staged: None,
            to_bytes: |v| rmp_serde::to_vec_named(v).map_err(|e| e.to_string()),
            from_bytes: |_, bytes| rmp_serde::from_slice(bytes).map_err(|e| e.to_string()),
        }
    }
}

impl<'a, T: Stateful> ValueSlot<'a, T> {
    pub(super) fn stateful(value: &'a mut T) -> Self {
        Self {
            value,
            staged: None,
            to_bytes: T::to_state_bytes,
            from_bytes: T::with_state_bytes,
        }
    }
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>, T> Slot<B, S> for ValueSlot<'_, T> {
    fn encode(&self, _acc: &Accelerator<B, S>) -> Result<Vec<u8>, AccelerateError> {
        (self.to_bytes)(self.value).map_err(encoding_failed)
    }

    fn stage(
        &mut self,
        _acc: &Accelerator<B, S>,
        _mode: Mode,
        bytes: Vec<u8>,
        path: &Path,
        _models: &[Part<'_, B, S>],
    ) -> Result<(), AccelerateError> {
        let loaded = (self.from_bytes)(self.value, &bytes)
            .map_err(|e| AccelerateError::mismatched(path, "value", e))?;
        self.staged = Some(loaded);
        Ok(())
    }

    fn commit(&mut self, _acc: &mut Accelerator<B, S>, _mode: Mode) -> Result<(), AccelerateError> {
        if let Some(loaded) = self.staged.take() {
            *self.value = loaded;
        }
        Ok(())
    }
}
