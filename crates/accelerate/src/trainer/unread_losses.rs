//! [`UnreadLosses`]: the training losses since the last log, left on the device. Reading a
//! loss on the host at every micro-batch would wait for its forward pass before backward is
//! even queued (on a GPU the queue drains); the Trainer reads them all at once at a log, a
//! save or the end of training, as HF's Trainer keeps `tr_loss` on the device.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

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

    /// The kept values in order, read in one host read (none when nothing is kept), and
    /// forgets them. Each is the f64 of its loss divided by its divisor, as a read of that
    /// loss alone would give.
    pub(super) fn read(&mut self) -> Result<Vec<f64>, AccelerateError> {
        if self.losses.is_empty() {
            return Ok(Vec::new());
        }
        let (tensors, divisors): (Vec<_>, Vec<_>) = std::mem::take(&mut self.losses)
            .into_iter()
            .map(|(loss, divisor)| (loss.reshape([1]), divisor))
            .unzip();
        let values = read_f64(Tensor::cat(tensors, 0))?;
        Ok(values
            .into_iter()
            .zip(divisors)
            .map(|(value, divisor)| value / divisor)
            .collect())
    }
}

/// A tensor's values as f64 (one host read).
fn read_f64<B: Backend>(tensor: Tensor<B, 1>) -> Result<Vec<f64>, AccelerateError> {
    let data: TensorData = tensor.into_data().convert::<f64>();
    data.to_vec::<f64>()
        .map_err(|e| AccelerateError::Usage(format!("reading the training losses: {e:?}")))
}
