//! [`UnreadLosses`]: the training losses since the last log, left on the device. Reading a
//! loss on the host at every micro-batch would wait for its forward pass before backward is
//! even queued (on a GPU the queue drains); the Trainer reads them all at once at a log, a
//! save or the end of training, as HF's Trainer keeps `tr_loss` on the device.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use crate::AccelerateError;

/// How many losses are kept one by one before they are folded into one running total on the
/// device (a run that never logs or saves keeps at most this many tensors, as HF keeps one
/// total); below it, each is read and summed on the host in f64, in order.
const KEPT: usize = 1024;

/// Each micro-batch's loss (detached) with the number its value is divided by (1 for a mean
/// loss, the items for a summed one), in the order they came; past [`KEPT`] of them, the
/// oldest folded into one.
pub(super) struct UnreadLosses<B: Backend> {
    losses: Vec<(Tensor<B, 1>, f64)>,
}

impl<B: Backend> Default for UnreadLosses<B> {
    fn default() -> Self {
        Self { losses: Vec::new() }
    }
}

impl<B: Backend> UnreadLosses<B> {
    /// Keeps `loss` (one element, on the device) to be read later as `loss / divisor`; once
    /// [`KEPT`] are kept, they become one running total (on the device: nothing is read).
    pub(super) fn push(&mut self, loss: Tensor<B, 1>, divisor: f64) {
        if self.losses.len() >= KEPT {
            self.fold();
        }
        self.losses.push((loss, divisor));
    }

    /// The kept losses as one: `sum(loss / divisor)` in f32 on the device, divisor 1.
    fn fold(&mut self) {
        let parts: Vec<Tensor<B, 1>> = std::mem::take(&mut self.losses)
            .into_iter()
            .map(|(loss, divisor)| {
                let loss = loss.reshape([1]).cast(DType::F32);
                match divisor == 1.0 {
                    true => loss,
                    false => loss.div_scalar(divisor),
                }
            })
            .collect();
        self.losses.push((Tensor::cat(parts, 0).sum(), 1.0));
    }

    /// How many loss tensors are kept on the device.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.losses.len()
    }

    /// The kept values in order and `extra`'s values (other values to read at the same
    /// time), in one host read (none when there is nothing to read), and forgets them. Each
    /// loss is the f64 of its value divided by its divisor, as a read of that loss alone
    /// would give.
    pub(super) fn read(
        &mut self,
        extra: Option<Tensor<B, 1>>,
    ) -> Result<(Vec<f64>, Option<Vec<f64>>), AccelerateError> {
        if self.losses.is_empty() && extra.is_none() {
            return Ok((Vec::new(), None));
        }
        // One dtype for the one read: `extra`'s (f64 where the device has it) or f32; a
        // loss widened so reads as it would alone.
        let dtype = extra.as_ref().map_or(DType::F32, Tensor::dtype);
        let (mut tensors, divisors): (Vec<_>, Vec<_>) = std::mem::take(&mut self.losses)
            .into_iter()
            .map(|(loss, divisor)| (loss.reshape([1]).cast(dtype), divisor))
            .unzip();
        let extra_len = extra.as_ref().map(|e| e.dims()[0]);
        tensors.extend(extra);
        let mut values = read_f64(Tensor::cat(tensors, 0))?;
        let extra = extra_len.map(|len| values.split_off(values.len() - len));
        let losses = values
            .into_iter()
            .zip(divisors)
            .map(|(value, divisor)| value / divisor)
            .collect();
        Ok((losses, extra))
    }
}

/// A tensor's values as f64 (one host read).
fn read_f64<B: Backend>(tensor: Tensor<B, 1>) -> Result<Vec<f64>, AccelerateError> {
    let data: TensorData = tensor.into_data().convert::<f64>();
    data.to_vec::<f64>()
        .map_err(|e| AccelerateError::Usage(format!("reading the training losses: {e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// A run that never reads (no log, no save) keeps a bounded number of tensors, and the
    /// total it finally reads is the losses' (within f32's rounding of the folded part).
    #[test]
    fn losses_never_read_stay_bounded_and_sum_to_the_same() {
        let device = Default::default();
        let mut unread = UnreadLosses::<Flex>::default();
        let mut exact = 0f64;
        for k in 0..5 * KEPT {
            let value = 1.0 + (k % 7) as f32 * 0.25;
            let divisor = 1.0 + (k % 3) as f64;
            unread.push(Tensor::from_floats([value], &device), divisor);
            exact += f64::from(value) / divisor;
            assert!(unread.kept() <= KEPT, "{} tensors kept", unread.kept());
        }
        let (losses, _) = unread.read(None).unwrap();
        let total: f64 = losses.iter().sum();
        assert!((total - exact).abs() / exact < 1e-5, "{total} vs {exact}");
        // Below the bound, each loss is read on its own, in order.
        let mut few = UnreadLosses::<Flex>::default();
        few.push(Tensor::from_floats([3.0], &device), 2.0);
        few.push(Tensor::from_floats([1.0], &device), 1.0);
        assert_eq!(few.read(None).unwrap().0, vec![1.5, 1.0]);
    }
}
