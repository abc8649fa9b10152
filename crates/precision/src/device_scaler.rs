//! [`DeviceScaler`]: the [`GradScaler`]'s state on the device, updated there from a
//! device-side overflow flag (as `torch._amp_update_scale_` does), so a step under `16-mixed`
//! needs no host read to decide its scale.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::{GradScaler, GradScalerConfig, GradScalerState};

/// The loss scale and its growth tracker as one-element f32 tensors on the device. With the
/// default factors (powers of 2) every value is the host scaler's exactly.
#[derive(Debug, Clone)]
pub struct DeviceScaler<B: Backend> {
    config: GradScalerConfig,
    /// The current loss scale.
    scale: Tensor<B, 1>,
    /// Finite steps since the last change of scale (exact in f32 up to 2^24).
    tracker: Tensor<B, 1>,
}

impl<B: Backend> DeviceScaler<B> {
    /// The host scaler's state, moved to `device`.
    pub fn from_host(scaler: &GradScaler, device: &B::Device) -> Self {
        let state = scaler.state();
        let one = |value: f64| Tensor::from_data(TensorData::new(vec![value as f32], [1]), device);
        Self {
            config: *scaler.config(),
            scale: one(state.scale),
            tracker: one(f64::from(state.growth_tracker)),
        }
    }

    /// The current loss scale (one element).
    pub fn scale(&self) -> Tensor<B, 1> {
        self.scale.clone()
    }

    /// Ends a step: `found_inf` (one element, 1 when the step overflowed, 0 when not) backs
    /// the scale off, or counts a finite step and grows the scale after `growth_interval` of
    /// them, as [`GradScaler::update`] does on the host.
    pub fn update(&mut self, found_inf: Tensor<B, 1>) {
        let finite = found_inf.clone().neg().add_scalar(1.0);
        let counted = (self.tracker.clone() + 1.0) * finite;
        let grow = counted
            .clone()
            .greater_equal_elem(f64::from(self.config.growth_interval))
            .float();
        let backoff = found_inf
            .clone()
            .mul_scalar(self.config.backoff_factor - 1.0);
        let growth = grow.clone().mul_scalar(self.config.growth_factor - 1.0);
        // factor = backoff_factor on overflow, growth_factor on growth, else 1 (the two
        // cannot both hold: an overflow resets the count to 0).
        let factor = (backoff + growth).add_scalar(1.0);
        self.scale = self.scale.clone() * factor;
        self.tracker = counted * grow.neg().add_scalar(1.0);
    }

    /// The state on the host (one host read of both values).
    pub fn read(&self) -> GradScalerState {
        let both = Tensor::cat(vec![self.scale.clone(), self.tracker.clone()], 0);
        let values = both.into_data().convert::<f64>();
        let values = values.to_vec::<f64>().unwrap_or_default();
        let (scale, tracker) = (values.first(), values.get(1));
        GradScalerState {
            scale: scale.copied().unwrap_or(f64::NAN),
            growth_tracker: tracker.map_or(0, |t| *t as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn follows_the_host_scaler_step_for_step() {
        let config = GradScalerConfig {
            growth_interval: 3,
            ..Default::default()
        };
        let mut host = GradScaler::new(config).unwrap();
        let device = Default::default();
        let mut on_device = DeviceScaler::<Flex>::from_host(&host, &device);
        let overflows = [0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0];
        for (i, overflow) in overflows.into_iter().enumerate() {
            let flag = Tensor::<Flex, 1>::from_floats([overflow as f32], &device);
            on_device.update(flag);
            host.update(overflow == 1);
            assert_eq!(on_device.read(), host.state(), "after step {}", i + 1);
        }
    }
}
