//! The Accelerator's forward and backward passes: the strategy's view of the model (FSDP's
//! gathered one), the checkpointing policy, and the precision plugin around them.

use std::sync::Arc;

use afterburner_checkpoint::{ReplayContext, with_derived_params, with_replay_context};
use afterburner_parallel::{ForwardView, ParallelStrategy};
use afterburner_precision::{CastFloats, HostReadTally};
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::{AccelerateError, Accelerator};

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
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
        self.check_data()?;
        let view = self
            .strategy
            .forward_view(model, self.precision.view_dtype())?;
        let (view, derived) = match view {
            Some(ForwardView { model, derived }) => (Some(model), derived),
            None => (None, Vec::new()),
        };
        let run = || {
            afterburner_checkpoint::with_policy(self.config.gradient_checkpointing, || {
                // A recomputed block keeps its unit's sources (FSDP: the shards), not the
                // built parameters, and builds them again in the backward pass.
                with_derived_params(derived, || {
                    self.precision.forward(model, view, input, forward)
                })
            })
        };
        // Checkpointed blocks recompute on a helper thread: under the same per-op scope, and
        // counting their host reads towards this thread's step.
        let scope = self.precision.op_scope();
        let tally = HostReadTally::of_this_thread();
        let replay: ReplayContext = Arc::new(move |recompute: &mut dyn FnMut()| {
            tally.clone().adopt();
            match &scope {
                Some(scope) => scope(recompute),
                None => recompute(),
            }
        });
        Ok(with_replay_context(replay, run))
    }

    /// `loss.backward()` as [`backward`](Self::backward) runs it, without the loss scaling,
    /// accumulation and gradient sync around it (to read raw gradients yourself): under the
    /// forward's op-level autocast scope when the mixed precisions run per op, so the
    /// backward ops of Linear and the convolutions run in half (their gradients delivered in
    /// f32 to f32 operands) and checkpointed blocks recompute under the same policy as their
    /// forward, as PyTorch's backward of an autocast region does.
    pub fn raw_backward(&self, loss: Tensor<B, 1>) -> B::Gradients {
        self.precision.backward(loss)
    }
}
