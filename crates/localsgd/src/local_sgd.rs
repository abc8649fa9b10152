//! [`LocalSgd`]: every rank steps alone; every `local_sgd_steps` optimizer steps the
//! parameters are averaged across ranks (one flat all-reduce).

use std::marker::PhantomData;

use afterburner_parallel::{
    ParallelError, ParallelStrategy, ProcessGroup, ReduceOp, StateLayout, StateSaving,
    StrategyState, average_optimizer_state, broadcast_from_rank0, donate_live_state, flat_params,
    receive_live_state, with_flat_params,
};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};

use crate::LocalSgdConfig;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Local SGD over a process group: rank 0's parameters at setup, no gradient exchange, the
/// parameters averaged (mean) every `local_sgd_steps` optimizer steps, counted from the start
/// of the run (so a resumed run averages at the same steps). Each rank's optimizer state stays
/// its own, so each rank saves its own part of the training state.
pub struct LocalSgd<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    group: G,
    config: LocalSgdConfig,
    averages: u64,
    /// The step `finish` last synced at (a second call is a no-op).
    finished_at: Option<u64>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> LocalSgd<B, G> {
    /// Local SGD over `group`; errors on an invalid config.
    pub fn new(group: G, config: LocalSgdConfig) -> Result<Self, ParallelError> {
        config.validate()?;
        Ok(Self {
            group,
            config,
            averages: 0,
            finished_at: None,
            backend: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &LocalSgdConfig {
        &self.config
    }

    /// Parameter averages so far (one all-reduce each).
    pub fn averages(&self) -> u64 {
        self.averages
    }

    /// `model` with every rank's mean parameters (one all-reduce); e.g. at the end of
    /// training, when the last period was cut short.
    pub fn average<M: AutodiffModule<B>>(&mut self, model: M) -> Result<M, ParallelError> {
        let Some(flat) = flat_params::<B, M>(&model) else {
            return Ok(model);
        };
        let mean = self.group.all_reduce(flat, ReduceOp::Mean)?;
        self.averages += 1;
        Ok(with_flat_params::<B, M>(model, mean))
    }
}

/// Whether any rank passes `yes` (one small all-reduce).
pub(crate) fn any_rank<B: AutodiffBackend, G: ProcessGroup<Inner<B>> + ?Sized>(
    group: &G,
    yes: bool,
    device: &B::Device,
) -> Result<bool, ParallelError> {
    let flag = Tensor::<Inner<B>, 1>::from_floats([f32::from(u8::from(yes))], device);
    let sum = group.all_reduce(flag, ReduceOp::Sum)?.into_scalar();
    Ok(sum.elem::<f32>() > 0.5)
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> ParallelStrategy<B> for LocalSgd<B, G> {
    /// Replicas step on their own and sync periodically: one that dies is restarted alone
    /// and healed from a live replica (`join`).
    const HEALS_ALONE: bool = true;

    fn name(&self) -> &'static str {
        "local-sgd"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        Some(&self.group)
    }

    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        broadcast_from_rank0(&self.group, model)
    }

    /// On a fault-tolerant group, a replica joining a run in progress takes a live replica's
    /// parameters, optimizer state and average count, and continues after its step.
    fn join<M, O>(&mut self, model: M, optimizer: &mut O) -> Result<(M, u64), ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let Some(quorum) = self.group.quorum().filter(|q| q.is_joining()) else {
            return Ok((self.setup(model)?, 0));
        };
        let device = model.devices().into_iter().next().unwrap_or_default();
        let (model, state, step) = receive_live_state(&*quorum, model, optimizer, &device)?;
        self.check_own_state(&state)?;
        self.load_own_state(state);
        Ok((model, step))
    }

    /// Ranks step on their own gradients: all skip an fp16 step if any overflowed, so they
    /// keep counting the same steps.
    fn agree_on_skip(&self, skip: bool, device: &B::Device) -> Result<bool, ParallelError> {
        any_rank::<B, G>(&self.group, skip, device)
    }

    /// Every `local_sgd_steps` steps: the parameters averaged and, with
    /// `average_optimizer_state`, the optimizer's state too (AdamW's moments, SGD's momentum).
    fn after_optimizer_step<M, O>(
        &mut self,
        model: M,
        optimizer: &mut O,
        step: u64,
    ) -> Result<M, ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        if !step.is_multiple_of(self.config.local_sgd_steps as u64) {
            return Ok(model);
        }
        let model = self.average(model)?;
        if self.config.average_optimizer_state {
            let device = model.devices().into_iter().next().unwrap_or_default();
            average_optimizer_state::<B, M, O, G>(&self.group, &model, optimizer, &device)?;
        }
        donate_live_state(
            self.group.quorum(),
            &model,
            optimizer,
            || self.own_state(),
            step,
        )?;
        Ok(model)
    }

    fn parameter_syncs(&self) -> u64 {
        self.averages
    }

    /// A last average unless the last step (or an earlier `finish`) just averaged.
    fn finish<M: AutodiffModule<B>>(&mut self, model: M, steps: u64) -> Result<M, ParallelError> {
        if steps.is_multiple_of(self.config.local_sgd_steps as u64)
            || self.finished_at == Some(steps)
        {
            return Ok(model);
        }
        self.finished_at = Some(steps);
        self.average(model)
    }
}

/// Each replica writes its own state (its model drifts between averages).
impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> StateSaving<B> for LocalSgd<B, G> {
    fn state_layout(&self) -> StateLayout {
        StateLayout::PerRank
    }

    /// The number of averages, so `parameter_syncs` continues after a resume.
    fn own_state(&self) -> Result<StrategyState, ParallelError> {
        Ok(StrategyState {
            tensors: Vec::new(),
            counters: vec![("averages".to_string(), self.averages)],
        })
    }

    fn check_own_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
        match state.tensors.first() {
            None => Ok(()),
            Some((name, _)) => Err(ParallelError::Record(format!(
                "Local SGD keeps no tensors; the state holds '{name}' (saved by another strategy)"
            ))),
        }
    }

    fn load_own_state(&mut self, state: StrategyState) {
        if let Some((_, averages)) = state.counters.iter().find(|(n, _)| n == "averages") {
            self.averages = *averages;
        }
    }
}
