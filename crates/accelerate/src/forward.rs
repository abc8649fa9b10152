//! The Accelerator's forward pass under the precision policy: per-op autocast or a half
//! view of the model, and the set-up check for state the half view must leave alone.

use std::sync::{Arc, PoisonError};

use afterburner_checkpoint::{ReplayContext, with_derived_params, with_replay_context};
use afterburner_parallel::{ForwardView, TrainingStrategy};
use afterburner_precision::{
    CastFloats, autocast_ops, autocast_view_except, promotes_dtypes, shared_float_state,
};
use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::{AccelerateError, Accelerator, AutocastMode};

impl<B: AutodiffBackend, S: TrainingStrategy<B>> Accelerator<B, S> {
    /// Runs `forward(model, input)` under the precision policy: in the mixed modes per op
    /// (`autocast = "op"`: inside an `autocast_ops` scope, the input as it is) or on a fresh
    /// half view of the model (`"view"`: the input's float tensors cast to the compute dtype),
    /// and the output's float tensors come back in f32 so the loss is computed in f32. The model's
    /// `Checkpointed` blocks follow the config's `gradient_checkpointing` policy (their
    /// recompute runs in the same half view or under the same per-op scope, so in the same
    /// dtypes). Under FSDP the forward
    /// pass runs on a view whose units are gathered from every rank when first read; a model
    /// that is not the one `setup`/`step` returned is an error here, before anything runs.
    pub fn forward<M, I, O, F>(&self, model: &M, input: I, forward: F) -> Result<O, AccelerateError>
    where
        M: Module<B>,
        I: CastFloats,
        O: CastFloats,
        F: FnOnce(&M, I) -> O,
    {
        let precision = self.config.precision;
        let compute = precision.compute_dtype();
        let per_op = self.per_op_half().is_some();
        // Per op, the input stays as it is (as under torch.autocast); otherwise it goes in the
        // compute dtype.
        let input = if per_op {
            input
        } else {
            input.cast_floats(compute)
        };
        let mixed = (precision.is_mixed() && !per_op).then_some(compute);
        let view = self.strategy.forward_view(model, mixed)?;
        let run = || {
            afterburner_checkpoint::with_policy(self.config.gradient_checkpointing, || {
                match (view, mixed) {
                    // A recomputed block keeps its unit's sources (FSDP: the shards), not the
                    // built parameters, and builds them again in the backward pass.
                    (Some(ForwardView { model, derived }), _) => {
                        with_derived_params(derived, || forward(&model, input))
                    }
                    (None, Some(half)) => {
                        let keep = self
                            .shared_state
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        let view = autocast_view_except(model, half, &keep);
                        drop(keep);
                        forward(&view, input)
                    }
                    (None, None) => forward(model, input),
                }
            })
        };
        let output = if per_op {
            // Checkpointed blocks recompute (on a helper thread) under the same scope.
            let context: ReplayContext = Arc::new(move |f| autocast_ops(compute, f));
            autocast_ops(compute, || with_replay_context(context, run))
        } else {
            run()
        };
        Ok(output.cast_floats(DType::F32))
    }

    /// `loss.backward()` as [`backward`](Self::backward) runs it, without the loss scaling,
    /// accumulation and gradient sync around it (to read raw gradients yourself): under the
    /// forward's op-level autocast scope when the mixed precisions run per op, so the
    /// backward ops of Linear and the convolutions run in half (their gradients delivered in
    /// f32 to f32 operands) and checkpointed blocks recompute under the same policy as their
    /// forward, as PyTorch's backward of an autocast region does.
    pub fn raw_backward(&self, loss: Tensor<B, 1>) -> B::Gradients {
        match self.per_op_half() {
            Some(half) => autocast_ops(half, || loss.backward()),
            None => loss.backward(),
        }
    }

    /// The half dtype when a mixed precision runs per op (`autocast = "op"`, or "auto" on a
    /// backend with `Autocast`); `None` for the half view and the other precisions.
    fn per_op_half(&self) -> Option<DType> {
        let precision = self.config.precision;
        let per_op = match self.config.autocast {
            AutocastMode::Op => true,
            AutocastMode::View => false,
            AutocastMode::Auto => promotes_dtypes::<B>(&self.device),
        };
        (precision.is_mixed() && per_op).then(|| precision.compute_dtype())
    }

    /// A model with float state shared between clones (BatchNorm's running statistics) keeps
    /// that state in f32 under the mixed precisions, where it meets half activations: only a
    /// backend that promotes dtypes runs that (`Autodiff<Autocast<B>>`); say so up front
    /// rather than let the backend panic in the first forward.
    pub(crate) fn check_shared_state<M: AutodiffModule<B>>(
        &self,
        model: &M,
    ) -> Result<(), AccelerateError> {
        let precision = self.config.precision;
        if !precision.is_mixed() {
            return Ok(());
        }
        let shared = shared_float_state(model, precision.compute_dtype());
        if shared.is_empty() {
            return Ok(());
        }
        if !promotes_dtypes::<B>(&self.device) {
            return Err(AccelerateError::invalid(
                "precision",
                precision,
                "32-true or a *-true precision for a model with running statistics \
                 (BatchNorm), or the backend wrapped as Autodiff<afterburner::Autocast<B>>, \
                 which keeps them in f32 and promotes dtypes",
            ));
        }
        let mut known = self
            .shared_state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        known.extend(shared);
        Ok(())
    }
}
