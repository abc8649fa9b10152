//! HF's learning-rate schedules (transformers' `get_scheduler`) as a Burn `LrScheduler`.

use burn::optim::LearningRate;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::Backend;

use super::SchedulerType;

/// A learning-rate schedule with HF's formulas: the rate used by optimizer step `k`
/// (counting from 0) is `learning_rate * factor(k)`, where, with `w` warmup steps and `n`
/// steps in all,
/// - warmup (every type but `constant`): `factor(k) = k / max(1, w)` for `k < w`;
/// - `linear`: `max(0, (n - k) / max(1, n - w))`;
/// - `cosine`: `max(0, 0.5 * (1 + cos(pi * (k - w) / max(1, n - w))))`;
/// - `constant` / `constant_with_warmup`: 1.
///
/// It advances once per optimizer step (the Accelerator does not step it on a skipped fp16
/// step), and saves its position as its record.
#[derive(Debug, Clone, PartialEq)]
pub struct HfSchedule {
    kind: SchedulerType,
    learning_rate: f64,
    warmup_steps: usize,
    total_steps: usize,
    step: usize,
}

impl HfSchedule {
    /// A schedule of `total_steps` optimizer steps peaking at `learning_rate`.
    pub fn new(
        kind: SchedulerType,
        learning_rate: f64,
        warmup_steps: usize,
        total_steps: usize,
    ) -> Self {
        Self {
            kind,
            learning_rate,
            warmup_steps,
            total_steps,
            step: 0,
        }
    }

    /// HF's warmup length: `warmup_steps` when >= 1, `ceil(total_steps * warmup_steps)` when
    /// it is a share in (0, 1), else `ceil(total_steps * warmup_ratio)`.
    pub fn warmup_from(warmup_steps: f64, warmup_ratio: f64, total_steps: usize) -> usize {
        let share = |ratio: f64| (total_steps as f64 * ratio).ceil() as usize;
        match warmup_steps {
            s if s >= 1.0 => s as usize,
            s if s > 0.0 => share(s),
            _ => share(warmup_ratio),
        }
    }

    /// The learning rate optimizer step `step` (from 0) uses.
    pub fn lr_at(&self, step: usize) -> LearningRate {
        self.learning_rate * self.factor(step)
    }

    /// The optimizer steps it spans.
    pub fn total_steps(&self) -> usize {
        self.total_steps
    }

    /// Optimizer steps taken so far.
    pub fn steps_taken(&self) -> usize {
        self.step
    }

    fn factor(&self, step: usize) -> f64 {
        let (k, w, n) = (
            step as f64,
            self.warmup_steps as f64,
            self.total_steps as f64,
        );
        if self.kind != SchedulerType::Constant && step < self.warmup_steps {
            return k / w.max(1.0);
        }
        match self.kind {
            SchedulerType::Linear => ((n - k) / (n - w).max(1.0)).max(0.0),
            SchedulerType::Cosine => {
                let progress = (k - w) / (n - w).max(1.0);
                (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0)
            }
            SchedulerType::Constant | SchedulerType::ConstantWithWarmup => 1.0,
        }
    }
}

impl LrScheduler for HfSchedule {
    type Record<B: Backend> = usize;

    fn step(&mut self) -> LearningRate {
        let lr = self.lr_at(self.step);
        self.step += 1;
        lr
    }

    fn to_record<B: Backend>(&self) -> usize {
        self.step
    }

    fn load_record<B: Backend>(mut self, record: usize) -> Self {
        self.step = record;
        self
    }
}
