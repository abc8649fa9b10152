//! [`UnreadLosses`]: the training losses since the last log, left on the device. Reading a
//! loss on the host at every micro-batch would wait for its forward pass before backward is
//! even queued (on a GPU the queue drains); the Trainer reads them all at once at a log, a
//! save or the end of training, as HF's Trainer keeps `tr_loss` on the device.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use crate::AccelerateError;

/// Each micro-batch's loss (detached) with the number its value is divided by (1 for a mean
/// loss, the items for a summed one), in the order they came.
pub(super) struct UnreadLosses<B: Backend> {
    losses: Vec<(Tensor<B, 1>, f64)>,
}

impl<B: Backend> Default for UnreadLosses<B> {
    fn default() -> Self {
        Self { losses: Vec::new() }
    }
}

impl<B: Backend> UnreadLosses<B> {
    /// Keeps `loss` (one element, on the device) to be read later as `loss / divisor`.
    pub(super) fn push(&mut self, loss: Tensor<B, 1>, divisor: f64) {
        self.losses.push((loss, divisor));
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
