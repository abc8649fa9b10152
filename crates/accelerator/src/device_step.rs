//! [`Accelerator::step_on_device`]: an optimizer step whose skip is decided on the device.
//!
//! [`step`](Accelerator::step) decides on the host whether a step is skipped (non-finite
//! gradients, an fp16 overflow) and how much to clip: one host read per step, which on a GPU
//! waits for the whole backward before the optimizer is queued. On several devices (DDP,
//! ZeRO-1, FSDP) the ranks decide alike with no read: they hold the same reduced gradients,
//! or (FSDP) sum their shards' measure with one all-reduce of a device tensor, as PyTorch's
//! GradScaler all-reduces its `found_inf`. Here the same decisions are
//! device tensors, as PyTorch's fused optimizers take `found_inf`: the gradients' squared norm
//! (or sum) stays on the device, the clip factor is `min(1, max_norm / (norm + 1e-6))` as a
//! tensor, the loss scale is unscaled and updated on the device, and the skip flag goes to an
//! optimizer that keeps or drops its update on the device (the Trainer's AdamW,
//! `afterburner::trainer::gated`). What the steps did (how many were skipped, the last norm)
//! is read when asked: [`device_step_values`](Accelerator::device_step_values) to read with
//! other values in one read, [`settle_device_steps`](Accelerator::settle_device_steps) after.

use afterburner_parallel::ParallelStrategy;
use afterburner_precision::grads;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, DType, Tensor, TensorData};

use crate::{AccelerateError, Accelerator, Counters, NonFinitePolicy, StepOutcome};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Steps decided on the device and not read yet.
pub(crate) struct DeviceSteps<B: burn::tensor::backend::Backend> {
    /// Steps taken (applied or skipped) since the last read.
    pub(crate) attempted: u64,
    /// `[1]`: how many of them were skipped (f32, exact to 2^24).
    pub(crate) skipped: Tensor<B, 1>,
    /// `[1]`: the last step's global gradient norm before clipping, when one was computed
    /// (in f64 where the device has it).
    pub(crate) grad_norm: Option<Tensor<B, 1>>,
}

/// What the steps decided on the device did, once read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SettledSteps {
    /// Steps applied since the last read.
    pub applied: u64,
    /// Steps skipped since the last read.
    pub skipped: u64,
    /// The last step's global gradient norm before clipping (clipping or fp16).
    pub grad_norm: Option<f64>,
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Device-to-host reads and `Backend::sync`s this rank has made through `Autocast` since
    /// the Accelerator was built, on its thread and on the threads doing its step's work (DDP's
    /// communication thread, the recompute helper; see
    /// [`host_reads_counted`](afterburner_precision::host_reads_counted)): each one drains a
    /// GPU's queue. 0 on a backend without `Autocast`.
    pub fn host_reads(&self) -> u64 {
        afterburner_precision::host_reads_counted().wrapping_sub(self.host_reads_at_start)
    }

    /// Whether [`step_on_device`](Self::step_on_device) can decide this run's steps: a
    /// strategy whose ranks reach the same decision on the device (one device, DDP, ZeRO-1,
    /// FSDP: [`ParallelStrategy::decides_on_device`]), and a `nonfinite_gradients` policy
    /// other than `"error"` (an error is raised on the host).
    pub fn can_step_on_device(&self) -> bool {
        self.strategy.decides_on_device()
            && self.config.nonfinite_gradients != NonFinitePolicy::Error
    }

    /// [`step`](Self::step) with every decision left on the device, for an optimizer that
    /// reads a skip flag there: `gate` receives the step's flag (`[1]`, true to skip) right
    /// before `optimizer.step` runs; the optimizer must keep its parameters and state as they
    /// were where it is set (the Trainer's AdamW does). The learning rate is the optimizer's
    /// business too: `lr` is passed through as is (the Trainer's gated AdamW reads its own
    /// from the device). Clipping follows `max_grad_norm`; fp16's loss scale is unscaled and
    /// updated on the device. Makes no host read.
    pub fn step_on_device<M, O>(
        &mut self,
        model: M,
        optimizer: &mut O,
        lr: f64,
        gate: &mut dyn FnMut(Tensor<Inner<B>, 1, Bool>),
    ) -> Result<M, AccelerateError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.check_data()?;
        if self.pending.is_none() {
            return Err(AccelerateError::CallOrder(
                "step_on_device() called with no pending gradients: call backward() first".into(),
            ));
        }
        if !self.sync_gradients() {
            self.last = StepOutcome::Accumulating;
            return Ok(model);
        }
        if !self.can_step_on_device() {
            return Err(AccelerateError::Usage(format!(
                "step_on_device() under strategy {} with nonfinite_gradients = {}: it decides \
                 on one device or under ddp, zero-1 and fsdp (not tensor parallelism, Local \
                 SGD or DiLoCo), under \"skip\" or \"apply\"; use step()",
                self.strategy.name(),
                self.config.nonfinite_gradients
            )));
        }
        if self.unscaled.is_some() {
            return Err(AccelerateError::CallOrder(
                "clip_grad_norm() before step_on_device(): set max_grad_norm in the config \
                 instead (clip_grad_norm reads the norm on the host)"
                    .into(),
            ));
        }
        self.reduce_pending(&model)?;
        self.precision.scale_on_device(&self.device);
        let mut grads = self.pending.take().unwrap_or_default();
        let short_cycle =
            self.config.gradient_accumulation_steps as f64 / self.micro_in_cycle as f64;
        let unscale = self.precision.device_unscale();
        let max_norm = self.config.max_grad_norm;
        let guarded = self.config.nonfinite_gradients == NonFinitePolicy::Skip;
        let scaled = unscale.is_some();
        let measured = match (max_norm.is_some() || scaled, guarded) {
            (true, _) => grads::scale_and_squared_norm_on_device::<B, M>(
                &model,
                &mut grads,
                short_cycle,
                unscale,
            ),
            (false, true) => grads::sum_on_device::<B, M>(&model, &mut grads, short_cycle),
            (false, false) => {
                if short_cycle != 1.0 {
                    grads::scale::<B, M>(&model, &mut grads, short_cycle);
                }
                None
            }
        };
        // The whole model's measure where ranks hold parts of the gradients (FSDP: one
        // all-reduce on the device), so every rank decides alike.
        let measured = measured
            .map(|local| self.strategy.sum_over_parts_on_device(local))
            .transpose()?;
        // True where the measure is inf or NaN (x - x is NaN exactly then).
        let nonfinite = measured
            .as_ref()
            .map(|m| (m.clone() - m.clone()).not_equal_elem(0.0));
        // The norm and the clip factor in f64 where the device has it, as `step` computes
        // them on the host (so both give the same bits), else in f32 as PyTorch does.
        let wide = match self.supports_f64() {
            true => DType::F64,
            false => DType::F32,
        };
        let norm = match (max_norm.is_some() || scaled, &measured) {
            (true, Some(squared)) => Some(squared.clone().cast(wide).sqrt()),
            _ => None,
        };
        if let (Some(max), Some(norm)) = (max_norm, &norm) {
            // PyTorch's clip_grad_norm_: max / (norm + 1e-6), clamped to 1 and always applied
            // (a factor of 1 changes nothing).
            let max =
                Tensor::<Inner<B>, 1>::from_data(TensorData::new(vec![max], [1]), &norm.device())
                    .cast(wide);
            let clip = max.div(norm.clone().add_scalar(1e-6)).clamp_max(1.0);
            grads::scale_on_device::<B, M>(&model, &mut grads, clip.cast(DType::F32));
        }
        let skip = match (&nonfinite, guarded || scaled) {
            (Some(nonfinite), true) => nonfinite.clone(),
            _ => Tensor::<Inner<B>, 1, Bool>::from_data(
                TensorData::new(vec![false], [1]),
                &self.device,
            ),
        };
        self.strategy.before_optimizer_step(&model, &mut grads);
        gate(skip.clone());
        let model = optimizer.step(lr, model, grads);
        // The strategy's share of the new values (ZeRO-1's owners, FSDP grad-op's gathers),
        // skipped step or not (then they are the old ones); `step` counts this one attempted.
        let attempted = self.device_steps.as_ref().map_or(0, |s| s.attempted);
        let step = self.counters.optimizer_steps + attempted + 1;
        let model = self.strategy.after_optimizer_step(model, optimizer, step)?;
        if let Some(nonfinite) = nonfinite {
            self.precision.update_on_device(nonfinite.float());
        }
        let (attempted, skipped) = match self.device_steps.take() {
            Some(steps) => (steps.attempted + 1, steps.skipped + skip.float()),
            None => (1, skip.float()),
        };
        self.device_steps = Some(DeviceSteps {
            attempted,
            skipped,
            grad_norm: norm,
        });
        self.last = StepOutcome::Deferred;
        self.end_cycle();
        Ok(model)
    }

    /// `[skipped, grad_norm]` of the steps decided on the device since the last settle (the
    /// norm NaN when none was computed), to read with other values in one host read and hand
    /// to [`settle_device_steps`](Self::settle_device_steps); `None` when there are none.
    pub fn device_step_values(&self) -> Option<Tensor<Inner<B>, 1>> {
        let steps = self.device_steps.as_ref()?;
        let norm = steps.grad_norm.clone().unwrap_or_else(|| {
            Tensor::from_data(TensorData::new(vec![f32::NAN], [1]), &self.device)
        });
        // In the norm's dtype (f64 where the device has it: the logged norm is then the
        // host path's to the bit; the count is exact in either).
        let skipped = steps.skipped.clone().cast(norm.dtype());
        Some(Tensor::cat(vec![skipped, norm], 0))
    }

    /// Folds the values [`device_step_values`](Self::device_step_values) gave, read on the
    /// host, into the counters; returns what the steps did. Nothing when there are none.
    pub fn settle_device_steps(&mut self, values: &[f64]) -> SettledSteps {
        let Some(steps) = self.device_steps.take() else {
            return SettledSteps {
                applied: 0,
                skipped: 0,
                grad_norm: None,
            };
        };
        let skipped = values.first().map_or(0, |s| *s as u64).min(steps.attempted);
        let applied = steps.attempted - skipped;
        self.counters.optimizer_steps += applied;
        self.counters.skipped_steps += skipped;
        let grad_norm = values.get(1).copied().filter(|n| !n.is_nan());
        SettledSteps {
            applied,
            skipped,
            grad_norm: steps.grad_norm.and(grad_norm),
        }
    }

    /// Reads and settles the steps decided on the device (one host read; none when there
    /// are none).
    pub fn settle_device_steps_now(&mut self) -> SettledSteps {
        let values = self.device_step_values().map(read_f64).unwrap_or_default();
        self.settle_device_steps(&values)
    }

    /// The counters with the steps decided on the device and not settled yet (read from
    /// the device when there are some).
    pub(crate) fn counters_now(&self) -> Counters {
        let mut counters = self.counters;
        if let Some(steps) = &self.device_steps {
            let skipped = read_f64(steps.skipped.clone())
                .first()
                .map_or(0, |s| *s as u64)
                .min(steps.attempted);
            counters.optimizer_steps += steps.attempted - skipped;
            counters.skipped_steps += skipped;
        }
        counters
    }

    /// Steps decided on the device and not settled yet (they count as cycles for the seeds).
    pub(crate) fn unsettled_steps(&self) -> u64 {
        self.device_steps.as_ref().map_or(0, |s| s.attempted)
    }

    /// Whether the device computes in f64 (flex and CUDA do; most wgpu devices do not).
    fn supports_f64(&self) -> bool {
        <Inner<B> as burn::tensor::backend::Backend>::supports_dtype(&self.device, DType::F64)
    }
}

/// A tensor's values as f64 (one host read).
fn read_f64<Bk: burn::tensor::backend::Backend>(tensor: Tensor<Bk, 1>) -> Vec<f64> {
    tensor
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .unwrap_or_default()
}
