//! Gathered full states (a strategy whose layout is `StateLayout::Gathered`, e.g. FSDP with
//! `fsdp.state_dict_type = "full"`): parameters and optimizer state gathered from every rank and
//! written by rank 0 as an ordinary state directory, which loads into a single-device or DDP run
//! as is, and back into such a strategy at any world size (sharded again). The strategy does the
//! gathering and sharding; this file does the files and the ranks' agreement.

use std::path::Path;

use afterburner_parallel::TrainingStrategy;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;

use crate::state::{decode_record, encode};
use crate::{AccelerateError, Accelerator};

impl<B: AutodiffBackend> Accelerator<B> {
    /// Every rank gathers; rank 0 writes; every rank learns whether it worked.
    pub(crate) fn save_full_state<M, O, S>(
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
        // Everything that can fail on one rank alone, before any collective.
        let prepared = (|| {
            self.check_save_target(dir)?;
            encode::<B, _>(optimizer.to_record())
        })();
        self.all_ranks_succeeded(&prepared, "save_state")?;
        let sharded = prepared?;
        let full = self.strategy.full_model(model)?;
        let gathered = self
            .strategy
            .gather_optimizer_record(model, sharded, &self.device);
        let written = match gathered {
            Ok(optimizer) if self.is_main_process() => (|| {
                let model = encode::<B, _>(full.into_record())?;
                let scheduler = encode::<B, _>(scheduler.to_record::<B>())?;
                self.write_encoded(dir, model, optimizer, scheduler)
            })(),
            Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        };
        self.all_ranks_succeeded(&written, "save_state")?;
        written
    }

    /// Loads a full state into the strategy's `model`: each rank keeps its part of every
    /// parameter and optimizer state tensor, whatever world size saved it.
    pub(crate) fn load_full_state<M, O, S>(
        &mut self,
        dir: &Path,
        model: M,
        optimizer: O,
        scheduler: S,
    ) -> Result<(M, O, S), AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: LrScheduler,
    {
        // A full-shaped model to load the record into (every rank: a collective).
        let template = self.strategy.full_model(&model)?;
        let decoded = self.decode_with::<M, O, S>(dir, |model_bytes, optimizer| {
            // The record's parameter ids, on the full model.
            let record = decode_record::<B, M::Record>(model_bytes.to_vec(), &self.device, dir)?;
            let loaded = template.clone().load_record(record);
            Ok(self.strategy.shard_optimizer_record(&loaded, optimizer)?)
        });
        self.all_ranks_succeeded(&decoded, "load_state")?;
        let ((full, optimizer, scheduler), restored) =
            self.load_records(decoded?, template, optimizer, scheduler);
        let model = self.strategy.shard_full_state(full)?;
        self.strategy.after_load(&model)?;
        self.restore(restored);
        Ok((model, optimizer, scheduler))
    }
}
