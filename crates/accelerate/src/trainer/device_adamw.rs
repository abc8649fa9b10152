//! [`DeviceAdamW`]: the Trainer's AdamW with its steps decided on the device, for a
//! hand-written Accelerator loop: no host read per step under the non-finite guard, clipping
//! and fp16 loss scaling alike (docs/performance.md, "Host reads on the step path").
//!
//! ```ignore
//! let schedule = HfSchedule::new(SchedulerType::Linear, 1e-3, 10, 1000);
//! let mut optim = DeviceAdamW::new(DeviceAdamWConfig::default(), schedule);
//! let mut model = acc.setup_model(model)?;
//! for batch in loader.epoch(0) {
//!     let loss = acc.forward(&model, batch.x, |m, x| m.forward(x))?; // ...
//!     acc.backward(loss, &model)?;
//!     model = optim.step(&mut acc, model)?; // queued, nothing read
//! }
//! let done = optim.settle(&mut acc); // one read: applied and skipped steps, the last norm
//! ```

use burn::module::AutodiffModule;
use burn::optim::AdamWConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;

use super::device_gate::TrainerGate;
use super::gated::{GateCell, GatedAdamW};
use super::{ArgsOptimizer, HfOptimizer, HfSchedule};
use crate::parallel::ParallelStrategy;
use crate::{AccelerateError, Accelerator, SettledSteps};

/// AdamW's settings (Burn's `AdamWConfig` defaults; decoupled weight decay).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceAdamWConfig {
    /// Beta 1. Default 0.9.
    pub beta_1: f32,
    /// Beta 2. Default 0.999.
    pub beta_2: f32,
    /// Epsilon. Default 1e-5.
    pub epsilon: f32,
    /// Weight decay. Default 1e-4.
    pub weight_decay: f32,
}

impl Default for DeviceAdamWConfig {
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-5,
            weight_decay: 1e-4,
        }
    }
}

/// AdamW and its learning-rate schedule, stepped with the skip, the clip and the loss scale
/// decided on the device ([`Accelerator::step_on_device`]). Each applied step is Burn's
/// `AdamW` step at the schedule's rate, bit for bit; a skipped one changes nothing and does
/// not advance the schedule. Its optimizer saves and loads as Burn's AdamW.
pub struct DeviceAdamW<M: AutodiffModule<B>, B: AutodiffBackend> {
    optimizer: HfOptimizer<M, B>,
    schedule: HfSchedule,
    gate: TrainerGate<B::InnerBackend>,
    started: bool,
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> DeviceAdamW<M, B> {
    /// AdamW with `config`, at the rates of `schedule` (its total steps size the tables).
    pub fn new(config: DeviceAdamWConfig, schedule: HfSchedule) -> Self {
        let cell = GateCell::default();
        let burn = AdamWConfig::new()
            .with_beta_1(config.beta_1)
            .with_beta_2(config.beta_2)
            .with_epsilon(config.epsilon)
            .with_weight_decay(config.weight_decay)
            .build();
        let gated = GatedAdamW {
            beta_1: config.beta_1,
            beta_2: config.beta_2,
            epsilon: config.epsilon,
            weight_decay: config.weight_decay,
            gate: cell.clone(),
        };
        let betas = (config.beta_1, config.beta_2);
        let gate = TrainerGate::with(&schedule, cell, betas, config.weight_decay);
        Self {
            optimizer: OptimizerAdaptor::from(ArgsOptimizer::AdamW(burn, gated)),
            schedule,
            gate,
            started: false,
        }
    }

    /// Ends a micro-batch as [`Accelerator::step`] does (accumulating, or stepping when the
    /// cycle is complete), every decision left on the device. Errors where the device cannot
    /// decide: several devices, `nonfinite_gradients = "error"`, or half parameters (a
    /// `*-true` precision).
    pub fn step<S: ParallelStrategy<B>>(
        &mut self,
        acc: &mut Accelerator<B, S>,
        model: M,
    ) -> Result<M, AccelerateError> {
        if acc.precision().param_dtype() != DType::F32 {
            return Err(AccelerateError::Usage(format!(
                "DeviceAdamW under precision {}: it steps f32 parameters (32-true, bf16-mixed, \
                 16-mixed); use Burn's AdamW with step()",
                acc.precision()
            )));
        }
        if !self.started {
            let done = acc.counters().optimizer_steps;
            self.gate
                .start(self.schedule.total_steps(), done, acc.device());
            self.started = true;
        }
        let gate = &mut self.gate;
        let mut open = |skip| gate.open(skip);
        let stepped = acc.step_on_device(model, &mut self.optimizer, 0.0, &mut open);
        self.gate.close();
        stepped
    }

    /// Reads what the steps since the last settle did (one host read) and moves the schedule
    /// past the applied ones: call it to log, before saving the schedule, and after loading a
    /// state (the next step starts again from the Accelerator's counters).
    pub fn settle<S: ParallelStrategy<B>>(&mut self, acc: &mut Accelerator<B, S>) -> SettledSteps {
        let settled = acc.settle_device_steps_now();
        for _ in 0..settled.applied {
            self.schedule.step();
        }
        self.started = false;
        settled
    }

    /// The optimizer (to save and load with the Accelerator's state).
    pub fn optimizer_mut(&mut self) -> &mut HfOptimizer<M, B> {
        &mut self.optimizer
    }

    /// The schedule at the settled position.
    pub fn schedule(&self) -> &HfSchedule {
        &self.schedule
    }
}
