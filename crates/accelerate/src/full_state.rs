//! FSDP's full state (`fsdp_state_dict_type = "full"`): parameters and optimizer state gathered
//! from every rank and written by rank 0 as an ordinary state directory, which loads into a
//! single-device or DDP run as is, and into an FSDP run at any world size (sharded again).

use std::collections::HashMap;
use std::path::Path;

use afterburner_parallel::Fsdp;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;

use crate::distributed::Group;
use crate::record_tensors::{check_param_ids, map_state_tensors};
use crate::state::{decode_record, encode};
use crate::{AccelerateError, Accelerator};

/// Each parameter's layout index by its serialized `ParamId` (how records name parameters).
fn indices_by_id<B: AutodiffBackend, M: AutodiffModule<B>>(
    fsdp: &Fsdp<B, Group<B>>,
    model: &M,
) -> HashMap<String, usize> {
    fsdp.param_indices(model)
        .into_iter()
        .map(|(id, index)| (id.serialize(), index))
        .collect()
}

impl<B: AutodiffBackend> Accelerator<B> {
    /// Every rank gathers; rank 0 writes; every rank learns whether it worked.
    pub(crate) fn save_full_state<M, O, S>(
        &self,
        fsdp: &Fsdp<B, Group<B>>,
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
        let ids = indices_by_id(fsdp, model);
        // Everything that can fail on one rank alone, before any collective.
        let prepared = (|| {
            self.check_save_target(dir)?;
            let sharded = encode::<B, _>(optimizer.to_record())?;
            check_param_ids(&sharded, &ids)?;
            Ok(sharded)
        })();
        self.all_ranks_succeeded(&prepared, "save_state")?;
        let sharded = prepared?;
        let full = fsdp.full_model(model)?;
        let gathered = map_state_tensors(&sharded, &ids, |index, values| {
            Ok(fsdp.gather_values(index, values, &self.device)?)
        });
        let written = match gathered {
            Ok(optimizer) if self.is_main_process() => (|| {
                let model = encode::<B, _>(full.into_record())?;
                let scheduler = encode::<B, _>(scheduler.to_record::<B>())?;
                self.write_encoded(dir, model, optimizer, scheduler)
            })(),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        self.all_ranks_succeeded(&written, "save_state")?;
        written
    }

    /// Loads a full state into the sharded `model`: each rank keeps its shard of every
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
        let Some(fsdp) = &self.fsdp else {
            unreachable!("load_full_state is only called under fsdp");
        };
        // A full-shaped model to load the record into (every rank: one gather per unit).
        let template = fsdp.full_model(&model)?;
        let decoded = self.decode_with::<M, O, S>(dir, |model_bytes, optimizer| {
            // The record's parameter ids, in the model's visit order.
            let record = decode_record::<B, M::Record>(model_bytes.to_vec(), &self.device, dir)?;
            let ids = indices_by_id(fsdp, &template.clone().load_record(record));
            map_state_tensors(&optimizer, &ids, |index, values| {
                Ok(fsdp.shard_values(index, values)?)
            })
        });
        self.all_ranks_succeeded(&decoded, "load_state")?;
        let ((full, optimizer, scheduler), restored) =
            self.load_records(decoded?, template, optimizer, scheduler);
        let model = fsdp.shard(full)?;
        fsdp.after_step(&model)?;
        self.restore(restored);
        Ok((model, optimizer, scheduler))
    }
}
