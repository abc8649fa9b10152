//! The Trainer's per-item loss normalisation (`loss_normalization = "per-item"`): the
//! divisor a cycle's summed losses go back with, and the division by the cycle's items at its
//! end.

use super::{Trainer, TrainerTypes};
use crate::AccelerateError;
use crate::parallel::ParallelStrategy;

impl<T: TrainerTypes> Trainer<T> {
    /// The constant a cycle's summed losses are divided by before backward, so that their
    /// gradients are about a mean's size: the first micro-batch's items, averaged over the
    /// ranks where they average gradients (the same divisor on every rank: DDP may reduce
    /// during backward).
    pub(super) fn per_item_scale(&self, items: usize) -> Result<f64, AccelerateError> {
        let world = self.acc.world_size();
        let items = match self.acc.strategy().averages_gradients() && world > 1 {
            true => self.sum_across_ranks(vec![items as f64])?[0] / world as f64,
            false => items as f64,
        };
        Ok(items.max(1.0))
    }

    /// Per-item loss normalisation at the end of a cycle whose summed losses were
    /// back-propagated divided by `scale`: the Accelerator divided them by the cycle's
    /// micro-batches and, under DDP-like strategies, averaged over the ranks; this makes it a
    /// division by the items of the whole cycle on every rank.
    pub(super) fn normalise_per_item(
        &mut self,
        model: &T::Model,
        items: usize,
        scale: f64,
    ) -> Result<(), AccelerateError> {
        let micro = self.acc.pending_micro_batches() as f64;
        let (items, ranks) = match self.acc.strategy().averages_gradients() {
            true => {
                let all = self.sum_across_ranks(vec![items as f64])?;
                (all[0], self.acc.world_size() as f64)
            }
            false => (items as f64, 1.0),
        };
        if items == 0.0 {
            return Err(AccelerateError::argument(
                "loss_normalization",
                "per-item",
                "at least one item in every accumulation cycle (train_loss_sum counted none)",
            ));
        }
        self.acc
            .scale_gradients(model, micro * ranks * scale / items)
    }
}
