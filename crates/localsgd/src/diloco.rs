//! [`DiLoCo`]: Local SGD whose sync is an outer optimizer step on a global copy of the
//! parameters along the averaged pseudo-gradient `global - local`.

use std::sync::{Mutex, PoisonError};

use afterburner_parallel::{
    ParallelError, ProcessGroup, ReduceOp, StateLayout, StrategyState, TrainingStrategy,
    broadcast_from_rank0, flat_params, with_flat_params,
};
use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::local_sgd::any_rank;
use crate::{DiLoCoConfig, OuterSgd};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// DiLoCo over a process group (Douillard et al. 2023): rank 0's parameters at setup, kept
/// as the global copy; every rank takes `sync_every` inner steps alone; then the
/// pseudo-gradients `global - local` are averaged (one all-reduce), the outer optimizer steps
/// the global copy, and every rank continues from it. The global copy and the outer momentum
/// are saved with the training state; the inner optimizer state stays each rank's own.
pub struct DiLoCo<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    group: G,
    config: DiLoCoConfig,
    /// The global parameters (flat f32), set at setup.
    global: Mutex<Option<Tensor<Inner<B>, 1>>>,
    outer: OuterSgd<Inner<B>>,
    syncs: u64,
    /// The step `finish` last synced at (a second call is a no-op).
    finished_at: Option<u64>,
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> DiLoCo<B, G> {
    /// DiLoCo over `group`; errors on an invalid config.
    pub fn new(group: G, config: DiLoCoConfig) -> Result<Self, ParallelError> {
        config.validate()?;
        let outer = OuterSgd::new(config.outer_lr, config.outer_momentum, config.nesterov);
        Ok(Self {
            group,
            config,
            global: Mutex::new(None),
            outer,
            syncs: 0,
            finished_at: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> &DiLoCoConfig {
        &self.config
    }

    /// Outer steps so far (one all-reduce each).
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    fn global(&self) -> Option<Tensor<Inner<B>, 1>> {
        self.global
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The outer step: every rank's model becomes the new global parameters.
    fn sync<M: AutodiffModule<B>>(&mut self, model: M) -> Result<M, ParallelError> {
        let Some(local) = flat_params::<B, M>(&model) else {
            return Ok(model);
        };
        let global = self.global().ok_or_else(not_set_up)?;
        if global.dims() != local.dims() {
            return Err(ParallelError::Mismatch {
                rank: self.group.rank(),
                reason: format!(
                    "DiLoCo's global copy has {} values, the model {}: DiLoCo trains the one \
                     model set up first",
                    global.dims()[0],
                    local.dims()[0]
                ),
            });
        }
        let pseudo_gradient = self
            .group
            .all_reduce(global.clone() - local, ReduceOp::Mean)?;
        let global = self.outer.step(global, pseudo_gradient);
        *self.global.lock().unwrap_or_else(PoisonError::into_inner) = Some(global.clone());
        self.syncs += 1;
        Ok(with_flat_params::<B, M>(model, global))
    }
}

fn not_set_up() -> ParallelError {
    ParallelError::InvalidConfig {
        field: "diloco",
        value: "not set up".into(),
        expected: "setup(model) before training or loading a state",
    }
}

fn values<B: burn::tensor::backend::Backend>(t: &Tensor<B, 1>) -> Result<Vec<f32>, ParallelError> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| ParallelError::Record(format!("DiLoCo state tensor: {e:?}")))
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> TrainingStrategy<B> for DiLoCo<B, G> {
    fn name(&self) -> &'static str {
        "diloco"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        Some(&self.group)
    }

    /// Rank 0's parameters on every rank; the first model set up is the one DiLoCo keeps a
    /// global copy of.
    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        let model = broadcast_from_rank0(&self.group, model)?;
        let mut global = self.global.lock().unwrap_or_else(PoisonError::into_inner);
        if global.is_none() {
            *global = flat_params::<B, M>(&model);
        }
        Ok(model)
    }

    fn agree_on_skip(&self, skip: bool, device: &B::Device) -> Result<bool, ParallelError> {
        any_rank::<B, G>(&self.group, skip, device)
    }

    fn after_optimizer_step<M: AutodiffModule<B>>(
        &mut self,
        model: M,
        step: u64,
    ) -> Result<M, ParallelError> {
        match step.is_multiple_of(self.config.sync_every as u64) {
            true => self.sync(model),
            false => Ok(model),
        }
    }

    /// A last outer step unless the last step (or an earlier `finish`) just synced.
    fn finish<M: AutodiffModule<B>>(&mut self, model: M, steps: u64) -> Result<M, ParallelError> {
        if steps.is_multiple_of(self.config.sync_every as u64) || self.finished_at == Some(steps) {
            return Ok(model);
        }
        self.finished_at = Some(steps);
        self.sync(model)
    }

    /// The ranks' mean of a loaded model (their parts may differ, e.g. a Local SGD save in
    /// the middle of a period) is the new global copy, with no momentum, unless the state
    /// carries DiLoCo's own (restored right after, overriding this). One all-reduce.
    fn after_load<M: AutodiffModule<B>>(&mut self, model: &M) -> Result<(), ParallelError> {
        let global = match flat_params::<B, M>(model) {
            Some(flat) => Some(self.group.all_reduce(flat, ReduceOp::Mean)?),
            None => None,
        };
        *self.global.lock().unwrap_or_else(PoisonError::into_inner) = global;
        self.outer.buffer = None;
        self.syncs = 0;
        Ok(())
    }

    fn state_layout(&self) -> StateLayout {
        StateLayout::PerRank
    }

    fn own_state(&self) -> Result<StrategyState, ParallelError> {
        let mut tensors = Vec::new();
        if let Some(global) = self.global() {
            tensors.push(("global".to_string(), values(&global)?));
        }
        if let Some(buffer) = &self.outer.buffer {
            tensors.push(("outer_momentum".to_string(), values(buffer)?));
        }
        Ok(StrategyState {
            tensors,
            counters: vec![("syncs".to_string(), self.syncs)],
        })
    }

    fn check_own_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
        let expected = self.global().ok_or_else(not_set_up)?.dims()[0];
        for (name, values) in &state.tensors {
            if !matches!(name.as_str(), "global" | "outer_momentum") {
                return Err(ParallelError::Record(format!(
                    "DiLoCo state: unknown tensor '{name}'"
                )));
            }
            if values.len() != expected {
                return Err(ParallelError::Record(format!(
                    "DiLoCo state: '{name}' holds {} values, the model has {expected}",
                    values.len()
                )));
            }
        }
        Ok(())
    }

    fn load_own_state(&mut self, state: StrategyState) {
        let Some(device) = self.global().map(|g| g.device()) else {
            return; // not set up: nothing to continue from
        };
        let tensor = |values: &[f32]| Tensor::<Inner<B>, 1>::from_floats(values, &device);
        if let Some(global) = state.tensor("global") {
            *self.global.lock().unwrap_or_else(PoisonError::into_inner) = Some(tensor(global));
        }
        self.outer.buffer = state.tensor("outer_momentum").map(tensor);
        if let Some((_, syncs)) = state.counters.iter().find(|(n, _)| n == "syncs") {
            self.syncs = *syncs;
        }
    }
}
