//! AdamW whose step is kept or dropped on the device, as PyTorch's fused AdamW takes
//! `found_inf` as a tensor: the Trainer decides a step's skip (non-finite gradients, an fp16
//! overflow) without reading anything on the host, and a skipped step leaves the parameter,
//! its moments and its step count exactly as they were.
//!
//! Burn's `AdamW` keeps a parameter's step count on the host (its bias correction is
//! `1 - beta^t`, computed there) and takes the learning rate as an f64, so a skip decided on the
//! device cannot be expressed through it. Here the step count is a device tensor, the bias
//! corrections are read from tables of the same host values Burn computes (`1f32 -
//! beta.powi(t)`), and the learning rate and the decay factor `1 - lr * weight_decay` come as
//! one-element tensors of the f32 values Burn would use: every applied step is bitwise
//! Burn's (`a_gated_step_is_burns_adamw_bitwise`).

use std::sync::{Arc, Mutex, PoisonError};

use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

/// What the next gated steps read from the device (set by the Trainer before each optimizer
/// step, shared with the optimizer inside Burn's `OptimizerAdaptor`).
pub type GateCell<B> = Arc<Mutex<Option<Gate<B>>>>;

/// One optimizer step's device-side inputs.
#[derive(Clone)]
pub struct Gate<B: Backend> {
    /// `[1]`: true when the step is skipped.
    pub skip: Tensor<B, 1, Bool>,
    /// `[1]`: the learning rate, as the f32 Burn's `mul_scalar(lr)` multiplies by.
    pub lr: Tensor<B, 1>,
    /// `[1]`: `1 - lr * weight_decay` (computed in f64, then f32, as Burn does).
    pub decay: Tensor<B, 1>,
    /// `1f32 - beta_1.powi(t)` at index `t`, and the same for `beta_2`.
    pub bias_1: Tensor<B, 1>,
    /// See `bias_1`.
    pub bias_2: Tensor<B, 1>,
}

/// AdamW's settings, kept beside Burn's `AdamW` (whose fields are private) for the gated
/// step, with the cell the Trainer sets the gate in.
#[derive(Clone)]
pub struct GatedAdamW<B: Backend> {
    /// Beta 1.
    pub beta_1: f32,
    /// Beta 2.
    pub beta_2: f32,
    /// Epsilon.
    pub epsilon: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// The gate of the next step (`None`: Burn's own step).
    pub gate: GateCell<B>,
}

/// A parameter's moments with its step count on the device (the gated step's state).
#[derive(Clone)]
pub struct DeviceMoments<B: Backend, const D: usize> {
    /// Applied steps of this parameter, `[1]`.
    pub time: Tensor<B, 1, Int>,
    /// First moment.
    pub moment_1: Tensor<B, D>,
    /// Second moment.
    pub moment_2: Tensor<B, D>,
}

impl<B: Backend, const D: usize> DeviceMoments<B, D> {
    /// Burn's state (one host read of the step count).
    pub fn into_host(self) -> AdamWState<B, D> {
        let time = self.time.into_data().convert::<i64>();
        let time = time.to_vec::<i64>().ok().and_then(|t| t.first().copied());
        let momentum =
            AdaptiveMomentumState::new(time.unwrap_or(0) as usize, self.moment_1, self.moment_2);
        AdamWState::new(momentum)
    }

    /// Burn's state on the device (the step count written, not read).
    pub fn from_host(state: AdamWState<B, D>) -> Self {
        let momentum = state.momentum;
        let device = momentum.moment_1.device();
        let time = TensorData::new(vec![momentum.time as i64], [1]);
        Self {
            time: Tensor::from_data(time, &device),
            moment_1: momentum.moment_1,
            moment_2: momentum.moment_2,
        }
    }
}

impl<B: Backend> GatedAdamW<B> {
    /// The gate set for the next step, if any.
    pub fn current(&self) -> Option<Gate<B>> {
        self.gate
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// One gated AdamW step of `tensor`: Burn's arithmetic, op for op, with the step count,
    /// the learning rate and the bias corrections read on the device, and the result kept
    /// only where the gate does not skip.
    pub fn step<const D: usize>(
        &self,
        gate: &Gate<B>,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<DeviceMoments<B, D>>,
    ) -> (Tensor<B, D>, DeviceMoments<B, D>) {
        let factor_1 = 1.0 - self.beta_1;
        let factor_2 = 1.0 - self.beta_2;
        let device = tensor.device();
        // A parameter's first step: zero moments at step 0 give Burn's initial ones exactly
        // (0 * beta + x = x).
        let state = state.unwrap_or_else(|| DeviceMoments {
            time: Tensor::zeros([1], &device),
            moment_1: tensor.zeros_like(),
            moment_2: tensor.zeros_like(),
        });
        let moment_1 = state
            .moment_1
            .clone()
            .mul_scalar(self.beta_1)
            .add(grad.clone().mul_scalar(factor_1));
        let moment_2 = state
            .moment_2
            .clone()
            .mul_scalar(self.beta_2)
            .add(grad.square().mul_scalar(factor_2));
        let time = state.time.clone() + 1;
        // The gate's tables cover every step count the run reaches (TrainerGate grows them);
        // the clamp keeps a count they do not cover from reading past them.
        let at = |table: &Tensor<B, 1>| {
            let last = table.dims()[0] as i64 - 1;
            broadcast::<B, D>(table.clone().select(0, time.clone().clamp_max(last)))
        };
        let corrected_1 = moment_1.clone().div(at(&gate.bias_1));
        let corrected_2 = moment_2.clone().div(at(&gate.bias_2));
        let delta = corrected_1.div(corrected_2.sqrt().add_scalar(self.epsilon));
        let decayed = match self.weight_decay == 0.0 {
            true => tensor.clone(),
            false => tensor.clone().mul(broadcast::<B, D>(gate.decay.clone())),
        };
        let updated = decayed - delta.mul(broadcast::<B, D>(gate.lr.clone()));
        // The parameter and its moments share one shape: one mask keeps all three.
        let skip: Tensor<B, D, Bool> = gate.skip.clone().reshape([1; D]).expand(tensor.shape());
        let kept = DeviceMoments {
            time: time.mask_where(gate.skip.clone(), state.time),
            moment_1: moment_1.mask_where(skip.clone(), state.moment_1),
            moment_2: moment_2.mask_where(skip.clone(), state.moment_2),
        };
        (updated.mask_where(skip, tensor), kept)
    }
}

/// A one-element tensor shaped to broadcast over `D` dims.
fn broadcast<B: Backend, const D: usize>(value: Tensor<B, 1>) -> Tensor<B, D> {
    value.reshape([1; D])
}

/// `1f32 - beta.powi(t)` for `t` in `0..len`, as Burn's AdamW computes its bias corrections.
pub fn bias_table<B: Backend>(beta: f32, len: usize, device: &B::Device) -> Tensor<B, 1> {
    let values: Vec<f32> = (0..len).map(|t| 1f32 - beta.powi(t as i32)).collect();
    Tensor::from_data(TensorData::new(values, [len]), device)
}

/// `[1]` of an f64 as Burn's `mul_scalar` would use it on an f32 tensor.
pub fn scalar<B: Backend>(value: f64, device: &B::Device) -> Tensor<B, 1> {
    Tensor::from_data(TensorData::new(vec![value as f32], [1]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::optim::{AdamWConfig, SimpleOptimizer};
    use burn::tensor::Distribution;

    type B = Flex;

    fn bits<const D: usize>(t: &Tensor<B, D>) -> Vec<u32> {
        let values = t.clone().into_data().to_vec::<f32>().unwrap();
        values.into_iter().map(f32::to_bits).collect()
    }

    fn gate(skip: bool, lr: f64, wd: f64, device: &burn::tensor::Device<B>) -> Gate<B> {
        Gate {
            skip: Tensor::from_data(TensorData::new(vec![skip], [1]), device),
            lr: scalar(lr, device),
            decay: scalar(1.0 - lr * wd, device),
            bias_1: bias_table(0.9, 16, device),
            bias_2: bias_table(0.999, 16, device),
        }
    }

    #[test]
    fn a_gated_step_is_burns_adamw_bitwise_and_a_skipped_one_changes_nothing() {
        let device = Default::default();
        let wd = 0.01;
        let burn = AdamWConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(wd as f32)
            .build();
        let gated = GatedAdamW::<B> {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay: wd as f32,
            gate: Arc::default(),
        };
        let mut reference = Tensor::<B, 2>::random([3, 4], Distribution::Default, &device);
        let mut ours = reference.clone();
        let mut burn_state = None;
        let mut our_state = None;
        // Steps 2 and 5 are skipped on the gated side and not taken on Burn's.
        for (step, skip) in [false, true, false, false, true, false]
            .into_iter()
            .enumerate()
        {
            let lr = 1e-2 / (step + 1) as f64;
            let grad = Tensor::<B, 2>::random([3, 4], Distribution::Default, &device);
            let before = (bits(&ours), our_state.clone());
            let (next, state) =
                gated.step(&gate(skip, lr, wd, &device), ours, grad.clone(), our_state);
            ours = next;
            our_state = Some(state);
            if skip {
                assert_eq!(bits(&ours), before.0, "a skipped step keeps the parameter");
                let (was, now) = (before.1.unwrap(), our_state.clone().unwrap());
                assert_eq!(bits(&was.moment_1), bits(&now.moment_1));
                assert_eq!(bits(&was.moment_2), bits(&now.moment_2));
                continue;
            }
            let (next, state) = burn.step(lr, reference, grad, burn_state);
            reference = next;
            burn_state = state;
            assert_eq!(bits(&ours), bits(&reference), "step {step}");
            let host = our_state.clone().unwrap().into_host().momentum;
            let burns = &burn_state.as_ref().unwrap().momentum;
            assert_eq!(host.time, burns.time);
            assert_eq!(bits(&host.moment_1), bits(&burns.moment_1));
            assert_eq!(bits(&host.moment_2), bits(&burns.moment_2));
        }
    }
}
