//! The Trainer's values combined across ranks: the sums and means its logs, evaluations and
//! votes read (the values themselves on one device).

use burn::tensor::{Tensor, TensorData};

use super::{Trainer, TrainerTypes};
use crate::AccelerateError;
use crate::parallel::ReduceOp;

impl<T: TrainerTypes> Trainer<T> {
    /// `(sum / count, count)` of per-rank sums and counts.
    pub(super) fn mean_across_ranks(
        &self,
        sum: f64,
        count: u64,
    ) -> Result<(f64, f64), AccelerateError> {
        let totals = self.sum_across_ranks(vec![sum, count as f64])?;
        Ok((totals[0] / totals[1].max(1.0), totals[1]))
    }

    /// Element-wise sums over ranks (the values themselves on one device).
    pub(super) fn sum_across_ranks(&self, values: Vec<f64>) -> Result<Vec<f64>, AccelerateError> {
        if self.acc.world_size() == 1 {
            return Ok(values);
        }
        let len = values.len();
        let tensor = Tensor::<T::Backend, 1>::from_data(
            TensorData::new(values.iter().map(|v| *v as f32).collect(), [len]),
            self.acc.device(),
        );
        let summed = self.acc.reduce(tensor, ReduceOp::Sum)?;
        let data = summed.into_data().convert::<f64>();
        data.to_vec::<f64>()
            .map_err(|e| AccelerateError::Usage(format!("reading a reduced metric: {e:?}")))
    }
}
