//! Dynamic loss scaling for f16 training, as `torch.amp.GradScaler` does it.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};

use crate::PrecisionError;
use crate::grads::{self, GradSummary};

/// Settings of the dynamic loss scale; the defaults are PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GradScalerConfig {
    /// Starting scale. Default 65536 (2^16).
    pub init_scale: f64,
    /// Multiplier after `growth_interval` finite steps in a row. Default 2.0.
    pub growth_factor: f64,
    /// Multiplier when a step overflows. Default 0.5.
    pub backoff_factor: f64,
    /// Finite steps in a row before the scale grows. Default 2000.
    pub growth_interval: u32,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        Self {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl GradScalerConfig {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), PrecisionError> {
        let bad = |field, value, expected| {
            Err(PrecisionError::InvalidScalerConfig {
                field,
                value,
                expected,
            })
        };
        if !(self.init_scale.is_finite() && self.init_scale > 0.0) {
            return bad("init_scale", self.init_scale, "a finite number > 0");
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return bad("growth_factor", self.growth_factor, "a finite number > 1");
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return bad("backoff_factor", self.backoff_factor, "a number in (0, 1)");
        }
        if self.growth_interval == 0 {
            return bad("growth_interval", 0.0, "at least 1");
        }
        Ok(())
    }
}

/// The scaler's mutable state, saved with a training checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GradScalerState {
    /// The current loss scale.
    pub scale: f64,
    /// Finite steps since the last change of scale.
    pub growth_tracker: u32,
}

/// Dynamic loss scaler for `16-mixed`.
///
/// Per optimizer step: multiply the loss by [`scale`](Self::scale) before `backward`
/// ([`scale_loss`](Self::scale_loss)); [`unscale`](Self::unscale) the gradients (before any
/// clipping), which also reports whether they are finite; step the optimizer (and the LR
/// scheduler) only when they are; then [`update`](Self::update) the scale: x0.5 after an
/// overflow, x2 after `growth_interval` finite steps.
///
/// ```
/// use afterburner_precision::{GradScaler, GradScalerConfig};
/// let mut scaler = GradScaler::new(GradScalerConfig::default()).unwrap();
/// scaler.update(false);
/// assert_eq!(scaler.scale(), 65536.0);
/// scaler.update(true); // overflow
/// assert_eq!(scaler.scale(), 32768.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct GradScaler {
    config: GradScalerConfig,
    state: GradScalerState,
}

impl GradScaler {
    /// A scaler at `config.init_scale`; errors on an invalid config.
    pub fn new(config: GradScalerConfig) -> Result<Self, PrecisionError> {
        config.validate()?;
        Ok(Self {
            config,
            state: GradScalerState {
                scale: config.init_scale,
                growth_tracker: 0,
            },
        })
    }

    /// The current loss scale.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// The settings.
    pub fn config(&self) -> &GradScalerConfig {
        &self.config
    }

    /// Multiplies the loss by the current scale (call before `backward`).
    pub fn scale_loss<B: Backend, const D: usize>(&self, loss: Tensor<B, D>) -> Tensor<B, D> {
        loss.mul_scalar(self.state.scale)
    }

    /// Divides every gradient by the scale (times `extra_factor`, e.g. an accumulation
    /// correction) and reports the unscaled global norm and whether all gradients are finite.
    pub fn unscale<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
        extra_factor: f64,
    ) -> GradSummary {
        grads::scale_and_norm::<B, M>(model, grads, extra_factor / self.state.scale)
    }

    /// Updates the scale after a step: back off on overflow, grow after enough finite steps.
    pub fn update(&mut self, found_inf: bool) {
        let s = &mut self.state;
        if found_inf {
            s.scale *= self.config.backoff_factor;
            s.growth_tracker = 0;
            tracing::warn!(
                scale = s.scale,
                "gradient overflow: step skipped, loss scale lowered"
            );
        } else {
            s.growth_tracker += 1;
            if s.growth_tracker >= self.config.growth_interval {
                s.scale *= self.config.growth_factor;
                s.growth_tracker = 0;
            }
        }
    }

    /// The state to save with a checkpoint.
    pub fn state(&self) -> GradScalerState {
        self.state
    }

    /// Restores a saved state; errors if the saved scale is not a finite positive number.
    pub fn load_state(&mut self, state: GradScalerState) -> Result<(), PrecisionError> {
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(PrecisionError::InvalidScalerConfig {
                field: "scale",
                value: state.scale,
                expected: "a finite number > 0 in the saved scaler state",
            });
        }
        self.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_defaults() {
        let c = GradScalerConfig::default();
        assert_eq!(
            (
                c.init_scale,
                c.growth_factor,
                c.backoff_factor,
                c.growth_interval
            ),
            (65536.0, 2.0, 0.5, 2000)
        );
    }

    #[test]
    fn grows_after_interval_and_backs_off_on_overflow() {
        let mut s = GradScaler::new(GradScalerConfig {
            growth_interval: 3,
            ..Default::default()
        })
        .unwrap();
        s.update(false);
        s.update(false);
        assert_eq!(s.scale(), 65536.0);
        s.update(false);
        assert_eq!(s.scale(), 131072.0);
        s.update(false);
        s.update(true);
        assert_eq!(s.scale(), 65536.0);
        assert_eq!(s.state().growth_tracker, 0);
    }

    #[test]
    fn rejects_bad_settings() {
        let err = GradScaler::new(GradScalerConfig {
            backoff_factor: 2.0,
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("backoff_factor"), "{err}");
        let mut s = GradScaler::new(GradScalerConfig::default()).unwrap();
        assert!(
            s.load_state(GradScalerState {
                scale: f64::NAN,
                growth_tracker: 0
            })
            .is_err()
        );
    }
}
