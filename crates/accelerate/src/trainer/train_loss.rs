//! [`TrainLoss`]: what the Trainer asks of a model beside its forward pass.

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::parallel::ParallelStrategy;
use crate::{AccelerateError, Accelerator, AnyStrategy};

/// How the Trainer gets a training batch's loss from the model: run the forward pass through
/// `acc.forward` (so the precision policy, activation checkpointing and FSDP's gathered view
/// apply) and compute the loss from its output, exactly as in a hand-written Accelerator
/// loop. Backward, loss scaling, accumulation and the optimizer step stay the Trainer's.
///
/// `S` is the Accelerator's strategy: the built-in [`AnyStrategy`] by default; implement the
/// trait for every `S: ParallelStrategy<B>` to train under a user's strategy too.
pub trait TrainLoss<B: AutodiffBackend, Batch, S: ParallelStrategy<B> = AnyStrategy<B>>:
    AutodiffModule<B>
{
    /// The loss of one training batch (a one-element tensor).
    fn train_loss(
        &self,
        acc: &Accelerator<B, S>,
        batch: Batch,
    ) -> Result<Tensor<B, 1>, AccelerateError>;

    /// For `loss_normalization = "per-item"`: the loss summed over the batch's items (not
    /// their mean) and the number of items that count in it (tokens that are not padding,
    /// say). The default is an error naming the setting.
    fn train_loss_sum(
        &self,
        _acc: &Accelerator<B, S>,
        _batch: Batch,
    ) -> Result<(Tensor<B, 1>, usize), AccelerateError> {
        Err(AccelerateError::argument(
            "loss_normalization",
            "per-item",
            "a model that implements TrainLoss::train_loss_sum",
        ))
    }

    /// Under `tp_size > 1`: this rank's part of the model, split by its tensor-parallel plan
    /// (a model with a [`TensorParallelPlan`](crate::parallel::tp::TensorParallelPlan)
    /// returns `acc.parallelize(self)`). The default is an error naming the setting.
    fn parallelize(self, _acc: &Accelerator<B, S>) -> Result<Self, AccelerateError> {
        Err(AccelerateError::argument(
            "tp_size",
            "> 1",
            "a model with a tensor-parallel plan (implement TensorParallelPlan and \
             TrainLoss::parallelize as `acc.parallelize(self)`)",
        ))
    }

    /// The tokens in a training batch, when it has any (a language model's `batch * seq`):
    /// the Trainer then logs `tokens_per_second`. The default: `None`.
    fn batch_tokens(&self, _batch: &Batch) -> Option<usize> {
        None
    }
}
