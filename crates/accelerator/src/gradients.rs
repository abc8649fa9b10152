//! The Accelerator's gradient side between backward and the optimizer step: unscaling
//! (once per cycle), rescaling, global-norm clipping and the non-finite check.

use afterburner_parallel::ParallelStrategy;
use afterburner_precision::grads::{self, GradSummary};
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use crate::{AccelerateError, Accelerator};

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Unscales the pending gradients (once per cycle) and returns their summary when a norm
    /// was needed. The accumulation mean is corrected for a cycle cut short by an epoch end.
    pub(crate) fn unscale_pending<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        want_norm: bool,
    ) -> Result<Option<GradSummary>, AccelerateError> {
        if self.unscaled.is_some() {
            return Ok(self.unscaled);
        }
        let Some(grads) = self.pending.as_mut() else {
            return Ok(None);
        };
        let short_cycle =
            self.config.gradient_accumulation_steps as f64 / self.micro_in_cycle as f64;
        let Some(summary) = self.precision.unscale(model, grads, short_cycle, want_norm) else {
            return Ok(None);
        };
        let summary = self.summary_over_ranks(model, summary, want_norm)?;
        self.unscaled = Some(summary);
        Ok(Some(summary))
    }

    /// Multiplies the pending gradients by `factor` (before unscaling and clipping: call it
    /// between the cycle's last `backward` and `step`, before `clip_grad_norm`). For a loss
    /// normalised by a count known only at the end of the cycle, like the Trainer's per-item
    /// loss under accumulation. Under DDP reducing its gradients during backward (one
    /// micro-batch per step) the factor applies to the averaged gradients, at the step.
    pub fn scale_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        factor: f64,
    ) -> Result<(), AccelerateError> {
        if !factor.is_finite() {
            return Err(AccelerateError::invalid(
                "factor",
                factor,
                "a finite number",
            ));
        }
        if self.unscaled.is_some() {
            return Err(AccelerateError::CallOrder(
                "scale_gradients() after clip_grad_norm() in the same cycle".into(),
            ));
        }
        let Some(grads) = self.pending.as_mut() else {
            return Err(AccelerateError::CallOrder(
                "scale_gradients() with no pending gradients: call backward() first".into(),
            ));
        };
        if self.strategy.reduces_in_backward() && !self.synced {
            // Already on their way across the ranks: the same factor on their average.
            self.deferred_scale = Some(self.deferred_scale.unwrap_or(1.0) * factor);
            return Ok(());
        }
        grads::scale::<B, M>(model, grads, factor);
        Ok(())
    }

    /// Clips the pending gradients to a global L2 norm of `max_norm` (after unscaling) and
    /// returns the norm before clipping, like `accelerator.clip_grad_norm_`. Call it when
    /// [`sync_gradients`](Self::sync_gradients) is true, between `backward` and `step`;
    /// `max_grad_norm` in the config does the same inside `step`.
    pub fn clip_grad_norm<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        max_norm: f64,
    ) -> Result<f64, AccelerateError> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(AccelerateError::invalid(
                "max_norm",
                max_norm,
                "a finite number > 0",
            ));
        }
        self.reduce_pending(model)?;
        let Some(summary) = self.unscale_pending(model, true)? else {
            return Err(AccelerateError::CallOrder(
                "clip_grad_norm() called with no pending gradients: call backward() first".into(),
            ));
        };
        if summary.is_finite()
            && let Some(grads) = self.pending.as_mut()
        {
            grads::clip_to_norm::<B, M>(model, grads, summary.norm(), max_norm);
            self.clipped = true;
        }
        Ok(summary.norm())
    }

    /// Whether every pending gradient is finite, on every rank that holds a part of them
    /// (the non-finite guard's check when no norm is computed anyway).
    pub(crate) fn pending_all_finite<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
    ) -> Result<bool, AccelerateError> {
        let Some(grads) = self.pending.as_mut() else {
            return Ok(true);
        };
        let local = match grads::all_finite::<B, M>(model, grads) {
            true => 0.0,
            false => f64::NAN,
        };
        let global = self.strategy.global_squared_norm(local, &self.device)?;
        Ok(global.is_finite())
    }
}
