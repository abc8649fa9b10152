//! [`TrainerGate`]: the Trainer's side of a step decided on the device
//! ([`Accelerator::step_on_device`](crate::Accelerator::step_on_device)). It holds the tables
//! the gated AdamW reads (the learning rate and decay factor of every optimizer step of the
//! run, the bias corrections of every step count: the same host values Burn's AdamW and the
//! schedule compute) and the number of applied steps on the device, which picks the rate: a
//! skipped step does not advance the schedule, without the host knowing it was skipped.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

use super::TrainingArguments;
use super::choices::OptimizerType;
use super::gated::{Gate, GateCell, bias_table};
use super::schedule::HfSchedule;

/// The tables of one run, on the device.
struct Tables<B: Backend> {
    lr: Tensor<B, 1>,
    decay: Tensor<B, 1>,
    bias_1: Tensor<B, 1>,
    bias_2: Tensor<B, 1>,
}

/// The gate of the Trainer's default AdamW and what it reads.
pub(super) struct TrainerGate<B: Backend> {
    cell: GateCell<B>,
    schedule: HfSchedule,
    weight_decay: f64,
    betas: (f32, f32),
    tables: Option<Tables<B>>,
    /// Optimizer steps applied in the run so far, `[1]`, on the device.
    applied: Option<Tensor<B, 1, Int>>,
    /// The device of the tables.
    device: Option<B::Device>,
    /// Steps applied when the gate started, and steps opened since: together a bound on the
    /// steps applied, known on the host, which keeps the tables long enough (a loop that
    /// steps past the schedule's end gets its rates there, never a read past a table).
    done: u64,
    opened: u64,
}

impl<B: Backend> TrainerGate<B> {
    /// The gate when this run's steps can be decided on the device: AdamW (the arguments'
    /// `optim`) with f32 parameters (not a `*-true` precision) on an Accelerator that can.
    pub(super) fn new(
        args: &TrainingArguments,
        schedule: &HfSchedule,
        cell: GateCell<B>,
        accelerator_can: bool,
    ) -> Option<Self> {
        let f32_params = args.effective_precision().param_dtype() == burn::tensor::DType::F32;
        let adamw = args.optim == OptimizerType::AdamW;
        let betas = (args.adam_beta1 as f32, args.adam_beta2 as f32);
        (accelerator_can && f32_params && adamw)
            .then(|| Self::with(schedule, cell, betas, args.weight_decay as f32))
    }

    /// The gate of an AdamW with `betas` and `weight_decay` at the rates of `schedule`.
    pub(super) fn with(
        schedule: &HfSchedule,
        cell: GateCell<B>,
        betas: (f32, f32),
        weight_decay: f32,
    ) -> Self {
        Self {
            cell,
            schedule: schedule.clone(),
            // As Burn's AdamW: its f32 weight decay, widened.
            weight_decay: f64::from(weight_decay),
            betas,
            tables: None,
            applied: None,
            device: None,
            done: 0,
            opened: 0,
        }
    }

    /// Builds the tables for a run of `max_steps` optimizer steps, `done` of them applied
    /// already (a resumed run), on `device`.
    pub(super) fn start(&mut self, max_steps: usize, done: u64, device: &B::Device) {
        self.device = Some(device.clone());
        self.done = done;
        self.opened = 0;
        self.build(max_steps.max(done as usize + 1));
        let done = TensorData::new(vec![done as i64], [1]);
        self.applied = Some(Tensor::from_data(done, device));
    }

    /// (Re)builds the tables for the first `steps` optimizer steps: the rate and decay of
    /// steps 0..=steps, the bias corrections of step counts 0..=steps + 1.
    fn build(&mut self, steps: usize) {
        let Some(device) = self.device.clone() else {
            return;
        };
        let steps = steps.max(1) + 1;
        let rates: Vec<f64> = (0..steps).map(|k| self.schedule.lr_at(k)).collect();
        let f32s = |values: Vec<f32>| {
            let len = values.len();
            Tensor::<B, 1>::from_data(TensorData::new(values, [len]), &device)
        };
        // Burn's AdamW multiplies by `lr` and by `1 - lr * weight_decay`, each an f64 made f32.
        let decay = rates
            .iter()
            .map(|lr| (1.0 - lr * self.weight_decay) as f32)
            .collect();
        self.tables = Some(Tables {
            lr: f32s(rates.iter().map(|lr| *lr as f32).collect()),
            decay: f32s(decay),
            bias_1: bias_table(self.betas.0, steps + 1, &device),
            bias_2: bias_table(self.betas.1, steps + 1, &device),
        });
    }

    /// Sets the gate of the next optimizer step from its skip flag (true to skip), and counts
    /// the step as applied on the device where it is not skipped. Called after
    /// [`start`](Self::start).
    pub(super) fn open(&mut self, skip: Tensor<B, 1, Bool>) {
        // The steps applied after this one are at most `done + opened + 1`: the tables must
        // hold that step's rate and count (a hand-written loop may step past its schedule).
        let bound = (self.done + self.opened + 1) as usize;
        if self
            .tables
            .as_ref()
            .is_some_and(|t| t.lr.dims()[0] <= bound)
        {
            self.build(2 * bound);
        }
        self.opened += 1;
        // Both callers (the Trainer's loop, `DeviceAdamW::step`) start the gate first: without
        // tables the optimizer would silently run Burn's step at the placeholder rate.
        let (Some(tables), Some(applied)) = (&self.tables, self.applied.take()) else {
            unreachable!("TrainerGate::start runs before the first gated step");
        };
        let last = tables.lr.dims()[0] as i64 - 1;
        let at = applied.clone().clamp_max(last);
        let gate = Gate {
            skip: skip.clone(),
            lr: tables.lr.clone().select(0, at.clone()),
            decay: tables.decay.clone().select(0, at),
            bias_1: tables.bias_1.clone(),
            bias_2: tables.bias_2.clone(),
        };
        let taken = skip.bool_not().int();
        self.applied = Some(applied + taken);
        *self
            .cell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(gate);
    }

    /// Clears the gate after the step (any later step of the optimizer is Burn's own).
    pub(super) fn close(&self) {
        *self
            .cell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// The learning rate optimizer step `index` (from 0, applied steps) used.
    pub(super) fn lr_of(&self, index: u64) -> f64 {
        self.schedule.lr_at(index as usize)
    }
}
