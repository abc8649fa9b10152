//! The training log's throughput values, over the window since the previous training log
//! (its evaluations and saves left out) and across ranks:
//! - `samples_per_second` and `tokens_per_second` (when the model says how many tokens a
//!   batch holds, `TrainLoss::batch_tokens`): the whole run's, summed over the ranks;
//! - `tflops`: the achieved TFLOP/s of the counted ops (matmul, Linear, convolutions,
//!   attention through `Autocast`) per device, the mean over the ranks;
//! - `mfu`: `tflops` over the device's peak in the compute dtype (a fraction), the mean;
//! - `peak_memory_mib`: on a GPU backend (built with afterburner's `cuda` or `wgpu` feature)
//!   the bytes CubeCL's pools hold on the device (they grow to the peak and are trimmed only
//!   on a cleanup), elsewhere the most memory the process has held resident; the max over
//!   the ranks.
//!
//! `tflops` and `mfu` are left out on a backend without `Autocast` (nothing is counted).

use super::{Metrics, Trainer, TrainerTypes};
use crate::AccelerateError;
use crate::parallel::ParallelStrategy;
use crate::throughput::{device_memory, peak_flops, peak_memory_bytes};

impl<T: TrainerTypes> Trainer<T> {
    /// Adds the window's throughput values to `values` and starts a new window.
    pub(super) fn add_throughput(&mut self, values: &mut Metrics) -> Result<(), AccelerateError> {
        let window = self.meter.read();
        let peak = self.peak_flops(window.flops > 0);
        // The next window starts here, after a first lookup's probe.
        self.meter.restart();
        let rates = window.rates(peak);
        let world = self.acc.world_size();
        // One sum across the ranks: the rates, then each rank's memory at its own index
        // (the max is read off the gathered values).
        let mut local = vec![
            rates.samples_per_second,
            rates.tokens_per_second.unwrap_or(0.0),
            rates.flops_per_second.unwrap_or(0.0),
            rates.mfu.unwrap_or(0.0),
        ];
        let mut memory = vec![0.0; world];
        let device = self.acc.device().clone();
        let bytes = device_memory::<T::Backend>(&device)
            .map(|m| m.reserved_bytes)
            .or_else(peak_memory_bytes);
        let mib = bytes.map(|b| b as f64 / (1024.0 * 1024.0));
        memory[self.acc.rank().min(world - 1)] = mib.unwrap_or(0.0);
        local.extend(memory);
        let summed = self.sum_across_ranks(local)?;
        let ranks = world as f64;
        // The ranks of a tensor-parallel group train on the same samples: count them once.
        let shards = self.acc.strategy().data_parallel_size() as f64 / ranks;
        values.insert("samples_per_second", summed[0] * shards);
        if rates.tokens_per_second.is_some() {
            values.insert("tokens_per_second", summed[1] * shards);
        }
        if rates.flops_per_second.is_some() {
            values.insert("tflops", summed[2] / ranks / 1e12);
        }
        if rates.mfu.is_some() {
            values.insert("mfu", summed[3] / ranks);
        }
        if mib.is_some() {
            let max = summed[4..].iter().copied().fold(0.0, f64::max);
            values.insert("peak_memory_mib", max);
        }
        Ok(())
    }

    /// The device's peak FLOP/s in the run's compute dtype, looked up (or probed) on the
    /// first window that counted FLOPs; `None` when unknown or when nothing is counted.
    fn peak_flops(&mut self, counted: bool) -> Option<f64> {
        if !counted {
            return None;
        }
        if self.peak_flops.is_none() {
            let dtype = self.args.precision.compute_dtype();
            let device = self.acc.device().clone();
            let peak = peak_flops::<T::Backend>(&device, dtype).map(|p| p.flops_per_second);
            self.peak_flops = Some(peak);
        }
        self.peak_flops.flatten()
    }
}
